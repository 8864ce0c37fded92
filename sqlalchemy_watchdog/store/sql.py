"""The shared pieces of the store's SQL statements, built with SQLAlchemy Core.

Each store feature owns its statements beside it (``store/<feature>_sql.py``:
``enqueue_sql``, ``claims_sql``, ``limits_sql``, ``maintenance_sql``,
``dependencies_sql``, ``chart_sql``); what several of them share lives here:
the selected columns, the state literals, the clock, bind parameters, many
rows as one parameter, claim order and the batch-size helpers.

Internal module: its names may change in any release; the public API is
what :mod:`sqlalchemy_watchdog` exports.

Each statement is built once per backend (PostgreSQL or SQLite) and
kept: values travel as named bind parameters, so SQLAlchemy compiles each
statement once, psycopg can prepare it server-side, and the hot path (claim,
settle, renew) builds nothing per call. Many rows travel as one JSON array
parameter (``jsonb_array_elements`` on PostgreSQL, ``json_each`` on SQLite),
so a batch is still one constant statement.
:mod:`sqlalchemy_watchdog.store` runs them. Time is in
milliseconds since the Unix epoch, and always read inside the statement:

* a claim holder's own checks (settle, renew) require ``lease_until >
  max(application now, database clock)``: a delayed request cannot
  resurrect an expired lease, and a worker clock running ahead can only
  shorten its own lease, never lengthen it;
* leases are extended from the database clock alone (``clock + lease``), so
  no worker clock can stretch one;
* recovery takes over another runner's claim only when ``lease_until <=
  database clock``, so a recoverer's clock running ahead cannot steal a live
  lease.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    BindParameter,
    Float,
    Integer,
    Select,
    Text,
    Update,
    bindparam,
    cast,
    literal_column,
    select,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from ..backends import Backend, backend_of
from ..columns import JOB_COLUMNS
from ..jobs import JobState
from ..model import (
    edges_table,
    jobs_table,
    limits_table,
    pauses_table,
)

t = jobs_table
c = t.c
pauses = pauses_table
edges = edges_table

#: The columns every read returns (``lease_until`` only where a caller needs
#: it), as :data:`~sqlalchemy_watchdog.columns.JOB_COLUMNS` declares them.
COLUMNS = tuple(c[spec.column] for spec in JOB_COLUMNS)

_DELAYED = JobState.DELAYED.value
_QUEUED = JobState.QUEUED.value
_RUNNING = JobState.RUNNING.value
_SETTLED = JobState.SETTLED.value
_WAITING = JobState.WAITING.value

# States in WHERE clauses are SQL literals, not bound parameters: the
# partial indexes' predicates must be provable from the query text itself
# (SQLite requires it; PostgreSQL needs it for generic prepared plans).
IS_DELAYED = c.state == literal_column(f"'{_DELAYED}'")
IS_QUEUED = c.state == literal_column(f"'{_QUEUED}'")
IS_RUNNING = c.state == literal_column(f"'{_RUNNING}'")
IS_SETTLED = c.state == literal_column(f"'{_SETTLED}'")
#: ``running`` written so that it does not imply ``ix_watchdog_jobs_lease``'s
#: predicate (``state = 'running'``): the same rows under the CHECK grammar
#: of four states, for a statement that must look its rows up by key (settle).
IS_RUNNING_UNINDEXED = c.state.not_in([literal_column(f"'{state}'") for state in (_DELAYED, _QUEUED, _SETTLED)])
# The same literal order as the live indexes' predicate (model.LIVE).
#: Revision w0014: as ix_watchdog_jobs_waiting's predicate says it.
IS_WAITING = c.state == literal_column(f"'{_WAITING}'")
IS_LIVE = c.state.in_([literal_column(f"'{state}'") for state in (_DELAYED, _QUEUED, _RUNNING)])


class db_clock_ms(FunctionElement[int]):
    """The database's own clock in integer milliseconds since the epoch."""

    type = BigInteger()
    inherit_cache = True
    name = "db_clock_ms"


@compiles(db_clock_ms)
def _clock(element: db_clock_ms, compiler: Any, **kw: Any) -> str:
    return backend_of(compiler.dialect).clock_ms_sql()


class effective_now(FunctionElement[int]):
    """``max(:now_ms, database clock)``, evaluated by the database."""

    type = BigInteger()
    inherit_cache = True
    name = "effective_now"

    def __init__(self, now_ms: ColumnElement[int]) -> None:
        super().__init__(now_ms, db_clock_ms())


@compiles(effective_now)
def _effective_now(element: effective_now, compiler: Any, **kw: Any) -> str:
    return backend_of(compiler.dialect).greatest_sql(compiler.process(element.clauses, **kw))


class text_length(FunctionElement[int]):
    """The length of a text in characters (MySQL's ``LENGTH`` counts bytes)."""

    type = Integer()
    inherit_cache = True
    name = "text_length"


@compiles(text_length)
def _text_length(element: text_length, compiler: Any, **kw: Any) -> str:
    return backend_of(compiler.dialect).text_length_sql(compiler.process(element.clauses, **kw))


def _insert(backend: Backend) -> Any:
    return _insert_into(backend, t)


def _insert_into(backend: Backend | str, table: Any) -> Any:
    return backend_of(backend).insert(table)


def _p(name: str, type_: Any = None) -> BindParameter[Any]:
    return bindparam(name, type_=type_)


#: The application clock (epoch ms) as sent by the caller.
NOW = _p("now", BigInteger())


Fields = tuple[tuple[str, Any], ...]

#: What identifies a job: an identical replay has equal values in all of these
#: (the columns :data:`~sqlalchemy_watchdog.columns.JOB_COLUMNS` marks ``identity``).
IDENTITY_FIELDS: Fields = tuple((spec.column, spec.identity.bind) for spec in JOB_COLUMNS if spec.identity is not None)
#: An enqueued row: its identity, then what is not part of it -- the
#: enqueue's delay and the trace context it was enqueued under.
ENQUEUE_FIELDS: Fields = (
    *IDENTITY_FIELDS,
    ("delay_ms", BigInteger()),
    ("trace_context", Text()),
    # Revision w0012: a job with parents not settled yet waits for them.
    ("waiting_on", Integer()),
    ("after_policy", Text()),
)
SETTLE_FIELDS: Fields = (
    ("job_id", Text()),
    ("claim_token", Text()),
    ("outcome", Text()),
    ("reason", Text()),
    ("detail", Text()),
    # A requeue (retry or snooze) instead of a settle: ready again delay_ms
    # after the database clock, with these counters moved and this history.
    ("delay_ms", BigInteger()),
    ("attempt_add", Integer()),
    ("snooze_add", Integer()),
    ("history", Text()),
    # The result of a completed job (canonical JSON), NULL for none.
    ("result", Text()),
    # The attempt's last progress not written yet (rate limit), NULL for none.
    ("progress", Float()),
    ("progress_note", Text()),
)


def _rows(
    backend: Backend, name: str, fields: Fields, *, counted: bool = False, sized: bool = False
) -> tuple[Any, dict[str, Any], Any]:
    """A FROM source yielding the rows sent as one JSON array of arrays in
    the bind parameter ``name``, in order (see :func:`rows_params`).

    One text parameter, whatever the batch size: encoding it is one call to
    the C JSON encoder, where per-column arrays cost psycopg a Python loop
    over every element. PostgreSQL reads it as ``jsonb`` with
    ``jsonb_array_elements`` (parsed once: ``->>`` on ``json`` re-parses the
    element for every field, which made a 1,000-row enqueue statement 1.7x
    slower), SQLite with ``json_each``.

    ``counted``: the source reads at most ``:<name>_count`` rows -- all of
    them (:func:`rows_params` sends the count), but a planner that cannot
    see into the JSON then estimates a tenth of its default hundred rows
    instead of the hundred, which is what makes it look the rows up one by
    one (see :func:`settle`). ``sized``: that number is written into the
    text at each execution instead (:func:`batch_size`): the generic plan of
    a prepared statement then knows it as a custom plan does (see
    :func:`settle`).

    Returns the source, its columns by field name, and its ordering column.
    """
    limit: BindParameter[Any] | None = None
    if counted:
        limit = batch_size(f"{name}_count") if sized else _p(f"{name}_count", Integer())
    return backend.json_rows(name, fields, limit=limit)


def rows_params(backend: Backend, name: str, fields: Fields, rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The bind parameters that carry ``rows`` (tuples in ``fields`` order),
    and their count (for a ``counted`` source).

    A row may be shorter than ``fields``: the fields it leaves out are read
    as NULL (``->>`` and ``json_extract`` past an array's end are NULL).
    """
    return {name: _ROWS_ENCODER.encode(rows), f"{name}_count": len(rows)}


#: Tuples encode as JSON arrays; ``check_circular`` is off (rows are flat).
_ROWS_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False, separators=(",", ":"))


def row_params(name: str, fields: Fields, row: Sequence[Any]) -> dict[str, Any]:
    """The bind parameters of :func:`_bound_row`: ``row`` (a tuple in
    ``fields`` order, which may stop early: the rest are NULL)."""
    names = _bound_names(name, fields)
    params = dict.fromkeys(names)
    params.update(zip(names, row))
    return params


def _bound_names(name: str, fields: Fields) -> tuple[str, ...]:
    key = (name, fields)
    names = _BOUND_NAMES.get(key)
    if names is None:
        names = _BOUND_NAMES[key] = tuple(f"{name}_{field}" for field, _ in fields)
    return names


_BOUND_NAMES: dict[tuple[str, Fields], tuple[str, ...]] = {}


def _bound_row(name: str, fields: Fields) -> dict[str, Any]:
    """The columns of one row sent as a bind parameter per field (see
    :func:`row_params`): the one-row form of :func:`_rows`, with no FROM.

    A statement over it is short to parse and plan: where statements cannot
    be prepared (a pooler in transaction mode), parsing and planning the
    ``jsonb`` source of one job cost about 150 us more than this form.
    """
    # CAST: a NULL bound without a type (psycopg2, asyncpg) is read as text.
    names = _bound_names(name, fields)
    return {field: cast(_p(bound, type_), type_) for (field, type_), bound in zip(fields, names, strict=True)}


_QUEUES: BindParameter[Any] = bindparam("queues", expanding=True)

#: The job's queue is not paused: read in the claim statement itself, so a
#: pause that committed before the claim started is never crossed. NOT IN
#: (``queue_name`` and the pauses' key are NOT NULL, so it means NOT EXISTS):
#: PostgreSQL checks it per row against a hashed set, where a NOT EXISTS
#: becomes an anti-join whose estimates made it read and sort a queue's
#: whole backlog instead of reading ``ix_watchdog_jobs_live_queue`` in
#: claim order (tests/integration/test_plans.py).
UNPAUSED = c.queue_name.not_in(select(pauses.c.queue_name).scalar_subquery())
#: The job's queue has no limits (revision w0011): the plain claim never takes
#: a limited queue's job, even when the limit was set after the store read
#: the limits; the limited claim (:func:`claim_limited`) takes those.
UNLIMITED = c.queue_name.not_in(select(limits_table.c.queue_name).scalar_subquery())


def queue_params(queues: Sequence[str]) -> dict[str, str]:
    """The bind parameters of :func:`claim`'s ``queue_count`` queues."""
    return {f"queue_{index}": queue for index, queue in enumerate(queues)}


#: Claim order: higher priority first, then admission order.
CLAIM_ORDER = (c.priority.desc(), c.sequence)


#: The largest claim whose ``LIMIT`` is written into the statement's text
#: (:func:`claim` with ``sized``), and the largest settle whose row count is
#: (:func:`settle` with ``sized``): every smaller batch size is a text of its
#: own, prepared and planned once per connection; a larger batch sends its
#: number as a parameter and is planned at each execution (its planning then
#: shared by more than this many jobs).
LITERAL_LIMIT_MAX = 32


def batch_size(name: str) -> BindParameter[Any]:
    """The parameter ``:name``, a batch size written into the statement's
    text at each execution (SQLAlchemy's ``literal_execute``), so a prepared
    statement's generic plan knows it as its custom plans do.

    One statement is built and compiled for every size: SQLAlchemy renders
    the number where its compiled text has ``__[POSTCOMPILE_<name>]``, and
    so does ``store.views`` for the statements it sends precompiled (once
    per size, checked by :func:`literal_size`). Built with the number
    itself, each size was a statement of its own to build and compile:
    about 6 ms for a settle, 1.5 ms for a claim, up to a quarter of a
    second in every new worker process."""
    return bindparam(name, type_=Integer(), literal_execute=True)


def literal_size(field: str, size: object) -> int:
    """``size``, a batch size that may be written into a statement's text
    (1 to :data:`LITERAL_LIMIT_MAX`), or a ValueError naming ``field``."""
    if type(size) is int and 1 <= size <= LITERAL_LIMIT_MAX:
        return size
    raise ValueError(f"{field}: a whole number from 1 to {LITERAL_LIMIT_MAX}, got {size!r}")


def size_in_text(size: int) -> bool:
    """Whether a batch of ``size`` has its size written into the statement's
    text (the ``sized`` statement, up to :data:`LITERAL_LIMIT_MAX`), or
    sent as a parameter."""
    return 0 < size <= LITERAL_LIMIT_MAX


#: The keys (``sequence``) of the jobs a locking read returned, as an
#: expanding parameter (:func:`by_key`).
KEYS: BindParameter[Any] = bindparam("keys", expanding=True)


@dataclass(frozen=True)
class ByKey:
    """A guarded ``UPDATE ... RETURNING`` of ``watchdog_jobs`` as three
    statements, for a backend whose writes return no rows
    (``Backend.writes_return_rows``; see ``store.views.write_returning``):

    * ``pick``: the ``sequence`` of the rows the write's WHERE selects,
      locked (``FOR UPDATE``) -- the same guard, the same parameters;
    * ``write``: the write itself, its guard kept, also limited to ``:keys``;
    * ``read``: what the write returned, read back by ``:keys``.
    """

    pick: Select[Any]
    write: Update
    read: Select[Any]


_BY_KEY: dict[tuple[Update, Backend], ByKey] = {}


def by_key(backend: Backend, stmt: Update) -> ByKey:
    """:class:`ByKey` of ``stmt`` (a cached statement of the store: built once each)."""
    found = _BY_KEY.get((stmt, backend))
    if found is None:
        where = stmt.whereclause
        assert where is not None, "a guarded write has a WHERE clause"
        returned = list(stmt.exported_columns)
        # The jobs' table or its alias (the settle's ``j``, updated from its rows).
        key = stmt.table.c.sequence
        write = stmt._generate()
        write._returning = ()  # the same SET and WHERE, nothing returned
        found = _BY_KEY[(stmt, backend)] = ByKey(
            pick=backend.locked(select(key).where(where)),
            write=write.where(key.in_(KEYS)),
            read=select(*returned).where(key.in_(KEYS)),
        )
    return found
