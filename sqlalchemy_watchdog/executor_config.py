"""What a runner's ``executor`` option says: where handlers run.

The values only -- :data:`ExecutorName`, :class:`ProcessExecutor`, a handler
located by module path (:class:`HandlerRef`) and the errors a child's death
raises -- checked without running anything, so the runner's core can check
its options without importing the process pool
(:mod:`sqlalchemy_watchdog.executors.pool`, which imports the core). Every
name is re-exported from :mod:`sqlalchemy_watchdog.executors`, where
applications import them (and :class:`ProcessExecutor` from
:mod:`sqlalchemy_watchdog`).
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from .errors import InvalidJob

__all__ = ["ExecutorName", "HandlerProcessDied", "HandlerRef", "ProcessExecutor", "check_executor", "locate"]

#: The executors a runner takes by name: ``"thread"`` (the default) or
#: ``"process"`` (a :class:`ProcessExecutor` with its defaults).
ExecutorName = Literal["thread", "process"]

#: The most child processes one runner may have.
MAX_PROCESSES = 1024
#: The most jobs one runner may claim ahead of its children.
MAX_PREFETCH = 10_000
#: The smallest memory ceiling accepted (a Python interpreter alone is larger).
MIN_MEMORY = 16 * 1024 * 1024
#: The largest memory ceiling accepted (1 TiB).
MAX_MEMORY = 1024**4
#: The longest kill grace accepted.
MAX_KILL_GRACE = timedelta(hours=1)
#: The kill grace unless told otherwise.
DEFAULT_KILL_GRACE = timedelta(seconds=5)
#: The most loggers ``forward_loggers`` may name, and the longest name.
MAX_FORWARD_LOGGERS = 100
MAX_LOGGER_NAME = 200


def default_processes() -> int:
    """One child per CPU this process may use (at least 1)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        count = os.cpu_count() or 1
    return max(1, min(count, MAX_PROCESSES))


def _positive_int(name: str, value: object, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidJob(name, f"must be an int from 1 to {high}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ProcessExecutor:
    """Run plain handlers in child processes (``Runner(engine, executor=...)``).

    :param processes: how many children run handlers at once; the runner's
        ``concurrency`` is this number. Default: one per CPU.
    :param max_jobs_per_child: replace a child after it ran this many jobs
        (between jobs, never during one); None: never.
    :param max_memory_per_child: replace a child whose resident memory
        (RSS, in bytes) is over this after a job (between jobs, never during
        one; read from ``/proc`` on Linux, the peak elsewhere); None: never.
    :param kill_grace: how long a child told to stop (its attempt's timeout,
        a cancellation, a lane failure, a lost lease) may take before it is
        killed (SIGKILL); at shutdown, the shorter of this and half the stop
        wait. Default 5 s.
    :param prefetch: how many jobs the runner claims ahead of its busy
        children, so that a child that finishes a job gets the next one at
        once instead of after a claim's round trip; a job claimed ahead
        waits in the runner (leased, its timeout not yet running) for the
        first child that frees up. The runner claims again once no job
        waits for a child or ``prefetch`` slots are free, for all of them
        in one statement. It claims ahead only while the recent
        handlers run at least four round trips of its claims and start
        records (a job claimed ahead waits one for the record of its start
        as a child takes it); shorter handlers are claimed for idle children
        only. Default: one per process; 0 claims only
        for idle children (long handlers: a job claimed ahead waits until a
        child frees up, which another runner could have used).
    :param forward_loggers: the loggers (each with its descendants) whose
        records a child sends to the runner from the runner's levels, beside
        the ones it always sends that way: ``sqlalchemy_watchdog``'s, those
        of the handler's top-level package and the root logger's. Records of
        other loggers (third-party libraries: ``httpx``, ``botocore``, ...)
        are sent from WARNING up only. ``("httpx",)`` sends httpx's INFO
        lines too (when the runner logs INFO); ``("",)`` every logger's.
        Default: none.
    """

    processes: int | None = None
    max_jobs_per_child: int | None = None
    max_memory_per_child: int | None = None
    kill_grace: timedelta = DEFAULT_KILL_GRACE
    prefetch: int | None = None
    forward_loggers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.processes is None:
            object.__setattr__(self, "processes", default_processes())
        else:
            _positive_int("processes", self.processes, MAX_PROCESSES)
        if self.max_jobs_per_child is not None:
            _positive_int("max_jobs_per_child", self.max_jobs_per_child, 1_000_000_000)
        memory = self.max_memory_per_child
        if memory is not None and (
            isinstance(memory, bool) or not isinstance(memory, int) or not MIN_MEMORY <= memory <= MAX_MEMORY
        ):
            raise InvalidJob(
                "max_memory_per_child",
                f"must be None or a number of bytes from {MIN_MEMORY} (16 MiB) to {MAX_MEMORY} (1 TiB), got {memory!r}",
            )
        prefetch = self.prefetch
        if prefetch is None:
            object.__setattr__(self, "prefetch", self.processes)
        elif isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 0 <= prefetch <= MAX_PREFETCH:
            raise InvalidJob("prefetch", f"must be an int from 0 to {MAX_PREFETCH}, got {prefetch!r}")
        grace = self.kill_grace
        if not isinstance(grace, timedelta):
            raise InvalidJob("kill_grace", f"must be a datetime.timedelta, not {type(grace).__name__}")
        if not timedelta(0) <= grace <= MAX_KILL_GRACE:
            raise InvalidJob("kill_grace", f"must be from 0 to {MAX_KILL_GRACE}, got {grace}")
        object.__setattr__(self, "forward_loggers", _logger_names(self.forward_loggers))

    @property
    def children(self) -> int:
        """How many children run handlers at once (``processes``, its default resolved)."""
        assert self.processes is not None
        return self.processes

    @property
    def claim_ahead(self) -> int:
        """How many jobs are claimed ahead of the busy children (``prefetch``, its default resolved)."""
        assert self.prefetch is not None
        return self.prefetch

    @property
    def kill_grace_s(self) -> float:
        return self.kill_grace.total_seconds()


def _logger_names(value: object) -> tuple[str, ...]:
    """``forward_loggers`` as a tuple of logger names, or a clear InvalidJob."""
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise InvalidJob("forward_loggers", f"must be a tuple of logger names, not {type(value).__name__}")
    if len(value) > MAX_FORWARD_LOGGERS:
        raise InvalidJob("forward_loggers", f"must name at most {MAX_FORWARD_LOGGERS} loggers, got {len(value)}")
    for name in value:
        if not isinstance(name, str):
            raise InvalidJob("forward_loggers", f"must hold logger names (str), not {type(name).__name__}")
        if len(name) > MAX_LOGGER_NAME or not name.isprintable() or name != name.strip(" ."):
            raise InvalidJob(
                "forward_loggers",
                f"a logger name must be printable, at most {MAX_LOGGER_NAME} characters, with no leading or "
                f"trailing space or dot, got {name[:MAX_LOGGER_NAME]!r}",
            )
    return tuple(value)


def check_executor(value: object) -> ProcessExecutor | None:
    """The ``executor`` option: None for the thread executor, else the
    :class:`ProcessExecutor` to use."""
    if value is None or value == "thread":
        return None
    if value == "process":
        return ProcessExecutor()
    if isinstance(value, ProcessExecutor):
        return value
    raise InvalidJob("executor", f'must be "thread", "process" or a ProcessExecutor, got {value!r}')


@dataclass(frozen=True, slots=True)
class HandlerRef:
    """Where a child finds a handler: its module and qualified name."""

    module: str
    qualname: str

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


class HandlerProcessDied(Exception):
    """The process running a handler died (a crash, ``os._exit``, a signal,
    or the kill after a stop's grace): the error of the job's failed
    attempt, which a :class:`~sqlalchemy_watchdog.RetryPolicy`'s
    ``retry_on`` may name."""


class HandlerError(Exception):
    """What a handler raised in its process, when that exception could not
    be sent to the runner as itself (its class cannot be pickled or
    rebuilt): the exception the runner sees is a subclass named like the
    original, with the original's message; the job keeps the original's
    traceback."""


_FIX = "define it with def at the top level of an importable module (not the script being run) and import it from there"


def locate(queue: str, fn: Callable[..., Any]) -> HandlerRef:
    """Where a child process finds ``fn``, the handler of ``queue``; an
    :class:`~sqlalchemy_watchdog.InvalidJob` naming ``handlers`` when a
    child could not import it (a lambda, a nested function, a handler
    defined in ``__main__``, a callable object, or a name that does not
    lead back to ``fn``)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if inspect.ismethod(fn) or not isinstance(module, str) or not isinstance(qualname, str):
        raise InvalidJob(
            "handlers",
            f"the handler of {queue!r} ({fn!r}) has no module path: the process executor runs a handler by "
            f"its module and name, so it must be a plain function; {_FIX}",
        )
    if module in ("__main__", "__mp_main__"):
        raise InvalidJob(
            "handlers",
            f"the handler of {queue!r} ({qualname}) is defined in __main__, which a child process cannot import "
            f"by that name; move it into a module of its own and import it from the script ({_FIX})",
        )
    if "<lambda>" in qualname:
        raise InvalidJob("handlers", f"the handler of {queue!r} is a lambda ({module}.{qualname}); {_FIX}")
    if "<locals>" in qualname:
        raise InvalidJob(
            "handlers",
            f"the handler of {queue!r} is a nested function ({module}.{qualname}), which a child process "
            f"cannot import; {_FIX}",
        )
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception as error:
        raise InvalidJob(
            "handlers",
            f"the handler of {queue!r} cannot be imported as {module}:{qualname} ({type(error).__name__}: {error}); "
            f"{_FIX}",
        ) from None
    if found is not fn:
        raise InvalidJob(
            "handlers",
            f"the handler of {queue!r}: {module}:{qualname} names another object than the handler given (a "
            f"decorator that returns a new function without functools.wraps?); {_FIX}",
        )
    return HandlerRef(module, qualname)


def locate_all(
    handlers: Mapping[str, Callable[..., Any]], queues: tuple[str, ...], *, stays: Callable[[Any], bool] | None = None
) -> dict[str, HandlerRef]:
    """The module paths of the handlers of ``queues``, but those ``stays``
    keeps in the runner's process (an async runner's coroutine handlers)."""
    return {q: locate(q, handlers[q]) for q in queues if stays is None or not stays(handlers[q])}
