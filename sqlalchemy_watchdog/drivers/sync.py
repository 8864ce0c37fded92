"""The worker: :class:`Runner` claims jobs, keeps their leases alive, runs
their handlers in threads and settles them with the exact claim.

::

    from sqlalchemy_watchdog import Runner, handler

    @handler("emails")
    def send_email(job):
        deliver(job.payload["to"])          # None -> settled "completed"

    Runner(engine).run_forever()            # until SIGINT/SIGTERM or stop()

Every rule the runner follows lives in :mod:`sqlalchemy_watchdog.core`;
this module only performs its steps with threads and a sync ``Connection``
(what it does alike with the asyncio driver is in ``drivers/base.py``).
Public as :class:`sqlalchemy_watchdog.Runner` and ``sqlalchemy_watchdog.runner.Runner``.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from sqlalchemy import Engine

from ..core.ahead import AHEAD_WAIT_MAX_S, Parking, take_stale
from ..core.durable import StepPort
from ..core.handlers import RunningJob
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
    compensation_due,
    conclude,
    decision_of_exception,
    decision_of_result,
    finish_handed_off,
    settle_batch,
    steps_unread,
)
from ..core.settings import RunnerOptions
from ..core.signals import SignalSafeEvent, restore_signal, signals_to_install
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
    drive,
)
from ..errors import WatchdogError, redacted
from ..executors.pool import RunnerChildren, decision_of_outcome
from ..gateway import SyncGateway
from ..jobs import Decision, JobView
from ..records import SettleRequest
from ..store import parent_results, read_signal, read_steps, report_progress
from ..wakeups import (
    Listener,
    Waiting,
    WakeupStatus,
    connect_and_prove,
    local_key,
    polling_reason,
    wake_locally,
)
from . import base
from .base import record_step_in, step_writer

if TYPE_CHECKING:
    pass

__all__ = ["Runner"]

#: The name the runner has always logged under (its public module's).
log = logging.getLogger("sqlalchemy_watchdog.runner")

T = TypeVar("T")


class Runner:
    """A worker that runs the jobs of the queues it serves.

    :param engine: the application's ``Engine`` (PostgreSQL or SQLite).
    :param handlers: ``{queue: handler}``; None uses the handlers registered
        with :func:`~sqlalchemy_watchdog.handler`. A handler is called with a
        :class:`RunningJob` and returns None (``completed``) or a
        :class:`Decision`; an exception settles ``failed`` (and is logged
        with its traceback). With ``executor="process"`` (a
        :class:`~sqlalchemy_watchdog.ProcessExecutor`) handlers run in child
        processes and must be module-level functions.
    :param options: the runner's options as keyword arguments
        (``concurrency=``, ``lease=``, ``retry=``, ...): every one is
        described in :class:`~sqlalchemy_watchdog.RunnerOptions`,
        and one left out takes its default.
    :param listen_engine: an ``Engine`` with a direct URL (not through a
        transaction-mode pooler) used only for the listening session; default:
        ``engine``.
    """

    def __init__(
        self,
        engine: Engine,
        handlers: Mapping[str, Callable[[RunningJob], Any]] | None = None,
        *,
        listen_engine: Engine | None = None,
        **options: Unpack[RunnerOptions],
    ) -> None:
        setup = base.set_up(
            "Runner",
            engine,
            handlers,
            listen_engine,
            options,
            engine_type=Engine,
            other="sqlalchemy_watchdog.asyncio.AsyncRunner for an AsyncEngine",
        )
        self.engine = setup.engine
        self.listen_engine = setup.listen_engine
        self.wakeups = setup.wakeups
        #: Whether the poll interval is the default's (shortened when the runner cannot listen).
        self._default_poll = setup.default_poll
        self.settings = setup.settings
        self.core = setup.core
        #: The wake-ups in force: what was asked, whether the runner listens
        #: (LISTEN/NOTIFY on a proven session) and why not, and its poll
        #: interval. Known once :meth:`run_forever` has started.
        self.wakeup_status = setup.wakeup_status
        # Set by the stop signals' handler, which may run while the loop's
        # thread is inside one of them (see SignalSafeEvent).
        self._wake = SignalSafeEvent()
        self._stopping = SignalSafeEvent()
        # Wakes the heartbeat thread: to renew now (_renew_requested), to
        # look at a new handler's deadline, or to stop.
        self._heartbeat_now = threading.Event()
        self._renew_requested = False
        self._settler: _Settler | None = None
        self._workers: _Workers | None = None
        #: Store calls: connections (one kept by each holding thread), retries.
        self._gateway = SyncGateway(engine)
        self.core.progress_write = lambda *report: self._gateway.run(report_progress, *report)
        self.core.parents_read = lambda job_id: self._gateway.read(parent_results, job_id)
        self.core.step_port = StepPort(
            read=lambda job_id: self._gateway.read(read_steps, job_id),
            write=step_writer(self._gateway.run),
            write_in=record_step_in,
            codec=self.settings.codec,
            read_signal=lambda job_id, name: self._gateway.read(read_signal, job_id, name),
        )
        #: Set once run_forever serves (its listener started), or has ended.
        self._serving = threading.Event()
        #: Held by the one run_forever (or running() block) serving this runner.
        self._loop_lock = threading.Lock()
        self._loop_claimed = False
        #: The process executors' children (each pool made on first use).
        self._children = RunnerChildren(self.settings.child_executors)

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues this runner claims from."""
        return self.settings.queues

    @property
    def shutdown_budget(self) -> timedelta:
        """The longest a shutdown waits for running handlers: ``grace``, then
        ``min(2 s, grace)`` for those told to stop (what still runs is then
        handed to recovery by one more statement)."""
        return timedelta(seconds=self.settings.shutdown_budget_s)

    @property
    def isolated_jobs(self) -> tuple[str, ...]:
        """Jobs whose recovery the database refused (a constraint the
        library did not create, say), skipped for a while so they cannot
        stall the runner; each refusal is logged."""
        return self.core.isolated_jobs

    # -- performing steps --------------------------------------------------------

    def _store(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._gateway.run(fn, *args, **kwargs)

    @contextmanager
    def _holding_connection(self) -> Iterator[None]:
        """Within this block, the calling thread's store calls reuse one
        connection (the loop, settler, heartbeat and pruner threads: a
        checkout, an isolation-level change and a check-in less per call);
        handler threads check one out per call, so they never hold more
        than the pool has."""
        with self._gateway.holding():
            yield

    def _perform(self, step: Step) -> Any:
        if isinstance(step, StoreCall):
            answer = self._store(step.fn, *step.args, **step.kwargs)
            self.core.outage.succeeded()  # the database answers: an outage episode is over
            return answer
        if isinstance(step, Pause):
            time.sleep(step.seconds)
            return True
        if isinstance(step, RunHandler):
            return self._run_handler(step.execution)
        if isinstance(step, RecordStart):
            return self._record_start(step.execution)
        if isinstance(step, Stop):
            step.execution.signal.request(step.reason)
            return None
        if isinstance(step, Probe):
            assert self.settings.is_alive is not None
            try:
                return bool(self.settings.is_alive(step.job))
            except Exception as error:
                return probe_failed(step.job, error)
        if isinstance(step, Spawn):
            workers = self._workers
            assert workers is not None, "executions are spawned only by run_forever"
            self._children.expect(step.executions)  # before their threads: those arrive in no set order
            for execution in step.executions:
                workers.run(execution)
            return None
        if isinstance(step, WaitDone):
            deadline = time.monotonic() + step.timeout
            for execution in step.executions:
                execution.done.wait(max(0.0, deadline - time.monotonic()))
            return None
        raise TypeError(step)  # pragma: no cover

    def _record_start(self, execution: Execution) -> set[str]:
        """Record the start of a job claimed ahead: in the settler's next
        statement of starts, with every other start asked for meanwhile
        (:meth:`_Settler.start`) -- or, without a settler, alone."""
        settler = self._settler
        answer = settler.start(execution.pair) if settler is not None else None
        if answer is None:
            answer = drive(record_starts(self.core, [execution.pair]), self._perform)
        if isinstance(answer, WatchdogError):
            raise answer
        held: set[str] = answer
        return held

    def _run_handler(self, execution: Execution) -> Decision | None:
        if execution.started_late(self.settings.heartbeat_s):
            return STARTED_LATE  # execute() renews the claim first, then asks again
        job = execution.job
        if execution.deadline is not None:
            self._heartbeat_now.set()  # the heartbeat thread keeps the deadlines
        ref = self.settings.handler_refs.get(job.queue)
        if ref is not None:
            try:
                outcome = self._children.get(job.queue).call(
                    ref,
                    job,
                    execution.signal,
                    stop_wait_s=self.settings.stop_wait_s,
                    on_start=functools.partial(self._child_started, execution),
                    rank=execution.rank,
                    pipe=not execution.claimed_ahead,
                )
                decided = decision_of_outcome(execution, outcome)
                if decided is STARTED_LATE or decided is NEVER_STARTED:
                    return decided
                unread = None if decided is None else steps_unread(execution)
                if unread is not None:
                    unread.load()
                # A failure for good runs the undos the child's steps named
                # here, in the runner (the child sent them by reference).
                if not compensation_due(self.core, execution, decided) or not drive(
                    claim_kept(self.core, execution), self._perform
                ):
                    return decided
                return compensate(self.core, execution, decided)
            finally:
                if self.core.release_slot(execution):
                    self._wake.set()
        try:
            handler = self.settings.handlers[job.queue]
            # A context of its own (its trace's, else a copy of this thread's):
            # what the handler sets in context variables ends with its job and
            # is never seen by the next job this thread runs.
            context = execution.handler_context()
            if context is None:
                context = contextvars.copy_context()
            try:
                decision = decision_of_result(context.run(handler, job), job)
            except Exception as error:
                decision = decision_of_exception(execution, error)
            # A failure for good runs the undos of its steps here, in the
            # handler's thread and context, before the slot is freed -- under
            # a claim renewed first if the handler outlived its timeout.
            unread = None if decision is None else steps_unread(execution)
            if unread is not None:
                unread.load()  # a run recovery requeued to compensate may not have read its steps
            if compensation_due(self.core, execution, decision) and not drive(
                claim_kept(self.core, execution), self._perform
            ):
                return decision
            return context.run(compensate, self.core, execution, decision)
        finally:
            if self.core.release_slot(execution):
                self._wake.set()

    def _child_started(self, execution: Execution, now: bool) -> bool:
        """The pool asks whether a child may take ``execution``'s job (``now``
        False): not before the start of a job claimed ahead is recorded, nor
        when the claim was last known live over a heartbeat ago -- it waited
        for a child that long -- and must be renewed first
        (:meth:`~.Execution.child_may_take`). Then it says the job starts
        (``now`` True): its timeout counts from now."""
        if not now:
            if execution.unstarted and not execution.child_ready:
                # Claimed ahead: its start is recorded here, in the pool's thread, as a child takes it.
                return drive(start_in_child(self.core, execution), self._perform)
            return execution.child_may_take(self.settings.heartbeat_s)
        if self.core.start_deadline(execution) is not None:
            self._heartbeat_now.set()  # the heartbeat thread keeps the deadlines
        return True

    def _close_pool(self) -> None:
        """End the process executors' children (after the shutdown ended every job)."""
        for pool in self._children.take():
            pool.close()

    def _settle(
        self, requests: list[SettleRequest], perform: Callable[[Step], Any] | None = None
    ) -> list[Settlement | None]:
        """Settle ``requests`` (:func:`settle_batch`: retried while the
        database is unreachable and their leases may live); ``perform``:
        the settler's, whose pauses end when it is stopped."""
        return drive(settle_batch(self.core, requests), perform or self._perform)

    def _execute(self, execution: Execution, *, hand_off: bool = False) -> TickResult | None:
        """Run ``execution`` to its settle request in this thread, then settle
        it here -- or, with ``hand_off`` (handler threads under
        :meth:`run_forever`), hand the request to the settler, which settles
        it in a batch and finishes the execution; None then."""
        try:
            outcome = drive(execute(self.core, execution), self._perform)
        except BaseException:
            self._retire(execution)
            raise
        finally:
            self._children.withdraw(execution)
        if isinstance(outcome, TickResult):
            self._retire(execution)
            return outcome
        settler = self._settler
        if hand_off and settler is not None and settler.submit(outcome, execution):
            return None
        try:
            (settlement,) = self._settle([outcome])
            return conclude(execution, settlement)
        finally:
            self._retire(execution)

    def _finish(self, execution: Execution, settlement: Settlement | None) -> None:
        """A handed-off execution's settle is in: conclude it and retire it."""
        try:
            finish_handed_off(self.core, execution, settlement)
        finally:
            self._wake.set()

    def _retire(self, execution: Execution) -> None:
        self.core.retire(execution)
        self._wake.set()

    # -- public API ----------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run_forever` to shut down gracefully (thread-safe)."""
        self._stopping.set()
        self._wake.set()

    @contextmanager
    def running(self) -> Iterator[Runner]:
        """Run the runner in a thread of its own for the block: the one-line
        embedding for a Flask app, a script or any process whose main thread
        is busy with something else::

            with runner.running():
                serve_forever()      # the application; its signals stay its own

        Entering starts :meth:`run_forever` in a daemon thread (never
        touching signal handlers) and returns once it serves; an error it
        raised while starting (the session proof of ``wakeups="listen"``,
        say) is raised here. Leaving stops it and waits for its shutdown --
        within :attr:`shutdown_budget` and a few seconds for the last
        statements; a runner still stopping after that is logged and left to
        finish in its daemon thread (leases and recovery cover its jobs). A
        failure of the runner while the block ran is raised on leaving
        (after the block's own exception, if any). Entering it while the
        runner already serves raises :class:`RuntimeError`.
        """
        failure: list[BaseException] = []
        self._claim_loop("running()")

        def serve() -> None:
            try:
                self._run_forever(install_signal_handlers=False)
            except BaseException as error:
                failure.append(error)
                log.error("runner failed: %s", redacted(error), exc_info=error)
            finally:
                self._release_loop()
                self._serving.set()

        self._serving.clear()
        thread = threading.Thread(target=serve, name="watchdog-runner", daemon=True)
        thread.start()
        self._serving.wait()
        if failure:
            thread.join()
            raise failure[0]
        try:
            yield self
        finally:
            self.stop()
            thread.join(base.exit_wait_s(self.settings))
            if thread.is_alive():
                log.warning(
                    "runner: still shutting down %gs after it was asked to stop; leaving it to finish",
                    base.exit_wait_s(self.settings),
                )
        if failure:
            raise failure[0]

    def tick(self) -> TickResult:
        """One step: recover a disappeared claim if any; else claim one job,
        run its handler in this thread (heartbeats keep its lease alive) and
        settle it. For custom loops and tests."""
        outcome = drive(tick(self.core), self._perform)
        if isinstance(outcome, TickResult):
            return outcome
        heartbeat = _Heartbeat(self)
        heartbeat.start()
        try:
            result = self._execute(outcome)
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
            if until_idle(self.tick(), settled):
                break
        return settled

    def run_forever(self, *, install_signal_handlers: bool | None = None) -> None:
        """Serve the queues until :meth:`stop` (or SIGINT/SIGTERM where the
        runner owns the process).

        Signals stay the host's: by default (None) the runner stops on
        SIGINT/SIGTERM only in the main thread, and only on a signal nobody
        else handles -- a script's, not a server's that installed its own.
        ``True`` takes both over in the main thread, ``False`` never; the
        handlers it replaced are put back when it returns.

        Shutdown stops claiming, gives running handlers ``grace`` to finish,
        then sets their ``stop_requested``; a job still running after that
        has its lease ended on purpose and is recovered at once (requeued
        within its budget, else settled ``interrupted`` with a reason saying
        the shutdown's grace ran out) -- never left running under a live
        lease, never lost. A handler that returns normally meanwhile has
        done its work: its job settles ``completed``.

        One runner serves one loop at a time: calling it while the runner
        already serves (here or in :meth:`running`) raises
        :class:`RuntimeError` and leaves the serving loop alone.
        """
        self._claim_loop("run_forever()")
        try:
            self._run_forever(install_signal_handlers=install_signal_handlers)
        finally:
            self._release_loop()

    def _claim_loop(self, entry: str) -> None:
        """Mark the runner as serving, or refuse a second loop on it: a
        second loop would share its stop event, so leaving either would stop
        both and the outer block's jobs would wait unserved."""
        with self._loop_lock:
            if self._loop_claimed:
                raise base.already_serving(entry, "Runner")
            self._loop_claimed = True

    def _release_loop(self) -> None:
        with self._loop_lock:
            self._loop_claimed = False

    def _run_forever(self, *, install_signal_handlers: bool | None) -> None:
        previous = self._install_signals(install_signal_handlers)
        heartbeat = _Heartbeat(self)
        heartbeat.start()
        settler = self._settler = _Settler(self)
        workers = self._workers = _Workers(self)
        try:
            listener = self._start_listener()
        except BaseException:
            heartbeat.stop()
            settler.stop()
            self._settler = None
            workers.stop()
            self._workers = None
            self._close_pool()
            for sig, previous_handler in previous.items():
                restore_signal(sig, previous_handler)
            self._serving.set()
            raise
        pruner = _Pruner(self) if self.settings.retention is not None else None
        # Room freed in a limited queue by a settle in this process (SQLite's only wake-up).
        unwake = wake_locally(local_key(self.engine), self._jobs_arrived)
        self._worker_step(register_worker(self.core, str(self.wakeup_status)))
        base.log_started(log, "runner", self.settings, self.wakeup_status, self.engine.pool)
        self._serving.set()
        try:
            with self._holding_connection():
                self._loop()
        finally:
            try:
                for pool in self._children.current:
                    pool.give_back_waiting()  # jobs claimed ahead never start once stopping
                workers.give_back(workers.parking.take_all())  # as those waiting for a thread
                drive(shutdown(self.core), self._perform)
            finally:
                unwake()
                if pruner is not None:
                    pruner.stop()
                heartbeat.stop()
                settler.stop()
                self._settler = None
                workers.stop()
                self._workers = None
                self._close_pool()
                # After the heartbeat stopped: nothing refreshes the row again.
                self._worker_step(deregister_worker(self.core))
                if listener is not None:
                    self.core.waiting = None
                    listener.stop()
                for sig, previous_handler in previous.items():
                    restore_signal(sig, previous_handler)
                self._stopping.clear()
                log.info("runner stopped")

    def _start_listener(self) -> Listener | None:
        """Listen where :attr:`wakeups` allows it and the listening session is
        proven (see :mod:`sqlalchemy_watchdog.connections`); else poll, and say why."""
        engine = self.listen_engine
        reason = polling_reason(self.wakeups, engine.dialect.name, engine.dialect.driver)
        first: Any = None
        if reason is None:
            # The proof's NOTIFY goes through the runner's own engine: a listen_engine on another
            # database would otherwise prove itself and then hear none of the runner's notifications.
            first, proof = connect_and_prove(engine, self.engine)
            if proof is not None and not proof.proven:
                reason = proof.reason
        if reason is not None:
            settings = base.poll_settings(self.settings, default_poll=self._default_poll)
            self.settings = self.core.settings = settings
            self.wakeup_status = base.polling_status(
                reason, wakeups=self.wakeups, listen_engine=engine, settings=settings
            )
            return None
        waiting = Waiting(self.settings.poll_interval_s)
        listener = Listener.start_for(
            engine, self._jobs_arrived, self._renew_now, waiting, first=first, notify_engine=self.engine
        )
        self.core.waiting = waiting if listener is not None else None
        self.wakeup_status = WakeupStatus(self.wakeups, True, "", self.settings.poll_interval_s)
        return listener

    def __repr__(self) -> str:
        return base.describe("Runner", self.settings, self.wakeup_status)

    # -- the loop --------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            # Cleared before looking at the state, so a wake-up that arrives
            # while we look is never lost and a stale one never spins us.
            self._wake.clear()
            try:
                wait = drive(loop_pass(self.core), self._perform)
            except Exception as error:
                self._stopping.wait(self.core.pass_failed(error))
                continue
            self.core.pass_succeeded()
            # A stop whose wake-up a clear() above swallowed is seen here.
            if wait > 0 and not self._stopping.is_set():
                self._wake.wait(wait)

    def _jobs_arrived(self) -> None:
        """A wake-up: jobs were enqueued (some may be delayed only briefly)."""
        self.core.jobs_arrived()
        self._wake.set()

    def _renew_now(self) -> None:
        """A wake-up: a job was cancelled or its lane failed; renew now to find out which."""
        self._renew_requested = True
        self._heartbeat_now.set()

    def _renew_all(self) -> float:
        """Renew every claim; how long until the next renewal (sooner after
        a transient failure: see :func:`renew`)."""
        return drive(renew(self.core), self._perform)

    def _worker_step(self, steps: Steps[None]) -> None:
        """Perform a step on this runner's worker row; its failures are the
        step's to log, never the runner's to die of."""
        try:
            drive(steps, self._perform)
        except Exception as error:  # pragma: no cover - the steps answer store failures themselves
            log.warning("worker row: %s", redacted(error))

    def _time_out(self) -> None:
        drive(time_out(self.core), self._perform)

    def _install_signals(self, install: bool | None) -> dict[signal.Signals, Any]:
        """Take over the stop signals :func:`signals_to_install` allows; the
        handlers replaced, to put back."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop()  # first: nothing the log line might run into can keep the stop back
            log.info("received %s; shutting down", signal.Signals(signum).name)

        return {sig: signal.signal(sig, on_signal) for sig in signals_to_install(install)}


class _Workers:
    """Handler threads, started as needed up to ``concurrency`` and reused.

    A thread per job cost more than a no-op handler; a worker that is busy
    with a handler that ignores its stop signal is simply not reused (it is
    a daemon thread and never blocks the process from exiting). Jobs claimed
    ahead of the free slots wait in :attr:`parking` for the next thread that
    finishes its job (the process executor's wait for a child instead).
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._queue: queue.SimpleQueue[Execution | None] = queue.SimpleQueue()
        self._idle = 0
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        local = runner.settings.local_group
        self.parking = Parking(local.concurrency if local is not None else sys.maxsize)
        #: The queues whose jobs wait for a thread when claimed ahead; a job
        #: run in a child waits for the child instead (its pool's line).
        self._parked = frozenset(local.queues) if local is not None else frozenset()

    def run(self, execution: Execution) -> None:
        parks = execution.job.queue in self._parked
        if parks and not self.parking.offer(execution, self.runner.core.clock.monotonic()):
            return  # claimed ahead: the next thread that finishes its job takes it
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
            execution: Execution | None = self._queue.get()
            if execution is None:
                return
            while execution is not None:
                try:
                    self.runner._execute(execution, hand_off=True)
                except BaseException:  # pragma: no cover - a bug; the lease then ends and recovery covers it
                    log.exception("job %s: execution failed", execution.job_id)
                # Its slot goes to the next job parked for a thread, if it held one.
                execution = self.parking.next() if execution.job.queue in self._parked else None
            with self._lock:
                self._idle += 1

    def give_back(self, executions: list[Execution]) -> None:
        """Give jobs claimed ahead back without running them (queued again,
        nothing counted; taken out of :attr:`parking`, which marked them):
        they waited too long for a thread, or the runner is stopping. On the
        calling thread: no handler runs."""
        for execution in executions:
            try:
                self.runner._execute(execution, hand_off=True)
            except BaseException:  # pragma: no cover - a bug; the lease then ends and recovery covers it
                log.exception("job %s: giving back failed", execution.job_id)

    def give_back_stale(self) -> None:
        """Give back the jobs that waited for a thread over :data:`AHEAD_WAIT_MAX_S`."""
        core = self.runner.core
        self.give_back(take_stale(self.parking, core.run_times, core.clock.monotonic()))

    def stop(self) -> None:
        """Let idle workers end; busy ones end after their execution."""
        for _ in self._threads:
            self._queue.put(None)


class _Settler:
    """Settles finished executions in batches: every settle that is waiting
    when a batch starts shares one statement and one commit (a runner that
    claims ahead of its children first gathers their answers for a moment:
    ``RunnerCore.settle_gather``).

    A handler thread hands its settle request over (:meth:`submit`) and goes
    on to the next job; the settler concludes and retires that execution
    once the batch is in.
    """

    MAX_BATCH = 256

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._pending: list[tuple[SettleRequest, Execution]] = []
        #: Starts of jobs claimed ahead waiting to be recorded (:meth:`start`).
        self._starts: list[_Start] = []
        self._cond = threading.Condition()
        self._stopped = False
        #: Set by :meth:`stop`: a batch retried while the database is
        #: unreachable is given up (its pause ends at once, answered False).
        self._giving_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog-settler", daemon=True)
        self._thread.start()

    def submit(self, request: SettleRequest, execution: Execution) -> bool:
        """Settle ``request`` in the next batch; False once the settler stopped
        (the caller then settles it itself)."""
        with self._cond:
            if self._stopped:
                return False
            self._pending.append((request, execution))
            self._cond.notify()
            return True

    def start(self, pair: tuple[str, str]) -> set[str] | WatchdogError | None:
        """Record the start of the claim ``pair`` (a job claimed ahead whose
        handler is about to be called) in the settler's next statement of
        starts, shared by every start asked for until it is sent, and sent
        before the settles waiting beside it. Blocks until it is in: the
        job_ids whose claim held, the failure, or None once the settler
        stopped (the caller then records it itself)."""
        waiter = _Start(pair)
        with self._cond:
            if self._stopped:
                return None
            self._starts.append(waiter)
            self._cond.notify()
        waiter.done.wait()
        return waiter.answer

    def _send_starts(self, starts: list[_Start]) -> None:
        """One statement records every start in ``starts``; each waiter gets its answer."""
        runner = self.runner
        answer: set[str] | WatchdogError | None
        try:
            answer = drive(record_starts(runner.core, [waiter.pair for waiter in starts]), runner._perform)
        except WatchdogError as error:
            answer = error
        except BaseException:  # pragma: no cover - a bug: the handlers record their starts themselves
            log.exception("settler: recording %d start(s) failed", len(starts))
            answer = None
        for waiter in starts:
            waiter.answer = answer
            waiter.done.set()

    def stop(self) -> None:
        """Stop once the settles waiting are sent; a batch retried while the
        database is unreachable is given up (logged by :func:`settle_batch`),
        and so is every one after it (the shutdown waited for them first)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._giving_up.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            with self.runner._holding_connection():
                self._serve()
        finally:
            with self._cond:
                self._stopped = True
                starts, self._starts = self._starts, []
            for waiter in starts:  # never sent: each handler records its own
                waiter.done.set()

    def _perform(self, step: Step) -> Any:
        """The runner's steps, but a pause ends when the settler is stopped."""
        if isinstance(step, Pause):
            return not self._giving_up.wait(step.seconds)
        return self.runner._perform(step)

    def _gather(self) -> None:
        """Wait (the condition held) for as many settles as the runner's
        core's ``settle_gather()`` asks, or until its time is up, the settler
        stops or a handler waits for the record of its start."""
        want, gather_s = self.runner.core.settle_gather()
        deadline = time.monotonic() + gather_s
        while len(self._pending) < want and not self._stopped and not self._starts:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._starts and not self._stopped:
                    self._cond.wait()
                if not self._pending and not self._starts:
                    return
                if not self._starts:
                    self._gather()  # a handler waiting for its start is never kept waiting
                starts, self._starts = self._starts, []
                batch = self._pending[: self.MAX_BATCH]
                del self._pending[: self.MAX_BATCH]
            if starts:
                # First: the handlers wait for these, the settles for nobody.
                self._send_starts(starts)
            if not batch:
                continue
            try:
                settlements = self.runner._settle([request for request, _ in batch], self._perform)
            except Exception:  # pragma: no cover - settle_batch answers store failures itself
                log.exception("settler: a batch of %d settles failed", len(batch))
                settlements = [None] * len(batch)
            for (_, execution), settlement in zip(batch, settlements, strict=True):
                self.runner._finish(execution, settlement)


class _Start:
    """A start waiting in the settler (:meth:`_Settler.start`), and its answer."""

    __slots__ = ("answer", "done", "pair")

    def __init__(self, pair: tuple[str, str]) -> None:
        self.pair = pair
        self.answer: set[str] | WatchdogError | None = None
        self.done = threading.Event()


class _Pruner:
    """A thread pruning settled jobs past the runner's retention, beside the
    claiming loop so that a batch never delays a claim."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog-pruner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with self.runner._holding_connection():
            self._prune()

    def _prune(self) -> None:
        runner = self.runner
        while not self._stop.wait(runner.core.until_retention()):
            try:
                drive(prune(runner.core), runner._perform)
            except Exception as error:  # pragma: no cover - prune answers store failures itself
                log.error("pruner: %s", redacted(error))


class _Heartbeat:
    """A thread renewing every running claim of a runner each heartbeat, and
    stopping handlers at their attempt's deadline."""

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
        with self.runner._holding_connection():
            self._beat()

    def _beat(self) -> None:
        runner = self.runner
        interval = runner.settings.heartbeat_s
        next_renewal = time.monotonic() + interval
        while not self._stop.is_set():
            wait = next_renewal - time.monotonic()
            deadline = runner.core.next_deadline()
            if deadline is not None:
                wait = min(wait, deadline - runner.core.clock.monotonic())
            if runner.settings.ahead_cap > 0:
                wait = min(wait, AHEAD_WAIT_MAX_S)  # jobs claimed ahead are given back if they waited too long
            runner._heartbeat_now.wait(max(0.0, wait))
            runner._heartbeat_now.clear()
            if self._stop.is_set():
                return
            try:
                runner._time_out()
            except Exception:  # pragma: no cover - time_out only signals handlers
                log.exception("heartbeat: stopping timed-out handlers failed")
            workers = runner._workers
            if workers is not None:
                workers.give_back_stale()
            if not runner._renew_requested and time.monotonic() < next_renewal:
                continue
            runner._renew_requested = False
            next_renewal = time.monotonic() + interval
            try:
                # Sooner after a transient failure: the renewal is retried
                # while the leases may be alive (see core.loop.renew).
                next_renewal = min(next_renewal, time.monotonic() + runner._renew_all())
            except Exception as error:
                log.error("heartbeat failed: %s", error)
            if not runner.core.outage.ongoing:
                runner._worker_step(refresh_worker(runner.core))
