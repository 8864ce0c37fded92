"""Jobs, decisions and the results of queue operations.

Everything here is a small frozen value. :class:`Job` validates its fields
when it is built, so bad input is refused before any SQL runs.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import InvalidJob

if TYPE_CHECKING:
    from .codecs import PayloadCodec

_T = TypeVar("_T")

__all__ = [
    "JOB_ID_MAX_LENGTH",
    "QUEUE_MAX_LENGTH",
    "LANE_MAX_LENGTH",
    "CANCELLATION_ID_MAX_LENGTH",
    "FAILURE_REASON_MAX_LENGTH",
    "PAYLOAD_MAX_BYTES",
    "PAYLOAD_MAX_DEPTH",
    "RESULT_MAX_BYTES",
    "PRIORITY_MIN",
    "PRIORITY_MAX",
    "MAX_ATTEMPTS_LIMIT",
    "FAILURE_HISTORY_LENGTH",
    "MAX_DELAY",
    "JobState",
    "Outcome",
    "RetryPolicy",
    "FailedAttempt",
    "Job",
    "Decision",
    "JobView",
    "Undecodable",
    "EnqueueStatus",
    "EnqueueResult",
    "PauseStatus",
    "QueuePause",
    "QueueStats",
    "WorkerView",
    "ScheduleView",
    "Stats",
    "Throughput",
    "THROUGHPUT_MINUTES",
    "Retention",
    "CancelStatus",
    "CancelResult",
    "SettleStatus",
    "LaneFailure",
    "BulkSkip",
    "BulkResult",
    "BULK_BATCH_MAX",
    "KEY_MAX_LENGTH",
    "LIMIT_MAX",
    "RATE_PERIOD_MAX",
    "Rate",
    "QueueLimits",
    "HeldBy",
    "encode_payload",
    "encode_result",
    "ResultStatus",
    "JobResult",
]

JOB_ID_MAX_LENGTH = 256
#: The longest stored trace context (JSON text of its propagation fields).
TRACE_CONTEXT_MAX_LENGTH = 4096
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
CANCELLATION_ID_MAX_LENGTH = 256
#: The longest pause reason accepted.
PAUSE_REASON_MAX_LENGTH = 2000
#: Failure reasons are cut to this many characters before they are stored.
FAILURE_REASON_MAX_LENGTH = 2000
#: The longest traceback kept with a failed job (its last characters are kept).
FAILURE_DETAIL_MAX_LENGTH = 8000
#: The largest payload accepted, measured as its canonical UTF-8 JSON text.
PAYLOAD_MAX_BYTES = 1024 * 1024
#: The deepest nesting of arrays and objects accepted in a payload.
PAYLOAD_MAX_DEPTH = 64
#: The largest result a handler may return, in bytes of its canonical JSON
#: (the same bound as a payload's).
RESULT_MAX_BYTES = PAYLOAD_MAX_BYTES
PRIORITY_MIN = -(2**63)
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


class JobState(str, enum.Enum):
    """Where a job is in its life: (``delayed`` →) ``queued`` → ``running`` → ``settled``.

    A ``delayed`` job waits for its time (``run_at``, an enqueue ``delay``, a
    retry's backoff or a snooze); it becomes ``queued`` when the time comes.
    A retried or snoozed job goes from ``running`` back to ``delayed`` (or
    ``queued``); ``settled`` is final. A ``waiting`` job (``Job(after=...)``)
    waits for its parents to settle; then it becomes ``queued`` (or
    ``delayed``), or is settled ``cancelled`` when a parent did not complete.
    """

    DELAYED = "delayed"
    QUEUED = "queued"
    RUNNING = "running"
    SETTLED = "settled"
    #: Revision w0012: waiting for its parents (``Job(after=...)``) to settle.
    WAITING = "waiting"


class Outcome(str, enum.Enum):
    """How a settled job ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    OUTCOME_UNKNOWN = "outcome_unknown"
    INTERRUPTED = "interrupted"


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


def duration_ms(value: timedelta) -> int:
    """A checked duration in whole milliseconds."""
    return value // timedelta(milliseconds=1)


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


def epoch_ms(value: datetime) -> int:
    """A checked aware datetime in milliseconds since the Unix epoch."""
    return (value - _RUN_AT_MIN) // timedelta(milliseconds=1)


def from_epoch_ms(value: int | None) -> datetime | None:
    """Epoch milliseconds as an aware UTC datetime (None stays None)."""
    return None if value is None else at_epoch_ms(value)


def at_epoch_ms(value: int) -> datetime:
    """Epoch milliseconds as an aware UTC datetime."""
    return _RUN_AT_MIN + timedelta(0, 0, 0, value)  # positional: keywords cost a third more


def _check_json(value: Any, name: str = "payload") -> None:
    """Refuse anything that is not strict JSON, without recursion.

    Strings are not looked into here: a lone surrogate in any of them (keys
    included) makes the encoded text fail UTF-8 encoding in
    :func:`encode_payload`, which checks the whole text once.
    """
    if type(value) is dict and _flat(value):
        return
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, (str, bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidJob(name, f"must be strict JSON; {item!r} is not a JSON number")
            continue
        if depth >= PAYLOAD_MAX_DEPTH:
            raise InvalidJob(name, f"must nest at most {PAYLOAD_MAX_DEPTH} levels deep")
        if isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidJob(
                        name,
                        f"object keys must be str, not {type(key).__name__} ({key!r})",
                    )
                stack.append((child, depth + 1))
        else:
            raise InvalidJob(name, f"must be strict JSON; {type(item).__name__} is not a JSON type")


#: Exact types a flat payload's values may have without a closer look.
_SCALARS = frozenset({str, int, bool, type(None)})


def _flat(value: dict[Any, Any]) -> bool:
    """Whether ``value`` is a plain dict of ``str`` keys and finite scalars,
    the common payload: strict JSON as it stands (the fast path of
    :func:`_check_json`; False sends anything else to the full check)."""
    for key, item in value.items():
        if type(key) is not str:
            return False
        kind = type(item)
        if kind in _SCALARS or (kind is float and math.isfinite(item)):
            continue
        return False
    return True


#: Canonical payload JSON: sorted keys, fixed separators, strict numbers.
_PAYLOAD_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _one_shot_encoder() -> Callable[[Any], str]:
    """``_PAYLOAD_ENCODER.encode``, the same text, without its per-call set-up.

    ``JSONEncoder.encode`` builds CPython's C encoder object on every call,
    about half the cost of encoding a small payload. This builds it once,
    with the very arguments ``encode`` passes, but no circular-reference
    markers: :func:`_check_json` has already refused anything nested deeper
    than :data:`PAYLOAD_MAX_DEPTH`, which a cycle would be. Where the C
    encoder is missing (another Python), ``encode`` itself.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return _PAYLOAD_ENCODER.encode
    e = _PAYLOAD_ENCODER
    iterate = make(
        None,
        e.default,
        json.encoder.encode_basestring,
        e.indent,
        e.key_separator,
        e.item_separator,
        e.sort_keys,
        e.skipkeys,
        e.allow_nan,
    )

    def encode(payload: Any) -> str:
        return "".join(iterate(payload, 0))

    return encode


_encode_checked_json = _one_shot_encoder()


def encode_payload(payload: Any, name: str = "payload", max_bytes: int = PAYLOAD_MAX_BYTES) -> str:
    """Validate ``payload`` and return its canonical JSON text.

    Keys are sorted and separators fixed, so equal payloads always encode to
    the same text and an identical replay is recognised as a duplicate.
    ``name`` is the field an error names (``result`` for a handler's result).
    """
    if payload is None:  # the default: no need for the encoder
        return "null"
    _check_json(payload, name)
    try:
        text = _encode_checked_json(payload)
    except (TypeError, ValueError) as error:  # e.g. a read-only mapping, a 5,000-digit int
        raise InvalidJob(name, f"cannot be encoded as JSON: {error}") from None
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidJob(name, "strings must be valid Unicode (no lone surrogates)") from None
    if size > max_bytes:
        raise InvalidJob(name, f"must be at most {max_bytes} bytes of JSON, got {size}")
    return text


def encode_result(value: Any, codec: PayloadCodec | None = None) -> str | None:
    """A handler's result as stored: ``codec.encode(value)`` (when a codec is
    given), then canonical JSON of at most :data:`RESULT_MAX_BYTES`; None for
    no result (``None``).

    :raises InvalidJob: (field ``result``) a value the codec refuses, that is
        not strict JSON, or that is too large.
    """
    if value is None:
        return None
    if codec is not None:
        try:
            value = codec.encode(value)
        except InvalidJob as error:
            raise InvalidJob("result", str(error).split(": ", 1)[-1]) from None
        except Exception as error:  # a codec refusing a value, in its own words
            raise InvalidJob(
                "result", f"{type(codec).__name__}.encode failed: {type(error).__name__}: {error}"
            ) from None
    return encode_payload(value, "result", RESULT_MAX_BYTES)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failed attempt is retried: at most ``max_attempts`` attempts in
    all, the n-th retry waiting ``backoff * factor**(n-1)`` (at most
    ``max_backoff``), spread by ``± jitter`` (a fraction) so that jobs that
    failed together do not all come back at once; the spread never takes a
    wait past ``max_backoff``, the longest wait.

    Give it to a job (``Job(..., retry=...)``), to a handler
    (``@handler(queue, retry=...)``) or to a runner (``Runner(..., retry=...)``);
    the first of those that has one applies. Without any, a failed attempt
    is final (``max_attempts=1``).

    :param max_attempts: attempts in all, the first included (1 to
        :data:`MAX_ATTEMPTS_LIMIT`).
    :param backoff: the wait before the first retry (positive).
    :param factor: how much each further retry waits longer (1 to 100).
    :param max_backoff: the longest wait between attempts.
    :param jitter: the random spread, a fraction from 0 to 1 of the wait.
    :param retry_on: exception types (a type or a tuple of types): when
        given, only an attempt whose handler raised one of them (or returned
        ``Decision.retry(reason, after=...)``) is retried; any other failure
        is final.
        ``retry_on=(sqlalchemy.exc.OperationalError,)`` retries a handler
        whose database connection was cut, and nothing else. Empty (the
        default): every failed attempt is retried. A runner's or a
        handler's policy only: it is not stored with a job (``Job(retry=...)``
        refuses it).
    """

    max_attempts: int = 5
    backoff: timedelta = timedelta(seconds=1)
    factor: float = 2.0
    max_backoff: timedelta = timedelta(hours=1)
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        retry_on: Any = self.retry_on
        if isinstance(retry_on, type):
            retry_on = (retry_on,)
        if not isinstance(retry_on, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in retry_on
        ):
            raise InvalidJob("retry_on", f"must be an exception type or a tuple of them, got {self.retry_on!r}")
        object.__setattr__(self, "retry_on", retry_on)
        check_int("max_attempts", self.max_attempts, 1, MAX_ATTEMPTS_LIMIT)
        check_duration("backoff", self.backoff)
        check_duration("max_backoff", self.max_backoff)
        if self.max_backoff < self.backoff:
            raise InvalidJob("max_backoff", f"must be at least backoff ({self.backoff}), got {self.max_backoff}")
        for name, value, low, high in (("factor", self.factor, 1.0, 100.0), ("jitter", self.jitter, 0.0, 1.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidJob(name, f"must be a number, not {type(value).__name__}")
            if not (math.isfinite(value) and low <= value <= high):
                raise InvalidJob(name, f"must be from {low:g} to {high:g}, got {value!r}")

    def retries(self, error: BaseException | None) -> bool:
        """Whether a failed attempt that raised ``error`` (None: the handler
        returned a failed decision) may be retried under :attr:`retry_on`."""
        if not self.retry_on:
            return True
        return error is not None and isinstance(error, self.retry_on)

    def delay(self, attempt: int, *, rng: random.Random | None = None) -> timedelta:
        """The wait after failed attempt number ``attempt`` (1-based): never
        more than ``max_backoff``, jitter included, whatever the attempt."""
        longest = self.max_backoff.total_seconds()
        base = self.backoff.total_seconds()
        retries = max(attempt - 1, 0)
        # Compared in log space, so no power is ever computed past the cap:
        # factor ** retries overflows a float long before max_attempts ends.
        factor = float(self.factor)
        if factor > 1.0 and retries and retries * math.log(factor) < math.log(longest / base):
            base = min(longest, base * factor**retries)
        elif factor > 1.0 and retries:
            base = longest
        spread = (rng or random).uniform(-float(self.jitter), float(self.jitter)) if self.jitter else 0.0
        return timedelta(seconds=min(longest, max(0.001, base * (1.0 + spread))))

    def to_json(self) -> str:
        """The backoff part as canonical JSON (``max_attempts`` is stored on its own)."""
        return json.dumps(
            {
                "backoff_ms": duration_ms(self.backoff),
                "factor": float(self.factor),
                "jitter": float(self.jitter),
                "max_backoff_ms": duration_ms(self.max_backoff),
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_stored(cls, max_attempts: int | None, text: str | None) -> RetryPolicy | None:
        """The policy stored with a job, if it has one."""
        if max_attempts is None:
            return None
        if text is None:
            return cls(max_attempts=max_attempts)
        data = json.loads(text)
        return cls(
            max_attempts=max_attempts,
            backoff=timedelta(milliseconds=data["backoff_ms"]),
            factor=data["factor"],
            max_backoff=timedelta(milliseconds=data["max_backoff_ms"]),
            jitter=data["jitter"],
        )


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed attempt in a job's history (:attr:`JobView.failure_history`)."""

    #: When the attempt failed (the runner's clock, UTC).
    at: datetime
    #: Which attempt it was (1 is the first).
    attempt: int
    #: Why, cut to ``FAILURE_HISTORY_REASON_LENGTH`` characters.
    reason: str


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


#: Strict JSON: ``NaN`` and ``Infinity`` are refused (Python's default takes them).
_STRICT_JSON = json.JSONDecoder(parse_constant=_not_json)


def payload_of(text: str) -> Any:
    """A stored payload's value; raises for text the library would never
    have stored: not strict JSON, or nested deeper than :data:`PAYLOAD_MAX_DEPTH`
    (a ``RecursionError`` from the decoder included)."""
    value = _STRICT_JSON.decode(text)
    # Only text with that many brackets can nest that deep: a flat payload
    # is not walked again.
    if len(text) > PAYLOAD_MAX_DEPTH and text.count("[") + text.count("{") > PAYLOAD_MAX_DEPTH:
        _check_json(value)
    return value


def history_of(text: str | None) -> tuple[FailedAttempt, ...]:
    """A stored failure history (JSON) as values."""
    if not text:
        return ()
    entries = json.loads(text)
    return tuple(
        FailedAttempt(
            at=at_epoch_ms(int(entry["at"])),
            attempt=int(entry["attempt"]),
            reason=str(entry["reason"]),
        )
        for entry in entries
    )


def history_with(history: tuple[FailedAttempt, ...], *, at_ms: int, attempt: int, reason: str) -> str:
    """``history`` with one more failed attempt, as stored (JSON): the latest
    :data:`FAILURE_HISTORY_LENGTH` entries, each reason bounded."""
    if len(reason) > FAILURE_HISTORY_REASON_LENGTH:
        reason = reason[: FAILURE_HISTORY_REASON_LENGTH - 1] + "…"
    entries = [{"at": epoch_ms(e.at), "attempt": e.attempt, "reason": e.reason} for e in history]
    entries.append({"at": at_ms, "attempt": attempt, "reason": reason})
    return json.dumps(entries[-FAILURE_HISTORY_LENGTH:], ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True, init=False)
class Job:
    """A job to enqueue; every field is checked when it is built.

    :param job_id: the caller's idempotency key (1-256 characters). Enqueueing
        the same job twice is a no-op; the same ``job_id`` with other
        contents is an :class:`~sqlalchemy_watchdog.EnqueueConflict`.
    :param queue: the queue a runner serves (1-256 characters).
    :param lane: the failure domain (1-512 characters), defaults to ``queue``;
        :meth:`Watchdog.fail_lane` settles all its live jobs at once.
    :param priority: higher runs first, then admission order; signed 64-bit.
    :param payload: any strict-JSON value (at most :data:`PAYLOAD_MAX_BYTES`).
    :param max_recoveries: ``None`` means an execution that disappears is
        settled ``interrupted``; ``N >= 0`` allows N requeues first.
    :param run_at: when the job may start, a timezone-aware datetime (naive
        is refused); until then it is ``delayed`` and no runner claims it. A
        time in the past runs at once. Part of the job's identity.
    :param retry: its own :class:`RetryPolicy` (else its handler's, else
        its runner's, else none: a failed attempt is final).
    :param timeout: how long one attempt may run; then its handler is told
        to stop (:attr:`StopReason.TIMEOUT`) and the attempt counts as failed.
    :param key: the job's flow-control key (1-256 characters), e.g. a tenant:
        a queue's ``concurrency_per_key`` limit counts the running jobs of each
        key, and a limited queue's claims rotate across keys
        (:meth:`Watchdog.set_limits`). Part of the job's identity.
    :param codec: an optional :class:`~sqlalchemy_watchdog.PayloadCodec`
        (e.g. :class:`~sqlalchemy_watchdog.TaggedJSON`): ``payload`` is
        replaced by ``codec.encode(payload)`` before it is validated, so
        :attr:`payload` holds the JSON form that is stored. The codec is not
        part of the job's identity: jobs whose encoded payloads are equal
        are the same job (an identical replay).
    :param after: job_ids of jobs this one waits for (its parents): until
        every one of them is settled it is ``waiting``, and no runner claims
        it. Each must exist, or come earlier in the same enqueue call (so no
        cycle can be built), and not be the job itself. Part of the job's
        identity, in any order: a replay naming other parents (or none) is an
        :class:`~sqlalchemy_watchdog.EnqueueConflict` whose ``field`` is
        ``"after"``.
    :param after_policy: ``completed`` (the default): a parent that ends
        other than ``completed`` settles this job ``cancelled``, with a
        reason naming it (a parent already ended so is refused at enqueue);
        ``any_outcome``: it runs once every parent settled, however.
    """

    job_id: str
    queue: str
    _: KW_ONLY
    lane: str | None = None
    priority: int = 0
    payload: Any = None
    max_recoveries: int | None = None
    run_at: datetime | None = None
    retry: RetryPolicy | None = None
    timeout: timedelta | None = None
    #: The job this one reruns (set by ``Watchdog.rerun``).
    rerun_of: str | None = None
    #: The flow-control key (see :meth:`Watchdog.set_limits`).
    key: str | None = None
    codec: PayloadCodec | None = field(default=None, repr=False, compare=False)
    payload_json: str = field(init=False, repr=False, compare=False)
    #: The jobs (by job_id) this one waits for; see :class:`Job`'s ``after``.
    after: tuple[str, ...] = ()
    #: ``completed`` (the default) or ``any_outcome`` (``jobs.AFTER_POLICIES``).
    after_policy: str = "completed"

    # Written out rather than generated: a frozen dataclass's own __init__
    # sets each field through object.__setattr__, which made building a Job
    # a third slower (batch enqueue builds thousands). Fields are set through
    # their slots' descriptors (slot_setters), after every check has passed.
    def __init__(
        self,
        job_id: str,
        queue: str,
        *,
        lane: str | None = None,
        priority: int = 0,
        payload: Any = None,
        max_recoveries: int | None = None,
        run_at: datetime | None = None,
        retry: RetryPolicy | None = None,
        timeout: timedelta | None = None,
        rerun_of: str | None = None,
        key: str | None = None,
        codec: PayloadCodec | None = None,
        after: Iterable[str] | None = None,
        after_policy: str = "completed",
    ) -> None:
        check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
        check_text("queue", queue, QUEUE_MAX_LENGTH)
        if lane is None:
            lane = queue
        else:
            check_text("lane", lane, LANE_MAX_LENGTH)
        check_int("priority", priority, PRIORITY_MIN, PRIORITY_MAX)
        if max_recoveries is not None:
            check_int("max_recoveries", max_recoveries, 0, _INT32_MAX)
        if run_at is not None:
            check_datetime("run_at", run_at)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidJob("retry", f"must be a RetryPolicy, not {type(retry).__name__}")
        if retry is not None and retry.retry_on:
            raise InvalidJob(
                "retry", "retry_on is not stored with a job: give that policy to the handler or the runner"
            )
        if timeout is not None:
            check_duration("timeout", timeout)
        if rerun_of is not None:
            check_text("rerun_of", rerun_of, JOB_ID_MAX_LENGTH)
        if key is not None:
            check_text("key", key, KEY_MAX_LENGTH)
        if codec is not None:
            payload = _encoded(codec, payload)
        payload_json = encode_payload(payload)
        parents = check_parents(job_id, after)
        if after_policy not in AFTER_POLICIES:
            raise InvalidJob("after_policy", f"must be one of {list(AFTER_POLICIES)}, got {after_policy!r}")
        _set_job_id(self, job_id)
        _set_queue(self, queue)
        _set_lane(self, lane)
        _set_priority(self, priority)
        _set_payload(self, payload)
        _set_max_recoveries(self, max_recoveries)
        _set_run_at(self, run_at)
        _set_retry(self, retry)
        _set_timeout(self, timeout)
        _set_rerun_of(self, rerun_of)
        _set_key(self, key)
        _set_codec(self, codec)
        _set_payload_json(self, payload_json)
        _set_after(self, parents)
        _set_after_policy(self, after_policy)

    def __post_init__(self) -> None:
        # Not called by Job's own __init__: a dataclass subclass's generated
        # __init__ sets the fields and calls this, so its jobs are checked and
        # encoded like any other.
        Job.__init__(
            self, self.job_id, self.queue, lane=self.lane, priority=self.priority, payload=self.payload,
            max_recoveries=self.max_recoveries, run_at=self.run_at, retry=self.retry, timeout=self.timeout,
            rerun_of=self.rerun_of, key=self.key, codec=self.codec, after=self.after, after_policy=self.after_policy,
        )  # fmt: skip

    @property
    def run_at_ms(self) -> int | None:
        """:attr:`run_at` in epoch milliseconds, as stored."""
        return None if self.run_at is None else epoch_ms(self.run_at)

    @property
    def timeout_ms(self) -> int | None:
        """:attr:`timeout` in milliseconds, as stored."""
        return None if self.timeout is None else duration_ms(self.timeout)

    @property
    def max_attempts(self) -> int | None:
        """The job's own ``max_attempts`` (None: its handler's or runner's policy)."""
        return None if self.retry is None else self.retry.max_attempts

    @property
    def retry_json(self) -> str | None:
        """The job's own backoff settings as stored."""
        return None if self.retry is None else self.retry.to_json()


def slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[Any, Any], None], ...]:
    """The setters of a frozen slots dataclass's fields, in ``names`` order,
    which must name all its fields in their declared order (else TypeError).

    For building instances on a hot path: a frozen dataclass's own ``__init__``
    sets each field through ``object.__setattr__``, several times slower than
    the slot's setter. Whoever uses them must set every field."""
    declared = tuple(f.name for f in fields(cls))
    if declared != names:
        raise TypeError(f"{cls.__name__} has the fields {declared}, not {names}")
    return tuple(cls.__dict__[name].__set__ for name in names)


def frozen_builder(cls: type[_T], names: tuple[str, ...]) -> Callable[..., _T]:
    """A function ``build(*values)`` making an instance of the frozen
    dataclass ``cls`` with its fields ``names`` (all of them, in declared
    order, else TypeError) set to ``values``, without ``__init__``: no
    defaults, no ``__post_init__``, so whoever calls it passes values the
    class's own checks would accept.

    For the instances the runner makes per job (a :class:`JobView` per
    claimed row). A frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, and even the slots' own setters are a call per
    field: 2.5 us for a ``JobView``. The builder is generated code (as
    dataclasses generate ``__init__``) that assigns each field on an
    instance of a private subclass with the plain ``__setattr__`` -- for a
    slots class one specialised bytecode per field, no call -- then sets its
    ``__class__`` to ``cls`` (the same layout: the subclass adds no slot and
    no ``__dict__``): 0.4 us. What it returns is a plain, frozen ``cls``.
    A dataclass without slots has its ``__dict__`` filled in one update."""
    declared = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    if declared != names:
        raise TypeError(f"{cls.__name__} has the fields {declared}, not {names}")
    params = ", ".join(f"v{i}" for i in range(len(names)))
    if "__slots__" in cls.__dict__:
        open_twin = type(
            f"_Building{cls.__name__}",
            (cls,),
            # Both plain: CPython then gives the twin the generic set-attribute
            # slot, which STORE_ATTR specialises for slots; with either of the
            # dataclass's own left, every assignment calls through it.
            {"__slots__": (), "__setattr__": object.__setattr__, "__delattr__": object.__delattr__},
        )
        assign = "".join(f"    made.{name} = v{i}\n" for i, name in enumerate(names))
        source = f"def build({params}):\n    made = new(open_twin)\n{assign}    made.__class__ = cls\n    return made\n"
        namespace: dict[str, Any] = {"new": object.__new__, "open_twin": open_twin, "cls": cls}
    else:  # the fields live in the instance's __dict__: set it whole
        assign = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
        source = f"def build({params}):\n    made = new(cls)\n    made.__dict__.update({{{assign}}})\n    return made\n"
        namespace = {"new": object.__new__, "cls": cls}
    exec(source, namespace)  # generated from the dataclass's own field names
    build: Callable[..., _T] = namespace["build"]
    return build


(
    _set_job_id, _set_queue, _set_lane, _set_priority, _set_payload, _set_max_recoveries, _set_run_at,
    _set_retry, _set_timeout, _set_rerun_of, _set_key, _set_codec, _set_payload_json, _set_after, _set_after_policy,
) = slot_setters(Job, (
    "job_id", "queue", "lane", "priority", "payload", "max_recoveries", "run_at",
    "retry", "timeout", "rerun_of", "key", "codec", "payload_json", "after", "after_policy",
))  # fmt: skip


#: Set a checked ``after`` on a copy of a job (workflows.py: a step made to
#: wait for the step before it).
set_after = _set_after


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


def _encoded(codec: Any, payload: Any) -> Any:
    """``codec.encode(payload)``; a codec's own failure is bad input too."""
    encode = getattr(codec, "encode", None)
    if not callable(encode) or not callable(getattr(codec, "decode", None)):
        raise InvalidJob("codec", f"must be a PayloadCodec (encode and decode), not {type(codec).__name__}")
    try:
        return encode(payload)
    except InvalidJob:
        raise
    except Exception as error:  # a codec refusing a value, in its own words
        raise InvalidJob("payload", f"{type(codec).__name__}.encode failed: {type(error).__name__}: {error}") from None


def rerun_job_id(job_id: str, rerun_id: str) -> str:
    """The ``job_id`` of rerun ``rerun_id`` of job ``job_id``:
    ``<job_id>~rerun~<rerun_id>`` when it fits in :data:`JOB_ID_MAX_LENGTH`,
    else ``rerun~<sha256 of both>`` (deterministic either way)."""
    plain = f"{job_id}~rerun~{rerun_id}"
    if len(plain) <= JOB_ID_MAX_LENGTH:
        return plain
    return "rerun~" + hashlib.sha256(f"{job_id}\x00{rerun_id}".encode()).hexdigest()


def bulk_cancellation_id(cancellation_id: str, job_id: str) -> str:
    """The ``cancellation_id`` that bulk cancellation ``cancellation_id``
    records on job ``job_id``: ``<cancellation_id>~<job_id>`` when it fits in
    :data:`CANCELLATION_ID_MAX_LENGTH`, else ``cancel~<sha256 of both>``
    (deterministic either way, so a repeated bulk cancellation replays)."""
    plain = f"{cancellation_id}~{job_id}"
    if len(plain) <= CANCELLATION_ID_MAX_LENGTH:
        return plain
    return "cancel~" + hashlib.sha256(f"{cancellation_id}\x00{job_id}".encode()).hexdigest()


def job_batch(jobs: object) -> list[Job]:
    """``jobs`` (a Job or an iterable of Jobs) as a list, or a clear TypeError."""
    if isinstance(jobs, Job):
        return [jobs]
    if isinstance(jobs, (str, bytes, Mapping)) or not isinstance(jobs, Iterable):
        raise TypeError(f"enqueue takes a Job or an iterable of Jobs, not {type(jobs).__name__}")
    batch = list(jobs)
    for job in batch:
        if not isinstance(job, Job):
            raise TypeError(f"enqueue takes Job objects, not {type(job).__name__}")
    return batch


@dataclass(frozen=True, slots=True)
class Decision:
    """What a handler decided; returned from a handler to settle its job.

    Use the constructors: :meth:`completed`, :meth:`failed`, :meth:`retry`,
    :meth:`snooze`, :meth:`outcome_unknown`.

    ``outcome`` is the outcome the job settles with; None for a snooze
    (which does not settle it). ``retryable`` says whether a ``failed`` decision
    may be retried under the job's :class:`RetryPolicy`; ``after`` is an
    explicit wait before the next attempt (a retry's or a snooze's).
    """

    outcome: Outcome | None
    reason: str | None = None
    _: KW_ONLY
    #: None: True for ``failed``, else False.
    retryable: bool | None = None
    after: timedelta | None = None
    #: The value a ``completed`` job keeps (see :meth:`completed`); None: none.
    result: Any = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.result is not None and self.outcome is not Outcome.COMPLETED:
            raise InvalidJob("result", "only a completed decision carries a result")
        if self.retryable is None:
            object.__setattr__(self, "retryable", self.outcome is Outcome.FAILED)
        if self.outcome is None:
            if self.after is None:
                raise InvalidJob(
                    "decision",
                    f"outcome must be one of {sorted(o.value for o in _DECIDABLE)}, got None "
                    "(a snooze is Decision.snooze(after))",
                )
        elif not isinstance(self.outcome, Outcome) or self.outcome not in _DECIDABLE:
            raise InvalidJob(
                "decision",
                f"outcome must be one of {sorted(o.value for o in _DECIDABLE)}, got {self.outcome!r}",
            )
        if not isinstance(self.retryable, bool):
            raise InvalidJob("retryable", f"must be a bool, not {type(self.retryable).__name__}")
        if self.retryable and self.outcome is not Outcome.FAILED:
            raise InvalidJob("retryable", "only a failed decision can be retried")
        if self.after is not None:
            if self.outcome is not None and not self.retryable:
                raise InvalidJob("after", "only a retry or a snooze waits (Decision.retry / Decision.snooze)")
            check_duration("after", self.after, low=timedelta(0) if self.retryable else timedelta(milliseconds=1))
        if self.reason is not None:
            if not isinstance(self.reason, str):
                raise InvalidJob("reason", f"must be a str, not {type(self.reason).__name__}")
            object.__setattr__(self, "reason", bound_reason(self.reason))

    @property
    def snoozed(self) -> bool:
        """Whether this is a snooze: run again later, no attempt used."""
        return self.outcome is None

    @classmethod
    def completed(cls, result: Any = None) -> Decision:
        """The job did what it should; ``result`` (any value the runner's
        codec can encode, at most :data:`RESULT_MAX_BYTES` of JSON) is kept
        with it, read by :meth:`Watchdog.result <sqlalchemy_watchdog.Watchdog.result>`.
        Returning the value itself from a handler is the same."""
        return cls(Outcome.COMPLETED, result=result)

    @classmethod
    def failed(cls, reason: str, *, retry: bool = True) -> Decision:
        """The attempt failed, for ``reason``.

        Retried after the policy's backoff while attempts are left (see
        :class:`RetryPolicy`); ``retry=False`` fails the job at once.
        """
        if not isinstance(retry, bool):
            raise InvalidJob("retry", f"must be a bool, not {type(retry).__name__}")
        return cls(Outcome.FAILED, reason, retryable=retry)

    @classmethod
    def retry(cls, reason: str, *, after: timedelta | None = None) -> Decision:
        """Run the job again after ``after`` (default: the policy's backoff).

        Uses an attempt: with none left the job settles ``failed`` with
        ``reason``.
        """
        return cls(Outcome.FAILED, reason, retryable=True, after=after)

    @classmethod
    def snooze(cls, after: timedelta) -> Decision:
        """Run the job again after ``after`` without using an attempt (the
        job's ``snoozes`` count goes up)."""
        return cls(None, None, after=after)

    @classmethod
    def outcome_unknown(cls, reason: str | None = None) -> Decision:
        """The side effect may or may not have happened; never retried."""
        return cls(Outcome.OUTCOME_UNKNOWN, reason)


_DECIDABLE = frozenset({Outcome.COMPLETED, Outcome.FAILED, Outcome.OUTCOME_UNKNOWN})


def bound_reason(reason: str) -> str:
    """Cut a failure reason to :data:`FAILURE_REASON_MAX_LENGTH` and strip NULs."""
    reason = reason.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")
    if len(reason) > FAILURE_REASON_MAX_LENGTH:
        reason = reason[: FAILURE_REASON_MAX_LENGTH - 1] + "…"
    return reason


#: The longest :attr:`Undecodable.reason` kept.
UNDECODABLE_REASON_LENGTH = 200


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A stored value the library cannot decode: a row a producer wrote
    itself (not valid JSON, nested deeper than :data:`PAYLOAD_MAX_DEPTH`,
    a time outside 1970-9999, a retry policy out of its bounds, ...).

    It never stops a claim, a settle, a recovery or a read: the job is read
    with that field unknown and the value listed in :attr:`JobView.undecodable`.
    An undecodable ``payload`` reads as this object itself (and a runner
    settles the job ``failed`` without running its handler); another field
    reads as its "none" value (see :attr:`JobView.undecodable`).
    """

    #: The :class:`JobView` field (``payload``, ``retry``, ``ready_at``, ...).
    field: str
    #: The ``watchdog_jobs`` column it is stored in.
    column: str
    #: Why it cannot be decoded (at most :data:`UNDECODABLE_REASON_LENGTH` characters).
    reason: str

    @classmethod
    def of(cls, field: str, column: str, error: BaseException) -> Undecodable:
        """The value of ``field`` (stored in ``column``) that raised ``error`` when decoded."""
        reason = f"{type(error).__name__}: {error}"
        if len(reason) > UNDECODABLE_REASON_LENGTH:
            reason = reason[: UNDECODABLE_REASON_LENGTH - 1] + "…"
        return cls(field, column, reason)

    def __str__(self) -> str:
        return f"<undecodable {self.column}: {self.reason}>"


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as stored, read back from the database."""

    sequence: int
    job_id: str
    queue: str
    lane: str
    priority: int
    payload: Any
    max_recoveries: int | None
    state: JobState
    outcome: Outcome | None
    failure_reason: str | None
    recovery_count: int
    cancellation_id: str | None
    #: The traceback of a handler that raised (the last
    #: :data:`FAILURE_DETAIL_MAX_LENGTH` characters); None otherwise, and for
    #: jobs settled before revision ``w0002``.
    failure_detail: str | None = None
    #: The job's own requested start (``Job.run_at``), if it has one.
    run_at: datetime | None = None
    #: When it becomes (or became) ready: its ``run_at``, the end of an
    #: enqueue ``delay``, a retry's backoff or a snooze. None when it never waited.
    ready_at: datetime | None = None
    #: The attempt it is on (1 is the first); a retry moves to the next.
    attempt: int = 1
    #: Its own ``max_attempts`` (None: its handler's or runner's policy applies).
    max_attempts: int | None = None
    #: How many times it was snoozed.
    snoozes: int = 0
    #: Its own per-attempt timeout, if it has one.
    timeout: timedelta | None = None
    #: Its own retry policy, if it has one.
    retry: RetryPolicy | None = None
    #: The latest failed attempts (at most ``FAILURE_HISTORY_LENGTH``), oldest first.
    failure_history: tuple[FailedAttempt, ...] = ()
    #: When it was enqueued, by the database clock (None: before revision w0004).
    enqueued_at: datetime | None = None
    #: When its current or last attempt started (None: it never started, or before w0004).
    started_at: datetime | None = None
    #: When it settled (None: not settled, or settled before w0004).
    settled_at: datetime | None = None
    #: The job this one reruns (:meth:`Watchdog.rerun`), if it is a rerun.
    rerun_of: str | None = None
    #: The reruns of this job, by job_id (filled by ``Watchdog.read`` only).
    reruns: tuple[str, ...] = ()
    #: The W3C trace context it was enqueued under (``traceparent``, ...;
    #: see :mod:`sqlalchemy_watchdog.otel`), None when none was recorded.
    trace_context: Mapping[str, str] | None = None
    #: The stored values that could not be decoded (a row written by hand),
    #: empty for a row the library wrote. Each such field reads as unknown:
    #: ``payload`` as the :class:`Undecodable` itself; ``retry`` as the
    #: default policy with the job's stored ``max_attempts``; ``timeout``,
    #: ``trace_context`` and the times as None; ``failure_history`` as ``()``.
    undecodable: tuple[Undecodable, ...] = ()
    #: Its flow-control key (``Job.key``), if it has one.
    key: str | None = None
    #: Filled by ``Watchdog.read`` only, for a queued job of a queue with
    #: limits: the limit that leaves no room for it now (None: none does,
    #: or the job is not queued).
    held_by: HeldBy | None = None
    #: The result a ``completed`` job's handler returned, as stored (its JSON
    #: value: a codec's encoded form); None: none (or the job is not completed).
    result: Any = None
    #: The progress its handler last reported (0 to 1, ``job.progress``),
    #: and its note; None: none reported (a requeue clears it).
    progress: float | None = None
    progress_note: str | None = None
    #: A ``waiting`` job's parents not settled yet (None otherwise).
    waiting_on: int | None = None
    #: Its ``after_policy`` (None: it was enqueued without parents).
    after_policy: str | None = None
    #: Its parents (``Job(after=...)``) by job_id, each with the outcome
    #: counted for it (None: not settled yet); filled by ``Watchdog.read`` only.
    parents: tuple[tuple[str, str | None], ...] = ()
    #: The jobs that wait (or waited) for it; filled by ``Watchdog.read`` only.
    dependents: tuple[str, ...] = ()

    @property
    def cancellation_requested(self) -> bool:
        """Whether a cancellation has been recorded for this job."""
        return self.cancellation_id is not None


class HeldBy(str, enum.Enum):
    """Which limit leaves a queued job no room to start now (:attr:`JobView.held_by`)."""

    #: Its queue runs as many jobs as its ``concurrency`` allows.
    CONCURRENCY = "concurrency"
    #: Its key runs as many jobs as the queue's ``concurrency_per_key`` allows.
    CONCURRENCY_PER_KEY = "concurrency_per_key"
    #: Its queue started as many jobs as its ``rate`` allows in the current window.
    RATE = "rate"
    #: Its key started as many jobs as the queue's ``rate_per_key`` allows in the current window.
    RATE_PER_KEY = "rate_per_key"


# N/[AMOUNT]UNIT in ASCII: \d and \w would take any script's digits and letters.
_RATE_TEXT = re.compile(r"([0-9]+)/([0-9]*)([A-Za-z]+)")

_PERIOD_UNITS = {
    "ms": timedelta(milliseconds=1),
    "millisecond": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "sec": timedelta(seconds=1),
    "second": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "min": timedelta(minutes=1),
    "minute": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "hour": timedelta(hours=1),
    "d": timedelta(days=1),
    "day": timedelta(days=1),
}


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate limit: at most ``count`` of a queue's jobs start (are claimed)
    in any window ``[t, t + per)`` of the database clock -- a sliding,
    half-open window, a start being the job's ``started_at``
    (:meth:`Watchdog.set_limits`; docs/howto/limits.md, "The window, exactly").

    ``count`` is 1 to :data:`LIMIT_MAX`; ``per`` whole milliseconds from 1 ms
    to :data:`RATE_PERIOD_MAX` (a day). :meth:`parse` reads ``"100/minute"``.
    """

    count: int
    per: timedelta

    def __post_init__(self) -> None:
        check_int("rate", self.count, 1, LIMIT_MAX)
        if not isinstance(self.per, timedelta):
            raise InvalidJob("rate", f"per must be a datetime.timedelta, not {type(self.per).__name__}")
        if not RATE_PERIOD_MIN <= self.per <= RATE_PERIOD_MAX:
            raise InvalidJob("rate", f"per must be between {RATE_PERIOD_MIN} and {RATE_PERIOD_MAX}, got {self.per}")
        if self.per % RATE_PERIOD_MIN:
            raise InvalidJob("rate", f"per must be whole milliseconds, got {self.per}")

    @property
    def period_ms(self) -> int:
        """:attr:`per` in milliseconds, as stored."""
        return duration_ms(self.per)

    @classmethod
    def parse(cls, text: str) -> Rate:
        """``"N/PERIOD"``: ``100/minute``, ``10/s``, ``5/30s``, ``1000/2h``
        (units ``ms``, ``s``, ``m``/``min``/``minute``, ``h``/``hour``,
        ``d``/``day``, plurals too; ASCII digits, no space inside);
        :class:`InvalidJob` otherwise."""
        if not isinstance(text, str):
            raise InvalidJob("rate", f"must be a str such as '100/minute', not {type(text).__name__}")
        # ASCII digits and letters only, with no space inside: "5 / s" or "٣/s" is refused, not guessed at.
        match = _RATE_TEXT.fullmatch(text.strip())
        if match is None:
            raise InvalidJob("rate", f"must be N/PERIOD such as '100/minute' or '10/s', got {text!r}")
        count_text, amount_text, unit = match.group(1), match.group(2), match.group(3).lower()
        if unit.endswith("s") and unit[:-1] in _PERIOD_UNITS and unit not in _PERIOD_UNITS:
            unit = unit[:-1]
        if unit not in _PERIOD_UNITS or (amount_text and int(amount_text) == 0) or len(amount_text) > 9:
            raise InvalidJob("rate", f"must be N/PERIOD such as '100/minute' or '10/s', got {text!r}")
        amount = int(amount_text) if amount_text else 1
        if len(count_text) > 9:
            raise InvalidJob("rate", f"count must be between 1 and {LIMIT_MAX}, got {count_text}")
        return cls(int(count_text), _PERIOD_UNITS[unit] * amount)

    def __str__(self) -> str:
        ms = self.period_ms
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if ms % size == 0:
                amount = ms // size
                return f"{self.count}/{'' if amount == 1 else amount}{unit}"
        return f"{self.count}/{ms}ms"


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's limits as stored (:meth:`Watchdog.limits`); None: no such limit.

    Every runner on every host obeys them: at most :attr:`concurrency` of
    the queue's jobs run at once, at most :attr:`concurrency_per_key` of one
    key's, at most :attr:`rate` claims are made in any window of its
    period, and at most :attr:`rate_per_key` claims of one key's jobs in
    any window of that period. A limited queue's claims rotate across keys.
    """

    queue: str
    concurrency: int | None
    concurrency_per_key: int | None
    rate: Rate | None
    #: When they were last set, by the database clock.
    updated_at: datetime
    #: At most this many claims of one key's jobs in any window of its period.
    rate_per_key: Rate | None = None


class PauseStatus(str, enum.Enum):
    """What :meth:`Watchdog.pause` / :meth:`Watchdog.resume` did."""

    PAUSED = "paused"
    ALREADY_PAUSED = "already_paused"
    RESUMED = "resumed"
    NOT_PAUSED = "not_paused"


@dataclass(frozen=True, slots=True)
class QueuePause:
    """A paused queue: no runner claims its jobs until it is resumed."""

    queue: str
    reason: str | None
    #: When the pause committed, by the database clock.
    paused_at: datetime


@dataclass(frozen=True, slots=True)
class QueueStats:
    """How one queue is doing (:meth:`Watchdog.stats`)."""

    queue: str
    #: Jobs by live state.
    delayed: int = 0
    queued: int = 0
    running: int = 0
    #: Running jobs whose lease has ended (their worker is gone or frozen;
    #: recovery takes them).
    expired_leases: int = 0
    #: How long the oldest ready (queued) job has been ready; None when none is queued.
    oldest_ready_age: timedelta | None = None
    #: Jobs settled in the last minute and in the last hour, by outcome.
    settled_last_minute: Mapping[Outcome, int] = field(default_factory=dict)
    settled_last_hour: Mapping[Outcome, int] = field(default_factory=dict)
    #: The pause, if the queue is paused.
    pause: QueuePause | None = None
    #: Live workers serving the queue (registered runners not gone; see
    #: :meth:`Watchdog.workers`).
    workers: int = 0
    #: The queue's limits, if it has any (:meth:`Watchdog.set_limits`).
    limits: QueueLimits | None = None
    #: Claims counted against its rate in the current window (None: no rate limit).
    rate_used: int | None = None
    #: With a per-key rate: the claims of its busiest key in that key's current
    #: window, i.e. how close the nearest key is to its rate (None: no per-key rate).
    rate_per_key_used: int | None = None
    #: Queued jobs no claim could take now because of a limit (0 without limits).
    held_back: int = 0
    #: Jobs waiting for their parents (``Job(after=...)``): not claimable
    #: until released, and not counted in ``queued`` or ``delayed``.
    waiting: int = 0

    @property
    def paused(self) -> bool:
        return self.pause is not None

    @property
    def unserved(self) -> bool:
        """Ready jobs wait and no live worker serves the queue: nothing will
        run them until a worker for it starts."""
        return self.queued > 0 and self.workers == 0


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A registered runner, as :meth:`Watchdog.workers` reads it.

    A runner registers itself when it starts serving (``run_forever``),
    refreshes ``last_seen`` (database clock) and ``running`` with every
    heartbeat and removes its row when it shuts down cleanly. A runner that
    died without shutting down (SIGKILL, a lost host) stops refreshing: once
    it has not been seen for :attr:`gone_after` -- three of its heartbeats
    and 30 seconds -- it is :attr:`gone`; runners prune gone workers an hour
    later. A restarted runner is a new worker (a new ``worker_id``).
    """

    worker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    #: Its wake-up mode as it runs (``Runner.wakeup_status``).
    wakeups: str
    #: The library version it runs.
    version: str
    heartbeat: timedelta
    #: When it started serving, and its last heartbeat (database clock).
    started_at: datetime
    last_seen: datetime
    #: Jobs it held at its last heartbeat: running, or claimed ahead and
    #: waiting for a free slot (so at most ``concurrency + claim_ahead``).
    running: int
    #: The most jobs it claims beyond its concurrency: the process
    #: executor's ``prefetch``, else the cap of the runner's ``claim_ahead``
    #: (0: none). 0 for a runner of a version before revision w0017.
    claim_ahead: int
    #: How long it has not been seen, by the database clock when read.
    silent_for: timedelta
    #: How long without a heartbeat makes it gone.
    gone_after: timedelta
    #: Its queues whose handlers run in child processes (a process
    #: executor); the others run in its own process (threads, or an async
    #: runner's tasks). Empty for a runner of a version before revision w0018.
    process_queues: tuple[str, ...] = ()

    @property
    def gone(self) -> bool:
        """Not seen for longer than :attr:`gone_after`: dead, frozen or cut off."""
        return self.silent_for > self.gone_after

    @property
    def executors(self) -> dict[str, str]:
        """Where each of its queues' handlers run: ``process`` (child
        processes) or ``thread`` (its own process)."""
        processes = set(self.process_queues)
        return {queue: ("process" if queue in processes else "thread") for queue in self.queues}


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A schedule as the runners serving it recorded it (:meth:`Watchdog.schedules`).

    One view per name and definition: two deploys that serve a schedule of
    the same name with different definitions (cron, time zone, queue, the
    jobs' contents) are two views, both :attr:`current` and each
    :attr:`disputed`.
    """

    name: str
    #: A digest of the whole definition.
    fingerprint: str
    cron: str
    timezone: str
    queue: str
    #: Its next slot, and the latest slot a runner enqueued (None: none yet).
    next_slot: datetime | None
    last_enqueued: datetime | None
    #: The worker_id of the runner that recorded it last.
    recorded_by: str
    #: When it was recorded last (database clock).
    last_seen: datetime
    #: Whether a runner served it recently (within 3.5 minutes: runners
    #: record their schedules at least every minute).
    current: bool
    #: Whether another current definition of the same name exists.
    disputed: bool


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of every queue that has live jobs, recent settlements or a pause."""

    #: The database clock when the snapshot was taken.
    at: datetime
    queues: tuple[QueueStats, ...]

    def queue(self, name: str) -> QueueStats:
        """The stats of queue ``name`` (all zero if it has nothing)."""
        for stats in self.queues:
            if stats.queue == name:
                return stats
        return QueueStats(name)


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a runner keeps settled jobs before it prunes them, by outcome.

    None keeps that outcome forever. Pruning frees a ``job_id``: after its
    job is pruned, enqueueing the same ``job_id`` creates a new job.

    :param every: how often the runner prunes (one runner at a time).
    :param batch: rows deleted per statement, so claims never wait long.
    """

    completed: timedelta | None = None
    failed: timedelta | None = None
    cancelled: timedelta | None = None
    outcome_unknown: timedelta | None = None
    interrupted: timedelta | None = None
    every: timedelta = timedelta(minutes=1)
    batch: int = 1000

    def __post_init__(self) -> None:
        for outcome in Outcome:
            age = getattr(self, outcome.value)
            if age is not None:
                check_duration(outcome.value, age)
        check_duration("every", self.every, low=timedelta(seconds=1))
        check_int("batch", self.batch, 1, PRUNE_BATCH_MAX)

    def ages(self) -> dict[Outcome, timedelta]:
        """The outcomes pruned, with their age."""
        return {o: age for o in Outcome if (age := getattr(self, o.value)) is not None}


#: The most rows one prune statement deletes.
PRUNE_BATCH_MAX = 10_000


class EnqueueStatus(str, enum.Enum):
    QUEUED = "queued"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What :func:`~sqlalchemy_watchdog.enqueue` did with one job."""

    job_id: str
    status: EnqueueStatus


class CancelStatus(str, enum.Enum):
    RECORDED = "recorded"
    REPLAYED = "replayed"
    CONFLICT = "conflict"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What a cancellation request did."""

    job_id: str
    status: CancelStatus


class ResultStatus(str, enum.Enum):
    """Where a job's result stands (:class:`JobResult`)."""

    #: Settled ``completed``: :attr:`JobResult.value` is its result.
    COMPLETED = "completed"
    #: Settled ``failed``, ``interrupted`` or ``outcome_unknown``: no result;
    #: :attr:`JobResult.reason` says why.
    FAILED = "failed"
    #: Settled ``cancelled``: no result.
    CANCELLED = "cancelled"
    #: Not started yet (``delayed``, ``queued`` or ``waiting``).
    PENDING = "pending"
    #: A handler is running it.
    RUNNING = "running"
    #: No job has this job_id (never enqueued, purged, or pruned).
    UNKNOWN = "unknown"
    #: :meth:`Watchdog.wait <sqlalchemy_watchdog.Watchdog.wait>` gave up: the
    #: job was not settled within its timeout.
    TIMED_OUT = "timed_out"

    @property
    def final(self) -> bool:
        """Whether the answer can no longer change (the job is settled)."""
        return self in (ResultStatus.COMPLETED, ResultStatus.FAILED, ResultStatus.CANCELLED)


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job's result, or why there is none (:meth:`Watchdog.result
    <sqlalchemy_watchdog.Watchdog.result>`, :meth:`~sqlalchemy_watchdog.Watchdog.wait`)."""

    job_id: str
    status: ResultStatus
    #: The handler's result (decoded by the codec given, if any); None
    #: unless :attr:`status` is ``completed`` (and None when it returned none).
    value: Any = None
    #: The outcome of a settled job.
    outcome: Outcome | None = None
    #: Why a job failed (its failure reason), or was cancelled (None if the
    #: cancellation gave no reason); None otherwise.
    reason: str | None = None

    @property
    def completed(self) -> bool:
        """Whether the job completed (its :attr:`value` is its result)."""
        return self.status is ResultStatus.COMPLETED

    def unwrap(self) -> Any:
        """The value of a completed job.

        :raises ~sqlalchemy_watchdog.WatchdogError: (code ``invalid_input``)
            the job did not complete; the message says why.
        """
        if self.status is ResultStatus.COMPLETED:
            return self.value
        why = f": {self.reason}" if self.reason else ""
        raise InvalidJob("job_id", f"job {self.job_id!r} has no result ({self.status.value}{why})")


_RESULT_STATUS_OF_STATE = {
    JobState.DELAYED: ResultStatus.PENDING,
    JobState.QUEUED: ResultStatus.PENDING,
    JobState.RUNNING: ResultStatus.RUNNING,
}


def result_of(job_id: str, job: JobView | None, codec: PayloadCodec | None = None) -> JobResult:
    """The :class:`JobResult` of the stored ``job`` (None: no such job)."""
    if job is None:
        return JobResult(job_id, ResultStatus.UNKNOWN)
    if job.state is not JobState.SETTLED:
        return JobResult(job_id, _RESULT_STATUS_OF_STATE.get(job.state, ResultStatus.PENDING))
    outcome = job.outcome
    if outcome is Outcome.COMPLETED:
        value = job.result
        if codec is not None and value is not None and not isinstance(value, Undecodable):
            value = codec.decode(value)
        return JobResult(job_id, ResultStatus.COMPLETED, value, outcome)
    if outcome is Outcome.CANCELLED:
        return JobResult(job_id, ResultStatus.CANCELLED, None, outcome, job.failure_reason)
    return JobResult(job_id, ResultStatus.FAILED, None, outcome, job.failure_reason or (outcome and outcome.value))


class SettleStatus(str, enum.Enum):
    SETTLED = "settled"
    #: Not settled: back to ``delayed``/``queued`` for a retry or a snooze.
    REQUEUED = "requeued"
    REPLAYED = "replayed"
    CONFLICT = "conflict"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class LaneFailure:
    """What :meth:`Watchdog.fail_lane` did: one batch of the lane's live jobs."""

    jobs: tuple[JobView, ...]
    more: bool

    @property
    def settled(self) -> int:
        """How many jobs this call settled ``failed``."""
        return len(self.jobs)


#: The largest batch of :meth:`Watchdog.rerun_many` / :meth:`Watchdog.cancel_many`.
BULK_BATCH_MAX = 1000


@dataclass(frozen=True, slots=True)
class BulkSkip:
    """A job a bulk action selected and left alone, and why (in plain words)."""

    job_id: str
    why: str


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What :meth:`Watchdog.rerun_many` or :meth:`Watchdog.cancel_many` did
    (with ``dry_run``: what it selected, changing nothing).

    ``done`` are the jobs acted on now (the reruns' new job_ids; the jobs
    whose cancellation was recorded), ``repeated`` the ones an earlier call
    with the same id had already done (the rerun is a duplicate, the
    cancellation a replay), ``skipped`` the ones left alone.
    """

    matched: int
    done: tuple[str, ...]
    repeated: tuple[str, ...]
    skipped: tuple[BulkSkip, ...]
    #: How many transactions it took (one per batch).
    batches: int
    dry_run: bool


#: The minutes :meth:`Watchdog.throughput` counts (the last hour).
THROUGHPUT_MINUTES = 60


@dataclass(frozen=True, slots=True)
class Throughput:
    """Jobs settled per minute over the last hour, by queue and outcome
    (:meth:`Watchdog.throughput`): what the dashboard's chart draws."""

    #: The database clock when it was read; the last minute ends here.
    at: datetime
    #: ``{queue: {outcome: counts}}``, each ``counts`` a tuple of
    #: :data:`THROUGHPUT_MINUTES` numbers, the oldest minute first; only the
    #: queues and outcomes that settled anything in the hour.
    queues: Mapping[str, Mapping[Outcome, tuple[int, ...]]]

    @property
    def start(self) -> datetime:
        """When the first minute begins (an hour before :attr:`at`)."""
        return self.at - timedelta(minutes=THROUGHPUT_MINUTES)

    def per_minute(self, queue: str | None = None) -> dict[Outcome, tuple[int, ...]]:
        """The counts of ``queue`` (None: every queue added up), by outcome."""
        total: dict[Outcome, list[int]] = {}
        for name, outcomes in self.queues.items():
            if queue is not None and name != queue:
                continue
            for outcome, counts in outcomes.items():
                sums = total.setdefault(outcome, [0] * THROUGHPUT_MINUTES)
                for minute, count in enumerate(counts):
                    sums[minute] += count
        return {outcome: tuple(total[outcome]) for outcome in Outcome if outcome in total}
