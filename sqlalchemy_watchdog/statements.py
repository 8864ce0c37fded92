"""Every SQL statement of the queue, built in one place with SQLAlchemy Core.

Each builder returns a statement for the given dialect name (``postgresql``
or ``sqlite``); :mod:`sqlalchemy_watchdog.store` runs them. Time is in
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

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Delete,
    Insert,
    Select,
    Update,
    and_,
    case,
    delete,
    exists,
    func,
    literal,
    literal_column,
    not_,
    null,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from .jobs import JobState, Outcome
from .model import jobs_table

__all__ = [
    "COLUMNS",
    "db_clock_ms",
    "effective_now",
    "enqueue_rows",
    "read_job",
    "read_queue_head",
    "read_settled",
    "has_pending_work",
    "claim",
    "settle",
    "renew",
    "cancel",
    "cancellation_holder",
    "notify",
    "CHANNEL",
    "fail_lane",
    "lane_has_live_jobs",
    "purge",
    "expired_claims",
    "reconcile",
    "release",
]

t = jobs_table
c = t.c

#: The columns every read returns (``lease_until`` only where a caller needs it).
COLUMNS = (
    c.sequence,
    c.job_id,
    c.queue_name,
    c.lane,
    c.priority,
    c.payload_json,
    c.recovery_max,
    c.state,
    c.outcome,
    c.claim_token,
    c.recovery_count,
    c.cancellation_id,
    c.failure_reason,
    c.lease_until,
)

_QUEUED = JobState.QUEUED.value
_RUNNING = JobState.RUNNING.value
_SETTLED = JobState.SETTLED.value

# States in WHERE clauses are SQL literals, not bound parameters: the
# partial indexes' predicates must be provable from the query text itself
# (SQLite requires it; PostgreSQL needs it for generic prepared plans).
IS_QUEUED = c.state == literal_column(f"'{_QUEUED}'")
IS_RUNNING = c.state == literal_column(f"'{_RUNNING}'")
IS_SETTLED = c.state == literal_column(f"'{_SETTLED}'")
IS_LIVE = c.state.in_([literal_column(f"'{_QUEUED}'"), literal_column(f"'{_RUNNING}'")])


class db_clock_ms(FunctionElement[int]):
    """The database's own clock in integer milliseconds since the epoch."""

    type = BigInteger()
    inherit_cache = True
    name = "db_clock_ms"


@compiles(db_clock_ms, "postgresql")
def _pg_clock(element: db_clock_ms, compiler: Any, **kw: Any) -> str:
    return "CAST(floor(EXTRACT(EPOCH FROM statement_timestamp()) * 1000) AS BIGINT)"


@compiles(db_clock_ms, "sqlite")
def _sqlite_clock(element: db_clock_ms, compiler: Any, **kw: Any) -> str:
    return "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"


@compiles(db_clock_ms)
def _other_clock(element: db_clock_ms, compiler: Any, **kw: Any) -> str:
    raise NotImplementedError(
        f"sqlalchemy_watchdog supports PostgreSQL and SQLite, not {compiler.dialect.name}"
    )


class effective_now(FunctionElement[int]):
    """``max(:now_ms, database clock)``, evaluated by the database."""

    type = BigInteger()
    inherit_cache = True
    name = "effective_now"

    def __init__(self, now_ms: int) -> None:
        super().__init__(literal(int(now_ms), BigInteger()), db_clock_ms())


@compiles(effective_now, "postgresql")
def _pg_effective_now(element: effective_now, compiler: Any, **kw: Any) -> str:
    return f"GREATEST({compiler.process(element.clauses, **kw)})"


@compiles(effective_now)
def _sqlite_effective_now(element: effective_now, compiler: Any, **kw: Any) -> str:
    # SQLite's multi-argument max() is the scalar maximum.
    return f"max({compiler.process(element.clauses, **kw)})"


def _insert(dialect: str) -> Any:
    if dialect == "postgresql":
        return postgresql.insert(t)
    if dialect == "sqlite":
        return sqlite.insert(t)
    raise NotImplementedError(f"sqlalchemy_watchdog supports PostgreSQL and SQLite, not {dialect}")


def enqueue_rows(dialect: str, rows: Sequence[Mapping[str, Any]]) -> Insert:
    """Insert queued jobs; ``RETURNING job_id`` names the ones newly admitted.

    A replay of an identical job matches the conflict target and updates
    nothing (no row returned: a duplicate). A replay with other contents sets
    the NOT NULL ``job_id`` to NULL, which fails the statement and with it the
    caller's transaction -- never a silent no-op that would commit the
    caller's writes beside an unrelated old job.
    """
    ins = _insert(dialect).values([{**row, "state": _QUEUED} for row in rows])
    ex = ins.excluded
    identical = and_(
        c.queue_name == ex.queue_name,
        c.lane == ex.lane,
        c.priority == ex.priority,
        c.payload_json == ex.payload_json,
        c.recovery_max.is_not_distinct_from(ex.recovery_max),
    )
    return ins.on_conflict_do_update(
        index_elements=[c.job_id], set_={"job_id": null()}, where=not_(identical)
    ).returning(c.job_id)


def stored_contents(job_ids: Sequence[str]) -> Select[Any]:
    """What an identical replay compares, for the stored jobs among ``job_ids``."""
    return select(
        c.job_id, c.queue_name, c.lane, c.priority, c.payload_json, c.recovery_max
    ).where(c.job_id.in_(list(job_ids)))


def read_job(job_id: str) -> Select[Any]:
    return select(*COLUMNS).where(c.job_id == job_id)


def read_queue_head(queue: str) -> Select[Any]:
    """The queue's running job, else its next queued one."""
    return (
        select(*COLUMNS)
        .where(c.queue_name == queue, IS_LIVE)
        .order_by(
            case((c.state == _RUNNING, 0), else_=1),
            c.priority.desc(),
            c.sequence,
        )
        .limit(1)
    )


def read_settled(limit: int, after_sequence: int) -> Select[Any]:
    return (
        select(*COLUMNS)
        .where(IS_SETTLED, c.sequence > after_sequence)
        .order_by(c.sequence)
        .limit(limit)
    )


def has_pending_work() -> Select[Any]:
    return select(exists().where(IS_LIVE))


def _picked(dialect: str, pick: Select[Any], *, skip_locked: bool) -> ColumnElement[bool]:
    """``sequence IN (pick)``, evaluated exactly once.

    On PostgreSQL the pick is a MATERIALIZED CTE locking its rows, so the
    planner cannot run a ``LIMIT`` subquery twice and touch more rows than
    asked for.
    """
    if dialect == "postgresql":
        cte = pick.with_for_update(skip_locked=skip_locked).cte().prefix_with("MATERIALIZED")
        return c.sequence.in_(select(cte.c.sequence))
    return c.sequence.in_(pick)


def claim(
    dialect: str,
    *,
    claim_token: str,
    now_ms: int,
    lease_ms: int,
    queues: Sequence[str] | None,
    limit: int,
) -> Update:
    """Take up to ``limit`` of the best queued jobs of ``queues``.

    A job whose cancellation was recorded while it waited is settled
    ``cancelled`` instead of being run. Running rows locked by another
    claimer are skipped, never waited for.
    """
    pick = select(c.sequence).where(IS_QUEUED)
    if queues is not None:
        pick = pick.where(c.queue_name.in_(list(queues)))
    pick = pick.order_by(c.priority.desc(), c.sequence).limit(limit)
    runnable = c.cancellation_id.is_(None)
    return (
        update(t)
        .where(_picked(dialect, pick, skip_locked=True), IS_QUEUED)
        .values(
            state=case((runnable, _RUNNING), else_=_SETTLED),
            outcome=case((runnable, null()), else_=Outcome.CANCELLED.value),
            claim_token=case((runnable, claim_token), else_=null()),
            lease_until=case((runnable, db_clock_ms() + lease_ms), else_=null()),
        )
        .returning(*COLUMNS)
    )


def settle(
    *,
    job_id: str,
    claim_token: str,
    outcome: Outcome,
    reason: str | None,
    now_ms: int,
) -> Update:
    """Settle the exact claim, only while its lease lives.

    A recorded cancellation turns any decision into ``cancelled``. The claim
    token stays on the row so a repeated settle can be recognised as a replay.
    """
    uncancelled = c.cancellation_id.is_(None)
    return (
        update(t)
        .where(
            c.job_id == job_id,
            IS_RUNNING,
            c.claim_token == claim_token,
            c.lease_until > effective_now(now_ms),
        )
        .values(
            state=_SETTLED,
            outcome=case((uncancelled, outcome.value), else_=Outcome.CANCELLED.value),
            failure_reason=case((uncancelled, reason), else_=null()),
            lease_until=null(),
        )
        .returning(*COLUMNS)
    )


def renew(*, claims: Sequence[tuple[str, str]], now_ms: int, lease_ms: int) -> Update:
    """Extend the leases of exact, live, uncancelled claims ``(job_id, token)``.

    The claims not returned have been lost (lease expired, cancellation
    recorded, lane failed or job settled elsewhere).
    """
    return (
        update(t)
        .where(
            tuple_(c.job_id, c.claim_token).in_(list(claims)),
            IS_RUNNING,
            c.lease_until > effective_now(now_ms),
            c.cancellation_id.is_(None),
        )
        .values(lease_until=db_clock_ms() + lease_ms)
        .returning(c.job_id, c.claim_token)
    )


def release(*, claims: Sequence[tuple[str, str]]) -> Update:
    """End the leases of exact claims now, for a runner shutting down.

    The jobs stay ``running``; the next recovery pass handles them at once
    instead of after a whole lease.
    """
    return (
        update(t)
        .where(tuple_(c.job_id, c.claim_token).in_(list(claims)), IS_RUNNING)
        .values(lease_until=db_clock_ms() - 1)
        .returning(c.job_id)
    )


def cancel(*, job_id: str, cancellation_id: str, only_if_queued: bool) -> Update:
    """Record a cancellation on a live job (``only_if_queued``: a queued one)."""
    return (
        update(t)
        .where(c.job_id == job_id, c.cancellation_id.is_(None), IS_QUEUED if only_if_queued else IS_LIVE)
        .values(cancellation_id=cancellation_id)
        .returning(c.job_id)
    )


def cancellation_holder(cancellation_id: str) -> Select[Any]:
    """The job_id whose cancellation has this id, if any."""
    return select(c.job_id).where(c.cancellation_id == cancellation_id)


#: The LISTEN/NOTIFY channel of runners on PostgreSQL.
CHANNEL = "watchdog_jobs"


def notify(event: str) -> Select[Any]:
    """``pg_notify``; PostgreSQL folds identical notifications of one transaction."""
    return select(func.pg_notify(CHANNEL, event))


def fail_lane(dialect: str, *, lane: str, reason: str, batch: int) -> Update:
    """Settle a batch of the lane's live jobs ``failed``, running ones first."""
    # 'running' sorts after 'queued', so DESC puts running jobs first.
    pick = (
        select(c.sequence)
        .where(c.lane == lane, IS_LIVE)
        .order_by(c.state.desc(), c.sequence)
        .limit(batch)
    )
    return (
        update(t)
        .where(_picked(dialect, pick, skip_locked=False), IS_LIVE)
        .values(
            state=_SETTLED,
            outcome=Outcome.FAILED.value,
            failure_reason=reason,
            lease_until=null(),
            claim_token=null(),
        )
        .returning(*COLUMNS)
    )


def lane_has_live_jobs(lane: str) -> Select[Any]:
    return select(exists().where(c.lane == lane, IS_LIVE))


def purge(queue: str) -> Delete:
    """Delete the queue's queued jobs; running and settled ones stay."""
    return delete(t).where(c.queue_name == queue, IS_QUEUED)


def expired_claims(*, limit: int) -> Select[Any]:
    """Running jobs whose lease has ended by the database clock, earliest first."""
    return (
        select(*COLUMNS)
        .where(IS_RUNNING, c.lease_until <= db_clock_ms())
        .order_by(c.lease_until, c.sequence)
        .limit(limit)
    )


def next_lease_expiry() -> Select[Any]:
    """The earliest lease of any running job, and the database clock."""
    return select(
        select(c.lease_until)
        .where(IS_RUNNING)
        .order_by(c.lease_until)
        .limit(1)
        .scalar_subquery(),
        db_clock_ms(),
    )


def reconcile(
    *,
    job_id: str,
    claim_token: str,
    recovery_count: int,
    requeue: bool,
    reason: str,
) -> Update:
    """Requeue or settle a disappeared claim, if nobody else got there first.

    Conditional on the same token, the same recovery count and a lease
    ended by the database clock, so of two recoverers only one wins, and a claim that was renewed
    or settled meanwhile is left alone. A recorded cancellation settles the
    job ``cancelled`` instead.
    """
    uncancelled = c.cancellation_id.is_(None)
    if requeue:
        values: dict[str, Any] = dict(
            state=case((uncancelled, _QUEUED), else_=_SETTLED),
            outcome=case((uncancelled, null()), else_=Outcome.CANCELLED.value),
            claim_token=case((uncancelled, null()), else_=c.claim_token),
            recovery_count=c.recovery_count + case((uncancelled, 1), else_=0),
            failure_reason=null(),
        )
    else:
        values = dict(
            state=_SETTLED,
            outcome=case((uncancelled, Outcome.INTERRUPTED.value), else_=Outcome.CANCELLED.value),
            failure_reason=case((uncancelled, reason), else_=null()),
        )
    return (
        update(t)
        .where(
            c.job_id == job_id,
            IS_RUNNING,
            c.claim_token == claim_token,
            c.recovery_count == recovery_count,
            c.lease_until <= db_clock_ms(),
        )
        .values(**values, lease_until=null())
        .returning(*COLUMNS)
    )
