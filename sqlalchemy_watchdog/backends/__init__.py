"""A backend per dialect: what differs between PostgreSQL and SQLite.

Each :class:`Backend` owns its dialect's facts and rules -- the insert
construct (``ON CONFLICT``), the clock SQL, how a writer takes its lock
(``BEGIN IMMEDIATE`` or nothing), whether reads run beside the writer (the
look-before-lock rule), error classification (transient or not, integrity
violations), wake-ups (LISTEN/NOTIFY or none), whether operations run in
autocommit, how ``job_id`` sorts, the schema's dialect DDL (column types,
CHECKs or domains, the dependency triggers), the URLs the CLI and the
pytest plugin derive, and the hot statements' raw-driver fast path. Nothing
outside this package (and the frozen revisions) compares dialect names
(``tests/unit/test_dialect_boundary.py`` holds it so): the store, the
statements, the model and the tools ask :func:`backend_of`. A third dialect
is a module here implementing :class:`Backend`, registered in
:data:`BACKENDS` (see the design document, "Store operations and backends").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sqlalchemy import Connection, Select
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from .mysql import MariaDB, MySQL
from .postgresql import PostgreSQL
from .sqlite import SQLite, UnreadableText

__all__ = [
    "BACKENDS",
    "Backend",
    "MariaDB",
    "MySQL",
    "PostgreSQL",
    "SQLite",
    "UnreadableText",
    "backend_of",
    "backend_of_error",
    "known_backend",
    "with_variants",
]


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
    #: Whether a write returns the rows it wrote: ``INSERT ... ON CONFLICT``
    #: and ``UPDATE``/``DELETE ... RETURNING`` exist. Else (MariaDB/MySQL)
    #: the store reads the rows under a lock (``FOR UPDATE``), writes by
    #: primary key and reads back, in the same transaction.
    writes_return_rows: bool
    #: The isolation level of the queue's transactions where it is not the
    #: connection's default (MariaDB/MySQL: READ COMMITTED, see
    #: ``begin_write``); None: the default.
    isolation_level: str | None
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
    #: An ``INSERT ... SELECT`` holds a table-wide lock on the auto-increment
    #: counter for the whole statement (InnoDB's AUTO-INC lock at the default
    #: ``innodb_autoinc_lock_mode=1``), which can close a deadlock with the row
    #: locks of another transaction -- reported by MariaDB as error 1467,
    #: "Failed to read auto-increment value". A single row is then inserted
    #: with ``VALUES`` (a "simple insert": a short mutex, no table lock).
    insert_select_locks_table: bool

    # -- the schema (model.py asks; the revisions keep their own frozen copies) -----

    #: Whether each column of ``watchdog_jobs`` has a CHECK that its stored
    #: value is of the column's type (revision w0010: SQLite keeps any type).
    checks_stored_types: bool
    #: Whether a one-column CHECK of ``watchdog_jobs`` is a domain's (the
    #: column's type, revision w0016) rather than the table's.
    column_domains: bool
    #: The type of a ``BIGINT`` autoincrementing primary key here, where
    #: ``BigInteger`` is not it (SQLite's ``INTEGER PRIMARY KEY``); else None.
    bigint_pk_type: TypeEngine[int] | None
    #: The text type sorting by code point (a prefix is one index range),
    #: where the default collation may not (PostgreSQL's ``COLLATE "C"``); else None.
    code_point_text: TypeEngine[str] | None
    #: The type of a text column holding up to a payload's or result's
    #: 1 MiB of JSON (``PAYLOAD_MAX_BYTES``), where ``TEXT`` holds less
    #: (MariaDB/MySQL: 65,535 bytes, ``LONGTEXT``, revision w0023); else None.
    long_text: TypeEngine[str] | None

    # -- connections and tools -------------------------------------------------------

    #: Whether a server can stop being a writable primary under a pool's
    #: connections (``connections.follow_failover`` listens for it).
    fails_over: bool
    #: Whether a limited queue's claim can be one statement
    #: (``limits_sql.claim_limited_at_once``) in autocommit or once the
    #: limits row is locked.
    limited_claim_at_once: bool
    #: Whether the dependency triggers tell a parent's dependents: a trigger
    #: on ``watchdog_jobs`` writes a settled or deleted parent's outcome on
    #: its edges, whose own trigger counts each for its child. Else
    #: (MariaDB/MySQL: a trigger may not write the table of the statement
    #: that fired it, even through another table's trigger -- error 1442)
    #: only the edges' trigger exists, and the store writes the outcome on
    #: the edges itself, in the transaction of each statement that settles
    #: or deletes live jobs (``store.dependencies.tell``).
    triggers_tell_dependents: bool
    #: The dependency triggers this backend makes (of ``backends.triggers.TRIGGER_NAMES``).
    trigger_names: tuple[str, ...]
    #: Whether a test can run in a schema of its own (the pytest plugin's
    #: ``watchdog_engine``); else it gets the tables of a database file.
    has_schemas: bool
    #: Whether a test can run in a database of its own on the server, made
    #: and dropped by the pytest plugin's ``watchdog_engine`` (MariaDB/MySQL,
    #: where a schema is a database), when it has no schemas.
    has_databases: bool

    def bounded_text(self, length: int) -> TypeEngine[str] | None:
        """The type of an indexed text column of at most ``length``
        characters where ``TEXT`` cannot be indexed whole (MariaDB/MySQL:
        ``VARCHAR`` in a binary collation); else None (``TEXT``)."""
        ...

    def partial_index(self, where: str) -> dict[str, Any]:
        """The ``Index`` keyword arguments making it partial on ``where``
        (``postgresql_where``, ``sqlite_where``), or none where the
        database has no partial indexes (MariaDB/MySQL: every row enters)."""
        ...

    def __hash__(self) -> int:
        """Backends key the statement builders' caches (one instance each)."""
        ...

    def key_prefix(self, lengths: Mapping[str, int]) -> dict[str, Any]:
        """The ``Index`` keyword arguments indexing each column of
        ``lengths`` by that many leading characters, where a key's length is
        limited (MariaDB/MySQL: 3,072 bytes); else none."""
        ...

    def insert(self, table: Any) -> Insert:
        """The dialect's INSERT construct (with ``on_conflict_do_*``)."""
        ...

    def upsert(self, stmt: Insert, key: Sequence[Any], set_: Callable[[Any], dict[str, Any]]) -> Insert:
        """``stmt`` (an INSERT of one row) updating instead the row whose
        ``key`` columns it repeats, with the values ``set_(new)`` computes
        from ``new``, the proposed row's columns: ``ON CONFLICT DO UPDATE``
        with ``excluded``, or MariaDB/MySQL's ``ON DUPLICATE KEY UPDATE``
        with ``VALUES()`` (which fires on any unique key: for tables whose
        only one is ``key``). Returns no rows. MariaDB/MySQL assign in
        ``set_``'s order, each assignment reading the row as the earlier
        ones left it: a value that depends on the old row goes first."""
        ...

    def trigger_sql(self, clock: str | None = None) -> list[str]:
        """The DDL creating the dependency triggers (``backends.triggers``),
        and whatever they run (PostgreSQL: a function each); ``clock``: the
        SQL of the time they read, :meth:`clock_ms_sql` unless given."""
        ...

    def drop_trigger_sql(self) -> list[str]:
        """The DDL dropping them, if they exist."""
        ...

    def count_triggers_sql(self) -> str:
        """SQL counting those of the dependency triggers that exist."""
        ...

    def domain_sql(self, domain: str, base: str, check: str, condition: str) -> list[str]:
        """The DDL (re)creating domain ``domain`` over the compiled type
        ``base`` with the CHECK named ``check`` on ``condition`` (``{c}`` the
        value), where :attr:`column_domains`; else nothing."""
        ...

    def drop_domain_sql(self, domain: str) -> list[str]:
        """The DDL dropping domain ``domain`` if it exists (or nothing)."""
        ...

    def with_default_driver(self, url: URL) -> URL:
        """``url``, its driver the package's default when it names none."""
        ...

    def sync_url(self, url: URL) -> URL:
        """``url`` with a sync driver (a bare or asyncio one replaced by the
        package's default)."""
        ...

    def unshareable(self, url: URL) -> str | None:
        """Why the database of ``url`` cannot be shared by a runner's several
        connections (an in-memory SQLite database), or None."""
        ...

    def missing_database(self, url: URL) -> str | None:
        """Why connecting to ``url`` would create its database rather than
        find it (a SQLite file that is not there), or None."""
        ...

    def execute_rows(self, conn: Connection, text: str, args: Any, *, native: bool = False) -> list[Sequence[Any]]:
        """Run a hot statement's compiled ``text`` with ``args`` on the
        DBAPI connection of ``conn`` (whose transaction has begun) and return
        the driver's rows; a driver error takes SQLAlchemy's own path.
        ``native``: ``text`` is in the driver's native form (psycopg 3's
        ``$n``, see ``store.views``), which this backend's fast path runs."""
        ...

    # -- statement variants (the store's statement builders ask for these) --------

    def json_rows(
        self, name: str, fields: Sequence[tuple[str, Any]], *, limit: ColumnElement[Any] | None = None
    ) -> tuple[Any, dict[str, ColumnElement[Any]], Any]:
        """A FROM source yielding the rows sent as one JSON array of arrays
        in the bind parameter ``name``, its columns by field name and its
        ordering column (see ``sql._rows``); with a ``limit`` (a
        parameter, plain or ``sql.batch_size``), at most that many rows."""
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
        pick whose ``LIMIT`` is a constant, see ``claims_sql.claim``);
        elsewhere ``IN (pick)``, with ``recheck``, the condition the write
        checks again where the pick locks no rows (a locked row is re-read by
        PostgreSQL anyway)."""
        ...

    def among(self, key: ColumnElement[Any], pick: Select[Any]) -> ColumnElement[bool]:
        """``key IN (pick)`` for a ``pick`` that may have a ``LIMIT``
        (MariaDB/MySQL refuse a LIMIT in an IN subquery, error 1235: there
        the pick is read from a derived table of its own)."""
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

    def text_length_sql(self, argument: str) -> str:
        """SQL for the length of the text ``argument`` (compiled) in characters."""
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
BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (PostgreSQL(), SQLite(), MySQL(), MariaDB())}


def _name_of(conn_or_dialect: Connection | Dialect | str) -> str:
    if isinstance(conn_or_dialect, str):
        return conn_or_dialect
    if isinstance(conn_or_dialect, Connection):
        return conn_or_dialect.dialect.name
    return conn_or_dialect.name


def backend_of(conn_or_dialect: Connection | Dialect | str | Backend) -> Backend:
    """The backend of a connection, a dialect or a dialect name (a backend is its own)."""
    if not isinstance(conn_or_dialect, (str, Connection, Dialect)):
        return conn_or_dialect
    name = _name_of(conn_or_dialect)
    found = BACKENDS.get(name)
    if found is None:
        raise NotImplementedError(f"sqlalchemy_watchdog supports PostgreSQL, SQLite, MariaDB and MySQL, not {name}")
    return found


def known_backend(conn_or_dialect: Connection | Dialect | str) -> Backend | None:
    """:func:`backend_of`, or None for a dialect without a backend (for
    what leaves such a database alone rather than refusing it: the
    model's DDL hooks, ``follow_failover``)."""
    return BACKENDS.get(_name_of(conn_or_dialect))


def with_variants(base: TypeEngine[Any], variant: Callable[[Backend], TypeEngine[Any] | None]) -> TypeEngine[Any]:
    """``base``, with each backend's ``variant(backend)`` (where not None)
    as its type on that backend's dialect (``TypeEngine.with_variant``)."""
    for backend in BACKENDS.values():
        chosen = variant(backend)
        if chosen is not None:
            base = base.with_variant(chosen, backend.name)
    return base


def backend_of_error(error: DBAPIError) -> Backend:
    """The backend whose driver raised ``error`` (PostgreSQL's when none claims it)."""
    for backend in BACKENDS.values():
        if backend.name != "postgresql" and backend.owns_error(error):
            return backend
    return BACKENDS["postgresql"]
