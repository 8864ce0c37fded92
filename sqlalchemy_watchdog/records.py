"""The records the runner's core and the store exchange.

What a claim took (:class:`Claim`, :class:`ClaimBatch`), what the core asks
a settle to write (:class:`SettleRequest`), what a recovery or a promotion
did, a runner's row and its schedules' records, and what a tick did. They
sit below both the core (:mod:`sqlalchemy_watchdog.core`, which names the
operations it needs in :mod:`sqlalchemy_watchdog.core.ports`) and the store
(:mod:`sqlalchemy_watchdog.store`, which performs them): neither imports
the other for them. They hold values only -- no statement, no connection.
The store re-exports each under its old name.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .errors import ErrorCode, InvalidJob, WatchdogError
from .jobs import Decision, JobState, JobView, Outcome, encode_result

__all__ = [
    "PROGRESS_NOTE_MAX_LENGTH",
    "PROMOTE_BATCH",
    "PROPAGATE_BATCH",
    "Claim",
    "ClaimBatch",
    "ParentResult",
    "Promotion",
    "Recovery",
    "RecoveryCause",
    "RecoveryStatus",
    "ScheduleRecord",
    "SettleRequest",
    "StopReason",
    "TickResult",
    "TickStatus",
    "WorkerRegistration",
]

#: The longest progress note kept (``job.progress(note=...)``; the
#: ``progress_note`` column's width).
PROGRESS_NOTE_MAX_LENGTH = 500
#: Delayed jobs made queued per promotion statement.
PROMOTE_BATCH = 1000
#: Jobs whose dependents one propagate call tells (one hop of a cascade).
PROPAGATE_BATCH = 100


@dataclass(frozen=True, slots=True)
class Promotion:
    """What one promotion did: how many delayed jobs became queued, and in
    how many seconds the next delayed job is due (None: none is delayed)."""

    promoted: int
    next_in: float | None


@dataclass(frozen=True, slots=True)
class Claim:
    """A job this process claimed, with the secret token that settles it."""

    job: JobView
    token: str


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    """What one claim statement took: jobs to run, and jobs it found cancelled."""

    claimed: tuple[Claim, ...]
    cancelled: tuple[JobView, ...]
    #: A limit held the claim back: a limited queue had more jobs queued than
    #: it let the claim take (room frees only when one of its jobs ends).
    held_back: bool = False


@dataclass(frozen=True, slots=True)
class SettleRequest:
    """One settle of a batch: the exact claim and what its handler decided.

    ``now`` is the application clock (epoch milliseconds) when the handler
    returned; the database clock is consulted too (the later one counts).
    """

    job_id: str
    claim_token: str
    decision: Decision
    now: int | None = None
    #: The traceback of a handler that raised, kept with a ``failed`` job.
    detail: str | None = None
    #: Requeue instead of settling (a retry or a snooze): ready again this
    #: many milliseconds after the database clock. None settles the job
    #: with ``decision.outcome``.
    requeue_after_ms: int | None = None
    #: The failure history to store (JSON), when this attempt failed.
    history: str | None = None
    #: The result to keep with a ``completed`` job, as canonical JSON
    #: (:func:`~sqlalchemy_watchdog.jobs.encode_result`). None: the
    #: decision's own ``result`` encoded without a codec (the runner's core
    #: passes its codec's encoding here instead), or none.
    result_json: str | None = None
    #: The attempt's last progress that the rate limit kept back, written
    #: with the settlement: (fraction, note); None: none pending.
    progress: tuple[float, str | None] | None = None
    #: Give the claim back instead (a job claimed ahead that never started):
    #: queued again at once, no attempt or snooze counted, the job's failure
    #: reason and detail as they were (these). ``decision`` is then unused.
    given_back: tuple[str | None, str | None] | None = None
    #: A snooze of a handler waiting for this signal (``job.wait_for``;
    #: revision w0022): after the snooze, in the same transaction, the job is
    #: made ``queued`` at once if the signal is kept by then.
    waits_for: str | None = None

    def __post_init__(self) -> None:
        # Checked once, where the request is made: the runner's core builds
        # its requests from a Decision it checked already; a direct caller
        # of settle()/settle_many() gets the same refusal, before any write.
        if not isinstance(self.decision, Decision):
            raise WatchdogError(
                ErrorCode.INVALID_INPUT,
                f"decision: must be a Decision, not {type(self.decision).__name__}",
            )
        if self.result_json is not None and (
            self.decision.outcome is not Outcome.COMPLETED or self.requeue_after_ms is not None
        ):
            raise WatchdogError(ErrorCode.INVALID_INPUT, "result_json: only a completed settle keeps a result")
        if self.result_json is None and self.decision.result is not None and self.given_back is None:
            # The Decision's result reaches the statement whoever settles: the
            # runner's core encodes it with its codec (and turns a refusal into
            # a failed job); a direct caller's request encodes it here with the
            # default codec, and a value that cannot be kept refuses the whole
            # request (InvalidJob naming ``result``) before anything is written.
            if self.requeue_after_ms is not None:
                raise InvalidJob("result", "a requeued settle keeps no result")
            object.__setattr__(self, "result_json", encode_result(self.decision.result))


class RecoveryStatus(str, enum.Enum):
    """What recovering one disappeared claim did."""

    #: Back in the queue, its recovery count one higher.
    REQUEUED = "requeued"
    #: Settled: ``interrupted`` (no budget left), or ``cancelled``.
    SETTLED = "settled"
    #: Somebody else recovered, renewed or settled it first; nothing changed.
    LOST_RACE = "lost_race"


class RecoveryCause(str, enum.Enum):
    """Why a claim is being recovered; an ``interrupted`` job's reason says which."""

    #: Its lease ended: the worker died, froze or lost its database.
    VANISHED = "vanished"
    #: Its runner shut down and the handler outlived the grace period.
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class Recovery:
    """What recovering one disappeared claim did."""

    job_id: str
    status: RecoveryStatus
    job: JobView | None
    #: Revision w0019: requeued because it was claimed ahead and its handler
    #: never started -- no recovery counted, whatever the budget.
    unstarted: bool = False
    #: Revision w0022: requeued, its recovery budget spent, for one run that
    #: runs the undos of its recorded steps (recovery would have settled it
    #: ``interrupted``); its ``undo:`` marker recorded with the requeue, no recovery counted.
    compensating: bool = False


@dataclass(frozen=True, slots=True)
class ParentResult:
    """One parent of a job as its handler reads it (``job.parent_results()``)."""

    job_id: str
    #: None: the parent is gone (pruned while no live job waited for it).
    state: JobState | None
    outcome: Outcome | None
    #: Its result (the stored JSON form), None for none.
    result: Any


@dataclass(frozen=True, slots=True)
class WorkerRegistration:
    """What a runner writes of itself to ``watchdog_workers`` (cut to the
    columns' bounds, so registering never fails on a long host name)."""

    worker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    wakeups: str
    version: str
    heartbeat_ms: int
    #: The most jobs it claims beyond ``concurrency`` (0: none).
    claim_ahead: int = 0
    #: Its queues whose handlers run in child processes.
    process_queues: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """What a runner records of a schedule it serves."""

    name: str
    fingerprint: str
    cron: str
    timezone: str
    queue: str
    next_slot_ms: int | None
    last_enqueued_ms: int | None


class StopReason(str, enum.Enum):
    """Why a running handler was asked to stop."""

    CANCELLED = "cancelled"
    LANE_FAILED = "lane_failed"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    #: The attempt outlived its timeout; it counts as a failed attempt.
    TIMEOUT = "timeout"


class TickStatus(str, enum.Enum):
    """What one tick of a runner did."""

    IDLE = "idle"
    SETTLED = "settled"
    RECOVERED = "recovered"
    REQUEUED = "requeued"
    REJECTED = "rejected"
    LIVENESS_UNKNOWN = "liveness_unknown"


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one :meth:`Runner.tick` did, and the job it settled if any."""

    status: TickStatus
    job: JobView | None = None
    job_id: str | None = None
