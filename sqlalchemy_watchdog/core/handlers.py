"""Handlers and what a handler sees: the registry, RunningJob, stop signals."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import InvalidJob
from ..executor_config import ExecutorName, ProcessExecutor, check_executor
from ..jobs import (
    QUEUE_MAX_LENGTH,
    RetryPolicy,
    check_duration,
    check_step_name,
    check_text,
)
from ..records import StopReason as StopReason
from .durable import DurableSteps, check_undo, check_wait, run_without_runner
from .progress import ProgressReporter, ProgressStatus, check_progress

T = TypeVar("T")

if TYPE_CHECKING:
    from ..records import ParentResult

log = logging.getLogger("sqlalchemy_watchdog.runner")


#: A handler takes the running job; it returns None (completed), a Decision,
#: or a value (completed, keeping it as the job's result).
Handler = Callable[["RunningJob"], Any]


_UNSET: Any = object()


def _check_undo(name: object, undo: object) -> None:
    """A step's ``undo``, checked where no runner records it."""
    if undo is not None:
        check_undo(check_step_name(name), undo)


@dataclass(frozen=True, slots=True)
class HandlerPolicy:
    """What ``@handler(queue, ...)`` set for the jobs of its queue that carry
    none of their own; a field not given is :data:`_UNSET` (the runner's
    own setting applies)."""

    max_recoveries: int | None = _UNSET
    retry: RetryPolicy | None = _UNSET
    timeout: timedelta | None = _UNSET
    #: Where the handler runs: ``"thread"`` (the runner's own process) or a
    #: :class:`~sqlalchemy_watchdog.ProcessExecutor` (child processes).
    executor: ProcessExecutor | ExecutorName = _UNSET


@dataclass(frozen=True, slots=True)
class _Registered:
    """A registry entry: the handler of a queue and its policy."""

    fn: Callable[..., Any]
    max_recoveries: int | None
    retry: RetryPolicy | None = None
    timeout: timedelta | None = None
    executor: ProcessExecutor | ExecutorName = _UNSET

    @property
    def policy(self) -> HandlerPolicy:
        return HandlerPolicy(self.max_recoveries, self.retry, self.timeout, self.executor)


def check_handler_executor(value: object) -> ProcessExecutor | ExecutorName:
    """A handler's own ``executor``: ``"thread"``, or the
    :class:`~sqlalchemy_watchdog.ProcessExecutor` that ``"process"`` or the
    value given names (an :class:`~sqlalchemy_watchdog.InvalidJob` naming
    ``executor`` otherwise)."""
    if value is None:
        raise InvalidJob("executor", 'must be "thread", "process" or a ProcessExecutor, got None')
    checked = check_executor(value)
    return "thread" if checked is None else checked


#: The attribute ``@handler`` puts on the function it registers: its
#: policies by queue. ``functools.wraps`` copies it onto a wrapper (and sets
#: ``__wrapped__``, which is followed too), so wrapping a handler keeps its
#: retry, timeout and recovery budget.
POLICY_ATTRIBUTE = "__watchdog_policies__"


def _attached(fn: object) -> Mapping[str, HandlerPolicy]:
    """The policies attached to ``fn`` or to a function it wraps."""
    seen: set[int] = set()
    current: object = fn
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = getattr(current, POLICY_ATTRIBUTE, None)
        if isinstance(found, Mapping):
            return found
        current = getattr(current, "__wrapped__", None)
    return {}


def _same(registered: Callable[..., Any], fn: object) -> bool:
    """Whether ``fn`` is the registered handler (a bound method is made anew
    at each attribute access, so equal ones count)."""
    return registered is fn or (inspect.ismethod(registered) and registered == fn)


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


class HandlerRegistry:
    """Handlers by queue, as ``@handler`` registers them; each handler
    carries its policy (:data:`POLICY_ATTRIBUTE`)."""

    def __init__(self) -> None:
        self.entries: dict[str, _Registered] = {}

    def register(
        self,
        queue: str,
        *,
        max_recoveries: int | None = _UNSET,
        retry: RetryPolicy | None = _UNSET,
        timeout: timedelta | None = _UNSET,
        executor: ProcessExecutor | str = _UNSET,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """The decorator of :func:`handler`, for this registry."""
        check_text("queue", queue, QUEUE_MAX_LENGTH)
        budget = _UNSET if max_recoveries is _UNSET else _check_budget("max_recoveries", max_recoveries)
        policy = _UNSET if retry is _UNSET else check_retry(retry)
        limit = _UNSET if timeout is _UNSET else check_timeout(timeout)
        where: ProcessExecutor | ExecutorName = _UNSET
        if executor is not _UNSET:
            where = check_handler_executor(executor)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            existing = self.entries.get(queue)
            if existing is not None and existing.fn is not fn:
                raise ValueError(f"queue {queue!r} already has a handler: {existing.fn!r}")
            entry = _Registered(fn, budget, policy, limit, where)
            try:  # a new mapping: a wrapper sharing the old one (functools.wraps) keeps what it had
                setattr(fn, POLICY_ATTRIBUTE, {**_attached(fn), queue: entry.policy})
            except (AttributeError, TypeError):
                pass  # a callable without attributes (a bound method): found by the registry alone
            self.entries[queue] = entry
            return fn

        return register

    def handlers(self) -> dict[str, Callable[..., Any]]:
        """A copy of the handlers registered, by queue."""
        return {queue: entry.fn for queue, entry in self.entries.items()}

    def policy_for(self, queue: str, fn: object) -> HandlerPolicy | None:
        """The policy of ``fn`` serving ``queue``: the one ``@handler(queue,
        ...)`` attached to it or to the function it wraps, else the one this
        registry holds for that very handler; None: it has none."""
        attached = _attached(fn).get(queue)
        if attached is not None:
            return attached
        entry = self.entries.get(queue)
        return entry.policy if entry is not None and _same(entry.fn, fn) else None


#: The registry behind the module-level :func:`handler`.
default_registry = HandlerRegistry()
#: Its entries, by queue (read by :mod:`sqlalchemy_watchdog.applies`).
_registry = default_registry.entries


def handler(
    queue: str,
    *,
    max_recoveries: int | None = _UNSET,
    retry: RetryPolicy | None = _UNSET,
    timeout: timedelta | None = _UNSET,
    executor: ProcessExecutor | str = _UNSET,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the handler of ``queue``.

    A :class:`~sqlalchemy_watchdog.Runner` (or ``AsyncRunner``) built
    without ``handlers`` serves every queue registered this way. The
    policy given here goes with the function (a wrapper made with
    ``functools.wraps`` keeps it), also when it is passed in ``handlers``.

    :param max_recoveries: the recovery budget of this queue's jobs that do
        not carry one of their own (``Job(max_recoveries=None)``): how many
        times a job whose execution disappeared (killed worker, lost lease)
        is requeued before it settles ``interrupted``. Overrides the
        runner's ``max_recoveries`` for this queue.
    :param retry: the :class:`~sqlalchemy_watchdog.RetryPolicy` of this
        queue's jobs that carry none of their own; overrides the runner's.
    :param timeout: how long one attempt of this queue's jobs may run when
        the job sets no ``timeout`` of its own; overrides the runner's.
    :param executor: where this queue's jobs run, whatever the runner's
        own ``executor``: ``"thread"`` (the runner's process), ``"process"``
        or a :class:`~sqlalchemy_watchdog.ProcessExecutor` (child
        processes; the function must then be importable by module path).
        One runner serves thread and process queues side by side, each
        executor with slots of its own (see the executors how-to).
    """
    return default_registry.register(
        queue, max_recoveries=max_recoveries, retry=retry, timeout=timeout, executor=executor
    )


def registered_handlers() -> dict[str, Callable[..., Any]]:
    """A copy of the handlers registered with :func:`handler`."""
    return default_registry.handlers()


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
    #: The job's flow-control key (``Job.key``), if it has one.
    key: str | None = None
    _progress: ProgressReporter | None = field(default=None, repr=False, compare=False)

    def progress(self, fraction: float, note: str | None = None) -> ProgressStatus:
        """Report how far the job is (``fraction`` from 0 to 1, and an
        optional ``note`` of at most 500 characters), for ``JobView.progress``,
        ``show`` and the dashboard. Written under the exact claim, at most
        once a second per job: a report that comes sooner is kept and
        written by the next one or with the settlement (``DEFERRED``).
        ``LOST``: the job no longer holds its claim; nothing was written.
        In a coroutine handler use :meth:`progress_async`.

        :raises ~sqlalchemy_watchdog.InvalidJob: ``fraction`` outside [0, 1]
            (or not a number), a ``note`` too long or not text.
        """
        reporter = self._progress
        if reporter is None:  # made outside a runner: checked, kept nowhere
            check_progress(fraction, note)
            return ProgressStatus.DEFERRED
        return reporter.report(fraction, note)

    async def progress_async(self, fraction: float, note: str | None = None) -> ProgressStatus:
        """:meth:`progress` for a coroutine handler (it never blocks the loop)."""
        reporter = self._progress
        if reporter is None:
            check_progress(fraction, note)
            return ProgressStatus.DEFERRED
        return await reporter.report_async(fraction, note)

    def parent_results(self) -> tuple[ParentResult, ...]:
        """The jobs this one waited for (``Job(after=...)``), each with its
        state, outcome and result (as stored: a codec's JSON form), by
        job_id -- for a callback that combines its parents' work. Read now,
        in a transaction of its own; in a coroutine handler use
        :meth:`parent_results_async`. ``()`` for a job without parents."""
        reporter = self._progress
        if reporter is None or reporter.read is None:
            if reporter is not None and reporter.read_async is not None and reporter._loop is not None:
                return tuple(
                    asyncio.run_coroutine_threadsafe(reporter.read_async(self.job_id), reporter._loop).result()
                )
            raise RuntimeError("parent_results() reads through a runner; this job was not claimed by one")
        return tuple(reporter.read(self.job_id))

    async def parent_results_async(self) -> tuple[ParentResult, ...]:
        """:meth:`parent_results` for a coroutine handler."""
        reporter = self._progress
        if reporter is not None and reporter.read_async is not None:
            return tuple(await reporter.read_async(self.job_id))
        if reporter is not None and reporter.read is not None:
            return tuple(await asyncio.to_thread(reporter.read, self.job_id))
        raise RuntimeError("parent_results() reads through a runner; this job was not claimed by one")

    # -- durable steps (revision w0021) ---------------------------------------------

    def _steps(self) -> DurableSteps | None:
        reporter = self._progress
        return None if reporter is None else reporter.steps

    def step(
        self, name: str, fn: Callable[..., T], /, *args: Any, undo: Callable[[T], Any] | None = None, **kwargs: Any
    ) -> T:
        """Run ``fn(*args, **kwargs)`` as the durable step ``name``: the first
        time, ``fn`` runs and its result (encoded by the runner's codec, a
        job result's limits) is recorded under this job's exact claim; a
        later attempt of this job -- a retry, a recovery after its runner
        died, a resumed :meth:`sleep` -- gets the recorded result back and
        ``fn`` does not run again. Names are unique per job (1-256
        characters); keep the steps' order and names when you change the
        handler's code while jobs run (docs/howto/durable-steps.md). In a
        coroutine handler use :meth:`step_async`.

        ``undo``: a function called with the step's result if the job fails
        for good (its handler raised or timed out, and no retry follows): the undos of the
        recorded steps run last step first, each recorded once it returned
        (compensation). In a process child it must be a plain module-level
        function: the child sends it by reference and the runner runs it in its
        own process. ``undo`` is not passed to ``fn``.

        :raises ~sqlalchemy_watchdog.InvalidJob: a bad ``name``, a name used
            twice in one attempt, or a result the codec or JSON cannot hold
            (checked before anything is recorded).
        :raises ~sqlalchemy_watchdog.core.durable.StepNotRecorded: ``fn``
            ran but the job no longer holds its claim: stop.
        """
        steps = self._steps()
        if steps is None:
            _check_undo(name, undo)
            return run_without_runner(name, fn, args, kwargs)  # type: ignore[no-any-return]
        return steps.step(name, fn, args, kwargs, undo)  # type: ignore[no-any-return]

    async def step_async(
        self, name: str, fn: Callable[..., Any], /, *args: Any, undo: Callable[[Any], Any] | None = None, **kwargs: Any
    ) -> Any:
        """:meth:`step` in a coroutine handler; ``fn`` (and ``undo``) may be coroutine functions."""
        steps = self._steps()
        if steps is None:
            _check_undo(name, undo)
            value = run_without_runner(name, fn, args, kwargs)
            return await value if inspect.isawaitable(value) else value
        return await steps.step_async(name, fn, args, kwargs, undo)

    def transaction_step(
        self,
        session: Any,
        name: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        undo: Callable[[T], Any] | None = None,
        **kwargs: Any,
    ) -> T:
        """:meth:`step` whose record commits with ``fn``'s own writes: ``fn``
        writes through ``session`` (a ``Session`` or ``Connection`` on the
        queue's database, not inside a transaction of yours yet), then the
        step is recorded on that same transaction and it is committed. A
        crash before the commit leaves neither the writes nor the record,
        and the step runs again; after it, never. If ``fn`` raises, the
        transaction is rolled back. In a coroutine handler (``AsyncSession``)
        use :meth:`transaction_step_async`; not in a process child."""
        steps = self._steps()
        if steps is None:
            _check_undo(name, undo)
            value = run_without_runner(name, fn, args, kwargs)
            session.commit()
            return value  # type: ignore[no-any-return]
        return steps.transaction_step(session, name, fn, args, kwargs, undo)  # type: ignore[no-any-return]

    async def transaction_step_async(
        self,
        session: Any,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        undo: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """:meth:`transaction_step` with an ``AsyncSession``; ``fn`` (and ``undo``) may be coroutine functions."""
        steps = self._steps()
        if steps is None:
            _check_undo(name, undo)
            value = run_without_runner(name, fn, args, kwargs)
            value = await value if inspect.isawaitable(value) else value
            await session.commit()
            return value
        return await steps.transaction_step_async(session, name, fn, args, kwargs, undo)

    def wait_for(self, name: str, *, timeout: timedelta) -> Any:
        """Wait durably for signal ``name`` (``Watchdog.signal(job_id, name,
        payload)``) for at most ``timeout`` (counted on the database clock
        from the first time this job waits for it) and return its payload.

        The wait is recorded as a step named ``name``. When the signal is
        kept already -- sent before the wait, or by an earlier attempt's
        wait -- its payload returns at once. Otherwise the attempt ends (the
        job is snoozed until the timeout, its slot freed, no attempt
        counted) and the signal, when it comes, makes the job due at once:
        it runs again from the top, its recorded steps returning their
        results, and this call returns the payload. Every attempt gets the
        same answer. In a coroutine handler use :meth:`wait_for_async`.

        :raises ~sqlalchemy_watchdog.core.durable.WaitRequested: to end the
            attempt; let it propagate.
        :raises ~sqlalchemy_watchdog.core.durable.WaitTimedOut: the timeout
            passed with no signal ``name`` kept within it (a signal kept
            later does not count). Uncaught, the job fails without a retry.
        :raises ~sqlalchemy_watchdog.InvalidJob: a bad ``name`` or
            ``timeout`` (a positive timedelta), before anything is recorded.
        """
        steps = self._steps()
        if steps is None:
            check_wait(timeout)
            check_step_name(name)
            raise RuntimeError("wait_for() needs a runner: this job was not claimed by one")
        return steps.wait_for(name, timeout)

    async def wait_for_async(self, name: str, *, timeout: timedelta) -> Any:
        """:meth:`wait_for` in a coroutine handler."""
        steps = self._steps()
        if steps is None:
            check_wait(timeout)
            check_step_name(name)
            raise RuntimeError("wait_for_async() needs a runner: this job was not claimed by one")
        return await steps.wait_for_async(name, timeout)

    def sleep(self, delay: timedelta, *, name: str | None = None) -> None:
        """Sleep durably for ``delay``: the end of the sleep (database clock)
        is recorded, the attempt ends (the job is snoozed: its slot is freed,
        no attempt counted) and the job runs again when the time comes --
        across restarts -- its recorded steps returning their results and
        this sleep passing at once. ``name``: the sleep's step name
        (default ``sleep#N``, the N-th sleep of the run). In a coroutine
        handler use :meth:`sleep_async`.

        :raises ~sqlalchemy_watchdog.core.durable.SleepRequested: to end the
            attempt; let it propagate.
        """
        steps = self._steps()
        if steps is None:
            DurableSteps._delay_ms(delay)
            raise RuntimeError("sleep() needs a runner: this job was not claimed by one")
        steps.sleep(name, delay=delay)

    def sleep_until(self, when: datetime, *, name: str | None = None) -> None:
        """:meth:`sleep` until ``when`` (an aware datetime; in the past: no sleep)."""
        steps = self._steps()
        if steps is None:
            DurableSteps._delay_ms(until=when)
            raise RuntimeError("sleep_until() needs a runner: this job was not claimed by one")
        steps.sleep(name, until=when)

    async def sleep_async(self, delay: timedelta, *, name: str | None = None) -> None:
        """:meth:`sleep` in a coroutine handler."""
        steps = self._steps()
        if steps is None:
            DurableSteps._delay_ms(delay)
            raise RuntimeError("sleep_async() needs a runner: this job was not claimed by one")
        await steps.sleep_async(name, delay=delay)

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
