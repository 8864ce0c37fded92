"""The worker: :class:`Runner` claims jobs, keeps their leases alive, runs
their handlers in threads and settles them with the exact claim.

::

    from sqlalchemy_watchdog import Runner, handler

    @handler("emails")
    def send_email(job):
        deliver(job.payload["to"])          # None -> settled "completed"

    Runner(engine).run_forever()            # until SIGINT/SIGTERM or stop()
"""

from __future__ import annotations

import functools
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from datetime import timedelta
from types import FrameType
from typing import Any, TypeVar

from sqlalchemy import Engine

from . import store
from .client import EVENT_QUEUED, EVENT_STOP
from .errors import ErrorCode, WatchdogError
from .execution import (
    CallHandler,
    Execution,
    Probe,
    RunnerSettings,
    RunningJob,
    Step,
    StopReason,
    StoreCall,
    TickResult,
    TickStatus,
    check_clock,
    decision_of_exception,
    decision_of_result,
    drive,
    execute,
    lost,
    probe_failed,
    recover_one,
    release_and_recover,
    renewals,
    resume,
    slots_taken,
)
from .jobs import Decision, JobState, JobView

__all__ = ["Runner"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Runner:
    """A worker that runs the jobs of the queues it serves.

    :param engine: the application's ``Engine`` (PostgreSQL or SQLite).
    :param handlers: ``{queue: handler}``; None uses the handlers registered
        with :func:`~sqlalchemy_watchdog.handler`. A handler is called with a
        :class:`RunningJob` and returns None (``completed``) or a
        :class:`Decision`; an exception settles ``failed``.
    :param queues: the queues to serve (default: every queue with a handler).
    :param concurrency: handlers run at once, each in its own thread.
    :param lease: how long a claim lives without a heartbeat.
    :param heartbeat: how often running claims are renewed (at most lease/3).
    :param poll_interval: how often an idle runner looks for work when no
        wake-up arrives (on PostgreSQL, LISTEN/NOTIFY wakes it at once).
    :param grace: on shutdown, how long running handlers may take to finish
        before they are asked to stop and their jobs handed to recovery.
    :param is_alive: ``is_alive(job) -> bool`` for executions that live
        outside this process, asked before a claim whose lease ended is
        recovered. True leaves the job running; an exception means unknown
        (neither requeued nor settled). Default: the lease alone decides.
    :param clock: the application clock in epoch milliseconds (for tests);
        the database clock is always consulted too.
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
        self._clock = check_clock(clock)
        self._active: dict[str, Execution] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._heartbeat_now = threading.Event()
        self._settler: _Settler | None = None
        self._workers: _Workers | None = None
        self._autocommit = store.self_committing(engine.dialect.name)

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues this runner claims from."""
        return self.settings.queues

    # -- driving the shared steps ------------------------------------------------

    def _store(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def work() -> T:
            with self.engine.connect() as conn:
                return store.transact(conn, fn, *args, autocommit=self._autocommit, **kwargs)

        return store.retrying(work, what=fn.__name__)

    def _perform(self, step: Step) -> Any:
        if isinstance(step, StoreCall):
            settler = self._settler
            if step.fn is store.settle and settler is not None:
                return settler.settle(step.kwargs)
            return self._store(step.fn, *step.args, **step.kwargs)
        if isinstance(step, CallHandler):
            job = step.execution.job
            try:
                return decision_of_result(self.settings.handlers[job.queue](job), job)
            except Exception as error:
                log.warning("job %s: handler raised %s: %s", job.job_id, type(error).__name__, error)
                return decision_of_exception(error)
            finally:
                self._free_slot(step.execution)
        if isinstance(step, Probe):
            try:
                return bool(self.settings.is_alive(step.job))  # type: ignore[misc]
            except Exception as error:
                return probe_failed(step.job, error)
        raise TypeError(step)  # pragma: no cover

    def _active_view(self) -> dict[str, Execution]:
        with self._lock:
            return dict(self._active)

    def _recover_one(self) -> TickResult | None:
        result = drive(recover_one(self.settings, self._active_view()), self._perform)
        if result is not None and result.status is TickStatus.REQUEUED:
            self._wake.set()
        return result

    def _claim(self, limit: int) -> tuple[list[Execution], tuple[JobView, ...]]:
        """Claim up to ``limit`` jobs: the executions to run, and the jobs
        found cancelled while queued (settled by the claim itself)."""
        asked_at = time.monotonic()
        batch = self._store(
            store.claim,
            queues=self.settings.queues,
            limit=limit,
            lease_ms=self.settings.lease_ms,
        )
        for job in batch.cancelled:
            log.info("job %s cancelled before it ran", job.job_id)
        executions = [Execution.of(claim, asked_at) for claim in batch.claimed]
        with self._lock:
            for execution in executions:
                self._active[execution.job_id] = execution
        return executions, batch.cancelled

    def _free_slot(self, execution: Execution) -> None:
        if execution.slot_held:
            execution.slot_held = False
            self._wake.set()

    def _execute(self, execution: Execution, *, hand_off: bool = False) -> TickResult | None:
        """Run ``execution``'s steps in this thread.

        With ``hand_off`` (handler threads under :meth:`run_forever`) the
        settle is handed to the settler with the rest of the steps, and this
        thread is free for the next job at once: it does not wait for the
        batch's commit. Returns None then; the settler finishes the steps.
        """
        steps = execute(
            execution,
            self._clock,
            fresh_for=self.settings.heartbeat_s,
            lease_ms=self.settings.lease_ms,
        )
        handed_off = False
        try:
            perform = functools.partial(self._perform_or_hand_off, execution, steps) if hand_off else self._perform
            return drive(steps, perform)
        except _HandedOff:
            handed_off = True
            return None
        finally:
            if not handed_off:
                self._retire(execution)

    def _perform_or_hand_off(self, execution: Execution, steps: Any, step: Step) -> Any:
        """:meth:`_perform`, except that a settle goes to the settler with the
        rest of ``steps`` (:class:`_HandedOff` then leaves :func:`drive`)."""
        settler = self._settler
        if settler is None or not (isinstance(step, StoreCall) and step.fn is store.settle):
            return self._perform(step)
        settler.submit(step.kwargs, functools.partial(self._after_settle, execution, steps))
        raise _HandedOff

    def _after_settle(
        self, execution: Execution, steps: Any, answer: Any, error: BaseException | None
    ) -> None:
        """The rest of a handed-off execution, on the settler's thread."""
        try:
            if error is None or isinstance(error, WatchdogError):
                resume(steps, self._perform, answer=answer, error=error)
            else:
                log.error("job %s: settlement failed, recovery will handle it: %r", execution.job_id, error)
        except Exception:
            log.exception("job %s: execution failed", execution.job_id)
        finally:
            self._retire(execution)

    def _retire(self, execution: Execution) -> None:
        """The execution is over: forget it, free its slot, wake the loop."""
        with self._lock:
            if self._active.get(execution.job_id) is execution:
                del self._active[execution.job_id]
        self._free_slot(execution)
        execution.done.set()
        self._wake.set()

    # -- public API ----------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run_forever` to shut down gracefully (thread-safe)."""
        self._stopping.set()
        self._wake.set()

    def tick(self) -> TickResult:
        """One step: recover a disappeared claim if any; else claim one job,
        run its handler in this thread (heartbeats keep its lease alive) and
        settle it. For custom loops and tests."""
        recovery = self._recover_one()
        if recovery is not None and recovery.status is not TickStatus.LIVENESS_UNKNOWN:
            return recovery
        executions, cancelled = self._claim(1)
        if cancelled:
            job = cancelled[0]
            return TickResult(TickStatus.SETTLED, job, job.job_id)
        if not executions:
            return recovery or TickResult(TickStatus.IDLE)
        heartbeat = _Heartbeat(self)
        heartbeat.start()
        try:
            result = self._execute(executions[0])
            assert result is not None  # no hand-off: run here to the end
            return result
        finally:
            heartbeat.stop()

    def run_until_idle(self, *, max_ticks: int | None = None) -> list[JobView]:
        """Tick until nothing is ready; returns the jobs settled meanwhile.

        The helper for your own test suite: enqueue, then
        ``runner.run_until_idle()``, then assert on the outcomes.
        """
        settled: list[JobView] = []
        ticks = 0
        while max_ticks is None or ticks < max_ticks:
            ticks += 1
            result = self.tick()
            if result.status in (TickStatus.IDLE, TickStatus.LIVENESS_UNKNOWN):
                break
            if result.job is not None and result.job.state is JobState.SETTLED:
                settled.append(result.job)
        return settled

    def run_forever(self, *, install_signal_handlers: bool = True) -> None:
        """Serve the queues until SIGINT/SIGTERM or :meth:`stop`.

        Shutdown stops claiming, gives running handlers ``grace`` to finish,
        then sets their ``stop_requested``; a job still running after that
        has its lease ended on purpose and is recovered at once (requeued
        within its budget, else settled ``interrupted``) -- never left
        running under a live lease, never lost.
        """
        previous = self._install_signals() if install_signal_handlers else {}
        heartbeat = _Heartbeat(self)
        heartbeat.start()
        settler = self._settler = _Settler(self)
        self._workers = _Workers(self)
        listener = _Listener.start_for(self)
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
                settler.stop()
                self._settler = None
                self._workers.stop()
                self._workers = None
                if listener is not None:
                    listener.stop()
                for sig, previous_handler in previous.items():
                    signal.signal(sig, previous_handler)
                self._stopping.clear()
                log.info("runner stopped")

    # -- the loop --------------------------------------------------------------------

    def _loop(self) -> None:
        workers = self._workers
        assert workers is not None
        settings = self.settings
        recovery_due = 0.0
        failures = 0
        while not self._stopping.is_set():
            # Cleared before looking at the state, so a wake-up that arrives
            # while we look is never lost and a stale one never spins us.
            self._wake.clear()
            try:
                if time.monotonic() >= recovery_due:
                    self._recover_one()
                    until_expiry = self._store(store.seconds_until_next_expiry)
                    recovery_due = time.monotonic() + min(
                        settings.poll_interval_s,
                        settings.poll_interval_s if until_expiry is None else until_expiry,
                    )
                free = settings.concurrency - slots_taken(self._active_view().values())
                taken = 0
                if free > 0:
                    executions, cancelled = self._claim(free)
                    for execution in executions:
                        workers.run(execution)
                    taken = len(executions) + len(cancelled)
                failures = 0
                if taken and taken == free:
                    continue  # free slots were all filled: there may be more ready work
                self._wake.wait(max(0.0, min(settings.poll_interval_s, recovery_due - time.monotonic())))
            except Exception as error:
                failures += 1
                delay = min(30.0, 0.25 * 2 ** min(failures, 7))
                if isinstance(error, WatchdogError):
                    log.error("runner: %s; retrying in %.1fs", error, delay)
                else:
                    log.exception("runner: unexpected error; retrying in %.1fs", delay)
                self._stopping.wait(delay)

    def _renew_all(self) -> None:
        executions = list(self._active_view().values())
        if not executions:
            return
        held = self._store(
            store.renew, [e.pair for e in executions], lease_ms=self.settings.lease_ms, now=self._clock()
        )
        for execution in renewals(executions, held):
            lost(execution, self._store(store.read, execution.job_id))

    # -- shutdown --------------------------------------------------------------------

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("received %s; shutting down", signal.Signals(signum).name)
            self.stop()

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _shutdown(self) -> None:
        deadline = time.monotonic() + self.settings.grace_s
        for execution in list(self._active_view().values()):
            execution.done.wait(max(0.0, deadline - time.monotonic()))
        leftover = [e for e in self._active_view().values() if not e.done.is_set()]
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
        try:
            self._store(release_and_recover, [e.pair for e in leftover])
        except WatchdogError as error:
            log.error("shutdown: could not hand %d running job(s) to recovery: %s", len(leftover), error)


class _HandedOff(Exception):
    """An execution's settle went to the settler, which finishes the execution."""


class _Workers:
    """Handler threads, started as needed up to ``concurrency`` and reused.

    A thread per job cost more than a no-op handler; a worker that is busy
    with a handler that ignores its stop signal is simply not reused (it is
    a daemon thread and never blocks the process from exiting).
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._queue: queue.SimpleQueue[Execution | None] = queue.SimpleQueue()
        self._idle = 0
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def run(self, execution: Execution) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
            else:
                thread = threading.Thread(
                    target=self._serve, name=f"watchdog-handler-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._queue.put(execution)

    def _serve(self) -> None:
        while True:
            execution = self._queue.get()
            if execution is None:
                return
            try:
                self.runner._execute(execution, hand_off=True)
            except BaseException:  # pragma: no cover - _execute logs its own failures
                log.exception("job %s: execution failed", execution.job_id)
            with self._lock:
                self._idle += 1

    def stop(self) -> None:
        """Let idle workers end; busy ones end after their execution."""
        for _ in self._threads:
            self._queue.put(None)


class _Settler:
    """Settles finished executions in batches: every settle that is waiting
    when a batch starts shares one transaction and one commit.

    Each settle keeps its own guard (exact token, live lease); a failed
    batch fails each waiting execution's settle, which recovery then covers.
    A handler thread hands its settle over (:meth:`submit`) and goes on to
    the next job; the settler finishes that execution once the batch is in.
    """

    MAX_BATCH = 256

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._pending: list[tuple[Mapping[str, Any], Callable[[Any, BaseException | None], None]]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="watchdog-settler", daemon=True)
        self._thread.start()

    def submit(self, request: Mapping[str, Any], then: Callable[[Any, BaseException | None], None]) -> None:
        """Settle ``request`` in the next batch, then call ``then(result, error)``
        on the settler's thread."""
        with self._cond:
            if self._stopped:
                raise WatchdogError(ErrorCode.SETTLEMENT_REJECTED, "runner stopped")
            self._pending.append((request, then))
            self._cond.notify()

    def settle(self, request: Mapping[str, Any]) -> Any:
        """Settle ``request`` in the next batch and wait for its result."""
        future: Future[Any] = Future()

        def then(result: Any, error: BaseException | None) -> None:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        self.submit(request, then)
        return future.result()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if not self._pending:
                    return
                batch = self._pending[: self.MAX_BATCH]
                del self._pending[: self.MAX_BATCH]
            try:
                results = self.runner._store(store.settle_many, [request for request, _ in batch])
            except BaseException as error:
                outcomes: list[tuple[Any, BaseException | None]] = [(None, error)] * len(batch)
            else:
                outcomes = [(result, None) for result in results]
            for (_, then), (result, failure) in zip(batch, outcomes, strict=True):
                try:
                    then(result, failure)
                except BaseException:  # pragma: no cover - the callbacks log their own failures
                    log.exception("settler: a settle's continuation failed")


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
        self._thread.join(timeout=10)

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
    """LISTEN on PostgreSQL: wake the loop on new work; on a cancellation or
    lane failure, renew at once (which finds the stopped claims)."""

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
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import psycopg

        runner = self.runner
        args, kwargs = runner.engine.dialect.create_connect_args(runner.engine.url)
        failures = 0
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(*args, **kwargs, autocommit=True)
            except Exception as error:
                failures += 1
                log.warning("listener: cannot connect (%s); polling meanwhile", error)
                self._stop.wait(min(30.0, 0.25 * 2 ** min(failures, 7)))
                continue
            failures = 0
            try:
                with conn:
                    conn.execute(f"LISTEN {store.sql.CHANNEL}")
                    # Whatever was committed while nobody listened is found by one pass.
                    runner._wake.set()
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
