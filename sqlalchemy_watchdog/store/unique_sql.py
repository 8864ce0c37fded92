"""The statements of :mod:`.unique` (uniqueness windows, debounce, throttle
and replacement; revision w0020): built here, run there.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Delete,
    Integer,
    Select,
    Text,
    Update,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.sql.dml import Insert

from ..backends import Backend
from ..jobs import JobState
from ..model import unique_keys_table
from . import sql

keys = unique_keys_table
k = keys.c
j = sql.c


def _p(name: str, type_: Any = None) -> Any:
    return bindparam(name, type_=type_)


def _key_row(backend: Backend) -> Any:
    """The INSERT of key ``:key``'s row for ``:job_id``, its window from now
    (database clock) for ``:window`` ms."""
    insert: Any = backend.insert(keys)
    return insert.values(
        unique_key=_p("key", Text()),
        job_id=_p("job_id", Text()),
        kind=_p("kind", Text()),
        states=_p("states", Text()),
        since_ms=sql.db_clock_ms(),
        until_ms=sql.db_clock_ms() + _p("window", BigInteger()),
    )


@cache
def take_fresh(backend: Backend) -> Insert:
    """The key ``:key`` for ``:job_id`` unless a row holds it already (then
    no row returns): its window from now (database clock) for ``:window`` ms.
    Where writes return rows (``ON CONFLICT DO NOTHING ... RETURNING``)."""
    stmt: Insert = _key_row(backend).on_conflict_do_nothing(index_elements=[k.unique_key]).returning(k.until_ms)
    return stmt


@cache
def insert_key(backend: Backend) -> Insert:
    """:func:`take_fresh` for a backend without ``ON CONFLICT`` (MariaDB/MySQL):
    ``INSERT ... ON DUPLICATE KEY UPDATE unique_key = unique_key`` (the
    table's only unique key), returning nothing. A key nobody holds is
    inserted, its CHECKs enforced; a key another enqueue holds is left as it
    is but locked (exclusively: concurrent enqueues of one key queue up
    behind each other, where a plain INSERT failing as a duplicate would
    keep a shared lock that two of them then both try to upgrade, and
    deadlock). Not ``INSERT IGNORE``, which would also turn a row its CHECKs
    refuse into a warning. Whether the row is the enqueue's own is read
    next (``store.unique``): the row count cannot say, as the driver counts
    a row found as a row changed."""
    stmt: Insert = backend.upsert(_key_row(backend), [k.unique_key], lambda _new: {"unique_key": k.unique_key})
    return stmt


@cache
def lock_key() -> Select[Any]:
    """The row of ``:key``, locked until the transaction ends, and the database clock."""
    return (
        select(k.job_id, k.kind, k.states, k.since_ms, k.until_ms, sql.db_clock_ms().label("now"))
        .where(k.unique_key == _p("key", Text()))
        .with_for_update()
    )


@cache
def job_state() -> Select[Any]:
    """The state of job ``:job_id`` (no row: no such job)."""
    return select(j.state).where(j.job_id == _p("job_id", Text()))


@cache
def pass_key() -> Update:
    """``:key`` now held by job ``:holder`` from ``:since`` to ``:until``, its counts reset."""
    return (
        update(keys)
        .where(k.unique_key == _p("key", Text()))
        .values(
            job_id=_p("holder", Text()),
            kind=_p("kind", Text()),
            states=_p("states", Text()),
            since_ms=_p("since", BigInteger()),
            until_ms=_p("until", BigInteger()),
            duplicates=0,
            replacements=0,
        )
    )


@cache
def count_duplicate() -> Update:
    """One more enqueue absorbed by the holder of ``:key``."""
    return update(keys).where(k.unique_key == _p("key", Text())).values(duplicates=k.duplicates + 1)


@cache
def count_replacement() -> Update:
    """One more replacement of ``:key``'s holder, now planned to start at ``:until``."""
    return (
        update(keys)
        .where(k.unique_key == _p("key", Text()))
        .values(replacements=k.replacements + 1, until_ms=_p("until", BigInteger()))
    )


@cache
def replace_waiting() -> Update:
    """Job ``:holder`` gets ``:payload`` and starts at ``:ready_at`` -- only
    while it is ``delayed`` or ``queued`` (one statement: a job a runner
    claimed meanwhile is never changed: the row count is 0 then). Nothing
    returned, so that it runs as it is where writes return no rows
    (MariaDB): one UPDATE whose WHERE reads only the row it writes."""
    ready_at = _p("ready_at", BigInteger())
    delayed: ColumnElement[str] = literal_column(f"'{JobState.DELAYED.value}'")
    queued: ColumnElement[str] = literal_column(f"'{JobState.QUEUED.value}'")
    return (
        update(sql.t)
        .where(j.job_id == _p("holder", Text()), j.state.in_([delayed, queued]))
        .values(
            payload_json=_p("payload", Text()),
            ready_at=ready_at,
            state=case((ready_at > sql.db_clock_ms(), delayed), else_=queued),
        )
    )


@cache
def held_by() -> Select[Any]:
    """The keys job ``:job_id`` holds."""
    return (
        select(k.unique_key, k.kind, k.states, k.since_ms, k.until_ms, k.duplicates, k.replacements)
        .where(k.job_id == _p("job_id", Text()))
        .order_by(k.unique_key)
    )


@cache
def prune_ended(backend: Backend) -> Delete:
    """At most ``:limit`` key rows whose window ended over ``:age`` ms ago
    (database clock). The condition is the row's own, so a row an enqueue
    just renewed (it waits for that enqueue's lock, then reads the new row)
    is never deleted."""
    ended = (
        select(k.unique_key)
        .where(k.until_ms < sql.db_clock_ms() - _p("age", BigInteger()))
        .limit(_p("limit", BigInteger()))
    )
    return delete(keys).where(
        backend.among(k.unique_key, ended), k.until_ms < sql.db_clock_ms() - _p("age", BigInteger())
    )


@cache
def replace_job() -> Update:
    """Job ``:target`` gets ``:payload`` (NULL: keeps its own) and, when
    ``:set_start``, the start ``:start`` (its ``run_at`` and ready time;
    NULL: at once) -- only while it waits (delayed, queued, or waiting for
    parents, which keeps waiting). One statement guarded by the state; its
    row count says whether it replaced (nothing returned, as on MariaDB)."""
    start = _p("start", BigInteger())
    set_start = _p("set_start", Integer())
    waiting: ColumnElement[str] = literal_column(f"'{JobState.WAITING.value}'")
    delayed: ColumnElement[str] = literal_column(f"'{JobState.DELAYED.value}'")
    queued: ColumnElement[str] = literal_column(f"'{JobState.QUEUED.value}'")
    ready_at = case((set_start == 1, start), else_=j.ready_at)
    return (
        update(sql.t)
        .where(j.job_id == _p("target", Text()), j.state.in_([delayed, queued, waiting]))
        .values(
            payload_json=func.coalesce(_p("payload", Text()), j.payload_json),
            run_at=case((set_start == 1, start), else_=j.run_at),
            ready_at=ready_at,
            state=case(
                (j.state == waiting, waiting),
                (ready_at > sql.db_clock_ms(), delayed),
                else_=queued,
            ),
        )
    )
