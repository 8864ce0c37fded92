"""The MariaDB and MySQL backend: InnoDB row locks, READ COMMITTED, error numbers.

Phase 1 of issue 57 (see ``docs/howto/mariadb.md``): the dialect's facts --
the clock, the isolation level, the error classification, the schema's
types and indexes, the dependency triggers -- are here; the statement
builders do not yet write every statement in a form MariaDB runs (no
``RETURNING`` on ``UPDATE``, no ``UPDATE`` of a table its own subquery reads).

Supported: MariaDB >= 10.6 and MySQL >= 8.0 (``SKIP LOCKED``, ``JSON_TABLE``,
enforced ``CHECK`` constraints), tested on MariaDB 10.11.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Connection,
    Engine,
    Float,
    Integer,
    Select,
    String,
    Text,
    and_,
    bindparam,
    column,
    event,
    select,
    text,
    union_all,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from ._dbapi import execute_plain
from .triggers import TRIGGER_NAMES, edge_triggers

#: ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT: InnoDB rolled the statement (a
#: deadlock: the whole transaction) back; the transaction may be run again.
#: ER_AUTOINC_READ_FAILED: a deadlock on the table-wide AUTO-INC lock an
#: INSERT ... SELECT holds, reported this way; the whole transaction was
#: rolled back, as for 1213 (tests/backends/test_mysql_facts.py).
RETRYABLE_ERRORS = frozenset({1213, 1205, 1467})
#: The connection is gone: CR_SERVER_GONE_ERROR, CR_SERVER_LOST, MariaDB's
#: ER_CONNECTION_KILLED (``KILL CONNECTION``), ER_CLIENT_INTERACTION_TIMEOUT;
#: or none can be made: CR_CONNECTION_ERROR (unix socket), CR_CONN_HOST_ERROR
#: (TCP) -- a server being restarted refuses connections for a moment, and
#: must not be taken for one refusing the statement (a runner then settled a
#: completed job as failed).
DISCONNECT_ERRORS = frozenset({2006, 2013, 1927, 4031, 2002, 2003})
#: A CHECK constraint refused a row: MariaDB's ER_CONSTRAINT_FAILED, MySQL's
#: ER_CHECK_CONSTRAINT_VIOLATED. PyMySQL raises them as OperationalError;
#: the store and its users expect IntegrityError, as on the other dialects.
CHECK_VIOLATIONS = frozenset({4025, 3819})
#: A NOT NULL column without a default left out of an INSERT (strict mode's
#: ER_NO_DEFAULT_FOR_FIELD): PostgreSQL's NotNullViolation, an IntegrityError
#: there; PyMySQL raises it as OperationalError too.
NO_DEFAULT_FOR_FIELD = 1364
#: The refusals of a row raised as ``IntegrityError`` (:func:`_refusal_as_integrity_error`).
ROW_REFUSALS = CHECK_VIOLATIONS | {NO_DEFAULT_FOR_FIELD}
#: ER_CANT_CHANGE_TX_CHARACTERISTICS.
_IN_TRANSACTION = 1568
#: ER_BAD_NULL_ERROR, ER_DUP_ENTRY.
_NOT_NULL, _DUPLICATE = 1048, 1062

#: The drivers' modules (aiomysql raises PyMySQL's exceptions).
_DRIVER_MODULES = ("pymysql", "aiomysql", "asyncmy", "MySQLdb", "mysql.connector", "mariadb")


def _json_table_type(type_: Any) -> str:
    """The ``JSON_TABLE`` column type of a field's SQLAlchemy type."""
    if isinstance(type_, Float):
        return "DOUBLE"  # FLOAT is single precision here
    if isinstance(type_, BigInteger):
        return "BIGINT"
    if isinstance(type_, Integer):
        return "INT"
    return "LONGTEXT"


def error_number(error: BaseException | None) -> int | None:
    """The server's (or client library's) error number of a driver exception."""
    args = getattr(error, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


class MySQL:
    """MySQL >= 8.0 (PyMySQL, aiomysql): dialect name ``mysql`` -- which is
    also what a ``mysql+pymysql://`` URL to a MariaDB server reports."""

    name = "mysql"
    # The claim is a locking read and an update by key: transactions everywhere.
    self_committing = False
    # A failed statement is rolled back alone (a deadlock rolls back the
    # transaction, and is retried whole: RETRYABLE_ERRORS).
    aborts_on_error = False
    # No ON CONFLICT, no UPDATE ... RETURNING (MariaDB returns from INSERT
    # and DELETE only, MySQL from nothing): a locking read, a write by key.
    writes_return_rows = False
    # No LISTEN/NOTIFY: runners poll.
    notifies = False
    # GET_LOCK is a session's, not a transaction's.
    advisory_xact_lock = False
    prefix_range_marker = "job_id_range"
    # No partial indexes at all (see partial_index).
    repeats_partial_predicates = False
    locks_before_reading = False
    # InnoDB clusters rows by primary key: sequence is the row's address.
    row_address: str | None = None
    # One row is inserted with VALUES: INSERT ... SELECT takes InnoDB's
    # table-wide AUTO-INC lock for the statement (deadlocks: error 1467).
    insert_select_locks_table = True
    checks_stored_types = False
    # No domains: every one-column CHECK is the table's.
    column_domains = False
    # BIGINT AUTO_INCREMENT.
    bigint_pk_type: TypeEngine[int] | None = None
    #: Revision w0023: TEXT holds 65,535 bytes, and an ``INSERT ... SELECT``
    #: (a batch enqueue) cuts a longer value short without an error.
    long_text: TypeEngine[str] | None = mysql.LONGTEXT()
    #: The binary collation: code-point order, equality of the exact text
    #: (but PAD SPACE: 'a' = 'a '). utf8mb4_bin, the one binary collation
    #: both MySQL and MariaDB have, as a ``mysql://`` URL may reach either.
    collation = "utf8mb4_bin"
    #: The isolation level of the queue's transactions (:meth:`begin_write`).
    isolation_level: str | None = "READ COMMITTED"
    fails_over = False
    limited_claim_at_once = False
    # A test gets a database of its own (a MySQL schema is a database).
    has_schemas = False
    has_databases = True
    # A trigger may not write the table whose statement fired it, even
    # through another table's trigger (1442): the parent triggers on
    # watchdog_jobs would update the edges, whose trigger updates
    # watchdog_jobs. The store tells the edges itself; the edges' trigger
    # (fired by the store's UPDATE of the edges) and the deleted child's
    # (which writes only the edges) stay.
    triggers_tell_dependents = False
    trigger_names: tuple[str, ...] = ("watchdog_jobs_child_pruned", "watchdog_job_edges_counted")

    def __init__(self) -> None:
        # The longest job_id, limit key and cursor key (jobs.validation: 256).
        self.code_point_text: TypeEngine[str] | None = self.bounded_text(256)

    def bounded_text(self, length: int) -> TypeEngine[str]:
        """``VARCHAR`` in the binary collation: an indexed text column (InnoDB
        indexes a TEXT column only by a prefix). One character longer than
        ``length``, the limit its CHECK enforces: a value one too long
        reaches that CHECK (an IntegrityError naming it) rather than
        failing as too long for the column (1406, a DataError)."""
        return String(length + 1, collation=self.collation)

    def partial_index(self, where: str) -> dict[str, Any]:
        """Index keyword arguments of a partial index on ``where``: none --
        neither MariaDB nor MySQL has partial indexes, so it indexes every
        row (docs/howto/mariadb.md lists what each one costs)."""
        return {}

    def key_prefix(self, lengths: Mapping[str, int]) -> dict[str, Any]:
        """Index keyword arguments indexing each named column by its first
        ``lengths[column]`` characters: an InnoDB key holds 3,072 bytes (768
        utf8mb4 characters), which lane (512) and queue_name (256) exceed
        together."""
        return {f"{self.name}_length": dict(lengths)}

    def insert(self, table: Any) -> Insert:
        return mysql.insert(table)

    def upsert(self, stmt: Insert, key: Sequence[Any], set_: Callable[[Any], dict[str, Any]]) -> Insert:
        # As a list: the assignments in set_'s order (a dict would be put in
        # the table's column order), each reading the row as the earlier ones left it.
        upserted: Insert = stmt.on_duplicate_key_update(list(set_(stmt.inserted).items()))  # type: ignore[attr-defined]
        return upserted

    # -- DDL ------------------------------------------------------------------------

    def trigger_sql(self, clock: str | None = None) -> list[str]:
        """A row trigger per edge trigger of :attr:`trigger_names`, its
        condition an ``IF`` (no ``WHEN``), created under ``PIPES_AS_CONCAT``
        (the bodies concatenate with ``||``; a trigger keeps the sql_mode it
        was created under). The parent triggers are not made: the store
        tells the edges (:attr:`triggers_tell_dependents`)."""
        statements = ["SET @watchdog_sql_mode = @@SESSION.sql_mode",
                      "SET SESSION sql_mode = CONCAT(@@SESSION.sql_mode, ',PIPES_AS_CONCAT')"]  # fmt: skip
        for name, fires, when, body in edge_triggers(clock or self.clock_ms_sql()):
            if name not in self.trigger_names:
                continue
            fires = fires.replace("UPDATE OF state ON", "UPDATE ON").replace("UPDATE OF outcome ON", "UPDATE ON")
            statements.append(f"CREATE TRIGGER {name} {fires} FOR EACH ROW BEGIN IF {when} THEN {body}; END IF; END")
        statements.append("SET SESSION sql_mode = @watchdog_sql_mode")
        return statements

    def drop_trigger_sql(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {name}" for name in TRIGGER_NAMES]

    def count_triggers_sql(self) -> str:
        names = ", ".join(f"'{name}'" for name in TRIGGER_NAMES)
        return (
            "SELECT count(*) FROM information_schema.triggers "
            f"WHERE trigger_schema = DATABASE() AND trigger_name IN ({names})"
        )

    def domain_sql(self, domain: str, base: str, check: str, condition: str) -> list[str]:
        return []  # no domains: the table's own CHECKs

    def drop_domain_sql(self, domain: str) -> list[str]:
        return []

    # -- URLs -----------------------------------------------------------------------

    def with_default_driver(self, url: URL) -> URL:
        return url.set(drivername=f"{url.get_backend_name()}+pymysql") if "+" not in url.drivername else url

    def sync_url(self, url: URL) -> URL:
        if "+" not in url.drivername or url.get_driver_name() in ("aiomysql", "asyncmy"):
            return url.set(drivername=f"{url.get_backend_name()}+pymysql")
        return url

    def unshareable(self, url: URL) -> str | None:
        return None

    def missing_database(self, url: URL) -> str | None:
        return None  # the server says so itself when connected to

    # -- the hot statements' fast path ----------------------------------------------

    def execute_rows(self, conn: Connection, text: str, args: Any, *, native: bool = False) -> list[Sequence[Any]]:
        return execute_plain(conn, text, args)

    # -- statement variants ---------------------------------------------------------

    def json_rows(
        self, name: str, fields: Sequence[tuple[str, Any]], *, limit: ColumnElement[Any] | None = None
    ) -> tuple[Any, dict[str, ColumnElement[Any]], Any]:
        """``JSON_TABLE`` over the parameter (MariaDB >= 10.6, MySQL >= 8.0):
        each field a column read by its array index (a missing element or a
        JSON ``null`` is NULL), ``ordinal`` the row's position (``FOR
        ORDINALITY``, from 1). A derived table of its own, so the statement
        refers to ``name.field`` like the other backends' sources."""
        columns_sql = ", ".join(
            f"`{field}` {_json_table_type(type_)} PATH '$[{index}]'" for index, (field, type_) in enumerate(fields)
        )
        table = (
            text(f"SELECT * FROM JSON_TABLE(:{name}, '$[*]' COLUMNS (ordinal FOR ORDINALITY, {columns_sql})) AS rows_")
            .bindparams(bindparam(name, type_=Text()))
            .columns(column("ordinal", BigInteger()), *(column(field, type_) for field, type_ in fields))
        )
        source: Any = table.subquery(name)
        if limit is not None:
            source = select(source).order_by(source.c.ordinal).limit(limit).subquery(name)
        return source, {field: source.c[field] for field, _ in fields}, source.c.ordinal

    def skip_locked(self, pick: Select[Any]) -> Select[Any]:
        return pick.with_for_update(skip_locked=True)

    def locked(self, query: Select[Any]) -> Select[Any]:
        return query.with_for_update()

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
        # MariaDB refuses an UPDATE/DELETE whose subquery reads its own table
        # (error 1093) unless the subquery is materialised (a derived table):
        # phase 2 replaces this with a locking read and a write by key.
        derived = select(pick.subquery(name).c[str(key.key)])
        return key.in_(derived) if recheck is None else and_(key.in_(derived), recheck)

    def among(self, key: ColumnElement[Any], pick: Select[Any]) -> ColumnElement[bool]:
        # Error 1235 refuses a LIMIT in an IN subquery, not in a derived table.
        derived = pick.subquery("limited")
        return key.in_(select(*derived.c))

    def union_picked(self, parts: Sequence[tuple[Select[Any], str]]) -> Any:
        return union_all(*(select(part.subquery(name)) for part, name in parts)).subquery("lane_jobs")

    def share_locked(self, query: Select[Any], table: Any) -> Select[Any]:
        return query.with_for_update(read=True)

    def clock_ms_sql(self) -> str:
        # UTC_TIMESTAMP ignores the session's time_zone; the difference from
        # the epoch (a DATETIME, zone-less too) is the epoch time.
        return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)"

    def greatest_sql(self, arguments: str) -> str:
        return f"GREATEST({arguments})"

    def text_length_sql(self, argument: str) -> str:
        # LENGTH counts bytes here: 'é' is 2.
        return f"CHAR_LENGTH({argument})"

    def begin_write(self, conn: Connection) -> None:
        """Run the transaction at READ COMMITTED (before its first statement).

        InnoDB's default, REPEATABLE READ, takes gap and next-key locks on
        every locking read and on an UPDATE's index range: two claims or a
        claim and an enqueue then lock the gaps between rows they never
        touch, and deadlock (1213). READ COMMITTED locks only the rows read.
        """
        try:
            conn.exec_driver_sql(f"SET TRANSACTION ISOLATION LEVEL {self.isolation_level}")
        except DBAPIError as error:
            # 1568: a statement of this transaction ran already (its level is
            # fixed); it goes on at the session's level rather than failing.
            if error_number(error.orig) != _IN_TRANSACTION:
                raise

    def reads_beside_writer(self, conn: Connection) -> bool:
        # MVCC reads never block writers; row locks: no look before the lock.
        return False

    def owns_error(self, error: DBAPIError) -> bool:
        return type(error.orig).__module__.startswith(_DRIVER_MODULES)

    def is_transient(self, error: DBAPIError) -> bool:
        number = error_number(error.orig)
        return number in RETRYABLE_ERRORS or number in DISCONNECT_ERRORS or bool(error.connection_invalidated)

    def violation(self, error: DBAPIError, table: str, unique_columns: Mapping[str, str]) -> tuple[str, str] | None:
        """From the error number and the fixed wording of 1048 / 1062.

        1048: ``Column 'x' cannot be null``; 1364: ``Field 'x' doesn't have a
        default value`` (a NOT NULL column the INSERT left out); 1062: ``Duplicate entry '...'
        for key 'name'`` (the key's name, qualified by its table on MySQL;
        MariaDB names the key alone, which is ``table``'s when it says so:
        the schema's unique keys are named ``uq_<table>_<column>``).
        """
        number = error_number(error.orig)
        message = str(getattr(error.orig, "args", ("", ""))[-1])
        if number == _NOT_NULL and message.startswith("Column '"):
            return ("not_null", message.split("'")[1])
        if number == NO_DEFAULT_FOR_FIELD and message.startswith("Field '"):
            return ("not_null", message.split("'")[1])
        if number == _DUPLICATE and " for key '" in message:
            owner, _, key = message.rsplit(" for key '", 1)[1].rstrip("'").rpartition(".")
            if owner != table if owner else not key.startswith(f"uq_{table}_"):
                return None
            column = unique_columns.get(key)
            return ("unique", column) if column else None
        return None

    def sorts_by_code_point(self, conn: Connection, ask_collation: Callable[[], Any]) -> bool:
        # job_id's type is VARCHAR in a binary collation (code_point_text).
        return True

    def forget(self) -> None:
        pass  # nothing learnt

    @contextlib.contextmanager
    def reading_any_text(self, conn: Connection) -> Iterator[None]:
        """Nothing to do: a utf8mb4 column refuses invalid text when written."""
        yield


class MariaDB(MySQL):
    """MariaDB >= 10.6 (dialect name ``mariadb``: a ``mariadb+pymysql://`` URL)."""

    name = "mariadb"
    # MariaDB's binary collation without trailing-space padding: 'a' <> 'a '.
    collation = "utf8mb4_nopad_bin"


def _refusal_as_integrity_error(context: ExceptionContext) -> BaseException | None:
    """A CHECK violation (MariaDB 4025, MySQL 3819) or a NOT NULL column
    left without a value (1364) raised as SQLAlchemy's ``IntegrityError``,
    as PostgreSQL's and SQLite's are: PyMySQL classifies these error numbers
    as ``OperationalError``, which also means a lost connection or a
    deadlock -- a caller retrying "operational" errors would retry a row the
    schema refuses. Only MariaDB/MySQL engines are affected."""
    if context.dialect.name not in ("mysql", "mariadb"):
        return None
    if error_number(context.original_exception) not in ROW_REFUSALS:
        return None
    if isinstance(context.sqlalchemy_exception, IntegrityError):
        return None
    original = context.original_exception
    assert isinstance(original, Exception)
    return IntegrityError(context.statement, context.parameters, original)


#: ``length(`` as a function call in a CHECK's text.
_LENGTH_CALL = re.compile(r"\blength\(", re.IGNORECASE)


def _check_in_characters(constraint: CheckConstraint, compiler: Any, **kw: Any) -> str:
    """A CHECK constraint's DDL with ``length()`` as ``CHAR_LENGTH()``: the
    schema's CHECKs bound text in characters (PostgreSQL's and SQLite's
    ``length``), MySQL's ``LENGTH`` counts bytes -- a 256-character job_id of
    emoji would be refused as 1,024 long."""
    return _LENGTH_CALL.sub("CHAR_LENGTH(", compiler.visit_check_constraint(constraint, **kw))


compiles(CheckConstraint, "mysql")(_check_in_characters)
compiles(CheckConstraint, "mariadb")(_check_in_characters)

# Every engine (sync, and the sync engine under each AsyncEngine): the
# listener returns at once for other dialects.
event.listen(Engine, "handle_error", _refusal_as_integrity_error)
