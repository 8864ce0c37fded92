"""The runner core: every rule of a runner, written once and free of I/O.

This module is internal; its public names are re-exported from
:mod:`sqlalchemy_watchdog`.

A runner is a loop of small decisions: how many jobs to claim for the free
slots, whether a claimed job may still start, how a handler's answer becomes
a settlement, what a refused settlement means, which disappeared claims to
recover and with what budget, when to look again, how long to back off after
a failed pass, and how to shut down. Each decision is a generator of
**steps** -- typed requests for I/O (:class:`StoreCall`, :class:`RunHandler`,
:class:`Stop`, :class:`Probe`, :class:`Spawn`, :class:`WaitDone`) -- driven by
one of two drivers that only perform them:

* :class:`~sqlalchemy_watchdog.Runner` runs store calls on a ``Connection``
  and handlers in threads;
* :class:`~sqlalchemy_watchdog.asyncio.AsyncRunner` runs store calls through
  ``AsyncConnection.run_sync`` and handlers as tasks.

Neither driver contains a rule the other lacks. A store failure reaches the
generator that asked for it as a :class:`~sqlalchemy_watchdog.WatchdogError`
thrown at its ``yield``; a generator is only ever driven by one thread, from
its first step to its return.

An execution's steps end where its settlement starts (:func:`execute`
returns a :class:`SettleRequest`): the driver settles it -- in a batch with
others, on whatever thread or task does that -- and the job's end is then
the pure function :func:`conclude` of the execution and its settlement.
"""

from __future__ import annotations

import contextvars
import enum
import functools
import logging
import random
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import store, telemetry
from .errors import InvalidJob, WatchdogError, redacted, redacted_detail, safe_text
from .jobs import (
    QUEUE_MAX_LENGTH,
    Decision,
    Job,
    JobState,
    JobView,
    Outcome,
    Retention,
    RetryPolicy,
    SettleStatus,
    Undecodable,
    at_epoch_ms,
    bound_reason,
    check_duration,
    check_text,
    duration_ms,
    history_with,
)
from .store import Claim, Recovery, RecoveryCause, RecoveryStatus, Settlement, SettleRequest
from .wakeups import Waiting, WakeupMode, listens

if TYPE_CHECKING:
    from .codecs import PayloadCodec
    from .schedules import Schedule

__all__ = [
    "Handler",
    "JobLogger",
    "RunningJob",
    "StopReason",
    "TickStatus",
    "TickResult",
    "RunnerSettings",
    "handler",
    "registered_handlers",
]

log = logging.getLogger("sqlalchemy_watchdog.runner")

T = TypeVar("T")

#: A handler takes the running job; it returns None (completed) or a Decision.
Handler = Callable[["RunningJob"], "Decision | None"]


# -- the handler registry --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Registered:
    fn: Callable[..., Any]
    max_recoveries: int | None
    retry: RetryPolicy | None = None
    timeout: timedelta | None = None


_registry: dict[str, _Registered] = {}

_UNSET: Any = object()


def _check_budget(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
        raise InvalidJob(name, f"must be None or an int from 0 to 1000000, got {value!r}")
    return value


def check_retry(value: object, name: str = "retry") -> RetryPolicy | None:
    """A retry policy argument: None or a :class:`RetryPolicy`."""
    if value is not None and not isinstance(value, RetryPolicy):
        raise InvalidJob(name, f"must be a RetryPolicy or None, not {type(value).__name__}")
    return value


def check_timeout(value: object, name: str = "timeout") -> timedelta | None:
    """A timeout argument: None or a positive timedelta."""
    return None if value is None else check_duration(name, value)


def handler(
    queue: str,
    *,
    max_recoveries: int | None = _UNSET,
    retry: RetryPolicy | None = _UNSET,
    timeout: timedelta | None = _UNSET,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the handler of ``queue``.

    A :class:`~sqlalchemy_watchdog.Runner` (or ``AsyncRunner``) built
    without ``handlers`` serves every queue registered this way.

    :param max_recoveries: the recovery budget of this queue's jobs that do
        not carry one of their own (``Job(max_recoveries=None)``): how many
        times a job whose execution disappeared (killed worker, lost lease)
        is requeued before it settles ``interrupted``. Overrides the
        runner's ``max_recoveries`` for this queue.
    :param retry: the :class:`~sqlalchemy_watchdog.RetryPolicy` of this
        queue's jobs that carry none of their own; overrides the runner's.
    :param timeout: how long one attempt of this queue's jobs may run when
        the job sets no ``timeout`` of its own; overrides the runner's.
    """
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    budget = _UNSET if max_recoveries is _UNSET else _check_budget("max_recoveries", max_recoveries)
    policy = _UNSET if retry is _UNSET else check_retry(retry)
    limit = _UNSET if timeout is _UNSET else check_timeout(timeout)

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        existing = _registry.get(queue)
        if existing is not None and existing.fn is not fn:
            raise ValueError(f"queue {queue!r} already has a handler: {existing.fn!r}")
        _registry[queue] = _Registered(fn, budget, policy, limit)
        return fn

    return register


def registered_handlers() -> dict[str, Callable[..., Any]]:
    """A copy of the handlers registered with :func:`handler`."""
    return {queue: entry.fn for queue, entry in _registry.items()}


# -- what a handler sees -----------------------------------------------------------


class StopReason(str, enum.Enum):
    """Why a running handler was asked to stop."""

    CANCELLED = "cancelled"
    LANE_FAILED = "lane_failed"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    #: The attempt outlived its timeout; it counts as a failed attempt.
    TIMEOUT = "timeout"


#: Guards the creation of every :class:`Flag`'s event against its setting.
_FLAGS = threading.Lock()


class Flag:
    """A one-way flag whose :class:`threading.Event` is made only when asked for.

    Every claimed job carries two (its stop signal, its end), and almost
    none is ever waited on; an ``Event`` (a ``Condition`` and its lock) cost
    more to make than the rest of an execution's bookkeeping.
    """

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with _FLAGS:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    @property
    def event(self) -> threading.Event:
        """The flag as an ``Event`` (made now if needed; set if the flag is)."""
        event = self._event
        if event is None:
            with _FLAGS:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
                    if self._set:
                        event.set()
        return event

    def wait(self, timeout: float | None = None) -> bool:
        return self._set or self.event.wait(timeout)


class StopSignal:
    """The stop request of one execution: the first reason wins."""

    __slots__ = ("_flag", "reason")

    def __init__(self) -> None:
        self.reason: StopReason | None = None
        self._flag = Flag()

    @property
    def event(self) -> threading.Event:
        """Set once a stop was requested (what a handler waits on)."""
        return self._flag.event

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        return self._flag.is_set()

    def request(self, reason: StopReason) -> bool:
        """Ask the handler to stop; whether this was the first request."""
        first = self.reason is None
        if first:
            self.reason = reason
        self._flag.set()
        return first


@dataclass(frozen=True)
class RunningJob:
    """The job a handler runs.

    ``stop_requested`` is set when the handler should stop: the job was
    cancelled, its lane failed, its lease was lost, its attempt timed out,
    or the runner is shutting down (:attr:`stop_reason` says which). A long
    handler should check it (``job.stop_requested.wait(0)`` /
    ``.is_set()``) between steps.
    """

    job_id: str
    queue: str
    lane: str
    priority: int
    payload: Any
    recovery_count: int
    max_recoveries: int | None
    _signal: StopSignal = field(repr=False, compare=False)
    #: The attempt this is (1 is the first).
    attempt: int = 1
    #: Attempts in all under the policy that applies (1: no retries).
    max_attempts: int = 1
    #: How many times the job was snoozed before this attempt.
    snoozes: int = 0
    #: How long this attempt may run (None: no limit).
    timeout: timedelta | None = None
    #: The W3C trace context the job was enqueued under (``traceparent``,
    #: ``tracestate``, ...), None when none was recorded. With
    #: :mod:`sqlalchemy_watchdog.otel` installed the handler already runs in
    #: the attempt's span, which continues this trace.
    trace_context: Mapping[str, str] | None = None

    @property
    def stop_requested(self) -> threading.Event:
        return self._signal.event

    @property
    def log_fields(self) -> dict[str, Any]:
        """What identifies this attempt in a log record: ``job_id``,
        ``queue``, ``lane``, ``attempt``, ``recovery_count``."""
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "lane": self.lane,
            "attempt": self.attempt,
            "recovery_count": self.recovery_count,
        }

    @property
    def log(self) -> JobLogger:
        """A logger (``sqlalchemy_watchdog.job``) whose every record carries
        :attr:`log_fields` as attributes, for a JSON or ``extra``-aware
        formatter: ``job.log.info("sent %s", to)``."""
        return self.logger(_JOB_LOG)

    def logger(self, logger: logging.Logger | str) -> JobLogger:
        """``logger`` (or the logger of that name) adding :attr:`log_fields`
        to every record, beside any ``extra`` of the call."""
        base = logging.getLogger(logger) if isinstance(logger, str) else logger
        return JobLogger(base, self.log_fields)

    @property
    def stop_reason(self) -> StopReason | None:
        return self._signal.reason


_JOB_LOG = logging.getLogger("sqlalchemy_watchdog.job")


class JobLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger adapter adding a job's fields to every record; an ``extra``
    given to a call is merged in (the call's values win)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


class TickStatus(str, enum.Enum):
    """What one tick of a runner did."""

    IDLE = "idle"
    SETTLED = "settled"
    RECOVERED = "recovered"
    REQUEUED = "requeued"
    REJECTED = "rejected"
    LIVENESS_UNKNOWN = "liveness_unknown"


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one :meth:`Runner.tick` did, and the job it settled if any."""

    status: TickStatus
    job: JobView | None = None
    job_id: str | None = None


# -- settings --------------------------------------------------------------------

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


def default_poll_interval(engine: Any, wakeups: WakeupMode = WakeupMode.AUTO) -> timedelta:
    """The default ``poll_interval`` of a runner on ``engine`` (sync or async)
    that listens there as ``wakeups`` says (a runner whose session proof
    fails polls at :data:`POLLING_POLL_INTERVAL` instead)."""
    dialect = engine.dialect
    if wakeups is not WakeupMode.POLL and listens(dialect.name, dialect.driver):
        return NOTIFIED_POLL_INTERVAL
    return POLLING_POLL_INTERVAL


def check_clock(clock: object) -> Callable[[], int]:
    """Refuse a runner ``clock`` that cannot be called."""
    if not callable(clock):
        raise InvalidJob("clock", f"must be a callable returning epoch milliseconds, not {type(clock).__name__}")
    return clock


#: Handlers a runner runs at once unless told otherwise. Ten threads (the
#: asyncio runner: ten tasks) keep a busy queue moving -- claims and settles
#: are batched over the slots that free up, so one runner drains several
#: thousand jobs per second instead of one job per commit round trip -- while
#: staying inside SQLAlchemy's default pool (5 + 10 overflow) even when every
#: handler uses the same engine beside the runner's own three connections.
#: A handler that must never run beside another of the process: concurrency=1.
DEFAULT_CONCURRENCY = 10

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


# -- signals: the host's unless the runner owns the process ------------------------

#: The signals a runner that owns its process stops on.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _unclaimed(sig: signal.Signals, current: object) -> bool:
    """Whether nobody but the interpreter handles ``sig``: its default
    action, Python's own SIGINT handler, or the SIGINT handler
    ``asyncio.run`` puts in place of that default for its main task."""
    if current is signal.SIG_DFL:
        return True
    if sig is signal.SIGINT:
        if current is signal.default_int_handler:
            return True
        func = getattr(current, "func", None) if isinstance(current, functools.partial) else None
        owner = getattr(func, "__self__", None)
        return getattr(func, "__name__", "") == "_on_sigint" and type(owner).__module__.startswith("asyncio")
    return False


def signals_to_install(install: bool | None) -> tuple[signal.Signals, ...]:
    """Which stop signals ``run_forever(install_signal_handlers=install)``
    takes over, with their handlers now: none outside the main thread or
    with ``False``; both with ``True``; by default (None) each one nobody
    has claimed -- the runner owns a script's process, never a server's
    (uvicorn, gunicorn and the like install their own handlers first)."""
    if install is False or threading.current_thread() is not threading.main_thread():
        return ()
    if install is True:
        return STOP_SIGNALS
    return tuple(sig for sig in STOP_SIGNALS if _unclaimed(sig, signal.getsignal(sig)))


def restore_signal(sig: signal.Signals, previous: Any) -> None:
    """Put back the handler a runner replaced (one installed outside Python,
    which cannot be put back, becomes the default action)."""
    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)


# -- pool sizing ---------------------------------------------------------------------

#: Connections a runner keeps checked out while it runs: its loop's, its
#: settler's and its heartbeat's (and its pruner's, with a retention).
RUNNER_CONNECTIONS = 3


def pool_shortfall(pool: Any, settings: RunnerSettings) -> str | None:
    """Why ``pool`` (the runner's engine's) cannot serve the runner beside
    ``concurrency`` handlers that each use one connection of it; None when
    it can, or when the pool has no fixed limit (``NullPool``, ...)."""
    size = getattr(pool, "size", None)
    overflow = getattr(pool, "_max_overflow", None)
    if not callable(size) or not isinstance(overflow, int) or overflow < 0:
        return None
    capacity = int(size()) + overflow
    held = RUNNER_CONNECTIONS + (1 if settings.retention is not None else 0)
    needed = held + settings.concurrency
    if capacity >= needed:
        return None
    return (
        f"the engine's pool holds at most {capacity} connections (pool_size + max_overflow); the runner keeps "
        f"{held} and its {settings.concurrency} handlers may need one each: create the engine with "
        f"pool_size={needed} (or more), or lower concurrency -- else handlers wait for a connection "
        "(pool_timeout) and fail"
    )


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
        *,
        queues: Iterable[str] | None,
        concurrency: int,
        lease: timedelta,
        heartbeat: timedelta,
        poll_interval: timedelta,
        grace: timedelta,
        is_alive: Callable[[JobView], Any] | None,
        max_recoveries: int | None = None,
        codec: PayloadCodec | None = None,
        retry: RetryPolicy | None = None,
        timeout: timedelta | None = None,
        retention: Retention | None = None,
        schedules: Iterable[Schedule] | None = None,
        summary_every: timedelta | int | None = DEFAULT_SUMMARY_EVERY,
    ) -> RunnerSettings:
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
            registered = _registry.get(queue)
            if registered is None or registered.fn is not fn:
                continue
            if registered.max_recoveries is not _UNSET:
                budgets[queue] = registered.max_recoveries
            if registered.retry is not _UNSET:
                retries[queue] = registered.retry
            if registered.timeout is not _UNSET:
                timeouts[queue] = registered.timeout
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


def _checked_retention(retention: object) -> Retention | None:
    if retention is not None and not isinstance(retention, Retention):
        raise InvalidJob("retention", f"must be a Retention or None, not {type(retention).__name__}")
    return retention


def _checked_schedules(schedules: object) -> tuple[Schedule, ...]:
    if schedules is None:
        return ()
    from .schedules import check_schedules

    return check_schedules(schedules)


# -- executions ------------------------------------------------------------------


@dataclass(eq=False)
class Execution:
    """A claim this runner is executing, with its handler's view and stop signal."""

    claim: Claim
    job: RunningJob
    signal: StopSignal
    done: Flag = field(default_factory=Flag)
    #: The driver's handle on the running handler (the async driver's task).
    task: Any = None
    #: When the claim was asked for, on this process's monotonic clock: no
    #: later than the database took it, so a pause anywhere after that point
    #: (even before the claim's answer was read) counts against the start.
    claimed_at: float = field(default_factory=time.monotonic)
    #: When :func:`execute` last knew the claim live before the handler
    #: starts (the moment it sent a renewal that held), monotonic; 0: only
    #: the claim itself.
    checked_at: float = 0.0
    #: The decision made without running the handler (its payload could
    #: not be decoded), if any.
    refused: Decision | None = None
    #: The traceback of its handler's exception, kept with the job (bound
    #: parameters and driver details of database errors left out).
    failure_detail: str | None = None
    #: The exception its handler raised, if any (a retry policy's
    #: ``retry_on`` is matched against it).
    error: BaseException | None = None
    #: What became of it, for the runner's summary: an outcome's value,
    #: ``requeued`` or ``rejected`` (set when it is concluded).
    result: str | None = None
    #: Whether it still occupies one of the runner's ``concurrency`` slots:
    #: from the claim until its handler returns. Its settle then overlaps
    #: with the next claim; the heartbeat keeps renewing it until settled.
    slot_held: bool = True
    #: When its handler must have returned (monotonic), if it has a timeout;
    #: set when the handler starts. The driver stops it then.
    deadline: float | None = None
    #: In how many seconds a retry or snooze asked for makes the job due
    #: again; the runner promotes then, once the requeue has committed.
    requeue_in: float | None = None
    #: Whether its handler runs in a thread the driver cannot interrupt (a
    #: plain handler under the async driver): a stop only signals it, and
    #: its slot and claim stay held until the thread returns.
    threaded: bool = False
    #: The instrumentation's view of this attempt (:mod:`.telemetry`), if any.
    trace: telemetry.AttemptTrace | None = None

    def traced(self, what: str, *args: Any) -> None:
        """Tell the attempt's trace ``what`` happened (a no-op without one;
        an instrumentation failure is logged, never raised)."""
        trace = self.trace
        if trace is not None:
            with telemetry.guarded(what):
                getattr(trace, what)(*args)

    def started_late(self, heartbeat_s: float) -> bool:
        """Whether more than a heartbeat interval passed since the claim was
        last known live: its handler must not start before a renewal says
        the claim still holds (the process may have been frozen or starved
        past the lease in between)."""
        return time.monotonic() - max(self.claimed_at, self.checked_at) > heartbeat_s

    def handler_context(self) -> contextvars.Context | None:
        """The context the handler runs in: its trace's (None without a
        trace, or when the instrumentation fails to give one -- logged, and
        the handler runs as it would untraced)."""
        trace = self.trace
        if trace is not None:
            with telemetry.guarded("context"):
                return trace.context()
        return None

    @property
    def job_id(self) -> str:
        return self.claim.job.job_id

    @property
    def pair(self) -> tuple[str, str]:
        return (self.claim.job.job_id, self.claim.token)


# -- steps: what a driver performs -------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreCall(Generic[T]):
    """Run ``fn(conn, *args, **kwargs)`` in a transaction of its own; the
    answer is its result (a failure comes back as a WatchdogError)."""

    fn: Callable[..., T]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunHandler:
    """Run the execution's handler; the answer is its :class:`Decision`, or
    None when shutdown stopped it before it decided."""

    execution: Execution


@dataclass(frozen=True, slots=True)
class Stop:
    """Tell an execution's handler to stop (an async handler's task is cancelled)."""

    execution: Execution
    reason: StopReason


@dataclass(frozen=True, slots=True)
class Probe:
    """Ask ``is_alive(job)``; the answer is True, False, or :data:`UNKNOWN`."""

    job: JobView


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start running these claimed executions in the background."""

    executions: tuple[Execution, ...]


@dataclass(frozen=True, slots=True)
class WaitDone:
    """Wait until every execution is done, or ``timeout`` seconds."""

    executions: tuple[Execution, ...]
    timeout: float


UNKNOWN: Any = object()
Step = StoreCall[Any] | RunHandler | Stop | Probe | Spawn | WaitDone
Steps = Generator[Step, Any, T]


def drive(steps: Steps[T], perform: Callable[[Step], Any]) -> T:
    """Run ``steps`` to the end with a sync ``perform``; a WatchdogError it
    raises goes back into ``steps`` at the step that caused it."""
    try:
        step = next(steps)
        while True:
            try:
                answer = perform(step)
            except WatchdogError as error:
                step = steps.throw(error)
                continue
            step = steps.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def drive_async(steps: Steps[T], perform: Callable[[Step], Awaitable[Any]]) -> T:
    """:func:`drive` with an async ``perform``."""
    try:
        step = next(steps)
        while True:
            try:
                answer = await perform(step)
            except WatchdogError as error:
                step = steps.throw(error)
                continue
            step = steps.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


# -- handler answers -----------------------------------------------------------------


#: What a driver answers :class:`RunHandler` with when it did not call the
#: handler because the claim's last check was over a heartbeat old by then
#: (:meth:`Execution.started_late`): :func:`execute` renews and asks again.
STARTED_LATE: Decision = Decision.failed("the handler was about to start late; not run")


def decision_of_result(result: object, job: RunningJob) -> Decision | None:
    """A handler's return value as a decision.

    None means ``completed``: a handler that returns normally has done its
    work, also after the runner asked it to stop for shutdown. A handler
    that stopped early says so -- by raising (after a shutdown stop the job
    is then handed to recovery: requeued within its budget, else
    ``interrupted``; an async handler's cancelled task is the same) or by
    returning a :class:`Decision`. The one exception is an attempt past its
    timeout, which counts as failed whatever it returns but a Decision.
    """
    if result is None:
        if job.stop_reason is StopReason.TIMEOUT:
            return Decision.failed(timed_out(job))
        return Decision.completed()
    if isinstance(result, Decision):
        return result
    return Decision.failed(f"handler returned {type(result).__name__}, not a Decision or None: {result!r}"[:500])


def decision_of_exception(execution: Execution, error: BaseException) -> Decision | None:
    """A handler's exception as a ``failed`` decision with a bounded reason;
    the exception is logged with its traceback, which is kept with the job
    (``JobView.failure_detail``). Neither the reason nor the kept traceback
    holds a database error's bound parameters, SQL text in the reason, or
    driver details (:func:`~sqlalchemy_watchdog.errors.safe_text`).

    Raised after a shutdown stop, the exception is the handler saying it
    stopped early: no decision (None), and the job is handed to recovery."""
    job = execution.job
    if job.stop_reason is StopReason.SHUTDOWN:
        log.warning(
            "job %s: its handler stopped for shutdown (%s); handing it to recovery",
            job.job_id,
            safe_text(error),
            extra=job.log_fields,
        )
        return None
    execution.error = error
    execution.failure_detail = redacted_detail(error)
    execution.traced("raised", error)
    # The traceback at DEBUG only: the attempt's one WARNING (a retry) or
    # ERROR (the final failure) line is logged once its fate is known
    # (settle_request).
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "job %s: handler raised %s: %s",
            job.job_id,
            type(error).__name__,
            safe_text(error),
            exc_info=(type(error), error, error.__traceback__),
            extra=job.log_fields,
        )
    if job.stop_reason is StopReason.TIMEOUT:
        return Decision.failed(bound_reason(f"{timed_out(job)} ({safe_text(error)})"))
    return Decision.failed(bound_reason(safe_text(error)))


def timed_out(job: RunningJob) -> str:
    """The reason of an attempt that outlived its timeout."""
    timeout = job.timeout
    seconds = 0.0 if timeout is None else timeout.total_seconds()
    return f"timed out after {seconds:g}s"


def decision_of_cancelled_task(execution: Execution) -> Decision | None:
    """The decision of an async handler whose task was cancelled: none for a
    shutdown (recovery takes it), else ``failed`` with the stop's reason."""
    reason = execution.signal.reason or StopReason.SHUTDOWN
    if reason is StopReason.SHUTDOWN:
        return None
    if reason is StopReason.TIMEOUT:
        return Decision.failed(timed_out(execution.job))
    return Decision.failed(f"execution stopped ({reason.value})")


def stop_reason_of(job: JobView | None) -> StopReason:
    """Why a claim could not be renewed, judged from the stored row."""
    if job is not None and job.cancellation_id is not None:
        return StopReason.CANCELLED
    if job is not None and job.state is JobState.SETTLED and job.outcome is Outcome.FAILED:
        return StopReason.LANE_FAILED
    return StopReason.LEASE_LOST


def _reason(execution: Execution) -> str:
    reason = execution.signal.reason
    return reason.value if reason is not None else "stop requested"


def _outcome(job: JobView | None) -> str:
    return job.outcome.value if job is not None and job.outcome is not None else "?"


# -- the core of one runner -------------------------------------------------------------


class RunnerCore:
    """The state of one runner and every rule it follows.

    Shared by the driver's loop, its heartbeat, its handler threads or
    tasks and its settler; the table of active executions is guarded by a
    lock (uncontended under asyncio).
    """

    #: The longest back-off after failed loop passes, in seconds.
    MAX_BACKOFF_S = 30.0
    #: How long a claim the database refuses to recover is left alone, at most.
    MAX_ISOLATION_S = 600.0

    def __init__(self, settings: RunnerSettings, clock: Callable[[], int]) -> None:
        self.settings = settings
        self.clock = check_clock(clock)
        #: By claim, (job_id, token): a slot belongs to an execution, not to
        #: a job. A handler that overstays its lease keeps its slot until it
        #: returns, even after its job was recovered and claimed again here.
        self._active: dict[tuple[str, str], Execution] = {}
        self._lock = threading.Lock()
        self.recovery_due = 0.0
        #: When to make due delayed jobs ready next (monotonic).
        self.promotion_due = 0.0
        #: When to prune settled jobs next (monotonic).
        self.retention_due = 0.0
        #: When to enqueue the schedules' next slots (monotonic).
        self.schedules_due = 0.0
        self.failures = 0
        #: Maintenance steps of the current loop pass that failed, with
        #: their errors: logged with the pass's own failure as one line, or
        #: each on its own when the claim went through.
        self.deferred: list[tuple[str, WatchdogError]] = []
        #: Claims whose recovery the database refused: (job_id, token) ->
        #: (monotonic time until which they are skipped, refusals so far).
        self._isolated: dict[tuple[str, str], tuple[float, int]] = {}
        #: Where NOTIFY wakes the runner: its side of the waiting lock, told
        #: after each claim whether the runner now waits for work.
        self.waiting: Waiting | None = None
        #: This runner's id among the workers (``watchdog_workers``) and the
        #: schedules' records; new for every runner object.
        self.worker_id = uuid.uuid4().hex
        #: Its row as registered while it serves (None: not registered).
        self.registration: store.WorkerRegistration | None = None
        #: Its row when registering at start failed: each heartbeat tries again.
        self.unregistered: store.WorkerRegistration | None = None
        #: When to prune long-gone workers next (monotonic).
        self.worker_prune_due = 0.0
        #: Whether recording the schedules failed last time (logged once).
        self.schedule_record_failed = False

        #: What the jobs that ended since the last summary became, counted.
        self._counts: dict[str, int] = {}
        self._counted = 0
        self._summary_since = time.monotonic()

    # -- the INFO summary

    def count(self, result: str, n: int = 1) -> None:
        """One job (or ``n``) ended as ``result`` (an outcome's value,
        ``requeued``, ``rejected``): counted for the next summary."""
        if n <= 0:
            return
        with self._lock:
            self._counts[result] = self._counts.get(result, 0) + n
            self._counted += n

    def summary_is_due(self) -> bool:
        """Whether the summary is due: its interval passed (with something
        counted or running since the last one -- an idle runner stays
        quiet), or its count of jobs was reached."""
        every = self.settings.summary_every
        if every is None:
            return False
        if isinstance(every, int):
            return self._counted >= every
        if time.monotonic() - self._summary_since < every:
            return False
        if self._counted == 0 and not self._active:
            self._summary_since = time.monotonic()
            return False
        return True

    def take_summary(self) -> tuple[float, dict[str, int], int]:
        """The seconds since the last summary, the counts since then and how
        many jobs run now; starts the next period."""
        now = time.monotonic()
        with self._lock:
            counts, self._counts, self._counted = self._counts, {}, 0
            running = len(self._active)
        seconds, self._summary_since = now - self._summary_since, now
        return seconds, counts, running

    # -- the table of executions

    def active(self) -> list[Execution]:
        """The executions this runner holds a claim for."""
        with self._lock:
            return list(self._active.values())

    def own(self, job_id: str, token: str) -> Execution | None:
        with self._lock:
            return self._active.get((job_id, token))

    #: The fewest settles that may wait for the database before the runner
    #: stops claiming (see :meth:`free_slots`); the bound is the larger of
    #: this and twice the concurrency.
    SETTLE_BACKLOG_MIN = 256

    @property
    def settle_backlog_max(self) -> int:
        """How many finished executions may wait for their settle before the
        runner stops claiming: a database that is slow to settle then holds
        up new claims instead of growing the runner's memory."""
        return max(self.SETTLE_BACKLOG_MIN, 2 * self.settings.concurrency)

    def free_slots(self) -> int:
        """How many of the runner's concurrency slots are free (none while
        the settle backlog is full)."""
        with self._lock:
            running = sum(1 for e in self._active.values() if e.slot_held)
            settling = len(self._active) - running
        if settling >= self.settle_backlog_max:
            return 0
        return self.settings.concurrency - running

    def admit(self, claim: Claim, asked_at: float) -> Execution:
        """Register the execution of ``claim``, asked for at ``asked_at``
        (``time.monotonic()`` read before the claim statement was sent).

        Registered before its handler starts, so a cancellation or lane
        failure recorded after the claim reaches it through the heartbeat."""
        signal = StopSignal()
        job = claim.job
        payload, refused = self._decoded(job)
        running = RunningJob(
            job_id=job.job_id,
            queue=job.queue,
            lane=job.lane,
            priority=job.priority,
            payload=payload,
            recovery_count=job.recovery_count,
            max_recoveries=job.max_recoveries,
            _signal=signal,
            attempt=job.attempt,
            max_attempts=max(job.attempt, policy.max_attempts if (policy := self.settings.policy_for(job)) else 1),
            snoozes=job.snoozes,
            timeout=self.settings.timeout_for(job),
            trace_context=job.trace_context,
        )
        execution = Execution(claim, running, signal, claimed_at=asked_at, refused=refused)
        with self._lock:
            self._active[execution.pair] = execution
        if log.isEnabledFor(logging.DEBUG):  # its fields are built per job: only when logged
            log.debug(
                "claimed job %s (queue %s, attempt %d, recovery %d)",
                job.job_id,
                job.queue,
                job.attempt,
                job.recovery_count,
                extra=running.log_fields,
            )
        return execution

    def _decoded(self, job: JobView) -> tuple[Any, Decision | None]:
        """The payload the handler sees (through the runner's codec), or the
        ``failed`` decision of a payload the codec cannot decode."""
        if isinstance(job.payload, Undecodable):  # a row written by hand: never handed to a handler
            log.error("job %s: its stored payload could not be decoded (%s)", job.job_id, job.payload.reason)
            return None, Decision.failed(
                bound_reason(f"payload could not be decoded: {job.payload.reason}"), retry=False
            )
        codec = self.settings.codec
        if codec is None:
            return job.payload, None
        try:
            return codec.decode(job.payload), None
        except Exception as error:
            log.error("job %s: its payload could not be decoded (%s)", job.job_id, redacted(error))
            # Not retried: another attempt would decode the same payload.
            return None, Decision.failed(bound_reason(f"payload could not be decoded: {redacted(error)}"), retry=False)

    def release_slot(self, execution: Execution) -> bool:
        """The handler returned: free its slot (its settle may still be under
        way). Whether a slot was freed, so the driver wakes its loop."""
        if execution.slot_held:
            execution.slot_held = False
            return True
        return False

    def retire(self, execution: Execution) -> None:
        """The execution is over (its settle, if any, committed): forget it
        and free its slot. A retry or snooze it asked for is due in
        ``requeue_in``: promote no later than that (the requeue has
        committed by now, so a promotion then finds it)."""
        with self._lock:
            if self._active.get(execution.pair) is execution:
                del self._active[execution.pair]
        execution.slot_held = False
        if execution.result is not None:
            self.count(execution.result)
        if execution.requeue_in is not None:
            self.expect_ready(execution.requeue_in)
        execution.traced("end")
        execution.trace = None
        execution.done.set()

    # -- the loop's timing

    def recovery_is_due(self) -> bool:
        return time.monotonic() >= self.recovery_due

    def schedule_recovery(self, until_expiry: float | None) -> None:
        """Look for disappeared claims again when the next lease ends, and
        at least every poll interval."""
        poll = self.settings.poll_interval_s
        self.recovery_due = time.monotonic() + min(poll, poll if until_expiry is None else until_expiry)

    #: The pause between prune batches while there is more to prune.
    PRUNE_PAUSE_S = 0.2

    def retention_is_due(self) -> bool:
        return time.monotonic() >= self.retention_due

    def until_retention(self) -> float:
        """Seconds until the next prune pass is due (0: now)."""
        return max(0.0, self.retention_due - time.monotonic())

    def schedule_retention(self, seconds: float) -> None:
        self.retention_due = time.monotonic() + seconds

    def promotion_is_due(self) -> bool:
        return time.monotonic() >= self.promotion_due

    #: How often a busy runner that NOTIFY wakes looks for due delayed jobs:
    #: enqueues notify only while a runner waits (see ``wakeups``), so a busy
    #: one is not told of a delayed job enqueued meanwhile.
    BUSY_PROMOTION_S = 0.25

    def schedule_promotion(self, next_in: float | None) -> None:
        """Look for due delayed jobs again when the next one is due, and at
        least every poll interval (other processes enqueue delayed jobs too)
        -- every :attr:`BUSY_PROMOTION_S` while busy where NOTIFY wakes it."""
        poll = self.settings.poll_interval_s
        if self.waiting is not None and not self.waiting.waits():
            poll = min(poll, self.BUSY_PROMOTION_S)
        self.promotion_due = time.monotonic() + min(poll, poll if next_in is None else next_in)

    #: The longest wait before the schedules are looked at again (a clock
    #: that jumps is noticed within it).
    MAX_SCHEDULE_WAIT_S = 60.0

    def schedules_are_due(self) -> bool:
        return time.monotonic() >= self.schedules_due

    def schedule_schedules(self, until_next: float | None) -> None:
        """Enqueue the schedules' slots again when the next one is due (at
        most a minute from now; a failure looks again after a poll interval)."""
        wait = self.settings.poll_interval_s if until_next is None else min(until_next, self.MAX_SCHEDULE_WAIT_S)
        self.schedules_due = time.monotonic() + wait

    def expect_ready(self, seconds: float) -> None:
        """A job will be due in ``seconds`` (a retry or a snooze of this
        runner, or a new delayed job): promote no later than that."""
        self.promotion_due = min(self.promotion_due, time.monotonic() + max(0.0, seconds))

    def jobs_arrived(self) -> None:
        """New jobs were enqueued (a wake-up): one may be delayed only briefly."""
        self.promotion_due = 0.0

    def idle_wait(self) -> float:
        """How long an idle loop waits for a wake-up before looking again."""
        now = time.monotonic()
        wait = min(self.settings.poll_interval_s, self.recovery_due - now, self.promotion_due - now)
        if self.settings.schedules:
            wait = min(wait, self.schedules_due - now)
        return max(0.0, wait)

    def next_deadline(self) -> float | None:
        """The earliest deadline (monotonic) of a running handler not yet stopped."""
        deadlines = [
            e.deadline for e in self.active() if e.deadline is not None and e.slot_held and not e.signal.is_set()
        ]
        return min(deadlines, default=None)

    def overdue(self) -> list[Execution]:
        """Executions whose handler outlived its timeout and was not stopped yet."""
        now = time.monotonic()
        return [
            e
            for e in self.active()
            if e.deadline is not None and e.deadline <= now and e.slot_held and not e.signal.is_set()
        ]

    def pass_succeeded(self) -> None:
        self.failures = 0

    def pass_failed(self, error: BaseException, who: str = "runner") -> float:
        """Log a failed loop pass -- one line, naming the maintenance steps
        that failed before it in the same pass -- and return how long to
        back off before the next one."""
        self.failures += 1
        delay = min(self.MAX_BACKOFF_S, 0.25 * 2.0 ** min(self.failures, 7))
        deferred, self.deferred = self.deferred, []
        also = f" ({' and '.join(what for what, _ in deferred)} failed too)" if deferred else ""
        if isinstance(error, WatchdogError):
            log.error("%s: %s%s; retrying in %.1fs", who, error, also, delay)
        else:
            log.error(
                "%s: unexpected error (%s)%s; retrying in %.1fs", who, redacted(error), also, delay, exc_info=error
            )
        return delay

    def defer_failure(self, what: str, error: WatchdogError) -> None:
        """A maintenance step (recovery, promotion, scheduling) of this pass
        failed; the pass goes on to claim (see :meth:`report_deferred`)."""
        self.deferred.append((what, error))

    def report_deferred(self) -> None:
        """The pass went through: log each maintenance step that failed in it."""
        deferred, self.deferred = self.deferred, []
        for what, error in deferred:
            log.error("runner: %s failed (%s); claiming goes on", what, error)

    # -- isolating claims the database refuses to recover

    def isolated(self, claim: Claim) -> bool:
        entry = self._isolated.get((claim.job.job_id, claim.token))
        return entry is not None and entry[0] > time.monotonic()

    def isolate(self, claim: Claim, error: WatchdogError) -> None:
        key = (claim.job.job_id, claim.token)
        _, refusals = self._isolated.get(key, (0.0, 0))
        refusals += 1
        pause = min(self.MAX_ISOLATION_S, 5.0 * 2 ** min(refusals - 1, 10))
        self._isolated[key] = (time.monotonic() + pause, refusals)
        log.error(
            "job %s: the database refused its recovery (%s); skipping it for %.0fs (refusal %d)",
            claim.job.job_id,
            error,
            pause,
            refusals,
        )

    def forget_isolated(self, claims: Iterable[Claim]) -> None:
        """Drop isolation entries of claims that are no longer expired."""
        live = {(c.job.job_id, c.token) for c in claims}
        for key in [k for k in self._isolated if k not in live]:
            del self._isolated[key]

    @property
    def isolated_jobs(self) -> tuple[str, ...]:
        """The job_ids whose recovery the database refused and that are skipped for now."""
        now = time.monotonic()
        return tuple(sorted({job_id for (job_id, _), (until, _) in self._isolated.items() if until > now}))


# -- the rules, as steps ---------------------------------------------------------------


def claim_steps(core: RunnerCore, limit: int) -> Steps[tuple[list[Execution], tuple[JobView, ...]]]:
    """Claim up to ``limit`` jobs: the executions to run, and the jobs the
    claim found cancelled while queued (settled by the claim itself)."""
    asked_at = time.monotonic()
    batch = yield StoreCall(
        store.claim,
        kwargs=dict(queues=core.settings.queues, limit=limit, lease_ms=core.settings.lease_ms),
    )
    instrumentation = telemetry.active()
    core.count("cancelled", len(batch.cancelled))
    for job in batch.cancelled:
        log.debug("job %s cancelled before it ran", job.job_id)
        if instrumentation is not None:
            with telemetry.guarded("settled_unrun"):
                instrumentation.settled_unrun(job)
    return [core.admit(claim, asked_at) for claim in batch.claimed], batch.cancelled


def time_out(core: RunnerCore) -> Steps[None]:
    """Tell every handler that outlived its attempt's timeout to stop
    (:attr:`StopReason.TIMEOUT`); its attempt then counts as failed."""
    for execution in core.overdue():
        yield from stop(execution, StopReason.TIMEOUT)


def stop(execution: Execution, reason: StopReason) -> Steps[None]:
    """Tell ``execution``'s handler to stop, and log why."""
    if execution.signal.reason is None:
        level = logging.INFO if reason in (StopReason.CANCELLED, StopReason.LANE_FAILED) else logging.WARNING
        if reason is StopReason.TIMEOUT:
            level = logging.WARNING
        fields = execution.job.log_fields
        log.log(level, "job %s: stopping its handler (%s)", execution.job_id, reason.value, extra=fields)
        execution.traced("stop_requested", reason)
    yield Stop(execution, reason)


def execute(core: RunnerCore, execution: Execution) -> Steps[SettleRequest | TickResult]:
    """Run the handler unless the claim was already stopped or lost; end in
    the request that settles it with the exact claim, or in the result of
    handing an abandoned job to recovery.

    A handler that starts within a heartbeat interval of its claim (well
    inside the lease) needs no database check; one that starts later -- the
    process was paused, starved or stopped between claim and start -- first
    renews its exact claim, and does not run if the claim was lost meanwhile
    (another runner may already be running it). Either way the settle is
    guarded by the database: a recorded cancellation turns it into
    ``cancelled``, a lost claim is refused.
    """
    settings = core.settings
    job_id = execution.job_id
    instrumentation = telemetry.active()
    if instrumentation is not None:
        with telemetry.guarded("attempt"):
            execution.trace = instrumentation.attempt(execution)
    try:
        while True:
            if execution.started_late(settings.heartbeat_s) and not execution.signal.is_set():
                asked = time.monotonic()
                held = yield StoreCall(
                    store.renew, ([execution.pair],), dict(lease_ms=settings.lease_ms, now=core.clock())
                )
                if job_id not in held:
                    row = yield StoreCall(store.read, (job_id,))
                    yield from stop(execution, stop_reason_of(row))
                else:
                    execution.checked_at = asked
            if execution.signal.reason is StopReason.SHUTDOWN:
                decision: Decision | None = None
            elif execution.signal.is_set():
                decision = Decision.failed(f"execution stopped before it started ({_reason(execution)})")
            elif execution.refused is not None:
                decision = execution.refused
            else:
                timeout = execution.job.timeout
                if timeout is not None:
                    execution.deadline = time.monotonic() + timeout.total_seconds()
                decision = yield RunHandler(execution)
                if decision is STARTED_LATE:
                    # The driver found the claim's last check over a heartbeat
                    # old when the handler was about to start: check again.
                    execution.slot_held = True
                    continue
            break
        if decision is None:
            # Stopped by shutdown before it decided: hand it to recovery now.
            abandoned = yield from abandon(core, [execution])
            execution.traced("concluded", abandoned)
            return abandoned
    except WatchdogError as error:
        log.error("job %s: could not run or hand over its claim (%s); recovery will handle it", job_id, error)
        rejected = TickResult(TickStatus.REJECTED, None, job_id)
        execution.traced("concluded", rejected)
        return rejected
    request = settle_request(core, execution, decision)
    execution.traced("decided", decision, request)
    return request


def settle_request(core: RunnerCore, execution: Execution, decision: Decision) -> SettleRequest:
    """What the decision means for the job under its retry policy: settle
    it, or requeue it on the same row (a retry or a snooze), by one
    statement guarded by the exact claim.

    * a snooze waits ``after`` and uses no attempt;
    * a retryable ``failed`` decision (a raised exception, a timeout,
      ``Decision.failed(reason)``, ``Decision.retry``) with attempts left
      under the policy waits ``after`` (``Decision.retry``) or the policy's
      backoff and moves to the next attempt; without attempts left -- or
      with ``retry=False``, or no policy at all, or an exception the
      policy's ``retry_on`` does not list -- it settles ``failed``;
    * every failed attempt goes into the job's bounded failure history;
    * ``completed`` and ``outcome_unknown`` settle (never retried).
    """
    claim = execution.claim
    job = claim.job
    now = core.clock()
    if decision.snoozed:
        after = decision.after
        assert after is not None
        execution.requeue_in = after.total_seconds()
        return SettleRequest(job.job_id, claim.token, decision, now)
    if decision.outcome is not Outcome.FAILED:
        return SettleRequest(job.job_id, claim.token, decision, now, execution.failure_detail)
    history = history_with(job.failure_history, at_ms=now, attempt=job.attempt, reason=decision.reason or "failed")
    policy = core.settings.policy_for(job)
    if (
        decision.retryable
        and policy is not None
        and job.attempt < policy.max_attempts
        and (decision.after is not None or policy.retries(execution.error))
    ):
        wait = decision.after if decision.after is not None else policy.delay(job.attempt)
        execution.requeue_in = wait.total_seconds()
        # One WARNING line, no traceback (DEBUG and failure_detail have it):
        # an attempt that will be retried is no reason to page anyone.
        log.warning(
            "job %s: attempt %d of %d failed (%s); next attempt at %s (in %.3fs)",
            job.job_id,
            job.attempt,
            policy.max_attempts,
            decision.reason or "failed",
            _log_time(now + duration_ms(wait)),
            wait.total_seconds(),
            extra=execution.job.log_fields,
        )
        return SettleRequest(
            job.job_id, claim.token, decision, now, execution.failure_detail,
            requeue_after_ms=duration_ms(wait), history=history,
        )  # fmt: skip
    _log_final_failure(execution, decision, policy)
    return SettleRequest(job.job_id, claim.token, decision, now, execution.failure_detail, history=history)


def _log_final_failure(execution: Execution, decision: Decision, policy: RetryPolicy | None) -> None:
    """The ERROR line of an attempt that settles the job ``failed``: with its
    handler's traceback when it raised."""
    job = execution.job
    error = execution.error
    attempts = "" if policy is None else f" of {policy.max_attempts}"
    why = "" if decision.retryable or policy is None else "; not retried"
    log.error(
        "job %s: attempt %d%s failed (%s)%s; the job failed",
        job.job_id,
        job.attempt,
        attempts,
        decision.reason or "failed",
        why,
        exc_info=None if error is None else (type(error), error, error.__traceback__),
        extra=job.log_fields,
    )


def _log_time(epoch_ms: int) -> str:
    """An epoch-millisecond instant as a log line shows it (UTC, milliseconds)."""
    return f"{at_epoch_ms(epoch_ms):%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"


def conclude(execution: Execution, settlement: Settlement | None) -> TickResult:
    """What a settle attempt means for the execution (logged, and told to its
    trace); ``settlement`` None when the database refused it (recovery then
    covers the job)."""
    execution.result = _result_of(settlement)
    result = _concluded(execution, settlement)
    execution.traced("concluded", result)
    return result


def _result_of(settlement: Settlement | None) -> str:
    """What a settle did, as the runner's summary counts it."""
    if settlement is None:
        return "rejected"
    if settlement.status is SettleStatus.REQUEUED:
        return "requeued"
    if settlement.status in (SettleStatus.SETTLED, SettleStatus.REPLAYED):
        outcome = settlement.outcome
        return outcome.value if outcome is not None else "settled"
    return "rejected"


def finish(execution: Execution, settlement: Settlement | None) -> None:
    """:func:`conclude` a settle whose result nobody reads (a handed-off
    settle under ``run_forever``): a plain settle that is neither logged nor
    traced is left at that, so the settled job's view is never built."""
    if (
        execution.trace is None
        and settlement is not None
        and settlement.status is SettleStatus.SETTLED
        and not log.isEnabledFor(logging.DEBUG)
    ):
        execution.result = _result_of(settlement)
        return
    conclude(execution, settlement)


def _concluded(execution: Execution, settlement: Settlement | None) -> TickResult:
    job_id = execution.job_id
    if settlement is None:
        return TickResult(TickStatus.REJECTED, None, job_id)
    settled = settlement.job
    if settlement.status is SettleStatus.REQUEUED:
        assert settled is not None
        log.info(
            "job %s: back to %s (attempt %d, %d snooze(s))%s",
            job_id,
            settled.state.value,
            settled.attempt,
            settled.snoozes,
            f" until {settled.ready_at:%Y-%m-%d %H:%M:%S.%f}"[:-3] if settled.ready_at is not None else "",
            extra=execution.job.log_fields,
        )
        return TickResult(TickStatus.REQUEUED, settled, job_id)
    if settlement.status in (SettleStatus.SETTLED, SettleStatus.REPLAYED):
        if log.isEnabledFor(logging.DEBUG):  # the common case: no record built unless logged
            log.debug(
                "settled job %s: %s%s",
                job_id,
                _outcome(settled),
                f" ({settled.failure_reason})" if settled is not None and settled.failure_reason else "",
                extra=execution.job.log_fields,
            )
        return TickResult(TickStatus.SETTLED, settled, job_id)
    if settled is not None and settled.state is JobState.SETTLED:
        log.info("job %s was settled elsewhere (%s); this claim's decision is dropped", job_id, _outcome(settled))
        return TickResult(TickStatus.SETTLED, settled, job_id)
    log.warning("job %s: settlement rejected (%s): the claim was lost", job_id, settlement.status.value)
    return TickResult(TickStatus.REJECTED, settled, job_id)


#: The reason a job is settled ``failed`` with when the database refused to
#: store its own decision (short, to fit constraints the library did not make).
REFUSED_SETTLE_REASON = "settle refused by the database"


def settle_batch(requests: Sequence[SettleRequest], *, fallback: bool = True) -> Steps[list[Settlement | None]]:
    """Settle ``requests`` in one statement; isolate a row the database refuses.

    Every row keeps its own guard (exact token, live lease); only the
    statement and the commit are shared. When the database refuses the
    batch for a reason that is not transient (a constraint the library did
    not create, say), each request is settled alone, so one poison row
    cannot take the others with it; a row refused alone is settled
    ``failed`` with :data:`REFUSED_SETTLE_REASON`, and if even that is
    refused it is left to its lease (logged; recovery then isolates it). A
    transient failure (the database is unreachable) fails the batch:
    recovery covers its jobs.
    """
    try:
        return list((yield StoreCall(store.settle_many, (list(requests),))))
    except WatchdogError as error:
        if store.transient_failure(error):
            log.error("settle of %d job(s) failed (%s); recovery will handle them", len(requests), error)
            return [None] * len(requests)
        if len(requests) > 1:
            log.warning("a batch of %d settles was refused (%s); settling each alone", len(requests), error)
            results: list[Settlement | None] = []
            for request in requests:
                results.extend((yield from settle_batch([request], fallback=fallback)))
            return results
        (request,) = requests
        if not fallback:
            log.error("job %s: the database refused its settlement (%s); left to its lease", request.job_id, error)
            return [None]
        log.error("job %s: the database refused its settlement (%s); settling it failed instead", request.job_id, error)
        failed = SettleRequest(request.job_id, request.claim_token, Decision.failed(REFUSED_SETTLE_REASON), request.now)
        return list((yield from settle_batch([failed], fallback=False)))


def abandon(core: RunnerCore, executions: Sequence[Execution]) -> Steps[TickResult]:
    """End the leases of executions that stopped without deciding (shutdown)
    and recover them at once: requeued within their budget, else settled
    ``interrupted`` with a reason saying the shutdown's grace ran out."""
    budgets = {e.job_id: core.settings.budget_for(e.claim.job) for e in executions}
    recoveries = yield StoreCall(
        store.release_and_recover, ([e.pair for e in executions], budgets), dict(cause=RecoveryCause.SHUTDOWN)
    )
    result = TickResult(TickStatus.REJECTED, None, executions[0].job_id if executions else None)
    claimed = {e.job_id: e.claim.job for e in executions}
    for recovery in recoveries:
        _trace_recovery(claimed[recovery.job_id], recovery, RecoveryCause.SHUTDOWN)
        log.warning(
            "shutdown: job %s was still running after the grace period: %s",
            recovery.job_id,
            recovery.status.value if recovery.job is None else recovery.job.state.value,
        )
        status = TickStatus.REQUEUED if recovery.status is RecoveryStatus.REQUEUED else TickStatus.RECOVERED
        result = TickResult(status, recovery.job, recovery.job_id)
        core.count("requeued" if status is TickStatus.REQUEUED else _outcome(recovery.job))
    return result


def recover(core: RunnerCore) -> Steps[TickResult | None]:
    """Recover the first disappeared claim whose execution is dead.

    Only claims whose lease has ended by the database clock are considered.
    This runner's own lapsed claims are lost (their handlers are told to
    stop); others are probed with ``is_alive`` when one is set: alive
    stays, a probe that raises is *unknown* and stays too. The reconcile is
    conditional on the same token, count and an ended lease, so concurrent
    recoverers never both win. A claim the database refuses to recover is
    isolated for a while, never blocking the others or the loop.
    """
    settings = core.settings
    expired: list[Claim] = yield StoreCall(
        store.expired_claims, kwargs=dict(limit=settings.recovery_batch + len(core.isolated_jobs))
    )
    core.forget_isolated(expired)
    unknown: TickResult | None = None
    for claim in expired:
        if core.isolated(claim):
            continue
        job = claim.job
        own = core.own(job.job_id, claim.token)
        if own is not None:
            yield from stop(own, StopReason.LEASE_LOST)
        elif settings.is_alive is not None:
            alive = yield Probe(job)
            if alive is UNKNOWN:
                unknown = unknown or TickResult(TickStatus.LIVENESS_UNKNOWN, job, job.job_id)
                continue
            if alive:
                continue
        try:
            recovery = yield StoreCall(store.reconcile, (claim,), dict(max_recoveries=settings.budget_for(job)))
        except WatchdogError as error:
            if store.transient_failure(error):
                raise
            core.isolate(claim, error)
            continue
        if recovery.status is RecoveryStatus.LOST_RACE:
            continue
        _trace_recovery(job, recovery, RecoveryCause.VANISHED)
        core.count("recovered")
        if recovery.status is RecoveryStatus.REQUEUED:
            log.warning(
                "recovered job %s: requeued (recovery %d of %s)",
                job.job_id,
                job.recovery_count + 1,
                settings.budget_for(job),
            )
            return TickResult(TickStatus.REQUEUED, recovery.job, job.job_id)
        log.warning(
            "recovered job %s: settled %s (%s)",
            job.job_id,
            _outcome(recovery.job),
            recovery.job.failure_reason if recovery.job else None,
        )
        return TickResult(TickStatus.RECOVERED, recovery.job, job.job_id)
    return unknown


def _trace_recovery(job: JobView, recovery: Recovery, cause: RecoveryCause) -> None:
    instrumentation = telemetry.active()
    if instrumentation is not None and recovery.status is not RecoveryStatus.LOST_RACE:
        with telemetry.guarded("recovered"):
            instrumentation.recovered(job, recovery, cause.value)


def probe_failed(job: JobView, error: BaseException) -> Any:
    """A liveness probe that raised: the execution's state is unknown."""
    log.warning("job %s: liveness probe failed (%s); leaving it alone", job.job_id, redacted(error))
    return UNKNOWN


def renew(core: RunnerCore) -> Steps[None]:
    """The heartbeat: renew every claim this runner holds; tell the handlers
    whose claim was not renewed to stop, and why (judged from the row).

    One whose handler has returned is settling: its renewal fails because
    the settle just committed (nothing to stop), or its claim was lost and
    the database refuses the settle (which logs it) -- either way there is
    no handler left to tell.
    """
    # A timed-out attempt is not renewed: its handler settles within the
    # lease it still has, or -- if it ignores the stop -- its lease ends and
    # recovery takes the job, as for any execution that stopped answering.
    executions = [e for e in core.active() if e.signal.reason is not StopReason.TIMEOUT]
    if not executions:
        return
    held = yield StoreCall(
        store.renew, ([e.pair for e in executions],), dict(lease_ms=core.settings.lease_ms, now=core.clock())
    )
    for execution in executions:
        if execution.job_id in held or not execution.slot_held or execution.signal.is_set() or execution.done.is_set():
            continue
        row = yield StoreCall(store.read, (execution.job_id,))
        yield from stop(execution, stop_reason_of(row))


#: The order a summary lists what jobs became in (others follow, sorted).
_SUMMARY_ORDER = ("completed", "failed", "cancelled", "interrupted", "outcome_unknown", "requeued", "rejected")


def summarize(core: RunnerCore) -> Steps[None]:
    """Log the runner's INFO summary: what the jobs that ended since the
    last one became, how many run now, and the backlog of ready jobs in the
    queues it serves (counted up to :data:`SUMMARY_BACKLOG_CAP`; a failed
    count is left out, never stopping the loop)."""
    seconds, counts, running = core.take_summary()
    try:
        backlog = yield StoreCall(store.count_ready, (core.settings.queues, SUMMARY_BACKLOG_CAP))
        ready = f"{backlog}+" if backlog >= SUMMARY_BACKLOG_CAP else str(backlog)
    except WatchdogError:
        ready = "unknown"
    names = [name for name in _SUMMARY_ORDER if counts.get(name)] + sorted(set(counts) - set(_SUMMARY_ORDER))
    ended = ", ".join(f"{counts[name]} {name}" for name in names) or "none"
    log.info(
        "runner summary: %d job(s) ended in the last %.0fs (%s); %d running; %s ready in %s",
        sum(counts.values()),
        seconds,
        ended,
        running,
        ready,
        ",".join(core.settings.queues),
    )


def loop_pass(core: RunnerCore) -> Steps[float]:
    """One pass of :meth:`Runner.run_forever`'s loop; returns how long to
    wait for a wake-up before the next (0: go on at once).

    Recover when due -- a recovery the database refuses never keeps the
    loop from claiming -- then claim for the free slots and start what was
    claimed. When every free slot was filled there may be more ready work,
    so the next pass follows at once.
    """
    if core.recovery_is_due():
        until_expiry: float | None = None
        try:
            result = yield from recover(core)
            until_expiry = yield StoreCall(store.seconds_until_next_expiry)
        except WatchdogError as error:
            core.defer_failure("recovery", error)
            result = None
        core.schedule_recovery(until_expiry)
        if result is not None and result.status is TickStatus.REQUEUED:
            core.recovery_due = 0.0  # there may be more to recover, and the requeued job is ready
    if core.settings.schedules and core.schedules_are_due():
        yield from enqueue_schedules(core, defer=True)
    if core.promotion_is_due():
        yield from promote(core, defer=True)
    if core.summary_is_due():
        yield from summarize(core)
    yield from prune_workers(core)
    free = core.free_slots()
    if free <= 0:
        core.report_deferred()
        return core.idle_wait()
    executions, cancelled = yield from claim_steps(core, free)
    core.report_deferred()
    if executions:
        yield Spawn(tuple(executions))
    taken = len(executions) + len(cancelled)
    if taken and taken == free:
        if core.waiting is not None:
            core.waiting.busy()  # a backlog: no wake-up needed
        return 0.0
    if core.waiting is not None:
        core.waiting.idle()
    return core.idle_wait()


def prune(core: RunnerCore) -> Steps[None]:
    """Prune settled jobs past the runner's :class:`Retention`: one batch
    per outcome, then a pause; more batches follow soon while there is
    more to delete. One runner at a time (an advisory lock on PostgreSQL;
    SQLite's write lock is exclusive anyway).

    Drivers run it beside the claiming loop (a thread of the sync runner, a
    task of the async one), never in it: a batch's DELETE then delays no
    claim on PostgreSQL, where deleting settled rows locks nothing a claim
    reads; on SQLite it holds the write lock for one batch, as any writer."""
    retention = core.settings.retention
    assert retention is not None
    ages = {outcome.value: age for outcome, age in retention.ages().items()}
    if not ages:
        core.schedule_retention(retention.every.total_seconds())
        return
    try:
        deleted = yield StoreCall(store.prune_retention, (ages, retention.batch))
    except WatchdogError as error:
        log.error("runner: pruning settled jobs failed (%s); trying again later", error)
        core.schedule_retention(retention.every.total_seconds())
        return
    if deleted is None:
        log.debug("another runner is pruning")
    elif deleted:
        log.info("pruned %d settled job(s)", deleted)
    more = deleted is not None and deleted >= retention.batch
    core.schedule_retention(RunnerCore.PRUNE_PAUSE_S if more else retention.every.total_seconds())


def enqueue_schedules(core: RunnerCore, *, defer: bool = False) -> Steps[None]:
    """Enqueue the schedules' due slots ahead of time, and note when to look again.

    Each slot is a delayed job whose ``job_id`` is derived from the
    schedule's name and the slot's time, so however many runners do this,
    one job exists per slot. The next slot of each schedule is enqueued as
    soon as the previous one is due, so it starts on time; a runner that was
    down enqueues at most the schedule's ``catch_up`` missed slots. A slot
    already enqueued with other contents (an older deploy's payload) is kept
    as it is and logged.
    """
    from .schedules import plan

    now = at_epoch_ms(core.clock())  # the runner's clock (a test's fake one too), not datetime.now
    jobs, next_at = plan(core.settings.schedules, now)
    try:
        results = yield StoreCall(store.enqueue_each, (jobs,))
    except WatchdogError as error:
        if defer:
            core.defer_failure("scheduling", error)
        else:
            log.error("runner: enqueueing scheduled jobs failed (%s); trying again soon", error)
        core.schedule_schedules(None)
        return
    for job, result in zip(jobs, results, strict=True):
        if result is None:
            log.warning("schedule slot %s is already enqueued with other contents; kept as it is", job.job_id)
        elif result.status.value == "queued":
            log.info("enqueued schedule slot %s", job.job_id)
    yield from record_schedules(core, jobs, [result is not None for result in results], now)
    until = None if next_at is None else max(0.0, (next_at - now).total_seconds())
    core.schedule_schedules(until)
    if until is not None:
        core.expect_ready(until)


#: The Unix epoch, for epoch milliseconds of a datetime.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# -- the worker's row (revision w0009) ---------------------------------------------------

#: How often a serving runner prunes long-gone workers and forgotten
#: schedules (one bounded batch each time).
WORKER_PRUNE_EVERY_S = 300.0


def register_worker(core: RunnerCore, wakeups: str) -> Steps[None]:
    """Register this serving runner in ``watchdog_workers`` (database clock).
    A failure -- a database not upgraded to the table, say -- is logged as a
    WARNING and the runner serves on, unlisted."""
    import os
    import socket

    from . import __version__

    settings = core.settings
    registration = store.WorkerRegistration(
        worker_id=core.worker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        queues=tuple(settings.queues),
        concurrency=settings.concurrency,
        wakeups=wakeups,
        version=__version__,
        heartbeat_ms=max(1, round(settings.heartbeat_s * 1000)),
    )
    try:
        yield StoreCall(store.register_worker, (registration, len(core.active())))
    except WatchdogError as error:
        log.warning(
            "runner: could not register as worker %s (%s); it serves on, unlisted until a heartbeat registers it "
            "(is the database upgraded? sqlalchemy-watchdog upgrade)",
            core.worker_id,
            error,
        )
        core.unregistered = registration
        return
    core.registration = registration
    core.worker_prune_due = time.monotonic() + WORKER_PRUNE_EVERY_S * random.random()


def refresh_worker(core: RunnerCore) -> Steps[None]:
    """With each heartbeat: refresh this worker's ``last_seen`` (database
    clock) and its running jobs, by the one statement that registered it."""
    registration = core.registration or core.unregistered
    if registration is None:
        return
    try:
        yield StoreCall(store.register_worker, (registration, len(core.active())))
    except WatchdogError as error:
        # A runner that never registered (a database without the table) says so once, at start.
        level = logging.WARNING if core.registration is not None else logging.DEBUG
        log.log(level, "heartbeat: refreshing worker %s failed (%s)", registration.worker_id, error)
        return
    if core.registration is None:
        log.info("runner: registered as worker %s", registration.worker_id)
        core.registration, core.unregistered = registration, None


def deregister_worker(core: RunnerCore) -> Steps[None]:
    """On a clean shutdown: remove this worker's row (a failure leaves it to
    show as gone, then be pruned)."""
    registration, core.registration, core.unregistered = core.registration, None, None
    if registration is None:
        return
    try:
        yield StoreCall(store.deregister_worker, (registration.worker_id,))
    except WatchdogError as error:
        log.warning("shutdown: removing worker %s failed (%s); it will show as gone", registration.worker_id, error)


def prune_workers(core: RunnerCore) -> Steps[None]:
    """Maintenance of a serving runner, every :data:`WORKER_PRUNE_EVERY_S`:
    delete one bounded batch of long-gone workers and forgotten schedules
    (never a job)."""
    if core.registration is None or time.monotonic() < core.worker_prune_due:
        return
    core.worker_prune_due = time.monotonic() + WORKER_PRUNE_EVERY_S
    try:
        deleted = yield StoreCall(store.prune_workers)
    except WatchdogError as error:
        core.defer_failure("pruning gone workers", error)
        return
    if deleted:
        log.debug("pruned %d gone worker(s) and forgotten schedule(s)", deleted)


def record_schedules(core: RunnerCore, jobs: Sequence[Job], enqueued: Sequence[bool], now: datetime) -> Steps[None]:
    """Record the schedules this runner serves (``watchdog_schedules``): each
    one's definition, next slot and latest slot enqueued, by this worker. A
    failure is logged (a WARNING the first time) and never stops scheduling."""
    from .schedules import JOB_ID_PREFIX, fingerprint

    records = []
    for schedule in core.settings.schedules:
        prefix = f"{JOB_ID_PREFIX}{schedule.name}:"
        slots = [
            (job.run_at, done)
            for job, done in zip(jobs, enqueued, strict=True)
            if job.run_at is not None and job.job_id.startswith(prefix)
        ]
        past = [slot for slot, done in slots if done and slot <= now]
        upcoming = [slot for slot, _ in slots if slot > now]
        records.append(
            store.ScheduleRecord(
                name=schedule.name,
                fingerprint=fingerprint(schedule),
                cron=schedule.cron,
                timezone=schedule.timezone,
                queue=schedule.queue,
                next_slot_ms=duration_ms(min(upcoming) - EPOCH) if upcoming else None,
                last_enqueued_ms=duration_ms(max(past) - EPOCH) if past else None,
            )
        )
    try:
        yield StoreCall(store.record_schedules, (records, core.worker_id))
    except WatchdogError as error:
        level = logging.DEBUG if core.schedule_record_failed else logging.WARNING
        core.schedule_record_failed = True
        log.log(level, "runner: recording the schedules it serves failed (%s); scheduling goes on", error)
        return
    core.schedule_record_failed = False


def promote(core: RunnerCore, *, defer: bool = False) -> Steps[None]:
    """Make the delayed jobs whose time has come ``queued``, and note when
    the next one is due. A failure is logged (with ``defer``, together with
    the pass's: :meth:`RunnerCore.defer_failure`) and tried again later: it
    never keeps the runner from claiming what is ready."""
    try:
        promotion = yield StoreCall(store.promote, kwargs=dict(limit=store.PROMOTE_BATCH))
    except WatchdogError as error:
        if defer:
            core.defer_failure("promotion", error)
        else:
            log.error("runner: promoting delayed jobs failed (%s); claiming goes on", error)
        core.schedule_promotion(None)
        return
    if promotion.promoted:
        log.debug("%d delayed job(s) are ready", promotion.promoted)
    core.schedule_promotion(0.0 if promotion.promoted >= store.PROMOTE_BATCH else promotion.next_in)


def tick(core: RunnerCore) -> Steps[TickResult | Execution]:
    """One step of a custom loop: recover a disappeared claim if any; else
    make due delayed jobs ready and claim one job. Returns the recovery's or
    the claim's result, or the execution the driver then runs to the end
    with :func:`execute` (with a heartbeat beside it)."""
    recovery = yield from recover(core)
    if recovery is not None and recovery.status is not TickStatus.LIVENESS_UNKNOWN:
        return recovery
    if core.settings.schedules and core.schedules_are_due():
        yield from enqueue_schedules(core)
    yield from promote(core)
    executions, cancelled = yield from claim_steps(core, 1)
    if cancelled:
        return TickResult(TickStatus.SETTLED, cancelled[0], cancelled[0].job_id)
    if not executions:
        return recovery or TickResult(TickStatus.IDLE)
    return executions[0]


def until_idle(result: TickResult, settled: list[JobView]) -> bool:
    """The rule of ``run_until_idle``: collect what a tick settled; whether
    to stop (nothing was ready, or only executions of unknown liveness)."""
    if result.status in (TickStatus.IDLE, TickStatus.LIVENESS_UNKNOWN):
        return True
    if result.job is not None and result.job.state is JobState.SETTLED:
        settled.append(result.job)
    return False


def shutdown(core: RunnerCore) -> Steps[None]:
    """Shut down: give running handlers ``grace`` to finish, then ask them to
    stop (an async handler's task is cancelled) and give them a short moment
    to settle; what still runs after that has its lease ended on purpose and
    is recovered at once -- never left running under a live lease, never lost."""
    grace = core.settings.grace_s
    yield WaitDone(tuple(core.active()), grace)
    leftover = [e for e in core.active() if not e.done.is_set()]
    if not leftover:
        return
    for execution in leftover:
        yield from stop(execution, StopReason.SHUTDOWN)
    yield WaitDone(tuple(leftover), stop_wait_s(grace))
    leftover = [e for e in leftover if not e.done.is_set()]
    if not leftover:
        return
    try:
        yield from abandon(core, leftover)
    except WatchdogError as error:
        log.error("shutdown: could not hand %d running job(s) to recovery: %s", len(leftover), error)
