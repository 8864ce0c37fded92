"""A backend per dialect: what differs between PostgreSQL and SQLite.

Each :class:`Backend` owns its dialect's facts and rules -- the insert
construct (``ON CONFLICT``), the clock SQL, how a writer takes its lock
(``BEGIN IMMEDIATE`` or nothing), whether reads run beside the writer (the
look-before-lock rule), error classification (transient or not, integrity
violations), wake-ups (LISTEN/NOTIFY or none), whether operations run in
autocommit, and how ``job_id`` sorts. The store and the statements ask
:func:`backend_of` instead of comparing dialect names; a third dialect is a
module here registered in :data:`BACKENDS` (and its statement variants; see
the design document, "Store operations and backends").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sqlalchemy import Connection, Select
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement

from .postgresql import PostgreSQL
from .sqlite import SQLite, UnreadableText

__all__ = ["BACKENDS", "Backend", "PostgreSQL", "SQLite", "UnreadableText", "backend_of", "backend_of_error"]


class Backend(Protocol):
    """What the store needs to know about a dialect (see the module docstring)."""

    #: The SQLAlchemy dialect name.
    name: str
    #: Whether the store's operations run in autocommit where their shape
    #: allows (one round trip instead of three).
    self_committing: bool
    #: Whether a failed statement aborts the whole transaction (so going on
    #: after one needs a savepoint around it).
    aborts_on_error: bool
    #: Whether the database delivers LISTEN/NOTIFY wake-ups.
    notifies: bool
    #: Whether a transaction-scoped advisory lock exists (else the write
    #: lock is exclusive anyway).
    advisory_xact_lock: bool
    #: The marker parameter of a job-id prefix range in a list statement.
    prefix_range_marker: str

    #: Whether the planner uses a partial index only for a query that repeats
    #: its predicate (SQLite), so a pick must say it again.
    repeats_partial_predicates: bool
    #: Whether a write transaction holds its lock before its first statement
    #: reads (SQLite's ``BEGIN IMMEDIATE``), so one statement can lock a row
    #: and count what the lock protects; else (PostgreSQL) a statement that
    #: waited for a row lock still reads with the snapshot it began with.
    locks_before_reading: bool
    #: The system column naming a row's current version (PostgreSQL
    #: ``ctid``), by which a write reaches rows its own pick locked whatever
    #: the planner knows of the table (a TID scan); None where the key is the
    #: row's address already (SQLite: ``sequence`` is the rowid).
    row_address: str | None

    def insert(self, table: Any) -> Insert:
        """The dialect's INSERT construct (with ``on_conflict_do_*``)."""
        ...

    # -- statement variants (the statements module asks for these) -----------------

    def json_rows(
        self, name: str, fields: Sequence[tuple[str, Any]], *, limit: ColumnElement[Any] | None = None
    ) -> tuple[Any, dict[str, ColumnElement[Any]], Any]:
        """A FROM source yielding the rows sent as one JSON array of arrays
        in the bind parameter ``name``, its columns by field name and its
        ordering column (see ``statements._rows``); with a ``limit`` (a
        parameter, plain or ``statements.batch_size``), at most that many rows."""
        ...

    def skip_locked(self, pick: Select[Any]) -> Select[Any]:
        """``pick`` locking the rows it returns and skipping rows another
        transaction holds, where the database locks rows (else unchanged:
        the write lock serialises writers)."""
        ...

    def locked(self, query: Select[Any]) -> Select[Any]:
        """``query`` locking the rows it returns until the transaction ends,
        waiting for another holder (``FOR UPDATE``), where rows lock; else
        unchanged (the write lock is held already)."""
        ...

    def picked(
        self,
        key: ColumnElement[Any],
        pick: Select[Any],
        name: str,
        *,
        skip_locked: bool = True,
        as_array: bool = False,
        joined: bool = False,
        recheck: ColumnElement[bool] | None = None,
    ) -> ColumnElement[bool]:
        """The WHERE clause of a write that targets the rows whose ``key``
        column is among those ``pick`` returns: on PostgreSQL a materialized CTE
        ``name`` of them, locked (``FOR UPDATE``, skipping locked rows when
        ``skip_locked``; ``pick`` already locked when None is wanted, see
        :meth:`skip_locked`), matched with ``= ANY(ARRAY(...))`` when
        ``as_array`` (a generic plan that goes by key; by address where the
        pick has a ``row`` column, joined to the pick when ``joined`` -- for a
        pick whose ``LIMIT`` is a constant, see ``statements.claim``);
        elsewhere ``IN (pick)``, with ``recheck``, the condition the write
        checks again where the pick locks no rows (a locked row is re-read by
        PostgreSQL anyway)."""
        ...

    def union_picked(self, parts: Sequence[tuple[Select[Any], str]]) -> Any:
        """One subquery ``lane_jobs`` of the rows of several picks (each
        ``(select, name)``), locked ``FOR UPDATE`` where rows lock."""
        ...

    def share_locked(self, query: Select[Any], table: Any) -> Select[Any]:
        """``query`` holding its rows of ``table`` ``FOR KEY SHARE`` until
        commit where rows lock (so a concurrent delete waits), else unchanged."""
        ...

    def clock_ms_sql(self) -> str:
        """SQL for the database clock in integer epoch milliseconds."""
        ...

    def greatest_sql(self, arguments: str) -> str:
        """SQL for the largest of ``arguments`` (a compiled argument list)."""
        ...

    def begin_write(self, conn: Connection) -> None:
        """Take the write lock at the start of the transaction (if any)."""
        ...

    def reads_beside_writer(self, conn: Connection) -> bool:
        """Whether reads never block the writer here (the look-before-lock rule)."""
        ...

    def owns_error(self, error: DBAPIError) -> bool:
        """Whether ``error`` came from this backend's drivers."""
        ...

    def is_transient(self, error: DBAPIError) -> bool:
        """Whether retrying the whole transaction may succeed (contention,
        a lost connection) -- beyond the disconnects every backend shares."""
        ...

    def violation(self, error: DBAPIError, table: str, unique_columns: Mapping[str, str]) -> tuple[str, str] | None:
        """``(kind, column)`` of a NOT NULL or one-column UNIQUE violation on ``table``."""
        ...

    def sorts_by_code_point(self, conn: Connection, ask_collation: Callable[[], Any]) -> bool:
        """Whether ``job_id`` sorts by code point (a prefix is one index range)."""
        ...

    def forget(self) -> None:
        """Forget the facts learnt about databases (e.g. the collation
        :meth:`sorts_by_code_point` read), after a revision changed them."""
        ...

    def reading_any_text(self, conn: Connection) -> AbstractContextManager[None]:
        """While the block runs, stored text the driver cannot decode reads as
        :class:`UnreadableText` instead of failing the fetch (SQLite keeps any
        bytes a producer wrote; PostgreSQL checks encodings on the way in)."""
        ...


#: The backends by dialect name.
BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (PostgreSQL(), SQLite())}


def backend_of(conn_or_dialect: Connection | Dialect | str) -> Backend:
    """The backend of a connection, a dialect or a dialect name."""
    if isinstance(conn_or_dialect, str):
        name = conn_or_dialect
    elif isinstance(conn_or_dialect, Connection):
        name = conn_or_dialect.dialect.name
    else:
        name = conn_or_dialect.name
    found = BACKENDS.get(name)
    if found is None:
        raise NotImplementedError(f"sqlalchemy_watchdog supports PostgreSQL and SQLite, not {name}")
    return found


def backend_of_error(error: DBAPIError) -> Backend:
    """The backend whose driver raised ``error`` (PostgreSQL's when none claims it)."""
    for backend in BACKENDS.values():
        if backend.name != "postgresql" and backend.owns_error(error):
            return backend
    return BACKENDS["postgresql"]
