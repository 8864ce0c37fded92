"""The hot statements precompiled.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

import logging
import re
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Connection, Integer, Row, Update
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from ..backends import backend_of
from . import sql

log = logging.getLogger("sqlalchemy_watchdog.store")


# -- the hot statements, precompiled ------------------------------------------


@dataclass(frozen=True, slots=True)
class _Precompiled:
    """A statement compiled once for one dialect: the SQL text the driver
    gets, the statement's own literal parameters, and -- for a positional
    paramstyle (SQLite's ``?``) -- the order of the parameter names."""

    text: str
    defaults: Mapping[str, Any]
    positions: tuple[str, ...] | None
    #: psycopg 3: the text with PostgreSQL's own ``$n`` placeholders and the
    #: parameter name of each ``n`` (see :func:`_native`); None for others.
    native: tuple[str, tuple[str, ...]] | None = None
    #: The batch sizes written into the text at each execution
    #: (``sql.batch_size``), by parameter name; their places in the
    #: texts are SQLAlchemy's ``__[POSTCOMPILE_<name>]``.
    sized: tuple[str, ...] = ()
    #: This statement with its sizes written in, per their values (each made
    #: once, by :func:`_with_sizes`).
    variants: dict[tuple[int, ...], _Precompiled] = field(default_factory=dict, compare=False)


def _with_sizes(pre: _Precompiled, values: Mapping[str, Any]) -> _Precompiled:
    """``pre`` with the batch sizes in ``values`` written into its texts (a
    size outside 1..LITERAL_LIMIT_MAX is a ValueError naming it)."""
    key = tuple(values[name] for name in pre.sized)
    variant = pre.variants.get(key)
    # Not a cached text for an equal value of another type (8.0, True).
    if variant is None or not all(type(size) is int for size in key):
        text, native = pre.text, pre.native
        for name, size in zip(pre.sized, key, strict=True):
            marker, literal = f"__[POSTCOMPILE_{name}]", str(sql.literal_size(name, size))
            text = text.replace(marker, literal)
            native = None if native is None else (native[0].replace(marker, literal), native[1])
        variant = _Precompiled(text, pre.defaults, pre.positions, native)
        pre.variants[key] = variant  # a race makes the same variant twice: harmless
    return variant


#: psycopg's named placeholder, and its escaped percent sign.
_PYFORMAT = re.compile(r"%\((\w+)\)s|%%")


def _native(text: str) -> tuple[str, tuple[str, ...]]:
    """``text``'s ``%(name)s`` placeholders as ``$1``, ``$2``, ... (one number
    per name, however often it appears) and ``%%`` as ``%``, with the names
    in number order: what psycopg's query converter makes of it, done once.

    psycopg caches that conversion only for statements of up to 4,096
    characters; a longer one (the limited claim's one statement, about 14,700; the
    claim of four or more queues) was parsed for its placeholders in Python
    at every execution -- 180 microseconds of the client's CPU per limited
    claim. A ``RawCursor`` sends the converted text as it is.
    """
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        return f"${numbers.setdefault(name, len(numbers) + 1)}"

    return _PYFORMAT.sub(number, text), tuple(numbers)


def _constant(value: Any) -> str | None:
    """``value`` as an SQL literal, or None to keep it a parameter: whole
    numbers and text only (what the builders' constants are); text with a
    backslash stays a parameter (its reading depends on the server's
    ``standard_conforming_strings``)."""
    if type(value) is int:
        return str(value) if value >= 0 else f"({value})"
    if type(value) is str and "\\" not in value:
        return "'" + value.replace("'", "''").replace("%", "%%") + "'"
    return None


def _inline_constants(text: str, defaults: dict[str, Any]) -> str:
    """``text`` (pyformat) with the statement's own constants -- the
    parameters SQLAlchemy made of literal values in the builders: a
    ``LIMIT 1``, a ``COALESCE(x, 0)``, a state's name in a ``CASE`` --
    written in as literals and taken out of ``defaults``; the parameters
    a caller supplies stay parameters.

    PostgreSQL plans a prepared statement for its first five executions
    with the values given (custom plans), then keeps one generic plan if
    that is not estimated dearer. A constant sent as a parameter is unknown
    to the generic plan -- a ``LIMIT $n`` is estimated at a tenth of the
    rows -- so the limited claim's one statement with keyed jobs looked
    dearer generic than custom and was planned again at every claim: 1.4 ms
    of planning for a claim that runs in about 2. With its constants in the
    text both plans know them, and the generic one is kept.
    """

    def inline(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None or name not in defaults:
            return match.group(0)
        literal = _constant(defaults[name])
        if literal is None:
            return match.group(0)
        return literal

    inlined = _PYFORMAT.sub(inline, text)
    for name in [name for name, value in defaults.items() if _constant(value) is not None]:
        del defaults[name]
    return inlined


#: Per dialect (an engine's), per statement (by identity: the statement
#: builders of the store cache theirs, and the entry keeps it alive).
_PRECOMPILED: weakref.WeakKeyDictionary[Dialect, dict[int, tuple[Executable, _Precompiled | None]]] = (
    weakref.WeakKeyDictionary()
)


def _precompiled(dialect: Dialect, stmt: Executable) -> _Precompiled | None:
    """``stmt`` compiled for ``dialect``, once; None for a statement the
    driver cannot be given as it is (a parameter needing a bind processor,
    an expanding ``IN``)."""
    cached = _PRECOMPILED.setdefault(dialect, {})
    entry = cached.get(id(stmt))
    if entry is not None and entry[0] is stmt:
        return entry[1]
    compiled = cast(SQLCompiler, cast(ClauseElement, stmt).compile(dialect=dialect))
    plain = True
    defaults: dict[str, Any] = {}
    # Batch sizes (sql.batch_size): whole numbers written in at execution.
    sized = tuple(sorted(bind.key for bind in compiled.literal_execute_params))
    for bind in compiled.literal_execute_params:
        if bind.expanding or not isinstance(bind.type, Integer) or not bind.required:
            plain = False
    for bind, name in compiled.bind_names.items():
        if bind.expanding or bind.type.dialect_impl(dialect).bind_processor(dialect) is not None:
            plain = False
        if not bind.required and name not in sized:
            defaults[name] = bind.effective_value
    result = None
    if plain and not compiled.post_compile_params:
        positions = None
        if compiled.positional and compiled.positiontup:
            positions = tuple(name for name in compiled.positiontup if name not in sized)
        text, native = compiled.string, None
        if dialect.driver == "psycopg" and dialect.paramstyle == "pyformat":
            text = _inline_constants(text, defaults)
            native = _native(text)
        result = _Precompiled(text, defaults, positions, native, sized)
    cached[id(stmt)] = (stmt, result)
    return result


# -- plans made anew when a hot statement turns slow ----------------------------

#: A hot statement that takes longer than this, plus :data:`REPLAN_PER_ROW_S`
#: for each row it returned, has its connection's hot statements planned anew
#: (:func:`_replan_if_slow`). A claim or settle of a dozen jobs takes about
#: 1 ms; one that reads the table whole, 10 ms at 50,000 rows.
REPLAN_AFTER_S = 0.003
REPLAN_PER_ROW_S = 0.0002
#: At most one renewal per connection in this many seconds: on a server too
#: busy for the bound above, plans are not thrown away at every statement.
REPLAN_EVERY_S = 10.0
#: Keys of the connection's pool entry ``info``: its plans' generation (0, or
#: absent, at first) and when it was last renewed (``time.monotonic()``).
_PLANS = "sqlalchemy_watchdog.plans"
_PLANS_RENEWED_AT = "sqlalchemy_watchdog.plans_renewed_at"


def plans_generation(conn: Connection) -> int:
    """How often ``conn``'s hot statements were planned anew (:func:`_replan_if_slow`)."""
    return int(conn.connection.info.get(_PLANS, 0))


def _renewed(text: str, generation: int) -> str:
    """``text`` as sent in plans generation ``generation``: a comment at the end
    makes it another statement for the driver's cache and the server."""
    return text if not generation else f"{text} /* plans {generation} */"


def _replan_if_slow(conn: Connection, elapsed: float, rows: int) -> None:
    """Have ``conn``'s hot statements planned anew (psycopg with prepared
    statements only) when the one it just ran took ``elapsed`` seconds for
    ``rows`` rows, longer than the bound above.

    PostgreSQL keeps the generic plan of a prepared statement once it looks no
    dearer than the custom ones, until the table is analysed again. A generic
    plan made while ``watchdog_jobs`` held a few rows (a new deployment, a
    small table before a burst) reads the table whole -- cheaper than an index
    or TID lookup per row when the table has a few pages, 10 ms a statement
    once it holds 50,000 rows -- until autovacuum's next analyze, a minute or
    more later. The connection's next generation of texts (:func:`_renewed`)
    is prepared anew by psycopg and planned on the table as it is now; the old
    statements leave psycopg's cache as it rotates (``prepared_max``). Not
    ``DEALLOCATE ALL``: psycopg would not always notice it, and would then
    execute statements the server no longer has. At most once per
    :data:`REPLAN_EVERY_S` per connection.
    """
    if elapsed <= REPLAN_AFTER_S + REPLAN_PER_ROW_S * rows or conn.dialect.driver != "psycopg":
        return
    if getattr(conn.connection.driver_connection, "prepare_threshold", None) is None:
        return  # prepared statements are off (a transaction-mode pooler): every statement is planned anew
    info = conn.connection.info
    now = time.monotonic()
    if now - info.get(_PLANS_RENEWED_AT, -REPLAN_EVERY_S) < REPLAN_EVERY_S:
        return
    info[_PLANS_RENEWED_AT] = now
    info[_PLANS] = generation = info.get(_PLANS, 0) + 1
    log.debug(
        "a hot statement took %.1f ms for %d rows: its connection's plans are made anew (generation %d)",
        elapsed * 1e3,
        rows,
        generation,
    )


def _observed(conn: Connection) -> bool:
    """Whether anything listens to ``conn``'s statements (SQLAlchemy engine
    or connection events: OpenTelemetry's SQLAlchemy instrumentation, a test
    counting statements); they then go through SQLAlchemy's execution."""
    dispatch = conn.dispatch
    return bool(
        dispatch.before_execute
        or dispatch.after_execute
        or dispatch.before_cursor_execute
        or dispatch.after_cursor_execute
    )


def execute_rows(conn: Connection, stmt: Executable, params: Mapping[str, Any]) -> list[Sequence[Any]]:
    """Run one of the runner's hot statements (claim, settle, enqueue: each
    has RETURNING) and return its rows as the driver's tuples.

    The statement is compiled once per dialect and handed to the DBAPI
    cursor as text, which the driver prepares after a few executions
    (psycopg) -- no per-call cache key, parameter processing or result
    metadata: about a third of the client's CPU per job when the runner
    used ``Connection.execute``. A driver error takes SQLAlchemy's own path
    (wrapped as ``DBAPIError``, a dropped connection invalidated), so the
    retry rules and error mapping are those of every other statement. When
    engine or connection events listen, the statement goes through
    ``Connection.exec_driver_sql`` instead, so listeners see every
    statement the store sends. A statement far slower than its rows
    explain has the connection's plans made anew (:func:`_replan_if_slow`).
    """
    started = time.perf_counter()
    rows = _execute_rows(conn, stmt, params)
    _replan_if_slow(conn, time.perf_counter() - started, len(rows))
    return rows


def _execute_rows(conn: Connection, stmt: Executable, params: Mapping[str, Any]) -> list[Sequence[Any]]:
    """:func:`execute_rows` without its plan check."""
    pre = _precompiled(conn.dialect, stmt)
    if pre is None:
        return list(conn.execute(stmt, dict(params)))
    values = {**pre.defaults, **params}
    if pre.sized:
        pre = _with_sizes(pre, values)
    args: Any = values if pre.positions is None else tuple(values[name] for name in pre.positions)
    generation = plans_generation(conn) if pre.native is not None else 0
    if _observed(conn):
        return list(conn.exec_driver_sql(_renewed(pre.text, generation), args))
    if not conn.in_transaction():
        # What Connection.execute does first (its autobegin): the caller's
        # commit() or rollback() then ends the transaction this statement is in.
        conn.begin()
    # The driver's cursor, or the backend's fast path for a native text (psycopg's
    # raw cursor): a driver error takes SQLAlchemy's own path in either.
    if pre.native is None:
        return backend_of(conn).execute_rows(conn, pre.text, args)
    text, names = pre.native
    native_args = tuple(values[name] for name in names)
    return backend_of(conn).execute_rows(conn, _renewed(text, generation), native_args, native=True)


#: How many times :func:`write_returning` picks again when its write reached
#: fewer rows than its locking read returned.
_BY_KEY_ATTEMPTS = 3


def write_returning(conn: Connection, stmt: Update, params: Mapping[str, Any]) -> list[Row[Any]]:
    """Run ``stmt``, a guarded ``UPDATE ... RETURNING`` of ``watchdog_jobs``,
    and return its rows -- where the backend's writes return none
    (MariaDB/MySQL: ``Backend.writes_return_rows``) as three statements of
    the caller's transaction (:func:`sql.by_key`): a locking read of the
    rows the guard selects, the same guarded write limited to them by
    primary key, and a read of what it returned.

    The rows are locked between the read and the write, but the guard may
    read the clock (a lease): should the write reach fewer rows than the
    read locked (a lease ended in between), it is undone to a savepoint and
    the rows are picked again, so what is returned is exactly what was written.
    """
    backend = backend_of(conn)
    if backend.writes_return_rows:
        return list(conn.execute(stmt, params))
    parts = sql.by_key(backend, stmt)
    for _ in range(_BY_KEY_ATTEMPTS):
        keys = [row[0] for row in conn.execute(parts.pick, params)]
        if not keys:
            return []
        savepoint = conn.begin_nested()
        written = conn.execute(parts.write, {**params, "keys": keys}).rowcount
        if written != len(keys):
            savepoint.rollback()
            continue
        savepoint.commit()
        return list(conn.execute(parts.read, {"keys": keys}))
    return []
