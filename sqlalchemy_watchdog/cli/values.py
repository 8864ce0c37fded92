"""The values of the command's options: argparse types with their bounds
(each raises :class:`argparse.ArgumentTypeError`, which argparse reports
naming the option), durations, ``--where`` and the dashboard's ``--host``."""

from __future__ import annotations

import argparse
import ipaddress
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import InvalidJob
from ..jobs import MAX_DELAY, Outcome, Rate

#: The keys of ``--where`` (``rerun`` / ``cancel`` in bulk), as the library's arguments.
WHERE_KEYS = {
    "queue": "queue",
    "lane": "lane",
    "outcome": "outcome",
    "settled-after": "settled_after",
    "settled-before": "settled_before",
    "enqueued-after": "enqueued_after",
    "enqueued-before": "enqueued_before",
}


def where(text: str) -> tuple[str, Any]:
    """One ``--where KEY=VALUE``: ``queue``, ``lane``, ``outcome`` (several
    comma-separated), or a time bound -- an ISO 8601 time with its zone
    (``2026-05-01T12:00:00Z``) or a DURATION meaning that long ago."""
    key, sep, value = text.partition("=")
    if not sep or key not in WHERE_KEYS:
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE with KEY one of {', '.join(WHERE_KEYS)}, got {text[:60]!r}"
        )
    if key == "outcome":
        known = {outcome.value for outcome in Outcome}
        outcomes = value.split(",")
        unknown = [name for name in outcomes if name not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"outcome {unknown[0][:40]!r} is not one of {', '.join(sorted(known))}")
        return WHERE_KEYS[key], outcomes
    if key.endswith(("-after", "-before")):
        return WHERE_KEYS[key], time_bound(value)
    if not value:
        raise argparse.ArgumentTypeError(f"{key} is empty")
    return WHERE_KEYS[key], value


def time_bound(text: str) -> datetime:
    """An ISO 8601 time with its zone, or a DURATION ago (this machine's clock)."""
    if DURATION.fullmatch(text) and text:
        return datetime.now(UTC) - parse_duration(text)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time with its zone (2026-05-01T12:00:00Z) or a duration ago (2h), got {text[:40]!r}"
        )
    return value


#: The hosts ``dashboard`` may bind to: it has no ``authorize``, so only this machine may reach it.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def loopback_host(text: str) -> str:
    """``--host`` of ``dashboard``: a loopback address, nothing else."""
    try:
        loopback = text == "localhost" or ipaddress.ip_address(text).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r} is not a loopback address: without an authorize function the dashboard "
            "binds to 127.0.0.1 only. To serve it to others, mount "
            "sqlalchemy_watchdog.web.create_app(engine, authorize=...) in your own application"
        )
    return text


#: The most threads a runner started here may run at once.
CONCURRENCY_MAX = 1024


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def concurrency(text: str) -> int:
    value = positive_int(text)
    if value > CONCURRENCY_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {CONCURRENCY_MAX}, got {text[:40]}")
    return value


#: The executors ``run --executor`` names.
EXECUTOR_NAMES = ("thread", "process")


def executor_choice(text: str) -> tuple[str | None, str]:
    """``--executor``: ``thread`` or ``process`` (the runner's default), or
    ``QUEUE=thread`` / ``QUEUE=process`` (that queue's): (queue or None, executor)."""
    queue, sep, name = text.rpartition("=")
    if not sep:
        queue, name = "", text
    if name not in EXECUTOR_NAMES:
        raise argparse.ArgumentTypeError(f"expected thread, process, QUEUE=thread or QUEUE=process, got {text[:80]!r}")
    if sep and not queue:
        raise argparse.ArgumentTypeError(f"the queue before '=' is empty in {text[:80]!r}")
    return (queue if sep else None), name


#: The most slots ``schedules --count`` prints per schedule.
SCHEDULE_COUNT_MAX = 1000


def slot_count(text: str) -> int:
    value = positive_int(text)
    if value > SCHEDULE_COUNT_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {SCHEDULE_COUNT_MAX}, got {text[:40]}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


#: The longest duration option accepted, in seconds: what a thread can wait.
SECONDS_MAX = threading.TIMEOUT_MAX


def seconds(text: str) -> float:
    """A duration option: seconds from 0 to :data:`SECONDS_MAX` (argparse
    names the option in the error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text[:40]!r}") from None
    if not 0 <= value <= SECONDS_MAX:
        raise argparse.ArgumentTypeError(f"must be a number of seconds from 0 to {SECONDS_MAX:.0f}, got {text[:40]!r}")
    return value


#: A DURATION option: whole days, hours, minutes and seconds, largest unit first.
DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
DURATION_UNITS = (86400, 3600, 60, 1)


def parse_duration(text: str) -> timedelta:
    """A DURATION: ``30d``, ``12h``, ``15m``, ``90s``, or units combined
    largest first (``1d12h``, ``1h30m``); from ``0s`` to 3650 days.

    Nothing else is accepted (no sign, no fraction, no space, no other
    unit): argparse names the option in the error.
    """
    match = DURATION.fullmatch(text) if 0 < len(text) <= 40 else None
    if match is None or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"expected a duration such as 30d, 12h, 15m, 90s or 1h30m, got {text[:40]!r}")
    total = sum(int(part) * unit for part, unit in zip(match.groups(), DURATION_UNITS) if part)
    if total > MAX_DELAY.total_seconds():
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DELAY.days}d, got {text[:40]!r}")
    return timedelta(seconds=total)


def format_duration(value: timedelta) -> str:
    """A whole-second duration as :func:`parse_duration` reads it (``1h30m``, ``0s``)."""
    rest = int(value.total_seconds())
    parts = []
    for unit, name in zip(DURATION_UNITS, "dhms"):
        count, rest = divmod(rest, unit)
        if count:
            parts.append(f"{count}{name}")
    return "".join(parts) or "0s"


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An integer option from ``low`` to ``high`` (argparse names the option in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    return parse


#: The shortest and the default ``stats --watch --interval``, in seconds.
WATCH_INTERVAL_MIN = 0.1
WATCH_INTERVAL_DEFAULT = 2.0


def rate(text: str) -> Rate:
    """``--rate N/PERIOD`` (``100/minute``, ``10/s``, ``5/30s``): a :class:`Rate`."""
    try:
        return Rate.parse(text)
    except InvalidJob as error:
        raise argparse.ArgumentTypeError(str(error).split(": ", 1)[-1]) from None


def watch_interval(text: str) -> float:
    value = seconds(text)
    if value < WATCH_INTERVAL_MIN:
        raise argparse.ArgumentTypeError(f"must be at least {WATCH_INTERVAL_MIN} seconds, got {text[:40]!r}")
    return value


#: The largest ``sequence`` (a 64-bit signed integer).
SEQUENCE_MAX = 2**63 - 1
