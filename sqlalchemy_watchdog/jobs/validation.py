"""The checks every value of :mod:`sqlalchemy_watchdog.jobs` makes, and their bounds.

Each check returns the value it was given, or raises
:class:`~sqlalchemy_watchdog.InvalidJob` naming the field, so bad input is
refused before any SQL runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from ..errors import InvalidJob

__all__ = [
    "AFTER_POLICIES",
    "CANCELLATION_ID_MAX_LENGTH",
    "FAILURE_DETAIL_MAX_LENGTH",
    "FAILURE_HISTORY_LENGTH",
    "FAILURE_HISTORY_REASON_LENGTH",
    "FAILURE_REASON_MAX_LENGTH",
    "JOB_ID_MAX_LENGTH",
    "KEY_MAX_LENGTH",
    "LANE_MAX_LENGTH",
    "LIMIT_MAX",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_DELAY",
    "MAX_PARENTS",
    "PAUSE_REASON_MAX_LENGTH",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "QUEUE_MAX_LENGTH",
    "RATE_PERIOD_MAX",
    "RATE_PERIOD_MIN",
    "TRACE_CONTEXT_MAX_LENGTH",
    "bound_reason",
    "check_aware",
    "check_datetime",
    "check_duration",
    "check_int",
    "check_parents",
    "check_text",
]


#: The longest ``job_id`` accepted, in characters (a CHECK of the table holds it too).
JOB_ID_MAX_LENGTH = 256
#: The longest stored trace context (JSON text of its propagation fields).
TRACE_CONTEXT_MAX_LENGTH = 4096
#: The longest queue name accepted, in characters.
QUEUE_MAX_LENGTH = 256
#: The longest flow-control key of a job (``Job.key``).
KEY_MAX_LENGTH = 256
#: The largest limit (concurrency, per-key concurrency, rate count) accepted.
LIMIT_MAX = 1_000_000
#: The longest rate period accepted (a rate limit's window), and the shortest.
RATE_PERIOD_MAX = timedelta(days=1)
RATE_PERIOD_MIN = timedelta(milliseconds=1)
#: A 256-character identity plus a prefix such as ``team-key:`` still fits.
LANE_MAX_LENGTH = 512
#: The longest cancellation id accepted (``Job.cancellation_id``), in characters.
CANCELLATION_ID_MAX_LENGTH = 256
#: The longest pause reason accepted.
PAUSE_REASON_MAX_LENGTH = 2000
#: Failure reasons are cut to this many characters before they are stored.
FAILURE_REASON_MAX_LENGTH = 2000
#: The longest traceback kept with a failed job (its last characters are kept).
FAILURE_DETAIL_MAX_LENGTH = 8000
#: The lowest priority accepted (a signed 64-bit integer, as stored).
PRIORITY_MIN = -(2**63)
#: The highest priority accepted; a higher priority is claimed first.
PRIORITY_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
#: The largest ``max_attempts`` a retry policy may ask for.
MAX_ATTEMPTS_LIMIT = 1000
#: How many failed attempts a job remembers (the latest ones).
FAILURE_HISTORY_LENGTH = 10
#: Each remembered failure keeps at most this many characters of its reason.
FAILURE_HISTORY_REASON_LENGTH = 500
#: The longest delay, backoff, snooze or timeout accepted (about ten years).
MAX_DELAY = timedelta(days=3650)
#: The most parents one job may wait for (``Job(after=...)``).
MAX_PARENTS = 10_000
#: ``Job(after_policy=...)``: run only after every parent completed (a parent
#: ending otherwise settles the job ``cancelled``), or after every parent
#: settled, however it ended.
AFTER_POLICIES = ("completed", "any_outcome")

#: The range of ``run_at`` accepted (stored as epoch milliseconds).
_RUN_AT_MIN = datetime(1970, 1, 1, tzinfo=UTC)
_RUN_AT_MAX = datetime(9999, 1, 1, tzinfo=UTC)


def check_text(field_name: str, value: object, max_length: int) -> str:
    """Return ``value`` if it is a usable identifier, else raise :class:`InvalidJob`."""
    if not isinstance(value, str):
        raise InvalidJob(field_name, f"must be a str, not {type(value).__name__}")
    if not 1 <= len(value) <= max_length:
        raise InvalidJob(field_name, f"must be 1 to {max_length} characters long, got {len(value)}")
    if "\x00" in value:
        raise InvalidJob(field_name, "must not contain a NUL character")
    if not value.isascii():  # isascii() is O(1); only non-ASCII text can hold a lone surrogate
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidJob(field_name, "must be valid Unicode (no lone surrogates)") from None
    return value


def check_int(field_name: str, value: object, low: int, high: int) -> int:
    """Return ``value`` if it is an int (not a bool) within ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(field_name, f"must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidJob(field_name, f"must be between {low} and {high}, got {value}")
    return value


def check_duration(field_name: str, value: object, *, low: timedelta = timedelta(milliseconds=1)) -> timedelta:
    """Return ``value`` if it is a timedelta within ``[low, MAX_DELAY]`` (whole milliseconds count)."""
    if not isinstance(value, timedelta):
        raise InvalidJob(field_name, f"must be a datetime.timedelta, not {type(value).__name__}")
    if value < low:
        what = "positive" if low > timedelta(0) else "non-negative"
        raise InvalidJob(field_name, f"must be {what} (at least {low}), got {value}")
    if value > MAX_DELAY:
        raise InvalidJob(field_name, f"must be at most {MAX_DELAY}, got {value}")
    return value


def check_aware(field_name: str, value: object) -> datetime:
    """Return ``value`` if it is a timezone-aware datetime, else :class:`InvalidJob`."""
    if not isinstance(value, datetime):
        raise InvalidJob(field_name, f"must be a timezone-aware datetime.datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidJob(
            field_name, f"must be timezone-aware (e.g. datetime.now(timezone.utc)), got naive {value.isoformat()}"
        )
    return value


def check_datetime(field_name: str, value: object) -> datetime:
    """Return ``value`` if it is a timezone-aware datetime the table can hold."""
    value = check_aware(field_name, value)
    if not _RUN_AT_MIN <= value < _RUN_AT_MAX:
        raise InvalidJob(field_name, f"must be between 1970 and 9999, got {value.isoformat()}")
    return value


def check_parents(job_id: str, after: object) -> tuple[str, ...]:
    """``after`` as a tuple of distinct job_ids (first mention kept), checked."""
    if after is None:
        return ()
    if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
        raise InvalidJob("after", f"must be an iterable of job_ids, not {type(after).__name__}")
    parents = tuple(dict.fromkeys(after))
    if len(parents) > MAX_PARENTS:
        raise InvalidJob("after", f"may name at most {MAX_PARENTS} jobs, got {len(parents)}")
    for parent in parents:
        check_text("after", parent, JOB_ID_MAX_LENGTH)
        if parent == job_id:
            raise InvalidJob("after", f"job {job_id!r} cannot wait for itself")
    return parents


def bound_reason(reason: str) -> str:
    """Cut a failure reason to :data:`FAILURE_REASON_MAX_LENGTH` and strip NULs."""
    reason = reason.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")
    if len(reason) > FAILURE_REASON_MAX_LENGTH:
        reason = reason[: FAILURE_REASON_MAX_LENGTH - 1] + "…"
    return reason
