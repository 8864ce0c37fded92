"""Durable steps and sleeps: what a job finished, kept for its next attempt (revision w0021).

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring); this feature's
statements are its own, in :mod:`.job_steps_sql`.

A running handler's ``job.step(name, fn)`` records ``fn``'s result here
once it returned, and ``job.sleep(...)`` its end: one ``INSERT ... SELECT``
from the job's row, guarded by the exact claim token and a live lease, so a
handler whose claim is gone records nothing. A later attempt of the same job
reads them first and returns a recorded step's result instead of running it
again. ``record_step_in`` writes the same row on the caller's own
connection, inside its transaction (``job.transaction_step``): the step's
writes and its record commit together or not at all.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from ..backends import backend_of
from ..jobs import JobStep, StepKind, at_epoch_ms
from . import job_steps_sql
from .base import now_ms
from .operation import Shape, operation

__all__ = ["forget_orphan_steps", "read_steps", "record_step", "record_step_in"]


@operation(Shape.WRITE)
def record_step(
    conn: Connection,
    job_id: str,
    claim_token: str,
    name: str,
    *,
    kind: StepKind,
    result_json: str | None,
    delay_ms: int | None,
    attempt: int,
    now: int | None = None,
) -> JobStep | None:
    """Record step ``name`` of the exact, live claim ``(job_id,
    claim_token)``; the step as recorded, or None when the claim is gone or
    the name was recorded already (nothing written)."""
    return record_step_in(
        conn,
        job_id,
        claim_token,
        name,
        kind=kind,
        result_json=result_json,
        delay_ms=delay_ms,
        attempt=attempt,
        now=now,
    )


def record_step_in(
    conn: Connection,
    job_id: str,
    claim_token: str,
    name: str,
    *,
    kind: StepKind,
    result_json: str | None,
    delay_ms: int | None,
    attempt: int,
    now: int | None = None,
) -> JobStep | None:
    """:func:`record_step` on ``conn`` in the transaction it is in (the
    caller's own: it commits the step with its own writes)."""
    params = {
        "job": job_id,
        "token": claim_token,
        "name": name,
        "kind": kind.value,
        "result": result_json,
        "delay": delay_ms,
        "attempt": attempt,
        "now": now_ms() if now is None else now,
    }
    backend = backend_of(conn)
    if backend.writes_return_rows:
        row = conn.execute(job_steps_sql.record(backend), params).first()
    else:
        row = _record_plain(conn, params)
    if row is None:
        return None
    wake_at = None if row.wake_at is None else at_epoch_ms(row.wake_at)
    return JobStep(name, kind, result_json, wake_at, attempt, None)


def _record_plain(conn: Connection, params: dict[str, Any]) -> Any:
    """:func:`record_step_in` where writes return no rows (MariaDB/MySQL):
    the same guarded ``INSERT ... SELECT``, which inserts nothing for a name
    recorded already; the step read back when it inserted one. A concurrent
    record of the same name fails it as a duplicate key (only the statement
    undone): then it was recorded already, and nothing is returned."""
    try:
        inserted = conn.execute(job_steps_sql.record(backend_of(conn)), params).rowcount
    except IntegrityError:
        if conn.execute(job_steps_sql.read_step(), params).first() is None:
            raise
        return None
    return conn.execute(job_steps_sql.read_step(), params).first() if inserted else None


@operation(Shape.READ)
def read_steps(conn: Connection, job_id: str) -> list[JobStep]:
    """The recorded steps of ``job_id``, in the order they were recorded."""
    return [
        JobStep(
            row.name,
            StepKind(row.kind),
            row.result_json,
            None if row.wake_at is None else at_epoch_ms(row.wake_at),
            row.attempt,
            at_epoch_ms(row.recorded_at),
        )
        for row in conn.execute(job_steps_sql.read_steps(), {"job": job_id})
    ]


def forget_orphan_steps(conn: Connection, *, limit: int) -> int:
    """Delete at most ``limit`` steps whose job was pruned or purged; how many."""
    return int(conn.execute(job_steps_sql.forget_orphans(backend_of(conn)), {"limit": limit}).rowcount)
