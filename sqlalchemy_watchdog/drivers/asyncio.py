"""The asyncio runner driver: :class:`AsyncRunner` performs the core's steps
with tasks on the event loop and an ``AsyncEngine``.

Every store call runs the same sync store code as the sync driver's, through
``AsyncConnection.run_sync`` -- the way SQLAlchemy's own asyncio layer is
built -- so both behave identically on ``postgresql+psycopg`` and
``sqlite+aiosqlite``. Public as :class:`sqlalchemy_watchdog.asyncio.AsyncRunner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar, Unpack

from sqlalchemy.ext.asyncio import AsyncEngine

from .. import store
from ..core.ahead import AHEAD_WAIT_MAX_S, Parking, take_stale
from ..core.durable import StepPort
from ..core.handlers import RunningJob, StopReason
from ..core.loop import (
    execute,
    loop_pass,
    record_starts,
    renew,
    shutdown,
    start_in_child,
    tick,
    time_out,
    until_idle,
)
from ..core.maintenance import deregister_worker, probe_failed, prune, refresh_worker, register_worker
from ..core.ports import Settlement
from ..core.rules.settle import (
    claim_kept,
    compensate,
    compensate_async,
    compensation_due,
    conclude,
    decision_of_cancelled_task,
    decision_of_exception,
    decision_of_result,
    finish,
    finish_handed_off,
    settle_batch,
    steps_unread,
)
from ..core.settings import (
    RunnerOptions,
)
from ..core.signals import restore_signal, signals_to_install
from ..core.state import Execution, TickResult
from ..core.steps import (
    NEVER_STARTED,
    STARTED_LATE,
    Pause,
    Probe,
    RecordStart,
    RunHandler,
    Spawn,
    Step,
    Steps,
    Stop,
    StoreCall,
    WaitDone,
    drive_async,
)
from ..errors import WatchdogError, redacted
from ..executors import HandlerRef
from ..executors.pool import ChildOutcome, RunnerChildren, decision_of_outcome
from ..gateway import AsyncGateway
from ..jobs import (
    Decision,
    JobView,
)
from ..records import SettleRequest
from ..wakeups import (
    Waiting,
    WakeupStatus,
    connect_and_prove_async,
    listen_async,
    local_key,
    polling_reason,
    wake_locally,
)
from . import base
from .base import record_step_in, step_writer

#: The name the async runner has always logged under (its public module's).
log = logging.getLogger("sqlalchemy_watchdog.asyncio")

__all__ = ["AsyncRunner"]

T = TypeVar("T")


def _is_async(fn: Callable[..., Any]) -> bool:
    """Whether a handler is a coroutine function (or an object whose
    ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _finished(task: asyncio.Future[Any]) -> asyncio.Future[None]:
    """A future done once ``task`` is, whichever way it ended -- what
    ``asyncio.wait({task})`` gives, without its set, counters and timeout
    machinery (a drain waits on every handler this way). Cancelling the
    waiter (a cancelled caller) leaves ``task`` alone."""
    waiter: asyncio.Future[None] = task.get_loop().create_future()
    if task.done():
        waiter.set_result(None)
        return waiter

    def done(_: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(done)
    return waiter


class AsyncRunner:
    """The :class:`~sqlalchemy_watchdog.Runner` for asyncio, over an ``AsyncEngine``.

    Handlers are coroutine functions ``async def handler(job) -> Decision |
    None`` run as tasks on the event loop (plain functions run in a thread).
    A cancellation, lane failure, lost lease or the end of the shutdown grace
    cancels the handler's task; everything else follows the same rules as the
    sync runner -- the same steps of :mod:`sqlalchemy_watchdog.core`, the
    same store code. Its options are the sync runner's,
    :class:`~sqlalchemy_watchdog.RunnerOptions`;
    ``listen_engine`` is an ``AsyncEngine``.

    In a FastAPI/Starlette lifespan, ``async with runner.running():``
    (:meth:`running`) runs it beside the application.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        handlers: Mapping[str, Callable[[RunningJob], Any]] | None = None,
        *,
        listen_engine: AsyncEngine | None = None,
        **options: Unpack[RunnerOptions],
    ) -> None:
        setup = base.set_up(
            "AsyncRunner",
            engine,
            handlers,
            listen_engine,
            options,
            engine_type=AsyncEngine,
            other="sqlalchemy_watchdog.Runner for a sync Engine",
            stays=_is_async,
        )
        self.engine = setup.engine
        self.listen_engine = setup.listen_engine
        self.wakeups = setup.wakeups
        self._default_poll = setup.default_poll
        self.settings = setup.settings
        self.core = setup.core
        #: The process executors' children, for plain handlers (each pool made on first use).
        self._children = RunnerChildren(self.settings.child_executors)
        #: The wake-ups in force (see :attr:`Runner.wakeup_status <sqlalchemy_watchdog.Runner.wakeup_status>`).
        self.wakeup_status = setup.wakeup_status
        #: Store calls: connections (one kept by each holding task), retries.
        self._gateway = AsyncGateway(engine)
        self.core.progress_write_async = lambda *report: self._gateway.run(store.report_progress, *report)
        self.core.parents_read_async = lambda job_id: self._gateway.read(store.parent_results, job_id)
        self.core.step_port = StepPort(
            read_async=lambda job_id: self._gateway.read(store.read_steps, job_id),
            write_async=step_writer(self._gateway.run),
            write_in=record_step_in,
            write_in_async=base.record_step_in_async,
            codec=self.settings.codec,
            read_signal_async=lambda job_id, name: self._gateway.read(store.read_signal, job_id, name),
        )
        #: Whether each queue's handler is a coroutine function (asked on first use).
        self._async_queues: dict[str, bool] = {}
        self._settler: _AsyncSettler | None = None
        #: The executions' tasks under run_forever: each runs its job's
        #: coroutine handler itself (see :meth:`_await_inline`).
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The context each execution's task starts from: the claiming
        #: loop's (a handler's changes to context variables never reach the next job).
        self._spawn_context: contextvars.Context | None = None
        #: Jobs claimed ahead of the free slots, waiting for a task to finish its job.
        local = self.settings.local_group
        self._parking = Parking(local.concurrency if local is not None else sys.maxsize)
        #: The queues whose jobs wait for a task when claimed ahead; a job
        #: run in a child waits for the child instead (its pool's line).
        self._parked = frozenset(local.queues) if local is not None else frozenset()
        self._threads = _DaemonThreads()
        self._wake: asyncio.Event | None = None
        self._stopping: asyncio.Event | None = None
        self._heartbeat_now: asyncio.Event | None = None
        #: Resolved once run_forever serves (for running()).
        self._started: asyncio.Future[None] | None = None
        #: True while run_forever (or a running() block) serves this runner.
        self._loop_claimed = False

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues this runner claims from."""
        return self.settings.queues

    @property
    def isolated_jobs(self) -> tuple[str, ...]:
        """As :attr:`Runner.isolated_jobs <sqlalchemy_watchdog.Runner.isolated_jobs>`."""
        return self.core.isolated_jobs

    @property
    def shutdown_budget(self) -> timedelta:
        """As :attr:`Runner.shutdown_budget <sqlalchemy_watchdog.Runner.shutdown_budget>`."""
        return timedelta(seconds=self.settings.shutdown_budget_s)

    def _events(self) -> tuple[asyncio.Event, asyncio.Event, asyncio.Event]:
        # Made on first use, inside the running loop.
        if self._wake is None or self._stopping is None or self._heartbeat_now is None:
            self._wake, self._stopping, self._heartbeat_now = asyncio.Event(), asyncio.Event(), asyncio.Event()
        return self._wake, self._stopping, self._heartbeat_now

    # -- performing steps --------------------------------------------------------

    async def _store(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._gateway.run(fn, *args, **kwargs)

    @contextlib.asynccontextmanager
    async def _holding_connection(self) -> AsyncIterator[None]:
        """Within this block, the current task's store calls reuse one
        connection (the loop, settler, heartbeat and pruner tasks); the
        executions' own tasks check one out per call."""
        async with self._gateway.holding():
            yield

    async def _perform(self, step: Step) -> Any:
        if isinstance(step, StoreCall):
            answer = await self._store(step.fn, *step.args, **step.kwargs)
            self.core.outage.succeeded()  # the database answers: an outage episode is over
            return answer
        if isinstance(step, Pause):
            # A settler stopped during the pause has its task cancelled.
            await asyncio.sleep(step.seconds)
            return True
        if isinstance(step, RunHandler):
            return await self._run_handler(step.execution)
        if isinstance(step, RecordStart):
            return await self._record_start(step.execution)
        if isinstance(step, Stop):
            self._stop(step.execution, step.reason)
            return None
        if isinstance(step, Probe):
            assert self.settings.is_alive is not None
            try:
                alive = self.settings.is_alive(step.job)
                if inspect.isawaitable(alive):
                    alive = await alive
                return bool(alive)
            except Exception as error:
                return probe_failed(step.job, error)
        if isinstance(step, Spawn):
            self._children.expect(step.executions)  # before their threads: those arrive in no set order
            now = self.core.clock.monotonic()
            for execution in step.executions:
                if execution.job.queue in self._parked and not self._parking.offer(execution, now):
                    continue  # claimed ahead: the next task that finishes its job takes it
                self._spawn(execution)
            return None
        if isinstance(step, WaitDone):
            # Polled rather than waited on in threads: a thread blocked on an
            # execution that never ends would hold the event loop's exit.
            deadline = time.monotonic() + step.timeout
            while any(not e.done.is_set() for e in step.executions) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return None
        raise TypeError(step)  # pragma: no cover

    async def _record_start(self, execution: Execution) -> set[str]:
        """Record the start of a job claimed ahead: in the settler's next
        statement of starts, with every other start asked for meanwhile
        (:meth:`_AsyncSettler.start`) -- or, without a settler, alone."""
        settler = self._settler
        answer = await settler.start(execution.pair) if settler is not None else None
        if answer is None:
            answer = await drive_async(record_starts(self.core, [execution.pair]), self._perform)
        if isinstance(answer, WatchdogError):
            raise answer
        held: set[str] = answer
        return held

    async def _run_handler(self, execution: Execution) -> Decision | None:
        job = execution.job
        fn = self.settings.handlers[job.queue]
        # The attempt's trace context (a copy of this task's without one),
        # current in the handler's task or thread.
        context = execution.handler_context()
        loop = asyncio.get_running_loop()
        is_async = self._async_queues.get(job.queue)
        if is_async is None:  # asked once per queue, not once per job
            is_async = self._async_queues[job.queue] = _is_async(fn)
        heartbeat_s = self.settings.heartbeat_s
        ref = self.settings.handler_refs.get(job.queue)
        task: asyncio.Future[Any]
        timers: list[asyncio.TimerHandle] = []
        timer = None
        if execution.deadline is not None:  # set first: an inline handler has run once dispatched
            timer = loop.call_later(max(0.0, execution.deadline - self.core.clock.monotonic()), self._time_out)
        try:
            if ref is not None:
                task = self._threads.submit(functools.partial(self._call_in_child, ref, execution, loop, timers))
                execution.threaded = True
            elif is_async and context is None and asyncio.current_task() in self._tasks:
                task = await self._await_inline(fn, job, execution, heartbeat_s)
            elif is_async:
                task = loop.create_task(_unless_late(fn, job, execution, heartbeat_s), context=context)
            else:
                call = functools.partial(_call_unless_late, fn, job, execution, heartbeat_s)
                # In a copy of this task's context (as a coroutine handler's own
                # task gets), not the handler thread's: what one job sets in a
                # context variable is never seen by the next job on that thread.
                if context is None:
                    context = contextvars.copy_context()
                task = self._threads.submit(context.run, call)
                execution.threaded = True
            while True:
                execution.task = task
                if execution.signal.is_set() and not execution.threaded:
                    task.cancel()
                # Never raises the handler's own cancellation into this task.
                if not task.done():
                    await _finished(task)
                if task.cancelled() or task.exception() is not None:
                    break
                if not inspect.isawaitable(task.result()):
                    break
                # A plain callable returned a coroutine: run it as a task of its
                # own, so a cancellation can reach it like any async handler.
                awaitable = task.result()
                if asyncio.iscoroutine(awaitable):
                    task = loop.create_task(awaitable, context=context)
                else:
                    task = asyncio.ensure_future(awaitable)
                execution.threaded = False
        finally:
            if timer is not None:
                timer.cancel()
            for child_timer in timers:
                child_timer.cancel()
            if self.core.release_slot(execution):
                self._events()[0].set()
        error = None if task.cancelled() else task.exception()
        if task.cancelled():
            # A timeout on the last attempt compensates below; a cancellation
            # or a shutdown does not (compensation_due).
            decision = decision_of_cancelled_task(execution)
        elif error is not None:
            decision = decision_of_exception(execution, error)
        else:
            result: object = task.result()
            if result is STARTED_LATE:
                return STARTED_LATE  # execute() renews the claim first, then asks again
            if isinstance(result, ChildOutcome):
                decided = decision_of_outcome(execution, result)
                if decided is STARTED_LATE or decided is NEVER_STARTED:
                    return decided
                unread = None if decided is None else steps_unread(execution)
                if unread is not None:
                    await unread.load_async()
                # A failure for good runs the undos the child's steps named
                # here, in a thread of the runner (the child sent them by reference).
                if not compensation_due(self.core, execution, decided) or not await drive_async(
                    claim_kept(self.core, execution), self._perform
                ):
                    return decided
                return await asyncio.to_thread(compensate, self.core, execution, decided)
            decision = decision_of_result(result, job)
        unread = None if ref is not None or decision is None else steps_unread(execution)
        if unread is not None:
            await unread.load_async()  # a run recovery requeued to compensate may not have read its steps
        if ref is not None or not compensation_due(self.core, execution, decision):
            return decision
        if not await drive_async(claim_kept(self.core, execution), self._perform):
            return decision  # it outlived its timeout and its claim: recovery's
        # A failure for good runs the undos of its steps: a coroutine
        # handler's on this loop (an undo may be a coroutine function), a
        # thread handler's in a thread.
        if is_async:
            return await compensate_async(self.core, execution, decision)
        return await asyncio.to_thread(compensate, self.core, execution, decision)

    async def _await_inline(
        self, fn: Callable[[RunningJob], Any], job: RunningJob, execution: Execution, heartbeat_s: float
    ) -> asyncio.Future[Any]:
        """Await a coroutine handler in its execution's own task (one that
        :meth:`_spawn` started, in a fresh copy of the loop's context) rather
        than in a task of its own: a future done as that task would have
        ended -- its result, its exception, or cancelled.

        A stop cancels this task while the handler runs (:meth:`_stop` counts
        each cancel it asks for in ``execution.cancels``); those are taken
        back once the handler has ended, so they never reach the settle. A
        cancellation nobody here asked for (the application cancelling the
        runner's tasks) is raised on, as it would be from any await."""
        task = asyncio.current_task()
        assert task is not None
        outcome: asyncio.Future[Any] = task.get_loop().create_future()
        execution.task = task
        try:
            outcome.set_result(await _unless_late(fn, job, execution, heartbeat_s))
        except asyncio.CancelledError:
            outcome.cancel()
        except Exception as error:
            outcome.set_exception(error)
        finally:
            execution.task = None
            for _ in range(execution.cancels):
                task.uncancel()
            execution.cancels = 0
        if outcome.cancelled() and task.cancelling() > 0:
            raise asyncio.CancelledError
        return outcome

    def _call_in_child(
        self,
        ref: HandlerRef,
        execution: Execution,
        loop: asyncio.AbstractEventLoop,
        timers: list[asyncio.TimerHandle],
    ) -> object:
        """Run ``execution``'s job in a child of the process executor (in a
        handler thread: the wait blocks) -- unless it starts late, as
        :func:`_call_unless_late`. Its timeout counts from the moment the
        child begins the handler, its module imported (or 120 s after the job
        was sent, for an import that hangs): then a timer (kept in
        ``timers``, for the caller to cancel) is set on ``loop``."""

        def arm() -> None:
            deadline = self.core.start_deadline(execution)
            if deadline is not None:
                delay = max(0.0, deadline - self.core.clock.monotonic())
                timers.append(loop.call_later(delay, self._time_out))

        def started(now: bool) -> bool:
            if not now:  # may a child take it? Not before its start is recorded, nor if it waited that long
                if execution.unstarted and not execution.child_ready:
                    # Claimed ahead: its start is recorded now (on the loop; this is the pool's thread).
                    program = drive_async(start_in_child(self.core, execution), self._perform)
                    return asyncio.run_coroutine_threadsafe(program, loop).result()
                return execution.child_may_take(self.settings.heartbeat_s)
            try:
                loop.call_soon_threadsafe(arm)
            except RuntimeError:  # pragma: no cover - the loop closed: nobody waits
                pass
            return True

        if execution.started_late(self.settings.heartbeat_s):
            return STARTED_LATE
        return self._children.get(execution.job.queue).call(
            ref,
            execution.job,
            execution.signal,
            stop_wait_s=self.settings.stop_wait_s,
            on_start=started,
            rank=execution.rank,
            pipe=not execution.claimed_ahead,
        )

    async def _close_pool(self) -> None:
        """End the process executors' children (after the shutdown ended every job)."""
        for pool in self._children.take():
            await asyncio.get_running_loop().run_in_executor(None, pool.close)

    async def _settle(self, requests: list[SettleRequest]) -> list[Settlement | None]:
        """Settle ``requests`` (:func:`settle_batch`: retried while the
        database is unreachable and their leases may live)."""
        return await drive_async(settle_batch(self.core, requests), self._perform)

    async def _execute(self, execution: Execution, *, quiet: bool = False) -> TickResult | None:
        """Run ``execution`` to the end: its steps, then its settle (in the
        settler's next batch while :meth:`run_forever` runs). ``quiet``: the
        result is not wanted (None), only logged and traced -- and, while the
        settler runs, the settle request is handed to it and this returns at
        once: the settler settles it in a batch and finishes the execution,
        so the task goes on to the next job claimed ahead meanwhile."""
        handed_off = False
        try:
            try:
                outcome = await drive_async(execute(self.core, execution), self._perform)
            finally:
                self._children.withdraw(execution)
            if isinstance(outcome, TickResult):
                return outcome
            settler = self._settler
            if quiet and settler is not None and settler.submit(outcome, execution):
                handed_off = True
                return None
            if settler is not None and not settler.stopped:
                settlement = await settler.settle(outcome)
            else:
                (settlement,) = await self._settle([outcome])
            if quiet:
                finish(execution, settlement)
                return None
            return conclude(execution, settlement)
        finally:
            if not handed_off:
                self._retire(execution)

    def _finish(self, execution: Execution, settlement: Settlement | None) -> None:
        """A handed-off execution's settle is in: conclude it and retire it."""
        try:
            finish_handed_off(self.core, execution, settlement)
        finally:
            self._events()[0].set()

    def _retire(self, execution: Execution) -> None:
        self.core.retire(execution)
        self._events()[0].set()

    async def _execute_logged(self, execution: Execution) -> None:
        """:meth:`_execute` as a background task: a failure is logged (the
        claim's lease then ends and recovery covers the job), never left as
        an unretrieved task exception."""
        try:
            await self._execute(execution, quiet=True)
        except Exception:
            log.exception("job %s: execution failed", execution.job_id)

    def _spawn(self, execution: Execution) -> None:
        """Start ``execution`` in a task of its own (kept in :attr:`_tasks`),
        in a fresh copy of the claiming loop's context."""
        base = self._spawn_context if self._spawn_context is not None else contextvars.copy_context()
        task = asyncio.create_task(self._execute_in_turn(execution), context=base.copy())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute_in_turn(self, execution: Execution) -> None:
        """:meth:`_execute_logged`; then the job claimed ahead that waits for
        a slot, if any, takes this one's (:class:`~.core.ahead.Parking`), in
        a task of its own."""
        await self._execute_logged(execution)
        if execution.job.queue not in self._parked:
            return  # it held no slot of the runner's tasks
        next_one = self._parking.next()
        if next_one is not None:
            self._spawn(next_one)

    async def _give_back(self, executions: list[Execution]) -> None:
        """Give jobs claimed ahead back without running them (queued again,
        nothing counted; taken out of the parking, which marked them): they
        waited too long for a slot, or the runner is stopping."""
        await asyncio.gather(*(self._execute_logged(e) for e in executions))

    async def _give_back_loop(self) -> None:
        """Give back the jobs claimed ahead that waited for a slot over
        :data:`~.core.ahead.AHEAD_WAIT_MAX_S`, looking once a wait."""
        while True:
            await asyncio.sleep(AHEAD_WAIT_MAX_S)
            stale = take_stale(self._parking, self.core.run_times, self.core.clock.monotonic())
            if stale:
                await self._give_back(stale)

    async def _renew_all(self) -> float:
        """Renew every claim; how long until the next renewal (sooner after
        a transient failure: see :func:`renew`)."""
        return await drive_async(renew(self.core), self._perform)

    def _stop(self, execution: Execution, reason: StopReason) -> None:
        """Tell a handler to stop: a coroutine handler's task is cancelled; a
        plain handler's thread cannot be, so it is only signalled and keeps
        its slot and claim until it returns (as under the sync runner)."""
        execution.signal.request(reason)
        task = execution.task
        if task is not None and not execution.threaded and task.cancel() and task in self._tasks:
            execution.cancels += 1  # its execution's own task: taken back once the handler ended (_await_inline)

    def _time_out(self) -> None:
        """Stop the handlers past their deadline (see :meth:`_stop`)."""
        for step in time_out(self.core):
            assert isinstance(step, Stop)
            self._stop(step.execution, step.reason)

    def _jobs_arrived(self) -> None:
        """A wake-up: jobs were enqueued (some may be delayed only briefly)."""
        self.core.jobs_arrived()
        self._events()[0].set()

    # -- public API ----------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run_forever` to shut down gracefully."""
        wake, stopping, _ = self._events()
        stopping.set()
        wake.set()

    async def tick(self) -> TickResult:
        """One step, as :meth:`Runner.tick <sqlalchemy_watchdog.Runner.tick>`."""
        outcome = await drive_async(tick(self.core), self._perform)
        if isinstance(outcome, TickResult):
            return outcome
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        try:
            result = await self._execute(outcome)
            assert result is not None
            return result
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def run_until_idle(self, *, max_ticks: int | None = None) -> list[JobView]:
        """Tick until nothing is ready; returns the jobs settled meanwhile."""
        settled: list[JobView] = []
        ticks = 0
        while max_ticks is None or ticks < max_ticks:
            ticks += 1
            if until_idle(await self.tick(), settled):
                break
        return settled

    async def run_forever(self, *, install_signal_handlers: bool | None = None) -> None:
        """Serve the queues until :meth:`stop` (or SIGINT/SIGTERM where the
        runner owns the process); signals and shutdown as
        :meth:`Runner.run_forever <sqlalchemy_watchdog.Runner.run_forever>`:
        as a task inside a running server (whose handlers are in place) it
        never replaces the server's signal handlers. One runner serves one
        loop at a time: a second ``run_forever`` (or :meth:`running` block)
        while it serves raises :class:`RuntimeError`."""
        if self._loop_claimed:
            raise base.already_serving("run_forever()", "AsyncRunner")
        # Set and cleared with no await between the check and here: one event loop, no race.
        self._loop_claimed = True
        try:
            await self._run_forever(install_signal_handlers=install_signal_handlers)
        finally:
            self._loop_claimed = False

    async def _run_forever(self, *, install_signal_handlers: bool | None) -> None:
        _, stopping, heartbeat_now = self._events()
        loop = asyncio.get_running_loop()
        installed: dict[signal.Signals, Any] = {}
        for sig in signals_to_install(install_signal_handlers):
            installed[sig] = signal.getsignal(sig)
            loop.add_signal_handler(sig, self._on_signal, sig)
        settler = self._settler = _AsyncSettler(self)
        background = [asyncio.create_task(self._heartbeat_loop()), asyncio.create_task(settler.run())]
        if self.settings.retention is not None:
            background.append(asyncio.create_task(self._prune_loop()))
        if self.settings.ahead_cap > 0:
            background.append(asyncio.create_task(self._give_back_loop()))
        try:
            listening = await self._start_listener(heartbeat_now)
        except BaseException:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self._settler = None
            self._restore_signals(loop, installed)
            raise
        if listening is not None:
            background.append(listening)

        # Room freed in a limited queue by a settle in this process (SQLite's only wake-up).
        def room_freed() -> None:
            loop.call_soon_threadsafe(self._jobs_arrived)

        unwake = wake_locally(local_key(self.engine.sync_engine), room_freed)
        await self._worker_step(register_worker(self.core, str(self.wakeup_status)))
        base.log_started(log, "async runner", self.settings, self.wakeup_status, self.engine.sync_engine.pool)
        started, self._started = self._started, None
        if started is not None and not started.done():
            started.set_result(None)
        try:
            await self._loop()
        finally:
            try:
                for pool in self._children.current:
                    pool.give_back_waiting()  # jobs claimed ahead never start once stopping
                await self._give_back(self._parking.take_all())  # as those waiting for a task
                await drive_async(shutdown(self.core), self._perform)
            finally:
                unwake()
                self.core.waiting = None
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
                self._settler = None
                await self._close_pool()
                # After the heartbeat stopped: nothing refreshes the row again.
                await self._worker_step(deregister_worker(self.core))
                self._restore_signals(loop, installed)
                stopping.clear()
                log.info("async runner stopped")

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("received %s; shutting down", sig.name)
        self.stop()

    @staticmethod
    def _restore_signals(loop: asyncio.AbstractEventLoop, installed: Mapping[signal.Signals, Any]) -> None:
        """Put back the handlers ``run_forever`` replaced (``remove_signal_handler``
        alone would leave the default action behind)."""
        for sig, previous in installed.items():
            loop.remove_signal_handler(sig)
            restore_signal(sig, previous)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[AsyncRunner]:
        """Run the runner as a task beside the application for the block --
        the one-line embedding for a FastAPI/Starlette lifespan::

            @asynccontextmanager
            async def lifespan(app):
                async with runner.running():
                    yield
                await engine.dispose()

        Entering starts :meth:`run_forever` as a task (never touching signal
        handlers: the server keeps its own) and returns once it serves; an
        error it raised while starting is raised here. Leaving stops it and
        waits for its shutdown -- within :attr:`shutdown_budget` and a few
        seconds for the last statements, after which the task is cancelled
        (leases and recovery cover its jobs). A failure of the runner while
        the block ran is logged at once and raised on leaving (after the
        block's own exception, if any). Entering it while the runner already
        serves raises :class:`RuntimeError`."""
        if self._loop_claimed:
            raise base.already_serving("running()", "AsyncRunner")
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._started = started
        task = asyncio.create_task(self.run_forever(install_signal_handlers=False))

        def ended(done: asyncio.Task[None]) -> None:
            if not done.cancelled() and done.exception() is not None and started.done():
                log.error("async runner failed: %s", redacted(done.exception() or Exception()))

        task.add_done_callback(ended)
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            self._started = None
            await task  # raises what stopped it from starting
            raise RuntimeError("the runner returned before it served")  # pragma: no cover - stop() while starting
        try:
            yield self
        finally:
            self.stop()
            done, _ = await asyncio.wait({task}, timeout=base.exit_wait_s(self.settings))
            if not done:
                log.warning(
                    "async runner: still shutting down %gs after it was asked to stop; cancelled",
                    base.exit_wait_s(self.settings),
                )
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    async def _start_listener(self, heartbeat_now: asyncio.Event) -> asyncio.Task[None] | None:
        """As :meth:`Runner._start_listener <sqlalchemy_watchdog.Runner._start_listener>`:
        the listening task, or None (the runner polls, and says why)."""
        engine = self.listen_engine
        reason = polling_reason(self.wakeups, engine.dialect.name, engine.dialect.driver)
        first: Any = None
        if reason is None:
            first, proof = await connect_and_prove_async(engine, self.engine)  # as Runner's: the runner's NOTIFY
            if proof is not None and not proof.proven:
                reason = proof.reason
        if reason is not None:
            settings = base.poll_settings(self.settings, default_poll=self._default_poll)
            self.settings = self.core.settings = settings
            self.wakeup_status = base.polling_status(
                reason, wakeups=self.wakeups, listen_engine=engine, settings=settings
            )
            return None
        self.core.waiting = Waiting(self.settings.poll_interval_s)
        self.wakeup_status = WakeupStatus(self.wakeups, True, "", self.settings.poll_interval_s)
        return asyncio.create_task(
            listen_async(
                engine, self._jobs_arrived, heartbeat_now.set, self.core.waiting, first=first, notify_engine=self.engine
            )
        )

    def __repr__(self) -> str:
        return base.describe("AsyncRunner", self.settings, self.wakeup_status)

    # -- the loop --------------------------------------------------------------------

    async def _loop(self) -> None:
        self._spawn_context = contextvars.copy_context()
        async with self._holding_connection():
            await self._serve()

    async def _serve(self) -> None:
        wake, stopping, _ = self._events()
        while not stopping.is_set():
            # Cleared before looking at the state, so a wake-up that arrives
            # while we look is never lost and a stale one never spins us.
            wake.clear()
            try:
                wait = await drive_async(loop_pass(self.core), self._perform)
            except Exception as error:
                await _wait(stopping, self.core.pass_failed(error, "async runner"))
                continue
            self.core.pass_succeeded()
            if wait > 0:
                await _wait(wake, wait)

    async def _prune_loop(self) -> None:
        """Prune settled jobs past the retention, beside the claiming loop (a
        task of its own: a batch never delays a claim)."""
        async with self._holding_connection():
            await self._prune_forever()

    async def _prune_forever(self) -> None:
        while True:
            await asyncio.sleep(self.core.until_retention())
            try:
                await drive_async(prune(self.core), self._perform)
            except Exception as error:  # pragma: no cover - prune answers store failures itself
                log.error("pruner: %s", redacted(error))

    async def _heartbeat_loop(self) -> None:
        async with self._holding_connection():
            await self._beat()

    async def _beat(self) -> None:
        _, _, now = self._events()
        wait = self.settings.heartbeat_s
        while True:
            await _wait(now, wait)
            now.clear()
            wait = self.settings.heartbeat_s
            try:
                # Sooner after a transient failure: the renewal is retried
                # while the leases may be alive (see core.loop.renew).
                wait = await self._renew_all()
            except Exception as error:
                log.error("heartbeat failed: %s", error)
            if not self.core.outage.ongoing:
                await self._worker_step(refresh_worker(self.core))

    async def _worker_step(self, steps: Steps[None]) -> None:
        """Perform a step on this runner's worker row; its failures are the
        step's to log, never the runner's to die of."""
        try:
            await drive_async(steps, self._perform)
        except Exception as error:  # pragma: no cover - the steps answer store failures themselves
            log.warning("worker row: %s", redacted(error))


async def _unless_late(
    fn: Callable[[RunningJob], Any], job: RunningJob, execution: Execution, heartbeat_s: float
) -> Any:
    """Await ``fn(job)`` -- unless, now that its task runs, the claim's last
    check is over a heartbeat old (the process was frozen or starved since):
    then :data:`~sqlalchemy_watchdog.core.steps.STARTED_LATE`, never calling it."""
    if execution.started_late(heartbeat_s):
        return STARTED_LATE
    return await fn(job)


def _call_unless_late(
    fn: Callable[[RunningJob], Any], job: RunningJob, execution: Execution, heartbeat_s: float
) -> Any:
    """:func:`_unless_late` for a plain handler, in its thread."""
    if execution.started_late(heartbeat_s):
        return STARTED_LATE
    return fn(job)


class _DaemonThreads:
    """Threads for plain (blocking) handlers, started as needed and reused.

    Not ``asyncio.to_thread``: the loop's default executor has ``cpus + 4``
    threads, fewer than a large ``concurrency``, and its threads are joined
    at exit, so one handler ignoring its stop would keep the process alive
    after the runner returned. These are daemon threads, as the sync
    runner's handler threads are.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._idle = 0
        self._lock = threading.Lock()
        self._started = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` in a daemon thread, as a future of the running loop."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
            else:
                self._started += 1
                threading.Thread(
                    target=self._serve, name=f"watchdog-async-handler-{self._started}", daemon=True
                ).start()
        self._queue.put((fn, args, future))
        return future

    def _serve(self) -> None:
        while True:
            fn, args, future = self._queue.get()
            loop = future.get_loop()
            try:
                result = fn(*args)
            except BaseException as error:
                _resolve(loop, future, None, error)
            else:
                _resolve(loop, future, result, None)
            with self._lock:
                self._idle += 1


def _resolve(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, error: BaseException | None
) -> None:
    def settle() -> None:
        if future.done():  # cancelled meanwhile (a stop): nobody waits for the answer
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop has closed: nobody waits
        pass


async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Wait for ``event``, at most ``timeout`` seconds."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass


def _log_given_up(count: int, why: str) -> None:
    """The async settler's one ERROR for settles given up at stop: their
    decisions are lost (the sync settler's are logged by ``settle_batch``)."""
    log.error(
        "settle of %d job(s) given up: %s; their decisions are lost and recovery will handle them"
        " once their leases end",
        count,
        why,
    )


class _AsyncSettler:
    """Settles finished executions in batches, as the sync runner's settler:
    every settle waiting when a batch starts shares one ``settle_many``
    statement and one commit (each row keeps its own guard), so a runner
    needs one connection for settling however many handlers finish at once
    (gathered for a moment first when it claims ahead of its children).
    """

    MAX_BATCH = 256

    def __init__(self, runner: AsyncRunner) -> None:
        self.runner = runner
        # Each settle waits with whoever wants its answer: a future, or the
        # execution handed off (the settler finishes and retires it).
        self._pending: list[tuple[SettleRequest, asyncio.Future[Settlement | None] | Execution]] = []
        self._ready = asyncio.Event()
        #: Starts of jobs claimed ahead waiting to be recorded (:meth:`start`).
        self._starts: list[tuple[tuple[str, str], asyncio.Future[set[str] | WatchdogError | None]]] = []
        self.stopped = False
        #: Whether the settles given up at stop were logged.
        self._given_up_logged = False

    async def settle(self, request: SettleRequest) -> Settlement | None:
        """Settle ``request`` in the next batch."""
        future: asyncio.Future[Settlement | None] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._ready.set()
        return await future

    async def start(self, pair: tuple[str, str]) -> set[str] | WatchdogError | None:
        """Record the start of the claim ``pair`` (a job claimed ahead whose
        handler is about to be called) in the settler's next statement of
        starts, shared by every start asked for until it is sent, and sent
        before the settles waiting beside it: the job_ids whose claim held,
        the failure, or None once the settler stopped (the caller then
        records it itself)."""
        if self.stopped:
            return None
        future: asyncio.Future[set[str] | WatchdogError | None] = asyncio.get_running_loop().create_future()
        self._starts.append((pair, future))
        self._ready.set()
        return await future

    async def _send_starts(self) -> None:
        """One statement records every start waiting; each waiter gets its answer."""
        starts, self._starts = self._starts, []
        runner = self.runner
        answer: set[str] | WatchdogError | None
        try:
            answer = await drive_async(record_starts(runner.core, [pair for pair, _ in starts]), runner._perform)
        except WatchdogError as error:
            answer = error
        except BaseException:
            for _, future in starts:  # cancelled (stopping), or a bug: each records its own
                if not future.done():
                    future.set_result(None)
            raise
        for _, future in starts:
            if not future.done():
                future.set_result(answer)

    def submit(self, request: SettleRequest, execution: Execution) -> bool:
        """Settle ``request`` in the next batch, then finish and retire
        ``execution``; False once the settler stopped (the caller then
        settles it itself)."""
        if self.stopped:
            return False
        self._pending.append((request, execution))
        self._ready.set()
        return True

    def _answer(self, waiter: asyncio.Future[Settlement | None] | Execution, settlement: Settlement | None) -> None:
        if isinstance(waiter, Execution):
            try:
                self.runner._finish(waiter, settlement)
            except Exception:  # pragma: no cover - a bug; the lease then ends and recovery covers it
                log.exception("job %s: finishing its settle failed", waiter.job_id)
        elif not waiter.done():
            waiter.set_result(settlement)

    async def run(self) -> None:
        """Settle until cancelled; then settle whatever still waits one by one."""
        async with self.runner._holding_connection():
            await self._serve()

    async def _serve(self) -> None:
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                if not self._starts:
                    await self._gather()  # a handler waiting for its start is never kept waiting
                while self._pending or self._starts:
                    if self._starts:
                        # First: the handlers wait for these, the settles for nobody.
                        await self._send_starts()
                    if self._pending:
                        await self._settle_some()
        finally:
            self.stopped = True
            starts, self._starts = self._starts, []
            for _, future in starts:  # never sent: each handler records its own
                if not future.done():
                    future.set_result(None)
            pending, self._pending = self._pending, []
            if pending and not self._given_up_logged:
                _log_given_up(len(pending), "the runner stopped before they were sent")
            for _, waiter in pending:  # never sent: recovery covers those jobs
                self._answer(waiter, None)

    async def _gather(self) -> None:
        """Wait for as many settles as the runner's core's ``settle_gather()`` asks, or
        until its time is up (a cancellation ends the wait with the task)."""
        want, gather_s = self.runner.core.settle_gather()
        deadline = time.monotonic() + gather_s
        while len(self._pending) < want and not self._starts:  # a start waiting ends the gather
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await _wait(self._ready, left)
            self._ready.clear()

    async def _settle_some(self) -> None:
        batch = self._pending[: self.MAX_BATCH]
        del self._pending[: self.MAX_BATCH]
        try:
            settlements = await self.runner._settle([request for request, _ in batch])
        except BaseException as error:
            # Cancelled mid-batch, or a bug: whoever waits learns it was not settled.
            if isinstance(error, Exception):  # pragma: no cover - settle_batch answers store failures
                log.exception("settler: a batch of %d settles failed", len(batch))
            elif batch:
                # Stopped (after the shutdown waited for them) while the batch
                # was still being tried: the database did not take it in time.
                _log_given_up(len(batch) + len(self._pending), "the runner stopped while they were being sent")
                self._given_up_logged = True
            for _, waiter in batch:
                self._answer(waiter, None)
            if not isinstance(error, Exception):
                raise
            return
        for (_, waiter), settlement in zip(batch, settlements, strict=True):
            self._answer(waiter, settlement)
