"""The worker: :class:`Runner` claims jobs, keeps their leases alive, runs
their handlers and settles them with the exact claim.

::

    from sqlalchemy_watchdog import Runner, handler

    @handler("emails")
    def send_email(job):
        deliver(job.payload["to"])          # None -> settled "completed"

    Runner(engine).run_forever()            # until SIGINT/SIGTERM or stop()
"""

from __future__ import annotations

import enum
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from . import store
from .client import EVENT_QUEUED, EVENT_STOP
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
    "Runner",
    "handler",
    "registered_handlers",
]

log = logging.getLogger(__name__)

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
class _StopSignal:
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
    _signal: _StopSignal = field(repr=False, compare=False)

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


def decision_of_result(result: object) -> Decision:
    """A handler's return value as a decision (None means completed)."""
    if result is None:
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
class _Execution:
    claim: Claim
    job: RunningJob
    signal: _StopSignal
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Runner:
    """A worker that runs the jobs of the queues it serves.

    :param engine: the application's ``Engine`` (PostgreSQL or SQLite).
    :param handlers: ``{queue: handler}``; None uses the handlers registered
        with :func:`handler`.
    :param queues: the queues to serve (default: every queue with a handler).
    :param concurrency: handlers run at once, each in its own thread.
    :param lease: how long a claim lives without a heartbeat.
    :param heartbeat: how often running claims are renewed (at most lease/3).
    :param poll_interval: how often an idle runner looks for work when no
        wake-up arrives (on PostgreSQL, LISTEN/NOTIFY wakes it at once).
    :param grace: on shutdown, how long running handlers may take to finish
        before they are asked to stop and their jobs handed to recovery.
    :param is_alive: ``is_alive(job) -> bool`` probe for executions that live
        outside this process, asked before a claim whose lease ended is
        recovered. True keeps the job running; an exception means unknown
        (the job is neither requeued nor settled). Default: the lease alone.
    """

    def __init__(
        self,
        engine: Engine,
        handlers: Mapping[str, Callable[[RunningJob], Decision | None]] | None = None,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int = 1,
        lease: timedelta = timedelta(seconds=120),
        heartbeat: timedelta = timedelta(seconds=10),
        poll_interval: timedelta = timedelta(seconds=2),
        grace: timedelta = timedelta(seconds=30),
        is_alive: Callable[[JobView], bool] | None = None,
        clock: Callable[[], int] = store.now_ms,
    ) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(
                f"Runner takes an Engine, not {type(engine).__name__}"
                " (use sqlalchemy_watchdog.asyncio.AsyncRunner for an AsyncEngine)"
            )
        self.engine = engine
        self.settings = RunnerSettings.build(
            handlers,
            queues=queues,
            concurrency=concurrency,
            lease=lease,
            heartbeat=heartbeat,
            poll_interval=poll_interval,
            grace=grace,
            is_alive=is_alive,
        )
        self._clock = clock
        self._active: dict[str, _Execution] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._heartbeat_now = threading.Event()
        self._settled: list[JobView] = []
        self._listener: _Listener | None = None

    # -- store access ----------------------------------------------------------

    def _write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def work() -> T:
            with self.engine.connect() as conn:
                return store.transact(conn, fn, *args, **kwargs)

        return store.retrying(work, what=fn.__name__)

    # -- public API ------------------------------------------------------------

    @property
    def queues(self) -> tuple[str, ...]:
        return self.settings.queues

    def stop(self) -> None:
        """Ask :meth:`run_forever` to shut down gracefully (thread-safe)."""
        self._stopping.set()
        self._wake.set()

    def tick(self) -> TickResult:
        """One step: recover a disappeared claim if any, else claim one job,
        run its handler here (with heartbeats) and settle it.

        For custom loops and tests; :meth:`run_forever` is the worker loop.
        """
        recovery = self._recover_one()
        if recovery is not None and recovery.status is not TickStatus.LIVENESS_UNKNOWN:
            return recovery
        batch = self._write(
            store.claim,
            queues=self.settings.queues,
            limit=1,
            lease_ms=self.settings.lease_ms,
            now=self._clock(),
        )
        for job in batch.cancelled:
            log.info("job %s cancelled before it ran", job.job_id)
            return TickResult(TickStatus.SETTLED, job, job.job_id)
        if not batch.claimed:
            return recovery or TickResult(TickStatus.IDLE)
        heartbeat = _Heartbeat(self)
        heartbeat.start()
        try:
            return self._execute(self._track(batch.claimed[0]))
        finally:
            heartbeat.stop()

    def run_until_idle(self, *, max_ticks: int | None = None) -> list[JobView]:
        """Tick until nothing is ready; returns the jobs settled meanwhile.

        The helper for your own test suite: enqueue, then
        ``runner.run_until_idle()`` and assert on the outcomes.
        """
        settled: list[JobView] = []
        ticks = 0
        while max_ticks is None or ticks < max_ticks:
            ticks += 1
            result = self.tick()
            if result.status is TickStatus.IDLE or result.status is TickStatus.LIVENESS_UNKNOWN:
                break
            if result.job is not None and result.job.state is JobState.SETTLED:
                settled.append(result.job)
        return settled

    def run_forever(self, *, install_signal_handlers: bool = True) -> None:
        """Serve the queues until SIGINT/SIGTERM or :meth:`stop`.

        Shutdown stops claiming, gives running handlers ``grace`` to finish,
        then asks them to stop; a job still running after that has its lease
        ended on purpose and is recovered at once (requeued within its
        budget, else settled ``interrupted``) -- never left running under a
        live lease, never lost.
        """
        previous = self._install_signals() if install_signal_handlers else {}
        self._stopping.clear()
        heartbeat = _Heartbeat(self)
        heartbeat.start()
        self._listener = _Listener.start_for(self)
        log.info(
            "runner started: queues=%s concurrency=%d", ",".join(self.queues), self.settings.concurrency
        )
        try:
            self._loop()
        finally:
            try:
                self._shutdown()
            finally:
                heartbeat.stop()
                if self._listener is not None:
                    self._listener.stop()
                    self._listener = None
                for sig, handler_ in previous.items():
                    signal.signal(sig, handler_)
                log.info("runner stopped")

    # -- the loop --------------------------------------------------------------

    def _loop(self) -> None:
        settings = self.settings
        recovery_due = 0.0
        failures = 0
        while not self._stopping.is_set():
            try:
                now = time.monotonic()
                if now >= recovery_due:
                    self._recover_one()
                    wait = self._write(store.seconds_until_next_expiry)
                    recovery_due = time.monotonic() + min(
                        settings.poll_interval_s, settings.poll_interval_s if wait is None else wait
                    )
                free = settings.concurrency - len(self._active)
                claimed = 0
                if free > 0:
                    self._wake.clear()
                    batch = self._write(
                        store.claim,
                        queues=settings.queues,
                        limit=free,
                        lease_ms=settings.lease_ms,
                        now=self._clock(),
                    )
                    for job in batch.cancelled:
                        log.info("job %s cancelled before it ran", job.job_id)
                    for claim in batch.claimed:
                        self._start(self._track(claim))
                    claimed = len(batch.claimed) + len(batch.cancelled)
                failures = 0
                if claimed and claimed == free:
                    continue  # there may be more ready work for free slots
                timeout = max(0.0, min(settings.poll_interval_s, recovery_due - time.monotonic()))
                self._wake.wait(timeout)
            except WatchdogError as error:
                failures += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                log.error("runner: %s; retrying in %.1fs", error, delay)
                self._stopping.wait(delay)
            except Exception:
                failures += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                log.exception("runner: unexpected error; retrying in %.1fs", delay)
                self._stopping.wait(delay)

    def _track(self, claim: Claim) -> _Execution:
        signal_ = _StopSignal()
        job = claim.job
        running = RunningJob(
            job_id=job.job_id,
            queue=job.queue,
            lane=job.lane,
            priority=job.priority,
            payload=job.payload,
            recovery_count=job.recovery_count,
            max_recoveries=job.max_recoveries,
            _signal=signal_,
        )
        execution = _Execution(claim, running, signal_)
        with self._lock:
            self._active[job.job_id] = execution
        log.info("claimed job %s (queue %s, recovery %d)", job.job_id, job.queue, job.recovery_count)
        return execution

    def _start(self, execution: _Execution) -> None:
        thread = threading.Thread(
            target=self._execute,
            args=(execution,),
            name=f"watchdog-job-{execution.claim.job.job_id}"[:60],
            daemon=True,
        )
        execution.thread = thread
        thread.start()

    def _execute(self, execution: _Execution) -> TickResult:
        claim = execution.claim
        job_id = claim.job.job_id
        try:
            decision = self._run_handler(execution)
            try:
                settlement = self._write(
                    store.settle,
                    job_id=job_id,
                    claim_token=claim.token,
                    decision=decision,
                    now=self._clock(),
                )
            except WatchdogError as error:
                log.error("job %s: settlement failed, recovery will handle it: %s", job_id, error)
                return TickResult(TickStatus.REJECTED, None, job_id)
            if settlement.status in (SettleStatus.SETTLED, SettleStatus.REPLAYED):
                assert settlement.job is not None
                log.info(
                    "settled job %s: %s%s",
                    job_id,
                    settlement.job.outcome.value if settlement.job.outcome else "?",
                    f" ({settlement.job.failure_reason})" if settlement.job.failure_reason else "",
                )
                return TickResult(TickStatus.SETTLED, settlement.job, job_id)
            current = settlement.job
            if current is not None and current.state is JobState.SETTLED:
                log.info(
                    "job %s was settled elsewhere (%s); this claim's decision is dropped",
                    job_id,
                    current.outcome.value if current.outcome else "?",
                )
                return TickResult(TickStatus.SETTLED, current, job_id)
            log.warning(
                "job %s: settlement rejected (%s): the claim was lost", job_id, settlement.status.value
            )
            return TickResult(TickStatus.REJECTED, current, job_id)
        finally:
            with self._lock:
                if self._active.get(job_id) is execution:
                    del self._active[job_id]
            execution.done.set()
            self._wake.set()

    def _run_handler(self, execution: _Execution) -> Decision:
        job = execution.job
        fn = self.settings.handlers[job.queue]
        current = self._write(store.read, job.job_id)
        if current is None or current.state is not JobState.RUNNING or current.cancellation_id:
            # Cancelled or failed between claim and start: do not run it; the
            # settle below turns into "cancelled" or is refused.
            execution.signal.request(stop_reason_of(current))
            return Decision.failed("execution stopped before it started")
        try:
            return decision_of_result(fn(job))
        except Exception as error:
            log.warning("job %s: handler raised %s: %s", job.job_id, type(error).__name__, error)
            return decision_of_exception(error)

    # -- heartbeats ------------------------------------------------------------

    def _renew_all(self) -> None:
        with self._lock:
            executions = list(self._active.values())
        if not executions:
            return
        claims = [(e.claim.job.job_id, e.claim.token) for e in executions]
        held = self._write(store.renew, claims, lease_ms=self.settings.lease_ms, now=self._clock())
        for execution in executions:
            job_id = execution.claim.job.job_id
            if job_id in held or execution.signal.event.is_set() or execution.done.is_set():
                continue
            row = self._write(store.read, job_id)
            reason = stop_reason_of(row)
            level = logging.INFO if reason is not StopReason.LEASE_LOST else logging.WARNING
            log.log(level, "job %s: claim not renewed (%s); stopping its handler", job_id, reason.value)
            execution.signal.request(reason)

    # -- recovery --------------------------------------------------------------

    def _recover_one(self) -> TickResult | None:
        """Recover the first disappeared claim whose execution is dead."""
        expired = self._write(store.expired_claims, limit=self.settings.recovery_batch, now=self._clock())
        unknown: TickResult | None = None
        for claim in expired:
            job = claim.job
            with self._lock:
                own = self._active.get(job.job_id)
            if own is not None and own.claim.token == claim.token:
                # Our own claim lapsed (e.g. the database was unreachable): it
                # is lost; stop the handler and let recovery take it.
                own.signal.request(StopReason.LEASE_LOST)
            elif self.settings.is_alive is not None:
                try:
                    alive = self.settings.is_alive(job)
                except Exception as error:
                    log.warning(
                        "job %s: liveness probe failed (%s: %s); leaving it alone",
                        job.job_id,
                        type(error).__name__,
                        error,
                    )
                    unknown = unknown or TickResult(TickStatus.LIVENESS_UNKNOWN, job, job.job_id)
                    continue
                if alive:
                    continue
            recovery = self._write(store.reconcile, claim, now=self._clock())
            if recovery.status == "lost_race":
                continue
            if recovery.status == "requeued":
                log.warning(
                    "recovered job %s: requeued (recovery %d of %s)",
                    job.job_id,
                    job.recovery_count + 1,
                    job.max_recoveries,
                )
                self._wake.set()
                return TickResult(TickStatus.REQUEUED, recovery.job, job.job_id)
            assert recovery.job is not None
            log.warning(
                "recovered job %s: settled %s (%s)",
                job.job_id,
                recovery.job.outcome.value if recovery.job.outcome else "?",
                recovery.job.failure_reason,
            )
            return TickResult(TickStatus.RECOVERED, recovery.job, job.job_id)
        return unknown

    # -- shutdown --------------------------------------------------------------

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("received %s; shutting down", signal.Signals(signum).name)
            self.stop()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
        return previous

    def _shutdown(self) -> None:
        deadline = time.monotonic() + self.settings.grace_s
        for execution in list(self._active.values()):
            execution.done.wait(max(0.0, deadline - time.monotonic()))
        leftover = [e for e in list(self._active.values()) if not e.done.is_set()]
        if not leftover:
            return
        for execution in leftover:
            execution.signal.request(StopReason.SHUTDOWN)
        # A short moment for handlers that honour stop_requested.
        stop_deadline = time.monotonic() + min(2.0, max(0.1, self.settings.grace_s))
        for execution in leftover:
            execution.done.wait(max(0.0, stop_deadline - time.monotonic()))
        leftover = [e for e in leftover if not e.done.is_set()]
        if not leftover:
            return
        claims = [(e.claim.job.job_id, e.claim.token) for e in leftover]
        try:
            released = self._write(_release_and_recover, claims)
        except WatchdogError as error:
            log.error("shutdown: could not hand %d running job(s) to recovery: %s", len(claims), error)
            return
        for recovery in released:
            log.warning(
                "shutdown: job %s still running after the grace period: %s",
                recovery.job_id,
                recovery.status if recovery.job is None else (
                    recovery.job.outcome.value if recovery.job.outcome else recovery.job.state.value
                ),
            )


def _release_and_recover(conn: Connection, claims: list[tuple[str, str]]) -> list[store.Recovery]:
    """End the leases of abandoned claims and recover them at once."""
    store.release(conn, claims)
    tokens = dict(claims)
    results = []
    for expired in store.expired_claims(conn, limit=len(claims) + 64):
        if tokens.get(expired.job.job_id) == expired.token:
            results.append(store.reconcile(conn, expired))
    return results


class _Heartbeat:
    """A thread renewing every running claim of a runner each heartbeat."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.runner._heartbeat_now.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        runner = self.runner
        while not self._stop.is_set():
            runner._heartbeat_now.wait(runner.settings.heartbeat_s)
            runner._heartbeat_now.clear()
            if self._stop.is_set():
                return
            try:
                runner._renew_all()
            except Exception as error:
                log.error("heartbeat failed: %s", error)


class _Listener:
    """LISTEN on PostgreSQL: wake the loop on new work, renew (and so detect
    cancellations and lane failures) at once on stop events."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog-listener", daemon=True)

    @classmethod
    def start_for(cls, runner: Runner) -> _Listener | None:
        if runner.engine.dialect.name != "postgresql":
            return None
        listener = cls(runner)
        listener._thread.start()
        return listener

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _connect(self) -> Any:
        import psycopg

        engine = self.runner.engine
        args, kwargs = engine.dialect.create_connect_args(engine.url)
        conn = psycopg.connect(*args, **kwargs, autocommit=True)
        conn.execute(f"LISTEN {store.sql.CHANNEL}")
        return conn

    def _run(self) -> None:
        runner = self.runner
        failures = 0
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as error:
                failures += 1
                log.warning("listener: cannot connect (%s); polling meanwhile", error)
                self._stop.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))
                continue
            failures = 0
            # Anything committed while we were not listening is found by one pass.
            runner._wake.set()
            try:
                with conn:
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload == EVENT_STOP:
                                runner._heartbeat_now.set()
                            elif note.payload == EVENT_QUEUED:
                                runner._wake.set()
            except Exception as error:
                if not self._stop.is_set():
                    log.warning("listener: connection lost (%s); reconnecting", error)
                    self._stop.wait(0.5)
