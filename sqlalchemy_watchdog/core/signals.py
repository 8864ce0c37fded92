"""Stop signals: the host's unless the runner owns the process."""

from __future__ import annotations

import functools
import signal
import threading
from typing import Any

#: The signals a runner that owns its process stops on.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _unclaimed(sig: signal.Signals, current: object) -> bool:
    """Whether nobody but the interpreter handles ``sig``: its default
    action, Python's own SIGINT handler, or the SIGINT handler
    ``asyncio.run`` puts in place of that default for its main task."""
    if current is signal.SIG_DFL:
        return True
    if sig is signal.SIGINT:
        if current is signal.default_int_handler:
            return True
        func = getattr(current, "func", None) if isinstance(current, functools.partial) else None
        owner = getattr(func, "__self__", None)
        return getattr(func, "__name__", "") == "_on_sigint" and type(owner).__module__.startswith("asyncio")
    return False


def signals_to_install(install: bool | None) -> tuple[signal.Signals, ...]:
    """Which stop signals ``run_forever(install_signal_handlers=install)``
    takes over, with their handlers now: none outside the main thread or
    with ``False``; both with ``True``; by default (None) each one nobody
    has claimed -- the runner owns a script's process, never a server's
    (uvicorn, gunicorn and the like install their own handlers first)."""
    if install is False or threading.current_thread() is not threading.main_thread():
        return ()
    if install is True:
        return STOP_SIGNALS
    return tuple(sig for sig in STOP_SIGNALS if _unclaimed(sig, signal.getsignal(sig)))


class SignalSafeEvent(threading.Event):
    """A ``threading.Event`` that a signal handler may set.

    Python runs a signal handler in the main thread, between two of its
    bytecodes -- possibly while that thread is inside this event's ``wait``
    or ``clear`` and holds its lock. A plain event's lock is not reentrant:
    the handler's ``set()`` would wait forever for a lock its own thread
    holds, and a runner told to stop would never stop. This one's lock is
    reentrant, so ``set()`` goes through: a ``wait()`` it interrupted
    before blocking returns at once, one past its block sees the flag on
    its next look."""

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.RLock())


def restore_signal(sig: signal.Signals, previous: Any) -> None:
    """Put back the handler a runner replaced (one installed outside Python,
    which cannot be put back, becomes the default action)."""
    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
