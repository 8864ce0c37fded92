"""The PostgreSQL backend: autocommit, row locks, LISTEN/NOTIFY, SQLSTATEs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, Text, any_, bindparam, cast, func, literal_column, select, text, union_all
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine
from sqlalchemy.util import await_only

from ._dbapi import execute_plain
from .triggers import TRIGGER_NAMES, edge_triggers

#: SQLSTATEs of the integrity violations the store interprets.
_VIOLATIONS = {"23502": "not_null", "23505": "unique"}
#: serialization_failure, deadlock_detected
_RETRYABLE = ("40001", "40P01")
_CODE_POINT_COLLATIONS = frozenset({"C", "POSIX", "C.UTF-8", "C.utf8"})


class PostgreSQL:
    """PostgreSQL (psycopg 3, psycopg2, asyncpg)."""

    name = "postgresql"
    # Every store operation but those declared Shape.TRANSACTION is made of
    # statements each correct on its own: autocommit, one round trip.
    self_committing = True
    aborts_on_error = True
    writes_return_rows = True
    isolation_level: str | None = None
    notifies = True
    advisory_xact_lock = True
    prefix_range_marker = "job_id_range"
    repeats_partial_predicates = False
    # Row locks: a statement that waited for one keeps its older snapshot.
    locks_before_reading = False
    row_address: str | None = "ctid"
    insert_select_locks_table = False
    # The column types hold (no CHECK of a value's stored type); each
    # one-column CHECK of watchdog_jobs is a domain's (revision w0016).
    checks_stored_types = False
    column_domains = True
    bigint_pk_type: TypeEngine[int] | None = None
    # Revision w0010: job_id and the keys sort by code point.
    code_point_text: TypeEngine[str] | None = Text(collation="C")
    # TEXT holds any length.
    long_text: TypeEngine[str] | None = None
    # A server can stop being a writable primary under a pool's connections.
    fails_over = True
    # The limited claim can be one statement (limits_sql.claim_limited_at_once).
    limited_claim_at_once = True
    # Each test of the pytest plugin gets a schema of its own.
    has_schemas = True
    has_databases = False
    triggers_tell_dependents = True
    trigger_names: tuple[str, ...] = TRIGGER_NAMES

    def __init__(self) -> None:
        #: Whether job_id sorts by code point, per database URL (asked once).
        self._code_point_order: dict[str, bool] = {}

    def bounded_text(self, length: int) -> TypeEngine[str] | None:
        return None  # TEXT indexes whole

    def partial_index(self, where: str) -> dict[str, Any]:
        return {"postgresql_where": text(where)}

    def key_prefix(self, lengths: Mapping[str, int]) -> dict[str, Any]:
        return {}  # no limit on a key's length that the schema reaches

    def insert(self, table: Any) -> Insert:
        return postgresql.insert(table)

    def upsert(self, stmt: Insert, key: Sequence[Any], set_: Callable[[Any], dict[str, Any]]) -> Insert:
        upserted: Insert = stmt.on_conflict_do_update(index_elements=list(key), set_=set_(stmt.excluded))  # type: ignore[attr-defined]
        return upserted

    # -- DDL ------------------------------------------------------------------------

    def trigger_sql(self, clock: str | None = None) -> list[str]:
        """A PL/pgSQL function and a row trigger running it, per edge trigger."""
        statements: list[str] = []
        for name, event, when, body in edge_triggers(clock or self.clock_ms_sql()):
            statements.append(
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
                f"BEGIN\n    {body};\n    RETURN NULL;\nEND\n$$"
            )
            statements.append(f"CREATE TRIGGER {name} {event} FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION {name}()")
        return statements

    def drop_trigger_sql(self) -> list[str]:
        # The functions, and with them (CASCADE) their triggers -- those of the
        # current schema only: with a search_path such as "tenant, public", an
        # unqualified name would find public's functions when the tenant has none
        # yet, and drop the triggers of another installation.
        return [
            f"DO $$ BEGIN EXECUTE 'DROP FUNCTION IF EXISTS ' || quote_ident(current_schema()) || "
            f"'.{name}() CASCADE'; END $$"
            for name in TRIGGER_NAMES
        ]

    def count_triggers_sql(self) -> str:
        # The triggers on the tables this search_path finds: an installation in
        # another schema of the database (the pytest plugin gives each test one)
        # has triggers of the same names, which are not these tables'.
        names = ", ".join(f"'{name}'" for name in TRIGGER_NAMES)
        return (
            f"SELECT count(*) FROM pg_trigger WHERE tgname IN ({names}) "
            "AND tgrelid IN (to_regclass('watchdog_jobs'), to_regclass('watchdog_job_edges'))"
        )

    def domain_sql(self, domain: str, base: str, check: str, condition: str) -> list[str]:
        # A table dropped by hand (DROP TABLE watchdog_jobs) leaves its domains behind: made
        # afresh, so the new table's CHECKs are this version's. Without CASCADE, a domain some
        # other column still uses is not dropped: the error names it.
        return [
            *self.drop_domain_sql(domain),
            f"CREATE DOMAIN {domain} AS {base} CONSTRAINT {check} CHECK ({condition.format(c='VALUE')})",
        ]

    def drop_domain_sql(self, domain: str) -> list[str]:
        return [f"DROP DOMAIN IF EXISTS {domain}"]

    # -- URLs -----------------------------------------------------------------------

    def with_default_driver(self, url: URL) -> URL:
        # psycopg 3 is a dependency of the package; psycopg2 is not.
        return url.set(drivername="postgresql+psycopg") if "+" not in url.drivername else url

    def sync_url(self, url: URL) -> URL:
        if "+" not in url.drivername or url.get_driver_name() in ("asyncpg", "psycopg_async"):
            return url.set(drivername="postgresql+psycopg")
        return url

    def unshareable(self, url: URL) -> str | None:
        return None

    def missing_database(self, url: URL) -> str | None:
        return None  # a server says so itself when connected to

    # -- the hot statements' fast path ----------------------------------------------

    def execute_rows(self, conn: Connection, text: str, args: Any, *, native: bool = False) -> list[Sequence[Any]]:
        """``native``: ``text`` has PostgreSQL's own ``$n`` placeholders
        (psycopg 3), run on psycopg's raw cursor -- no placeholder
        conversion in Python at each execution; sync or async."""
        if not native:
            return execute_plain(conn, text, args)
        if conn.dialect.is_async:
            return _execute_native_async(conn, text, args)
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None
        cursor = None
        try:
            cursor = _raw_cursor()(dbapi_connection)
            cursor.execute(text, args)
            rows: list[Sequence[Any]] = list(cursor.fetchall())
            cursor.close()
        except conn.dialect.loaded_dbapi.Error as error:
            # Wrapped as DBAPIError, the connection invalidated on a disconnect,
            # the cursor closed otherwise: SQLAlchemy's own handling.
            conn._handle_dbapi_exception(error, text, args, cursor, None)
        return rows

    def json_rows(
        self, name: str, fields: Sequence[tuple[str, Any]], *, limit: ColumnElement[Any] | None = None
    ) -> tuple[Any, dict[str, ColumnElement[Any]], Any]:
        # jsonb, parsed once: ->> on json re-parses the element for every field.
        source: Any = (
            func.jsonb_array_elements(cast(bindparam(name, type_=Text()), postgresql.JSONB()))
            .table_valued("value", with_ordinality="ordinal")
            .render_derived(name=name)
        )
        columns: dict[str, ColumnElement[Any]] = {
            field: cast(source.c.value.op("->>")(literal_column(str(index))), type_)
            for index, (field, type_) in enumerate(fields)
        }
        if limit is not None:
            # Each field read and cast once, in the subquery, and named: the
            # statement refers to ``settles.delay_ms`` rather than repeating the
            # cast at every use -- which had made the settle statement longer
            # than psycopg's 4,096-character query cache takes, so every
            # settle re-parsed its placeholders in Python.
            typed = select(*(column.label(field) for field, column in columns.items()), source.c.ordinal)
            counted_source = typed.limit(limit).subquery(name)
            return counted_source, {field: counted_source.c[field] for field in columns}, counted_source.c.ordinal
        return source, columns, source.c.ordinal

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
        if skip_locked:
            pick = pick.with_for_update(skip_locked=True)
        cte = pick.cte(name).prefix_with("MATERIALIZED")
        sequence = cte.c[str(key.key)]
        if as_array and "row" in cte.c:
            # By the rows' addresses (a pick locked them, so they stay where they
            # are until this transaction writes them): TID scans, whatever the
            # planner knows of the table. By key, a generic plan made while the
            # table was young and never analysed scanned it whole for every
            # later claim -- 1 ms a claim at 9,000 rows, growing with the table.
            address: ColumnElement[Any] = literal_column(f"{key.table.name}.{self.row_address}")
            if joined:
                # Joined to a pick of a constant number of rows: a nested loop
                # of one TID scan per picked row, in every plan -- also one made
                # on a table of a few pages, where `ctid = ANY(array)` (a list of
                # unknown length) looked dearer than scanning the table.
                return address == cte.c.row
            # A pick of `LIMIT $n` (estimated at a tenth of the rows): joined,
            # its generic plan hash-joined a scan of the table; as an array it
            # is one TID scan of the list.
            return address == any_(func.array(select(cte.c.row).scalar_subquery()))
        if as_array:
            # = ANY(ARRAY(...)), not IN (SELECT ...): the planner takes the array for
            # a few elements whatever it knows of the table, so the generic plan of
            # a prepared statement goes to each row by key too.
            return key == any_(func.array(select(sequence).scalar_subquery()))
        return key.in_(select(sequence))

    def among(self, key: ColumnElement[Any], pick: Select[Any]) -> ColumnElement[bool]:
        return key.in_(pick)

    def union_picked(self, parts: Sequence[tuple[Select[Any], str]]) -> Any:
        ctes = [part.with_for_update().cte(name).prefix_with("MATERIALIZED") for part, name in parts]
        return union_all(*(select(cte.c.sequence, cte.c.state) for cte in ctes)).subquery("lane_jobs")

    def share_locked(self, query: Select[Any], table: Any) -> Select[Any]:
        return query.with_for_update(read=True, key_share=True, of=table)

    def clock_ms_sql(self) -> str:
        return "CAST(floor(EXTRACT(EPOCH FROM statement_timestamp()) * 1000) AS BIGINT)"

    def greatest_sql(self, arguments: str) -> str:
        return f"GREATEST({arguments})"

    def text_length_sql(self, argument: str) -> str:
        return f"length({argument})"

    def begin_write(self, conn: Connection) -> None:
        # Row locks: a writer locks what it writes, no lock up front.
        return None

    def reads_beside_writer(self, conn: Connection) -> bool:
        # MVCC reads never block writers, but row locks make a look before
        # the lock pointless: no peek (the claim itself skips locked rows).
        return False

    def owns_error(self, error: DBAPIError) -> bool:
        return not type(error.orig).__module__.startswith(("sqlite3", "aiosqlite"))

    def is_transient(self, error: DBAPIError) -> bool:
        if isinstance(error, OperationalError):
            return True
        return getattr(error.orig, "sqlstate", None) in _RETRYABLE

    def violation(self, error: DBAPIError, table: str, unique_columns: Mapping[str, str]) -> tuple[str, str] | None:
        """Read from the driver's diagnostics, never from the message text
        (which carries the failing row's values): SQLSTATE, table, column
        and constraint names. psycopg 3 and psycopg2 carry the server's
        fields as ``diag``; asyncpg's own exception (the cause of
        SQLAlchemy's adapted one) as attributes."""
        orig = error.orig
        diag = getattr(orig, "diag", None)
        cause = getattr(orig, "__cause__", None)
        if diag is None and hasattr(cause, "table_name"):
            diag = cause
        if diag is None:
            return None
        sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or ""
        kind = _VIOLATIONS.get(sqlstate)
        if kind is None or getattr(diag, "table_name", None) != table:
            return None
        if kind == "not_null":
            column = getattr(diag, "column_name", None)
            return (kind, column) if column else None
        column = unique_columns.get(getattr(diag, "constraint_name", None) or "")
        return (kind, column) if column else None

    def forget(self) -> None:
        self._code_point_order.clear()

    @contextlib.contextmanager
    def reading_any_text(self, conn: Connection) -> Iterator[None]:
        """Nothing to do: PostgreSQL refuses text that is not valid in the
        database's encoding when it is written."""
        yield

    def sorts_by_code_point(self, conn: Connection, ask_collation: Callable[[], Any]) -> bool:
        """When the column's collation is the database's and that one is
        ``C``, ``POSIX`` or ``C.UTF-8`` (libc) or the builtin provider's,
        never under a linguistic collation (glibc's ``en_US.UTF-8``, ICU).
        ``ask_collation()`` returns (collation, datcollate, provider)."""
        key = conn.engine.url.render_as_string(hide_password=True)
        known = self._code_point_order.get(key)
        if known is None:
            row = ask_collation()
            known = self._code_point_order[key] = row is not None and (
                row[0] in ("C", "POSIX")  # the column's own (revision w0010: "C")
                or (row[0] == "default" and (row[2] == "b" or (row[2] == "c" and row[1] in _CODE_POINT_COLLATIONS)))
            )
        return known


@cache
def _raw_cursor() -> type[Any]:
    """psycopg's ``RawCursor`` (imported once a psycopg engine runs a hot statement)."""
    import psycopg

    return psycopg.RawCursor


@cache
def _raw_async_cursor() -> type[Any]:
    """psycopg's ``AsyncRawCursor`` (as :func:`_raw_cursor`, for the async driver)."""
    import psycopg

    return psycopg.AsyncRawCursor


def _execute_native_async(conn: Connection, text: str, args: tuple[Any, ...]) -> list[Sequence[Any]]:
    """``PostgreSQL.execute_rows`` for async psycopg: the ``AsyncRawCursor`` on the
    driver's connection, awaited from the greenlet the async engine runs its
    sync API in (as SQLAlchemy's own adapted cursor awaits). Errors take
    SQLAlchemy's path as in the sync case; the cursor is closed here."""
    driver_connection = conn.connection.driver_connection
    cursor = _raw_async_cursor()(driver_connection)
    try:
        await_only(cursor.execute(text, args))
        rows: list[Sequence[Any]] = await_only(cursor.fetchall())
    except conn.dialect.loaded_dbapi.Error as error:
        conn._handle_dbapi_exception(error, text, args, None, None)
    finally:
        await_only(cursor.close())
    return rows
