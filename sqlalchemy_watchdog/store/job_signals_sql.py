"""The statements of :mod:`.job_signals` (signals and waits; revision
w0022): built here, run there.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import BigInteger, Delete, Select, Text, delete, literal, literal_column, select, true, update
from sqlalchemy.sql.dml import Insert, Update

from ..backends import Backend
from ..jobs import StepKind
from ..model import job_signals_table, job_steps_table
from . import sql

signals = job_signals_table
g = signals.c
s = job_steps_table.c
j = sql.c


@cache
def lock_job(backend: Backend) -> Select[Any]:
    """Job ``:job``'s ``sequence`` and ``state``, its row locked until the
    transaction ends (PostgreSQL: ``FOR UPDATE``, waiting for a holder --
    a settle or snooze of the same job in flight; SQLite: the write lock)."""
    return backend.locked(select(j.sequence, j.state).where(j.job_id == sql._p("job", Text())))


def keep(backend: Backend) -> Insert:
    """Keep signal ``:signal`` (payload ``:payload``) of the job whose sequence
    is ``:seq`` (``:job`` its job_id), on the database clock -- unless
    one of that name is kept already (no row returns then).

    Where writes return no rows (``Backend.writes_return_rows`` False:
    MariaDB/MySQL) a plain ``INSERT``, failing as a duplicate key when one of
    that name is kept (then :func:`kept_locked` reads it), its ``sent_at``
    read back with :func:`kept`."""
    insert: Any = sql._insert_into(backend, signals).values(
        job_sequence=sql._p("seq", BigInteger()),
        name=sql._p("signal", Text()),
        job_id=sql._p("job", Text()),
        payload_json=sql._p("payload", Text()),
        sent_at=sql.db_clock_ms(),
    )
    if not backend.writes_return_rows:
        plain: Insert = insert
        return plain
    stmt: Insert = insert.on_conflict_do_nothing(index_elements=[g.job_sequence, g.name]).returning(g.sent_at)
    return stmt


@cache
def kept() -> Select[Any]:
    """The signal ``:signal`` kept for the job whose sequence is ``:seq``."""
    return select(g.payload_json, g.sent_at).where(
        g.job_sequence == sql._p("seq", BigInteger()), g.name == sql._p("signal", Text())
    )


@cache
def kept_locked(backend: Backend) -> Select[Any]:
    """:func:`kept` as a locking read (MariaDB/MySQL ``LOCK IN SHARE
    MODE``), which reads the latest committed row whatever the transaction's
    isolation level: a caller's ``REPEATABLE READ`` transaction whose
    snapshot is older than a signal committed while it waited for the
    job's row still sees that signal."""
    return backend.share_locked(kept(), signals)


@cache
def read_signal() -> Select[Any]:
    """The database clock, with signal ``:signal`` of job ``:job`` (the job now
    stored under that job_id, by its sequence) when one is kept: one row, always."""
    found = (
        select(g.payload_json, g.sent_at)
        .join(sql.t, j.sequence == g.job_sequence)
        .where(j.job_id == sql._p("job", Text()), g.name == sql._p("signal", Text()))
        .subquery()
    )
    clock = select(sql.db_clock_ms().label("clock")).subquery()
    return select(clock.c.clock, found.c.payload_json, found.c.sent_at).select_from(clock.outerjoin(found, true()))


@cache
def read_signals() -> Select[Any]:
    """The signals kept for job ``:job`` (by its sequence), oldest first."""
    return (
        select(g.name, g.payload_json, g.sent_at)
        .join(sql.t, j.sequence == g.job_sequence)
        .where(j.job_id == sql._p("job", Text()))
        .order_by(g.sent_at, g.name)
    )


@cache
def wake_waiting() -> Update:
    """The signal side: job ``:seq``, delayed while its handler waits for
    signal ``:signal`` (its wait recorded, not timed out by the signal's time
    ``:sent``), is made ``queued`` now. Run after the signal is kept, on the
    row ``lock_job`` locked: a wait committed before sees the signal here."""
    sequence = sql._p("seq", BigInteger())
    name = sql._p("signal", Text())
    waiting = (
        select(literal(1))
        .where(
            s.job_sequence == sequence,
            s.name == name,
            s.kind == literal_column(f"'{StepKind.WAIT.value}'"),
            s.wake_at >= sql._p("sent", BigInteger()),
        )
        .exists()
    )
    return (
        update(sql.t)
        .where(j.sequence == sequence, sql.IS_DELAYED, waiting)
        .values(state=literal_column(f"'{sql._QUEUED}'"), ready_at=sql.db_clock_ms())
    )


@cache
def wake_snoozed() -> Update:
    """The wait side: job ``:job``, just snoozed by its exact claim while it
    waits for signal ``:signal``, is made ``queued`` now if that signal is
    kept. A statement of its own after the snooze's ``UPDATE`` (in the same
    transaction): it reads what a signal that held the row committed while
    the snooze waited for it (docs/design.md, "Events")."""
    kept_now = (
        select(literal(1))
        .where(g.job_sequence == j.sequence, g.name == sql._p("signal", Text()))
        .correlate(sql.t)
        .exists()
    )
    return (
        update(sql.t)
        .where(j.job_id == sql._p("job", Text()), sql.IS_DELAYED, kept_now)
        .values(state=literal_column(f"'{sql._QUEUED}'"), ready_at=sql.db_clock_ms())
    )


@cache
def forget_orphans(backend: Backend) -> Delete:
    """At most ``:limit`` signals whose job is gone (pruned or purged): a
    LIMITed pick (through :meth:`Backend.among`, as the steps')."""
    orphans = (
        select(g.job_sequence)
        .where(~select(literal(1)).where(j.sequence == g.job_sequence).exists())
        .limit(sql._p("limit", BigInteger()))
    )
    return delete(signals).where(backend.among(g.job_sequence, orphans))


__all__ = [
    "forget_orphans",
    "keep",
    "kept",
    "kept_locked",
    "lock_job",
    "read_signal",
    "read_signals",
    "wake_snoozed",
    "wake_waiting",
]
