"""Reads of one job, the claim life cycle and recovery.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from ..backends import backend_of
from ..columns import position
from ..errors import ErrorCode, WatchdogError
from ..jobs import (
    CANCELLATION_ID_MAX_LENGTH,
    FAILURE_DETAIL_MAX_LENGTH,
    JOB_ID_MAX_LENGTH,
    LANE_MAX_LENGTH,
    QUEUE_MAX_LENGTH,
    CancelResult,
    CancelStatus,
    Decision,
    JobState,
    JobView,
    LaneFailure,
    Outcome,
    SettleStatus,
    bound_reason,
    check_int,
    check_text,
    duration_ms,
)
from ..jobs.durable import COMPENSATION_MARK
from ..records import Claim as Claim
from ..records import ClaimBatch as ClaimBatch
from ..records import Promotion as Promotion
from ..records import Recovery as Recovery
from ..records import RecoveryCause as RecoveryCause
from ..records import RecoveryStatus as RecoveryStatus
from ..records import SettleRequest as SettleRequest
from ..wakeups import room_freed_at_commit
from . import claims_sql, job_steps_sql, limits_sql, maintenance_sql, sql
from .base import (
    _OUTCOMES,
    LANE_FAILURE_BATCH,
    NO_POLICY_REASON,
    PROMOTE_BATCH,
    STATEMENT_CHARS_MAX,
    new_claim_token,
    now_ms,
    sized_chunks,
    unreadable_columns,
    view,
)
from .dependencies import tell
from .job_signals import wake_snoozed
from .limits import claim_queue, limited_queues
from .operation import Shape, operation
from .views import execute_rows, write_returning

log = logging.getLogger("sqlalchemy_watchdog.store")


# -- reads -------------------------------------------------------------------


@operation(Shape.READ)
def read(conn: Connection, job_id: str) -> JobView | None:
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    row = conn.execute(claims_sql.read_job(), {"job": job_id}).first()
    return None if row is None else view(row)


@operation(Shape.READ)
def read_claim(conn: Connection, job_id: str) -> tuple[JobView, str | None] | None:
    """The job and its current claim token (private to the runner)."""
    row = conn.execute(claims_sql.read_job(), {"job": job_id}).first()
    return None if row is None else (view(row), row.claim_token)


@operation(Shape.READ)
def read_queue_head(conn: Connection, queue: str) -> JobView | None:
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    row = conn.execute(claims_sql.read_queue_head(), {"queue": queue}).first()
    return None if row is None else view(row)


@operation(Shape.READ)
def read_settled(conn: Connection, limit: int, after_sequence: int = 0) -> list[JobView]:
    check_int("limit", limit, 1, 256)
    check_int("after_sequence", after_sequence, 0, 2**63 - 1)
    params = {"limit": limit, "after_sequence": after_sequence}
    return [view(row) for row in conn.execute(claims_sql.read_settled(), params)]


@operation(Shape.READ)
def has_pending_work(conn: Connection) -> bool:
    return conn.execute(claims_sql.has_pending_work()).first() is not None


@operation(Shape.READ)
def count_ready(conn: Connection, queues: Sequence[str], cap: int) -> int:
    """How many queued jobs of ``queues`` wait, counted up to ``cap``."""
    return int(conn.execute(claims_sql.count_ready(), {"queues": list(queues), "cap": cap}).scalar_one())


# -- the claim life cycle ----------------------------------------------------


@operation(Shape.READ)
def next_ready_in(conn: Connection) -> float | None:
    """Seconds until the earliest delayed job is due by the database clock
    (0 when one is due now; None when none is delayed)."""
    ready_at, clock = conn.execute(claims_sql.next_ready()).one()
    if ready_at is None:
        return None
    seconds: float = max(0.0, (ready_at - clock) / 1000.0)
    return seconds


def _promote_peek(conn: Connection, *, limit: int = PROMOTE_BATCH) -> Promotion | None:
    """Look first, without the write lock: usually nothing is due."""
    due = next_ready_in(conn)
    return Promotion(0, due) if due is None or due > 0 else None


@operation(Shape.WRITE, peek=_promote_peek)
def promote(conn: Connection, *, limit: int = PROMOTE_BATCH) -> Promotion:
    """Make up to ``limit`` due delayed jobs ``queued`` (the earliest first)."""
    due = next_ready_in(conn)
    if due is None or due > 0:
        return Promotion(0, due)
    backend = backend_of(conn)
    if backend.writes_return_rows:
        promoted = len(conn.execute(claims_sql.promote(backend), {"limit": limit}).all())
    else:  # a locking read, then a write by key
        keys = [row[0] for row in conn.execute(claims_sql.promote_pick(backend), {"limit": limit})]
        promoted = conn.execute(claims_sql.promote_by_key(), {"keys": keys}).rowcount if keys else 0
    return Promotion(promoted, next_ready_in(conn))


def _claim_peek(
    conn: Connection, *, queues: Sequence[str] | None, limit: int = 1, lease_ms: int, ahead: bool = False
) -> ClaimBatch | None:
    """An empty batch when no job of ``queues`` is queued at all, read
    without the write lock (a claim that finds nothing must not queue for
    the lock); None to claim."""
    params = {} if queues is None else {"queues": list(queues)}
    found = conn.execute(claims_sql.any_queued(queues is not None), params).first()
    return ClaimBatch((), ()) if found is None else None


@operation(Shape.WRITE, peek=_claim_peek)
def claim(
    conn: Connection,
    *,
    queues: Sequence[str] | None,
    limit: int = 1,
    lease_ms: int,
    ahead: bool = False,
) -> ClaimBatch:
    """Claim up to ``limit`` ready jobs of ``queues`` (all queues if None),
    leased for ``lease_ms`` from the database clock.

    ``ahead``: the runner claims ahead of its free slots -- every job taken
    is marked ``unstarted`` until :func:`start` records that its handler is
    about to start (recovery requeues a job still marked without counting a
    recovery)."""
    token = new_claim_token()
    distinct = None if queues is None else list(dict.fromkeys(queues))
    if distinct is not None and not distinct:
        return ClaimBatch((), ())
    rows: list[Sequence[Any]] = []
    held = False
    limited = limited_queues(conn)
    if limited:
        # The limited queues first, each within its limits in a transaction
        # of its own (store/limits.py); then the plain claim takes the rest
        # of the batch from the others (its statement skips limited queues).
        names = sorted(limited if distinct is None else limited.intersection(distinct))
        plain = []
        for queue in names:
            if len(rows) >= limit:
                break
            taken = claim_queue(conn, queue, limit=limit - len(rows), lease_ms=lease_ms, token=token, ahead=ahead)
            if taken is None:  # its limits were cleared meanwhile: claimed the plain way
                plain.append(queue)
            else:
                rows.extend(taken.rows)
                held = held or taken.held
        if distinct is not None:
            distinct = [queue for queue in distinct if queue not in limited] + plain
            if not distinct:
                return _batch(conn, rows, held)
    if len(rows) >= limit:
        return _batch(conn, rows, held)
    batch = limit - len(rows)
    params: dict[str, Any] = {"token": token, "lease_ms": lease_ms, "limit": batch}
    # A batch size up to LITERAL_LIMIT_MAX is written into the statement's
    # text (one prepared statement, planned once, per size: see claims_sql.claim).
    sized = sql.size_in_text(batch)
    backend = backend_of(conn)
    if distinct is None and not backend.writes_return_rows:
        # Each queue read in claim order (claims_sql.queued_queues).
        distinct = list(conn.execute(claims_sql.queued_queues()).scalars())
        if not distinct:
            return _batch(conn, rows, held)
    queue_count = None if distinct is None else len(distinct)
    if distinct is not None:
        params.update(sql.queue_params(distinct))
    if backend.writes_return_rows:
        rows.extend(execute_rows(conn, claims_sql.claim(backend, queue_count, sized, ahead), params))
    else:
        rows.extend(_claim_by_key(conn, claims_sql.claim_pick(backend, queue_count, sized), params, ahead))
    return _batch(conn, rows, held)


def _claim_by_key(conn: Connection, pick: Any, params: dict[str, Any], ahead: bool) -> list[Sequence[Any]]:
    """The claim where a write returns no rows (MariaDB/MySQL), in the
    caller's transaction: the pick locks the rows it returns, skipping rows
    another claimer holds (``FOR UPDATE SKIP LOCKED``, each queue read in
    its index's order, so it locks only the rows it takes); one UPDATE by
    primary key takes them, guarded on their state; they are read back."""
    keys = [row[0] for row in conn.execute(pick, params)]
    if not keys:
        return []
    write = {"keys": keys, "token": params["token"], "lease_ms": params["lease_ms"]}
    conn.execute(claims_sql.claim_by_key(ahead), write)
    return list(conn.execute(claims_sql.read_by_key(), {"keys": keys}))


# Where a row read by columns.JOB_COLUMNS holds what the store reads
# without building the job's view.
_SEQUENCE = position("sequence")
_JOB_ID = position("job_id")
_QUEUE = position("queue_name")
_PRIORITY = position("priority")
_STATE = position("state")
_OUTCOME = position("outcome")
_TOKEN = position("claim_token")
_SETTLED_STATE = JobState.SETTLED.value


def _batch(conn: Connection, found: Sequence[Sequence[Any]], held_back: bool = False) -> ClaimBatch:
    """The claim statements' rows as a batch (jobs found cancelled apart)."""
    # By priority, then admission.
    rows = sorted(found, key=lambda r: (-r[_PRIORITY] if type(r[_PRIORITY]) is int else 0, r[_SEQUENCE]))
    claimed: list[Claim] = []
    cancelled: list[JobView] = []
    for row in rows:
        job = view(row)
        # Text that is not UTF-8 (SQLite) is always listed undecodable by
        # view(), so a row without any is not scanned again column by column.
        if job.undecodable and row[_TOKEN] is not None and (columns := unreadable_columns(row)):
            # Its job_id may not read back as stored, so no settle by job_id
            # could find it. Failed here, by key.
            failed = {
                "key": row[_SEQUENCE],
                "token": row[_TOKEN],
                "why": f"stored value unreadable: {', '.join(columns)}",
            }
            cancelled.extend(view(settled) for settled in write_returning(conn, claims_sql.settle_unreadable(), failed))
            continue
        if job.state is JobState.RUNNING:
            claimed.append(Claim(job, row[_TOKEN]))
        elif job.state is JobState.SETTLED:
            cancelled.append(job)
        else:  # pragma: no cover - the CHECK grammar forbids it
            raise WatchdogError(ErrorCode.CLAIM_UNAVAILABLE, f"claim returned {job.state}")
    if cancelled:  # settled from queued (or running): their dependents are told
        tell(conn, [(job.job_id, None if job.outcome is None else job.outcome.value) for job in cancelled])
    return ClaimBatch(tuple(claimed), tuple(cancelled), held_back)


def settle_row(request: SettleRequest) -> tuple[Any, ...]:
    """The request in :data:`sql.SETTLE_FIELDS` order."""
    if request.given_back is not None:
        reason, detail = request.given_back
        return (request.job_id, request.claim_token, None, reason, detail, 0, 0, 0, None, None, None, None)
    decision = request.decision
    delay = request.requeue_after_ms
    if delay is None and decision.snoozed:
        assert decision.after is not None
        delay = duration_ms(decision.after)
    requeued = delay is not None
    return (
        request.job_id,
        request.claim_token,
        None if requeued or decision.outcome is None else decision.outcome.value,
        decision.reason,
        _detail(request),
        delay,
        1 if requeued and not decision.snoozed else 0,
        1 if requeued and decision.snoozed else 0,
        request.history,
        request.result_json,
        *((None, None) if request.progress is None else request.progress),
    )


class Settlement:
    """What one settle did, and the job as it now is.

    A settle statement's row becomes a :class:`JobView` only when ``job`` is
    first read: a busy runner reads it only to log or trace the settle."""

    __slots__ = ("_job", "_row", "status")

    def __init__(self, status: SettleStatus, job: JobView | None = None, *, row: Sequence[Any] | None = None) -> None:
        self.status = status
        self._job = job
        self._row = row

    @property
    def outcome(self) -> Outcome | None:
        """The settled job's outcome, read without building its view."""
        row = self._row
        if row is not None:
            return _OUTCOMES.get(row[_OUTCOME])
        return None if self._job is None else self._job.outcome

    @property
    def job(self) -> JobView | None:
        row = self._row
        if row is not None:
            self._job = view(row)
            self._row = None
        return self._job

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settlement):
            return NotImplemented
        return self.status is other.status and self.job == other.job

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Settlement(status={self.status!r}, job={self.job!r})"


@operation(Shape.WRITE)
def settle(
    conn: Connection,
    *,
    job_id: str,
    claim_token: str,
    decision: Decision,
    now: int | None = None,
) -> Settlement:
    """Settle the exact claim; see :func:`limits_sql.settle`."""
    return settle_many(conn, [SettleRequest(job_id, claim_token, decision, now)])[0]


@operation(Shape.WRITE)
def settle_many(conn: Connection, requests: Sequence[SettleRequest]) -> list[Settlement]:
    """Settle exact claims in one statement of the caller's transaction.

    Every row keeps its own guard (exact token, live lease); only the
    statement and the commit are shared, which is what makes a busy runner
    fast on a durable database. The lease is checked against the latest
    ``now`` of the batch.
    """
    job_ids = [request.job_id for request in requests]
    if len(set(job_ids)) < len(job_ids):  # one statement updates a row once
        return [result for request in requests for result in settle_many(conn, [request])]
    backend = backend_of(conn)
    rows = [settle_row(r) for r in requests]
    if len(rows) > 1 and sum(map(_row_chars, rows)) > STATEMENT_CHARS_MAX:
        # Large results: statements MariaDB's max_allowed_packet takes (each
        # settle keeps its own guard, so several statements settle as one).
        chunks = sized_chunks(range(len(requests)), lambda i: _row_chars(rows[i]), len(requests))
        return [result for chunk in chunks for result in settle_many(conn, [requests[i] for i in chunk])]
    params = sql.rows_params(backend, "settles", sql.SETTLE_FIELDS, rows)
    params["now"] = max((r.now or now_ms()) for r in requests)
    # A batch of up to LITERAL_LIMIT_MAX rows has its count written into the
    # statement's text (one prepared statement, planned once, per size: see
    # limits_sql.settle).
    sized = sql.size_in_text(len(requests))
    stmt = limits_sql.settle(backend, sized)
    written = execute_rows(conn, stmt, params) if backend.writes_return_rows else write_returning(conn, stmt, params)
    settled = {row[_JOB_ID]: row for row in written}
    if settled and not backend.triggers_tell_dependents:  # MariaDB: the store tells the dependents
        tell(conn, [(row[_JOB_ID], row[_OUTCOME]) for row in settled.values() if row[_STATE] == _SETTLED_STATE])
    for request in requests:
        if request.waits_for is not None and request.job_id in settled:
            # A later statement than the snooze's: it sees a signal committed
            # while the snooze waited for the job's row (docs/design.md, "Events").
            wake_snoozed(conn, request.job_id, request.waits_for)
    if settled:
        limited = limited_queues(conn)  # cached: no statement for a deployment without limits
        if limited and any(row[_QUEUE] in limited for row in settled.values()):
            room_freed(conn)
    return [
        _settled(settled[r.job_id]) if r.job_id in settled else _unsettled(conn, r.job_id, r.claim_token, r.decision)
        for r in requests
    ]


def _row_chars(row: Sequence[Any]) -> int:
    """The characters of a settle's row (its result, traceback, history) in a statement."""
    return sum(len(value) for value in row if isinstance(value, str)) + 64


def _settled(row: Sequence[Any]) -> Settlement:
    status = SettleStatus.SETTLED if row[_STATE] == JobState.SETTLED.value else SettleStatus.REQUEUED
    return Settlement(status, row=row)


def _detail(request: SettleRequest) -> str | None:
    """The request's traceback, bounded to its last characters; only a
    ``failed`` decision keeps one."""
    detail = request.detail
    if detail is None or request.decision.outcome is not Outcome.FAILED:
        return None
    if not isinstance(detail, str):
        raise WatchdogError(ErrorCode.INVALID_INPUT, f"detail: must be a str, not {type(detail).__name__}")
    detail = detail.replace("\x00", "\\0")
    if len(detail) > FAILURE_DETAIL_MAX_LENGTH:
        detail = "…" + detail[-(FAILURE_DETAIL_MAX_LENGTH - 1) :]
    return detail


def _unsettled(conn: Connection, job_id: str, claim_token: str, decision: Decision) -> Settlement:
    """Why a settle updated nothing: a replay, a conflict, or no such job.

    A requeue (retry, snooze) drops its claim token, so its replay cannot be
    recognised and answers ``conflict``: the runner then leaves the job to
    whoever holds it now."""
    prior = read_claim(conn, job_id)
    if prior is None:
        return Settlement(SettleStatus.MISSING, None)
    job, token = prior
    expected = decision.outcome if job.cancellation_id is None else Outcome.CANCELLED
    if job.state is JobState.SETTLED and token == claim_token and job.outcome is expected:
        return Settlement(SettleStatus.REPLAYED, job)
    return Settlement(SettleStatus.CONFLICT, job)


@operation(Shape.WRITE)
def report_progress(
    conn: Connection, job_id: str, claim_token: str, fraction: float, note: str | None, *, now: int | None = None
) -> bool:
    """Record a running job's progress under its exact, live claim; whether
    the claim still held (False: nothing written)."""
    params = {"job": job_id, "token": claim_token, "fraction": fraction, "note": note, "now": now or now_ms()}
    return bool(write_returning(conn, claims_sql.progress(), params))


@operation(Shape.WRITE)
def renew(conn: Connection, claims: Sequence[tuple[str, str]], *, lease_ms: int, now: int | None = None) -> set[str]:
    """Renew exact claims; returns the job_ids still held (the rest are lost)."""
    if not claims:
        return set()
    params = {"claims": list(claims), "now": now_ms() if now is None else now, "lease_ms": lease_ms}
    return {row.job_id for row in write_returning(conn, claims_sql.renew(), params)}


@operation(Shape.WRITE)
def start(conn: Connection, claims: Sequence[tuple[str, str]], *, lease_ms: int, now: int | None = None) -> set[str]:
    """Record that the handlers of exact claims ``(job_id, token)`` are about
    to start: their ``unstarted`` mark cleared and their lease renewed, in one
    statement (:func:`claims_sql.start`). Returns the job_ids whose claim
    held; a handler whose claim is not among them must not start."""
    if not claims:
        return set()
    params = {"claims": list(claims), "now": now_ms() if now is None else now, "lease_ms": lease_ms}
    return {row.job_id for row in write_returning(conn, claims_sql.start(), params)}


@operation(Shape.WRITE)
def release(conn: Connection, claims: Sequence[tuple[str, str]]) -> set[str]:
    """End the leases of claims a stopping runner could not finish."""
    if not claims:
        return set()
    return {row.job_id for row in write_returning(conn, claims_sql.release(), {"claims": list(claims)})}


@operation(Shape.WRITE)
def cancel(conn: Connection, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelResult:
    """Record a cancellation.

    ``replayed`` when this ``cancellation_id`` is already recorded for this
    job; ``conflict`` when the job already has another cancellation, has
    settled (or, with ``only_if_queued``, is running), or when the
    ``cancellation_id`` names another job's cancellation. Two concurrent
    cancellations sharing one ``cancellation_id`` on different jobs fail the
    later statement with an ``IntegrityError``; the client reports it as a
    conflict. Identical requests answer ``recorded`` once and ``replayed``
    otherwise, whatever their interleaving.
    """
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    check_text("cancellation_id", cancellation_id, CANCELLATION_ID_MAX_LENGTH)
    if not isinstance(only_if_queued, bool):
        raise WatchdogError(ErrorCode.INVALID_INPUT, "only_if_queued: must be a bool")
    holder = conn.execute(claims_sql.cancellation_holder(), {"cancellation": cancellation_id}).scalar()
    if holder is not None:
        status = CancelStatus.REPLAYED if holder == job_id else CancelStatus.CONFLICT
        return CancelResult(job_id, status)
    params = {"job": job_id, "cancellation": cancellation_id}
    if write_returning(conn, claims_sql.cancel(only_if_queued), params):
        return CancelResult(job_id, CancelStatus.RECORDED)
    # Nothing updated. The read above and the update are separate statements
    # (each committed on its own on PostgreSQL): an identical request may have
    # recorded this very cancellation in between, so decide from the row as
    # it is now, never from the earlier read.
    return CancelResult(job_id, cancel_status_now(conn, job_id, cancellation_id))


def cancel_status_now(conn: Connection, job_id: str, cancellation_id: str) -> CancelStatus:
    """Why a cancellation was not recorded, read afresh: ``replayed`` if the
    job now holds this very ``cancellation_id``, ``missing`` if there is no
    such job, else ``conflict``."""
    prior = read(conn, job_id)
    if prior is None:
        return CancelStatus.MISSING
    if prior.cancellation_id == cancellation_id:
        return CancelStatus.REPLAYED
    return CancelStatus.CONFLICT


def room_freed(conn: Connection) -> None:
    """Jobs of a limited queue left ``running``: wake the runners a limit holds
    back (PostgreSQL: NOTIFY while one waits, delivered at commit; SQLite and
    MariaDB: this process's runners of the database, once this transaction
    committed). Unlimited queues never come here."""
    if backend_of(conn).notifies:
        conn.execute(claims_sql.notify_room())
    else:
        room_freed_at_commit(conn)


def room_freed_in(conn: Connection, queues: Iterable[str]) -> None:
    """:func:`room_freed` when any of ``queues`` (of jobs that left
    ``running`` in this transaction) is limited -- the process's cached list,
    so nothing is sent for a deployment without limits."""
    limited = limited_queues(conn)
    if limited and not limited.isdisjoint(queues):
        room_freed(conn)


def notify(conn: Connection, event: str) -> None:
    """Wake listening runners when the transaction commits (PostgreSQL only)."""
    if backend_of(conn).notifies:
        conn.execute(claims_sql.notify(), {"event": event})


@operation(Shape.WRITE)
def fail_lane(conn: Connection, lane: str, reason: str, *, batch: int = LANE_FAILURE_BATCH) -> LaneFailure:
    """Settle one batch of the lane's live jobs ``failed``, then (when the
    live ones are done) of its waiting jobs; ``more`` if any remain.

    A waiting job settled so keeps ``waiting_on = 0`` (like a cancelled
    one): a runner's pass tells its own dependents (``propagate``)."""
    check_text("lane", lane, LANE_MAX_LENGTH)
    if not isinstance(reason, str) or not reason:
        raise WatchdogError(ErrorCode.INVALID_INPUT, "reason: must be a non-empty str")
    params = {"lane_name": lane, "reason": bound_reason(reason), "batch": batch}
    rows = write_returning(conn, maintenance_sql.fail_lane(backend_of(conn)), params)
    tell(conn, [(row[_JOB_ID], row[_OUTCOME]) for row in rows])  # live jobs settled (not the waiting ones below)
    more = bool(conn.execute(maintenance_sql.lane_has_live_jobs(), {"lane_name": lane}).scalar())
    if not more and len(rows) < batch:
        params["batch"] = batch - len(rows)
        rows += write_returning(conn, maintenance_sql.fail_lane_waiting(backend_of(conn)), params)
    more = more or conn.execute(maintenance_sql.lane_has_waiting_jobs(), {"lane_name": lane}).first() is not None
    jobs = tuple(sorted((view(row) for row in rows), key=lambda j: j.sequence))
    if jobs:  # running jobs of a limited queue may have ended: wake the runners it holds back
        room_freed_in(conn, {job.queue for job in jobs})
    return LaneFailure(jobs, more)


@operation(Shape.WRITE)
def purge(conn: Connection, queue: str) -> int:
    """Delete the queue's waiting, queued and delayed jobs; returns how many.

    The waiting ones go first, so a waiting job of the queue whose parent is
    a queued job of the queue is deleted too, not cancelled by its parent's
    deletion. Each deleted job's dependents are told it ended ``purged``
    (the delete trigger), so in another queue they are cancelled (default
    policy) or released (``any_outcome``)."""
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    if not backend_of(conn).triggers_tell_dependents:
        return _purge_by_key(conn, queue)
    waiting = conn.execute(maintenance_sql.purge_waiting(), {"queue": queue}).rowcount
    return int(waiting or 0) + int(conn.execute(maintenance_sql.purge(), {"queue": queue}).rowcount or 0)


def _purge_by_key(conn: Connection, queue: str) -> int:
    """:func:`purge` where the store tells dependents itself (MariaDB/MySQL):
    the jobs each delete would take are read under a lock and deleted by
    key, then the dependents of the watched ones are told ``purged`` -- after
    the delete, so that a dependent deleted with them (its edges go with
    it) is not counted first."""
    deleted = 0
    for waiting in (True, False):
        rows = conn.execute(maintenance_sql.purge_pick(backend_of(conn), waiting), {"queue": queue}).all()
        if not rows:
            continue
        for start in range(0, len(rows), 1000):
            keys = [row[0] for row in rows[start : start + 1000]]
            deleted += int(conn.execute(maintenance_sql.purge_by_key(waiting), {"keys": keys}).rowcount or 0)
        tell(conn, [(row[1], "purged") for row in rows if row[2] is not None])
    return deleted


# -- recovery ----------------------------------------------------------------


@operation(Shape.READ)
def expired_claims(conn: Connection, *, limit: int) -> list[Claim]:
    """Running jobs whose lease has ended by the database clock, earliest first.

    Only the database clock decides whether another runner's claim is dead,
    so a recoverer whose own clock runs ahead cannot steal a live lease.
    """
    rows = conn.execute(claims_sql.expired_claims(), {"limit": limit})
    return [Claim(view(row), row.claim_token) for row in rows]


#: ``interrupted`` after a shutdown whose grace the handler outlived.
SHUTDOWN_REASON = "Runner shut down while the job was running (its handler outlived the grace period)"
_FROM_JOB: Any = object()


def recovery_reason(
    job: JobView, max_recoveries: int | None = _FROM_JOB, cause: RecoveryCause = RecoveryCause.VANISHED
) -> str:
    """The ``failure_reason`` of a job settled ``interrupted`` by recovery."""
    budget = job.max_recoveries if max_recoveries is _FROM_JOB else max_recoveries
    if cause is RecoveryCause.SHUTDOWN:
        policy = "no recovery policy" if budget is None else f"recovery budget exhausted ({budget} recoveries)"
        return f"{SHUTDOWN_REASON}; {policy}"
    if budget is None:
        return NO_POLICY_REASON
    return f"Restart recovery budget exhausted ({budget} recoveries)"


@operation(Shape.WRITE)
def reconcile(
    conn: Connection,
    expired: Claim,
    *,
    max_recoveries: int | None = _FROM_JOB,
    cause: RecoveryCause = RecoveryCause.VANISHED,
) -> Recovery:
    """Requeue the dead claim within its budget, else settle it ``interrupted``
    -- but requeue a job claimed ahead whose handler never started (still
    marked ``unstarted``) without counting a recovery, whatever its budget.

    The budget is ``max_recoveries`` (default: the job's own); ``cause``
    goes into an ``interrupted`` job's reason. One conditional statement:
    the same token, the same recovery count and an ended lease.

    Revision w0022: a claim that vanished (not a shutdown's) of a started
    job with recorded steps is, rather than settled ``interrupted``, requeued
    once -- its reason kept, no recovery counted -- for a run that runs the undos of
    its steps (compensation); the marker that makes that run compensate
    (the ``undo:`` row) is written in the same transaction. A job whose
    marker is there already (its compensating run vanished too) is settled
    ``interrupted``.
    """
    job = expired.job
    budget = job.max_recoveries if max_recoveries is _FROM_JOB else max_recoveries
    requeue = budget is not None and job.recovery_count < budget
    compensate = False
    if not requeue and cause is RecoveryCause.VANISHED:
        found = conn.execute(
            claims_sql.reconcile_steps(), {"job": job.job_id, "token": expired.token, "mark": COMPENSATION_MARK}
        ).first()
        compensate = found is not None and bool(found[0]) and bool(found[1]) and not found[2]
    params = {
        "job": job.job_id,
        "token": expired.token,
        "count": job.recovery_count,
        "reason": recovery_reason(job, budget, cause),
    }
    rows = write_returning(conn, claims_sql.reconcile(requeue, compensate), params)
    row = rows[0] if rows else None
    if row is None:
        return Recovery(job.job_id, RecoveryStatus.LOST_RACE, None)
    after = view(row)
    status = RecoveryStatus.REQUEUED if after.state is JobState.QUEUED else RecoveryStatus.SETTLED
    if compensate and status is RecoveryStatus.REQUEUED:
        conn.execute(job_steps_sql.mark_compensation(), {"job": job.job_id, "name": COMPENSATION_MARK})
        room_freed_in(conn, (after.queue,))
        return Recovery(job.job_id, status, after, compensating=True)
    if status is RecoveryStatus.SETTLED:
        tell(conn, [(row[_JOB_ID], row[_OUTCOME])])
    # It left running (requeued or settled): room in a limited queue.
    room_freed_in(conn, (after.queue,))
    # Requeued with its count unchanged: it was still marked unstarted (w0019).
    unstarted = status is RecoveryStatus.REQUEUED and after.recovery_count == job.recovery_count
    return Recovery(job.job_id, status, after, unstarted)


@operation(Shape.WRITE)
def release_and_recover(
    conn: Connection,
    claims: Sequence[tuple[str, str]],
    budgets: Mapping[str, int | None] | None = None,
    *,
    cause: RecoveryCause = RecoveryCause.SHUTDOWN,
) -> list[Recovery]:
    """End the leases of abandoned claims and recover them at once (shutdown).

    ``budgets`` maps a job_id to its recovery budget (default: the job's own).
    """
    release(conn, claims)
    # A set of pairs, not a job_id -> token map: a runner may hold two
    # executions of one job (a handler that overstayed its lease, and the
    # job's next claim), of which only the current claim's token matches.
    pairs = set(claims)
    results = []
    for expired in expired_claims(conn, limit=len(claims) + 64):
        if (expired.job.job_id, expired.token) in pairs:
            budget = _FROM_JOB if budgets is None else budgets.get(expired.job.job_id, _FROM_JOB)
            results.append(reconcile(conn, expired, max_recoveries=budget, cause=cause))
    return results


@operation(Shape.READ)
def seconds_until_next_expiry(conn: Connection) -> float | None:
    """Seconds until the earliest running lease ends (by the database clock)."""
    lease_until, clock = conn.execute(claims_sql.next_lease_expiry()).one()
    if lease_until is None:
        return None
    seconds: float = (lease_until - clock) / 1000.0
    return max(0.0, seconds)
