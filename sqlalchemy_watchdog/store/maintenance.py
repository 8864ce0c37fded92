"""Retention, listing, stats, pauses, reruns, workers, schedules, bulk actions, and testing's make_due.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from ..backends import backend_of
from ..errors import InvalidJob
from ..jobs import (
    BULK_BATCH_MAX,
    CANCELLATION_ID_MAX_LENGTH,
    JOB_ID_MAX_LENGTH,
    LANE_MAX_LENGTH,
    PAUSE_REASON_MAX_LENGTH,
    PRUNE_BATCH_MAX,
    QUEUE_MAX_LENGTH,
    BulkResult,
    BulkSkip,
    CancelStatus,
    EnqueueResult,
    EnqueueStatus,
    Job,
    JobState,
    JobView,
    Outcome,
    PauseStatus,
    QueuePause,
    QueueStats,
    ScheduleView,
    Stats,
    WorkerView,
    at_epoch_ms,
    bulk_cancellation_id,
    check_aware,
    check_duration,
    check_int,
    check_text,
    duration_ms,
    epoch_ms,
    rerun_job_id,
)
from ..records import ScheduleRecord as ScheduleRecord
from ..records import WorkerRegistration as WorkerRegistration
from ..wakeups import EVENT_QUEUED, EVENT_STOP
from . import enqueue_sql, maintenance_sql
from .base import (
    view,
)
from .claims import (
    cancel,
    notify,
    read,
)
from .dependencies import relations
from .enqueue import (
    _row,
    enqueue,
)
from .job_signals import forget_orphan_signals
from .job_steps import forget_orphan_steps
from .limits import held_by, queue_use, read_limits
from .operation import Shape, operation
from .unique import prune_keys
from .views import write_returning

log = logging.getLogger("sqlalchemy_watchdog.store")


# -- operations: retention, listing, stats, pauses, reruns ------------------------

#: The largest page :func:`list_jobs` returns.
LIST_LIMIT_MAX = 1000
#: The largest ``sequence`` (a 64-bit signed integer): no job's is greater.
SEQUENCE_MAX = 2**63 - 1


def check_outcomes(outcomes: object) -> list[str] | None:
    """Outcome filters as stored values (None: every outcome)."""
    if outcomes is None:
        return None
    if isinstance(outcomes, (str, Outcome)):
        outcomes = [outcomes]
    if not isinstance(outcomes, Iterable):
        raise InvalidJob("outcomes", f"must be an iterable of outcomes, not {type(outcomes).__name__}")
    values = [_member(Outcome, "outcomes", outcome) for outcome in outcomes]
    if not values:
        raise InvalidJob("outcomes", "must name at least one outcome (None prunes every outcome)")
    return sorted(set(values))


@dataclass(frozen=True, slots=True)
class Pruning:
    """A checked ``prune`` request: what to delete, in batches of ``batch``."""

    older_than: timedelta
    outcomes: list[str] | None
    limit: int | None
    batch: int
    include_undated: bool

    @classmethod
    def of(
        cls,
        older_than: object,
        outcomes: object,
        limit: object,
        batch: object,
        include_undated: object,
    ) -> Pruning:
        """Check every argument before anything is deleted."""
        values = check_outcomes(outcomes)
        age = check_duration("older_than", older_than, low=timedelta(0))
        size = check_int("batch", batch, 1, PRUNE_BATCH_MAX)
        total = None if limit is None else check_int("limit", limit, 1, 2**63 - 1)
        if not isinstance(include_undated, bool):
            raise InvalidJob("include_undated", f"must be a bool, not {type(include_undated).__name__}")
        return cls(age, values, total, size, include_undated)

    def next_batch(self, deleted: int) -> int:
        """The size of the next batch after ``deleted`` rows (0: done)."""
        return self.batch if self.limit is None else min(self.batch, self.limit - deleted)

    @operation(Shape.WRITE)
    def run_batch(self, conn: Connection, size: int) -> int:
        """One batch of jobs (how many it deleted), and as many ended unique keys."""
        prune_keys(conn, limit=size)
        forget_orphan_steps(conn, limit=size)  # steps of jobs deleted earlier (revision w0021)
        forget_orphan_signals(conn, limit=size)  # and their signals (revision w0022)
        return prune_batch(
            conn, older_than=self.older_than, outcomes=self.outcomes, limit=size, include_undated=self.include_undated
        )


@operation(Shape.WRITE)
def prune_batch(
    conn: Connection,
    *,
    older_than: timedelta,
    outcomes: Sequence[str] | None = None,
    limit: int = 1000,
    include_undated: bool = False,
) -> int:
    """Delete at most ``limit`` settled jobs that settled more than
    ``older_than`` ago by the database clock (of ``outcomes``, default
    every outcome; with ``include_undated`` also those with no recorded
    time), outcome by outcome, each the oldest first; returns how many."""
    check_duration("older_than", older_than, low=timedelta(0))
    check_int("limit", limit, 1, PRUNE_BATCH_MAX)
    backend = backend_of(conn)
    deleted = 0
    for outcome in outcomes if outcomes is not None else [o.value for o in Outcome]:
        for undated in (True, False) if include_undated else (False,):
            if deleted >= limit:
                return deleted
            params = {"outcome": outcome, "age_ms": duration_ms(older_than), "limit": limit - deleted}
            if backend.writes_return_rows:
                deleted += conn.execute(maintenance_sql.prune(backend, undated), params).rowcount
                continue
            # MariaDB/MySQL: the picked jobs locked, then deleted by key (a DELETE
            # reading the edges would clash with the trigger deleting theirs, 1442).
            keys = [row[0] for row in conn.execute(maintenance_sql.prune_pick(backend, undated), params)]
            if keys:
                deleted += conn.execute(maintenance_sql.delete_settled(), {"keys": keys}).rowcount
    return deleted


#: The key of the PostgreSQL advisory lock one pruning runner holds.
PRUNE_LOCK_KEY = 0x5741_5443_4844_4F47 & 0x7FFF_FFFF_FFFF_FFFF  # "WATCHDOG"


@operation(Shape.TRANSACTION)
def prune_retention(conn: Connection, ages: Mapping[str, timedelta], batch: int) -> int | None:
    """One runner's retention pass: one batch per outcome of ``ages``, in one
    transaction (:data:`NEEDS_TRANSACTION`).

    On PostgreSQL it runs only if its transaction gets the advisory lock
    (another runner pruning at the same moment makes this one skip: None);
    the lock is the transaction's, never the session's, so it is correct
    behind a pooler in transaction mode and ends with the commit. On SQLite
    every batch holds the write lock, which is exclusive anyway.
    Returns how many jobs were deleted, or None when another runner prunes.
    """
    if (
        backend_of(conn).advisory_xact_lock
        and not conn.execute(maintenance_sql.try_advisory_xact_lock(), {"key": PRUNE_LOCK_KEY}).scalar()
    ):
        return None
    prune_keys(conn, limit=batch)  # unique keys a day past their window (revision w0020)
    forget_orphan_steps(conn, limit=batch)  # steps of jobs deleted earlier (revision w0021)
    forget_orphan_signals(conn, limit=batch)  # and their signals (revision w0022)
    return sum(prune_batch(conn, older_than=age, outcomes=[outcome], limit=batch) for outcome, age in ages.items())


def _member(kind: type[JobState] | type[Outcome], field: str, value: object) -> str:
    """``value`` as a stored member of ``kind``, or a clear error naming ``field``."""
    try:
        return str(kind(value).value)
    except ValueError:
        known = ", ".join(member.value for member in kind)
        raise InvalidJob(field, f"{value!r} is not a known {kind.__name__} (known: {known})") from None


def prefix_upper_bound(prefix: str) -> str | None:
    """The least text greater than every text starting with ``prefix``, in
    code point order: its last character the next code point (surrogates
    skipped). None when there is none to say (a last character U+10FFFF)."""
    last = ord(prefix[-1])
    if last >= 0x10FFFF:
        return None
    following = 0xE000 if 0xD800 <= last + 1 <= 0xDFFF else last + 1
    return prefix[:-1] + chr(following)


def sorts_by_code_point(conn: Connection) -> bool:
    """Whether ``watchdog_jobs.job_id`` -- and so ``uq_watchdog_jobs_job_id`` --
    sorts by code point here, so that the jobs starting with a prefix are one
    range of it: always on SQLite (``BINARY``: UTF-8 bytes); on PostgreSQL
    when the column's collation is the database's and that one is ``C``,
    ``POSIX`` or ``C.UTF-8`` (libc) or the builtin provider's, never under a
    linguistic collation (glibc's ``en_US.UTF-8``, ICU). Asked once per
    database and remembered."""
    return backend_of(conn).sorts_by_code_point(conn, lambda: conn.execute(maintenance_sql.job_id_collation()).first())


@operation(Shape.READ)
def list_jobs(
    conn: Connection,
    *,
    queue: str | None = None,
    state: JobState | str | None = None,
    outcome: Outcome | str | None = None,
    lane: str | None = None,
    job_id_prefix: str | None = None,
    limit: int = 100,
    after_sequence: int = 0,
    before_sequence: int | None = None,
    newest_first: bool = False,
    with_payload: bool = True,
) -> list[JobView]:
    """Jobs between ``after_sequence`` and ``before_sequence`` (keyset
    paging) in admission order, or newest first; without ``with_payload``
    their payloads are not read (None)."""
    params: dict[str, Any] = {
        "limit": check_int("limit", limit, 1, LIST_LIMIT_MAX),
        "after_sequence": check_int("after_sequence", after_sequence, 0, SEQUENCE_MAX),
        "before_sequence": SEQUENCE_MAX
        if before_sequence is None
        else check_int("before_sequence", before_sequence, 1, SEQUENCE_MAX),
    }
    if not isinstance(newest_first, bool):
        raise InvalidJob("newest_first", f"must be a bool, not {type(newest_first).__name__}")
    if queue is not None:
        params["queue"] = check_text("queue", queue, QUEUE_MAX_LENGTH)
    if state is not None:
        params["state"] = _member(JobState, "state", state)
    if outcome is not None:
        params["outcome"] = _member(Outcome, "outcome", outcome)
    if lane is not None:
        params["lane"] = check_text("lane", lane, LANE_MAX_LENGTH)
    if job_id_prefix is not None:
        params["job_id_prefix"] = check_text("job_id_prefix", job_id_prefix, JOB_ID_MAX_LENGTH)
    if job_id_prefix is not None and (high := prefix_upper_bound(job_id_prefix)) and sorts_by_code_point(conn):
        # A marker (its values are the two below); SQLite's planner is told to read it first.
        params[backend_of(conn).prefix_range_marker] = True
        params["job_id_low"], params["job_id_high"] = job_id_prefix, high
    filters = tuple(
        f"state={params.pop('state')}" if name == "state" else name
        for name in maintenance_sql.LIST_FILTERS
        if name in params
    )
    params.pop("job_id_range", None)
    params.pop("job_id_range_first", None)
    if not isinstance(with_payload, bool):
        raise InvalidJob("with_payload", f"must be a bool, not {type(with_payload).__name__}")
    return [view(row) for row in conn.execute(maintenance_sql.list_jobs(filters, with_payload, newest_first), params)]


@operation(Shape.READ)
def stats(conn: Connection) -> Stats:
    """Every queue's counts, recent outcomes, oldest ready age and pause."""
    clock = conn.execute(maintenance_sql.stats_clock()).scalar_one()
    queues: dict[str, dict[str, Any]] = {}

    def entry(queue: str) -> dict[str, Any]:
        return queues.setdefault(queue, {"minute": {}, "hour": {}})

    for queue, state, count, since in conn.execute(maintenance_sql.live_counts()):
        e = entry(queue)
        e[state] = count
        if state == JobState.QUEUED.value and since is not None:
            try:
                e["oldest_ready_age"] = timedelta(milliseconds=max(0, clock - since))
            except (OverflowError, TypeError):  # a ready time written by hand, out of range: unknown
                pass
    for queue, count in conn.execute(maintenance_sql.waiting_counts()):
        entry(queue)["waiting"] = count
    for queue, count in conn.execute(maintenance_sql.expired_counts()):
        entry(queue)["expired_leases"] = count
    for queue, outcome, last_minute, last_hour in conn.execute(maintenance_sql.recent_outcomes()):
        e = entry(queue)
        e["minute"][Outcome(outcome)] = int(last_minute or 0)
        e["hour"][Outcome(outcome)] = int(last_hour)
    for queue, reason, paused_at in conn.execute(maintenance_sql.paused_queues()):
        entry(queue)["pause"] = QueuePause(queue, reason, at_epoch_ms(paused_at))
    serving = live_workers_per_queue(conn)
    uses = {limits.queue: queue_use(conn, limits) for limits in read_limits(conn)}
    for queue in uses:
        entry(queue)
    result = []
    for queue in sorted(queues):
        e = queues[queue]
        result.append(
            QueueStats(
                queue,
                delayed=e.get(JobState.DELAYED.value, 0),
                queued=e.get(JobState.QUEUED.value, 0),
                running=e.get(JobState.RUNNING.value, 0),
                expired_leases=e.get("expired_leases", 0),
                oldest_ready_age=e.get("oldest_ready_age"),
                settled_last_minute={o: n for o, n in e["minute"].items() if n},
                settled_last_hour=dict(e["hour"]),
                pause=e.get("pause"),
                workers=serving.get(queue, 0),
                limits=None if queue not in uses else uses[queue].limits,
                rate_used=None if queue not in uses else uses[queue].rate_used,
                rate_per_key_used=None if queue not in uses else uses[queue].rate_per_key_used,
                held_back=0 if queue not in uses else uses[queue].held_back,
                waiting=e.get("waiting", 0),
            )
        )
    return Stats(at_epoch_ms(clock), tuple(result))


# -- workers and schedules (revision w0009) ---------------------------------------

#: A worker is gone once it has not been seen for this many of its heartbeats
#: plus :data:`WORKER_GONE_MARGIN_MS` (a heartbeat late by a slow database or
#: a busy host is not a death): the bound is per worker, so a runner with a
#: long heartbeat is judged by its own period.
WORKER_GONE_HEARTBEATS = 3
WORKER_GONE_MARGIN_MS = 30_000
#: Gone workers are shown as gone this long, then pruned by the runners.
WORKER_KEEP_GONE_MS = 3_600_000
#: Recorded schedules not seen this long are forgotten.
SCHEDULE_KEEP_MS = 7 * 86_400_000
#: A recorded schedule is current when seen this recently (runners record
#: theirs at least every minute).
SCHEDULE_CURRENT_MS = 210_000
#: Rows each prune of workers or schedules deletes at most.
WORKER_PRUNE_BATCH = 100


def _gone_after_ms(heartbeat_ms: int) -> int:
    return heartbeat_ms * WORKER_GONE_HEARTBEATS + WORKER_GONE_MARGIN_MS


def registration_params(registration: WorkerRegistration, running: int) -> dict[str, Any]:
    """The registration as the statement's parameters, cut to the columns' bounds."""
    from ..model import HOST_MAX_LENGTH, VERSION_MAX_LENGTH, WAKEUPS_MAX_LENGTH

    encoded = _names(registration.queues)
    return {
        "worker_id": registration.worker_id,
        "host": registration.host[:HOST_MAX_LENGTH] or "?",
        "pid": max(0, registration.pid),
        "queues": encoded,
        "concurrency": max(1, registration.concurrency),
        "wakeups": registration.wakeups[:WAKEUPS_MAX_LENGTH] or "?",
        "version": registration.version[:VERSION_MAX_LENGTH] or "?",
        "heartbeat_ms": max(1, registration.heartbeat_ms),
        "running": max(0, running),
        "claim_ahead": max(0, registration.claim_ahead),
        "process_queues": _names(registration.process_queues),
    }


def _names(names: tuple[str, ...]) -> str:
    """``names`` as a JSON array, cut to what the column holds."""
    from ..model import WORKER_QUEUES_MAX_LENGTH

    kept = list(names)
    encoded = json.dumps(kept, ensure_ascii=False)
    while len(encoded) > WORKER_QUEUES_MAX_LENGTH and kept:  # thousands of long names: keep what fits
        kept.pop()
        encoded = json.dumps(kept, ensure_ascii=False)
    return encoded


@operation(Shape.WRITE)
def register_worker(conn: Connection, registration: WorkerRegistration, running: int = 0) -> None:
    """Register the worker, or refresh its ``last_seen`` and ``running`` (one
    statement, database clock; a row pruned meanwhile comes back)."""
    conn.execute(maintenance_sql.register_worker(backend_of(conn)), registration_params(registration, running))


@operation(Shape.WRITE)
def deregister_worker(conn: Connection, worker_id: str) -> None:
    """Remove the worker's row (a clean shutdown)."""
    conn.execute(maintenance_sql.deregister_worker(), {"worker_id": worker_id})


def _queues_of(encoded: str) -> tuple[str, ...]:
    try:
        value = json.loads(encoded)
    except ValueError:  # written by hand: shown as it is
        return (encoded,)
    return tuple(str(queue) for queue in value) if isinstance(value, list) else (encoded,)


@operation(Shape.READ)
def workers(conn: Connection) -> list[WorkerView]:
    """Every registered worker, oldest first; gone ones say so."""
    result = []
    for row in conn.execute(maintenance_sql.list_workers()).mappings():
        heartbeat_ms = row["heartbeat_ms"]
        result.append(
            WorkerView(
                worker_id=row["worker_id"],
                host=row["host"],
                pid=row["pid"],
                queues=_queues_of(row["queues"]),
                concurrency=row["concurrency"],
                wakeups=row["wakeups"],
                version=row["version"],
                heartbeat=timedelta(milliseconds=heartbeat_ms),
                started_at=at_epoch_ms(row["started_at"]),
                last_seen=at_epoch_ms(row["last_seen"]),
                running=row["running"],
                claim_ahead=row["claim_ahead"],
                process_queues=_queues_of(row["process_queues"]),
                silent_for=timedelta(milliseconds=max(0, row["now"] - row["last_seen"])),
                gone_after=timedelta(milliseconds=_gone_after_ms(heartbeat_ms)),
            )
        )
    return result


@operation(Shape.READ)
def live_workers_per_queue(conn: Connection) -> dict[str, int]:
    """How many live (not gone) workers serve each queue."""
    counts: dict[str, int] = {}
    for (encoded,) in conn.execute(maintenance_sql.live_worker_queues(WORKER_GONE_HEARTBEATS, WORKER_GONE_MARGIN_MS)):
        for queue in set(_queues_of(encoded)):
            counts[queue] = counts.get(queue, 0) + 1
    return counts


@operation(Shape.WRITE)
def prune_workers(conn: Connection, limit: int = WORKER_PRUNE_BATCH) -> int:
    """Delete at most ``limit`` workers gone for over an hour and ``limit``
    recorded schedules not seen for a week; returns how many rows. Never
    touches a job."""
    workers_deleted = conn.execute(
        maintenance_sql.prune_workers(backend_of(conn), WORKER_GONE_HEARTBEATS, WORKER_GONE_MARGIN_MS),
        {"keep_ms": WORKER_KEEP_GONE_MS, "limit": limit},
    ).rowcount
    schedules_deleted = conn.execute(
        maintenance_sql.prune_schedules(backend_of(conn)), {"keep_ms": SCHEDULE_KEEP_MS, "limit": limit}
    ).rowcount
    return int(workers_deleted or 0) + int(schedules_deleted or 0)


@operation(Shape.WRITE)
def record_schedules(conn: Connection, records: Sequence[ScheduleRecord], recorded_by: str) -> None:
    """Record the schedules a runner serves (one row per name and definition)."""
    if not records:
        return
    conn.execute(
        maintenance_sql.record_schedule(backend_of(conn)),
        [
            {
                "name": record.name,
                "fingerprint": record.fingerprint,
                "cron": record.cron,
                "timezone": record.timezone,
                "queue": record.queue,
                "next_slot": record.next_slot_ms,
                "last_enqueued": record.last_enqueued_ms,
                "recorded_by": recorded_by,
            }
            for record in records
        ],
    )


@operation(Shape.READ)
def schedules(conn: Connection) -> list[ScheduleView]:
    """Every recorded schedule by name, its most recently seen definition first."""
    rows = list(conn.execute(maintenance_sql.list_schedules()).mappings())
    current = {
        (row["name"], row["fingerprint"]) for row in rows if row["now"] - row["last_seen"] <= SCHEDULE_CURRENT_MS
    }
    definitions: dict[str, int] = {}
    for name, _ in current:
        definitions[name] = definitions.get(name, 0) + 1
    return [
        ScheduleView(
            name=row["name"],
            fingerprint=row["fingerprint"],
            cron=row["cron"],
            timezone=row["timezone"],
            queue=row["queue_name"],
            next_slot=None if row["next_slot"] is None else at_epoch_ms(row["next_slot"]),
            last_enqueued=None if row["last_enqueued"] is None else at_epoch_ms(row["last_enqueued"]),
            recorded_by=row["recorded_by"],
            last_seen=at_epoch_ms(row["last_seen"]),
            current=(row["name"], row["fingerprint"]) in current,
            disputed=(row["name"], row["fingerprint"]) in current and definitions[row["name"]] > 1,
        )
        for row in rows
    ]


@operation(Shape.WRITE)
def pause(conn: Connection, queue: str, reason: str | None = None) -> PauseStatus:
    """Pause ``queue``: from the commit on no claim takes its jobs."""
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    if reason is not None:
        check_text("reason", reason, PAUSE_REASON_MAX_LENGTH)
    params = {"queue": queue, "reason": reason}
    backend = backend_of(conn)
    if not backend.writes_return_rows:
        return _pause_by_key(conn, params)
    row = conn.execute(maintenance_sql.pause(backend), params).first()
    return PauseStatus.PAUSED if row is not None else PauseStatus.ALREADY_PAUSED


def _pause_by_key(conn: Connection, params: dict[str, Any]) -> PauseStatus:
    """:func:`pause` where writes return no rows (no ``ON CONFLICT``): the
    pause is read under a lock, and inserted if there is none. A concurrent
    pause of the same queue makes the INSERT wait and fail as a duplicate
    key (only that statement undone); the pause is then there to read."""
    if conn.execute(maintenance_sql.locked_pause(backend_of(conn)), params).first() is not None:
        return PauseStatus.ALREADY_PAUSED
    try:
        conn.execute(maintenance_sql.insert_pause(), params)
    except IntegrityError:
        if conn.execute(maintenance_sql.locked_pause(backend_of(conn)), params).first() is None:
            raise
        return PauseStatus.ALREADY_PAUSED
    return PauseStatus.PAUSED


@operation(Shape.WRITE)
def resume(conn: Connection, queue: str) -> PauseStatus:
    """Resume ``queue``; idle runners are woken (NOTIFY on PostgreSQL)."""
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    if backend_of(conn).writes_return_rows:
        resumed = conn.execute(maintenance_sql.resume(), {"queue": queue}).first() is not None
    else:
        resumed = conn.execute(maintenance_sql.delete_pause(), {"queue": queue}).rowcount > 0
    if not resumed:
        return PauseStatus.NOT_PAUSED
    notify(conn, EVENT_QUEUED)
    return PauseStatus.RESUMED


@operation(Shape.READ)
def read_with_reruns(conn: Connection, job_id: str) -> JobView | None:
    """:func:`read`, with the job's reruns, parents and dependents listed."""
    job = read(conn, job_id)
    if job is None:
        return None
    reruns = tuple(conn.execute(maintenance_sql.reruns_of(), {"job": job_id}).scalars())
    held = held_by(conn, job)
    parents, dependents = relations(conn, job_id)
    if reruns or held or parents or dependents:
        return dataclasses.replace(job, reruns=reruns, held_by=held, parents=parents, dependents=dependents)
    return job


@operation(Shape.READ)
def read_with_pause(conn: Connection, job_id: str) -> tuple[JobView, QueuePause | None] | None:
    """:func:`read_with_reruns`, and its queue's pause if it is paused (one read transaction)."""
    job = read_with_reruns(conn, job_id)
    if job is None:
        return None
    for queue, reason, paused_at in conn.execute(maintenance_sql.paused_queues()):
        if queue == job.queue:
            return job, QueuePause(queue, reason, at_epoch_ms(paused_at))
    return job, None


#: The longest ``rerun_id`` accepted.
RERUN_ID_MAX_LENGTH = 128


@operation(Shape.WRITE)
def rerun(conn: Connection, job_id: str, rerun_id: str) -> EnqueueResult:
    """Enqueue a copy of settled job ``job_id`` as a new job (see
    :func:`~sqlalchemy_watchdog.jobs.rerun_job_id`); the same call again is
    a duplicate."""
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    check_text("rerun_id", rerun_id, RERUN_ID_MAX_LENGTH)
    original = read(conn, job_id)
    if original is None:
        raise InvalidJob("job_id", f"no job {job_id!r} to rerun")
    if original.state is not JobState.SETTLED:
        raise InvalidJob("job_id", f"job {job_id!r} is {original.state.value}; only a settled job can be rerun")
    return enqueue(conn, [_rerun_copy(original, rerun_id)])[0]


# -- bulk actions --------------------------------------------------------------


class BulkKind(str, enum.Enum):
    RERUN = "rerun"
    CANCEL = "cancel"


_MS_MIN, _MS_MAX = -(2**63), 2**63 - 1


def _time_bound(field: str, value: object) -> int:
    """An aware datetime bound as epoch milliseconds, or a clear error."""
    ms = epoch_ms(check_aware(field, value))
    if not _MS_MIN <= ms <= _MS_MAX:  # pragma: no cover - datetime cannot reach it
        raise InvalidJob(field, f"is out of range: {value!r}")
    return ms


@dataclass(frozen=True, slots=True)
class BulkAction:
    """A checked :meth:`Watchdog.rerun_many` / ``cancel_many`` request: which
    jobs (``params`` of :func:`maintenance_sql.bulk_pick`), what to do to them,
    in batches of ``batch``, at most ``limit`` of them."""

    kind: BulkKind
    #: The ``rerun_id`` or the bulk ``cancellation_id``.
    action_id: str
    filters: tuple[str, ...]
    params: Mapping[str, Any]
    batch: int
    limit: int | None
    dry_run: bool
    only_if_queued: bool = False

    @classmethod
    def of(
        cls,
        kind: BulkKind,
        action_id: object,
        *,
        queue: object = None,
        lane: object = None,
        outcome: object = None,
        settled_after: object = None,
        settled_before: object = None,
        enqueued_after: object = None,
        enqueued_before: object = None,
        batch: object = 100,
        limit: object = None,
        dry_run: object = False,
        only_if_queued: object = False,
    ) -> BulkAction:
        """Check every argument before anything is read or written: a bad one
        raises :class:`InvalidJob` naming it."""
        if kind is BulkKind.RERUN:
            action = check_text("rerun_id", action_id, RERUN_ID_MAX_LENGTH)
        else:
            action = check_text("cancellation_id", action_id, CANCELLATION_ID_MAX_LENGTH)
            for field, value in (("outcome", outcome), ("settled_after", settled_after)):
                if value is not None:
                    raise InvalidJob(field, "cancel_many selects live jobs, which have not settled: no outcome or time")
            if settled_before is not None:
                raise InvalidJob("settled_before", "cancel_many selects live jobs, which have not settled")
        params: dict[str, Any] = {}
        if queue is not None:
            params["queue"] = check_text("queue", queue, QUEUE_MAX_LENGTH)
        if lane is not None:
            params["lane"] = check_text("lane", lane, LANE_MAX_LENGTH)
        if outcome is not None:
            params["outcomes"] = check_outcomes(outcome)
        times = {
            "settled_after": settled_after,
            "settled_before": settled_before,
            "enqueued_after": enqueued_after,
            "enqueued_before": enqueued_before,
        }
        for field, value in times.items():
            if value is not None:
                params[field] = _time_bound(field, value)
        for what in ("settled", "enqueued"):
            after, before = params.get(f"{what}_after"), params.get(f"{what}_before")
            if after is not None and before is not None and after >= before:
                raise InvalidJob(f"{what}_before", f"must be later than {what}_after (the range is empty)")
        if not params:
            raise InvalidJob(
                "filter",
                "a bulk action needs at least one of queue, lane, outcome or a time range (it never selects every job)",
            )
        size = check_int("batch", batch, 1, BULK_BATCH_MAX)
        total = None if limit is None else check_int("limit", limit, 1, 2**63 - 1)
        for field, flag in (("dry_run", dry_run), ("only_if_queued", only_if_queued)):
            if not isinstance(flag, bool):
                raise InvalidJob(field, f"must be a bool, not {type(flag).__name__}")
        filters = tuple(name for name in maintenance_sql.BULK_FILTERS if name in params)
        return cls(kind, action, filters, params, size, total, bool(dry_run), bool(only_if_queued))

    def next_size(self, matched: int) -> int:
        """The size of the next batch after ``matched`` jobs (0: done)."""
        return self.batch if self.limit is None else min(self.batch, self.limit - matched)


@dataclass(frozen=True, slots=True)
class BulkStep:
    """What one batch did: the last sequence it read (None: nothing left)."""

    last_sequence: int | None
    #: Rows the batch read (its own copies included); fewer than asked: the last batch.
    picked: int
    matched: int
    done: tuple[str, ...] = ()
    repeated: tuple[str, ...] = ()
    skipped: tuple[BulkSkip, ...] = ()


class BulkProgress:
    """The running total of a bulk action's batches (the client's loop)."""

    def __init__(self, action: BulkAction) -> None:
        self.action = action
        self.after = 0
        self.matched = 0
        self.batches = 0
        self.done: list[str] = []
        self.repeated: list[str] = []
        self.skipped: list[BulkSkip] = []

    def add(self, step: BulkStep, size: int) -> bool:
        """Fold in one batch of ``size``; whether another may follow."""
        self.batches += 1
        self.matched += step.matched
        self.done += step.done
        self.repeated += step.repeated
        self.skipped += step.skipped
        if step.last_sequence is None or step.picked < size:
            return False
        self.after = step.last_sequence
        return True

    def result(self) -> BulkResult:
        return BulkResult(
            self.matched,
            tuple(self.done),
            tuple(self.repeated),
            tuple(self.skipped),
            self.batches,
            self.action.dry_run,
        )


@operation(Shape.READ)
def newest_sequence(conn: Connection) -> int:
    """The greatest sequence there is (0: no job): where a bulk action stops,
    so the jobs it creates are never selected by itself."""
    return int(conn.execute(maintenance_sql.newest_sequence()).scalar() or 0)


@operation(Shape.TRANSACTION)
def bulk_batch(conn: Connection, action: BulkAction, after: int, end: int, size: int) -> BulkStep:
    """One batch of a bulk action, in one transaction: the next ``size``
    selected jobs with ``after < sequence <= end``, acted on (or, dry run,
    counted)."""
    params = {**action.params, "after_sequence": after, "before_sequence": end + 1, "limit": size}
    rows = conn.execute(maintenance_sql.bulk_pick(backend_of(conn), action.kind.value, action.filters), params).all()
    if action.kind is BulkKind.CANCEL:
        # Revision w0014: the waiting jobs too (cancel settles them at once),
        # from their own index, merged in admission order.
        waiting = conn.execute(maintenance_sql.bulk_pick_waiting(action.filters), params).all()
        if waiting:
            rows = sorted([*rows, *waiting], key=lambda row: int(row[0]))[:size]
    if not rows:
        return BulkStep(None, 0, 0)
    last = rows[-1][0]
    if action.kind is BulkKind.CANCEL:
        return _cancel_batch(conn, action, [row[1] for row in rows], last)
    return _rerun_batch(conn, action, [view(row) for row in rows], last)


def _rerun_copy(original: JobView, rerun_id: str) -> Job:
    """The copy :func:`rerun` enqueues; InvalidJob when the original cannot be copied."""
    for unknown in original.undecodable:
        if unknown.field in ("payload", "retry", "timeout"):  # what the copy would carry
            raise InvalidJob(
                "job_id", f"job {original.job_id!r} cannot be rerun: its stored {unknown.column} is undecodable"
            )
    return Job(
        rerun_job_id(original.job_id, rerun_id),
        original.queue,
        lane=original.lane,
        priority=original.priority,
        payload=original.payload,
        max_recoveries=original.max_recoveries,
        retry=original.retry,
        timeout=original.timeout,
        rerun_of=original.job_id,
        key=original.key,
    )


def _rerun_batch(conn: Connection, action: BulkAction, originals: list[JobView], last: int) -> BulkStep:
    copies: list[Job] = []
    skipped: list[BulkSkip] = []
    for original in originals:
        if original.rerun_of is not None and original.job_id == rerun_job_id(original.rerun_of, action.action_id):
            continue  # a copy this very rerun_id made: never copied again
        try:
            copies.append(_rerun_copy(original, action.action_id))
        except InvalidJob as error:
            skipped.append(BulkSkip(original.job_id, str(error).split(": ", 1)[1]))
    matched = len(copies) + len(skipped)
    if action.dry_run or not copies:
        return BulkStep(last, len(originals), matched, skipped=tuple(skipped))
    # A job_id taken by a job with other contents: skipped, never a failed batch.
    stored = {
        row.job_id: row._asdict()
        for row in conn.execute(enqueue_sql.stored_contents(), {"job_ids": [copy.job_id for copy in copies]})
    }
    fresh: list[Job] = []
    repeated: list[str] = []
    for copy in copies:
        row = stored.get(copy.job_id)
        if row is None:
            fresh.append(copy)
        elif row == _row(copy):
            repeated.append(copy.job_id)
        else:
            skipped.append(BulkSkip(copy.rerun_of or "", f"its rerun's job_id {copy.job_id!r} is another job's"))
    done: list[str] = []
    if fresh:
        for result in enqueue(conn, fresh):
            (done if result.status is EnqueueStatus.QUEUED else repeated).append(result.job_id)
    return BulkStep(last, len(originals), matched, tuple(done), tuple(repeated), tuple(skipped))


def _cancel_batch(conn: Connection, action: BulkAction, job_ids: list[str], last: int) -> BulkStep:
    if action.dry_run:
        return BulkStep(last, len(job_ids), len(job_ids))
    done: list[str] = []
    repeated: list[str] = []
    skipped: list[BulkSkip] = []
    for job_id in job_ids:
        cancellation_id = bulk_cancellation_id(action.action_id, job_id)
        result = cancel(conn, job_id, cancellation_id, only_if_queued=action.only_if_queued)
        if result.status is CancelStatus.RECORDED:
            done.append(job_id)
        elif result.status is CancelStatus.REPLAYED:
            repeated.append(job_id)
        elif result.status is CancelStatus.MISSING:
            skipped.append(BulkSkip(job_id, "deleted meanwhile (purged)"))
        else:
            skipped.append(
                BulkSkip(
                    job_id,
                    "settled meanwhile, "
                    + ("running, " if action.only_if_queued else "")
                    + "or already cancelled by another request",
                )
            )
    if done:
        notify(conn, EVENT_STOP)
    return BulkStep(last, len(job_ids), len(job_ids), tuple(done), tuple(repeated), tuple(skipped))


# -- testing only ------------------------------------------------------------


@operation(Shape.WRITE)
def make_due(conn: Connection, queues: Iterable[str] | None = None) -> int:
    """FOR TESTS ONLY: make every delayed job whose time has not come (of
    ``queues``; None: of every queue) due now, by the database clock -- a
    future ``run_at``, an enqueue's ``delay``, a retry's backoff, a snooze.
    They stay ``delayed`` until the next promotion (any runner's tick) makes
    them ``queued``. Returns how many jobs were changed.

    It rewrites the jobs' ``ready_at``, so it has no place in production:
    :func:`sqlalchemy_watchdog.testing.drain` (``advance_time=True``) runs it
    to play a test's delayed jobs without waiting.
    """
    if queues is None:
        return len(write_returning(conn, maintenance_sql.make_due(False), {}))
    if isinstance(queues, str):
        raise InvalidJob("queues", "must be an iterable of queue names, not one string")
    names = [check_text("queue", queue, QUEUE_MAX_LENGTH) for queue in queues]
    if not names:
        return 0
    return len(write_returning(conn, maintenance_sql.make_due(True), {"queues": names}))


@operation(Shape.READ)
def waiting_jobs(conn: Connection, queues: Sequence[str], limit: int = 10) -> list[tuple[str, str]]:
    """FOR TESTS ONLY: up to ``limit`` jobs of ``queues`` still waiting to
    run (delayed, or queued in a queue not paused), as (job_id, state)."""
    if not queues:
        return []
    rows = conn.execute(maintenance_sql.waiting_jobs(), {"queues": list(queues), "limit": limit})
    return [(job_id, state) for job_id, state in rows]
