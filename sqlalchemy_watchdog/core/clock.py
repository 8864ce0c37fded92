"""The runner's one clock: what its rules read the time from.

Every rule of the core reads the time from the :class:`Clock` its
:class:`~sqlalchemy_watchdog.core.state.RunnerCore` was given -- never
``time.monotonic()`` or ``datetime.now()`` of its own -- so a test (or the
unit layer, ``tests/unit``) can drive the rules on a clock it moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime

from ..errors import InvalidJob
from ..jobs import at_epoch_ms


def now_ms() -> int:
    """The application clock in milliseconds since the epoch (a runner's
    default ``clock``)."""
    return time.time_ns() // 1_000_000


def check_clock(clock: object) -> Callable[[], int]:
    """Refuse a runner ``clock`` that cannot be called."""
    if not callable(clock):
        raise InvalidJob("clock", f"must be a callable returning epoch milliseconds, not {type(clock).__name__}")
    return clock


class Clock:
    """A runner's two clocks, injected as one object.

    * :meth:`now_ms` -- the application clock (the runner's ``clock=``
      option), epoch milliseconds: what a claim holder's own checks send
      (settle, renew; the database takes the later of it and its own
      clock), the failure history's ``at``, and the schedules' slots.
    * :meth:`monotonic` -- seconds on a clock that never goes back: every
      duration of the runner (timeouts, when recovery, promotion, pruning
      and the schedules are due next, a late start, the summary's period).
    """

    __slots__ = ("_monotonic", "_now_ms")

    def __init__(self, now_ms: Callable[[], int] = now_ms, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._now_ms = check_clock(now_ms)
        self._monotonic = monotonic

    @classmethod
    def of(cls, options: Mapping[str, object]) -> Clock:
        """The clock of a runner built with ``options`` (its ``clock`` for the
        application clock, the process's monotonic clock)."""
        return cls(options.get("clock", now_ms))  # type: ignore[arg-type]

    def now_ms(self) -> int:
        """The application clock, epoch milliseconds."""
        return self._now_ms()

    def now(self) -> datetime:
        """The application clock as an aware UTC datetime."""
        return at_epoch_ms(self._now_ms())

    def monotonic(self) -> float:
        """Seconds on the monotonic clock."""
        return self._monotonic()
