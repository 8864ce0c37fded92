"""What a job is: its states and outcomes, the job itself, a handler's
decision, a retry policy, a job read back, and a queue's limits.

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
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..errors import InvalidJob
from .builders import slot_setters
from .encoding import PayloadCodec, at_epoch_ms, duration_ms, encode_payload, epoch_ms
from .uniqueness import ThrottleExcess, UniqueIntent, UniqueStates, check_unique
from .validation import (
    _INT32_MAX,
    AFTER_POLICIES,
    CANCELLATION_ID_MAX_LENGTH,
    FAILURE_HISTORY_LENGTH,
    FAILURE_HISTORY_REASON_LENGTH,
    JOB_ID_MAX_LENGTH,
    KEY_MAX_LENGTH,
    LANE_MAX_LENGTH,
    LIMIT_MAX,
    MAX_ATTEMPTS_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_MAX_LENGTH,
    RATE_PERIOD_MAX,
    RATE_PERIOD_MIN,
    bound_reason,
    check_datetime,
    check_duration,
    check_int,
    check_parents,
    check_text,
)

__all__ = [
    "PRUNE_BATCH_MAX",
    "UNDECODABLE_REASON_LENGTH",
    "Decision",
    "FailedAttempt",
    "HeldBy",
    "Job",
    "JobState",
    "JobView",
    "Outcome",
    "QueueLimits",
    "Rate",
    "Retention",
    "RetryPolicy",
    "Undecodable",
    "bulk_cancellation_id",
    "history_of",
    "history_with",
    "job_batch",
    "rerun_job_id",
    "set_after",
]


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
    :param unique_key: the key of ``unique_for``, ``debounce`` or
        ``throttle`` (1-256 characters): jobs enqueued with the same key are
        judged together (docs/howto/uniqueness.md). Not part of the job's
        identity, nor are the options below.
    :param unique_for: a later enqueue with the same ``unique_key`` within
        this period of this one (by the database clock) is a ``duplicate``
        of it (:attr:`EnqueueResult.job_id` is this job's), while this job
        is in one of ``unique_states``.
    :param unique_states: ``"any"`` (the default: the whole period, settled
        or not), ``"unsettled"`` (until it settles) or ``"waiting"`` (until
        a runner claims it); see :class:`~sqlalchemy_watchdog.UniqueStates`.
    :param debounce: enqueueing again with the same ``unique_key`` while
        this job still waits replaces its payload (status ``replaced``) and
        moves its start to now + ``debounce``; the job starts ``debounce``
        after the last such enqueue.
    :param max_wait: with ``debounce``: the job starts at most this long
        after its first enqueue, however often it is replaced.
    :param throttle: at most one job per ``unique_key`` per this period.
    :param throttle_excess: what happens to an enqueue beyond that:
        ``"drop"`` (the default: a ``duplicate``) or ``"delay"`` (it waits
        for the next period; see :class:`~sqlalchemy_watchdog.ThrottleExcess`).
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
    #: Uniqueness, debounce and throttle (see the parameters above).
    unique_key: str | None = None
    unique_for: timedelta | None = None
    unique_states: UniqueStates | None = None
    debounce: timedelta | None = None
    max_wait: timedelta | None = None
    throttle: timedelta | None = None
    throttle_excess: ThrottleExcess | None = None
    #: The options above as the store applies them (None: none given).
    unique: UniqueIntent | None = field(init=False, repr=False, compare=False)

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
        unique_key: str | None = None,
        unique_for: timedelta | None = None,
        unique_states: UniqueStates | str | None = None,
        debounce: timedelta | None = None,
        max_wait: timedelta | None = None,
        throttle: timedelta | None = None,
        throttle_excess: ThrottleExcess | str | None = None,
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
        intent: UniqueIntent | None = None
        states: UniqueStates | None = None
        excess: ThrottleExcess | None = None
        if not (
            unique_key is None and unique_for is None and unique_states is None and debounce is None
            and max_wait is None and throttle is None and throttle_excess is None
        ):  # fmt: skip
            intent, states, excess = check_unique(
                unique_key=unique_key, unique_for=unique_for, unique_states=unique_states, debounce=debounce,
                max_wait=max_wait, throttle=throttle, throttle_excess=throttle_excess,
                has_run_at=run_at is not None, has_parents=bool(parents),
            )  # fmt: skip
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
        _set_unique_key(self, unique_key)
        _set_unique_for(self, unique_for)
        _set_unique_states(self, states)
        _set_debounce(self, debounce)
        _set_max_wait(self, max_wait)
        _set_throttle(self, throttle)
        _set_throttle_excess(self, excess)
        _set_unique(self, intent)

    def __post_init__(self) -> None:
        # Not called by Job's own __init__: a dataclass subclass's generated
        # __init__ sets the fields and calls this, so its jobs are checked and
        # encoded like any other.
        Job.__init__(
            self, self.job_id, self.queue, lane=self.lane, priority=self.priority, payload=self.payload,
            max_recoveries=self.max_recoveries, run_at=self.run_at, retry=self.retry, timeout=self.timeout,
            rerun_of=self.rerun_of, key=self.key, codec=self.codec, after=self.after, after_policy=self.after_policy,
            unique_key=self.unique_key, unique_for=self.unique_for, unique_states=self.unique_states,
            debounce=self.debounce, max_wait=self.max_wait, throttle=self.throttle,
            throttle_excess=self.throttle_excess,
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


(
    _set_job_id, _set_queue, _set_lane, _set_priority, _set_payload, _set_max_recoveries, _set_run_at,
    _set_retry, _set_timeout, _set_rerun_of, _set_key, _set_codec, _set_payload_json, _set_after, _set_after_policy,
    _set_unique_key, _set_unique_for, _set_unique_states, _set_debounce, _set_max_wait, _set_throttle,
    _set_throttle_excess, _set_unique,
) = slot_setters(Job, (
    "job_id", "queue", "lane", "priority", "payload", "max_recoveries", "run_at",
    "retry", "timeout", "rerun_of", "key", "codec", "payload_json", "after", "after_policy",
    "unique_key", "unique_for", "unique_states", "debounce", "max_wait", "throttle", "throttle_excess", "unique",
))  # fmt: skip


#: Set a checked ``after`` on a copy of a job (workflows.py: a step made to
#: wait for the step before it).
set_after = _set_after


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
