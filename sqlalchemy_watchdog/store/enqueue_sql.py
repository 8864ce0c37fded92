"""The statements of :mod:`.enqueue`: admitting jobs (one constant statement for
any batch) and reading back what a batch stored.

Internal module: its names may change in any release."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    Insert,
    Select,
    and_,
    bindparam,
    case,
    literal_column,
    not_,
    null,
    select,
    true,
)

from ..backends import Backend
from .sql import (
    _DELAYED,
    _QUEUED,
    ENQUEUE_FIELDS,
    IDENTITY_FIELDS,
    _bound_row,
    _insert,
    _rows,
    c,
    db_clock_ms,
)


@cache
def insert_rows(backend: Backend, one: bool = False) -> Insert:
    """Insert queued jobs (rows of :data:`ENQUEUE_FIELDS` in the ``jobs``
    parameter(s), admitted in their order), with no conflict handling: the
    plain INSERT of :func:`enqueue_rows`, for a backend without ``ON
    CONFLICT`` (``Backend.writes_return_rows``), where the store has read
    the stored rows of these job ids under a lock first
    (:func:`locked_contents`) and inserts only the new ones. ``one``: a
    single job, its fields each a bind parameter ``job_<field>``.
    """
    source, cols, order = (
        (None, _bound_row("job", ENQUEUE_FIELDS), None) if one else _rows(backend, "jobs", ENQUEUE_FIELDS)
    )
    names = [field for field, _ in IDENTITY_FIELDS]
    clock = db_clock_ms()
    # The ready time: the job's run_at, else the end of the enqueue's delay
    # (from the database clock); a job whose time has not come is delayed.
    ready_at = case(
        (cols["run_at"].is_not(None), cols["run_at"]),
        (cols["delay_ms"].is_not(None), clock + cols["delay_ms"]),
        else_=null(),
    )
    state = case(
        (cols["waiting_on"] > 0, literal_column("'waiting'")),
        (ready_at > clock, literal_column(f"'{_DELAYED}'")),
        else_=literal_column(f"'{_QUEUED}'"),
    )
    into = [*names, "ready_at", "state", "enqueued_at", "trace_context", "waiting_on", "after_policy"]
    values = [
        *(cols[name] for name in names),
        ready_at,
        state,
        clock,
        cols["trace_context"],
        case((cols["waiting_on"] > 0, cols["waiting_on"]), else_=null()),
        cols["after_policy"],
    ]
    if one and backend.insert_select_locks_table:
        # VALUES: a "simple insert" takes no table-wide AUTO-INC lock.
        simple: Insert = _insert(backend).values(dict(zip(into, values, strict=True)))
        return simple
    # WHERE true: SQLite's parser needs it between INSERT ... SELECT and ON CONFLICT.
    rows = select(*values).where(true())
    if source is not None:
        rows = rows.select_from(source).order_by(order)
    ins: Insert = _insert(backend).from_select(into, rows)
    return ins


@cache
def enqueue_rows(backend: Backend, one: bool = False) -> Insert:
    """Insert queued jobs (:func:`insert_rows`); ``RETURNING job_id`` names
    the ones newly admitted (PostgreSQL, SQLite: ``Backend.writes_return_rows``).

    A replay of an identical job matches the conflict target and updates
    nothing (no row returned: a duplicate). A replay with other contents sets
    the NOT NULL ``job_id`` to NULL, which fails the statement and with it the
    caller's transaction -- never a silent no-op that would commit the
    caller's writes beside an unrelated old job.
    """
    ins: Any = insert_rows(backend, one)
    ex = ins.excluded
    identical = and_(
        c.queue_name == ex.queue_name,
        c.lane == ex.lane,
        c.priority == ex.priority,
        c.payload_json == ex.payload_json,
        c.recovery_max.is_not_distinct_from(ex.recovery_max),
        c.run_at.is_not_distinct_from(ex.run_at),
        c.max_attempts.is_not_distinct_from(ex.max_attempts),
        c.retry_policy.is_not_distinct_from(ex.retry_policy),
        c.timeout_ms.is_not_distinct_from(ex.timeout_ms),
        c.rerun_of.is_not_distinct_from(ex.rerun_of),
        c.limit_key.is_not_distinct_from(ex.limit_key),
        # Whether the job has parents, and its policy; which parents is
        # compared after the statement (store.enqueue: they are edges).
        c.after_policy.is_not_distinct_from(ex.after_policy),
    )
    stmt: Insert = ins.on_conflict_do_update(
        index_elements=[c.job_id], set_={"job_id": null()}, where=not_(identical)
    ).returning(c.job_id)
    return stmt


@cache
def locked_contents(backend: Backend) -> Select[Any]:
    """:func:`stored_contents`, its rows locked until the transaction ends
    (``FOR UPDATE``): what an enqueue without ``ON CONFLICT`` compares
    before inserting the job ids not stored (``store.enqueue``)."""
    return backend.locked(stored_contents())


@cache
def stored_contents() -> Select[Any]:
    """What an identical replay compares, for the stored jobs among ``:job_ids``."""
    return select(*(c[name] for name, _ in IDENTITY_FIELDS), c.after_policy).where(
        c.job_id.in_(bindparam("job_ids", expanding=True))
    )
