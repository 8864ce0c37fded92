"""The ``watchdog_jobs`` table as a declarative model.

The CHECK constraints are the state grammar; the database itself refuses a
row in an impossible state, whoever writes it:

* ``delayed``: no outcome, no claim token, no lease, a ready time
* ``queued``: no outcome, no claim token, no lease
* ``running``: no outcome, a claim token and a lease
* ``settled``: an outcome, no lease

and attempts stay within their bounds (``1 <= attempt <= max_attempts``).

The table lives on its own :data:`metadata` (with a naming convention, so
constraint names are stable across dialects and migrations). Use it beside
your own declarative ``Base`` in one ``Session``; list it in Alembic's
``target_metadata`` so autogenerate leaves the table alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import (
    DDL,
    BigInteger,
    CheckConstraint,
    Float,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    TypeDecorator,
    event,
    text,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.schema import SchemaItem
from sqlalchemy.sql.compiler import DDLCompiler
from sqlalchemy.sql.ddl import BaseDDLElement
from sqlalchemy.types import TypeEngine

from .backends import BACKENDS, Backend, known_backend, with_variants
from .backends.triggers import EDGE_OUTCOMES
from .jobs import (
    AFTER_POLICIES,
    CANCELLATION_ID_MAX_LENGTH,
    JOB_ID_MAX_LENGTH,
    KEY_MAX_LENGTH,
    LANE_MAX_LENGTH,
    LIMIT_MAX,
    MAX_ATTEMPTS_LIMIT,
    PAUSE_REASON_MAX_LENGTH,
    QUEUE_MAX_LENGTH,
    TRACE_CONTEXT_MAX_LENGTH,
    JobState,
    Outcome,
)
from .jobs.durable import STEP_NAME_MAX_LENGTH
from .jobs.uniqueness import UNIQUE_KEY_MAX_LENGTH
from .records import PROGRESS_NOTE_MAX_LENGTH
from .results import DROP_NOTIFY_SETTLED_SQL, NOTIFY_SETTLED_FUNCTION_SQL, NOTIFY_SETTLED_TRIGGER_SQL
from .schedules import CRON_MAX_LENGTH, SCHEDULE_NAME_MAX_LENGTH
from .wakeups import DROP_NOTIFY_FUNCTION_SQL, NOTIFY_FUNCTION_SQL, NOTIFY_TRIGGER_SQL

__all__ = [
    "metadata",
    "WatchdogBase",
    "WatchdogJob",
    "WatchdogQueuePause",
    "WatchdogWorker",
    "WatchdogSchedule",
    "WatchdogLimit",
    "WatchdogLimitClaim",
    "WatchdogJobEdge",
    "jobs_table",
    "edges_table",
    "pauses_table",
    "workers_table",
    "schedules_table",
    "limits_table",
    "limit_claims_table",
    "WatchdogUniqueKey",
    "unique_keys_table",
    "WatchdogJobStep",
    "job_steps_table",
    "WatchdogJobSignal",
    "job_signals_table",
]

#: Bounds of the workers and schedules tables (revision w0009); what a runner
#: writes is cut to fit, so registering never fails on a long host name.
WORKER_ID_MAX_LENGTH = 64
HOST_MAX_LENGTH = 255
WORKER_QUEUES_MAX_LENGTH = 65536
WAKEUPS_MAX_LENGTH = 1000
VERSION_MAX_LENGTH = 64
TIMEZONE_MAX_LENGTH = 255
FINGERPRINT_MAX_LENGTH = 64

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: The MetaData holding ``watchdog_jobs``; add it to Alembic's ``target_metadata``.
metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _in(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


_STATES = [s.value for s in JobState]
_OUTCOMES = [o.value for o in Outcome]

#: The state grammar (revision w0003): what each state requires of the row.
STATE_GRAMMAR = (
    "(state = 'delayed' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL"
    " AND ready_at IS NOT NULL)"
    " OR (state = 'queued' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL)"
    " OR (state = 'running' AND outcome IS NULL AND claim_token IS NOT NULL"
    " AND lease_until IS NOT NULL)"
    " OR (state = 'settled' AND outcome IS NOT NULL AND lease_until IS NULL)"
    # Revision w0012: waiting for parents (Job(after=...)).
    " OR (state = 'waiting' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL"
    " AND waiting_on > 0)"
)
#: The state grammar before revision w0012 (what its migration replaces).
STATE_GRAMMAR_W0003 = (
    "(state = 'delayed' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL"
    " AND ready_at IS NOT NULL)"
    " OR (state = 'queued' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL)"
    " OR (state = 'running' AND outcome IS NULL AND claim_token IS NOT NULL"
    " AND lease_until IS NOT NULL)"
    " OR (state = 'settled' AND outcome IS NOT NULL AND lease_until IS NULL)"
)
#: Revision w0012: ``waiting_on`` counts a waiting job's unsettled parents;
#: 0 marks a job settled while waiting whose dependents are not told yet.
WAITING_ON_GRAMMAR = (
    "waiting_on IS NULL OR (waiting_on > 0 AND state = 'waiting') OR (waiting_on = 0 AND state = 'settled')"
)

#: Revision w0012: a result exists exactly on a job settled ``completed``
#: (the settle statement that completes it writes it; nothing else does).
RESULT_GRAMMAR = "result_json IS NULL OR (state = 'settled' AND outcome = 'completed')"

#: Revision w0013: ``watched`` is a flag, 1 or NULL.
WATCHED_FLAG = "{c} IS NULL OR {c} = 1"

#: Revision w0019: ``unstarted`` is a flag, 1 or NULL ...
UNSTARTED_FLAG = "{c} IS NULL OR {c} = 1"
#: ... set only while the job runs (a claim ahead whose handler has not started).
UNSTARTED_RUNNING = "unstarted IS NULL OR state = 'running'"


#: The columns of ``watchdog_jobs`` by the type SQLite must store in them
#: (revision w0010): SQLite's type affinity keeps ``'abc'`` in an INTEGER
#: column and a BLOB in any column, which no statement of the library could
#: sort, compare or decode. ``sequence`` (the rowid) is always an integer.
INTEGER_COLUMNS = ("priority", "recovery_count", "attempt", "snoozes")
NULLABLE_INTEGER_COLUMNS = (
    "recovery_max", "lease_until", "run_at", "ready_at", "max_attempts", "timeout_ms",
    "enqueued_at", "started_at", "settled_at", "waiting_on", "watched", "unstarted",
)  # fmt: skip
TEXT_COLUMNS = ("job_id", "queue_name", "lane", "payload_json", "state")
NULLABLE_TEXT_COLUMNS = (
    "outcome", "claim_token", "cancellation_id", "failure_reason", "failure_detail", "retry_policy",
    "failure_history", "rerun_of", "trace_context", "limit_key", "result_json", "progress_note", "after_policy",
)  # fmt: skip
#: Revision w0012: the progress fraction, a REAL (SQLite's REAL affinity stores
#: an integer written to it as a real too).
REAL_COLUMNS = ("progress",)


def _on_backends(fact: Callable[[Backend], bool], *, unknown: bool) -> Callable[..., bool]:
    """A ``ddl_if(callable_=...)`` condition: ``fact`` of the dialect's
    backend, ``unknown`` on a dialect without one."""

    def condition(
        ddl: BaseDDLElement,
        target: SchemaItem | str,
        bind: Connection | None,
        tables: list[Table] | None = None,
        state: Any | None = None,
        *,
        dialect: Dialect,
        compiler: DDLCompiler | None = None,
        checkfirst: bool = False,
    ) -> bool:
        backend = known_backend(dialect)
        return unknown if backend is None else fact(backend)

    return condition


#: Where a column's CHECK of its stored type is made (SQLite's, revision w0010).
_checks_stored_types = _on_backends(lambda backend: backend.checks_stored_types, unknown=False)
#: Where a one-column CHECK is the table's: every dialect without domains (revision w0016).
_table_column_checks = _on_backends(lambda backend: not backend.column_domains, unknown=True)


def stored_type_check(column: str) -> str:
    """The CHECK (SQLite only, revision w0010) that ``column`` holds its own type."""
    if column in REAL_COLUMNS:
        return f"typeof({column}) IN ('real', 'null')"
    kind = "integer" if column in INTEGER_COLUMNS or column in NULLABLE_INTEGER_COLUMNS else "text"
    if column in NULLABLE_INTEGER_COLUMNS or column in NULLABLE_TEXT_COLUMNS:
        return f"typeof({column}) IN ('{kind}', 'null')"
    return f"typeof({column}) = '{kind}'"


#: Named ``ck_watchdog_jobs_<column>_stored_type``; PostgreSQL's types already hold.
STORED_TYPE_COLUMNS = INTEGER_COLUMNS + NULLABLE_INTEGER_COLUMNS + TEXT_COLUMNS + NULLABLE_TEXT_COLUMNS + REAL_COLUMNS
STORED_TYPE_CHECKS = tuple(
    CheckConstraint(stored_type_check(column), name=f"{column}_stored_type").ddl_if(callable_=_checks_stored_types)
    for column in STORED_TYPE_COLUMNS
)


class ColumnDomain(TypeDecorator[Any]):
    """A column's type that is, on PostgreSQL, a domain over ``base`` whose
    CHECK is the column's own (revision w0016); elsewhere ``base`` with a
    table CHECK.

    PostgreSQL prepares every CHECK of a table again for each statement that
    writes to it (about 75 us of server time for a one-row ``UPDATE`` of
    ``watchdog_jobs`` with its 23 CHECKs, 140 us for a one-row ``INSERT``);
    a domain's CHECK is planned once per server process and runs only when
    a value is written to the column. Bound values and results are
    ``base``'s: a comparison with a value the domain refuses finds nothing,
    it does not fail.
    """

    impl = Text
    cache_ok = True

    def __init__(self, base: TypeEngine[Any], domain: str) -> None:
        super().__init__()
        self.impl = base  # type: ignore[assignment]
        self.base = base
        self.domain = domain


def _domain_name(type_: ColumnDomain, compiler: Any, **kw: Any) -> str:
    return type_.domain


for _backend in BACKENDS.values():
    if _backend.column_domains:
        compiles(ColumnDomain, _backend.name)(_domain_name)


#: Revision w0016: the one-column CHECKs of ``watchdog_jobs`` (column, its
#: constraint's name, the condition on ``{c}``): a domain's on PostgreSQL,
#: the table's elsewhere. The CHECKs relating columns stay the table's.
JOB_COLUMN_CHECKS: list[tuple[str, str, str]] = []


def _column_check(column: str, name: str, condition: str) -> CheckConstraint:
    """The table CHECK ``condition`` (on ``{c}``) of one column, on every dialect but PostgreSQL."""
    JOB_COLUMN_CHECKS.append((column, name, condition))
    check = CheckConstraint(condition.format(c=column), name=name)
    return check.ddl_if(callable_=_table_column_checks)


def _code_point_text() -> TypeEngine[str]:
    """``TEXT`` sorting by code point on every backend (revision w0010)."""
    return with_variants(Text(), lambda backend: backend.code_point_text)


def _bounded_text(length: int) -> TypeEngine[str]:
    """``TEXT`` of at most ``length`` characters (its CHECK says so), which
    an index or key holds: ``VARCHAR`` where the backend cannot index
    ``TEXT`` whole (``Backend.bounded_text``)."""
    return with_variants(Text(), lambda backend: backend.bounded_text(length))


def _long_text() -> TypeEngine[str]:
    """``TEXT`` holding a payload's or result's JSON whole (up to
    ``PAYLOAD_MAX_BYTES``): ``LONGTEXT`` where ``TEXT`` holds less
    (``Backend.long_text``, revision w0023)."""
    return with_variants(Text(), lambda backend: backend.long_text)


def _bigint_key() -> TypeEngine[int]:
    """``BIGINT`` as an autoincrementing primary key on every backend."""
    return with_variants(BigInteger(), lambda backend: backend.bigint_pk_type)


def _domain(column: str, base: TypeEngine[Any]) -> ColumnDomain:
    return ColumnDomain(base, f"watchdog_jobs_{column}")


#: The longest state or outcome word (their CHECKs list them).
_WORD = 32


class WatchdogBase(DeclarativeBase):
    """The declarative base of sqlalchemy_watchdog's own tables."""

    metadata = metadata


class WatchdogJob(WatchdogBase):
    """One job: a row of ``watchdog_jobs``.

    Read it freely with the ORM; change it only through the library's
    operations, which keep the state machine and the claims intact.
    """

    __tablename__ = "watchdog_jobs"

    sequence: Mapped[int] = mapped_column(_bigint_key(), primary_key=True, autoincrement=True)
    #: ``COLLATE "C"`` on PostgreSQL (revision w0010): uniqueness is the same
    #: (a deterministic collation is equal only when the bytes are), and the
    #: unique index sorts by code point, so a prefix is one range of it.
    job_id: Mapped[str] = mapped_column(_domain("job_id", _code_point_text()), unique=True)
    queue_name: Mapped[str] = mapped_column(_domain("queue_name", _bounded_text(QUEUE_MAX_LENGTH)))
    lane: Mapped[str] = mapped_column(_domain("lane", _bounded_text(LANE_MAX_LENGTH)))
    priority: Mapped[int] = mapped_column(BigInteger)
    payload_json: Mapped[str] = mapped_column(_long_text())
    recovery_max: Mapped[int | None] = mapped_column(_domain("recovery_max", Integer()))
    state: Mapped[str] = mapped_column(_domain("state", _bounded_text(_WORD)))
    outcome: Mapped[str | None] = mapped_column(_domain("outcome", _bounded_text(_WORD)))
    claim_token: Mapped[str | None] = mapped_column(Text)
    recovery_count: Mapped[int] = mapped_column(_domain("recovery_count", Integer()), server_default=text("0"))
    #: Unique among the jobs that have one (``uq_watchdog_jobs_cancellation_id``,
    #: a partial index since revision w0008).
    cancellation_id: Mapped[str | None] = mapped_column(
        _domain("cancellation_id", _bounded_text(CANCELLATION_ID_MAX_LENGTH))
    )
    failure_reason: Mapped[str | None] = mapped_column(Text)
    #: The traceback of a handler that raised (bounded; revision w0002).
    failure_detail: Mapped[str | None] = mapped_column(Text)
    #: Milliseconds since the Unix epoch, compared with the database clock.
    lease_until: Mapped[int | None] = mapped_column(BigInteger)
    # -- revision w0003: time and failure policy (epoch / duration milliseconds)
    #: The job's own requested start (``Job.run_at``); part of its identity.
    run_at: Mapped[int | None] = mapped_column(BigInteger)
    #: When a ``delayed`` job becomes ready (kept afterwards: when it did).
    ready_at: Mapped[int | None] = mapped_column(BigInteger)
    #: The attempt the job is on, from 1; a retry moves to the next.
    attempt: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    #: The job's own retry policy: attempts in all, and its backoff as JSON.
    max_attempts: Mapped[int | None] = mapped_column(_domain("max_attempts", Integer()))
    retry_policy: Mapped[str | None] = mapped_column(Text)
    #: The job's own per-attempt timeout.
    timeout_ms: Mapped[int | None] = mapped_column(_domain("timeout_ms", BigInteger()))
    #: How many times a handler snoozed the job.
    snoozes: Mapped[int] = mapped_column(_domain("snoozes", Integer()), server_default=text("0"))
    #: The latest failed attempts, a bounded JSON array.
    failure_history: Mapped[str | None] = mapped_column(Text)
    # -- revision w0004: operations (epoch milliseconds, database clock)
    enqueued_at: Mapped[int | None] = mapped_column(BigInteger)
    #: When the current or last attempt started.
    started_at: Mapped[int | None] = mapped_column(BigInteger)
    settled_at: Mapped[int | None] = mapped_column(BigInteger)
    #: The job_id this job reruns (Watchdog.rerun); part of its identity.
    rerun_of: Mapped[str | None] = mapped_column(_domain("rerun_of", _bounded_text(JOB_ID_MAX_LENGTH)))
    # -- revision w0005: trace context
    #: The W3C trace context (JSON object of propagation fields) the job was
    #: enqueued under, continued by the runner; not part of its identity.
    trace_context: Mapped[str | None] = mapped_column(_domain("trace_context", Text()))
    # -- revision w0011: flow control
    #: The job's flow-control key (``Job.key``); part of its identity.
    #: ``COLLATE "C"`` on PostgreSQL: a limited claim walks the keys in code
    #: point order, as SQLite's BINARY sorts them.
    limit_key: Mapped[str | None] = mapped_column(_domain("limit_key", _code_point_text()))
    # -- revision w0012: results
    #: The result a completed job's handler returned, as canonical JSON
    #: (written by the settle statement itself; CHECK ``result_completed``).
    result_json: Mapped[str | None] = mapped_column(_long_text())
    #: A running job's progress as its handler last reported it (0 to 1),
    #: and its note; kept when it settles, cleared by a requeue.
    progress: Mapped[float | None] = mapped_column(_domain("progress", Float()))
    progress_note: Mapped[str | None] = mapped_column(_domain("progress_note", Text()))
    #: Revision w0012: how many of a waiting job's parents are not settled
    #: (0: settled while waiting, its dependents not told yet), and its
    #: ``after_policy`` (NULL: no parents).
    waiting_on: Mapped[int | None] = mapped_column(Integer)
    after_policy: Mapped[str | None] = mapped_column(_domain("after_policy", Text()))
    # -- revision w0013: settle watch
    #: 1 when something waits for this job's settlement -- dependents
    #: (``after``) or, on PostgreSQL, a result waiter -- else NULL. Only a
    #: watched job's settlement runs the triggers that count its edges and
    #: notify result waiters; any other settles without them.
    watched: Mapped[int | None] = mapped_column(_domain("watched", Integer()))
    # -- revision w0019: starts of jobs claimed ahead
    #: 1 while a job claimed ahead of its runner's free slots waits for one:
    #: its handler has not started (the runner clears it, with one statement
    #: for every job it is about to start, before calling the handler), else
    #: NULL. Recovery requeues a job still marked without counting a recovery.
    unstarted: Mapped[int | None] = mapped_column(_domain("unstarted", Integer()))

    __table_args__ = (
        _column_check("job_id", "job_id_length", f"length({{c}}) BETWEEN 1 AND {JOB_ID_MAX_LENGTH}"),
        _column_check("queue_name", "queue_name_length", f"length({{c}}) BETWEEN 1 AND {QUEUE_MAX_LENGTH}"),
        _column_check("lane", "lane_length", f"length({{c}}) BETWEEN 1 AND {LANE_MAX_LENGTH}"),
        _column_check(
            "cancellation_id",
            "cancellation_id_length",
            f"{{c}} IS NULL OR length({{c}}) BETWEEN 1 AND {CANCELLATION_ID_MAX_LENGTH}",
        ),
        _column_check("state", "state_known", _in("{c}", _STATES)),
        _column_check("outcome", "outcome_known", f"{{c}} IS NULL OR {_in('{c}', _OUTCOMES)}"),
        _column_check("recovery_max", "recovery_max_nonnegative", "{c} IS NULL OR {c} >= 0"),
        _column_check("recovery_count", "recovery_count_nonnegative", "{c} >= 0"),
        CheckConstraint(STATE_GRAMMAR, name="state_grammar"),
        _column_check(
            "max_attempts", "max_attempts_range", f"{{c}} IS NULL OR {{c}} BETWEEN 1 AND {MAX_ATTEMPTS_LIMIT}"
        ),
        CheckConstraint("attempt >= 1 AND (max_attempts IS NULL OR attempt <= max_attempts)", name="attempt_bounds"),
        _column_check("snoozes", "snoozes_nonnegative", "{c} >= 0"),
        _column_check("timeout_ms", "timeout_positive", "{c} IS NULL OR {c} > 0"),
        CheckConstraint("settled_at IS NULL OR state = 'settled'", name="settled_at_settled"),
        _column_check(
            "rerun_of", "rerun_of_length", f"{{c}} IS NULL OR length({{c}}) BETWEEN 1 AND {JOB_ID_MAX_LENGTH}"
        ),
        _column_check(
            "trace_context",
            "trace_context_length",
            f"{{c}} IS NULL OR length({{c}}) BETWEEN 2 AND {TRACE_CONTEXT_MAX_LENGTH}",
        ),
        _column_check(
            "limit_key", "limit_key_length", f"{{c}} IS NULL OR length({{c}}) BETWEEN 1 AND {KEY_MAX_LENGTH}"
        ),
        #: Revision w0012: only a job settled ``completed`` holds a result.
        CheckConstraint(RESULT_GRAMMAR, name="result_completed"),
        _column_check("progress", "progress_range", "{c} IS NULL OR ({c} >= 0 AND {c} <= 1)"),
        CheckConstraint(WAITING_ON_GRAMMAR, name="waiting_on_state"),
        _column_check("after_policy", "after_policy_known", f"{{c}} IS NULL OR {_in('{c}', list(AFTER_POLICIES))}"),
        _column_check(
            "progress_note", "progress_note_length", f"{{c}} IS NULL OR length({{c}}) <= {PROGRESS_NOTE_MAX_LENGTH}"
        ),
        #: Revision w0013: a flag, set or NULL.
        _column_check("watched", "watched_flag", WATCHED_FLAG),
        #: Revision w0019: a flag, set only on a running job.
        _column_check("unstarted", "unstarted_flag", UNSTARTED_FLAG),
        CheckConstraint(UNSTARTED_RUNNING, name="unstarted_running"),
        # Last, as revision w0010 appends them to the stored definition.
        *STORED_TYPE_CHECKS,
        {"sqlite_autoincrement": True},
    )

    def __repr__(self) -> str:
        return f"WatchdogJob(job_id={self.job_id!r}, state={self.state!r}, outcome={self.outcome!r})"


def _partial(where: str) -> dict[str, Any]:
    """Each backend's keyword arguments of a partial index on ``where``
    (none where the database has no partial indexes: every row enters)."""
    options: dict[str, Any] = {}
    for backend in BACKENDS.values():
        options.update(backend.partial_index(where))
    return options


def _key_prefix(lengths: dict[str, int]) -> dict[str, Any]:
    """Each backend's keyword arguments indexing the columns of ``lengths``
    by a prefix, where a key's length is limited."""
    options: dict[str, Any] = {}
    for backend in BACKENDS.values():
        options.update(backend.key_prefix(lengths))
    return options


#: Jobs not settled yet; the literal order matters: SQLite uses a partial
#: index only for a query whose WHERE repeats its predicate.
LIVE = "state IN ('delayed', 'queued', 'running')"
_LIVE = LIVE
# Settled history never enters these partial indexes, so a long history
# cannot slow claims, recovery or lane failures.
#
# Every index a row enters costs its enqueue, and every claim and settle
# (each changes ``state``, so PostgreSQL writes each index a new entry):
# a ready job with a default lane enters the primary key, job_id and
# ix_watchdog_jobs_live_queue (revision w0008) and, since w0010,
# ix_watchdog_jobs_lane_history -- and no other (docs/design.md "Indexes").
# Delayed jobs by the time they become ready: promotion and the runner's
# "when is the next one due" read.
Index(
    "ix_watchdog_jobs_delayed",
    WatchdogJob.ready_at,
    WatchdogJob.sequence,
    **_partial("state = 'delayed'"),
)
# Settled jobs by outcome, then by when they settled: pruning one outcome reads
# only its own old rows, and the recent-outcome stats read one range per outcome.
Index(
    "ix_watchdog_jobs_settled",
    WatchdogJob.outcome,
    WatchdogJob.settled_at,
    WatchdogJob.sequence,
    **_partial("state = 'settled'"),
)
# Reruns by the job they rerun.
Index("ix_watchdog_jobs_rerun_of", WatchdogJob.rerun_of, **_partial("rerun_of IS NOT NULL"))
# Only jobs that have a cancellation id: a NULL would be an entry per job for nothing.
Index(
    "uq_watchdog_jobs_cancellation_id",
    WatchdogJob.cancellation_id,
    unique=True,
    **_partial("cancellation_id IS NOT NULL"),
)
Index(
    "ix_watchdog_jobs_lease",
    WatchdogJob.lease_until,
    WatchdogJob.sequence,
    **_partial("state = 'running'"),
)
#: Live jobs whose lane is their own, not their queue's name (the default):
#: a default lane's jobs are its queue's, found in ix_watchdog_jobs_live_queue.
CUSTOM_LANE = "lane <> queue_name"
# 'running' sorts after 'queued' and 'delayed': fail_lane takes running jobs first.
Index(
    "ix_watchdog_jobs_live_lane",
    WatchdogJob.lane,
    WatchdogJob.state.desc(),
    WatchdogJob.sequence,
    **_partial(f"{_LIVE} AND {CUSTOM_LANE}"),
)
# Every job by lane, settled history included (revision w0010): the listing's
# lane filter, oldest or newest first with keyset bounds, reads one range of
# it. Not partial: ``lane = :x`` also matches the default-lane jobs of a
# queue named ``:x`` (lane = queue_name), so no predicate could leave a job
# out. An entry per job, removed when prune deletes the job.
Index("ix_watchdog_jobs_lane_history", WatchdogJob.lane, WatchdogJob.sequence)
# Live jobs by queue: claims (each queue's queued jobs in claim order), purge,
# read_queue_head, the per-queue counts of stats(), and the lane failures of a
# default lane. The ready and
# enqueue times close the key (after the unique sequence they never order
# anything) so that stats() finds each queue's oldest ready job in the same
# index-only read that counts its jobs.
Index(
    "ix_watchdog_jobs_live_queue",
    WatchdogJob.queue_name,
    WatchdogJob.state,
    WatchdogJob.priority.desc(),
    WatchdogJob.sequence,
    WatchdogJob.ready_at,
    WatchdogJob.enqueued_at,
    **_partial(_LIVE),
)

# Flow control (revision w0011): only keyed jobs enter these two, so an
# unkeyed job pays nothing for them. The queued one is walked key by key by a
# limited claim (the next key after the last, then that key's best jobs);
# the running one counts a key's running jobs.
#: Their predicates, as the statements repeat them (SQLite uses a partial
#: index only for a query that repeats its predicate).
KEYED_QUEUED = "state = 'queued' AND limit_key IS NOT NULL"
KEYED_RUNNING = "state = 'running' AND limit_key IS NOT NULL"
Index(
    "ix_watchdog_jobs_keyed_queued",
    WatchdogJob.queue_name,
    WatchdogJob.limit_key,
    WatchdogJob.priority.desc(),
    WatchdogJob.sequence,
    **_partial(KEYED_QUEUED),
)
Index(
    "ix_watchdog_jobs_keyed_running",
    WatchdogJob.queue_name,
    WatchdogJob.limit_key,
    **_partial(KEYED_RUNNING),
)
# Revision w0012: jobs settled while waiting whose dependents a runner's
# pass must still tell (store.propagate); no other row enters it.
Index("ix_watchdog_jobs_untold", WatchdogJob.sequence, **_partial("waiting_on = 0"))
# Revision w0014: jobs waiting for their parents, by lane and queue, for the
# operations that act on them (fail_lane, purge, cancel_many, stats); only
# waiting rows enter it, and leave it when released.
WAITING = "state = 'waiting'"
Index(
    "ix_watchdog_jobs_waiting",
    WatchdogJob.lane,
    WatchdogJob.queue_name,
    WatchdogJob.sequence,
    **_partial(WAITING),
    # MariaDB/MySQL: lane (512) and queue_name (256) exceed InnoDB's key together.
    **_key_prefix({"lane": 255}),
)

#: The Core ``Table`` behind :class:`WatchdogJob`; the statements use it.
jobs_table: Table = cast(Table, WatchdogJob.__table__)


class WatchdogJobEdge(WatchdogBase):
    """A dependency (revision w0012): ``child`` waits for ``parent``
    (``Job(after=...)``); ``outcome`` is the parent's, once its settlement
    was counted (``purged``: deleted while live). No foreign keys: a
    settled parent may be pruned once no live job waits for it.

    Written by ``enqueue`` and the triggers of
    :mod:`sqlalchemy_watchdog.backends.triggers`; read through ``Watchdog.read``.
    """

    __tablename__ = "watchdog_job_edges"

    child: Mapped[str] = mapped_column(_code_point_text(), primary_key=True)
    parent: Mapped[str] = mapped_column(_code_point_text(), primary_key=True)
    outcome: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        CheckConstraint(f"length(child) BETWEEN 1 AND {JOB_ID_MAX_LENGTH}", name="child_length"),
        CheckConstraint(f"length(parent) BETWEEN 1 AND {JOB_ID_MAX_LENGTH}", name="parent_length"),
        CheckConstraint(f"outcome IS NULL OR {_in('outcome', list(EDGE_OUTCOMES))}", name="outcome_known"),
        CheckConstraint("child <> parent", name="not_itself"),
    )


#: The Core ``Table`` behind :class:`WatchdogJobEdge`.
edges_table: Table = cast(Table, WatchdogJobEdge.__table__)
# A parent's edges, for its settlement's trigger and for reads of a job's dependents.
Index("ix_watchdog_job_edges_parent", WatchdogJobEdge.parent, WatchdogJobEdge.child)


class WatchdogQueuePause(WatchdogBase):
    """A paused queue (revision w0004): runners claim none of its jobs.

    Change it only through ``Watchdog.pause`` / ``resume``.
    """

    __tablename__ = "watchdog_queue_pauses"

    queue_name: Mapped[str] = mapped_column(_bounded_text(QUEUE_MAX_LENGTH), primary_key=True)
    reason: Mapped[str | None] = mapped_column(Text)
    #: Epoch milliseconds, database clock.
    paused_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        CheckConstraint(f"length(queue_name) BETWEEN 1 AND {QUEUE_MAX_LENGTH}", name="queue_name_length"),
        CheckConstraint(f"reason IS NULL OR length(reason) <= {PAUSE_REASON_MAX_LENGTH}", name="reason_length"),
    )


#: The Core ``Table`` behind :class:`WatchdogQueuePause`.
pauses_table: Table = cast(Table, WatchdogQueuePause.__table__)


class WatchdogWorker(WatchdogBase):
    """A serving runner (revision w0009): registered when it starts serving,
    refreshed with every heartbeat (``last_seen``, ``running``), removed when
    it shuts down cleanly, pruned by other runners once long gone.

    Read it through ``Watchdog.workers()``; the runners write it.
    """

    __tablename__ = "watchdog_workers"

    worker_id: Mapped[str] = mapped_column(_bounded_text(WORKER_ID_MAX_LENGTH), primary_key=True)
    host: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    #: The queues it serves, a JSON array of names (up to
    #: ``WORKER_QUEUES_MAX_LENGTH`` characters: LONGTEXT on MariaDB, revision w0023).
    queues: Mapped[str] = mapped_column(_long_text())
    concurrency: Mapped[int] = mapped_column(Integer)
    #: Its wake-up mode as it runs (its ``wakeup_status``).
    wakeups: Mapped[str] = mapped_column(Text)
    #: The library version it runs.
    version: Mapped[str] = mapped_column(Text)
    #: Its heartbeat period: how soon a live worker refreshes ``last_seen``.
    heartbeat_ms: Mapped[int] = mapped_column(BigInteger)
    #: Epoch milliseconds, database clock.
    started_at: Mapped[int] = mapped_column(BigInteger)
    last_seen: Mapped[int] = mapped_column(BigInteger)
    #: Jobs it held at its last heartbeat: running, or claimed ahead and
    #: waiting for a free slot (at most ``concurrency + claim_ahead``).
    running: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    #: The most jobs it claims beyond its concurrency (revision w0017): the
    #: process executor's ``prefetch``, else the cap of ``claim_ahead``; 0:
    #: none. Written with every heartbeat (0 until the first after the upgrade).
    claim_ahead: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    #: Its queues whose handlers run in child processes, a JSON array of
    #: names (revision w0018); the others run in its own process. Written
    #: with every heartbeat (``[]`` until the first after the upgrade).
    process_queues: Mapped[str] = mapped_column(_long_text(), server_default=text("'[]'"))

    __table_args__ = (
        CheckConstraint(f"length(worker_id) BETWEEN 1 AND {WORKER_ID_MAX_LENGTH}", name="worker_id_length"),
        CheckConstraint(f"length(host) BETWEEN 1 AND {HOST_MAX_LENGTH}", name="host_length"),
        CheckConstraint("pid >= 0", name="pid_nonnegative"),
        CheckConstraint(f"length(queues) BETWEEN 2 AND {WORKER_QUEUES_MAX_LENGTH}", name="queues_length"),
        CheckConstraint("concurrency >= 1", name="concurrency_positive"),
        CheckConstraint(f"length(wakeups) BETWEEN 1 AND {WAKEUPS_MAX_LENGTH}", name="wakeups_length"),
        CheckConstraint(f"length(version) BETWEEN 1 AND {VERSION_MAX_LENGTH}", name="version_length"),
        CheckConstraint("heartbeat_ms > 0", name="heartbeat_positive"),
        CheckConstraint("last_seen >= started_at", name="seen_after_start"),
        CheckConstraint("running >= 0", name="running_nonnegative"),
        CheckConstraint("claim_ahead >= 0", name="claim_ahead_nonnegative"),
        CheckConstraint(
            f"length(process_queues) BETWEEN 2 AND {WORKER_QUEUES_MAX_LENGTH}", name="process_queues_length"
        ),
    )


#: The Core ``Table`` behind :class:`WatchdogWorker`.
workers_table: Table = cast(Table, WatchdogWorker.__table__)


class WatchdogSchedule(WatchdogBase):
    """A schedule as the runners serving it recorded it (revision w0009): one
    row per name and definition (``fingerprint``), so two deploys that
    disagree about a schedule's definition leave two rows.

    Read it through ``Watchdog.schedules()``; the runners write it.
    """

    __tablename__ = "watchdog_schedules"

    name: Mapped[str] = mapped_column(_bounded_text(SCHEDULE_NAME_MAX_LENGTH), primary_key=True)
    #: A digest of the whole definition (cron, time zone, the jobs' contents).
    fingerprint: Mapped[str] = mapped_column(_bounded_text(FINGERPRINT_MAX_LENGTH), primary_key=True)
    cron: Mapped[str] = mapped_column(Text)
    timezone: Mapped[str] = mapped_column(Text)
    queue_name: Mapped[str] = mapped_column(Text)
    #: Epoch milliseconds: the next slot, and the latest slot enqueued.
    next_slot: Mapped[int | None] = mapped_column(BigInteger)
    last_enqueued: Mapped[int | None] = mapped_column(BigInteger)
    #: The worker_id of the runner that recorded it last.
    recorded_by: Mapped[str] = mapped_column(Text)
    #: Epoch milliseconds, database clock.
    last_seen: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        CheckConstraint(f"length(name) BETWEEN 1 AND {SCHEDULE_NAME_MAX_LENGTH}", name="name_length"),
        CheckConstraint(f"length(fingerprint) BETWEEN 1 AND {FINGERPRINT_MAX_LENGTH}", name="fingerprint_length"),
        CheckConstraint(f"length(cron) BETWEEN 1 AND {CRON_MAX_LENGTH}", name="cron_length"),
        CheckConstraint(f"length(timezone) BETWEEN 1 AND {TIMEZONE_MAX_LENGTH}", name="timezone_length"),
        CheckConstraint(f"length(queue_name) BETWEEN 1 AND {QUEUE_MAX_LENGTH}", name="queue_name_length"),
        CheckConstraint(f"length(recorded_by) BETWEEN 1 AND {WORKER_ID_MAX_LENGTH}", name="recorded_by_length"),
    )


#: The Core ``Table`` behind :class:`WatchdogSchedule`.
schedules_table: Table = cast(Table, WatchdogSchedule.__table__)

#: The longest rate period stored (a day), in milliseconds.
RATE_PERIOD_MAX_MS = 86_400_000


#: CHECK ``some_limit`` of ``watchdog_limits``: a row limits something (clearing deletes it).
SOME_LIMIT = (
    "concurrency IS NOT NULL OR concurrency_per_key IS NOT NULL OR rate_count IS NOT NULL"
    " OR rate_per_key_count IS NOT NULL"
)


def _limit_range(column: str) -> CheckConstraint:
    return CheckConstraint(f"{column} IS NULL OR {column} BETWEEN 1 AND {LIMIT_MAX}", name=f"{column}_range")


class WatchdogLimit(WatchdogBase):
    """A queue's limits (revision w0011): every runner's claims obey them.

    Change it only through ``Watchdog.set_limits`` / ``clear_limits``; a
    limited claim locks the queue's row and moves its round-robin cursor.
    """

    __tablename__ = "watchdog_limits"

    queue_name: Mapped[str] = mapped_column(_bounded_text(QUEUE_MAX_LENGTH), primary_key=True)
    #: At most this many of the queue's jobs running at once.
    concurrency: Mapped[int | None] = mapped_column(Integer)
    #: At most this many running jobs of one key.
    concurrency_per_key: Mapped[int | None] = mapped_column(Integer)
    #: At most ``rate_count`` claims in any ``rate_period_ms`` window (database clock).
    rate_count: Mapped[int | None] = mapped_column(Integer)
    rate_period_ms: Mapped[int | None] = mapped_column(BigInteger)
    #: At most ``rate_per_key_count`` claims of one key's jobs in any
    #: ``rate_per_key_period_ms`` window (database clock; revision w0015).
    rate_per_key_count: Mapped[int | None] = mapped_column(Integer)
    rate_per_key_period_ms: Mapped[int | None] = mapped_column(BigInteger)
    #: The key that got the last job of the rotation (NULL: the unkeyed jobs, or none yet).
    cursor_key: Mapped[str | None] = mapped_column(_code_point_text())
    #: Epoch milliseconds, database clock.
    updated_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        CheckConstraint(f"length(queue_name) BETWEEN 1 AND {QUEUE_MAX_LENGTH}", name="queue_name_length"),
        _limit_range("concurrency"),
        _limit_range("concurrency_per_key"),
        _limit_range("rate_count"),
        CheckConstraint(
            f"rate_period_ms IS NULL OR rate_period_ms BETWEEN 1 AND {RATE_PERIOD_MAX_MS}", name="rate_period_range"
        ),
        CheckConstraint("(rate_count IS NULL) = (rate_period_ms IS NULL)", name="rate_complete"),
        _limit_range("rate_per_key_count"),
        CheckConstraint(
            f"rate_per_key_period_ms IS NULL OR rate_per_key_period_ms BETWEEN 1 AND {RATE_PERIOD_MAX_MS}",
            name="rate_per_key_period_range",
        ),
        CheckConstraint(
            "(rate_per_key_count IS NULL) = (rate_per_key_period_ms IS NULL)", name="rate_per_key_complete"
        ),
        CheckConstraint(SOME_LIMIT, name="some_limit"),
        CheckConstraint(
            f"cursor_key IS NULL OR length(cursor_key) BETWEEN 1 AND {KEY_MAX_LENGTH}", name="cursor_key_length"
        ),
    )


#: The Core ``Table`` behind :class:`WatchdogLimit`.
limits_table: Table = cast(Table, WatchdogLimit.__table__)


#: The predicate of ``ix_watchdog_limit_claims_keyed`` (the statements repeat it).
LOGGED_KEYED = "limit_key IS NOT NULL"


class WatchdogLimitClaim(WatchdogBase):
    """One limited claim of a rate-limited queue (revision w0011): when
    (database clock) and how many jobs it started -- of one key when the
    queue has a per-key rate (revision w0015: one row per key a claim
    started jobs of, NULL for the unkeyed ones). The claimers delete a
    queue's rows older than its longest period as they go."""

    __tablename__ = "watchdog_limit_claims"

    id: Mapped[int] = mapped_column(_bigint_key(), primary_key=True, autoincrement=True)
    queue_name: Mapped[str] = mapped_column(_bounded_text(QUEUE_MAX_LENGTH))
    #: Epoch milliseconds, database clock.
    claimed_at: Mapped[int] = mapped_column(BigInteger)
    jobs: Mapped[int] = mapped_column(Integer)
    #: The key whose jobs these were (a queue with a per-key rate; revision w0015), else NULL.
    limit_key: Mapped[str | None] = mapped_column(_code_point_text())

    __table_args__ = (
        CheckConstraint(f"length(queue_name) BETWEEN 1 AND {QUEUE_MAX_LENGTH}", name="queue_name_length"),
        CheckConstraint("jobs >= 1", name="jobs_positive"),
        CheckConstraint(
            f"limit_key IS NULL OR length(limit_key) BETWEEN 1 AND {KEY_MAX_LENGTH}", name="limit_key_length"
        ),
        Index("ix_watchdog_limit_claims_queue_name_claimed_at", "queue_name", "claimed_at"),
        # A key's claims in a window: one range (revision w0015); only keyed rows enter it.
        Index(
            "ix_watchdog_limit_claims_keyed",
            "queue_name",
            "limit_key",
            "claimed_at",
            **_partial(LOGGED_KEYED),
        ),
    )


#: The Core ``Table`` behind :class:`WatchdogLimitClaim`.
limit_claims_table: Table = cast(Table, WatchdogLimitClaim.__table__)


#: ``watchdog_unique_keys.kind``: which option holds the key.
UNIQUE_KINDS = ["unique_for", "debounce", "throttle"]
#: ``watchdog_unique_keys.states``: while its holder is in which states a key is held.
UNIQUE_STATES = ["waiting", "unsettled", "any"]
#: A window ends after it starts.
UNIQUE_WINDOW = "until_ms > since_ms"


class WatchdogUniqueKey(WatchdogBase):
    """A key held by a job's uniqueness option (revision w0020):
    ``Job(unique_key=..., unique_for=... | debounce=... | throttle=...)``.

    One row per key: the job that holds it (``job_id``), how (``kind``,
    ``states``) and for which window (``since_ms`` to ``until_ms``, database
    clock); an enqueue with the key locks the row, so concurrent enqueues
    of one key are judged one after the other. ``duplicates`` and
    ``replacements`` count the enqueues this holder absorbed. No foreign
    key: a holder may be purged or pruned; its row then holds by its window
    alone. Written by ``enqueue``; read by ``show`` and the dashboard.
    """

    __tablename__ = "watchdog_unique_keys"

    unique_key: Mapped[str] = mapped_column(_code_point_text(), primary_key=True)
    #: The job holding the key.
    job_id: Mapped[str] = mapped_column(_code_point_text())
    kind: Mapped[str] = mapped_column(Text)
    states: Mapped[str] = mapped_column(Text)
    #: Epoch milliseconds, database clock: the holder's window (a throttled
    #: job delayed to the next period holds from that period's start).
    since_ms: Mapped[int] = mapped_column(BigInteger)
    #: A debounce's holds while its holder waits; its ``until_ms`` is the
    #: holder's planned start (retention deletes rows a day past it).
    until_ms: Mapped[int] = mapped_column(BigInteger)
    duplicates: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    replacements: Mapped[int] = mapped_column(Integer, server_default=text("0"))

    __table_args__ = (
        CheckConstraint(f"length(unique_key) BETWEEN 1 AND {UNIQUE_KEY_MAX_LENGTH}", name="unique_key_length"),
        CheckConstraint(f"length(job_id) BETWEEN 1 AND {JOB_ID_MAX_LENGTH}", name="job_id_length"),
        CheckConstraint(_in("kind", UNIQUE_KINDS), name="kind_known"),
        CheckConstraint(_in("states", UNIQUE_STATES), name="states_known"),
        CheckConstraint(UNIQUE_WINDOW, name="window_order"),
        CheckConstraint("duplicates >= 0", name="duplicates_nonnegative"),
        CheckConstraint("replacements >= 0", name="replacements_nonnegative"),
        # The keys a job holds, for show and the dashboard.
        Index("ix_watchdog_unique_keys_job_id", "job_id"),
        # Ended windows, for the retention pass.
        Index("ix_watchdog_unique_keys_until_ms", "until_ms"),
    )


#: The Core ``Table`` behind :class:`WatchdogUniqueKey`.
unique_keys_table: Table = cast(Table, WatchdogUniqueKey.__table__)

#: ``watchdog_job_steps.kind``: a step's result, a durable sleep's end, a
#: wait for a signal (its timeout), a finished undo (revision w0022 added the last two).
STEP_KINDS = ["step", "sleep", "wait", "undo"]
#: A sleep has its end and a wait its timeout; a step and an undo have none (revision w0022).
STEP_WAKE = "(kind IN ('sleep', 'wait')) = (wake_at IS NOT NULL)"
#: Only a step keeps a result (revision w0022).
STEP_RESULT = "result_json IS NULL OR kind = 'step'"


class WatchdogJobStep(WatchdogBase):
    """A finished step of a job (revision w0021): ``job.step(name, fn)``
    recorded its result, or ``job.sleep(...)`` its end; a later attempt of
    the same job (a retry, a recovery, a resumed sleep) returns it instead
    of running the step again. Since revision w0022 also ``job.wait_for(name,
    timeout)``'s wait (``kind = 'wait'``, named as the signal, its timeout in
    ``wake_at``) and each finished undo of a failed job's compensation
    (``kind = 'undo'``, named ``undo:<step>``).

    Written by the running handler's runner, one ``INSERT ... SELECT`` guarded
    by the job's exact claim token and live lease (or, for
    ``job.transaction_step``, in the handler's own transaction); read by the
    next attempt, ``show`` and the dashboard. Keyed by the job's
    ``sequence``; the steps of a pruned or purged job are deleted by the
    next prune, in bounded batches.
    """

    __tablename__ = "watchdog_job_steps"

    #: The job's ``sequence``: a ``job_id`` pruned and enqueued again is a
    #: new job, with a new sequence, and never sees the old one's steps.
    job_sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    name: Mapped[str] = mapped_column(_code_point_text(), primary_key=True)
    job_id: Mapped[str] = mapped_column(_code_point_text())
    kind: Mapped[str] = mapped_column(Text)
    #: The step's result (canonical JSON, the runner's codec applied); NULL: None.
    result_json: Mapped[str | None] = mapped_column(_long_text())
    #: A sleep's end or a wait's timeout, epoch milliseconds on the database clock.
    wake_at: Mapped[int | None] = mapped_column(BigInteger)
    #: The attempt that recorded it.
    attempt: Mapped[int] = mapped_column(Integer)
    #: Epoch milliseconds, database clock.
    recorded_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        CheckConstraint(f"length(job_id) BETWEEN 1 AND {JOB_ID_MAX_LENGTH}", name="job_id_length"),
        CheckConstraint(f"length(name) BETWEEN 1 AND {STEP_NAME_MAX_LENGTH}", name="name_length"),
        CheckConstraint(_in("kind", STEP_KINDS), name="kind_known"),
        CheckConstraint(STEP_WAKE, name="wake_at_timed"),
        CheckConstraint(STEP_RESULT, name="result_step_only"),
        CheckConstraint("attempt >= 1", name="attempt_positive"),
    )


#: The Core ``Table`` behind :class:`WatchdogJobStep`.
job_steps_table: Table = cast(Table, WatchdogJobStep.__table__)


class WatchdogJobSignal(WatchdogBase):
    """A signal sent to a job (revision w0022): ``Watchdog.signal(job_id,
    name, payload)`` keeps the first signal of each name, so one sent before
    the job waits for it is there when it does (``job.wait_for(name)``).

    Written by ``signal`` (in its own transaction or the caller's), which
    locks the job's row first, and never changed afterwards; read by the
    waiting handler, ``show`` and the dashboard. Keyed by the job's
    ``sequence``, like the steps; the signals of a pruned or purged job are
    deleted by the next prune, in bounded batches.
    """

    __tablename__ = "watchdog_job_signals"

    #: The job's ``sequence`` (a ``job_id`` enqueued again after a prune never sees these).
    job_sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    name: Mapped[str] = mapped_column(_code_point_text(), primary_key=True)
    job_id: Mapped[str] = mapped_column(_code_point_text())
    #: The payload, canonical JSON (``null`` for None).
    payload_json: Mapped[str] = mapped_column(_long_text())
    #: When it was kept: epoch milliseconds, database clock.
    sent_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        CheckConstraint(f"length(job_id) BETWEEN 1 AND {JOB_ID_MAX_LENGTH}", name="job_id_length"),
        CheckConstraint(f"length(name) BETWEEN 1 AND {STEP_NAME_MAX_LENGTH}", name="name_length"),
        CheckConstraint("length(payload_json) >= 1", name="payload_present"),
        CheckConstraint("sent_at >= 0", name="sent_at_nonnegative"),
    )


#: The Core ``Table`` behind :class:`WatchdogJobSignal`.
job_signals_table: Table = cast(Table, WatchdogJobSignal.__table__)

# On PostgreSQL every INSERT statement into the table (enqueue, enqueue_select,
# or your own SQL) wakes idle runners through NOTIFY when its transaction
# commits (see the wakeups module).


def _notifying_ddl(statement: str) -> DDL:
    """``DDL(statement)`` run where the backend delivers LISTEN/NOTIFY
    wake-ups (SQLAlchemy leaves ``DDL.__init__`` unannotated)."""
    make: Callable[[str], DDL] = DDL
    ddl: DDL = make(statement).execute_if(callable_=_notifies)
    return ddl


_notifies = _on_backends(lambda backend: backend.notifies, unknown=False)


def _column_domains() -> list[tuple[ColumnDomain, str, str]]:
    """Revision w0016: each :class:`ColumnDomain` of ``watchdog_jobs``, its CHECK's name and condition."""
    return [(cast(ColumnDomain, jobs_table.c[column].type), name, cond) for column, name, cond in JOB_COLUMN_CHECKS]


def _create_domains(target: Table, connection: Any, **_: Any) -> None:
    backend = known_backend(connection.dialect)
    if backend is None:
        return
    for type_, name, condition in _column_domains():
        base = type_.base.compile(dialect=connection.dialect)
        check = NAMING_CONVENTION["ck"] % {"table_name": jobs_table.name, "constraint_name": name}
        for statement in backend.domain_sql(type_.domain, base, check, condition):
            connection.exec_driver_sql(statement)


def _drop_domains(target: Table, connection: Any, **_: Any) -> None:
    backend = known_backend(connection.dialect)
    if backend is None:
        return
    for type_, *_check in _column_domains():
        for statement in backend.drop_domain_sql(type_.domain):
            connection.exec_driver_sql(statement)


def _forget_orphaned_edges(target: Table, connection: Any, **_: Any) -> None:
    # watchdog_jobs is being made while watchdog_job_edges is there: the jobs table was dropped
    # by hand, and every edge names jobs that are gone. Kept, they would hold a new job of a
    # reused job_id waiting for ever (its edge to the parent already counted).
    if connection.dialect.has_table(connection, "watchdog_job_edges"):
        connection.exec_driver_sql("DELETE FROM watchdog_job_edges")


event.listen(jobs_table, "before_create", _create_domains)
event.listen(jobs_table, "before_create", _forget_orphaned_edges)
event.listen(jobs_table, "after_drop", _drop_domains)
event.listen(jobs_table, "after_create", _notifying_ddl(NOTIFY_FUNCTION_SQL))
event.listen(jobs_table, "after_create", _notifying_ddl(NOTIFY_TRIGGER_SQL))
event.listen(jobs_table, "after_drop", _notifying_ddl(DROP_NOTIFY_FUNCTION_SQL))
# Revision w0012: a row becoming settled notifies result waiters, while any
# wait (see the results module).
event.listen(jobs_table, "after_create", _notifying_ddl(NOTIFY_SETTLED_FUNCTION_SQL))
event.listen(jobs_table, "after_create", _notifying_ddl(NOTIFY_SETTLED_TRIGGER_SQL))
event.listen(jobs_table, "after_drop", _notifying_ddl(DROP_NOTIFY_SETTLED_SQL))


# Revision w0012: the dependency triggers, once both tables exist.
def _dependency_triggers(target: MetaData, connection: Any, **_: Any) -> None:
    backend = known_backend(connection.dialect)
    if backend is None:
        return
    tables = set(connection.dialect.get_table_names(connection))
    if not {"watchdog_jobs", "watchdog_job_edges"} <= tables:
        return
    # create_all on existing tables creates nothing, and no trigger twice; but a watchdog_jobs
    # dropped by hand took its triggers along while the edges' stayed: then all are made afresh.
    if connection.exec_driver_sql(backend.count_triggers_sql()).scalar() == len(backend.trigger_names):
        return
    for statement in [*backend.drop_trigger_sql(), *backend.trigger_sql()]:
        connection.exec_driver_sql(statement)


def _drop_dependency_triggers(target: MetaData, connection: Any, **_: Any) -> None:
    # Before the tables: SQLite refuses to drop a table another table's trigger names.
    backend = known_backend(connection.dialect)
    if backend is not None:
        for statement in backend.drop_trigger_sql():
            connection.exec_driver_sql(statement)


event.listen(metadata, "after_create", _dependency_triggers)
event.listen(metadata, "before_drop", _drop_dependency_triggers)
