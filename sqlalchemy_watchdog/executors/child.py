"""The child side of the process executor: run handlers, report back.

A child is started by the parent's pool (a fresh interpreter, never a fork
of the parent) with one end of a socket pair. It never opens the runner's engine and does no database work: it
receives ``run`` messages naming a handler by module path with the job's
fields, calls the handler with a :class:`~sqlalchemy_watchdog.RunningJob`
whose ``stop_requested`` the parent sets with a ``stop`` message, and sends
back what the handler returned or raised. The handler's ``progress()`` and
``parent_results()`` are requests to the parent, which writes or reads
through the runner's connection and replies.

It never outlives the parent: on Linux the kernel kills it when the
parent dies (``PR_SET_PDEATHSIG``), and everywhere it exits as soon as its
pipe to the parent reaches end-of-file. SIGINT and SIGTERM are the
parent's to act on (a terminal's Ctrl-C reaches the whole process group):
the child ignores them and the parent stops, then kills it.
"""

from __future__ import annotations

import contextvars
import ctypes
import ctypes.util
import importlib
import logging
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC
from multiprocessing.connection import Connection
from typing import Any

#: ``prctl(PR_SET_PDEATHSIG, sig)``: the signal a child gets when its parent dies.
PR_SET_PDEATHSIG = 1

#: Messages (pickled tuples). Parent to child: ``("run", job_id, module,
#: qualname, fields, logs)`` (``logs``: see :meth:`_Child.follow`), ``("stop",
#: job_id, reason)``, ``("exit",)``, ``("reply", request, ok, value)``. Child to
#: parent: ``("ready", pid)``, ``("log", record_fields)``, ``("begun", job_id)``
#: (the handler of a job with a timeout begins, its module imported: the
#: timeout counts from now), ``("returned", job_id, value, rss)``, ``("skipped", ...)``,
#: ``("unencodable", job_id, text, rss)``, ``("raised", job_id, error_bytes,
#: type_name, text, detail, rss)``, and the running handler's requests, which
#: the parent answers with a ``reply`` of the same ``request`` number:
#: ``("progress", job_id, request, fraction, note)`` (the parent does the
#: guarded write; the value a ``ProgressStatus`` value) and ``("parents",
#: job_id, request)`` (the parent reads; the value a tuple of ``ParentResult``).
#: A refused request's value is ``(type_name, field, text)``.
RUN, STOP, EXIT, REPLY = "run", "stop", "exit", "reply"
READY, RETURNED, UNENCODABLE, RAISED, LOG = "ready", "returned", "unencodable", "raised", "log"
BEGUN = "begun"
PROGRESS, PARENTS = "progress", "parents"
#: The running handler's durable steps (revision w0021), answered by the runner:
#: ``("step", job_id, request, name)`` (the value ``(recorded, result)``),
#: ``("record", job_id, request, name, value)`` and ``("sleep", job_id,
#: request, name, delay_ms)`` (the value: the sleep's end in epoch ms, or None).
STEP, RECORD, SLEEP, WAIT = "step", "record", "sleep", "wait"
STEP_KINDS = (STEP, RECORD, SLEEP, WAIT)
#: Child to parent: ``("skipped", job_id, reason)`` -- a job stopped before it started
#: here (sent behind a running one, or stopped as it arrived): its handler never ran.
SKIPPED = "skipped"


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a no-op
    elsewhere; the pipe's end-of-file covers every platform)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - no libc prctl: the pipe's EOF remains
        pass


def resident_bytes() -> int:
    """This process's resident set size now, in bytes (Linux: /proc; elsewhere
    the peak that ``resource`` reports)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) * (1 if sys.platform == "darwin" else 1024)


def resolve(module: str, qualname: str) -> Callable[..., Any]:
    """The object ``module.qualname`` names (imported if needed)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found  # type: ignore[no-any-return]


#: What a ``run`` message tells a child of the runner's logging: ``(levels,
#: followed)``, see :meth:`_Child.follow`.
LogPlan = tuple[tuple[tuple[str, int], ...], tuple[str, ...]]
#: The loggers whose records a child always sends from the runner's levels
#: (besides the handler's top-level package and ``forward_loggers``).
OWN_LOGGERS = ("sqlalchemy_watchdog",)
#: The level from which a child sends the records of every other logger.
OTHERS_FROM = logging.WARNING


class Followed(logging.Filter):
    """Passes the records of the loggers it follows (a name and its
    descendants; "" every logger, "root" the root logger's own records) at
    any level, and every other record from :data:`OTHERS_FROM` up."""

    def __init__(self, names: frozenset[str]) -> None:
        super().__init__()
        self.names = names
        self._decided: dict[str, bool] = {}

    def follow(self, names: frozenset[str]) -> None:
        if names != self.names:
            self.names, self._decided = names, {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= OTHERS_FROM:
            return True
        name = record.name
        passed = self._decided.get(name)
        if passed is None:
            names, parts = self.names, name.split(".")
            passed = "" in names or any(".".join(parts[:i]) in names for i in range(1, len(parts) + 1))
            self._decided[name] = passed
        return passed


class PipeLogHandler(logging.Handler):
    """Sends the child's log records to the parent, which hands each to its
    own logger of the same name (its levels, handlers, formatters and
    filters): a handler's ``job.log`` lines appear in the runner's log, with
    their fields and the child's pid (``%(process)d``).

    Sent are the records of the loggers it follows (:attr:`followed`, set by
    :meth:`_Child.follow`) -- ``sqlalchemy_watchdog``'s, the handler's
    top-level package's, the root logger's own and those of
    ``ProcessExecutor.forward_loggers`` -- and those of any other logger (a
    third-party library's) from :data:`OTHERS_FROM` up."""

    def __init__(self, child: _Child) -> None:
        super().__init__()
        self.child = child
        self.followed = Followed(frozenset((*OWN_LOGGERS, "root")))
        self.addFilter(self.followed)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = dict(record.__dict__)
            fields["msg"], fields["args"] = record.getMessage(), None
            if record.exc_info:
                fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
            fields["exc_info"] = None
            try:
                self.child.send((LOG, fields))
            except Exception:  # an extra field that cannot be pickled: the standard fields only
                plain = logging.makeLogRecord({}).__dict__
                self.child.send((LOG, {k: v for k, v in fields.items() if k in plain}))
        except Exception:
            self.handleError(record)


def _ignore(signum: int, frame: object) -> None:
    """A stop signal sent to the process group: the parent decides."""


class _Child:
    """The state of one child: the job it runs and that job's stop signal."""

    def __init__(self, conn: Connection) -> None:
        from ..core.handlers import StopSignal

        self.conn = conn
        self.inbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.current: tuple[str, StopSignal] | None = None
        #: The jobs received and not started yet, and those of them skipped
        #: (a stop came before they started: answered ``skipped`` at once).
        self.pending: set[str] = set()
        self.skipped: set[str] = set()
        self.send_lock = threading.Lock()
        self.handlers: dict[tuple[str, str], Callable[..., Any]] = {}
        # The handler's requests to the parent, one at a time, and their replies.
        self.replies: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.request_lock = threading.Lock()
        self.requests = 0
        self.pipe_log: PipeLogHandler | None = None
        self.logs: LogPlan | None = None

    def read(self) -> None:
        """The reader thread: hand ``run`` messages to the main thread, set
        the running job's stop signal at once; exit when the parent is gone."""
        from ..core.handlers import StopReason

        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the parent is gone (or closed the pipe): never outlive it
            kind = message[0]
            if kind == RUN:
                with self.lock:
                    self.pending.add(message[1])
                self.inbox.put(message)
            elif kind == STOP:
                job_id = message[1]
                with self.lock:
                    current = self.current
                    skip = (current is None or current[0] != job_id) and job_id in self.pending
                    if skip:  # still in the inbox (behind the running job): never run it
                        self.pending.discard(job_id)
                        self.skipped.add(job_id)
                if skip:
                    self.send((SKIPPED, job_id, message[2]))
                elif current is not None and current[0] == job_id:
                    current[1].request(StopReason(message[2]))
            elif kind == REPLY:
                self.replies.put(message)
            elif kind == EXIT:
                self.inbox.put(None)
                return

    def send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self.send_lock:
            self.conn.send_bytes(data)

    def ask(self, kind: str, job_id: str, *args: Any) -> Any:
        """Send the running handler's request to the parent and wait for its
        reply (the reader thread hands it over; a parent that is gone ends
        this process). A refused request raises here, as it would in the
        parent: ``InvalidJob`` naming its field, else ``RuntimeError``."""
        from ..errors import InvalidJob

        with self.request_lock:
            self.requests += 1
            number = self.requests
            self.send((kind, job_id, number, *args))
            while True:
                reply = self.replies.get()
                if reply[1] == number:
                    break
        _, _, ok, value = reply
        if ok:
            return value
        name, field, text = value
        if name == "InvalidJob" and field:
            raise InvalidJob(field, text.split(": ", 1)[-1])
        raise RuntimeError(f"{kind} request refused by the runner: {name}: {text}")

    def serve(self) -> None:
        while True:
            message = self.inbox.get()
            if message is None:
                return
            _, job_id, module, qualname, fields, logs = message
            if logs != self.logs:
                self.follow(logs)
            self.run(job_id, module, qualname, fields)

    def follow(self, logs: LogPlan) -> None:
        """Take the runner's logging plan for the next job: ``(levels,
        followed)`` -- the runner's levels of the root logger (``""``), of
        ``sqlalchemy_watchdog``, of the handler's top-level package and of
        its ``forward_loggers`` (given to the same loggers here, so that
        their records are made from the same levels), and the names of the
        loggers whose records are sent at any level (others: from WARNING)."""
        levels, followed = logs
        for name, level in levels:
            logging.getLogger(name or None).setLevel(level)
        if self.pipe_log is not None:
            self.pipe_log.followed.follow(frozenset(followed))
        self.logs = logs

    def run(self, job_id: str, module: str, qualname: str, fields: dict[str, Any]) -> None:
        from ..core.handlers import RunningJob, StopSignal
        from ..errors import redacted_detail, safe_text

        stop = StopSignal()
        with self.lock:
            if job_id in self.skipped:  # answered ``skipped`` when its stop came
                self.skipped.discard(job_id)
                return
            self.pending.discard(job_id)
            self.current = (job_id, stop)
        try:
            key = (module, qualname)
            fn = self.handlers.get(key)
            if fn is None:
                fn = self.handlers[key] = resolve(module, qualname)
            if fields["timeout"] is not None:
                # Its module imported: the job's timeout counts from now.
                self.send((BEGUN, job_id))
            # A fresh context per job: what a handler sets in a context
            # variable is never seen by the next job this child runs.
            result = contextvars.copy_context().run(fn, _child_job(RunningJob)(_signal=stop, **fields))
        except Exception as error:
            encoded: bytes | None = None
            try:
                data = pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
                pickle.loads(data)  # an exception whose __init__ cannot take its args back fails here
                encoded = data
            except Exception:
                pass
            name = type(error).__name__
            self.send((RAISED, job_id, encoded, name, safe_text(error), redacted_detail(error), resident_bytes()))
            return
        finally:
            with self.lock:
                self.current = None
        try:
            self.send((RETURNED, job_id, result, resident_bytes()))
        except Exception as error:
            what = type(result).__name__
            text = f"handler returned {what}, which cannot be sent from its process to the runner ({safe_text(error)})"
            self.send((UNENCODABLE, job_id, text[:500], resident_bytes()))


def main(fd: int, parent_pid: int, level: int = logging.WARNING) -> None:
    """The child's entry point: serve the parent on the socket ``fd``; log
    records from ``level`` up go to the parent (its root logger's level)."""
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the death signal was asked for
        os._exit(0)
    conn = Connection(fd)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _ignore)
    global _child
    child = _child = _Child(conn)
    root = logging.getLogger()
    child.pipe_log = PipeLogHandler(child)
    root.handlers[:] = [child.pipe_log]
    root.setLevel(level)
    reader = threading.Thread(target=child.read, name="watchdog-child-reader", daemon=True)
    reader.start()
    child.send((READY, os.getpid()))
    child.serve()


#: This process's connection to the runner (set by :func:`main`).
_child: _Child | None = None
_child_classes: dict[type[Any], type[Any]] = {}


def _ask(kind: str, job_id: str, *args: Any) -> Any:
    if _child is None:  # pragma: no cover - a child job exists only under main()
        raise RuntimeError(f"{kind}() asks the runner, and this process has none")
    return _child.ask(kind, job_id, *args)


def _child_job(base: type[Any]) -> type[Any]:
    """``RunningJob`` as a child sees it: the fields, the stop signal and the
    logger work as in the runner; what needs the runner's connection
    (progress, the parents' results) is asked of the runner over the socket,
    and the runner writes (under the job's exact claim, rate limited as
    always) or reads for it."""
    made = _child_classes.get(base)
    if made is None:
        from ..core.progress import ProgressStatus, check_progress

        def progress(self: Any, fraction: float, note: str | None = None) -> ProgressStatus:
            check_progress(fraction, note)  # bad input is refused here, before anything is sent
            return ProgressStatus(_ask(PROGRESS, self.job_id, fraction, note))

        async def progress_async(self: Any, fraction: float, note: str | None = None) -> ProgressStatus:
            import asyncio

            return await asyncio.to_thread(progress, self, fraction, note)

        def parent_results(self: Any) -> tuple[Any, ...]:
            return tuple(_ask(PARENTS, self.job_id))

        async def parent_results_async(self: Any) -> tuple[Any, ...]:
            import asyncio

            return await asyncio.to_thread(parent_results, self)

        from ..core.durable import DurableSteps, SleepRequested
        from ..jobs import check_step_name

        def _undo_sent(name: str, kwargs: dict[str, Any]) -> bytes | None:
            """The step's undo, pickled for the runner, which runs it if the
            job fails for good: by reference, so a module-level function."""
            undo = kwargs.pop("undo", None)
            if undo is None:
                return None
            import inspect

            from ..core.durable import check_undo
            from ..errors import InvalidJob, safe_text

            check_undo(name, undo)
            if inspect.iscoroutinefunction(undo):
                raise InvalidJob("undo", "of a step in a process child is a plain function (the runner calls it)")
            try:
                return pickle.dumps(undo, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as error:
                raise InvalidJob(
                    "undo",
                    "of a step in a process child runs in the runner's process, so it must be picklable "
                    f"(a module-level function): {safe_text(error)}",
                ) from error

        def step(self: Any, name: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            check_step_name(name)  # bad input is refused here, before anything is sent
            undo = _undo_sent(name, kwargs)
            recorded, value = _ask(STEP, self.job_id, name, undo)
            if recorded:
                return value
            value = fn(*args, **kwargs)
            _ask(RECORD, self.job_id, name, value)
            return value

        async def step_async(self: Any, name: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            import asyncio
            import inspect

            undo = _undo_sent(check_step_name(name), kwargs)
            recorded, value = await asyncio.to_thread(_ask, STEP, self.job_id, name, undo)
            if recorded:
                return value
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            await asyncio.to_thread(_ask, RECORD, self.job_id, name, value)
            return value

        def sleep(self: Any, delay: Any, *, name: str | None = None) -> None:
            wake_at = _ask(SLEEP, self.job_id, name, DurableSteps._delay_ms(delay))
            if wake_at is not None:
                raise SleepRequested(name or "sleep", wake_at)

        def sleep_until(self: Any, when: Any, *, name: str | None = None) -> None:
            wake_at = _ask(SLEEP, self.job_id, name, DurableSteps._delay_ms(until=when))
            if wake_at is not None:
                raise SleepRequested(name or "sleep", wake_at)

        async def sleep_async(self: Any, delay: Any, *, name: str | None = None) -> None:
            import asyncio

            await asyncio.to_thread(sleep, self, delay, name=name)

        from datetime import datetime

        from ..core.durable import WaitRequested, WaitTimedOut, check_wait

        def wait_for(self: Any, name: str, *, timeout: Any) -> Any:
            timeout_ms = check_wait(timeout)  # bad input is refused here, before anything is sent
            check_step_name(name)
            how, value = _ask(WAIT, self.job_id, name, timeout_ms)
            if how == "signal":
                return value
            if how == "wait":
                raise WaitRequested(name, value)
            raise WaitTimedOut(name, datetime.fromtimestamp(value / 1000, UTC))

        async def wait_for_async(self: Any, name: str, *, timeout: Any) -> Any:
            import asyncio

            return await asyncio.to_thread(wait_for, self, name, timeout=timeout)

        def transaction_step(self: Any, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                "transaction_step() records the step in the runner's database transaction: use it in a thread "
                "or coroutine handler, not in a process child (job.step() works here)"
            )

        made = type(
            "RunningJob",
            (base,),
            {
                "progress": progress,
                "progress_async": progress_async,
                "parent_results": parent_results,
                "parent_results_async": parent_results_async,
                "step": step,
                "step_async": step_async,
                "sleep": sleep,
                "sleep_until": sleep_until,
                "sleep_async": sleep_async,
                "wait_for": wait_for,
                "wait_for_async": wait_for_async,
                "transaction_step": transaction_step,
                "transaction_step_async": transaction_step,
            },
        )
        _child_classes[base] = made
    return made
