"""Runner options, declared once, and the validated settings built from them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from ..errors import InvalidJob
from ..executor_config import ExecutorName, HandlerRef, ProcessExecutor, check_executor, locate_all
from ..jobs import (
    QUEUE_MAX_LENGTH,
    JobView,
    Retention,
    RetryPolicy,
    check_text,
)
from ..wakeup_mode import WakeupMode
from .handlers import (
    _UNSET,
    _check_budget,
    check_handler_executor,
    check_retry,
    check_timeout,
    default_registry,
    registered_handlers,
)

if TYPE_CHECKING:
    from ..codecs import PayloadCodec
    from ..schedules import Schedule


#: The longest duration a runner accepts: what ``threading`` can wait for.
MAX_DURATION = timedelta(seconds=min(threading.TIMEOUT_MAX, 10 * 365 * 86400))


def _duration(value: object, name: str, *, zero: bool = False) -> timedelta:
    if not isinstance(value, timedelta):
        raise InvalidJob(name, f"must be a datetime.timedelta, not {type(value).__name__}")
    if value < timedelta(0) or (value == timedelta(0) and not zero):
        raise InvalidJob(name, f"must be {'non-negative' if zero else 'positive'}, got {value}")
    if value > MAX_DURATION:
        raise InvalidJob(name, f"must be at most {MAX_DURATION}, got {value}")
    if not zero and value < timedelta(milliseconds=1):
        raise InvalidJob(name, f"must be at least 1 millisecond, got {value}")
    return value


#: The idle poll of a runner that LISTEN/NOTIFY wakes (a safety net only).
NOTIFIED_POLL_INTERVAL = timedelta(seconds=2)


#: The idle poll of a runner without wake-ups (SQLite): how long a new job
#: may wait before an idle runner sees it.
POLLING_POLL_INTERVAL = timedelta(milliseconds=250)


def default_poll_interval(listening: bool) -> timedelta:
    """The default ``poll_interval`` of a runner that is woken by NOTIFY
    (``listening``: :func:`sqlalchemy_watchdog.wakeups.listens_on` of its
    engine and ``wakeups``) or not (a runner whose session proof fails polls
    at :data:`POLLING_POLL_INTERVAL` instead)."""
    return NOTIFIED_POLL_INTERVAL if listening else POLLING_POLL_INTERVAL


#: Handlers a runner runs at once unless told otherwise. Ten threads (the
#: asyncio runner: ten tasks) keep a busy queue moving -- claims and settles
#: are batched over the slots that free up, so one runner drains several
#: thousand jobs per second instead of one job per commit round trip -- while
#: staying inside SQLAlchemy's default pool (5 + 10 overflow) even when every
#: handler uses the same engine beside the runner's own three connections.
#: A handler that must never run beside another of the process: concurrency=1.
#: Short handlers get larger batches without more threads by claiming ahead
#: (``claim_ahead``, ``core/ahead.py``), not by a larger default.
DEFAULT_CONCURRENCY = 10


#: How long the settler of a runner that claims jobs ahead of its children
#: (the process executor's ``prefetch``) waits for other children's answers
#: before it sends a settle, so that they share one statement and one commit.
#: The children have their next jobs meanwhile: the wait delays when a
#: settlement is seen, not the next job's start (the journal,
#: benchmarks/README.md, has what it saved: SQLite's commits most).
SETTLE_GATHER_S = 0.010


#: How long running handlers may take to finish on shutdown unless told
#: otherwise: with the 2 s stop wait after it, 22 s -- inside a 30 s
#: termination period (Kubernetes' default, gunicorn's ``graceful_timeout``)
#: with 8 s left for the server's own drain and the last statements.
DEFAULT_GRACE = timedelta(seconds=20)


#: The longest wait, after the grace, for handlers told to stop to return.
STOP_WAIT_MAX_S = 2.0


#: How long ``running()`` waits past the shutdown budget for the runner's
#: last statements (handing leftovers to recovery, closing connections)
#: before it gives up waiting.
EXIT_MARGIN_S = 5.0


#: The least a shutdown waits, once its budget is spent, for what is still
#: settling or being handed to recovery (one statement each): the "1 s for
#: the last statements" the shutdown-budget rule of the workers page counts.
#: Without it a short grace left no time at all for the hand-off of a child
#: killed at the end of the budget, which then held its job ``running``
#: under its live lease.
LAST_STATEMENTS_S = 1.0


def stop_wait_s(grace_s: float) -> float:
    """How long shutdown waits, after the grace, for the handlers it told to
    stop: ``min(2 s, grace)``, at least 0.1 s."""
    return min(STOP_WAIT_MAX_S, max(0.1, grace_s))


#: How often a runner logs its INFO summary unless told otherwise.
DEFAULT_SUMMARY_EVERY = timedelta(seconds=60)


#: The backlog a summary counts up to (a larger one reads "10000+").
SUMMARY_BACKLOG_CAP = 10_000


def check_summary_every(value: object) -> float | int | None:
    """``summary_every``: None (no summary), a positive timedelta (seconds
    between summaries) or a positive int (jobs between summaries)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return _duration(value, "summary_every").total_seconds()
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100_000_000:
        return value
    raise InvalidJob(
        "summary_every", f"must be None, a positive timedelta or an int from 1 to 100000000, got {value!r}"
    )


#: Connections a runner keeps checked out while it runs: its loop's, its
#: settler's and its heartbeat's (and its pruner's, with a retention).
RUNNER_CONNECTIONS = 3


def pool_shortfall(pool: Any, settings: RunnerSettings) -> str | None:
    """Why ``pool`` (the runner's engine's) cannot serve the runner beside
    ``concurrency`` handlers that each use one connection of it; None when
    it can, or when the pool has no fixed limit (``NullPool``, ...)."""
    # Handlers in child processes cannot use the runner's engine: only those
    # in the runner's own process count.
    local = sum(group.concurrency for group in settings.slot_groups if group.executor is None)
    if local == 0:
        return None
    size = getattr(pool, "size", None)
    overflow = getattr(pool, "_max_overflow", None)
    if not callable(size) or not isinstance(overflow, int) or overflow < 0:
        return None
    capacity = int(size()) + overflow
    held = RUNNER_CONNECTIONS + (1 if settings.retention is not None else 0)
    needed = held + local
    if capacity >= needed:
        return None
    return (
        f"the engine's pool holds at most {capacity} connections (pool_size + max_overflow); the runner keeps "
        f"{held} and its {local} handlers may need one each: create the engine with "
        f"pool_size={needed} (or more), or lower concurrency -- else handlers wait for a connection "
        "(pool_timeout) and fail"
    )


#: How long a claim lives without a heartbeat unless told otherwise.
DEFAULT_LEASE = timedelta(seconds=120)
#: How often running claims are renewed unless told otherwise.
DEFAULT_HEARTBEAT = timedelta(seconds=10)


@dataclass(frozen=True)
class SlotGroup:
    """The queues of a runner whose handlers share one executor's slots.

    A runner has one group per executor its served handlers run in: the
    runner's own process (threads, or an async runner's tasks) with
    ``concurrency`` slots, and each distinct
    :class:`~sqlalchemy_watchdog.ProcessExecutor` with its ``processes``.
    Each group is claimed for separately, up to its own free slots (and what
    it claims ahead), so a queue never gets more jobs than its executor can
    run."""

    queues: tuple[str, ...]
    #: How many of its handlers run at once.
    concurrency: int
    #: Its process executor, None for the runner's own process.
    executor: ProcessExecutor | None = None
    #: Jobs claimed ahead of its busy children (its executor's ``prefetch``;
    #: 0 for the runner's own process).
    prefetch: int = 0
    #: The most jobs claimed ahead of its threads or tasks while their
    #: handlers are short (the runner's ``claim_ahead``; 0 for children).
    ahead_cap: int = 0

    @property
    def most_ahead(self) -> int:
        """The most jobs it ever holds beyond ``concurrency``."""
        return self.prefetch if self.prefetch > 0 else max(0, self.ahead_cap)

    @property
    def label(self) -> str:
        """``thread`` or ``process``: where its handlers run."""
        return "thread" if self.executor is None else "process"


class RunnerOptions(TypedDict, total=False):
    """The options of :class:`~sqlalchemy_watchdog.Runner` and
    :class:`~sqlalchemy_watchdog.asyncio.AsyncRunner`, declared once: both
    take them as keyword arguments (``**options: Unpack[RunnerOptions]``),
    and one left out takes its default.

    ``queues``
        the queues to serve (default: every queue with a handler).
    ``concurrency``
        handlers run at once, each in its own thread (the async runner: its
        own task); default 10,
        :data:`~sqlalchemy_watchdog.core.settings.DEFAULT_CONCURRENCY`; 1 runs one
        handler at a time. Handlers that run in child processes (a process
        executor) have that executor's ``processes`` instead, beside these.
    ``lease``
        how long a claim lives without a heartbeat (default 120 s).
    ``heartbeat``
        how often running claims are renewed (default 10 s; at most
        lease/3).
    ``poll_interval``
        how often an idle runner looks for work when no wake-up arrives.
        Default: 2 s where LISTEN/NOTIFY wakes the runner at once
        (PostgreSQL), 0.25 s elsewhere (SQLite has no wake-ups: the poll
        bounds how long a new job waits; an idle poll is a short read).
    ``grace``
        on shutdown, how long running handlers may take to finish before
        they are asked to stop (default 20 s,
        :data:`~sqlalchemy_watchdog.core.settings.DEFAULT_GRACE`); those
        still running ``min(2 s, grace)`` later have their jobs handed to
        recovery. The runner's ``shutdown_budget`` is the sum: keep it
        under the platform's termination period minus the server's own
        drain.
    ``is_alive``
        ``is_alive(job) -> bool`` for executions that live outside this
        process (the async runner also awaits a coroutine function), asked
        before a claim whose lease ended is recovered. True leaves the job
        running; an exception means unknown (neither requeued nor settled).
        Default: the lease alone decides.
    ``max_recoveries``
        the recovery budget of jobs that carry none of their own and whose
        handler sets none (``@handler(queue, max_recoveries=...)``): how
        many times a job whose execution disappeared is requeued before it
        settles ``interrupted``. None (the default) settles such a job
        ``interrupted`` at once: at most once. A number gives at least once.
    ``codec``
        a :class:`~sqlalchemy_watchdog.codecs.PayloadCodec` whose ``decode``
        turns the stored JSON payload into what handlers see.
    ``retry``
        the :class:`~sqlalchemy_watchdog.RetryPolicy` of jobs that carry
        none of their own and whose handler sets none (``@handler(queue,
        retry=...)``). None (the default): a failed attempt is final.
    ``timeout``
        how long one attempt may run, for jobs that set no ``timeout`` and
        whose handler sets none; then the handler is told to stop
        (``StopReason.TIMEOUT``) and the attempt counts as failed. None (the
        default): no limit.
    ``retention``
        a :class:`~sqlalchemy_watchdog.Retention`: how long settled jobs
        are kept, by outcome, before this runner prunes them in the
        background (one runner at a time, in small batches). None (the
        default) keeps every settled job.
    ``schedules``
        :class:`~sqlalchemy_watchdog.Schedule` objects (periodic jobs, the
        ``[cron]`` extra) this runner enqueues: each due slot once, however
        many runners are given the same schedules.
    ``clock``
        the application clock in epoch milliseconds (for tests); the
        database clock is always consulted too.
    ``wakeups``
        how ``run_forever`` learns of new work on PostgreSQL (a
        :class:`~sqlalchemy_watchdog.WakeupMode`): ``"auto"`` (the default)
        LISTENs where the listening connection is proven to be one server
        session of the primary, else polls every 0.25 s and logs one
        WARNING saying why; ``"listen"`` refuses to start without that
        proof (:class:`~sqlalchemy_watchdog.WakeupsUnavailable`); ``"poll"``
        never LISTENs and takes no session lock. Behind a pooler in
        transaction mode, give ``listen_engine``. The runner's
        ``wakeup_status`` says what is in force.
    ``summary_every``
        how often ``run_forever`` logs its INFO summary (jobs ended by
        outcome, running, ready backlog): a ``timedelta`` (default 60 s;
        skipped while idle), an ``int`` (every so many jobs), or None
        (never). Each job's own claim and settle lines are DEBUG.
    ``executor``
        where plain handlers run: ``"thread"`` (the default: threads of the
        runner's process), ``"process"`` or a
        :class:`~sqlalchemy_watchdog.ProcessExecutor` (child processes, with
        hard timeouts and crash containment; handlers located by module
        path; ``concurrency`` is its ``processes``). An async runner's
        coroutine handlers always stay on its loop. It is the default of
        the handlers that name none: ``@handler(queue, executor=...)`` (and
        ``@task``) choose their own, so that one runner serves thread and
        process queues side by side -- ``concurrency`` then bounds the
        handlers in the runner's process, and each process executor its
        own ``processes``.
    ``executors``
        ``{queue: executor}``: where the named queues' handlers run,
        overriding both ``executor`` and what their ``@handler(queue,
        executor=...)`` says (``"thread"``, ``"process"`` or a
        :class:`~sqlalchemy_watchdog.ProcessExecutor`); what the command
        line's ``--executor QUEUE=process`` gives. Each queue must be served.
    ``claim_ahead``
        how many jobs a runner may claim beyond ``concurrency`` while its
        handlers are short, to wait for the next free slot (default None:
        four times ``concurrency``; 0: never). It claims only as many as its
        handlers start within about 10 ms at their recent run time, none
        until the first handler returned, and gives back (queued again,
        nothing counted) a job that waited a second (the how-to's "Claiming
        ahead of short handlers"). The process executor claims ahead by its
        own ``prefetch`` instead.
    """

    queues: Iterable[str] | None
    concurrency: int
    lease: timedelta
    heartbeat: timedelta
    poll_interval: timedelta | None
    grace: timedelta
    is_alive: Callable[[JobView], Any] | None
    max_recoveries: int | None
    codec: PayloadCodec | None
    retry: RetryPolicy | None
    timeout: timedelta | None
    retention: Retention | None
    schedules: Iterable[Schedule] | None
    clock: Callable[[], int]
    wakeups: WakeupMode | str
    summary_every: timedelta | int | None
    executor: ExecutorName | ProcessExecutor
    executors: Mapping[str, ExecutorName | ProcessExecutor] | None
    claim_ahead: int | None


def check_options(who: str, options: Mapping[str, object]) -> None:
    """Refuse a keyword argument that is no runner option, as Python
    refuses an unknown keyword (``TypeError``)."""
    for name in options:
        if name not in RunnerOptions.__optional_keys__:
            raise TypeError(f"{who}.__init__() got an unexpected keyword argument {name!r}")


@dataclass(frozen=True)
class RunnerSettings:
    """Validated runner settings, shared by :class:`Runner` and ``AsyncRunner``."""

    handlers: Mapping[str, Callable[..., Any]]
    queues: tuple[str, ...]
    concurrency: int
    lease_ms: int
    heartbeat_s: float
    poll_interval_s: float
    grace_s: float
    is_alive: Callable[[JobView], Any] | None
    #: The recovery budget of a job without one of its own, per queue; a
    #: queue not listed uses :attr:`max_recoveries`.
    budgets: Mapping[str, int | None] = field(default_factory=dict)
    max_recoveries: int | None = None
    codec: PayloadCodec | None = None
    recovery_batch: int = 16
    #: Retry policies and timeouts of handlers registered with their own, by queue.
    retries: Mapping[str, RetryPolicy | None] = field(default_factory=dict)
    retry: RetryPolicy | None = None
    timeouts: Mapping[str, timedelta | None] = field(default_factory=dict)
    timeout: timedelta | None = None
    #: How long settled jobs are kept before this runner prunes them.
    retention: Retention | None = None
    #: Periodic jobs this runner enqueues (any number of runners may).
    schedules: tuple[Schedule, ...] = ()
    #: The INFO summary: every so many seconds (float), every so many jobs
    #: (int), or never (None).
    summary_every: float | int | None = DEFAULT_SUMMARY_EVERY.total_seconds()
    #: The process executor, None for threads.
    executor: ProcessExecutor | None = None
    #: Where the process executor's children find each queue's handler
    #: (the queues whose handlers run in children).
    handler_refs: Mapping[str, HandlerRef] = field(default_factory=dict)
    #: How many jobs are claimed beyond ``concurrency``, to wait for the
    #: first free child (the process executor's ``prefetch``; 0 for threads).
    claim_ahead: int = 0
    #: The most jobs a thread or task runner claims ahead of its free slots
    #: while its handlers are short (``claim_ahead``; 0: never). How many
    #: it does claim ahead depends on their run time (:mod:`.ahead`).
    ahead_cap: int = 0
    #: The executors' slot groups of a runner whose handlers run in more
    #: than one executor (handlers that name their own); ``()``: one group,
    #: which the fields above describe (:attr:`slot_groups`). With several,
    #: ``concurrency`` is their sum and ``claim_ahead`` the sum of their
    #: ``prefetch``.
    groups: tuple[SlotGroup, ...] = ()

    @property
    def slot_groups(self) -> tuple[SlotGroup, ...]:
        """The groups of queues that share one executor's slots (at least one)."""
        if self.groups:
            return self.groups
        return (SlotGroup(self.queues, self.concurrency, self.executor, self.claim_ahead, self.ahead_cap),)

    @property
    def child_executors(self) -> dict[str, ProcessExecutor]:
        """The process executor of each queue whose handlers run in children."""
        return {
            queue: group.executor
            for group in self.slot_groups
            if group.executor is not None
            for queue in group.queues
            if queue in self.handler_refs
        }

    @property
    def local_group(self) -> SlotGroup | None:
        """The group of the queues whose handlers run in the runner's own
        process (threads, or an async runner's tasks), if any: its jobs
        claimed ahead wait for one of its slots (:class:`~.ahead.Parking`)."""
        for group in self.slot_groups:
            if group.executor is None:
                return group
        return None

    @property
    def slots_note(self) -> str:
        """Where the runner's handlers run, for its start line: nothing for
        the runner's process alone, `` (processes)`` for children alone,
        else each executor's slots and queues."""
        groups = self.slot_groups
        if len(groups) == 1:
            return "" if groups[0].executor is None else " (processes)"
        return " (" + "; ".join(f"{g.label} {g.concurrency}: {','.join(g.queues)}" for g in groups) + ")"

    @property
    def executors(self) -> dict[str, str]:
        """Where each served queue's handlers run: ``thread`` (the runner's
        process: threads, or an async runner's tasks) or ``process``."""
        return {queue: ("process" if queue in self.handler_refs else "thread") for queue in self.queues}

    @property
    def most_ahead(self) -> int:
        """The most jobs it ever holds beyond ``concurrency``: the process
        executor's ``prefetch``, else the cap of thread or task runners' claims
        ahead, summed over its executors (what ``watchdog_workers.claim_ahead``
        shows)."""
        return sum(group.most_ahead for group in self.slot_groups)

    @property
    def settle_gather(self) -> tuple[int, float]:
        """How many finished jobs the settler waits for, and for how long at
        most, before it sends a batch: one per child for at most
        :data:`SETTLE_GATHER_S` when the runner claims ahead of its children
        (they are not idle while a settle waits); ``(1, 0.0)`` -- settle at
        once -- otherwise."""
        if self.claim_ahead > 0:
            return sum(g.concurrency for g in self.slot_groups if g.prefetch > 0), SETTLE_GATHER_S
        return 1, 0.0

    @property
    def stop_wait_s(self) -> float:
        """How long shutdown waits, after the grace, for stopped handlers."""
        return stop_wait_s(self.grace_s)

    @property
    def shutdown_budget_s(self) -> float:
        """The longest a shutdown waits for handlers: the grace, then the stop
        wait (what is still running after that is handed to recovery by one
        more statement)."""
        return self.grace_s + self.stop_wait_s

    @classmethod
    def build(
        cls,
        handlers: Mapping[str, Callable[..., Any]] | None,
        options: RunnerOptions,
        *,
        default_poll_interval: timedelta,
        stays: Callable[[Any], bool] | None = None,
    ) -> RunnerSettings:
        """Validate ``options`` (a runner's keyword arguments; each one left
        out takes its default) for ``handlers``; ``poll_interval`` defaults
        to ``default_poll_interval`` (it depends on the engine). With the
        process executor, each served handler but those ``stays`` keeps in
        the runner's process is located by module path (refused if a child
        could not import it)."""
        queues = options.get("queues")
        concurrency = options.get("concurrency", DEFAULT_CONCURRENCY)
        lease = options.get("lease", DEFAULT_LEASE)
        heartbeat = options.get("heartbeat", DEFAULT_HEARTBEAT)
        poll_interval = options.get("poll_interval")
        if poll_interval is None:
            poll_interval = default_poll_interval
        grace = options.get("grace", DEFAULT_GRACE)
        is_alive = options.get("is_alive")
        max_recoveries = options.get("max_recoveries")
        codec = options.get("codec")
        retry = options.get("retry")
        timeout = options.get("timeout")
        retention = options.get("retention")
        schedules = options.get("schedules")
        summary_every = options.get("summary_every", DEFAULT_SUMMARY_EVERY)
        table = dict(registered_handlers() if handlers is None else handlers)
        for queue, fn in table.items():
            check_text("queue", queue, QUEUE_MAX_LENGTH)
            if not callable(fn):
                raise InvalidJob("handlers", f"handler of {queue!r} is not callable")
        if isinstance(queues, str):
            raise InvalidJob("queues", "must be an iterable of queue names, not a str")
        served = tuple(table) if queues is None else tuple(queues)
        if not served:
            raise InvalidJob("handlers", "no handlers: pass handlers={queue: fn} or register with @handler(queue)")
        for queue in served:
            check_text("queues", queue, QUEUE_MAX_LENGTH)
            if queue not in table:
                raise InvalidJob("queues", f"queue {queue!r} has no handler")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= 10_000:
            raise InvalidJob("concurrency", f"must be an int from 1 to 10000, got {concurrency!r}")
        executor = check_executor(options.get("executor", "thread"))
        placed = _place(table, served, executor, stays, _checked_executors(options.get("executors"), served))
        refs = locate_all(table, tuple(q for q, where in placed.items() if where is not None), stays=stays)
        if executor is not None and None not in placed.values():
            if "concurrency" in options and concurrency != executor.children:
                raise InvalidJob(
                    "concurrency",
                    f"with the process executor, concurrency is its processes ({executor.children}), got "
                    f"{concurrency}: leave concurrency out and give ProcessExecutor(processes={concurrency})",
                )
            concurrency = executor.children
        ahead_cap = check_claim_ahead(options.get("claim_ahead"), concurrency, executor is not None)
        groups = _groups(placed, refs, concurrency, ahead_cap)
        if len(groups) == 1 and groups[0].executor == executor:
            (group,) = groups
            concurrency, prefetch, groups = group.concurrency, group.prefetch, ()
        else:
            concurrency = sum(g.concurrency for g in groups)
            prefetch = sum(g.prefetch for g in groups)
            ahead_cap = sum(g.ahead_cap for g in groups)
        lease = _duration(lease, "lease")
        heartbeat = _duration(heartbeat, "heartbeat")
        if heartbeat * 3 > lease:
            raise InvalidJob(
                "heartbeat",
                f"must be at most a third of the lease ({lease}) so a renewal can fail "
                f"twice before the lease ends, got {heartbeat}",
            )
        poll_interval = _duration(poll_interval, "poll_interval")
        grace = _duration(grace, "grace", zero=True)
        if is_alive is not None and not callable(is_alive):
            raise InvalidJob("is_alive", "must be callable")
        default_budget = _check_budget("max_recoveries", max_recoveries)
        if codec is not None and not (callable(getattr(codec, "decode", None))):
            raise InvalidJob("codec", "must have a decode(value) method (see sqlalchemy_watchdog.codecs)")
        budgets: dict[str, int | None] = {}
        retries: dict[str, RetryPolicy | None] = {}
        timeouts: dict[str, timedelta | None] = {}
        for queue, fn in table.items():
            policy = default_registry.policy_for(queue, fn)
            if policy is None:
                continue
            if policy.max_recoveries is not _UNSET:
                budgets[queue] = policy.max_recoveries
            if policy.retry is not _UNSET:
                retries[queue] = policy.retry
            if policy.timeout is not _UNSET:
                timeouts[queue] = policy.timeout
        return cls(
            handlers=table,
            queues=served,
            concurrency=concurrency,
            lease_ms=lease // timedelta(milliseconds=1),
            heartbeat_s=heartbeat.total_seconds(),
            poll_interval_s=poll_interval.total_seconds(),
            grace_s=grace.total_seconds(),
            is_alive=is_alive,
            budgets=budgets,
            max_recoveries=default_budget,
            codec=codec,
            retries=retries,
            retry=check_retry(retry),
            timeouts=timeouts,
            timeout=check_timeout(timeout),
            retention=_checked_retention(retention),
            schedules=_checked_schedules(schedules),
            summary_every=check_summary_every(summary_every),
            executor=executor,
            handler_refs=refs,
            claim_ahead=prefetch,
            ahead_cap=ahead_cap,
            groups=groups,
        )

    def budget_for(self, job: JobView) -> int | None:
        """The recovery budget of ``job``: its own, else its queue's handler
        default, else the runner's ``max_recoveries``."""
        if job.max_recoveries is not None:
            return job.max_recoveries
        return self.budgets.get(job.queue, self.max_recoveries)

    def policy_for(self, job: JobView) -> RetryPolicy | None:
        """The retry policy of ``job``: its own, else its handler's, else the runner's."""
        if job.retry is not None:
            return job.retry
        return self.retries.get(job.queue, self.retry)

    def timeout_for(self, job: JobView) -> timedelta | None:
        """The per-attempt timeout of ``job``: its own, else its handler's, else the runner's."""
        if job.timeout is not None:
            return job.timeout
        return self.timeouts.get(job.queue, self.timeout)


#: The most jobs a runner may be told to claim ahead of its slots.
MAX_CLAIM_AHEAD = 10_000
#: The default ``claim_ahead``: this many jobs per concurrency slot. How
#: many are claimed ahead is still bounded by what the handlers start within
#: about 10 ms (:mod:`.ahead`); the cap matters for handlers of a few ms or
#: less, where a batch of ``concurrency`` x (1 + 4) jobs per claim and per
#: settle is what a runner at its defaults needs to outrun its peers.
CLAIM_AHEAD_PER_SLOT = 4


def check_claim_ahead(value: object, concurrency: int, process_executor: bool) -> int:
    """``claim_ahead``: None (:data:`CLAIM_AHEAD_PER_SLOT` x ``concurrency``, at most
    :data:`MAX_CLAIM_AHEAD`) or an int from 0 to that; refused beside the
    process executor, which claims ahead by its ``prefetch``."""
    if process_executor:
        if value is not None:
            raise InvalidJob(
                "claim_ahead",
                "the process executor claims ahead by its own prefetch: give ProcessExecutor(prefetch=...) instead",
            )
        return 0
    if value is None:
        return min(CLAIM_AHEAD_PER_SLOT * concurrency, MAX_CLAIM_AHEAD)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CLAIM_AHEAD:
        raise InvalidJob("claim_ahead", f"must be None or an int from 0 to {MAX_CLAIM_AHEAD}, got {value!r}")
    return value


def _place(
    table: Mapping[str, Callable[..., Any]],
    served: tuple[str, ...],
    default: ProcessExecutor | None,
    stays: Callable[[Any], bool] | None,
    overrides: Mapping[str, ProcessExecutor | ExecutorName],
) -> dict[str, ProcessExecutor | None]:
    """Where each served queue's handler runs: the process executor it
    names (``@handler(queue, executor=...)``), or the runner's ``default``
    when it names none; None for the runner's own process. A handler the
    runner keeps in its process (``stays``: an async runner's coroutine
    handlers) goes with the default's group, as before handlers could name
    one; naming a process executor for it is refused. ``overrides`` (the
    runner's ``executors``) win over what the handlers name."""
    placed: dict[str, ProcessExecutor | None] = {}
    for queue in served:
        fn = table[queue]
        policy = default_registry.policy_for(queue, fn)
        own = overrides.get(queue, _UNSET if policy is None else policy.executor)
        if own is _UNSET:
            placed[queue] = default
        elif own == "thread":
            placed[queue] = None
        elif stays is not None and stays(fn):
            raise InvalidJob(
                "executor",
                f"the handler of {queue!r} is a coroutine function, which runs on the async runner's event loop: "
                'it cannot name a process executor (give it executor="thread" or none, or make it a plain function)',
            )
        else:
            placed[queue] = own if isinstance(own, ProcessExecutor) else check_executor(own)
    return placed


def _checked_executors(value: object, served: tuple[str, ...]) -> dict[str, ProcessExecutor | ExecutorName]:
    """The ``executors`` option: None or ``{served queue: executor}``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidJob("executors", f"must be a mapping of queue names to executors, not {type(value).__name__}")
    checked: dict[str, ProcessExecutor | ExecutorName] = {}
    for queue, executor in value.items():
        if queue not in served:
            raise InvalidJob(
                "executors", f"queue {queue!r} is not served by this runner (it serves {', '.join(map(repr, served))})"
            )
        try:
            checked[queue] = check_handler_executor(executor)
        except InvalidJob as error:
            raise InvalidJob("executors", f"the executor of {queue!r}: {error}") from None
    return checked


def _groups(
    placed: Mapping[str, ProcessExecutor | None],
    refs: Mapping[str, HandlerRef],
    concurrency: int,
    ahead_cap: int,
) -> tuple[SlotGroup, ...]:
    """The runner's slot groups, one per executor in ``placed`` (equal
    process executors are one: their handlers share its children), in the
    order of the queues first served by each. The runner's own process has
    ``concurrency`` slots and claims ahead up to ``ahead_cap``; a process
    executor has its ``processes`` and claims its ``prefetch`` ahead when
    any of its handlers runs in children."""
    members: dict[ProcessExecutor | None, list[str]] = {}
    for queue, where in placed.items():
        members.setdefault(where, []).append(queue)
    groups = []
    for where, queues in members.items():
        if where is None:
            groups.append(SlotGroup(tuple(queues), concurrency, None, 0, ahead_cap))
        else:
            children = any(queue in refs for queue in queues)
            groups.append(SlotGroup(tuple(queues), where.children, where, where.claim_ahead if children else 0, 0))
    return tuple(groups)


def _checked_retention(retention: object) -> Retention | None:
    if retention is not None and not isinstance(retention, Retention):
        raise InvalidJob("retention", f"must be a Retention or None, not {type(retention).__name__}")
    return retention


def _checked_schedules(schedules: object) -> tuple[Schedule, ...]:
    if schedules is None:
        return ()
    from ..schedules import check_schedules

    return check_schedules(schedules)
