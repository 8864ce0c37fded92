"""The parent side of the process executor: a pool of child processes.

Each child is a fresh interpreter (``subprocess`` with ``sys.executable``,
the parent's ``sys.path`` and working directory) connected by a socket
pair that ``multiprocessing.connection`` frames: what ``multiprocessing``'s
``spawn`` context gives, without its re-import of the parent's main script
in every child (``__mp_main__``), which runs a script that lacks the
``if __name__ == "__main__":`` idiom again -- a runner in every child. The
parent is never forked (it has threads and database connections).

A handler thread of the runner (or of ``AsyncRunner``) calls
:meth:`ProcessPool.call` for one job: it takes an idle child (starting one
if needed), sends it the job, and waits for the answer while watching the
job's stop signal. With every child busy (a job claimed ahead, see
``ProcessExecutor.prefetch``) the job waits in the pool for the first child
that frees up -- or, unless its caller forbids it (``pipe=False``: a job
whose start is recorded only as a free child takes it), is sent to a busy
child's pipe behind its running job, which the child starts as soon as it
has answered -- in claim order (the
runner tells the pool a claim's order first, :meth:`ProcessPool.expect`,
since its threads arrive in no set order). A stop
is forwarded to the child at once; a child still busy
:attr:`~.ProcessExecutor.kill_grace` later is killed with SIGKILL and
*reaped* (``waitpid``) before ``call`` returns, so the job is settled only
once its handler can no longer run. A child that dies by itself is reaped
the same way and replaced by the next ``call``.
"""

from __future__ import annotations

import atexit
import collections
import enum
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from ..core.handlers import RunningJob, StopReason, StopSignal
from ..core.rules.settle import decision_of_exception, decision_of_result, timed_out
from ..core.state import Execution
from ..core.steps import NEVER_STARTED, STARTED_LATE
from ..errors import InvalidJob, safe_text
from ..jobs import Decision, bound_reason
from . import HandlerError, HandlerProcessDied, HandlerRef, ProcessExecutor
from . import child as child_module

log = logging.getLogger("sqlalchemy_watchdog.runner")

#: How often a waiting handler thread looks at its job's stop signal.
STOP_POLL_S = 0.05
#: The longest a new child may take to start (import the package) before it is killed.
START_TIMEOUT_S = 120.0
#: How long an idle child asked to exit may take before it is killed.
EXIT_WAIT_S = 5.0
#: How long the runner's logging levels, as told to children, are kept.
LOG_PLAN_TTL_S = 1.0


class Ending(str, enum.Enum):
    """How a job's run in a child ended."""

    #: The handler returned (:attr:`ChildOutcome.value`).
    RETURNED = "returned"
    #: The handler raised (:attr:`ChildOutcome.error`).
    RAISED = "raised"
    #: What the handler returned (or the job's payload) could not cross the pipe.
    UNENCODABLE = "unencodable"
    #: The child died while it ran the job.
    DIED = "died"
    #: The child was killed after a stop's grace (:attr:`ChildOutcome.stop`).
    KILLED = "killed"
    #: The job was stopped while it waited for a child (claimed ahead): it
    #: never reached one (:attr:`ChildOutcome.stop`).
    NOT_STARTED = "not_started"
    #: A child was free, but the job's claim was last known live over a
    #: heartbeat ago: not sent (the runner renews it, then asks again).
    LATE = "late"


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """What became of one job sent to a child."""

    ending: Ending
    value: Any = None
    error: BaseException | None = None
    #: A one-line description (the failure's reason).
    text: str = ""
    #: The handler's traceback as its child formatted it (:attr:`Ending.RAISED`).
    detail: str | None = None
    #: Why the child was told to stop (:attr:`Ending.KILLED`).
    stop: StopReason | None = None
    #: How long it was given between the stop and the kill (:attr:`Ending.KILLED`).
    grace_s: float = 0.0


def cause_of_death(exitcode: int | None) -> str:
    """A child's exit status in words: ``killed by signal SIGKILL``, ``exited with code 3``."""
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by signal {name}"
    return f"exited with code {exitcode}"


#: What a child runs (``python -c``): the parent's ``sys.path``, then
#: :func:`.child.main` on the inherited socket.
CHILD_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from sqlalchemy_watchdog.executors.child import main; main(*map(int, sys.argv[2:5]))"
)


def _relay(message: tuple[Any, ...]) -> None:
    """Hand a child's log record to the runner's logger of the same name."""
    if message[0] != child_module.LOG:
        return
    record = logging.makeLogRecord(message[1])
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)


def stand_in(name: str, text: str) -> HandlerError:
    """A :class:`HandlerError` for an exception named ``name`` whose
    :func:`~sqlalchemy_watchdog.safe_text` was ``text`` and that could not
    cross the pipe: a subclass of that name, so the job's reason reads as
    the original's."""
    message = text[len(name) + 2 :] if text.startswith(f"{name}: ") else ""
    kind: type[HandlerError] = type(name, (HandlerError,), {"__module__": HandlerError.__module__})
    return kind(message)


class _Spawner:
    """The one thread that starts children. On Linux a child's death signal
    (``PR_SET_PDEATHSIG``) fires when the *thread* that forked it ends, so
    children are started by a thread that lives as long as the pool."""

    def __init__(self) -> None:
        self._requests: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="watchdog-spawner", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._cond:
            if self._stopped:
                future.set_exception(RuntimeError("the process pool is closed"))
                return future
            self._requests.append((fn, future))
            self._cond.notify()
        return future

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._requests and not self._stopped:
                    self._cond.wait()
                if not self._requests:
                    return
                fn, future = self._requests.pop(0)
            try:
                future.set_result(fn())
            except BaseException as error:
                future.set_exception(error)


class _Child:
    """One child process and the parent's end of its pipe."""

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.pid: int = process.pid
        self.jobs = 0
        self.rss = 0
        #: Whether it holds one of the pool's ``processes`` places.
        self.counted = True
        #: Whether a job of the runner's is in it (running, or about to).
        self.running = False
        #: The job piped behind the running one (sent, not started yet).
        self.queued: _Waiter | None = None
        self._send_lock = threading.Lock()

    def send(self, data: bytes) -> None:
        """Send one message (threads of the runner send stops beside runs)."""
        with self._send_lock:
            self.conn.send_bytes(data)

    def alive(self) -> bool:
        return self.process.poll() is None

    def reap(self) -> str:
        """Wait for the child to be gone (``waitpid``); its cause of death."""
        self.process.wait()
        self._close()
        return cause_of_death(self.process.returncode)

    def kill(self) -> str:
        """SIGKILL the child and wait until it is gone; its cause of death."""
        try:
            self.process.kill()
        except OSError:  # pragma: no cover - already reaped
            pass
        return self.reap()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the child to exit; whether it did."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def retire(self) -> None:
        """Ask an idle child to exit; kill it if it does not within :data:`EXIT_WAIT_S`."""
        try:
            self.send(pickle.dumps((child_module.EXIT,)))
        except (OSError, ValueError):
            pass
        if not self.join(EXIT_WAIT_S):
            self.kill()
        self._close()

    def _close(self) -> None:
        try:
            self.conn.close()
        except OSError:  # pragma: no cover
            pass


class _Wait(enum.Enum):
    """Where a job claimed ahead stands while it waits for a child."""

    WAITING = "waiting"  # in the queue
    TAKING = "taking"  # a child that freed up is being handed to it
    SENT = "sent"  # sent to that child (``_Waiter.child``), which runs it
    PIPED = "piped"  # sent to a busy child (``_Waiter.child``), to run after its job
    LATE = "late"  # its claim's last check was too old when a child was free
    STOPPED = "stopped"  # its stop signal was set when a child was free
    DIED = "died"  # the child died as it was sent (``_Waiter.outcome``)
    START = "start"  # a place for one more child was freed: start one for it
    CLOSED = "closed"  # the pool closed


class _Waiter:
    """A job waiting for the first child to free up. The thread that frees
    a child hands it the next waiter's job itself (already pickled), so the
    child's next job follows its answer without a wake-up in between."""

    __slots__ = (
        "child", "data", "event", "job_id", "on_start", "outcome", "pipe", "rank", "reason", "signal", "state",
    )  # fmt: skip

    def __init__(
        self,
        data: bytes,
        signal: StopSignal,
        on_start: Callable[[bool], bool] | None,
        rank: tuple[int, int],
        pipe: bool = True,
    ) -> None:
        self.data = data
        #: Whether it may be sent behind a busy child's running job (see
        #: :meth:`ProcessPool.call`).
        self.pipe = pipe
        self.job_id: str = pickle.loads(data)[1]
        #: Its place in the claim order (priority first, then admission).
        self.rank = rank
        self.signal = signal
        self.on_start = on_start
        self.state = _Wait.WAITING
        #: Set once, when the state is final (anything but WAITING and TAKING).
        self.event = threading.Event()
        self.child: _Child | None = None
        self.outcome: ChildOutcome | None = None
        #: Why it was stopped, when not by its own signal (the runner stops).
        self.reason: StopReason | None = None

    def settle(self, state: _Wait) -> None:
        self.state = state
        self.event.set()


_POOLS: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    """At interpreter exit, end every pool's children (their pipes' end of
    file would end them too, a moment later)."""
    for pool in list(_POOLS):
        pool.close(wait_s=1.0)


class RunnerChildren:
    """A runner's :class:`ProcessPool` of each process executor its
    handlers run in (one per executor, handlers naming equal executors
    sharing it), each made when a job first needs it (handler threads ask at
    once) and taken away to be closed; what both runners do with them around
    a claim's executions."""

    def __init__(self, executors: Mapping[str, ProcessExecutor]) -> None:
        #: The executor of each queue whose handlers run in children.
        self._executors = dict(executors)
        self._pools: dict[ProcessExecutor, ProcessPool] = {}
        self._lock = threading.Lock()

    @property
    def current(self) -> tuple[ProcessPool, ...]:
        """The pools made so far (and not taken away)."""
        with self._lock:
            return tuple(self._pools.values())

    def get(self, queue: str) -> ProcessPool:
        """The pool of ``queue``'s executor, made now if none is."""
        config = self._executors.get(queue)
        assert config is not None, f"the handlers of {queue!r} do not run in children"
        with self._lock:
            pool = self._pools.get(config)
            if pool is None:
                pool = self._pools[config] = ProcessPool(config)
                weakref.finalize(self, pool.close)  # tick() alone never closes it
            return pool

    def take(self) -> tuple[ProcessPool, ...]:
        """The pools, for the caller to close; the next :meth:`get` makes another."""
        with self._lock:
            pools = tuple(self._pools.values())
            self._pools.clear()
        return pools

    def expect(self, executions: Sequence[Execution]) -> None:
        """Before a claim's executions start: the claim's order of those whose
        handlers run in children (:meth:`ProcessPool.expect`), each told to
        the pool of its queue's executor."""
        ranks: dict[str, list[tuple[int, int]]] = {}
        for e in executions:
            if e.killable:
                ranks.setdefault(e.job.queue, []).append(e.rank)
        by_pool: dict[int, tuple[ProcessPool, list[tuple[int, int]]]] = {}
        for queue, found in ranks.items():
            pool = self.get(queue)
            by_pool.setdefault(id(pool), (pool, []))[1].extend(found)
        for pool, found in by_pool.values():
            pool.expect(found)

    def withdraw(self, execution: Execution) -> None:
        """``execution`` asks for no child any more (:meth:`ProcessPool.withdraw`)."""
        if not execution.killable:
            return
        config = self._executors.get(execution.job.queue)
        pool = None if config is None else self._pools.get(config)
        if pool is not None:
            pool.withdraw(execution.rank)


class ProcessPool:
    """The children of one runner (see the module's docstring)."""

    def __init__(self, config: ProcessExecutor) -> None:
        self.config = config
        self._idle: list[_Child] = []
        self._live: set[_Child] = set()
        #: Places of ``processes`` taken: children serving, or being started.
        self._used = 0
        #: Jobs claimed ahead, waiting for a child (first come, first served).
        self._waiters: collections.deque[_Waiter] = collections.deque()
        #: The ranks of jobs claimed that have not asked for a child yet
        #: (:meth:`expect`): no child goes to a job ranked after one of them.
        #: The runner's threads reach the pool in no set order, so without
        #: this a job could take a child before one claimed ahead of it.
        self._expected: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._closed = False
        #: Set once the runner stops: no job waits for a child any more.
        self._giving_back = False
        self._spawner = _Spawner()
        #: Children started in all (replacements included), for logs and tests.
        self.started = 0
        #: The logging plan sent with each job, by handler module, and when it was made.
        self._log_plans: dict[str, tuple[float, child_module.LogPlan]] = {}
        _POOLS.add(self)

    @property
    def pids(self) -> tuple[int, ...]:
        """The process ids of the children alive now."""
        with self._lock:
            return tuple(sorted(c.pid for c in self._live if c.alive()))

    @property
    def waiting(self) -> int:
        """How many jobs wait for a child now (claimed ahead)."""
        with self._lock:
            return len(self._waiters)

    def _log_plan(self, module: str) -> child_module.LogPlan:
        """What a child running a handler of ``module`` is told of the
        runner's logging (made again at most every :data:`LOG_PLAN_TTL_S`):
        the loggers whose records it sends at any level -- the package's,
        those of the handler's top-level package and of ``forward_loggers``,
        and the root logger's own -- each with the lowest level the runner
        has for it or a logger below it (the runner applies its exact levels
        to what it receives), and the root logger's level."""
        now = time.monotonic()
        made = self._log_plans.get(module)
        if made is not None and now - made[0] < LOG_PLAN_TTL_S:
            return made[1]
        names = tuple(
            dict.fromkeys((*child_module.OWN_LOGGERS, module.partition(".")[0], *self.config.forward_loggers))
        )
        loggers = [(n, lg.level) for n, lg in _logger_items() if isinstance(lg, logging.Logger) and lg.level]
        levels = [("", logging.getLogger().getEffectiveLevel())]
        for name in names:
            level = logging.getLogger(name or None).getEffectiveLevel()
            below = [lv for other, lv in loggers if not name or other.startswith(f"{name}.")]
            levels.append((name, min([level, *below])))
        plan = (tuple(levels), ("root", *names))
        self._log_plans[module] = (now, plan)
        return plan

    # -- the claim's order

    def expect(self, ranks: Iterable[tuple[int, int]]) -> None:
        """Jobs of one claim, of these ``ranks``, will ask for a child: until
        each asks (:meth:`call`) or is withdrawn, no job ranked after it takes
        a child. The runner calls this before it starts their executions,
        whose threads reach the pool in no set order."""
        with self._lock:
            self._expected.update(ranks)

    def withdraw(self, rank: tuple[int, int]) -> None:
        """The job of ``rank`` asks for no child any more: its execution
        ended, having asked or not (a job stopped before it started never
        asks). Idempotent."""
        with self._lock:
            if rank not in self._expected:
                return
            self._expected.discard(rank)
        self._dispatch()

    def _blocked(self, rank: tuple[int, int]) -> bool:
        """Whether a job expected has not asked yet and ranks before ``rank`` (the lock held)."""
        return bool(self._expected) and min(self._expected) < rank

    def _dispatch(self) -> None:
        """Hand the idle children to the first jobs in line that may take
        them now, then pipe: after a job expected asks or is withdrawn."""
        while True:
            with self._lock:
                if self._closed or not self._idle or not self._waiters or self._blocked(self._waiters[0].rank):
                    break
                child = self._idle.pop()
            if child.alive():
                self._hand_on(child)
            else:
                child.reap()
                self._forget(child)
        self._pipe()

    # -- starting and ending children

    def _start(self) -> _Child:
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CHILD_BOOT,
                    json.dumps(sys.path),
                    str(theirs.fileno()),
                    str(os.getpid()),
                    str(logging.getLogger().getEffectiveLevel()),
                ],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        child = _Child(process, Connection(ours.detach()))
        with self._lock:
            self._live.add(child)
            self.started += 1
        return child

    def _new_child(self) -> _Child:
        """A child started by the spawner thread and ready for a job, in a
        place of ``processes`` already taken for it (the caller's to give
        back if this fails)."""
        try:
            child: _Child = self._spawner.submit(self._start).result()
        except Exception as error:  # no process (too many open files, the pool closed meanwhile)
            raise HandlerProcessDied(f"a handler process could not be started ({safe_text(error)})") from error
        deadline = time.monotonic() + START_TIMEOUT_S
        while wait([child.conn], max(0.0, deadline - time.monotonic())):
            try:
                message = pickle.loads(child.conn.recv_bytes())
            except (EOFError, OSError):
                break
            if message[0] == child_module.READY:
                log.debug("handler process %d started", child.pid)
                return child
            _relay(message)
        cause = child.kill() if child.alive() else child.reap()
        with self._lock:
            self._live.discard(child)
            child.counted = False
        raise HandlerProcessDied(f"a handler process (pid {child.pid}) failed to start: it {cause}")

    def _give_back(self) -> None:
        """A place of ``processes`` is free again: the first waiting job
        starts a child in it."""
        with self._lock:
            self._used -= 1
            if self._closed or not self._waiters:
                return
            waiter = self._waiters.popleft()
            self._used += 1
        waiter.settle(_Wait.START)

    def _forget(self, child: _Child) -> None:
        """``child`` is gone or leaving: its place of ``processes`` is free."""
        with self._lock:
            self._live.discard(child)
            counted, child.counted = child.counted, False
        if counted:
            self._give_back()

    def _release(self, child: _Child) -> None:
        """A child whose job ended: it takes the next waiting job at once,
        or goes back to the idle ones -- or it is replaced (its job count or
        memory is over the limits, it died, or the pool closed)."""
        with self._lock:
            queued, child.queued = child.queued, None
        if queued is not None:
            # Its next job was piped: it runs now (the child took it on its own).
            queued.settle(_Wait.SENT)
            self._pipe()
            return
        if not child.alive():
            child.reap()
            self._forget(child)
            return
        config = self.config
        why = None
        if config.max_jobs_per_child is not None and child.jobs >= config.max_jobs_per_child:
            why = f"it ran {child.jobs} jobs (max_jobs_per_child)"
        elif config.max_memory_per_child is not None and child.rss > config.max_memory_per_child:
            why = (
                f"its memory ({child.rss / 2**20:.0f} MiB resident) is over "
                f"max_memory_per_child ({config.max_memory_per_child / 2**20:.0f} MiB)"
            )
        if why is None:
            child.running = False
            self._hand_on(child)
            return
        child.running = False
        log.info("replacing handler process %d: %s", child.pid, why)
        self._leave(child)

    def _leave(self, child: _Child) -> None:
        """Retire an idle child in a thread of its own; its place is free at once."""
        with self._lock:
            counted, child.counted = child.counted, False
        if counted:
            self._give_back()
        threading.Thread(target=self._retire, args=(child,), name="watchdog-retire", daemon=True).start()

    def _hand_on(self, child: _Child) -> None:
        """Send the first waiting job to the idle ``child`` (from the thread
        that freed it: no wake-up between the answer and the next job), or
        keep it idle."""
        while True:
            with self._lock:
                if self._closed:
                    break
                if not self._waiters or self._blocked(self._waiters[0].rank):
                    self._idle.append(child)
                    return
                waiter = self._waiters.popleft()
                waiter.state = _Wait.TAKING
            if not self._still_wanted(waiter):
                continue
            child.running = True
            try:
                child.send(waiter.data)
            except OSError:
                waiter.outcome = self._died(child)
                waiter.settle(_Wait.DIED)
                return
            waiter.child = child
            waiter.settle(_Wait.SENT)
            self._pipe()
            return
        self._leave(child)

    def _still_wanted(self, waiter: _Waiter) -> bool:
        """Whether a job taken from the line may go to a child: not stopped
        meanwhile, and its claim still live (else it is settled here)."""
        if waiter.signal.is_set():
            waiter.settle(_Wait.STOPPED)
            return False
        if waiter.on_start is not None and not waiter.on_start(False):
            self._renewing(waiter.rank)
            waiter.settle(_Wait.LATE)
            return False
        return True

    def _renewing(self, rank: tuple[int, int]) -> None:
        """The job of ``rank`` was about to take a child, but its claim must
        be renewed first: it asks again once renewed (or its execution ends,
        which withdraws it), and until then it is expected like a job of a
        claim that has not asked yet -- no job ranked after it takes the
        child it would have had."""
        with self._lock:
            self._expected.add(rank)

    def _may_pipe(self, child: _Child) -> bool:
        """Whether ``child`` may be sent a job behind its running one (the
        lock held): it runs one, has none behind it, and will not be
        replaced after it (by job count or memory, as last known)."""
        config = self.config
        return (
            child.running
            and child.queued is None
            and child.counted
            and (config.max_jobs_per_child is None or child.jobs + 2 <= config.max_jobs_per_child)
            and (config.max_memory_per_child is None or child.rss <= config.max_memory_per_child)
        )

    def _pipe(self) -> None:
        """Send the first waiting jobs to busy children with room behind their
        running job: each starts the moment its child answers, without
        waiting for the runner (its thread, the GIL, the scheduler)."""
        while True:
            with self._lock:
                if self._closed or self._giving_back or not self._waiters or self._blocked(self._waiters[0].rank):
                    return
                if not self._waiters[0].pipe:
                    return  # it waits for a free child; those after it wait behind it
                serving = [c for c in self._live if c.counted]
                if len(serving) < self.config.children or not all(c.running for c in serving):
                    return  # a child is idle or starting: the job is its, not one behind another
                child = next((c for c in serving if self._may_pipe(c)), None)
                if child is None:
                    return
                waiter = self._waiters.popleft()
                waiter.state = _Wait.TAKING
            if not self._still_wanted(waiter):
                continue
            with self._lock:
                if self._closed or self._giving_back:
                    waiter.reason = StopReason.SHUTDOWN
                    stopped = True
                else:
                    stopped = False
                    if not self._may_pipe(child):  # it answered meanwhile: back in line
                        waiter.state = _Wait.WAITING
                        self._wait_in_line(waiter)
                        continue
                    child.queued, waiter.child, waiter.state = waiter, child, _Wait.PIPED
            if stopped:
                waiter.settle(_Wait.CLOSED if self._closed else _Wait.STOPPED)
                return
            try:
                child.send(waiter.data)
            except OSError:  # the child is dying: the job never reached it
                with self._lock:
                    if child.queued is waiter:
                        child.queued, waiter.child, waiter.state = None, None, _Wait.WAITING
                        self._wait_in_line(waiter)
                return

    def _retire(self, child: _Child) -> None:
        child.retire()
        self._forget(child)

    def give_back_waiting(self) -> None:
        """The runner stops: every job that has not reached a child (claimed
        ahead, waiting for one) ends as :attr:`Ending.NOT_STARTED` for a
        shutdown -- its claim is given back -- now or as it asks for a child.
        Jobs running in children go on."""
        with self._lock:
            self._giving_back = True
            self._expected.clear()
            waiters, self._waiters = list(self._waiters), collections.deque()
            piped = [(c, c.queued) for c in self._live if c.queued is not None]
        for waiter in waiters:
            waiter.reason = StopReason.SHUTDOWN
            waiter.settle(_Wait.STOPPED)
        for child, queued in piped:  # in a child's pipe: it skips them (then given back)
            queued.reason = StopReason.SHUTDOWN
            try:
                child.send(pickle.dumps((child_module.STOP, queued.job_id, StopReason.SHUTDOWN.value)))
            except OSError:
                pass

    def close(self, wait_s: float = EXIT_WAIT_S) -> None:
        """End every child: idle ones are asked to exit, any still there
        after ``wait_s`` is killed; each is reaped. Jobs still waiting for a
        child end as :attr:`Ending.DIED` (the pool closed)."""
        with self._lock:
            self._closed = True
            self._expected.clear()
            children = list(self._live)
            idle, self._idle = self._idle, []
            waiters, self._waiters = list(self._waiters), collections.deque()
            waiters += [c.queued for c in self._live if c.queued is not None]
        for waiter in waiters:
            waiter.settle(_Wait.CLOSED)
        for child in idle:
            try:
                child.send(pickle.dumps((child_module.EXIT,)))
            except (OSError, ValueError):
                pass
        for child in children:
            if child.join(wait_s):
                child.reap()
            else:
                child.kill()
        with self._lock:
            self._live.clear()
        self._spawner.stop()

    # -- running a job

    def call(
        self,
        ref: HandlerRef,
        job: RunningJob,
        signal: StopSignal,
        *,
        stop_wait_s: float,
        on_start: Callable[[bool], bool] | None = None,
        rank: tuple[int, int] = (0, 0),
        pipe: bool = True,
    ) -> ChildOutcome:
        """Run ``job`` with the handler ``ref`` in a child; return once the
        handler answered, or its child died or was killed -- and reaped.

        With every child busy (a job claimed ahead) it waits for the first
        that frees up; stopped meanwhile, it ends as :attr:`Ending.NOT_STARTED`
        without reaching a child. ``on_start(False)`` is asked once a child is
        ready, just before the job is sent: when it returns False the job is
        not sent (:attr:`Ending.LATE`). ``on_start(True)`` says the job's
        timeout counts from now: once the child began its handler, having
        imported the handler's module (the child reports it for a job with a
        timeout), so neither a new child's start-up, nor the wait for a free
        one, nor that import counts against it -- or :data:`START_TIMEOUT_S`
        after the job was sent, for a child that has not begun by then.
        Waiting jobs take the children that free up in ``rank`` order (the
        claim's: ``(-priority, sequence)``). ``pipe`` False: the job is
        never sent behind a busy child's running job (a job claimed ahead,
        whose start is recorded only as a free child takes it: a child
        would start a piped job with nobody to record it)."""
        log_plan = self._log_plan(ref.module)  # the runner's logging, not the job's: never the job's failure
        try:
            message = (child_module.RUN, job.job_id, ref.module, ref.qualname, _fields(job), log_plan)
            data = pickle.dumps(message, protocol=5)
        except Exception as error:
            text = f"the job's payload cannot be sent to the handler's process ({safe_text(error)})"
            return ChildOutcome(Ending.UNENCODABLE, text=text[:500])
        taken = self._take(data, signal, on_start, rank, pipe)
        if isinstance(taken, ChildOutcome):
            return taken
        try:
            return self._run(taken, job, signal, stop_wait_s, on_start)
        finally:
            self._release(taken)

    def _take(
        self,
        data: bytes,
        signal: StopSignal,
        on_start: Callable[[bool], bool] | None,
        rank: tuple[int, int],
        pipe: bool = True,
    ) -> _Child | ChildOutcome:
        """A child that was sent ``data``: an idle one, or the first that frees
        up or is started (while fewer than ``processes`` serve) -- to the
        waiting jobs in claim order."""
        waiter: _Waiter | None = None
        with self._lock:
            if self._closed:
                return _closed()
            if self._giving_back:
                return ChildOutcome(Ending.NOT_STARTED, stop=StopReason.SHUTDOWN)
            self._expected.discard(rank)
            child: _Child | None = None
            dead: list[_Child] = []
            # A job ranked before this one and not here yet takes the idle child.
            while self._idle and not self._blocked(rank):
                candidate = self._idle.pop()
                if candidate.alive():
                    child = candidate
                    break
                dead.append(candidate)  # its place is this job's (no job waits while a child is idle)
                self._live.discard(candidate)
                candidate.counted = False
                self._used -= 1
            start = child is None and self._used < self.config.children
            if start:
                self._used += 1
            if child is None:
                waiter = _Waiter(data, signal, on_start, rank, pipe)
                self._wait_in_line(waiter)
            # Its arrival may free jobs ranked after it that waited beside an idle child.
            others = bool(self._idle) and any(w is not waiter for w in self._waiters)
        for gone in dead:
            gone.reap()
        if waiter is None:
            assert child is not None
            sent = self._send(child, data, on_start, rank)
            if others:
                self._dispatch()
            return sent
        if start:
            self._start_for(waiter)
        elif others:
            self._dispatch()
        else:
            self._pipe()
        return self._await(waiter, data, on_start, rank)

    def _wait_in_line(self, waiter: _Waiter) -> None:
        """Queue ``waiter`` by its rank (the lock held)."""
        waiters = self._waiters
        if not waiters or waiters[-1].rank <= waiter.rank:
            waiters.append(waiter)
            return
        index = next(i for i, other in enumerate(waiters) if other.rank > waiter.rank)
        waiters.insert(index, waiter)

    def _start_for(self, waiter: _Waiter) -> None:
        """Start a child in a place taken for ``waiter`` and hand it to the
        first waiting job (``waiter`` or one claimed before it); a failure to
        start ends ``waiter`` unless a child was handed to it meanwhile."""
        try:
            child = self._new_child()
        except HandlerProcessDied as error:
            with self._lock:
                failed = waiter.state is _Wait.WAITING  # else it took a child meanwhile, or was stopped
                if failed:
                    self._waiters.remove(waiter)
            self._give_back()  # the next job waiting tries its own start
            if failed:
                waiter.outcome = ChildOutcome(Ending.DIED, error=error, text=str(error))
                waiter.settle(_Wait.DIED)
            return
        self._hand_on(child)

    def _send(
        self, child: _Child, data: bytes, on_start: Callable[[bool], bool] | None, rank: tuple[int, int]
    ) -> _Child | ChildOutcome:
        if on_start is not None and not on_start(False):
            self._renewing(rank)
            self._hand_on(child)
            return ChildOutcome(Ending.LATE)
        child.running = True
        try:
            child.send(data)
        except OSError:
            return self._died(child)
        self._pipe()
        return child

    def _await(
        self, waiter: _Waiter, data: bytes, on_start: Callable[[bool], bool] | None, rank: tuple[int, int]
    ) -> _Child | ChildOutcome:
        """Wait for a child to take ``waiter``'s job, watching its stop signal."""
        told = False
        while not waiter.event.wait(STOP_POLL_S):
            if not waiter.signal.is_set():
                continue
            with self._lock:
                if waiter.state is _Wait.WAITING:
                    self._waiters.remove(waiter)
                    waiter.state = _Wait.STOPPED
                    break
                piped = waiter.child if waiter.state is _Wait.PIPED and not told else None
            if piped is not None:  # in a child's pipe: the child skips it
                told = True
                reason = waiter.signal.reason or StopReason.SHUTDOWN
                try:
                    piped.send(pickle.dumps((child_module.STOP, waiter.job_id, reason.value)))
                except OSError:
                    pass  # the child is dying: the job goes back in line
        state = waiter.state
        if state is _Wait.SENT:
            assert waiter.child is not None
            return waiter.child
        if state is _Wait.START:
            # A place for a child was freed for this job: start one, for the
            # first job waiting (this one, or one claimed before it).
            fresh = _Waiter(data, waiter.signal, on_start, rank, waiter.pipe)
            with self._lock:
                self._wait_in_line(fresh)
            self._start_for(fresh)
            return self._await(fresh, data, on_start, rank)
        if state is _Wait.STOPPED:
            return ChildOutcome(Ending.NOT_STARTED, stop=waiter.reason or waiter.signal.reason)
        if state is _Wait.LATE:
            return ChildOutcome(Ending.LATE)
        if state is _Wait.DIED:
            assert waiter.outcome is not None
            return waiter.outcome
        return _closed()

    def _run(
        self,
        child: _Child,
        job: RunningJob,
        stop: StopSignal,
        stop_wait_s: float,
        on_start: Callable[[bool], bool] | None = None,
    ) -> ChildOutcome:
        """Wait for the answer of ``job``, sent to ``child``: relay its log
        records, serve its requests, start its timeout once its handler
        begins (``on_start(True)``, see :meth:`call`), forward a stop and kill
        the child a grace after it. The stop and the kill are looked at
        before every message read, so a child that never pauses (progress
        reports, log records) cannot put them off."""
        forwarded: StopReason | None = None
        kill_at: float | None = None
        grace = 0.0
        # A job with a timeout: the child says when its handler begins.
        begin_by: float | None = None
        if on_start is not None:
            if job.timeout is None:
                on_start(True)
            else:
                begin_by = time.monotonic() + START_TIMEOUT_S

        def begun() -> None:
            nonlocal begin_by
            if begin_by is not None and on_start is not None:
                begin_by = None
                on_start(True)

        while True:
            now = time.monotonic()
            if begin_by is not None and now >= begin_by:
                begun()  # an import that hangs: the timeout counts from here
            if forwarded is None and stop.is_set():
                forwarded = stop.reason or StopReason.SHUTDOWN
                grace = self.config.kill_grace_s
                if forwarded is StopReason.SHUTDOWN:
                    grace = min(grace, stop_wait_s / 2)
                kill_at = now + grace
                try:
                    child.send(pickle.dumps((child_module.STOP, job.job_id, forwarded.value)))
                except OSError:
                    return self._died(child, forwarded)
            if kill_at is not None and now >= kill_at:
                assert forwarded is not None
                return self._kill(child, job, forwarded, grace, begun)
            # A child that dies closes its end: the pipe reads as end-of-file.
            if not wait([child.conn], STOP_POLL_S if kill_at is None else min(STOP_POLL_S, kill_at - now)):
                continue
            try:
                raw = child.conn.recv_bytes()
            except (EOFError, OSError):
                return self._died(child, forwarded)
            answer = self._answer(child, raw, job, begun)
            if answer is not None:
                return answer

    def _kill(
        self, child: _Child, job: RunningJob, forwarded: StopReason, grace: float, begun: Callable[[], None]
    ) -> ChildOutcome:
        """``child`` did not answer within ``grace`` of its stop: kill it and
        wait until it is gone (``waitpid``) -- after a last look at what it
        sent, where an answer that arrived with the deadline wins. The look
        is short (:data:`STOP_POLL_S`): a child that keeps sending is killed
        all the same."""
        until = time.monotonic() + STOP_POLL_S
        while time.monotonic() < until and child.conn.poll(0):
            try:
                answer = self._answer(child, child.conn.recv_bytes(), job, begun)
            except (EOFError, OSError):
                return self._died(child, forwarded)
            if answer is not None:
                return answer
        cause = child.kill()
        self._unpipe(child)
        self._forget(child)
        text = f"its process (pid {child.pid}) did not stop within {grace:g}s and was {cause}"
        log.warning("job %s: %s (%s)", job.job_id, text, forwarded.value, extra=job.log_fields)
        return ChildOutcome(Ending.KILLED, error=HandlerProcessDied(text), text=text, stop=forwarded, grace_s=grace)

    def _unpipe(self, child: _Child) -> None:
        """``child`` is gone before its running job answered: the job piped
        behind it never started; it waits for the next child again (or is
        given back if the runner stops)."""
        with self._lock:
            queued, child.queued = child.queued, None
            child.running = False
            if queued is None:
                return
            queued.child = None
            if not (self._giving_back or self._closed):
                queued.state = _Wait.WAITING
                self._wait_in_line(queued)
                return
        queued.reason = StopReason.SHUTDOWN
        queued.settle(_Wait.STOPPED if not self._closed else _Wait.CLOSED)

    def _died(self, child: _Child, stop: StopReason | None = None) -> ChildOutcome:
        cause = child.kill() if child.alive() else child.reap()
        self._unpipe(child)
        self._forget(child)
        text = f"the handler's process (pid {child.pid}) died: it {cause}"
        log.error("%s; a new one takes its place", text)
        return ChildOutcome(Ending.DIED, error=HandlerProcessDied(text), text=text, stop=stop)

    def _answer(
        self, child: _Child, raw: bytes, job: RunningJob, begun: Callable[[], None] | None = None
    ) -> ChildOutcome | None:
        """What a message from the child says: the end of ``job``, or None
        for a log record (relayed to the runner's logging), a request of the
        running handler (answered: :meth:`_serve`), the start of ``job``'s
        handler (``begun`` is called) or the skip of the job piped behind it
        (handed to that job's waiting thread)."""
        try:
            message = pickle.loads(raw)
        except Exception as unreadable:
            child.jobs += 1
            text = f"the handler's answer could not be received from its process ({safe_text(unreadable)})"
            return ChildOutcome(Ending.UNENCODABLE, text=text[:500])
        kind = message[0]
        if kind == child_module.LOG:
            _relay(message)
            return None
        if kind == child_module.BEGUN:
            if begun is not None and message[1] == job.job_id:
                begun()
            return None
        if kind in (child_module.PROGRESS, child_module.PARENTS, *child_module.STEP_KINDS):
            self._serve(child, job, message)
            return None
        if kind == child_module.SKIPPED:  # stopped before it started there
            if message[1] == job.job_id:
                return ChildOutcome(Ending.NOT_STARTED, stop=StopReason(message[2]))
            with self._lock:
                queued = child.queued
                if queued is not None and queued.job_id == message[1]:
                    child.queued = None
                else:
                    queued = None
            if queued is not None:
                queued.reason = StopReason(message[2])
                queued.settle(_Wait.STOPPED)
            return None
        child.jobs += 1
        if kind == child_module.RETURNED:
            _, _, value, child.rss = message
            return ChildOutcome(Ending.RETURNED, value=value)
        if kind == child_module.UNENCODABLE:
            _, _, text, child.rss = message
            return ChildOutcome(Ending.UNENCODABLE, text=text)
        _, _, encoded, name, text, detail, child.rss = message
        error: BaseException | None = None
        if encoded is not None:
            try:
                error = pickle.loads(encoded)
            except Exception:
                pass
        if error is None:
            error = stand_in(name, text)
        return ChildOutcome(Ending.RAISED, error=error, text=text, detail=detail)

    @staticmethod
    def _serve(child: _Child, job: RunningJob | None, message: tuple[Any, ...]) -> None:
        """Do what the running handler asked through the job the runner
        made for it -- the progress write (guarded by the exact claim, rate
        limited) or the read of its parents -- and send the reply. A reply
        that cannot be sent means the child is gone: the loop finds that."""
        kind, job_id, number, *args = message
        try:
            if job is None or job_id != job.job_id:
                raise RuntimeError(f"job {job_id!r} is not the job this process runs")
            value: Any
            if kind == child_module.PROGRESS:
                value = job.progress(*args).value
            elif kind == child_module.PARENTS:
                value = tuple(job.parent_results())
            else:
                value = _serve_step(job, kind, args)
            reply: tuple[Any, ...] = (child_module.REPLY, number, True, value)
        except Exception as error:
            refused = (type(error).__name__, getattr(error, "field", None), safe_text(error)[:500])
            reply = (child_module.REPLY, number, False, refused)
        try:
            child.send(pickle.dumps(reply, protocol=5))  # beside a stop another thread may send
        except OSError:
            pass


def _serve_step(job: RunningJob, kind: str, args: list[Any]) -> Any:
    """A child's durable step request, done with the execution's own steps
    (the runner's connection, the job's exact claim)."""
    reporter = job._progress
    steps = None if reporter is None else reporter.steps
    if steps is None:
        raise RuntimeError("this runner records no steps")
    if kind == child_module.STEP:
        return steps.remote_begin(args[0], _undo_of(args[1]) if len(args) > 1 and args[1] is not None else None)
    if kind == child_module.RECORD:
        steps.remote_record(args[0], args[1])
        return None
    if kind == child_module.WAIT:
        return steps.remote_wait(args[0], args[1])
    return steps.remote_sleep(args[0], args[1])


def _undo_of(pickled: bytes) -> Any:
    """A child's step's undo, unpickled here (its module imported in the
    runner's process, where it runs if the job fails for good)."""
    try:
        return pickle.loads(pickled)
    except Exception as error:
        text = f"cannot be loaded in the runner's process, which runs it: {safe_text(error)}"
        raise InvalidJob("undo", text) from error


def _logger_items() -> list[tuple[str, Any]]:
    """A snapshot of every logger the ``logging`` module made, by name.

    Another thread may make a logger (``logging.getLogger``) while the
    registry is copied, which fails the copy with ``RuntimeError: dictionary
    changed size during iteration``; it is copied again then -- a logger
    made meanwhile is in the next copy or only in the next plan. (After a
    hundred failed copies, none: the plan then keeps the named loggers'
    own levels only.)"""
    registry = logging.Logger.manager.loggerDict
    for _ in range(100):
        try:
            return list(registry.items())
        except RuntimeError:
            continue
    return []  # pragma: no cover - a registry changing through a hundred copies in a row


def _fields(job: RunningJob) -> dict[str, Any]:
    """What a child rebuilds ``job`` from."""
    return {
        "job_id": job.job_id,
        "queue": job.queue,
        "lane": job.lane,
        "priority": job.priority,
        "key": job.key,
        "payload": job.payload,
        "recovery_count": job.recovery_count,
        "max_recoveries": job.max_recoveries,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "snoozes": job.snoozes,
        "timeout": job.timeout,
        "trace_context": dict(job.trace_context) if job.trace_context is not None else None,
    }


def _closed() -> ChildOutcome:
    error = HandlerProcessDied("the runner's process pool is closed")
    return ChildOutcome(Ending.DIED, error=error, text=str(error))


def decision_of_outcome(execution: Execution, outcome: ChildOutcome) -> Decision | None:
    """What a job run in a child decided, by the same rules as a handler run
    in a thread (:mod:`~sqlalchemy_watchdog.core.rules.settle`); None hands
    it to recovery (its runner shuts down).

    * returned: :func:`decision_of_result`; raised: :func:`decision_of_exception`,
      keeping the traceback the child formatted;
    * killed after its timeout: ``failed`` ("killed after timeout"), retried
      under the job's policy like any failed attempt;
    * killed after another stop: ``failed`` with the stop's reason (the
      database turns a cancelled job's settle into ``cancelled``);
    * died by itself: ``failed`` with the cause (exit code or signal);
    * a result (or payload) that cannot cross the pipe: ``failed`` saying so;
    * stopped while it waited for a child (claimed ahead): ``failed``
      "execution stopped before it started"; at shutdown ``NEVER_STARTED``
      (its claim is given back: queued again, nothing counted);
    * not sent because its claim was last checked too long ago:
      ``STARTED_LATE`` (the runner renews it and asks again).

    A shutdown stop that ends in a kill or a death is handed to recovery,
    as a handler that gives up at the shutdown stop is under threads.
    """
    job = execution.job
    ending = outcome.ending
    if ending is Ending.NOT_STARTED:
        # Stopped while claimed ahead, before any child took it: at shutdown
        # its claim is given back untouched; else as a thread handler stopped
        # before it started (see ``core.loop.execute``).
        if outcome.stop is StopReason.SHUTDOWN:
            return NEVER_STARTED
        reason = outcome.stop.value if outcome.stop is not None else "stop requested"
        return Decision.failed(f"execution stopped before it started ({reason})")
    if ending is Ending.LATE:
        return STARTED_LATE
    if ending is Ending.RETURNED:
        return decision_of_result(outcome.value, job)
    if ending is Ending.RAISED:
        assert outcome.error is not None
        decision = decision_of_exception(execution, outcome.error)
        if decision is not None and outcome.detail is not None:
            execution.failure_detail = outcome.detail
        return decision
    if ending is Ending.UNENCODABLE:
        return Decision.failed(bound_reason(outcome.text))
    stop = execution.signal.reason if outcome.stop is None else outcome.stop
    if stop is StopReason.SHUTDOWN:
        log.warning("job %s: %s at shutdown; handing it to recovery", job.job_id, outcome.text, extra=job.log_fields)
        return None
    execution.error = outcome.error
    execution.failure_detail = outcome.text
    if ending is Ending.KILLED and stop is StopReason.TIMEOUT:
        grace = f"{outcome.grace_s:g}s"
        return Decision.failed(bound_reason(f"killed after timeout ({timed_out(job)}, then {grace} to stop)"))
    if ending is Ending.KILLED and stop is not None:
        return Decision.failed(bound_reason(f"execution stopped ({stop.value}); killed after {outcome.grace_s:g}s"))
    if stop is StopReason.TIMEOUT:
        return Decision.failed(bound_reason(f"{timed_out(job)} ({outcome.text})"))
    return Decision.failed(bound_reason(outcome.text))
