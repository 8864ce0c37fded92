"""What the sync :class:`~sqlalchemy_watchdog.Runner` and the
:class:`~sqlalchemy_watchdog.asyncio.AsyncRunner` share.

The decisions of a runner -- how a claimed job is checked, run and settled,
and how a disappeared claim is recovered -- are written once here as
generators of steps (:class:`StoreCall`, :class:`CallHandler`,
:class:`Probe`). Each runner drives them with its own I/O: the sync one
calls the store on a ``Connection`` and handlers in threads, the async one
goes through ``AsyncConnection.run_sync`` and awaits coroutine handlers.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection

from . import store
from .errors import InvalidJob, WatchdogError
from .jobs import (
    QUEUE_MAX_LENGTH,
    Decision,
    JobState,
    JobView,
    Outcome,
    SettleStatus,
    bound_reason,
    check_text,
)
from .store import Claim

__all__ = [
    "Handler",
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

_registry: dict[str, Callable[..., Any]] = {}


def handler(queue: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the handler of ``queue``.

    A :class:`Runner` (or ``AsyncRunner``) built without ``handlers`` serves
    every queue registered this way.
    """
    check_text("queue", queue, QUEUE_MAX_LENGTH)

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        existing = _registry.get(queue)
        if existing is not None and existing is not fn:
            raise ValueError(f"queue {queue!r} already has a handler: {existing!r}")
        _registry[queue] = fn
        return fn

    return register


def registered_handlers() -> dict[str, Callable[..., Any]]:
    """A copy of the handlers registered with :func:`handler`."""
    return dict(_registry)


class StopReason(str, enum.Enum):
    """Why a running handler was asked to stop."""

    CANCELLED = "cancelled"
    LANE_FAILED = "lane_failed"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"


@dataclass(eq=False)
class StopSignal:
    event: threading.Event = field(default_factory=threading.Event)
    reason: StopReason | None = None

    def request(self, reason: StopReason) -> None:
        if self.reason is None:
            self.reason = reason
        self.event.set()


@dataclass(frozen=True)
class RunningJob:
    """The job a handler runs.

    ``stop_requested`` is set when the handler should stop: the job was
    cancelled, its lane failed, its lease was lost, or the runner is shutting
    down (:attr:`stop_reason` says which). A long handler should check it
    (``job.stop_requested.wait(0)`` / ``.is_set()``) between steps.
    """

    job_id: str
    queue: str
    lane: str
    priority: int
    payload: Any
    recovery_count: int
    max_recoveries: int | None
    _signal: StopSignal = field(repr=False, compare=False)

    @property
    def stop_requested(self) -> threading.Event:
        return self._signal.event

    @property
    def stop_reason(self) -> StopReason | None:
        return self._signal.reason


class TickStatus(str, enum.Enum):
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


def decision_of_result(result: object, job: RunningJob) -> Decision | None:
    """A handler's return value as a decision.

    None means ``completed`` -- unless the runner had asked the handler to
    stop for shutdown: then returning None cannot be told apart from
    abandoning the work, so there is no decision and the job is handed to
    recovery (requeued within its budget, else ``interrupted``). A handler
    that did finish says so with ``Decision.completed()``.
    """
    if result is None:
        if job.stop_reason is StopReason.SHUTDOWN:
            return None
        return Decision.completed()
    if isinstance(result, Decision):
        return result
    return Decision.failed(
        f"handler returned {type(result).__name__}, not a Decision or None: {result!r}"[:500]
    )


def decision_of_exception(error: BaseException) -> Decision:
    """A handler's exception as a ``failed`` decision with a bounded reason."""
    return Decision.failed(bound_reason(f"{type(error).__name__}: {error}"))


def stop_reason_of(job: JobView | None) -> StopReason:
    """Why a claim could not be renewed, judged from the stored row."""
    if job is not None and job.cancellation_id is not None:
        return StopReason.CANCELLED
    if job is not None and job.state is JobState.SETTLED and job.outcome is Outcome.FAILED:
        return StopReason.LANE_FAILED
    return StopReason.LEASE_LOST


def check_clock(clock: object) -> Callable[[], int]:
    """Refuse a runner ``clock`` that cannot be called."""
    if not callable(clock):
        raise InvalidJob("clock", f"must be a callable returning epoch milliseconds, not {type(clock).__name__}")
    return clock  # type: ignore[return-value]


def _ms(value: timedelta, name: str) -> int:
    if not isinstance(value, timedelta):
        raise InvalidJob(name, f"must be a datetime.timedelta, not {type(value).__name__}")
    ms = int(value.total_seconds() * 1000)
    if ms <= 0:
        raise InvalidJob(name, f"must be positive, got {value}")
    return ms


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
    recovery_batch: int = 16

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
    ) -> RunnerSettings:
        table = dict(registered_handlers() if handlers is None else handlers)
        for queue, fn in table.items():
            check_text("queue", queue, QUEUE_MAX_LENGTH)
            if not callable(fn):
                raise InvalidJob("handlers", f"handler of {queue!r} is not callable")
        served = tuple(table) if queues is None else tuple(queues)
        if isinstance(queues, str):
            raise InvalidJob("queues", "must be an iterable of queue names, not a str")
        if not served:
            raise InvalidJob(
                "handlers", "no handlers: pass handlers={queue: fn} or register with @handler(queue)"
            )
        for queue in served:
            check_text("queues", queue, QUEUE_MAX_LENGTH)
            if queue not in table:
                raise InvalidJob("queues", f"queue {queue!r} has no handler")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidJob("concurrency", f"must be an int >= 1, got {concurrency!r}")
        lease_ms = _ms(lease, "lease")
        heartbeat_ms = _ms(heartbeat, "heartbeat")
        if heartbeat_ms * 3 > lease_ms:
            raise InvalidJob(
                "heartbeat",
                f"must be at most a third of the lease ({lease}) so a renewal can fail "
                f"twice before the lease ends, got {heartbeat}",
            )
        poll_ms = _ms(poll_interval, "poll_interval")
        if not isinstance(grace, timedelta) or grace.total_seconds() < 0:
            raise InvalidJob("grace", f"must be a non-negative datetime.timedelta, got {grace!r}")
        if is_alive is not None and not callable(is_alive):
            raise InvalidJob("is_alive", "must be callable")
        return cls(
            handlers=table,
            queues=served,
            concurrency=concurrency,
            lease_ms=lease_ms,
            heartbeat_s=heartbeat_ms / 1000,
            poll_interval_s=poll_ms / 1000,
            grace_s=grace.total_seconds(),
            is_alive=is_alive,
        )


@dataclass(eq=False)
class Execution:
    """A claim this runner is executing, with its handler's view and stop signal."""

    claim: Claim
    job: RunningJob
    signal: StopSignal
    done: threading.Event = field(default_factory=threading.Event)
    task: Any = None
    #: When the claim was asked for, on this process's monotonic clock: no
    #: later than the database took it, so a pause anywhere after that point
    #: (even before the claim's answer was read) counts against the start.
    claimed_at: float = field(default_factory=time.monotonic)
    #: Whether it still occupies one of the runner's ``concurrency`` slots:
    #: from the claim until its handler returns. Its settle then overlaps
    #: with the next claim; the heartbeat keeps renewing it until settled.
    slot_held: bool = True

    @classmethod
    def of(cls, claim: Claim, asked_at: float) -> Execution:
        """The execution of ``claim``, asked for at ``asked_at`` (``time.monotonic()``
        read before the claim statement was sent)."""
        signal = StopSignal()
        job = claim.job
        running = RunningJob(
            job_id=job.job_id,
            queue=job.queue,
            lane=job.lane,
            priority=job.priority,
            payload=job.payload,
            recovery_count=job.recovery_count,
            max_recoveries=job.max_recoveries,
            _signal=signal,
        )
        log.info("claimed job %s (queue %s, recovery %d)", job.job_id, job.queue, job.recovery_count)
        return cls(claim, running, signal, claimed_at=asked_at)

    @property
    def job_id(self) -> str:
        return self.claim.job.job_id

    @property
    def pair(self) -> tuple[str, str]:
        return (self.claim.job.job_id, self.claim.token)


# -- steps ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreCall:
    """Run ``fn(conn, *args, **kwargs)`` in a write transaction of its own."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CallHandler:
    """Run the execution's handler; the answer is its :class:`Decision`, or
    None when shutdown stopped it before it decided."""

    execution: Execution


@dataclass(frozen=True, slots=True)
class Probe:
    """Ask ``is_alive(job)``; the answer is True, False, or :data:`UNKNOWN`."""

    job: JobView


UNKNOWN = object()
Step = StoreCall | CallHandler | Probe
Steps = Generator[Step, Any, T]


def slots_taken(executions: Iterable[Execution]) -> int:
    """How many of the runner's concurrency slots are in use."""
    return sum(1 for e in executions if e.slot_held)


def drive(steps: Steps[T], perform: Callable[[Step], Any]) -> T:
    """Run ``steps`` with a sync ``perform``; its WatchdogErrors go back in.

    Any other exception from ``perform`` leaves ``steps`` suspended at that
    step, so a runner may answer it later with :func:`resume`.
    """
    try:
        return _drive_from(steps, next(steps), perform)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def resume(
    steps: Steps[T], perform: Callable[[Step], Any], *, answer: Any = None, error: WatchdogError | None = None
) -> T:
    """Go on with ``steps`` after its current step was answered elsewhere
    (``answer``, or ``error`` thrown back in), then as :func:`drive`."""
    try:
        return _drive_from(steps, steps.throw(error) if error is not None else steps.send(answer), perform)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _drive_from(steps: Steps[T], step: Step, perform: Callable[[Step], Any]) -> T:
    """Perform ``step`` and every later one until ``steps`` raises StopIteration."""
    while True:
        try:
            answer = perform(step)
        except WatchdogError as error:
            step = steps.throw(error)
            continue
        step = steps.send(answer)


async def drive_async(steps: Steps[T], perform: Callable[[Step], Awaitable[Any]]) -> T:
    """Run ``steps`` with an async ``perform``."""
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


def execute(
    execution: Execution, clock: Callable[[], int], *, fresh_for: float, lease_ms: int
) -> Steps[TickResult]:
    """Run the handler unless the claim was already stopped or lost, settle
    with the exact claim, and say what happened.

    The execution is registered with its runner when it is claimed, before
    the handler starts, so a cancellation or lane failure recorded after the
    claim reaches it through the heartbeat (at once on PostgreSQL, through
    NOTIFY): if that happened before the start, the handler never runs.
    A handler that starts within ``fresh_for`` seconds of its claim (the
    heartbeat interval, well inside the lease) needs no database check; one
    that starts later -- the process was paused, starved or stopped between
    claim and start -- first renews its exact claim, and does not run if the
    claim was lost meanwhile (another runner may already be running it).
    Either way the settle below is guarded by the database: a recorded
    cancellation turns it into ``cancelled``, a lost claim is refused.
    """
    job_id = execution.job_id
    try:
        if time.monotonic() - execution.claimed_at > fresh_for and not execution.signal.event.is_set():
            held = yield StoreCall(store.renew, ([execution.pair],), dict(lease_ms=lease_ms, now=clock()))
            if job_id not in held:
                lost(execution, (yield StoreCall(store.read, (job_id,))))
        if execution.signal.reason is StopReason.SHUTDOWN:
            decision: Decision | None = None
        elif execution.signal.event.is_set():
            decision = Decision.failed(f"execution stopped before it started ({_reason(execution)})")
        else:
            decision = yield CallHandler(execution)
        if decision is None:
            # Stopped by shutdown before it decided: hand it to recovery now.
            recoveries = yield StoreCall(release_and_recover, ([execution.pair],))
            for recovery in recoveries:
                status = TickStatus.REQUEUED if recovery.status == "requeued" else TickStatus.RECOVERED
                return TickResult(status, recovery.job, job_id)
            return TickResult(TickStatus.REJECTED, None, job_id)
        settlement = yield StoreCall(
            store.settle,
            kwargs=dict(
                job_id=job_id, claim_token=execution.claim.token, decision=decision, now=clock()
            ),
        )
    except WatchdogError as error:
        log.error("job %s: settlement failed, recovery will handle it: %s", job_id, error)
        return TickResult(TickStatus.REJECTED, None, job_id)
    settled = settlement.job
    if settlement.status in (SettleStatus.SETTLED, SettleStatus.REPLAYED):
        log.info(
            "settled job %s: %s%s",
            job_id,
            _outcome(settled),
            f" ({settled.failure_reason})" if settled.failure_reason else "",
        )
        return TickResult(TickStatus.SETTLED, settled, job_id)
    if settled is not None and settled.state is JobState.SETTLED:
        log.info("job %s was settled elsewhere (%s); this claim's decision is dropped", job_id, _outcome(settled))
        return TickResult(TickStatus.SETTLED, settled, job_id)
    log.warning("job %s: settlement rejected (%s): the claim was lost", job_id, settlement.status.value)
    return TickResult(TickStatus.REJECTED, settled, job_id)


def _reason(execution: Execution) -> str:
    reason = execution.signal.reason
    return reason.value if reason is not None else "stop requested"


def _outcome(job: JobView | None) -> str:
    return job.outcome.value if job is not None and job.outcome is not None else "?"


def recover_one(settings: RunnerSettings, active: Mapping[str, Execution]) -> Steps[TickResult | None]:
    """Recover the first disappeared claim whose execution is dead.

    Only claims whose lease has ended are considered. This runner's own
    lapsed claims are lost (their handlers are told to stop); others are
    probed with ``is_alive`` when one is set: alive stays, a probe that
    raises is *unknown* and stays too. The reconcile is conditional on the
    same token, count and an ended lease, so concurrent recoverers never
    both win.
    """
    expired = yield StoreCall(store.expired_claims, kwargs=dict(limit=settings.recovery_batch))
    unknown: TickResult | None = None
    for claim in expired:
        job = claim.job
        own = active.get(job.job_id)
        if own is not None and own.claim.token == claim.token:
            own.signal.request(StopReason.LEASE_LOST)
            log.warning("job %s: this runner's own lease ended; stopping its handler", job.job_id)
        elif settings.is_alive is not None:
            alive = yield Probe(job)
            if alive is UNKNOWN:
                unknown = unknown or TickResult(TickStatus.LIVENESS_UNKNOWN, job, job.job_id)
                continue
            if alive:
                continue
        recovery = yield StoreCall(store.reconcile, (claim,))
        if recovery.status == "lost_race":
            continue
        if recovery.status == "requeued":
            log.warning(
                "recovered job %s: requeued (recovery %d of %s)",
                job.job_id,
                job.recovery_count + 1,
                job.max_recoveries,
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


def probe_failed(job: JobView, error: BaseException) -> object:
    log.warning(
        "job %s: liveness probe failed (%s: %s); leaving it alone", job.job_id, type(error).__name__, error
    )
    return UNKNOWN


def renewals(executions: Iterable[Execution], held: set[str]) -> list[Execution]:
    """The executions whose claim was not renewed and whose handler still runs.

    One whose handler has returned is settling: its renewal fails because
    the settle just committed (nothing to stop), or its claim was lost and
    the database refuses the settle (which logs it) -- either way there is
    no handler left to tell.
    """
    return [
        e
        for e in executions
        if e.job_id not in held and e.slot_held and not e.signal.event.is_set() and not e.done.is_set()
    ]


def lost(execution: Execution, row: JobView | None) -> StopReason:
    """Tell a handler whose claim was not renewed to stop, and why."""
    reason = stop_reason_of(row)
    level = logging.INFO if reason is not StopReason.LEASE_LOST else logging.WARNING
    log.log(level, "job %s: claim not renewed (%s); stopping its handler", execution.job_id, reason.value)
    execution.signal.request(reason)
    return reason


def release_and_recover(conn: Connection, claims: list[tuple[str, str]]) -> list[store.Recovery]:
    """End the leases of abandoned claims and recover them at once (shutdown)."""
    store.release(conn, claims)
    tokens = dict(claims)
    results = []
    for expired in store.expired_claims(conn, limit=len(claims) + 64):
        if tokens.get(expired.job.job_id) == expired.token:
            recovery = store.reconcile(conn, expired)
            log.warning(
                "shutdown: job %s still running after the grace period: %s",
                recovery.job_id,
                recovery.status if recovery.job is None else (
                    recovery.job.outcome.value if recovery.job.outcome else recovery.job.state.value
                ),
            )
            results.append(recovery)
    return results
