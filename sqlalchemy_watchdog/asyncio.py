"""The asyncio API: enqueue with an ``AsyncSession`` or ``AsyncConnection``,
and :class:`AsyncWatchdog` over an ``AsyncEngine``.

Every call runs the same sync store code as the sync API, through
``AsyncSession.run_sync`` / ``AsyncConnection.run_sync`` -- the way
SQLAlchemy's own asyncio layer is built -- so both behave identically on
``postgresql+psycopg`` and ``sqlite+aiosqlite``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, TypeVar, overload

from sqlalchemy import Select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from . import client, store
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
    drive_async,
    execute,
    lost,
    probe_failed,
    recover_one,
    release_and_recover,
    renewals,
    slots_taken,
)
from .jobs import (
    CancelResult,
    Decision,
    EnqueueResult,
    Job,
    JobState,
    JobView,
    LaneFailure,
    job_batch,
)

log = logging.getLogger(__name__)

__all__ = ["enqueue", "enqueue_select", "AsyncWatchdog", "AsyncRunner", "run_store"]

T = TypeVar("T")


async def _run_sync(target: AsyncSession | AsyncConnection, fn: Callable[..., T], *args: Any) -> T:
    if isinstance(target, (AsyncSession, AsyncConnection)):
        return await target.run_sync(fn, *args)
    raise TypeError(
        f"expected an AsyncSession or an AsyncConnection, not {type(target).__name__}"
        " (use sqlalchemy_watchdog.enqueue for a sync Session / Connection)"
    )


@overload
async def enqueue(target: AsyncSession | AsyncConnection, jobs: Job) -> EnqueueResult: ...
@overload
async def enqueue(target: AsyncSession | AsyncConnection, jobs: Iterable[Job]) -> list[EnqueueResult]: ...


async def enqueue(
    target: AsyncSession | AsyncConnection, jobs: Job | Iterable[Job]
) -> EnqueueResult | list[EnqueueResult]:
    """Async :func:`sqlalchemy_watchdog.enqueue`: same semantics, same code."""
    return await _run_sync(target, client.enqueue, jobs)


async def enqueue_select(target: AsyncSession | AsyncConnection, source: Select[Any]) -> list[EnqueueResult]:
    """Async :func:`sqlalchemy_watchdog.enqueue_select`."""
    return await _run_sync(target, client.enqueue_select, source)


async def run_store(
    engine: AsyncEngine,
    fn: Callable[..., T],
    *args: Any,
    write: bool = True,
    autocommit: bool = False,
    **kwargs: Any,
) -> T:
    """Run the sync store function ``fn(conn, ...)`` in a transaction of its
    own, through ``AsyncConnection.run_sync``, retrying transient failures."""
    backoff = store.Backoff()
    while True:
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(
                    lambda sync: store.transact(
                        sync, fn, *args, write=write, autocommit=autocommit, **kwargs
                    )
                )
        except DBAPIError as error:
            await asyncio.sleep(backoff.delay_after(error, fn.__name__))


class AsyncWatchdog:
    """Async twin of :class:`sqlalchemy_watchdog.Watchdog` over an ``AsyncEngine``."""

    def __init__(self, engine: AsyncEngine) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(f"AsyncWatchdog takes an AsyncEngine, not {type(engine).__name__}")
        self.engine = engine

    async def _run(self, fn: Callable[..., T], *args: Any, write: bool = True, **kwargs: Any) -> T:
        autocommit = store.self_committing(self.engine.dialect.name)
        return await run_store(self.engine, fn, *args, write=write, autocommit=autocommit, **kwargs)

    async def enqueue(self, jobs: Job | Iterable[Job]) -> Any:
        """Enqueue in a transaction of its own, as :meth:`Watchdog.enqueue
        <sqlalchemy_watchdog.Watchdog.enqueue>`."""
        batch = job_batch(jobs)
        autocommit = store.one_statement(self.engine.dialect.name, batch)
        results = await run_store(self.engine, store.enqueue, batch, autocommit=autocommit)
        return results[0] if isinstance(jobs, Job) else results

    async def read(self, job_id: str) -> JobView | None:
        return await self._run(store.read, job_id, write=False)

    async def read_queue_head(self, queue: str) -> JobView | None:
        return await self._run(store.read_queue_head, queue, write=False)

    async def read_settled(self, limit: int = 100, after_sequence: int = 0) -> list[JobView]:
        return await self._run(store.read_settled, limit, after_sequence, write=False)

    async def has_pending_work(self) -> bool:
        return await self._run(store.has_pending_work, write=False)

    async def cancel(self, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelResult:
        return await self._run(client.cancel_in, job_id, cancellation_id, only_if_queued=only_if_queued)

    async def fail_lane(self, lane: str, reason: str) -> LaneFailure:
        return await self._run(client.fail_lane_in, lane, reason)

    async def purge(self, queue: str) -> int:
        return await self._run(store.purge, queue)


class AsyncRunner:
    """The :class:`~sqlalchemy_watchdog.Runner` for asyncio, over an ``AsyncEngine``.

    Handlers are coroutine functions ``async def handler(job) -> Decision |
    None`` run as tasks on the event loop (plain functions run in a thread).
    A cancellation, lane failure, lost lease or the end of the shutdown grace
    cancels the handler's task; the settlement then follows the same rules
    as the sync runner, through the same store code and the same steps.
    Parameters are those of :class:`~sqlalchemy_watchdog.Runner`.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        handlers: Mapping[str, Callable[[RunningJob], Any]] | None = None,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int = 1,
        lease: timedelta = timedelta(seconds=120),
        heartbeat: timedelta = timedelta(seconds=10),
        poll_interval: timedelta = timedelta(seconds=2),
        grace: timedelta = timedelta(seconds=30),
        is_alive: Callable[[JobView], Any] | None = None,
        clock: Callable[[], int] = store.now_ms,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                f"AsyncRunner takes an AsyncEngine, not {type(engine).__name__}"
                " (use sqlalchemy_watchdog.Runner for a sync Engine)"
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
        self._settler: _AsyncSettler | None = None
        self._wake: asyncio.Event | None = None
        self._stopping: asyncio.Event | None = None
        self._heartbeat_now: asyncio.Event | None = None

    @property
    def queues(self) -> tuple[str, ...]:
        return self.settings.queues

    def _events(self) -> tuple[asyncio.Event, asyncio.Event, asyncio.Event]:
        # Made on first use, inside the running loop.
        if self._wake is None or self._stopping is None or self._heartbeat_now is None:
            self._wake, self._stopping, self._heartbeat_now = asyncio.Event(), asyncio.Event(), asyncio.Event()
        return self._wake, self._stopping, self._heartbeat_now

    # -- driving the shared steps ------------------------------------------------

    async def _store(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        autocommit = store.self_committing(self.engine.dialect.name)
        return await run_store(self.engine, fn, *args, autocommit=autocommit, **kwargs)

    async def _perform(self, step: Step) -> Any:
        if isinstance(step, StoreCall):
            settler = self._settler
            if step.fn is store.settle and settler is not None:
                return await settler.settle(step.kwargs)
            return await self._store(step.fn, *step.args, **step.kwargs)
        if isinstance(step, CallHandler):
            return await self._call_handler(step.execution)
        if isinstance(step, Probe):
            try:
                alive = self.settings.is_alive(step.job)  # type: ignore[misc]
                if inspect.isawaitable(alive):
                    alive = await alive
                return bool(alive)
            except Exception as error:
                return probe_failed(step.job, error)
        raise TypeError(step)  # pragma: no cover

    async def _call_handler(self, execution: Execution) -> Decision | None:
        job = execution.job
        fn = self.settings.handlers[job.queue]
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
            task: asyncio.Future[Any] = asyncio.ensure_future(fn(job))
        else:
            task = asyncio.ensure_future(asyncio.to_thread(fn, job))
        try:
            while True:
                execution.task = task
                if execution.signal.event.is_set():
                    task.cancel()
                # wait() never raises the handler's own cancellation into this task.
                await asyncio.wait({task})
                if task.cancelled() or task.exception() is not None:
                    break
                if not inspect.isawaitable(task.result()):
                    break
                # A plain callable returned a coroutine: run it as a task of its
                # own, so a cancellation can reach it like any async handler.
                task = asyncio.ensure_future(task.result())
        finally:
            self._free_slot(execution)
        if task.cancelled():
            reason = execution.signal.reason or StopReason.SHUTDOWN
            if reason is StopReason.SHUTDOWN:
                return None  # no decision: recovery requeues or interrupts it
            return Decision.failed(f"execution stopped ({reason.value})")
        error = task.exception()
        if error is not None:
            log.warning("job %s: handler raised %s: %s", job.job_id, type(error).__name__, error)
            return decision_of_exception(error)
        return decision_of_result(task.result(), job)

    def _stop_execution(self, execution: Execution, reason: StopReason) -> None:
        execution.signal.request(reason)
        if execution.task is not None:
            execution.task.cancel()

    async def _recover_one(self) -> TickResult | None:
        result = await drive_async(
            recover_one(self.settings, dict(self._active)), self._perform
        )
        for execution in list(self._active.values()):
            if execution.signal.reason is StopReason.LEASE_LOST and execution.task is not None:
                execution.task.cancel()
        if result is not None and result.status is TickStatus.REQUEUED:
            self._events()[0].set()
        return result

    async def _claim(self, limit: int) -> tuple[list[Execution], tuple[JobView, ...]]:
        asked_at = time.monotonic()
        batch = await self._store(
            store.claim,
            queues=self.settings.queues,
            limit=limit,
            lease_ms=self.settings.lease_ms,
        )
        for job in batch.cancelled:
            log.info("job %s cancelled before it ran", job.job_id)
        executions = [Execution.of(claim, asked_at) for claim in batch.claimed]
        for execution in executions:
            self._active[execution.job_id] = execution
        return executions, batch.cancelled

    def _free_slot(self, execution: Execution) -> None:
        if execution.slot_held:
            execution.slot_held = False
            self._events()[0].set()

    async def _execute(self, execution: Execution) -> TickResult:
        try:
            steps = execute(
                execution,
                self._clock,
                fresh_for=self.settings.heartbeat_s,
                lease_ms=self.settings.lease_ms,
            )
            return await drive_async(steps, self._perform)
        finally:
            if self._active.get(execution.job_id) is execution:
                del self._active[execution.job_id]
            self._free_slot(execution)
            execution.done.set()
            self._events()[0].set()

    async def _execute_logged(self, execution: Execution) -> None:
        """:meth:`_execute` as a background task: a failure is logged (the
        claim's lease then ends and recovery covers the job), never left as
        an unretrieved task exception."""
        try:
            await self._execute(execution)
        except Exception:
            log.exception("job %s: execution failed", execution.job_id)

    async def _renew_all(self) -> None:
        executions = list(self._active.values())
        if not executions:
            return
        held = await self._store(
            store.renew, [e.pair for e in executions], lease_ms=self.settings.lease_ms, now=self._clock()
        )
        for execution in renewals(executions, held):
            reason = lost(execution, await self._store(store.read, execution.job_id))
            self._stop_execution(execution, reason)

    # -- public API ----------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run_forever` to shut down gracefully."""
        wake, stopping, _ = self._events()
        stopping.set()
        wake.set()

    async def tick(self) -> TickResult:
        """One step, as :meth:`Runner.tick <sqlalchemy_watchdog.Runner.tick>`."""
        recovery = await self._recover_one()
        if recovery is not None and recovery.status is not TickStatus.LIVENESS_UNKNOWN:
            return recovery
        executions, cancelled = await self._claim(1)
        if cancelled:
            return TickResult(TickStatus.SETTLED, cancelled[0], cancelled[0].job_id)
        if not executions:
            return recovery or TickResult(TickStatus.IDLE)
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        try:
            return await self._execute(executions[0])
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def run_until_idle(self, *, max_ticks: int | None = None) -> list[JobView]:
        """Tick until nothing is ready; returns the jobs settled meanwhile."""
        settled: list[JobView] = []
        ticks = 0
        while max_ticks is None or ticks < max_ticks:
            ticks += 1
            result = await self.tick()
            if result.status in (TickStatus.IDLE, TickStatus.LIVENESS_UNKNOWN):
                break
            if result.job is not None and result.job.state is JobState.SETTLED:
                settled.append(result.job)
        return settled

    async def run_forever(self, *, install_signal_handlers: bool = True) -> None:
        """Serve the queues until SIGINT/SIGTERM or :meth:`stop`; shutdown as
        :meth:`Runner.run_forever <sqlalchemy_watchdog.Runner.run_forever>`."""
        wake, stopping, _ = self._events()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
        settler = self._settler = _AsyncSettler(self)
        background = [asyncio.create_task(self._heartbeat_loop()), asyncio.create_task(settler.run())]
        if self.engine.dialect.name == "postgresql":
            background.append(asyncio.create_task(self._listen()))
        log.info("async runner started: queues=%s concurrency=%d", ",".join(self.queues), self.settings.concurrency)
        try:
            await self._loop()
        finally:
            try:
                await self._shutdown()
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
                self._settler = None
                for sig in installed:
                    loop.remove_signal_handler(sig)
                stopping.clear()
                log.info("async runner stopped")

    # -- the loop --------------------------------------------------------------------

    async def _loop(self) -> None:
        wake, stopping, _ = self._events()
        settings = self.settings
        recovery_due = 0.0
        failures = 0
        tasks: set[asyncio.Task[Any]] = set()
        while not stopping.is_set():
            # Cleared before looking at the state, so a wake-up that arrives
            # while we look is never lost and a stale one never spins us.
            wake.clear()
            try:
                if time.monotonic() >= recovery_due:
                    await self._recover_one()
                    until_expiry = await self._store(store.seconds_until_next_expiry)
                    recovery_due = time.monotonic() + min(
                        settings.poll_interval_s,
                        settings.poll_interval_s if until_expiry is None else until_expiry,
                    )
                free = settings.concurrency - slots_taken(self._active.values())
                taken = 0
                if free > 0:
                    executions, cancelled = await self._claim(free)
                    for execution in executions:
                        task = asyncio.create_task(self._execute_logged(execution))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    taken = len(executions) + len(cancelled)
                failures = 0
                if taken and taken == free:
                    continue
                timeout = max(0.0, min(settings.poll_interval_s, recovery_due - time.monotonic()))
                try:
                    await asyncio.wait_for(wake.wait(), timeout)
                except TimeoutError:
                    pass
            except Exception as error:
                failures += 1
                delay = min(30.0, 0.25 * 2 ** min(failures, 7))
                if isinstance(error, WatchdogError):
                    log.error("async runner: %s; retrying in %.1fs", error, delay)
                else:
                    log.exception("async runner: unexpected error; retrying in %.1fs", delay)
                try:
                    await asyncio.wait_for(stopping.wait(), delay)
                except TimeoutError:
                    pass

    async def _heartbeat_loop(self) -> None:
        _, _, now = self._events()
        while True:
            try:
                await asyncio.wait_for(now.wait(), self.settings.heartbeat_s)
            except TimeoutError:
                pass
            now.clear()
            try:
                await self._renew_all()
            except Exception as error:
                log.error("heartbeat failed: %s", error)

    async def _listen(self) -> None:
        import psycopg

        wake, _, heartbeat_now = self._events()
        args, kwargs = self.engine.sync_engine.dialect.create_connect_args(self.engine.url)
        if "database" in kwargs:  # asyncpg's name for it; psycopg (libpq) says dbname
            kwargs["dbname"] = kwargs.pop("database")
        failures = 0
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(*args, **kwargs, autocommit=True)
            except Exception as error:
                failures += 1
                log.warning("listener: cannot connect (%s); polling meanwhile", error)
                await asyncio.sleep(min(30.0, 0.25 * 2 ** min(failures, 7)))
                continue
            failures = 0
            try:
                async with conn:
                    await conn.execute(f"LISTEN {store.sql.CHANNEL}")
                    wake.set()
                    async for note in conn.notifies():
                        if note.payload == EVENT_STOP:
                            heartbeat_now.set()
                        elif note.payload == EVENT_QUEUED:
                            wake.set()
            except Exception as error:
                log.warning("listener: connection lost (%s); reconnecting", error)
                await asyncio.sleep(0.5)

    async def _shutdown(self) -> None:
        # Polled rather than waited on in threads: a thread blocked on an
        # execution that never ends would hold the event loop's exit.
        await _until_done(list(self._active.values()), self.settings.grace_s)
        leftover = [e for e in self._active.values() if not e.done.is_set()]
        if not leftover:
            return
        # Cancel the handlers, then settle what they leave (their settles are
        # the normal path); what still runs after that is handed to recovery.
        for execution in leftover:
            self._stop_execution(execution, StopReason.SHUTDOWN)
        await _until_done(leftover, min(2.0, max(0.1, self.settings.grace_s)))
        leftover = [e for e in leftover if not e.done.is_set()]
        if leftover:
            try:
                await self._store(release_and_recover, [e.pair for e in leftover])
            except WatchdogError as error:
                log.error("shutdown: could not hand %d running job(s) to recovery: %s", len(leftover), error)


class _AsyncSettler:
    """Settles finished executions in batches, as the sync runner's settler:
    every settle waiting when a batch starts shares one ``settle_many``
    statement and one commit (each row keeps its own guard), so a runner
    needs one connection for settling however many handlers finish at once.
    """

    MAX_BATCH = 256

    def __init__(self, runner: AsyncRunner) -> None:
        self.runner = runner
        self._pending: list[tuple[Mapping[str, Any], asyncio.Future[Any]]] = []
        self._ready = asyncio.Event()
        self._stopped = False

    async def settle(self, request: Mapping[str, Any]) -> Any:
        if self._stopped:
            raise WatchdogError(ErrorCode.SETTLEMENT_REJECTED, "runner stopped")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._ready.set()
        return await future

    async def run(self) -> None:
        """Settle until cancelled; then fail whatever still waits."""
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                while self._pending:
                    batch = self._pending[: self.MAX_BATCH]
                    del self._pending[: self.MAX_BATCH]
                    try:
                        results = await self.runner._store(store.settle_many, [request for request, _ in batch])
                    except BaseException as error:
                        failure = error if isinstance(error, Exception) else WatchdogError(
                            ErrorCode.SETTLEMENT_REJECTED, "runner stopped"
                        )
                        for _, future in batch:
                            if not future.done():
                                future.set_exception(failure)
                        if not isinstance(error, Exception):
                            raise
                        continue
                    for (_, future), result in zip(batch, results, strict=True):
                        if not future.done():
                            future.set_result(result)
        finally:
            self._stopped = True
            for _, future in self._pending:
                if not future.done():
                    future.set_exception(WatchdogError(ErrorCode.SETTLEMENT_REJECTED, "runner stopped"))
            self._pending.clear()


async def _until_done(executions: list[Execution], timeout: float) -> None:
    """Wait until every execution is done, or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(not e.done.is_set() for e in executions) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
