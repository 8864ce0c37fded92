"""Signals and waits: events a job's handler waits for (revision w0022).

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring); this feature's
statements are its own, in :mod:`.job_signals_sql`.

``signal(job_id, name, payload)`` keeps the first signal of each name for a
job, in three statements of one transaction (its own, or the caller's):

1. lock the job's row (PostgreSQL, MariaDB ``FOR UPDATE``; SQLite holds
   the write lock) and read its ``sequence`` and state -- no job, or a
   settled one, and nothing is written;
2. ``INSERT ... ON CONFLICT DO NOTHING`` the signal, on the database clock
   (no row: one of that name is kept already -- a duplicate, or a conflict
   when its payload differs; the first one stays). Where writes return no
   rows (MariaDB/MySQL) a plain ``INSERT`` and its time read back, or, when
   it fails as a duplicate key, a locking read of the one kept
   (:func:`_keep_plain`);
3. make the job ``queued`` now if it is ``delayed`` while its handler waits
   for that name (a ``wait`` step recorded whose timeout the signal is within).

The handler's side (``job.wait_for``) records its wait as a step, reads the
signal, and when none is kept ends the attempt: the settle snoozes the job
until the timeout, and :func:`wake_snoozed` -- a later statement of the same
transaction -- makes it queued at once if the signal is kept by then.
Between the two sides no signal is lost (docs/design.md, "Events").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from ..backends import backend_of
from ..jobs import JobState, at_epoch_ms
from ..jobs.durable import JobSignal, SignalResult, SignalStatus
from ..wakeups import EVENT_QUEUED, room_freed_at_commit
from . import claims_sql, job_signals_sql
from .operation import Shape, operation

__all__ = ["forget_orphan_signals", "read_signal", "read_signals", "send_signal", "wake_snoozed"]


@operation(Shape.WRITE)
def send_signal(conn: Connection, job_id: str, name: str, payload_json: str) -> SignalResult:
    """Keep signal ``name`` (``payload_json``, canonical JSON) for job
    ``job_id`` and wake the job if it waits for it; see the module's docstring."""
    backend = backend_of(conn)
    row = conn.execute(job_signals_sql.lock_job(backend), {"job": job_id}).first()
    if row is None:
        return SignalResult(job_id, name, SignalStatus.NO_SUCH_JOB)
    sequence, state = row
    params = {"seq": sequence, "signal": name, "job": job_id, "payload": payload_json}
    if state == JobState.SETTLED.value:
        # Settled stays final: nothing is kept; a repeat of a signal it had is still a duplicate.
        read = job_signals_sql.kept() if backend.writes_return_rows else job_signals_sql.kept_locked(backend)
        prior = conn.execute(read, params).first()
        if prior is not None and prior.payload_json == payload_json:
            return SignalResult(job_id, name, SignalStatus.DUPLICATE, prior.payload_json)
        return SignalResult(job_id, name, SignalStatus.JOB_SETTLED)
    if backend.writes_return_rows:
        sent = conn.execute(job_signals_sql.keep(backend), params).first()
        prior = None if sent is not None else conn.execute(job_signals_sql.kept(), params).one()
    else:
        sent, prior = _keep_plain(conn, params)
    if prior is not None:
        status = SignalStatus.DUPLICATE if prior.payload_json == payload_json else SignalStatus.CONFLICT
        return SignalResult(job_id, name, status, prior.payload_json)
    assert sent is not None
    if conn.execute(job_signals_sql.wake_waiting(), {**params, "sent": sent.sent_at}).rowcount:
        _wake_runners(conn)
    return SignalResult(job_id, name, SignalStatus.DELIVERED, payload_json)


def _keep_plain(conn: Connection, params: dict[str, Any]) -> tuple[Any, Any]:
    """Step 2 where writes return no rows (MariaDB/MySQL): ``(the kept
    signal's row, None)`` once it is kept, or ``(None, the row kept
    already)``. A plain ``INSERT`` and its ``sent_at`` read back; one of that
    name kept already fails it as a duplicate key (only the statement is
    undone), and a locking read then returns that one. The read locks so
    that it sees the newest committed row: in a caller's REPEATABLE READ
    transaction whose snapshot is older than a signal committed while this
    one waited for the job's row (step 1), a plain read would miss it.
    Inserting first, not reading first, keeps that transaction from taking
    a gap lock on a missing name: a signal of another job inserting into
    that gap would wait for the caller's commit (or, the two interleaved,
    could deadlock)."""
    backend = backend_of(conn)
    try:
        conn.execute(job_signals_sql.keep(backend), params)
    except IntegrityError:
        prior = conn.execute(job_signals_sql.kept_locked(backend), params).first()
        if prior is None:
            raise
        return None, prior
    return conn.execute(job_signals_sql.kept(), params).one(), None


def _wake_runners(conn: Connection) -> None:
    """A job became ``queued``: wake idle runners (PostgreSQL: NOTIFY at
    commit; SQLite and MariaDB: this process's runners of the database, once
    this transaction committed)."""
    if backend_of(conn).notifies:
        conn.execute(claims_sql.notify(), {"event": EVENT_QUEUED})
    else:
        room_freed_at_commit(conn)


def wake_snoozed(conn: Connection, job_id: str, name: str) -> bool:
    """After the snooze of job ``job_id``'s exact claim while it waits for
    signal ``name``, in the same transaction: make it queued now if the
    signal is kept; whether it did."""
    woken = conn.execute(job_signals_sql.wake_snoozed(), {"job": job_id, "signal": name}).rowcount > 0
    if woken:
        _wake_runners(conn)
    return woken


@operation(Shape.READ)
def read_signal(conn: Connection, job_id: str, name: str) -> tuple[JobSignal | None, int]:
    """Signal ``name`` of job ``job_id`` if one is kept, and the database
    clock (epoch ms) when it was read."""
    row = conn.execute(job_signals_sql.read_signal(), {"job": job_id, "signal": name}).one()
    found = None if row.sent_at is None else JobSignal(name, row.payload_json, at_epoch_ms(row.sent_at))
    return found, int(row.clock)


@operation(Shape.READ)
def read_signals(conn: Connection, job_id: str) -> list[JobSignal]:
    """The signals kept for job ``job_id``, oldest first."""
    return [
        JobSignal(row.name, row.payload_json, at_epoch_ms(row.sent_at))
        for row in conn.execute(job_signals_sql.read_signals(), {"job": job_id})
    ]


def forget_orphan_signals(conn: Connection, *, limit: int) -> int:
    """Delete at most ``limit`` signals whose job was pruned or purged; how many."""
    return int(conn.execute(job_signals_sql.forget_orphans(backend_of(conn)), {"limit": limit}).rowcount)
