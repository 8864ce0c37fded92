"""The SQLite backend: one writer at a time, ``BEGIN IMMEDIATE``, WAL reads."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Integer, Select, Text, and_, bindparam, func, select, text, type_coerce, union_all
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from ._dbapi import execute_plain
from .triggers import TRIGGER_NAMES, edge_triggers


class UnreadableText(str):
    """Stored text that is not UTF-8 (SQLite keeps whatever bytes a producer
    wrote), read with U+FFFD in place of each undecodable byte sequence:
    the type marks it, so the store lists it as unknown and a claim
    isolates the job. Binding it back never matches the stored bytes."""

    __slots__ = ()


def _tolerant_text(data: bytes) -> str:
    """SQLite's ``text_factory`` on the library's own operations: UTF-8,
    and never an error for text that is not (:class:`UnreadableText`)."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return UnreadableText(data.decode(errors="replace"))


#: SQLite's fixed wording of a one-column NOT NULL / UNIQUE failure.
_VIOLATION = "(NOT NULL|UNIQUE) constraint failed: {table}\\.(\\w+)"


class SQLite:
    """SQLite (pysqlite, aiosqlite)."""

    name = "sqlite"
    # No round trips to save, and a reader that later writes must hold the
    # lock from the start: transactions everywhere.
    self_committing = False
    # A failed statement undoes itself only.
    aborts_on_error = False
    writes_return_rows = True
    isolation_level: str | None = None
    notifies = False
    advisory_xact_lock = False
    # Its planner is told to read the prefix range first.
    prefix_range_marker = "job_id_range_first"
    # SQLite uses a partial index only for a query repeating its predicate.
    repeats_partial_predicates = True
    # BEGIN IMMEDIATE: the write lock is held before any statement reads.
    locks_before_reading = True
    row_address: str | None = None
    insert_select_locks_table = False
    # Revision w0010: a column keeps whatever type a writer gave a value
    # unless a CHECK refuses it; the one-column CHECKs are the table's.
    checks_stored_types = True
    column_domains = False
    # INTEGER PRIMARY KEY: the rowid itself (BIGINT would not autoincrement).
    bigint_pk_type: TypeEngine[int] | None = Integer()
    # BINARY already sorts by code point.
    code_point_text: TypeEngine[str] | None = None
    # TEXT holds any length.
    long_text: TypeEngine[str] | None = None
    fails_over = False
    limited_claim_at_once = False
    has_schemas = False
    has_databases = False
    triggers_tell_dependents = True
    trigger_names: tuple[str, ...] = TRIGGER_NAMES

    def bounded_text(self, length: int) -> TypeEngine[str] | None:
        return None  # TEXT indexes whole

    def partial_index(self, where: str) -> dict[str, Any]:
        return {"sqlite_where": text(where)}

    def key_prefix(self, lengths: Mapping[str, int]) -> dict[str, Any]:
        return {}  # no limit on a key's length that the schema reaches

    def insert(self, table: Any) -> Insert:
        return sqlite.insert(table)

    def upsert(self, stmt: Insert, key: Sequence[Any], set_: Callable[[Any], dict[str, Any]]) -> Insert:
        upserted: Insert = stmt.on_conflict_do_update(index_elements=list(key), set_=set_(stmt.excluded))  # type: ignore[attr-defined]
        return upserted

    # -- DDL ------------------------------------------------------------------------

    def trigger_sql(self, clock: str | None = None) -> list[str]:
        return [
            f"CREATE TRIGGER {name} {event} FOR EACH ROW WHEN {when} BEGIN {body}; END"
            for name, event, when, body in edge_triggers(clock or self.clock_ms_sql())
        ]

    def drop_trigger_sql(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {name}" for name in TRIGGER_NAMES]

    def count_triggers_sql(self) -> str:
        names = ", ".join(f"'{name}'" for name in TRIGGER_NAMES)
        return f"SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name IN ({names})"

    def domain_sql(self, domain: str, base: str, check: str, condition: str) -> list[str]:
        return []  # no domains: the table's own CHECKs

    def drop_domain_sql(self, domain: str) -> list[str]:
        return []

    # -- URLs -----------------------------------------------------------------------

    def with_default_driver(self, url: URL) -> URL:
        return url  # pysqlite, the standard library's

    def sync_url(self, url: URL) -> URL:
        return url.set(drivername="sqlite") if url.get_driver_name() == "aiosqlite" else url

    def unshareable(self, url: URL) -> str | None:
        if (url.database or ":memory:") == ":memory:":
            return (
                "an in-memory SQLite database is private to one connection, and a runner uses "
                "several; name a file (or leave the option out: a fresh file per test)"
            )
        return None

    def missing_database(self, url: URL) -> str | None:
        """Connecting would create the file: a name that is not there is said here."""
        database = url.database or ""
        on_disk = database not in ("", ":memory:") and not database.startswith("file:")
        if on_disk and not Path(database).exists():
            return f"there is no SQLite database at {database}"
        return None

    # -- the hot statements' fast path ----------------------------------------------

    def execute_rows(self, conn: Connection, text: str, args: Any, *, native: bool = False) -> list[Sequence[Any]]:
        return execute_plain(conn, text, args)  # no native form here

    def json_rows(
        self, name: str, fields: Sequence[tuple[str, Any]], *, limit: ColumnElement[Any] | None = None
    ) -> tuple[Any, dict[str, ColumnElement[Any]], Any]:
        source: Any = func.json_each(bindparam(name, type_=Text())).table_valued("key", "value").alias(name)
        columns: dict[str, ColumnElement[Any]] = {
            field: type_coerce(func.json_extract(source.c.value, f"$[{index}]"), type_)
            for index, (field, type_) in enumerate(fields)
        }
        if limit is not None:
            # Each field extracted once, in the subquery, and named (as on PostgreSQL).
            typed = select(*(column.label(field) for field, column in columns.items()), source.c.key)
            counted_source = typed.limit(limit).subquery(name)
            return counted_source, {field: counted_source.c[field] for field in columns}, counted_source.c.key
        return source, columns, source.c.key

    def skip_locked(self, pick: Select[Any]) -> Select[Any]:
        return pick  # the write lock (BEGIN IMMEDIATE) serialises writers

    def locked(self, query: Select[Any]) -> Select[Any]:
        return query  # BEGIN IMMEDIATE: the write lock serialises writers

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
        return key.in_(pick) if recheck is None else and_(key.in_(pick), recheck)

    def among(self, key: ColumnElement[Any], pick: Select[Any]) -> ColumnElement[bool]:
        return key.in_(pick)

    def union_picked(self, parts: Sequence[tuple[Select[Any], str]]) -> Any:
        return union_all(*(select(part.subquery()) for part, _name in parts)).subquery("lane_jobs")

    def share_locked(self, query: Select[Any], table: Any) -> Select[Any]:
        return query

    def forget(self) -> None:
        pass  # nothing learnt

    @contextlib.contextmanager
    def reading_any_text(self, conn: Connection) -> Iterator[None]:
        """Read text that is not UTF-8 as :class:`UnreadableText` instead of
        failing the fetch, while the block runs; the DBAPI connection's own
        ``text_factory`` is restored afterwards, so the application's use of
        the same pooled connection is unchanged."""
        driver: Any = conn.connection.driver_connection  # sqlite3's, or aiosqlite's (the same property)
        try:
            before = driver.text_factory
            driver.text_factory = _tolerant_text
        except ValueError:
            # aiosqlite's connection is already closed ("no active connection"):
            # the operation's first statement fails as a database error, which
            # the gateway handles (a fresh connection, a retry) -- not here.
            yield
            return
        try:
            yield
        finally:
            # Closed meanwhile (a cancelled task, an invalidated connection):
            # nothing left to restore.
            with contextlib.suppress(ValueError):
                driver.text_factory = before

    def clock_ms_sql(self) -> str:
        return "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"

    def greatest_sql(self, arguments: str) -> str:
        # SQLite's multi-argument max() is the scalar maximum.
        return f"max({arguments})"

    def text_length_sql(self, argument: str) -> str:
        return f"length({argument})"

    def begin_write(self, conn: Connection) -> None:
        """Take the write lock at the start of the transaction.

        A deferred transaction that reads first and writes later cannot wait
        for the lock (SQLite returns "database is locked" at once, or
        ``SQLITE_BUSY_SNAPSHOT`` in WAL mode); ``BEGIN IMMEDIATE`` waits for
        it under the driver's busy timeout instead (pysqlite's ``timeout``,
        5 s by default), in line with the application's own writers.
        """
        dbapi = conn.connection.dbapi_connection
        if getattr(dbapi, "in_transaction", False):
            return
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    def reads_beside_writer(self, conn: Connection) -> bool:
        """Whether ``conn`` is in WAL mode, where reads never block the writer.

        With a rollback journal they do: a committing writer must wait
        (sleeping in the busy handler) until every reader's shared lock is
        gone, so there the store's reads keep taking the write lock, which
        serialises them with the writers instead. The journal mode is read
        once per pooled connection.
        """
        info = conn.connection.info
        mode = info.get("watchdog_journal_mode")
        if mode is None:
            mode = info["watchdog_journal_mode"] = str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()
        return bool(mode == "wal")

    def owns_error(self, error: DBAPIError) -> bool:
        return type(error.orig).__module__.startswith(("sqlite3", "aiosqlite"))

    def is_transient(self, error: DBAPIError) -> bool:
        # "no such table" is an OperationalError too; only contention passes.
        if not isinstance(error, OperationalError):
            return False
        message = str(error.orig).lower()
        return "locked" in message or "busy" in message

    def violation(self, error: DBAPIError, table: str, unique_columns: Mapping[str, str]) -> tuple[str, str] | None:
        """Read from SQLite's message, whose format SQLite fixes, matched in full."""
        match = re.fullmatch(_VIOLATION.format(table=re.escape(table)), str(error.orig).strip())
        if match is None:
            return None
        return ("not_null" if match.group(1) == "NOT NULL" else "unique", match.group(2))

    def sorts_by_code_point(self, conn: Connection, ask_collation: Callable[[], Any]) -> bool:
        # BINARY: UTF-8 bytes, which sort by code point.
        return True
