"""Jobs, decisions and the results of queue operations.

Everything here is a small frozen value. :class:`Job` validates its fields
when it is built, so bad input is refused before any SQL runs.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import InvalidJob

if TYPE_CHECKING:
    from .codecs import PayloadCodec

__all__ = [
    "JOB_ID_MAX_LENGTH",
    "QUEUE_MAX_LENGTH",
    "LANE_MAX_LENGTH",
    "CANCELLATION_ID_MAX_LENGTH",
    "FAILURE_REASON_MAX_LENGTH",
    "PAYLOAD_MAX_BYTES",
    "PAYLOAD_MAX_DEPTH",
    "PRIORITY_MIN",
    "PRIORITY_MAX",
    "JobState",
    "Outcome",
    "Job",
    "Decision",
    "JobView",
    "EnqueueStatus",
    "EnqueueResult",
    "CancelStatus",
    "CancelResult",
    "SettleStatus",
    "LaneFailure",
    "encode_payload",
]

JOB_ID_MAX_LENGTH = 256
QUEUE_MAX_LENGTH = 256
#: A 256-character identity plus a prefix such as ``team-key:`` still fits.
LANE_MAX_LENGTH = 512
CANCELLATION_ID_MAX_LENGTH = 256
#: Failure reasons are cut to this many characters before they are stored.
FAILURE_REASON_MAX_LENGTH = 2000
#: The longest traceback kept with a failed job (its last characters are kept).
FAILURE_DETAIL_MAX_LENGTH = 8000
#: The largest payload accepted, measured as its canonical UTF-8 JSON text.
PAYLOAD_MAX_BYTES = 1024 * 1024
#: The deepest nesting of arrays and objects accepted in a payload.
PAYLOAD_MAX_DEPTH = 64
PRIORITY_MIN = -(2**63)
PRIORITY_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1


class JobState(str, enum.Enum):
    """Where a job is in its life: ``queued`` → ``running`` → ``settled``."""

    QUEUED = "queued"
    RUNNING = "running"
    SETTLED = "settled"


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
        raise InvalidJob(
            field_name, f"must be 1 to {max_length} characters long, got {len(value)}"
        )
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


def _check_json(value: Any) -> None:
    """Refuse anything that is not strict JSON, without recursion.

    Strings are not looked into here: a lone surrogate in any of them (keys
    included) makes the encoded text fail UTF-8 encoding in
    :func:`encode_payload`, which checks the whole text once.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, (str, bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidJob("payload", f"must be strict JSON; {item!r} is not a JSON number")
            continue
        if depth >= PAYLOAD_MAX_DEPTH:
            raise InvalidJob("payload", f"must nest at most {PAYLOAD_MAX_DEPTH} levels deep")
        if isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidJob(
                        "payload",
                        f"object keys must be str, not {type(key).__name__} ({key!r})",
                    )
                stack.append((child, depth + 1))
        else:
            raise InvalidJob(
                "payload", f"must be strict JSON; {type(item).__name__} is not a JSON type"
            )


#: Canonical payload JSON: sorted keys, fixed separators, strict numbers.
_PAYLOAD_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def encode_payload(payload: Any) -> str:
    """Validate ``payload`` and return its canonical JSON text.

    Keys are sorted and separators fixed, so equal payloads always encode to
    the same text and an identical replay is recognised as a duplicate.
    """
    _check_json(payload)
    try:
        text = _PAYLOAD_ENCODER.encode(payload)
    except (TypeError, ValueError) as error:  # e.g. a read-only mapping, a 5,000-digit int
        raise InvalidJob("payload", f"cannot be encoded as JSON: {error}") from None
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidJob("payload", "strings must be valid Unicode (no lone surrogates)") from None
    if size > PAYLOAD_MAX_BYTES:
        raise InvalidJob("payload", f"must be at most {PAYLOAD_MAX_BYTES} bytes of JSON, got {size}")
    return text


@dataclass(frozen=True, slots=True)
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
    :param codec: an optional :class:`~sqlalchemy_watchdog.PayloadCodec`
        (e.g. :class:`~sqlalchemy_watchdog.TaggedJSON`): ``payload`` is
        replaced by ``codec.encode(payload)`` before it is validated, so
        :attr:`payload` holds the JSON form that is stored. The codec is not
        part of the job's identity: jobs whose encoded payloads are equal
        are the same job (an identical replay).
    """

    job_id: str
    queue: str
    _: KW_ONLY
    lane: str | None = None
    priority: int = 0
    payload: Any = None
    max_recoveries: int | None = None
    codec: PayloadCodec | None = field(default=None, repr=False, compare=False)
    payload_json: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_text("job_id", self.job_id, JOB_ID_MAX_LENGTH)
        check_text("queue", self.queue, QUEUE_MAX_LENGTH)
        if self.lane is None:
            object.__setattr__(self, "lane", self.queue)
        check_text("lane", self.lane, LANE_MAX_LENGTH)
        check_int("priority", self.priority, PRIORITY_MIN, PRIORITY_MAX)
        if self.max_recoveries is not None:
            check_int("max_recoveries", self.max_recoveries, 0, _INT32_MAX)
        if self.codec is not None:
            object.__setattr__(self, "payload", _encoded(self.codec, self.payload))
        object.__setattr__(self, "payload_json", encode_payload(self.payload))


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
        raise InvalidJob(
            "payload", f"{type(codec).__name__}.encode failed: {type(error).__name__}: {error}"
        ) from None


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

    Use the constructors: :meth:`completed`, :meth:`failed`,
    :meth:`outcome_unknown`.
    """

    outcome: Outcome
    reason: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.outcome, Outcome) or self.outcome not in _DECIDABLE:
            raise InvalidJob(
                "decision",
                f"outcome must be one of {sorted(o.value for o in _DECIDABLE)}, got {self.outcome!r}",
            )
        if self.reason is not None:
            if not isinstance(self.reason, str):
                raise InvalidJob("reason", f"must be a str, not {type(self.reason).__name__}")
            object.__setattr__(self, "reason", bound_reason(self.reason))

    @classmethod
    def completed(cls) -> Decision:
        """The job did what it should."""
        return cls(Outcome.COMPLETED)

    @classmethod
    def failed(cls, reason: str) -> Decision:
        """The job failed, for ``reason``."""
        return cls(Outcome.FAILED, reason)

    @classmethod
    def outcome_unknown(cls, reason: str | None = None) -> Decision:
        """The side effect may or may not have happened."""
        return cls(Outcome.OUTCOME_UNKNOWN, reason)


_DECIDABLE = frozenset({Outcome.COMPLETED, Outcome.FAILED, Outcome.OUTCOME_UNKNOWN})


def bound_reason(reason: str) -> str:
    """Cut a failure reason to :data:`FAILURE_REASON_MAX_LENGTH` and strip NULs."""
    reason = reason.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")
    if len(reason) > FAILURE_REASON_MAX_LENGTH:
        reason = reason[: FAILURE_REASON_MAX_LENGTH - 1] + "…"
    return reason


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

    @property
    def cancellation_requested(self) -> bool:
        """Whether a cancellation has been recorded for this job."""
        return self.cancellation_id is not None


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


class SettleStatus(str, enum.Enum):
    SETTLED = "settled"
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
