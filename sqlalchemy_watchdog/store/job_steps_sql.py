"""The statements of :mod:`.job_steps` (durable steps and sleeps; revision
w0021): built here, run there.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import BigInteger, Delete, Integer, Select, Text, case, delete, insert, literal, null, select, true
from sqlalchemy.sql.dml import Insert

from ..backends import Backend
from ..model import job_steps_table
from . import sql

steps = job_steps_table
s = steps.c
j = sql.c


def record(backend: Backend) -> Insert:
    """Record step ``:name`` (``:kind``; ``:result``; a sleep's end ``:delay``
    ms after the database clock) of job ``:job``, attempt ``:attempt`` -- only
    under the exact, live claim ``:job`` / ``:token`` (the lease on
    ``max(:now, database clock)``, as a renewal) and only once per name.
    One ``INSERT ... SELECT`` from the job's row: no row returns when the
    claim is gone (nothing written) or the name was recorded already."""
    delay = sql._p("delay", BigInteger())
    rows = select(
        j.sequence,
        sql._p("name", Text()),
        j.job_id,
        sql._p("kind", Text()),
        sql._p("result", Text()),
        case((delay.is_(None), null()), else_=sql.db_clock_ms() + delay),
        sql._p("attempt", Integer()),
        sql.db_clock_ms(),
    ).where(
        j.job_id == sql._p("job", Text()),
        j.claim_token == sql._p("token", Text()),
        sql.IS_RUNNING_UNINDEXED,
        j.lease_until > sql.effective_now(sql.NOW),
        true(),  # SQLite's parser needs a WHERE between INSERT ... SELECT and ON CONFLICT
    )
    insert: Any = sql._insert_into(backend, steps)
    columns = ["job_sequence", "name", "job_id", "kind", "result_json", "wake_at", "attempt", "recorded_at"]
    if not backend.writes_return_rows:
        # MariaDB/MySQL: no ON CONFLICT, no RETURNING. A name recorded already
        # inserts no row (the row count says); the store reads the step back
        # (read_step), and takes a duplicate key of a concurrent record for one.
        recorded = select(literal(1)).where(s.job_sequence == j.sequence, s.name == sql._p("name", Text()))
        plain: Insert = insert.from_select(columns, rows.where(~recorded.exists()))
        return plain
    stmt: Insert = (
        insert.from_select(columns, rows)
        .on_conflict_do_nothing(index_elements=[s.job_sequence, s.name])
        .returning(s.name, s.wake_at)
    )
    return stmt


@cache
def mark_compensation() -> Insert:
    """Record the compensation marker ``:name`` (kind ``undo``) of job
    ``:job``, which recovery just requeued for a compensating run -- in the
    requeue's transaction, once: nothing when the job is not queued or the
    marker is there already."""
    marked = select(literal(1)).where(s.job_sequence == j.sequence, s.name == sql._p("name", Text())).exists()
    rows = select(
        j.sequence,
        sql._p("name", Text()),
        j.job_id,
        literal("undo"),
        null(),
        null(),
        j.attempt,
        sql.db_clock_ms(),
    ).where(j.job_id == sql._p("job", Text()), sql.IS_QUEUED, ~marked)
    columns = ["job_sequence", "name", "job_id", "kind", "result_json", "wake_at", "attempt", "recorded_at"]
    stmt: Insert = insert(steps).from_select(columns, rows)
    return stmt


@cache
def read_step() -> Select[Any]:
    """Step ``:name`` of job ``:job`` (the job now stored under that job_id):
    what :func:`record` returns, read back where writes return no rows."""
    return (
        select(s.name, s.wake_at)
        .join(sql.t, j.sequence == s.job_sequence)
        .where(j.job_id == sql._p("job", Text()), s.name == sql._p("name", Text()))
    )


@cache
def read_steps() -> Select[Any]:
    """The recorded steps of job ``:job`` (the job now stored under that
    job_id, by its sequence), in the order they were recorded."""
    return (
        select(s.name, s.kind, s.result_json, s.wake_at, s.attempt, s.recorded_at)
        .join(sql.t, j.sequence == s.job_sequence)
        .where(j.job_id == sql._p("job", Text()))
        .order_by(s.recorded_at, s.name)
    )


@cache
def forget_orphans(backend: Backend) -> Delete:
    """At most ``:limit`` steps whose job is gone (pruned or purged): a
    LIMITed pick (through :meth:`Backend.among`: MariaDB refuses ``IN``
    over a subquery with ``LIMIT``)."""
    orphans = (
        select(s.job_sequence)
        .where(~select(literal(1)).where(j.sequence == s.job_sequence).exists())
        .limit(sql._p("limit", BigInteger()))
    )
    return delete(steps).where(backend.among(s.job_sequence, orphans))
