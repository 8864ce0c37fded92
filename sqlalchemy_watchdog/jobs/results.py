"""What queue operations return: small frozen results and their statuses.

An enqueue's, a cancellation's or a settle's status, a job's result, a bulk
action's outcome, and the read models of the queues, the workers and the
schedules (:meth:`Watchdog.stats <sqlalchemy_watchdog.Watchdog.stats>` and
its siblings).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..errors import InvalidJob
from .encoding import PayloadCodec
from .types import JobState, JobView, Outcome, QueueLimits, Undecodable

__all__ = [
    "BULK_BATCH_MAX",
    "THROUGHPUT_MINUTES",
    "BulkResult",
    "BulkSkip",
    "CancelResult",
    "CancelStatus",
    "EnqueueResult",
    "ReplaceResult",
    "ReplaceStatus",
    "EnqueueStatus",
    "JobResult",
    "LaneFailure",
    "PauseStatus",
    "QueuePause",
    "QueueStats",
    "ResultStatus",
    "ScheduleView",
    "SettleStatus",
    "Stats",
    "Throughput",
    "WorkerView",
    "result_of",
]


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


class EnqueueStatus(str, enum.Enum):
    """What an enqueue did with one job (:class:`EnqueueResult`)."""

    #: Written: the job is new.
    QUEUED = "queued"
    #: Nothing written: the job is stored already (an identical replay of
    #: its ``job_id``), or -- with a ``unique_key`` -- the key's holder
    #: absorbed it (``unique_for``, ``throttle``): ``job_id`` is the holder's.
    DUPLICATE = "duplicate"
    #: ``debounce``: the key's holder, still waiting, took this job's
    #: payload and a later start; ``job_id`` is the holder's.
    REPLACED = "replaced"


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What :func:`~sqlalchemy_watchdog.enqueue` did with one job."""

    #: The job now standing for it: its own, or the holder of its ``unique_key``.
    job_id: str
    status: EnqueueStatus
    #: The job's ``unique_key`` when it had one (the key that decided), else None.
    unique_key: str | None = None


class ReplaceStatus(str, enum.Enum):
    """What :meth:`Watchdog.replace <sqlalchemy_watchdog.Watchdog.replace>` did."""

    #: The job was waiting (delayed, queued, or waiting for parents) and now
    #: has the new payload and start.
    REPLACED = "replaced"
    #: A runner claimed it already (or it settled): nothing was changed.
    NOT_WAITING = "not_waiting"
    #: No such job (never enqueued, purged or pruned).
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class ReplaceResult:
    """What a replacement of a waiting job did."""

    job_id: str
    status: ReplaceStatus


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
