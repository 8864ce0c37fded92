"""Every SQL statement of the queue, built in one place with SQLAlchemy Core.

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
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    BindParameter,
    Delete,
    Float,
    Insert,
    Integer,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    false,
    func,
    insert,
    literal_column,
    not_,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.util import ClauseAdapter

from .backends import Backend, backend_of
from .columns import JOB_COLUMNS
from .jobs import JobState, Outcome
from .model import (
    KEYED_QUEUED,
    KEYED_RUNNING,
    edges_table,
    jobs_table,
    limit_claims_table,
    limits_table,
    pauses_table,
    schedules_table,
    workers_table,
)
from .wakeups import CHANNEL, EVENT_QUEUED, WAITING_LOCK

__all__ = [
    "COLUMNS",
    "db_clock_ms",
    "effective_now",
    "enqueue_rows",
    "row_params",
    "read_job",
    "read_queue_head",
    "read_settled",
    "has_pending_work",
    "next_ready",
    "promote",
    "claim",
    "queue_params",
    "settle",
    "renew",
    "cancel",
    "cancellation_holder",
    "notify",
    "settle_unreadable",
    "fail_lane",
    "lane_has_live_jobs",
    "purge",
    "expired_claims",
    "reconcile",
    "release",
    "make_due",
    "register_worker",
    "deregister_worker",
    "list_workers",
    "live_worker_queues",
    "prune_workers",
    "record_schedule",
    "list_schedules",
    "prune_schedules",
]

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


def _insert(backend: Backend) -> Any:
    return _insert_into(backend, t)


def _insert_into(backend: Backend | str, table: Any) -> Any:
    return backend_of(backend).insert(table)


def _p(name: str, type_: Any = None) -> BindParameter[Any]:
    return bindparam(name, type_=type_)


#: The application clock (epoch ms) as sent by the caller.
NOW = _p("now", BigInteger())


# -- many rows as one parameter ------------------------------------------------

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


# -- enqueue --------------------------------------------------------------------


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


@cache
def enqueue_rows(backend: Backend, one: bool = False) -> Insert:
    """Insert queued jobs (rows of :data:`ENQUEUE_FIELDS` in the ``jobs``
    parameter(s), admitted in their order); ``RETURNING job_id`` names the
    ones newly admitted. ``one``: a single job, its fields each a bind
    parameter ``job_<field>`` (:func:`row_params`), for the common one-job
    enqueue.

    A replay of an identical job matches the conflict target and updates
    nothing (no row returned: a duplicate). A replay with other contents sets
    the NOT NULL ``job_id`` to NULL, which fails the statement and with it the
    caller's transaction -- never a silent no-op that would commit the
    caller's writes beside an unrelated old job.
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
    # WHERE true: SQLite's parser needs it between INSERT ... SELECT and ON CONFLICT.
    rows = select(
        *(cols[name] for name in names),
        ready_at,
        state,
        clock,
        cols["trace_context"],
        case((cols["waiting_on"] > 0, cols["waiting_on"]), else_=null()),
        cols["after_policy"],
    ).where(true())
    if source is not None:
        rows = rows.select_from(source).order_by(order)
    ins = _insert(backend).from_select(
        [*names, "ready_at", "state", "enqueued_at", "trace_context", "waiting_on", "after_policy"], rows
    )
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
def stored_contents() -> Select[Any]:
    """What an identical replay compares, for the stored jobs among ``:job_ids``."""
    return select(*(c[name] for name, _ in IDENTITY_FIELDS), c.after_policy).where(
        c.job_id.in_(bindparam("job_ids", expanding=True))
    )


# -- reads ----------------------------------------------------------------------


@cache
def read_job() -> Select[Any]:
    return select(*COLUMNS).where(c.job_id == _p("job"))


@cache
def read_queue_head() -> Select[Any]:
    """The queue's running job, else its next queued one, else its next delayed one."""
    return (
        select(*COLUMNS)
        .where(c.queue_name == _p("queue"), IS_LIVE)
        .order_by(case((IS_RUNNING, 0), (IS_QUEUED, 1), else_=2), c.priority.desc(), c.sequence)
        .limit(1)
    )


@cache
def read_settled() -> Select[Any]:
    return (
        select(*COLUMNS)
        .where(IS_SETTLED, c.sequence > _p("after_sequence"))
        .order_by(c.sequence)
        .limit(_p("limit", Integer()))
    )


@cache
def has_pending_work() -> Select[Any]:
    """A live job's queue, if any: the first entry of
    ``ix_watchdog_jobs_live_queue`` (an unordered EXISTS was planned as a scan
    that reads the whole settled history when no job is live)."""
    return select(c.queue_name).where(IS_LIVE).order_by(c.queue_name).limit(1)


# -- the claim life cycle -------------------------------------------------------


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


@cache
def any_queued(filtered: bool) -> Select[Any]:
    """A queued job's ``sequence``, if any (of the expanding ``:queues`` when
    ``filtered``): whether a claim would find anything."""
    # IS_LIVE repeats ix_watchdog_jobs_live_queue's predicate: SQLite uses a
    # partial index only for a query whose WHERE has its terms.
    pick = select(c.sequence).where(IS_QUEUED, UNPAUSED, IS_LIVE)
    if filtered:
        pick = pick.where(c.queue_name.in_(_QUEUES))
    return pick.limit(1)


@cache
def count_ready() -> Select[Any]:
    """How many queued jobs of the expanding ``:queues`` wait, up to ``:cap``
    (a runner's summary: a bounded read of ``ix_watchdog_jobs_live_queue``)."""
    pick = select(c.sequence).where(IS_QUEUED, IS_LIVE, c.queue_name.in_(_QUEUES)).limit(_p("cap", Integer()))
    return select(func.count()).select_from(pick.subquery())


@cache
def next_ready() -> Select[Any]:
    """The earliest ready time of any delayed job, and the database clock."""
    return select(
        select(c.ready_at).where(IS_DELAYED).order_by(c.ready_at).limit(1).scalar_subquery(),
        db_clock_ms(),
    )


@cache
def promote(backend: Backend) -> Update:
    """Make up to ``:limit`` delayed jobs whose time has come (by the
    database clock) ``queued``, earliest first; they keep their ``sequence``,
    so among ready jobs the order stays priority, then admission.

    Promotion is the only way out of ``delayed`` besides a cancellation or a
    lane failure; it is idempotent, and two runners promoting at once skip
    each other's rows (PostgreSQL) or take turns (SQLite's one writer).
    """
    pick = (
        select(c.sequence)
        .where(IS_DELAYED, c.ready_at <= db_clock_ms())
        .order_by(c.ready_at, c.sequence)
        .limit(_p("limit", Integer()))
    )
    target = backend.picked(c.sequence, pick, "due")
    return update(t).where(target, IS_DELAYED).values(state=_QUEUED).returning(c.sequence)


def queue_params(queues: Sequence[str]) -> dict[str, str]:
    """The bind parameters of :func:`claim`'s ``queue_count`` queues."""
    return {f"queue_{index}": queue for index, queue in enumerate(queues)}


#: Claim order: higher priority first, then admission order.
CLAIM_ORDER = (c.priority.desc(), c.sequence)


def _addressed(backend: Backend) -> list[ColumnElement[Any]]:
    """The row's address as column ``row`` where the backend has one (see
    ``Backend.row_address``), for a pick a write then reaches by address."""
    address = backend.row_address
    return [] if address is None else [literal_column(f"watchdog_jobs.{address}").label("row")]


def _queue_pick(backend: Backend, index: int, limit: BindParameter[Any], *more: str) -> Select[Any]:
    """The ``sequence``, the row's address where the backend has one
    (:func:`_addressed`) and the ``more`` columns of up to ``limit`` of queue
    ``:queue_<index>``'s queued jobs in claim order, read in that order in
    ``ix_watchdog_jobs_live_queue``; on PostgreSQL locked, skipping rows
    another claimer holds."""
    # IN (:queue_0), which PostgreSQL reads as an equality in the index (with
    # = ANY(array) it read another index filtered, past other queues' jobs).
    queue = _p(f"queue_{index}", Text())
    # The pause check names the parameter, not the column: a condition of no
    # row, checked once before the index is read, so a paused queue's backlog
    # is never walked (on the column it was a filter on every row read).
    unpaused = queue.not_in(select(pauses.c.queue_name).scalar_subquery())
    # The same for limits (revision w0011): a limited queue's jobs are the
    # limited claim's, never this statement's.
    unlimited = queue.not_in(select(limits_table.c.queue_name).scalar_subquery())
    pick = select(c.sequence, *_addressed(backend), *(c[name] for name in more)).where(
        IS_QUEUED, unpaused, unlimited, c.queue_name.in_([queue])
    )
    if backend.repeats_partial_predicates:
        pick = pick.where(IS_LIVE)
    return backend.skip_locked(pick.order_by(*CLAIM_ORDER).limit(limit))


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


@cache
def claim(backend: Backend, queue_count: int | None, sized: bool = False, ahead: bool = False) -> Update:
    """Take up to ``:limit`` of the best queued jobs (of the ``queue_count``
    queues ``:queue_0``, ``:queue_1``, ...; of every queue when None) for
    ``:lease_ms``, each under its own claim token ``:token.<sequence>``, so
    a settle or renew of one job of the batch cannot name another's claim.

    A job whose cancellation was recorded while it waited is settled
    ``cancelled`` instead of being run. Jobs of a paused queue are not
    taken (:data:`UNPAUSED`). On PostgreSQL the pick is a MATERIALIZED CTE
    that locks its rows and skips rows another claimer holds, so the
    planner can neither run a ``LIMIT`` subquery twice nor touch more rows
    than it locked; the locked rows are still queued when the update
    reaches them, so the update goes to them by their address alone
    (``ctid``; by key on SQLite, where the key is the rowid).

    One bind parameter per queue (not an expanding ``IN``): the text of the
    statement is fixed for a runner's queues, so the store can send it
    precompiled and the driver prepares it once (see ``store.execute_rows``).

    ``sized`` writes ``:limit`` (1 to :data:`LITERAL_LIMIT_MAX`) into the
    text at each execution (:func:`batch_size`). A prepared statement's generic plan does
    not know a ``LIMIT $n``: PostgreSQL estimates it at a tenth of the queued
    rows, so the generic plan of a deep queue looked many times dearer than
    the custom ones and the claim was planned again at every execution (about
    a quarter of its server time). With the number in the text the generic
    plan costs what the custom ones do, and it is kept -- until a statement
    turns slow on a grown table (``store.views._replan_if_slow``).
    """
    limit = batch_size("limit") if sized else _p("limit", Integer())
    pick: Select[Any]
    if queue_count is None:
        # Every queue: every queued job sorted (no index holds them all in claim
        # order). Runners always name their queues; this serves tests and tools.
        pick = backend.skip_locked(
            select(c.sequence, *_addressed(backend))
            .where(IS_QUEUED, UNPAUSED, UNLIMITED)
            .order_by(*CLAIM_ORDER)
            .limit(limit)
        )
    elif queue_count < 1:
        raise ValueError("queue_count: at least 1")
    elif queue_count == 1:
        pick = _queue_pick(backend, 0, limit)
    else:
        # Several queues: the best `limit` of each queue (each read in claim
        # order in ix_watchdog_jobs_live_queue and, on PostgreSQL, locked), and
        # of those the best `limit`. The rows locked and not taken are free again
        # when the claim commits. No index holds the queued jobs of all queues in
        # claim order (it would cost every enqueue an entry), and one that did
        # made a claim read past the backlogs of queues it does not serve.
        each = [
            _queue_pick(backend, index, limit, "priority").subquery(f"queue_{index}") for index in range(queue_count)
        ]
        best = union_all(*(select(part) for part in each)).subquery("queues")
        # The sequence and the row's address (where the backend has one); the priority only orders.
        taken = [column for column in best.c if column.key != "priority"]
        pick = select(*taken).order_by(best.c.priority.desc(), best.c.sequence).limit(limit)
    # The picks lock their rows already (skip_locked), and the update reaches
    # them by address where the backend has one (TID scans on PostgreSQL):
    # joined to a pick of a constant number of rows, one TID scan per row in
    # every plan; as an array with `LIMIT :limit` (joined, the generic plan of
    # a queue holding most of the table hash-joined a scan of the whole table:
    # 7 ms a claim at 20,000 jobs, against 0.3). By sequence, a generic plan
    # made on a young table never analysed scanned it whole (1 ms a claim at
    # 9,000 rows, growing).
    target = backend.picked(
        c.sequence, pick, "ready", skip_locked=False, as_array=True, joined=sized, recheck=IS_QUEUED
    )
    return _claim_update(target, ahead)


def _claim_update(target: ColumnElement[bool], ahead: bool = False) -> Update:
    """The claim's UPDATE of the rows ``target`` selects (shared by
    :func:`claim` and :func:`claim_limited`): each runnable job running under
    its own token ``:token.<sequence>`` for ``:lease_ms`` -- with ``ahead``
    marked ``unstarted`` (claimed ahead of the runner's free slots) --; a
    job with a recorded cancellation settled ``cancelled`` instead."""
    runnable = c.cancellation_id.is_(None)
    clock = db_clock_ms()
    return (
        update(t)
        .where(target)
        .values(
            started_at=case((runnable, clock), else_=c.started_at),
            settled_at=case((runnable, null()), else_=clock),
            # Settled cancelled here: a retried job's last failure is not its end.
            failure_reason=case((runnable, c.failure_reason), else_=null()),
            failure_detail=case((runnable, c.failure_detail), else_=null()),
            state=case((runnable, _RUNNING), else_=_SETTLED),
            outcome=case((runnable, null()), else_=Outcome.CANCELLED.value),
            # Each job its own token: the statement's random token and the row's key.
            claim_token=case((runnable, _p("token", Text()) + "." + cast(c.sequence, Text)), else_=null()),
            lease_until=case((runnable, db_clock_ms() + _p("lease_ms", BigInteger())), else_=null()),
        )
        # Revision w0019: a claim ahead of the runner's free slots marks its
        # jobs (their handlers not started until the runner's start() clears
        # it); any other claim leaves the column as a queued job has it, NULL.
        .values(**({"unstarted": case((runnable, 1), else_=null())} if ahead else {}))
        .returning(*COLUMNS)
    )


# -- flow control (revision w0011) -------------------------------------------------

lim = limits_table.c
logged = limit_claims_table.c
_QUEUE = _p("queue", Text())
#: Literal predicates of the keyed partial indexes (model.KEYED_QUEUED,
#: model.KEYED_RUNNING), repeated by the statements that read them.
IS_KEYED = c.limit_key.is_not(None)
assert KEYED_QUEUED == "state = 'queued' AND limit_key IS NOT NULL"
assert KEYED_RUNNING == "state = 'running' AND limit_key IS NOT NULL"


@cache
def read_limits(filtered: bool) -> Select[Any]:
    """Every queue's limits (of the expanding ``:queues`` when ``filtered``), by name."""
    query = select(*limits_table.c).order_by(lim.queue_name)
    if filtered:
        query = query.where(lim.queue_name.in_(_QUEUES))
    return query


@cache
def lock_limits(backend: Backend) -> Select[Any]:
    """Queue ``:queue``'s limits, its row locked until the transaction ends
    (PostgreSQL ``FOR UPDATE``; SQLite's write lock is held already): the
    limited claimers of one queue take turns, and each one's next statement
    sees every claim committed before it. ``has_queued``: whether the queue
    had a queued job when the statement started (a hint, from the snapshot
    before the lock: a claim that finds none ends there, as a claim racing
    an enqueue may miss it anyway)."""
    queued = select(c.sequence).where(c.queue_name == _QUEUE, IS_QUEUED)
    if backend.repeats_partial_predicates:
        queued = queued.where(IS_LIVE)
    has_queued = queued.limit(1).exists().label("has_queued")
    query = select(*limits_table.c, has_queued).where(lim.queue_name == _QUEUE)
    if backend.locks_before_reading:
        # The lock is held already, so this statement's counts are exact: what
        # limit_usage reads, with the queue's own rate period, in the same
        # statement (clock, running, rate_used, paused).
        query = query.add_columns(*_usage(backend, func.coalesce(lim.rate_period_ms, 0)))
    return backend.locked(query)


def _usage(backend: Backend, period: ColumnElement[Any]) -> list[ColumnElement[Any]]:
    """The database clock, queue ``:queue``'s running jobs, the jobs its limited
    claims started after ``clock - period`` (none when ``period`` is 0), and
    whether it is paused (1) or not (0), labelled as :func:`limit_usage` returns them."""
    clock = db_clock_ms()
    running = select(func.count()).where(c.queue_name == _QUEUE, IS_RUNNING)
    if backend.repeats_partial_predicates:
        running = running.where(IS_LIVE)
    used = select(func.coalesce(func.sum(logged.jobs), 0)).where(
        logged.queue_name == _QUEUE, logged.claimed_at > clock - period
    )
    paused = select(func.count()).where(pauses.c.queue_name == _QUEUE)
    return [
        clock.label("clock"),
        running.scalar_subquery().label("running"),
        used.scalar_subquery().label("rate_used"),
        paused.scalar_subquery().label("paused"),
    ]


@cache
def limit_usage(backend: Backend) -> Select[Any]:
    """The database clock, queue ``:queue``'s running jobs, the jobs its
    limited claims started after ``clock - :period_ms`` (0 when ``:period_ms``
    is 0), and whether it is paused (1) or not (0): what a limited claim has
    room for. Run after :func:`lock_limits`,
    as a statement of its own, so its snapshot is taken after the lock
    (where the backend locks before reading, :func:`lock_limits` reads them itself)."""
    return select(*_usage(backend, _p("period_ms", BigInteger())))


def _next_key(after: ColumnElement[Any] | None) -> ColumnElement[Any]:
    """The smallest key of queue ``:queue``'s queued jobs above ``after``
    (None: the smallest of all): the first entry of a range of
    ``ix_watchdog_jobs_keyed_queued``."""
    query = select(c.limit_key).where(c.queue_name == _QUEUE, IS_QUEUED, IS_KEYED)
    if after is not None:
        query = query.where(c.limit_key > after)
    return query.order_by(c.limit_key).limit(1).scalar_subquery()


def _key_running(key: ColumnElement[Any], *within: Any) -> ColumnElement[Any]:
    """The running jobs of key ``key`` of queue ``:queue``, counted in
    ``within``'s rows (one range of ``ix_watchdog_jobs_keyed_running``)."""
    return (
        select(func.count())
        .where(c.queue_name == _QUEUE, IS_RUNNING, IS_KEYED, c.limit_key == key)
        .correlate(*within)
        .scalar_subquery()
    )


@cache
def walk_keys(counted: bool = False) -> Select[Any]:
    """Up to ``:walk`` keys of queue ``:queue``'s queued jobs, ascending from
    the first above ``:after``: a skip scan, one index probe per key
    (``WITH RECURSIVE``: each key the next above the previous one), so the
    cost is O(walk · log n) whatever the backlog of each key. ``counted``:
    each key with its running jobs (what :func:`keys_running` counts), in
    the same statement."""
    walk = select(_next_key(_p("after", Text())).label("key"), literal_column("1", Integer()).label("step")).cte(
        "walk", recursive=True
    )
    step = select(_next_key(walk.c.key), walk.c.step + 1).where(
        walk.c.key.is_not(None), walk.c.step < _p("walk", Integer())
    )
    walk = walk.union_all(step)
    columns = [walk.c.key, _key_running(walk.c.key, walk)] if counted else [walk.c.key]
    return select(*columns).where(walk.c.key.is_not(None)).order_by(walk.c.step)


@cache
def keys_running() -> Select[Any]:
    """Running jobs per key of queue ``:queue``, for the expanding ``:keys``
    (``ix_watchdog_jobs_keyed_running``)."""
    return (
        select(c.limit_key, func.count())
        .where(c.queue_name == _QUEUE, IS_RUNNING, IS_KEYED, c.limit_key.in_(bindparam("keys", expanding=True)))
        .group_by(c.limit_key)
    )


@cache
def keys_rate_used(filtered: bool) -> Select[Any]:
    """The jobs queue ``:queue``'s limited claims started per key after
    ``:since`` (database clock), of the expanding ``:keys`` when
    ``filtered`` (else of every key): what a per-key rate leaves, one range of
    ``ix_watchdog_limit_claims_keyed`` per key."""
    query = select(logged.limit_key, func.sum(logged.jobs)).where(
        logged.queue_name == _QUEUE, logged.limit_key.is_not(None), logged.claimed_at > _p("since", BigInteger())
    )
    if filtered:
        query = query.where(logged.limit_key.in_(bindparam("keys", expanding=True)))
    return query.group_by(logged.limit_key)


#: How far the unkeyed group's pick reads a limited queue's head (in claim
#: order, keyed jobs included) for unkeyed jobs, beyond the jobs it takes.
UNKEYED_SCAN = 256


@cache
def key_picks(backend: Backend, parts: int) -> Select[Any]:
    """The candidates of a limited claim, ``(sequence, priority, part)``:
    for each part ``i`` below ``parts`` the best ``:n_<i>`` queued jobs of
    key ``:key_<i>`` of queue ``:queue`` (one range of
    ``ix_watchdog_jobs_keyed_queued`` each; a NULL key matches nothing), and
    as part -1 up to ``:unkeyed_n`` unkeyed jobs among the queue's first
    ``:unkeyed_scan`` queued jobs in claim order (``ix_watchdog_jobs_live_queue``)."""
    head = select(c.sequence, c.priority, c.limit_key).where(c.queue_name == _QUEUE, IS_QUEUED)
    if backend.repeats_partial_predicates:
        head = head.where(IS_LIVE)
    scanned = head.order_by(*CLAIM_ORDER).limit(_p("unkeyed_scan", Integer())).subquery("head")
    unkeyed = (
        select(scanned.c.sequence, scanned.c.priority, literal_column("-1", Integer()).label("part"))
        .where(scanned.c.limit_key.is_(None))
        .limit(_p("unkeyed_n", Integer()))
        .subquery("unkeyed")
    )
    selects = [select(unkeyed.c.sequence, unkeyed.c.priority, unkeyed.c.part)]
    for index in range(parts):
        key = _p(f"key_{index}", Text())
        # The key as a range of one value, ordered by the whole index: with
        # `limit_key = ?` and statistics of about one job per key, SQLite sorted
        # each key's jobs in a temporary b-tree -- a pager with its own page
        # cache, allocated and freed per key per claim, which glibc's heap
        # trimming could turn into ~35 us of page faults each. As a range the
        # index's order is the order asked for, whatever the statistics.
        part = (
            select(c.sequence, c.priority, literal_column(str(index), Integer()).label("part"))
            .where(c.queue_name == _QUEUE, IS_QUEUED, IS_KEYED, c.limit_key >= key, c.limit_key <= key)
            .order_by(c.limit_key, *CLAIM_ORDER)
            .limit(_p(f"n_{index}", Integer()))
            .subquery(f"key_{index}")
        )
        selects.append(select(part.c.sequence, part.c.priority, part.c.part))
    return select(union_all(*selects).subquery("candidates"))


@cache
def claim_limited(parts: int, ahead: bool = False) -> Update:
    """Claim the queued jobs among ``:s_0`` ... ``:s_<parts - 1>`` (a limited
    claim's pick, made under the queue's lock; NULL pads a shorter pick), as
    :func:`claim` does. One parameter each, not an expanding ``IN``: the
    statement is compiled once per size (see :func:`_parts` in the store)
    and sent as it is, like the other hot statements."""
    if parts < 1:
        raise ValueError("parts: at least 1")
    picked = c.sequence.in_([_p(f"s_{index}", BigInteger()) for index in range(parts)])
    return _claim_update(and_(picked, IS_QUEUED), ahead)


#: Rate-log rows a claim deletes at most (the queue's rows out of the window).
FORGET_BATCH = 1000
#: Keys a one-statement limited claim walks at most in each direction, and
#: the rotation order of its unkeyed entry (after every key walked above the
#: cursor, before every key walked from the start).
FAST_WALK_MAX = 256


@cache
def claim_limited_at_once(mark_ahead: bool = False) -> Select[Any]:
    """The whole limited claim of queue ``:queue`` in one statement
    (PostgreSQL, autocommit): its limits row locked, the room, the fair walk
    and pick, the claim of up to ``:limit`` jobs (``:token``, ``:lease_ms``),
    the cursor moved and the rate logged -- what :func:`lock_limits`,
    :func:`limit_usage`, :func:`walk_keys`, :func:`keys_running`,
    :func:`key_picks`, :func:`claim_limited`, :func:`move_cursor`,
    :func:`log_claim` and :func:`forget_claims` do in a transaction, with the
    same result, in one round trip.

    Rows: ``(go, held, *COLUMNS)``, one per claimed job, or one row of NULL
    columns when none was claimed; no row at all when the queue has no
    limits. ``held``: a limit holds the queue back -- more jobs were queued
    than taken, and fewer were taken than asked or the claim used up the
    queue's room (room frees only when one of its running jobs ends). ``go``
    false: the statement changed nothing and the caller must claim by the
    transaction instead, because

    * its snapshot is older than the lock: the limits row it locked is not the
      version its snapshot sees (``ctid``), so a claim committed in between
      (every claim that takes jobs writes that row) -- its counts could be
      stale. Under READ COMMITTED a statement reads with the snapshot it began
      with, even after waiting for a lock; the check makes that wait visible.
      When the versions agree, every claim committed before the lock was
      granted is in the snapshot, and no other can commit until this
      statement ends: the counts are exact.
    * its bounded walk (:data:`FAST_WALK_MAX` keys each way, and ``2 · room +
      8`` above the cursor, as the transaction's first segment) found fewer
      entries with a job than the room and did not reach the end of the
      rotation: the transaction walks further.

    Otherwise the pick is the transaction's: the rotation (keys above the
    cursor, the unkeyed entry, keys from the start up to the cursor), each
    entry's first jobs in claim order (a key's up to its per-key room), ranked
    by position within the entry and then the entry's place in the rotation.
    """
    queue = _QUEUE
    version: ColumnElement[Any] = literal_column("watchdog_limits.ctid")
    seen = select(version.label("version")).where(lim.queue_name == queue).cte("seen")
    locked = (
        select(*limits_table.c, version.label("version"))
        .where(lim.queue_name == queue)
        .with_for_update()
        .cte("locked")
        .prefix_with("MATERIALIZED")
    )
    clock = db_clock_ms()
    running = select(func.count()).where(c.queue_name == queue, IS_RUNNING).scalar_subquery()
    used = (
        select(func.coalesce(func.sum(logged.jobs), 0))
        .where(logged.queue_name == queue, logged.claimed_at > clock - locked.c.rate_period_ms)
        .scalar_subquery()
    )
    paused = select(pauses.c.queue_name).where(pauses.c.queue_name == queue).exists()
    fresh = (locked.c.version == select(seen.c.version).scalar_subquery()).label("fresh")
    asked = _p("limit", Integer())
    room = func.least(
        asked,
        func.coalesce(locked.c.concurrency - running, asked),
        func.coalesce(locked.c.rate_count - used, asked),
    )
    usage = (
        select(
            locked.c.cursor_key,
            locked.c.concurrency_per_key,
            locked.c.rate_count,
            locked.c.rate_period_ms,
            locked.c.rate_per_key_count,
            locked.c.rate_per_key_period_ms,
            clock.label("clock"),
            fresh,
            case((fresh, case((paused, 0), else_=func.greatest(room, 0))), else_=0).label("room"),
            # What the queue-wide limits leave (NULL: none set; LEAST skips NULLs).
            func.least(locked.c.concurrency - running, locked.c.rate_count - used).label("headroom"),
        )
        .select_from(locked)
        .cte("usage")
        .prefix_with("MATERIALIZED")
    )
    u = usage.c

    def take_of(key: ColumnElement[Any], *within: Any) -> ColumnElement[Any]:
        """How many of key ``key``'s jobs the claim may take (the room, its
        per-key room, its per-key rate left), counted in ``within``'s rows."""
        key_running = _key_running(key, *within)
        # A key's claims in its per-key window (ix_watchdog_limit_claims_keyed);
        # NULL (no per-key rate) leaves the take to the other limits.
        key_used = (
            select(func.coalesce(func.sum(logged.jobs), 0))
            .where(
                logged.queue_name == queue,
                logged.limit_key.is_not(None),
                logged.limit_key == key,
                logged.claimed_at > u.clock - u.rate_per_key_period_ms,
            )
            .correlate(*within, usage)
            .scalar_subquery()
        )
        # CASE, not COALESCE: a count whose limit is not set is not read at all
        # (PostgreSQL runs a subquery an arithmetic operand names, NULL or not).
        return func.greatest(
            0,
            func.least(
                u.room,
                case((u.concurrency_per_key.is_(None), u.room), else_=u.concurrency_per_key - key_running),
                case((u.rate_per_key_count.is_(None), u.room), else_=u.rate_per_key_count - key_used),
            ),
        )

    segment = func.least(u.room * 2 + 8, FAST_WALK_MAX)
    # Keys above the cursor, ascending, one index probe each (walk_keys' skip
    # scan); ``found``: the keys walked before this one that the claim may take
    # from. The walk stops once they fill the room: every job it takes is the
    # first of one of them (a key further on ranks after them all), so the
    # keys beyond change nothing but the work.
    walk = (
        select(
            _next_key(func.coalesce(u.cursor_key, "")).label("key"),
            literal_column("1", Integer()).label("step"),
            literal_column("0", Integer()).label("found"),
        )
        .where(u.room > 0)
        .cte("walk", recursive=True)
    )
    found_so_far = walk.c.found + case((take_of(walk.c.key, walk) > 0, 1), else_=0)
    walk = walk.union_all(
        select(_next_key(walk.c.key), walk.c.step + 1, found_so_far).where(
            walk.c.key.is_not(None), walk.c.step < segment, found_so_far < u.room
        )
    )
    # The walk ran out of keys above the cursor (not cut by its bound or the room).
    ended = select(walk.c.step).where(walk.c.key.is_(None)).exists()
    # Keys from the start up to the cursor (the rotation's wrap), once the walk above ended.
    wrap = (
        # No bound: with the literal '' PostgreSQL's custom plan read every key's entry and sorted them.
        select(_next_key(None).label("key"), literal_column("1", Integer()).label("step"))
        .where(u.room > 0, u.cursor_key.is_not(None), ended)
        .cte("wrap", recursive=True)
    )
    wrap = wrap.union_all(
        select(_next_key(wrap.c.key), wrap.c.step + 1).where(
            wrap.c.key.is_not(None), wrap.c.key < u.cursor_key, wrap.c.step < FAST_WALK_MAX
        )
    )
    wrap_cut = (
        select(func.count(wrap.c.key)).where(wrap.c.key < select(u.cursor_key).scalar_subquery()).scalar_subquery()
        >= FAST_WALK_MAX
    )
    unkeyed_at = FAST_WALK_MAX + 1
    # ``before``: the entries ahead of this one that the claim takes a first job
    # from (known for the walk's keys; 0, no bound, for the others).
    entries = union_all(
        select(walk.c.key, walk.c.step.label("ord"), walk.c.found.label("before")).where(walk.c.key.is_not(None)),
        select(null().label("key"), literal_column(str(unkeyed_at), Integer()), literal_column("0", Integer())).where(
            u.room > 0, ended
        ),
        select(wrap.c.key, wrap.c.step + unkeyed_at, literal_column("0", Integer())).where(
            wrap.c.key.is_not(None), wrap.c.key <= u.cursor_key
        ),
    ).cte("entries")
    e = entries.c
    # Each entry with what the limits let it take (evaluated once per entry).
    sized = (
        select(e.key, e.ord, e.before, take_of(e.key, entries).label("take"))
        .select_from(entries.join(usage, true()))
        .cte("sized")
        .prefix_with("MATERIALIZED")
    )
    z = sized.c
    # Keys the claim may take from: each has a queued job (the walk found it),
    # so at least this many entries have a first job to rank.
    ahead = select(func.count()).select_from(sized).where(z.key.is_not(None), z.take > 0).scalar_subquery()
    # A key's n-th job ranks after its own n - 1 and the first jobs of the
    # entries ahead of it in the rotation (``before``) -- and, for n >= 2, of
    # every other key with a job (``ahead`` - 1): with ``room`` picks it can be
    # one only for n <= room - before and n <= max(1, room - ahead + 1). A
    # queue limit over many keys reads one job of each key walked, not 16.
    take = func.greatest(0, func.least(z.take, u.room - z.before, func.greatest(1, u.room - ahead + 1)))
    row: ColumnElement[Any] = literal_column("watchdog_jobs.ctid")
    keyed = (
        select(c.sequence, c.priority, row.label("row"))
        .where(c.queue_name == queue, IS_QUEUED, IS_KEYED, c.limit_key == z.key)
        .order_by(*CLAIM_ORDER)
        .limit(take)
        .correlate(sized, usage)
        .lateral("keyed")
    )
    head = (
        select(c.sequence, c.priority, c.limit_key, row.label("row"))
        .where(c.queue_name == queue, IS_QUEUED, select(e.key).where(e.ord == unkeyed_at).exists())
        .order_by(*CLAIM_ORDER)
        .limit(select(u.room + UNKEYED_SCAN).scalar_subquery())
        .subquery("head")
    )
    # The unkeyed entry's n-th job (n >= 2) ranks after the first job of every key ahead.
    unkeyed = (
        select(head.c.sequence, head.c.priority, head.c.row)
        .where(head.c.limit_key.is_(None))
        .limit(select(func.least(u.room, func.greatest(1, u.room - ahead))).scalar_subquery())
        .subquery("unkeyed")
    )
    found = union_all(
        select(z.ord, z.key, keyed.c.sequence, keyed.c.priority, keyed.c.row)
        .select_from(sized.join(usage, true()).join(keyed, true()))
        .where(z.key.is_not(None)),
        select(
            literal_column(str(unkeyed_at), Integer()).label("ord"),
            null(),
            unkeyed.c.sequence,
            unkeyed.c.priority,
            unkeyed.c.row,
        ),
    ).subquery("found")
    position = func.row_number().over(partition_by=found.c.ord, order_by=(found.c.priority.desc(), found.c.sequence))
    candidates = select(found, position.label("position")).cte("candidates").prefix_with("MATERIALIZED")
    k = candidates.c
    complete = and_(ended, not_(wrap_cut))
    go = and_(u.fresh, or_(select(func.count(k.ord.distinct())).scalar_subquery() >= u.room, complete)).label("go")
    status = select(go, u.cursor_key, u.room).cte("status").prefix_with("MATERIALIZED")
    s = status.c
    picks = (
        select(k.sequence, k.key, k.ord, k.position, k.row)
        .where(select(s.go).scalar_subquery())
        .order_by(k.position, k.ord)
        .limit(select(s.room).scalar_subquery())
        .cte("picks")
        .prefix_with("MATERIALIZED")
    )
    # The cursor: the entry of the last job taken, in rank order; none taken,
    # the last entry walked (a run of keys at their limit is not walked again).
    last_pick = select(picks.c.key).order_by(picks.c.position.desc(), picks.c.ord.desc()).limit(1)
    last_entry = select(e.key).order_by(e.ord.desc()).limit(1)
    took = select(picks.c.sequence).exists()
    cursor = case((took, last_pick.scalar_subquery()), else_=last_entry.scalar_subquery())
    # Nothing queued: the cursor stays (the transaction path ends at the lock then).
    any_queued = select(c.sequence).where(c.queue_name == queue, IS_QUEUED).limit(1).exists()
    moves = and_(
        s.go,
        or_(
            took,
            and_(any_queued, select(e.ord).exists(), last_entry.scalar_subquery().is_distinct_from(s.cursor_key)),
        ),
    )
    # By the rows' physical address (a TID scan, whatever the planner knows of
    # the table): by sequence, a generic plan made while the table was small
    # scanned it whole for every claim afterwards. A row updated meanwhile is
    # followed to its new version and checked again (still queued).
    picked = row == any_(func.array(select(picks.c.row).scalar_subquery()))
    # Still queued, written so that no index's predicate matches it: the rows
    # are found by key (with state = 'queued' PostgreSQL read every queued
    # job's entry in live_queue for a bitmap).
    still_queued = c.state.not_in([literal_column(f"'{state}'") for state in (_DELAYED, _RUNNING, _SETTLED, _WAITING)])
    claimed = _claim_update(and_(picked, still_queued), mark_ahead).cte("claimed")
    # Always written when jobs were taken: a claimer whose snapshot predates
    # this commit then sees another version of the row than it locks.
    moved = (
        update(limits_table)
        .where(lim.queue_name == queue, select(moves).scalar_subquery())
        .values(cursor_key=cursor)
        .returning(lim.queue_name)
        .cte("moved")
    )
    # One row per claim, or with a per-key rate one per key it started jobs
    # of (NULL: the unkeyed ones), so a key's count in a window is one range.
    log_key = case((u.rate_per_key_count.is_not(None), claimed.c.limit_key), else_=null())
    logs = (
        insert(limit_claims_table)
        .from_select(
            ["queue_name", "claimed_at", "jobs", "limit_key"],
            select(queue, u.clock, func.count(), log_key)
            .select_from(claimed.join(usage, true()))
            .where(claimed.c.state == _RUNNING, or_(u.rate_count.is_not(None), u.rate_per_key_count.is_not(None)))
            .group_by(u.clock, u.rate_per_key_count, log_key),
        )
        .returning(logged.id)
        .cte("logs")
    )
    old = (
        select(logged.id)
        .where(
            logged.queue_name == queue,
            # The longer period's window (GREATEST skips a NULL).
            logged.claimed_at <= u.clock - func.greatest(u.rate_period_ms, u.rate_per_key_period_ms),
        )
        .order_by(logged.claimed_at)
        .limit(FORGET_BATCH)
        .correlate(None)
    )
    # Forgotten by every claim that goes ahead, jobs taken or not, as the
    # transaction path forgets them at the lock.
    forgotten = (
        delete(limit_claims_table)
        .where(logged.id.in_(old.scalar_subquery()), select(s.go).scalar_subquery())
        .returning(logged.id)
        .cte("forgotten")
    )
    # Held back by a limit: more jobs were queued than taken, and either fewer
    # were taken than asked or the claim used up the queue's room.
    # In claim order, so the queue's range of ix_watchdog_jobs_live_queue is read
    # (asked + 1 entries); unordered, a plan from a young table's statistics read
    # the table from its start, past every settled job, to find them.
    queued = (
        select(c.sequence)
        .where(c.queue_name == queue, IS_QUEUED)
        .order_by(*CLAIM_ORDER)
        .limit(asked + 1)
        .subquery("queued")
    )
    taken = select(func.count()).select_from(picks).scalar_subquery()
    headroom = select(u.headroom).scalar_subquery()
    held = and_(
        select(func.count()).select_from(queued).scalar_subquery() > taken,
        or_(taken < asked, func.coalesce(headroom - taken <= 0, false())),
    ).label("held")
    rows = select(claimed).subquery("rows")
    return select(s.go, held, *rows.c).select_from(status.outerjoin(rows, true())).add_cte(moved, logs, forgotten)


@cache
def move_cursor() -> Update:
    """Queue ``:queue``'s round-robin position: ``:cursor``, the key that got
    the last job (NULL: the unkeyed jobs)."""
    return (
        update(limits_table)
        .where(lim.queue_name == _QUEUE)
        .values(cursor_key=_p("cursor", Text()))
        .returning(lim.queue_name)  # a row, as execute_rows reads one
    )


@cache
def log_claim() -> Insert:
    """Record that a limited claim of queue ``:queue`` started ``:jobs`` jobs
    at ``:clock`` (of key ``:key``: a queue with a per-key rate; else NULL)."""
    return limit_claims_table.insert().values(
        queue_name=_QUEUE,
        claimed_at=_p("clock", BigInteger()),
        jobs=_p("jobs", Integer()),
        limit_key=_p("key", Text()),
    )


@cache
def forget_claims() -> Delete:
    """Delete up to ``:batch`` of queue ``:queue``'s logged claims made at or
    before ``:before`` (outside every window a claim will look at)."""
    old = (
        select(logged.id)
        .where(logged.queue_name == _QUEUE, logged.claimed_at <= _p("before", BigInteger()))
        .order_by(logged.claimed_at)
        .limit(_p("batch", Integer()))
    )
    return delete(limit_claims_table).where(logged.id.in_(old.scalar_subquery()))


@cache
def forget_queue_claims() -> Delete:
    """Delete every logged claim of queue ``:queue`` (its limits are cleared)."""
    return delete(limit_claims_table).where(logged.queue_name == _QUEUE)


@cache
def set_limits(backend: Backend) -> Insert:
    """Store queue ``:queue``'s limits (``:concurrency``, ``:per_key``,
    ``:rate_count``, ``:rate_period_ms``, ``:rate_per_key_count``,
    ``:rate_per_key_period_ms``), its round-robin cursor kept; a
    row already holding exactly these is left alone (no row returned)."""
    clock = db_clock_ms()
    stmt = _insert_into(backend, limits_table).values(
        queue_name=_QUEUE,
        concurrency=_p("concurrency", Integer()),
        concurrency_per_key=_p("per_key", Integer()),
        rate_count=_p("rate_count", Integer()),
        rate_period_ms=_p("rate_period_ms", BigInteger()),
        rate_per_key_count=_p("rate_per_key_count", Integer()),
        rate_per_key_period_ms=_p("rate_per_key_period_ms", BigInteger()),
        updated_at=clock,
    )
    ex = stmt.excluded
    same = and_(
        lim.concurrency.is_not_distinct_from(ex.concurrency),
        lim.concurrency_per_key.is_not_distinct_from(ex.concurrency_per_key),
        lim.rate_count.is_not_distinct_from(ex.rate_count),
        lim.rate_period_ms.is_not_distinct_from(ex.rate_period_ms),
        lim.rate_per_key_count.is_not_distinct_from(ex.rate_per_key_count),
        lim.rate_per_key_period_ms.is_not_distinct_from(ex.rate_per_key_period_ms),
    )
    upsert: Insert = stmt.on_conflict_do_update(
        index_elements=[lim.queue_name],
        set_={
            "concurrency": ex.concurrency,
            "concurrency_per_key": ex.concurrency_per_key,
            "rate_count": ex.rate_count,
            "rate_period_ms": ex.rate_period_ms,
            "rate_per_key_count": ex.rate_per_key_count,
            "rate_per_key_period_ms": ex.rate_per_key_period_ms,
            "updated_at": clock,
        },
        where=not_(same),
    ).returning(lim.queue_name)
    return upsert


@cache
def clear_limits() -> ReturningDelete[Any]:
    """Remove queue ``:queue``'s limits; returns its row if it had any."""
    return delete(limits_table).where(lim.queue_name == _QUEUE).returning(lim.queue_name)


@cache
def keyed_counts(backend: Backend) -> Select[Any]:
    """Queue ``:queue``'s queued and running jobs per key (NULL: unkeyed),
    for the stats of a limited queue: one read of its live jobs in
    ``ix_watchdog_jobs_live_queue``."""
    query = select(c.limit_key, c.state, func.count()).where(
        c.queue_name == _QUEUE, c.state.in_([literal_column(f"'{_QUEUED}'"), literal_column(f"'{_RUNNING}'")])
    )
    if backend.repeats_partial_predicates:
        query = query.where(IS_LIVE)
    return query.group_by(c.limit_key, c.state)


@cache
def settle(backend: Backend, sized: bool = False) -> Update:
    """Settle exact claims (rows of :data:`SETTLE_FIELDS` in ``settles``),
    each only while its lease lives by ``max(:now, database clock)``.

    A row with a ``delay_ms`` is requeued instead (a retry or a snooze):
    ``delayed`` until ``database clock + delay_ms`` (``queued`` at once for
    0), its claim dropped, its attempt or snooze count moved. A recorded
    cancellation turns any decision, a requeue included, into ``cancelled``. The claim
    token stays on the row so a repeated settle can be recognised as a
    replay. One statement settles a whole batch; every row keeps its own
    guard.

    The plan looks each row up by ``job_id`` (``uq_watchdog_jobs_job_id``),
    whatever the table holds. Written with ``state = 'running'``, the guard
    let PostgreSQL read the running jobs through the partial
    ``ix_watchdog_jobs_lease`` instead, as a bitmap scan that also visits
    every entry left by jobs settled since the last vacuum (a drain of 5,000
    jobs: 3,000 of them per settle, a fifth of the server's CPU per job).
    ``state NOT IN ('delayed', 'queued', 'settled')`` -- the same rows under
    the state grammar -- does not imply that index's predicate, and the
    counted source (:func:`_rows`) makes the lookups by ``job_id`` the
    cheaper plan even on a small table.

    ``sized`` writes ``:settles_count`` (1 to :data:`LITERAL_LIMIT_MAX`)
    into the text at each execution, as the claim does with its limit (see
    :func:`claim`). A generic plan that does not know the count
    estimates a tenth of the source's hundred rows, which on a table never
    analysed made the custom plans of one-row settles look cheaper: the
    settle was planned again at every execution (0.16 ms of its 0.33 at
    3,000 jobs). Each batch size up to that is then a text of its own.
    """
    _source, cols, _ = _rows(backend, "settles", SETTLE_FIELDS, counted=True, sized=sized)
    cancelled = c.cancellation_id.is_not(None)
    delay = cols["delay_ms"]
    # A requeue (retry or snooze) of an uncancelled job: back to waiting.
    requeue = and_(c.cancellation_id.is_(None), delay.is_not(None))
    snooze = cols["snooze_add"] > 0
    # Written against the table, sent against its alias ``j``: the statement's
    # text stays under psycopg's 4,096-character query cache (a longer one is
    # parsed for its placeholders in Python at every execution, ~0.1 ms a settle).
    j: Any = t.alias("j")  # typed as the table's alias: update() takes it as PostgreSQL and SQLite do
    on_j = ClauseAdapter(j).traverse
    return (
        update(j)
        .where(
            on_j(c.job_id == cols["job_id"]),
            on_j(IS_RUNNING_UNINDEXED),
            on_j(c.claim_token == cols["claim_token"]),
            on_j(c.lease_until > effective_now(NOW)),
        )
        .values({name: on_j(value) for name, value in _settle_values(cols, cancelled, requeue, snooze, delay).items()})
        .returning(*(on_j(column) for column in COLUMNS))
    )


def _settle_values(
    cols: dict[str, Any], cancelled: ColumnElement[bool], requeue: ColumnElement[bool], snooze: Any, delay: Any
) -> dict[str, Any]:
    """The settle's SET clause, on the table's columns (:func:`settle` adapts them to its alias)."""
    return dict(
        state=case(
            (requeue, case((delay > 0, _DELAYED), else_=_QUEUED)),
            else_=_SETTLED,
        ),
        outcome=case((cancelled, Outcome.CANCELLED.value), (requeue, null()), else_=cols["outcome"]),
        claim_token=case((requeue, null()), else_=c.claim_token),
        ready_at=case((requeue, db_clock_ms() + delay), else_=c.ready_at),
        attempt=c.attempt + case((requeue, cols["attempt_add"]), else_=0),
        snoozes=c.snoozes + case((requeue, cols["snooze_add"]), else_=0),
        # A snooze keeps the last failure's reason; anything else records its own.
        failure_reason=case((cancelled, null()), (snooze, c.failure_reason), else_=cols["reason"]),
        failure_detail=case((cancelled, null()), (snooze, c.failure_detail), else_=cols["detail"]),
        failure_history=case((cancelled, c.failure_history), else_=func.coalesce(cols["history"], c.failure_history)),
        settled_at=case((requeue, null()), else_=db_clock_ms()),
        lease_until=null(),
        unstarted=null(),
        # Kept only by the completion itself: a cancellation or a requeue drops it.
        result_json=case((cancelled, null()), (requeue, null()), else_=cols["result"]),
        # A requeue starts the next run from nothing; a settle keeps the
        # attempt's last progress, the one it carries if the rate limit held it.
        progress=case((requeue, null()), else_=func.coalesce(cols["progress"], c.progress)),
        progress_note=case(
            (requeue, null()), (cols["progress"].is_not(None), cols["progress_note"]), else_=c.progress_note
        ),
    )


@cache
def settle_unreadable() -> Update:
    """Settle ``failed`` with ``:why`` the job a claim just took
    (``:key``, its ``sequence``, and ``:token``) whose stored text is not UTF-8 (SQLite:
    a producer wrote the bytes; its ``job_id`` may not even read back as it is
    stored, so the row is found by its key and its claim)."""
    return (
        update(t)
        .where(c.sequence == _p("key", BigInteger()), c.claim_token == _p("token", Text()), IS_RUNNING)
        .values(
            state=_SETTLED,
            outcome=Outcome.FAILED.value,
            failure_reason=_p("why", Text()),
            failure_detail=null(),
            settled_at=db_clock_ms(),
            lease_until=null(),
            unstarted=null(),
        )
        .returning(*COLUMNS)
    )


_CLAIMS: BindParameter[Any] = bindparam("claims", expanding=True)


@cache
def renew() -> Update:
    """Extend the leases of exact, live, uncancelled ``:claims`` ``(job_id, token)``.

    The claims not returned have been lost (lease ended, cancellation
    recorded, lane failed or job settled elsewhere).
    """
    return (
        update(t)
        .where(
            tuple_(c.job_id, c.claim_token).in_(_CLAIMS),
            IS_RUNNING,
            c.lease_until > effective_now(NOW),
            c.cancellation_id.is_(None),
        )
        .values(lease_until=db_clock_ms() + _p("lease_ms", BigInteger()))
        .returning(c.job_id, c.claim_token)
    )


@cache
def start() -> Update:
    """Record that the handlers of exact, live, uncancelled ``:claims``
    ``(job_id, token)`` are about to start (revision w0019): their
    ``unstarted`` mark is cleared and their lease renewed, in one statement
    for every job a runner is about to start at that moment.

    Guarded as :func:`renew` (the exact token, a lease alive by
    ``max(:now, database clock)``, no cancellation recorded): a claim not
    returned was lost, and its handler must not start.
    """
    return (
        update(t)
        .where(
            tuple_(c.job_id, c.claim_token).in_(_CLAIMS),
            IS_RUNNING,
            c.lease_until > effective_now(NOW),
            c.cancellation_id.is_(None),
        )
        .values(lease_until=db_clock_ms() + _p("lease_ms", BigInteger()), unstarted=null())
        .returning(c.job_id, c.claim_token)
    )


@cache
def progress() -> Update:
    """Record ``:fraction`` and ``:note`` as the progress of the exact, live
    claim ``:job`` / ``:token`` (guarded like :func:`renew`, by the lease on
    ``max(:now, database clock)``); ``RETURNING job_id`` says it was."""
    return (
        update(t)
        .where(
            c.job_id == _p("job", Text()),
            c.claim_token == _p("token", Text()),
            IS_RUNNING_UNINDEXED,
            c.lease_until > effective_now(NOW),
        )
        .values(progress=_p("fraction", Float()), progress_note=_p("note", Text()))
        .returning(c.job_id)
    )


@cache
def release() -> Update:
    """End the leases of exact ``:claims`` now, for a runner shutting down.

    The jobs stay ``running``; the next recovery pass handles them at once
    instead of after a whole lease.
    """
    return (
        update(t)
        .where(tuple_(c.job_id, c.claim_token).in_(_CLAIMS), IS_RUNNING)
        .values(lease_until=db_clock_ms() - 1)
        .returning(c.job_id)
    )


@cache
def cancel(only_if_queued: bool) -> Update:
    """Record ``:cancellation`` on live job ``:job`` (``only_if_queued``: one
    that has not started: queued or delayed)."""
    not_started = c.state.in_([literal_column(f"'{_DELAYED}'"), literal_column(f"'{_QUEUED}'")])
    # Revision w0012: a job waiting for its parents is settled cancelled at
    # once (nothing would claim it before its parents settle); its own
    # dependents are told by a runner's pass (waiting_on = 0, see propagate).
    waiting = c.state == literal_column(f"'{_WAITING}'")
    return (
        update(t)
        .where(
            c.job_id == _p("job"),
            c.cancellation_id.is_(None),
            or_(not_started if only_if_queued else IS_LIVE, waiting),
        )
        .values(
            cancellation_id=_p("cancellation", Text()),
            # A delayed job is made queued, so the next claim settles it
            # cancelled instead of it waiting for its time.
            state=case((IS_DELAYED, _QUEUED), (waiting, _SETTLED), else_=c.state),
            outcome=case((waiting, Outcome.CANCELLED.value), else_=c.outcome),
            settled_at=case((waiting, db_clock_ms()), else_=c.settled_at),
            waiting_on=case((waiting, 0), else_=c.waiting_on),
        )
        .returning(c.job_id)
    )


@cache
def cancellation_holder() -> Select[Any]:
    """The job_id whose cancellation has ``:cancellation``, if any."""
    return select(c.job_id).where(c.cancellation_id == _p("cancellation"))


@cache
def notify_room() -> Select[Any]:
    """Room freed in a limited queue: ``pg_notify`` of ``queued`` while a runner
    waits for work, by the protocol of the enqueue trigger (the waiting lock,
    see :mod:`sqlalchemy_watchdog.wakeups`): the shared lock taken when no
    runner waits, so none can start waiting before this transaction ends."""
    waits = not_(func.pg_try_advisory_xact_lock_shared(WAITING_LOCK[0], WAITING_LOCK[1]))
    return select(case((waits, func.pg_notify(CHANNEL, EVENT_QUEUED)), else_=null()))


@cache
def notify() -> Select[Any]:
    """``pg_notify`` of ``:event``; PostgreSQL folds identical notifications of one transaction."""
    return select(func.pg_notify(CHANNEL, _p("event", Text())))


#: A lane's jobs that name it as their own lane (ix_watchdog_jobs_live_lane's
#: predicate, written as the index writes it), and its queue's jobs when the
#: lane is a queue's name and its jobs kept that default (ix_watchdog_jobs_live_queue).
IS_CUSTOM_LANE = c.lane != c.queue_name
IS_DEFAULT_LANE = c.lane == c.queue_name
#: IS_DEFAULT_LANE as a test no planner carries over: with ``queue_name =
#: :lane`` an equality would let both derive ``lane = :lane`` and read the
#: lane's whole history in ix_watchdog_jobs_lane_history (PostgreSQL in a
#: bitmap with ix_watchdog_jobs_live_queue, SQLite instead of it). Both
#: columns are NOT NULL, so it is the same test.
_DEFAULT_LANE_NO_TRANSITIVE: ColumnElement[bool] = IS_DEFAULT_LANE.self_group().is_(true())


def _lane_jobs(lane: ColumnElement[Any]) -> tuple[Select[Any], Select[Any]]:
    """Lane ``lane``'s live jobs in two parts, each read in its own index:
    the jobs given it as their lane (running first, then in admission
    order), and -- when it is a queue's name -- that queue's jobs whose lane
    is the default, its index read backwards (running first, then queued
    from the lowest priority and newest, then delayed)."""
    custom = (
        select(c.sequence, c.state).where(c.lane == lane, IS_LIVE, IS_CUSTOM_LANE).order_by(c.state.desc(), c.sequence)
    )
    # ix_watchdog_jobs_live_queue read backwards: running (the last state) first.
    own = (
        select(c.sequence, c.state)
        .where(c.queue_name == lane, IS_LIVE, _DEFAULT_LANE_NO_TRANSITIVE)
        .order_by(c.state.desc(), c.priority, c.sequence.desc())
    )
    return custom, own


@cache
def fail_lane(backend: Backend) -> Update:
    """Settle a batch (``:batch``) of lane ``:lane_name``'s live jobs ``failed``
    with ``:reason``, running ones first; their claims are dropped.

    The lane's jobs come from two indexes (:func:`_lane_jobs`): at most a
    batch from each, locked on PostgreSQL, of which the update takes a batch,
    running jobs first. The order only decides which batch a job falls in:
    the calls that follow settle the rest."""
    batch = _p("batch", Integer())
    custom, own = (part.limit(batch) for part in _lane_jobs(_p("lane_name", Text())))
    both = backend.union_picked(((custom, "custom_lane"), (own, "default_lane")))
    pick = select(both.c.sequence).order_by(both.c.state.desc(), both.c.sequence).limit(batch)
    return (
        update(t)
        .where(c.sequence.in_(pick), IS_LIVE)
        .values(
            state=_SETTLED,
            outcome=Outcome.FAILED.value,
            failure_reason=_p("reason", Text()),
            failure_detail=null(),
            lease_until=null(),
            unstarted=null(),
            claim_token=null(),
            settled_at=db_clock_ms(),
        )
        .returning(*COLUMNS)
    )


@cache
def lane_has_live_jobs() -> Select[Any]:
    """Whether lane ``:lane_name`` has a live job. Each part is a first row in
    its index's order, not an EXISTS: PostgreSQL costs an EXISTS as a scan
    that stops at the first match, and a queue's default-lane jobs, which it
    takes for rare (it does not know that ``lane = queue_name`` holds for
    most rows), can all sit behind the settled history."""
    parts = _lane_jobs(_p("lane_name", Text()))
    firsts = (part.with_only_columns(c.sequence).limit(1).scalar_subquery() for part in parts)
    return select(or_(*(first.is_not(None) for first in firsts)))


@cache
def purge() -> Delete:
    """Delete queue ``:queue``'s queued and delayed jobs; running and settled ones stay."""
    return delete(t).where(c.queue_name == _p("queue"), IS_LIVE, c.state != literal_column(f"'{_RUNNING}'"))


@cache
def purge_waiting() -> Delete:
    """Delete queue ``:queue``'s waiting jobs (revision w0014: their own
    dependents are told ``purged`` by the delete trigger)."""
    return delete(t).where(c.queue_name == _p("queue"), IS_WAITING)


@cache
def fail_lane_waiting(backend: Backend) -> Update:
    """Settle a batch (``:batch``) of lane ``:lane_name``'s waiting jobs
    ``failed`` with ``:reason``, oldest first (revision w0014). Like a
    cancelled waiting job, each keeps ``waiting_on = 0``: a runner's pass
    tells its own dependents (:func:`untold`)."""
    pick = (
        select(c.sequence)
        .where(c.lane == _p("lane_name", Text()), IS_WAITING)
        .order_by(c.sequence)
        .limit(_p("batch", Integer()))
    )
    return (
        update(t)
        .where(
            backend.picked(c.sequence, backend.locked(pick), "waiting", skip_locked=False),
            IS_WAITING,
        )
        .values(
            state=_SETTLED,
            outcome=Outcome.FAILED.value,
            failure_reason=_p("reason", Text()),
            failure_detail=null(),
            settled_at=db_clock_ms(),
            waiting_on=0,
        )
        .returning(*COLUMNS)
    )


@cache
def lane_has_waiting_jobs() -> Select[Any]:
    """A waiting job of lane ``:lane_name``, if any (its sequence)."""
    return select(c.sequence).where(c.lane == _p("lane_name", Text()), IS_WAITING).limit(1)


# -- recovery -------------------------------------------------------------------


@cache
def expired_claims() -> Select[Any]:
    """Up to ``:limit`` running jobs whose lease has ended by the database
    clock, earliest first."""
    return (
        select(*COLUMNS)
        .where(IS_RUNNING, c.lease_until <= db_clock_ms())
        .order_by(c.lease_until, c.sequence)
        .limit(_p("limit", Integer()))
    )


@cache
def next_lease_expiry() -> Select[Any]:
    """The earliest lease of any running job, and the database clock."""
    return select(
        select(c.lease_until).where(IS_RUNNING).order_by(c.lease_until).limit(1).scalar_subquery(),
        db_clock_ms(),
    )


@cache
def reconcile(requeue: bool) -> Update:
    """Requeue (or settle ``interrupted`` with ``:reason``) the disappeared
    claim ``:job`` / ``:token`` / ``:count``, if nobody
    else got there first.

    Conditional on the same token, the same recovery count and a lease
    ended by the database clock, so of two recoverers only one wins, and a
    claim that was renewed or settled meanwhile is left alone. A recorded
    cancellation settles the job ``cancelled`` instead. A job still marked
    ``unstarted`` (claimed ahead, its handler never called) is requeued in
    either form, its recovery count and failure fields unchanged.
    """
    uncancelled = c.cancellation_id.is_(None)
    # Revision w0019: a job claimed ahead whose handler never started goes
    # back to the queue as it was -- no recovery counted, its failure fields
    # kept (a retried job's last failure) -- whatever the budget.
    unstarted = and_(uncancelled, c.unstarted.is_not(None))
    if requeue:
        values: dict[str, Any] = dict(
            state=case((uncancelled, _QUEUED), else_=_SETTLED),
            outcome=case((uncancelled, null()), else_=Outcome.CANCELLED.value),
            claim_token=case((uncancelled, null()), else_=c.claim_token),
            recovery_count=c.recovery_count + case((unstarted, 0), (uncancelled, 1), else_=0),
            failure_reason=case((unstarted, c.failure_reason), else_=null()),
            failure_detail=case((unstarted, c.failure_detail), else_=null()),
            settled_at=case((uncancelled, null()), else_=db_clock_ms()),
        )
    else:
        values = dict(
            state=case((unstarted, _QUEUED), else_=_SETTLED),
            outcome=case((unstarted, null()), (uncancelled, Outcome.INTERRUPTED.value), else_=Outcome.CANCELLED.value),
            claim_token=case((unstarted, null()), else_=c.claim_token),
            failure_reason=case((unstarted, c.failure_reason), (uncancelled, _p("reason", Text())), else_=null()),
            failure_detail=case((unstarted, c.failure_detail), else_=null()),
            settled_at=case((unstarted, null()), else_=db_clock_ms()),
        )
    return (
        update(t)
        .where(
            c.job_id == _p("job"),
            IS_RUNNING,
            c.claim_token == _p("token"),
            c.recovery_count == _p("count"),
            c.lease_until <= db_clock_ms(),
        )
        .values(**values, lease_until=null(), unstarted=null())
        .returning(*COLUMNS)
    )


# -- operations: retention, listing, stats, pauses, reruns ---------------------------


@cache
def prune(backend: Backend, undated: bool) -> Delete:
    """Delete up to ``:limit`` settled jobs of outcome ``:outcome`` that
    settled before ``database clock - :age_ms``, oldest first -- or, when
    ``undated``, that have no recorded ``settled_at`` (settled before
    revision w0004).

    Only ``settled`` rows can match: queued, delayed and running jobs are
    never pruned. The pick reads ``ix_watchdog_jobs_settled`` (outcome,
    then time) in order, so a batch costs O(limit) however long the history
    is, other outcomes' rows included.
    """
    pick = select(c.sequence).where(IS_SETTLED, c.outcome == _p("outcome", Text()))
    if undated:
        # Ordered as the index is (settled_at is NULL throughout), so the pick
        # reads ix_watchdog_jobs_settled, not the primary key filtered.
        pick = pick.where(c.settled_at.is_(None)).order_by(c.settled_at, c.sequence)
    else:
        pick = pick.where(c.settled_at < db_clock_ms() - _p("age_ms", BigInteger()))
        pick = pick.order_by(c.settled_at, c.sequence)
    # Revision w0012: never a parent a live job still waits on (its callback
    # reads the parents' results).
    child = t.alias("child")
    waited_on = (
        select(literal_column("1"))
        .select_from(edges.join(child, child.c.job_id == edges.c.child))
        .where(edges.c.parent == c.job_id, child.c.state != literal_column(f"'{_SETTLED}'"))
        .exists()
    )
    pick = pick.where(not_(waited_on)).limit(_p("limit", Integer()))
    return delete(t).where(backend.picked(c.sequence, pick, "old"), IS_SETTLED)


#: The payload column of a list that does not read payloads.
_NO_PAYLOAD: ColumnElement[Any] = literal_column("'null'").label("payload_json")
#: A listing without payloads leaves results out too (each up to 1 MB as well).
_NO_RESULT: ColumnElement[Any] = null().label("result_json")
#: The filters :func:`list_jobs` may combine (each one a bound parameter).
LIST_FILTERS = ("queue", "state", "outcome", "lane", "job_id_prefix", "job_id_range", "job_id_range_first")


@cache
def list_jobs(filters: tuple[str, ...], with_payload: bool = True, newest_first: bool = False) -> Select[Any]:
    """Up to ``:limit`` jobs with ``:after_sequence < sequence <
    :before_sequence`` in admission order (``newest_first``: the reverse, so
    the page is the newest below ``:before_sequence``), matching the named
    ``filters`` (``:queue``, ``state=<state>``, ``:outcome``, ``:lane``,
    ``:job_id_prefix`` -- a prefix compared with ``substr``, so LIKE
    wildcards in it mean nothing). Without ``with_payload`` the payload is
    not read: the JSON ``null`` stands in its column (a payload may be up
    to 1 MB), and no result is read either."""
    light = {c.payload_json: _NO_PAYLOAD, c.result_json: _NO_RESULT}
    columns = COLUMNS if with_payload else tuple(light.get(col, col) for col in COLUMNS)
    # With the prefix as a range on SQLite, the bounds must not draw its planner
    # to the primary key (it takes any rowid range for selective, knowing nothing
    # of the prefix): `sequence + 0` is no index's, so it reads the prefix's range
    # and sorts what matched. PostgreSQL weighs the range by its statistics.
    sequence = c.sequence + 0 if "job_id_range_first" in filters else c.sequence
    query = select(*columns).where(
        sequence > _p("after_sequence", BigInteger()), sequence < _p("before_sequence", BigInteger())
    )
    for name in filters:
        if name == "queue":
            query = query.where(c.queue_name == _p("queue", Text()))
        elif name.startswith("state="):
            # A literal, so the planner can use the state's partial indexes.
            query = query.where(c.state == literal_column(f"'{JobState(name[6:]).value}'"))
        elif name == "outcome":
            query = query.where(c.outcome == _p("outcome", Text()))
        elif name == "lane":
            # One range of ix_watchdog_jobs_lane_history (lane, sequence), every job's:
            # both orders and the sequence bounds read in it, however long the history.
            query = query.where(c.lane == _p("lane", Text()))
        elif name == "job_id_prefix":
            prefix = _p("job_id_prefix", Text())
            query = query.where(func.substr(c.job_id, 1, func.length(prefix)) == prefix)
        elif name in ("job_id_range", "job_id_range_first"):
            # The same jobs as the prefix, said as a range uq_watchdog_jobs_job_id
            # can read: exact only where job_id sorts by code point (the store checks).
            # PostgreSQL: the bounds are literals, so that even a prepared statement's
            # generic plan weighs the range by its statistics (unknown bounds it
            # costs as 0.5% of the table, and walks the primary key).
            literal = name == "job_id_range"
            low = bindparam("job_id_low", type_=Text(), literal_execute=literal)
            high = bindparam("job_id_high", type_=Text(), literal_execute=literal)
            query = query.where(c.job_id >= low, c.job_id < high)
        else:  # pragma: no cover - the store checks the names
            raise ValueError(name)
    return query.order_by(c.sequence.desc() if newest_first else c.sequence).limit(_p("limit", Integer()))


#: The filters :func:`bulk_pick` may combine (each one a bound parameter).
BULK_FILTERS = (
    "queue",
    "lane",
    "outcomes",
    "settled_after",
    "settled_before",
    "enqueued_after",
    "enqueued_before",
)


@cache
def bulk_pick(backend: Backend, kind: str, filters: tuple[str, ...]) -> Select[Any]:
    """The next ``:limit`` jobs a bulk action selects, with ``:after_sequence
    < sequence < :before_sequence``, in admission order: settled ones for
    ``kind`` ``rerun`` (whole rows, to copy; on PostgreSQL share-locked
    ``FOR KEY SHARE`` so a concurrent prune skips them until the copies are
    committed), live ones for ``cancel`` (job_id alone). The named
    ``filters``: ``:queue``, ``:lane``, ``:outcomes`` (a list), and times
    strictly after / before ``:settled_after`` ... ``:enqueued_before``
    (epoch ms)."""
    live = kind == "cancel"
    columns = (c.sequence, c.job_id) if live else COLUMNS
    query = select(*columns).where(
        c.sequence > _p("after_sequence", BigInteger()),
        c.sequence < _p("before_sequence", BigInteger()),
        IS_LIVE if live else IS_SETTLED,
    )
    for name in filters:
        if name == "queue":
            query = query.where(c.queue_name == _p("queue", Text()))
        elif name == "lane" and live:
            # The same as lane = :lane, said so that each part has its index:
            # a lane of its own (live_lane), a queue's default lane (live_queue).
            lane = _p("lane", Text())
            query = query.where(
                or_(and_(c.lane == lane, IS_CUSTOM_LANE), and_(c.queue_name == lane, _DEFAULT_LANE_NO_TRANSITIVE))
            )
        elif name == "lane":
            query = query.where(c.lane == _p("lane", Text()))
        elif name == "outcomes":
            query = query.where(c.outcome.in_(bindparam("outcomes", expanding=True)))
        elif name in ("settled_after", "enqueued_after"):
            query = query.where(c[name.replace("after", "at")] > _p(name, BigInteger()))
        elif name in ("settled_before", "enqueued_before"):
            query = query.where(c[name.replace("before", "at")] < _p(name, BigInteger()))
        else:  # pragma: no cover - the store checks the names
            raise ValueError(name)
    query = query.order_by(c.sequence).limit(_p("limit", Integer()))
    return query if live else backend.share_locked(query, t)


@cache
def bulk_pick_waiting(filters: tuple[str, ...]) -> Select[Any]:
    """:func:`bulk_pick` for ``cancel``, of the waiting jobs (revision w0014;
    read in ix_watchdog_jobs_waiting): ``:queue``, ``:lane`` and the enqueue
    times among ``filters``."""
    query = select(c.sequence, c.job_id).where(
        c.sequence > _p("after_sequence", BigInteger()),
        c.sequence < _p("before_sequence", BigInteger()),
        IS_WAITING,
    )
    for name in filters:
        if name == "queue":
            query = query.where(c.queue_name == _p("queue", Text()))
        elif name == "lane":
            # Said so that no planner reads the lane's whole history in
            # ix_watchdog_jobs_lane_history instead (the same test: NOT NULL).
            query = query.where((c.lane == _p("lane", Text())).self_group().is_(true()))
        elif name == "enqueued_after":
            query = query.where(c.enqueued_at > _p(name, BigInteger()))
        elif name == "enqueued_before":
            query = query.where(c.enqueued_at < _p(name, BigInteger()))
        else:  # pragma: no cover - BulkAction refuses the others for a cancel
            raise ValueError(name)
    # Ordered by an expression: no index delivers it, so SQLite's planner no
    # longer prefers the primary key (or the lane's history) for the order
    # and reads the waiting jobs' own index; they are few, the sort is small.
    return query.order_by(c.sequence + literal_column("0")).limit(_p("limit", Integer()))


@cache
def job_id_collation() -> Any:
    """PostgreSQL: the collation of ``watchdog_jobs.job_id`` (``default`` when the
    database's), the database's collation and its provider (``c`` libc, ``i``
    ICU, ``b`` builtin; before PostgreSQL 15 always libc)."""
    from sqlalchemy import text

    return text(
        "SELECT coalesce(co.collname, 'default'), d.datcollate,"
        " CASE WHEN current_setting('server_version_num')::int >= 150000"
        " THEN (to_jsonb(d) ->> 'datlocprovider') ELSE 'c' END"
        " FROM pg_database d, pg_attribute a"
        " LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100"
        " WHERE d.datname = current_database()"
        " AND a.attrelid = to_regclass('watchdog_jobs') AND a.attname = 'job_id'"
    )


@cache
def newest_sequence() -> Select[Any]:
    """The greatest ``sequence`` there is (NULL: no job): where a bulk action stops."""
    return select(func.max(c.sequence))


@cache
def live_counts() -> Select[Any]:
    """Live jobs per queue and state, and the earliest time one of them became
    ready (its ready time, else its enqueue time; rows from before w0004 have
    neither): for the queued ones, the queue's oldest ready job. One
    index-only read of ``ix_watchdog_jobs_live_queue``, which holds both times."""
    return (
        select(c.queue_name, c.state, func.count(), func.min(func.coalesce(c.ready_at, c.enqueued_at)))
        .where(IS_LIVE)
        .group_by(c.queue_name, c.state)
    )


@cache
def waiting_counts() -> Select[Any]:
    """Waiting jobs per queue (revision w0014: read in ix_watchdog_jobs_waiting alone)."""
    return select(c.queue_name, func.count()).where(IS_WAITING).group_by(c.queue_name)


@cache
def expired_counts() -> Select[Any]:
    """Running jobs per queue whose lease has ended by the database clock."""
    return select(c.queue_name, func.count()).where(IS_RUNNING, c.lease_until <= db_clock_ms()).group_by(c.queue_name)


@cache
def recent_outcomes() -> Select[Any]:
    """Per queue and outcome: jobs settled in the last minute and the last
    hour by the database clock (a range of ``ix_watchdog_jobs_settled``)."""
    clock = db_clock_ms()
    last_minute = func.sum(case((c.settled_at >= clock - 60_000, 1), else_=0))
    # Every outcome named, so the index (outcome, settled_at) serves one range per outcome.
    every_outcome = c.outcome.in_([literal_column(f"'{o.value}'") for o in Outcome])
    return (
        select(c.queue_name, c.outcome, last_minute, func.count())
        .where(IS_SETTLED, every_outcome, c.settled_at >= clock - 3_600_000)
        .group_by(c.queue_name, c.outcome)
    )


@cache
def stats_clock() -> Select[Any]:
    return select(db_clock_ms())


@cache
def paused_queues() -> Select[Any]:
    return select(pauses.c.queue_name, pauses.c.reason, pauses.c.paused_at).order_by(pauses.c.queue_name)


@cache
def pause(backend: Backend) -> Insert:
    """Pause ``:queue`` with ``:reason`` unless it is paused already (then no row returns)."""
    stmt: Insert = (
        _insert_into(backend, pauses)
        .values(queue_name=_p("queue", Text()), reason=_p("reason", Text()), paused_at=db_clock_ms())
        .on_conflict_do_nothing(index_elements=[pauses.c.queue_name])
        .returning(pauses.c.queue_name)
    )
    return stmt


@cache
def resume() -> ReturningDelete[Any]:
    """Resume ``:queue``; returns its row if it was paused."""
    return delete(pauses).where(pauses.c.queue_name == _p("queue", Text())).returning(pauses.c.queue_name)


@cache
def reruns_of() -> Select[Any]:
    """The job_ids of the reruns of ``:job``, in admission order."""
    return select(c.job_id).where(c.rerun_of == _p("job", Text())).order_by(c.sequence)


@cache
def try_advisory_xact_lock() -> Select[Any]:
    """PostgreSQL: take the advisory lock ``:key`` for this transaction if it
    is free. Never a session lock: behind a pooler in transaction mode a
    session lock would stay with whichever server session ran it."""
    return select(func.pg_try_advisory_xact_lock(_p("key", BigInteger())))


# -- workers and schedules (revision w0009) --------------------------------------

workers = workers_table
w = workers.c
recorded = schedules_table
r = recorded.c


def worker_gone_after(heartbeat_ms: ColumnElement[int], gone_heartbeats: int, margin_ms: int) -> ColumnElement[int]:
    """How long after its last heartbeat a worker counts as gone (ms)."""
    return heartbeat_ms * gone_heartbeats + margin_ms


@cache
def register_worker(backend: Backend) -> Insert:
    """Register the worker ``:worker_id`` -- or, for one registered already,
    refresh its ``last_seen`` (database clock), ``running``, ``wakeups``,
    ``claim_ahead`` and ``process_queues``: the same one statement serves the start and every
    heartbeat, and brings back a row pruned while its worker was frozen."""
    clock = db_clock_ms()
    stmt = _insert_into(backend, workers).values(
        worker_id=_p("worker_id", Text()),
        host=_p("host", Text()),
        pid=_p("pid", Integer()),
        queues=_p("queues", Text()),
        concurrency=_p("concurrency", Integer()),
        wakeups=_p("wakeups", Text()),
        version=_p("version", Text()),
        heartbeat_ms=_p("heartbeat_ms", BigInteger()),
        started_at=clock,
        last_seen=clock,
        running=_p("running", Integer()),
        claim_ahead=_p("claim_ahead", Integer()),
        process_queues=_p("process_queues", Text()),
    )
    ex = stmt.excluded
    upsert: Insert = stmt.on_conflict_do_update(
        index_elements=[w.worker_id],
        # claim_ahead and process_queues too: a row registered before revision
        # w0017 (w0018) reads 0 ([]) until then.
        set_={
            "last_seen": clock,
            "running": ex.running,
            "wakeups": ex.wakeups,
            "claim_ahead": ex.claim_ahead,
            "process_queues": ex.process_queues,
        },
    )
    return upsert


@cache
def deregister_worker() -> Delete:
    return delete(workers).where(w.worker_id == _p("worker_id", Text()))


@cache
def list_workers() -> Select[Any]:
    """Every registered worker, oldest first, with the database clock."""
    return select(*w, db_clock_ms().label("now")).order_by(w.started_at, w.worker_id)


@cache
def live_worker_queues(gone_heartbeats: int, margin_ms: int) -> Select[Any]:
    """The queues (JSON arrays) of the workers not gone by the database clock."""
    return select(w.queues).where(
        w.last_seen + worker_gone_after(w.heartbeat_ms, gone_heartbeats, margin_ms) >= db_clock_ms()
    )


@cache
def prune_workers(gone_heartbeats: int, margin_ms: int) -> Delete:
    """Delete at most ``:limit`` workers gone for longer than ``:keep_ms``."""
    long_gone = (
        select(w.worker_id)
        .where(
            w.last_seen + worker_gone_after(w.heartbeat_ms, gone_heartbeats, margin_ms) + _p("keep_ms", BigInteger())
            < db_clock_ms()
        )
        .limit(_p("limit", Integer()))
    )
    return delete(workers).where(w.worker_id.in_(long_gone.scalar_subquery()))


@cache
def record_schedule(backend: Backend) -> Insert:
    """Record that ``:recorded_by`` serves a schedule (one row per name and
    definition): its next slot and the latest slot enqueued (never moved
    back), seen now by the database clock."""
    clock = db_clock_ms()
    stmt = _insert_into(backend, recorded).values(
        name=_p("name", Text()),
        fingerprint=_p("fingerprint", Text()),
        cron=_p("cron", Text()),
        timezone=_p("timezone", Text()),
        queue_name=_p("queue", Text()),
        next_slot=_p("next_slot", BigInteger()),
        last_enqueued=_p("last_enqueued", BigInteger()),
        recorded_by=_p("recorded_by", Text()),
        last_seen=clock,
    )
    excluded = stmt.excluded
    latest = case(
        (r.last_enqueued.is_(None), excluded.last_enqueued),
        (excluded.last_enqueued.is_(None), r.last_enqueued),
        (excluded.last_enqueued > r.last_enqueued, excluded.last_enqueued),
        else_=r.last_enqueued,
    )
    upsert: Insert = stmt.on_conflict_do_update(
        index_elements=[r.name, r.fingerprint],
        set_={
            "next_slot": excluded.next_slot,
            "last_enqueued": latest,
            "recorded_by": excluded.recorded_by,
            "last_seen": clock,
        },
    )
    return upsert


@cache
def list_schedules() -> Select[Any]:
    """Every recorded schedule by name, most recently seen definition first."""
    return select(*r, db_clock_ms().label("now")).order_by(r.name, r.last_seen.desc(), r.fingerprint)


@cache
def prune_schedules() -> Delete:
    """Forget at most ``:limit`` recorded schedules not seen for ``:keep_ms``."""
    stale = (
        select(r.name, r.fingerprint)
        .where(r.last_seen + _p("keep_ms", BigInteger()) < db_clock_ms())
        .limit(_p("limit", Integer()))
    )
    return delete(recorded).where(tuple_(r.name, r.fingerprint).in_(stale))


# -- testing only ---------------------------------------------------------------


@cache
def make_due(filtered: bool) -> Update:
    """FOR TESTS ONLY (:func:`sqlalchemy_watchdog.testing.drain` with
    ``advance_time=True``): set ``ready_at`` of every delayed job (of the
    expanding ``:queues`` when ``filtered``) whose time has not come to the
    database clock, so the next promotion makes it ``queued``. Jobs already
    due keep their ``ready_at``.

    A delayed job stays ``delayed`` here -- promotion remains the only way
    to ``queued`` -- and the row keeps every CHECK of the state grammar
    (a delayed job has a ``ready_at``). Never run by a runner.
    """
    clock = db_clock_ms()
    stmt = update(t).where(IS_DELAYED, c.ready_at > clock)
    if filtered:
        stmt = stmt.where(c.queue_name.in_(_QUEUES))
    return stmt.values(ready_at=clock).returning(c.sequence)


@cache
def waiting_jobs() -> Select[Any]:
    """FOR TESTS ONLY (:func:`sqlalchemy_watchdog.testing.drain`): up to
    ``:limit`` jobs of the expanding ``:queues`` that still wait to run --
    delayed, or queued in a queue that is not paused -- job_id and state,
    read from ``ix_watchdog_jobs_live_queue``."""
    return (
        select(c.job_id, c.state)
        .where(IS_LIVE, c.queue_name.in_(_QUEUES), or_(IS_DELAYED, and_(IS_QUEUED, UNPAUSED)))
        .limit(_p("limit", Integer()))
    )


@cache
def waiting_for() -> Select[Any]:
    """FOR TESTS ONLY (:func:`sqlalchemy_watchdog.testing.drain`): up to
    ``:limit`` waiting jobs of the expanding ``:queues`` (read in
    ``ix_watchdog_jobs_waiting``), each with every parent it still waits
    for (an edge whose outcome is not counted yet): job_id, the parent, the
    parent's queue and state (both NULL: the parent row is gone)."""
    waiting = (
        select(c.job_id, c.sequence)
        .where(IS_WAITING, c.queue_name.in_(_QUEUES))
        .order_by(c.sequence)
        .limit(_p("limit", Integer()))
        .subquery()
    )
    parent = t.alias("parent")
    return (
        select(waiting.c.job_id, edges.c.parent, parent.c.queue_name, parent.c.state)
        .select_from(
            waiting.join(edges, edges.c.child == waiting.c.job_id).outerjoin(parent, parent.c.job_id == edges.c.parent)
        )
        .where(edges.c.outcome.is_(None))
        .order_by(waiting.c.sequence, edges.c.parent)
    )


# -- the dashboard's chart ----------------------------------------------------------


@cache
def settled_per_minute() -> Select[Any]:
    """Per queue, outcome and minute: jobs settled since ``:since`` (epoch
    milliseconds), the minute counted from ``:since`` (0 is the oldest).
    Like :func:`recent_outcomes`, one range of ``ix_watchdog_jobs_settled``
    per outcome."""
    since = _p("since", BigInteger())
    minute = ((c.settled_at - since) // literal_column("60000", BigInteger())).label("minute")
    every_outcome = c.outcome.in_([literal_column(f"'{o.value}'") for o in Outcome])
    return (
        select(c.queue_name, c.outcome, minute, func.count())
        .where(IS_SETTLED, every_outcome, c.settled_at >= since)
        .group_by(c.queue_name, c.outcome, minute)
    )


# -- dependencies (revision w0012) -----------------------------------------------


@cache
def read_parents() -> Select[Any]:
    """The state and outcome of the stored jobs among ``:job_ids`` (parents
    named by an enqueue), locked ``FOR NO KEY UPDATE`` on PostgreSQL (the
    lock :func:`watch_parents` takes next, so two enqueues naming one parent
    take turns rather than deadlock upgrading a shared lock): a parent's
    settlement waits for the enqueue to commit, then finds it watched and
    counts the new edge (SQLite's one writer orders them already)."""
    return (
        select(c.job_id, c.state, c.outcome)
        .where(c.job_id.in_(bindparam("job_ids", expanding=True)))
        .with_for_update(key_share=True)
    )


@cache
def watch_parents() -> Update:
    """Mark the live jobs among ``:job_ids`` ``watched`` (revision w0013):
    they have dependents now, so their settlement's trigger must count the
    edges. Jobs marked already, and settled ones, are left as they are."""
    return (
        update(t)
        .where(c.job_id.in_(bindparam("job_ids", expanding=True)), c.state != _SETTLED, c.watched.is_(None))
        .values(watched=1)
    )


@cache
def count_settled_parents() -> Update:
    """Record the outcome of every parent already settled on the uncounted
    edges of the children ``:children`` (the edges trigger counts each).

    An enqueue's read of its parents can be older than a settlement that
    committed before the enqueue's first write -- a caller's SQLite
    transaction reads outside ``BEGIN IMMEDIATE`` -- so it counted such a
    parent as pending and no trigger will tell it. Run after the edges are
    written (the write lock held, on SQLite the snapshot is the newest);
    nothing to do in the usual case."""
    settled = and_(c.job_id == edges.c.parent, c.state == _SETTLED)
    return (
        update(edges)
        .where(
            edges.c.child.in_(bindparam("children", expanding=True)),
            edges.c.outcome.is_(None),
            exists().where(settled),
        )
        .values(outcome=select(c.outcome).where(settled).scalar_subquery())
    )


EDGE_FIELDS: Fields = (("child", Text()), ("parent", Text()), ("outcome", Text()))


@cache
def insert_edges(backend: Backend) -> Insert:
    """Insert dependency rows (``:edges``, rows of :data:`EDGE_FIELDS`); an
    existing (child, parent) is left as it is."""
    source, cols, order = _rows(backend, "edges", EDGE_FIELDS)
    rows = select(cols["child"], cols["parent"], cols["outcome"]).select_from(source).where(true()).order_by(order)
    stmt: Insert = (
        _insert_into(backend, edges)
        .from_select(["child", "parent", "outcome"], rows)
        .on_conflict_do_nothing(index_elements=[edges.c.child, edges.c.parent])
    )
    return stmt


@cache
def untold(backend: Backend, *, locked: bool = True) -> Select[Any]:
    """Up to ``:limit`` jobs settled while waiting whose dependents are not
    told yet (``waiting_on = 0``), oldest first; when ``locked``, locked,
    skipping locked ones, where rows lock (``Backend.skip_locked``)."""
    pick = (
        select(c.job_id, c.outcome)
        .where(c.waiting_on == literal_column("0"))
        .order_by(c.sequence)
        .limit(_p("limit", Integer()))
    )
    return backend.skip_locked(pick) if locked else pick


@cache
def tell_dependents() -> Update:
    """Record ``:outcome`` on the uncounted edges of parent ``:job`` (the
    edges trigger then counts each for its child)."""
    return (
        update(edges)
        .where(edges.c.parent == _p("job", Text()), edges.c.outcome.is_(None))
        .values(outcome=_p("outcome", Text()))
    )


@cache
def told() -> Update:
    """Clear the mark of ``:job_ids``, whose dependents were told."""
    return (
        update(t)
        .where(c.job_id.in_(bindparam("job_ids", expanding=True)), c.waiting_on == literal_column("0"))
        .values(waiting_on=null())
    )


@cache
def parents_of_children() -> Select[Any]:
    """(child, parent) of every edge whose child is among ``:job_ids``."""
    return select(edges.c.child, edges.c.parent).where(edges.c.child.in_(bindparam("job_ids", expanding=True)))


@cache
def parents_of() -> Select[Any]:
    """The parents of ``:job`` and, per parent, the outcome counted (NULL: not settled yet)."""
    return select(edges.c.parent, edges.c.outcome).where(edges.c.child == _p("job", Text())).order_by(edges.c.parent)


@cache
def dependents_of() -> Select[Any]:
    """The jobs that wait (or waited) for ``:job``."""
    return select(edges.c.child).where(edges.c.parent == _p("job", Text())).order_by(edges.c.child)


@cache
def parent_results() -> Select[Any]:
    """Each parent of ``:job`` with its outcome and result, as stored now."""
    return (
        select(edges.c.parent, c.state, c.outcome, c.result_json)
        .select_from(edges.outerjoin(t, c.job_id == edges.c.parent))
        .where(edges.c.child == _p("job", Text()))
        .order_by(edges.c.parent)
    )
