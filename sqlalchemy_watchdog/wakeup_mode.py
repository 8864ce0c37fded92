"""How a runner learns of new work: the value of its ``wakeups`` option.

A value only, below the runner's core (which checks its options) and the
wake-ups themselves (:mod:`sqlalchemy_watchdog.wakeups`, which re-exports
both names; applications import :class:`WakeupMode` from
:mod:`sqlalchemy_watchdog`).
"""

from __future__ import annotations

import enum

from .errors import InvalidJob

__all__ = ["WakeupMode", "check_wakeups"]


class WakeupMode(str, enum.Enum):
    """How a runner learns of new work (its ``wakeups`` argument).

    ``AUTO`` (the default) listens where the connection is proven to be one
    PostgreSQL session, else polls at the fast interval and logs one WARNING
    saying why and what to set. ``LISTEN`` refuses to start without that
    proof. ``POLL`` never LISTENs and never takes the waiting lock.
    """

    AUTO = "auto"
    LISTEN = "listen"
    POLL = "poll"


def check_wakeups(value: object) -> WakeupMode:
    """``value`` as a :class:`WakeupMode`, or a clear error naming ``wakeups``."""
    try:
        return WakeupMode(value)
    except ValueError:
        known = ", ".join(repr(mode.value) for mode in WakeupMode)
        raise InvalidJob("wakeups", f"{value!r} is not a wake-up mode (known: {known})") from None
