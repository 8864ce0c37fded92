"""The one store: runs the statements of :mod:`.statements` on a sync ``Connection``.

Internal module: its names may change in any release; the public API is
what :mod:`sqlalchemy_watchdog` exports.

Every function here takes a ``Connection`` already inside a transaction and
leaves committing to its caller, so the same code serves the sync client,
the runner, and (through ``AsyncConnection.run_sync``) the asyncio API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import random
import re
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from . import statements as sql
from . import telemetry
from .connections import prepared_statement_failure
from .errors import EnqueueConflict, ErrorCode, InvalidJob, WatchdogError, redacted
from .jobs import (
    BULK_BATCH_MAX,
    CANCELLATION_ID_MAX_LENGTH,
    FAILURE_DETAIL_MAX_LENGTH,
    JOB_ID_MAX_LENGTH,
    LANE_MAX_LENGTH,
    PAUSE_REASON_MAX_LENGTH,
    PRUNE_BATCH_MAX,
    QUEUE_MAX_LENGTH,
    THROUGHPUT_MINUTES,
    BulkResult,
    BulkSkip,
    CancelResult,
    CancelStatus,
    Decision,
    EnqueueResult,
    EnqueueStatus,
    Job,
    JobState,
    JobView,
    LaneFailure,
    Outcome,
    PauseStatus,
    QueuePause,
    QueueStats,
    RetryPolicy,
    ScheduleView,
    SettleStatus,
    Stats,
    Throughput,
    Undecodable,
    WorkerView,
    at_epoch_ms,
    bound_reason,
    bulk_cancellation_id,
    check_aware,
    check_duration,
    check_int,
    check_text,
    duration_ms,
    epoch_ms,
    history_of,
    payload_of,
    rerun_job_id,
    slot_setters,
)
from .wakeups import EVENT_QUEUED, EVENT_STOP

__all__ = [
    "check_duration",
    "Claim",
    "ClaimBatch",
    "Recovery",
    "RecoveryCause",
    "RecoveryStatus",
    "SettleRequest",
    "Settlement",
    "now_ms",
    "view",
    "enqueue",
    "read",
    "read_queue_head",
    "read_settled",
    "has_pending_work",
    "Promotion",
    "promote",
    "claim",
    "settle",
    "renew",
    "release",
    "cancel",
    "fail_lane",
    "purge",
    "expired_claims",
    "reconcile",
    "seconds_until_next_expiry",
    "make_due",
    "begin_write",
    "TxMode",
    "READ",
    "WRITE",
    "transact",
    "transact_as",
    "write_transaction",
    "retrying",
    "WorkerRegistration",
    "register_worker",
    "deregister_worker",
    "workers",
    "prune_workers",
    "ScheduleRecord",
    "record_schedules",
    "schedules",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

#: Rows per multi-row INSERT (all rows travel as one JSON parameter).
ENQUEUE_CHUNK = 1000
#: Delayed jobs made queued per promotion statement.
PROMOTE_BATCH = 1000
#: Live jobs settled per ``fail_lane`` call.
LANE_FAILURE_BATCH = 100
NO_POLICY_REASON = "Execution disappeared without a recovery policy"


def now_ms() -> int:
    """The application clock in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def new_claim_token() -> str:
    return f"claim_{uuid.uuid4().hex}"


_STATES = {state.value: state for state in JobState}
_OUTCOMES = {outcome.value: outcome for outcome in Outcome}
#: The order :func:`view` unpacks (asserted against :data:`statements.COLUMNS`).
_VIEW_ORDER = (
    "sequence", "job_id", "queue_name", "lane", "priority", "payload_json", "recovery_max", "state",
    "outcome", "claim_token", "recovery_count", "cancellation_id", "failure_reason", "failure_detail",
    "lease_until", "run_at", "ready_at", "attempt", "max_attempts", "retry_policy", "timeout_ms",
    "snoozes", "failure_history", "enqueued_at", "started_at", "settled_at", "rerun_of", "trace_context",
)  # fmt: skip
assert tuple(column.key for column in sql.COLUMNS) == _VIEW_ORDER, "view() must unpack statements.COLUMNS"
_WIDTH = len(_VIEW_ORDER)


#: JobView's fields in the order :func:`view` fills them (asserted against the class).
_JOBVIEW_FIELDS = (
    "sequence", "job_id", "queue", "lane", "priority", "payload", "max_recoveries", "state", "outcome",
    "failure_reason", "recovery_count", "cancellation_id", "failure_detail", "run_at", "ready_at", "attempt",
    "max_attempts", "snoozes", "timeout", "retry", "failure_history", "enqueued_at", "started_at",
    "settled_at", "rerun_of", "reruns", "trace_context", "undecodable",
)  # fmt: skip
#: Each field's slot setter: a frozen dataclass's __init__ sets its 27 slots one
#: object.__setattr__ call at a time (by name, through a global), 3.5x slower
#: than the slots' own setters -- and view() runs for every claimed job.
_JOBVIEW_SETTERS = slot_setters(JobView, _JOBVIEW_FIELDS)
_new_object = object.__new__


class UnreadableText(str):
    """Stored text that is not UTF-8 (SQLite keeps whatever bytes a producer
    wrote), read with U+FFFD in place of each undecodable byte sequence:
    the type marks it, so :func:`view` lists it as unknown and :func:`claim`
    isolates the job. Binding it back never matches the stored bytes."""

    __slots__ = ()


def _tolerant_text(data: bytes) -> str:
    """SQLite's ``text_factory`` on the library's own connections: UTF-8,
    and never an error for text that is not (:class:`UnreadableText`)."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return UnreadableText(data.decode(errors="replace"))


@contextlib.contextmanager
def tolerant_text(conn: Connection) -> Iterator[None]:
    """On SQLite, read text that is not UTF-8 as :class:`UnreadableText`
    instead of failing the fetch, while the block runs; the DBAPI
    connection's own ``text_factory`` is restored afterwards, so the
    application's use of the same pooled connection is unchanged."""
    if conn.dialect.name != "sqlite":
        yield
        return
    driver: Any = conn.connection.driver_connection  # sqlite3's, or aiosqlite's (the same property)
    before = driver.text_factory
    driver.text_factory = _tolerant_text
    try:
        yield
    finally:
        driver.text_factory = before


def unreadable_columns(row: Sequence[Any]) -> list[str]:
    """The columns of a row starting with :data:`statements.COLUMNS` that
    hold :class:`UnreadableText`."""
    return [name for name, value in zip(_VIEW_ORDER, row) if type(value) is UnreadableText]


def view(row: Sequence[Any]) -> JobView:
    """Turn a row that starts with :data:`statements.COLUMNS` (a ``Row`` or
    a driver's tuple) into a :class:`JobView`.

    Positional, not by name: the runner's hot statements hand over the
    driver's tuples (:func:`execute_rows`), and this runs once per claimed
    job (and per settled job whose view is read).

    Never raises for a stored value it cannot decode (a row a producer
    wrote itself): that field reads as unknown (:class:`~sqlalchemy_watchdog.Undecodable`,
    see :attr:`JobView.undecodable`), so one such row never stops a claim,
    a settle, a recovery or a read of the others."""
    (
        sequence, job_id, queue_name, lane, priority, payload_json, recovery_max, state,
        outcome, _token, recovery_count, cancellation_id, failure_reason, failure_detail,
        _lease, run_at, ready_at, attempt, max_attempts, retry_policy, timeout_ms,
        snoozes, failure_history, enqueued_at, started_at, settled_at, rerun_of, trace_context,
    ) = row[:_WIDTH]  # fmt: skip
    try:
        values = (
            sequence,
            job_id,
            queue_name,
            lane,
            priority,
            payload_of(payload_json),
            recovery_max,
            _STATES[state],
            None if outcome is None else _OUTCOMES[outcome],
            failure_reason,
            recovery_count,
            cancellation_id,
            failure_detail,
            None if run_at is None else at_epoch_ms(run_at),
            None if ready_at is None else at_epoch_ms(ready_at),
            attempt,
            max_attempts,
            snoozes,
            None if timeout_ms is None else timedelta(milliseconds=timeout_ms),
            None if max_attempts is None else RetryPolicy.from_stored(max_attempts, retry_policy),
            history_of(failure_history) if failure_history else (),
            None if enqueued_at is None else at_epoch_ms(enqueued_at),
            None if started_at is None else at_epoch_ms(started_at),
            None if settled_at is None else at_epoch_ms(settled_at),
            rerun_of,
            (),
            None if trace_context is None else telemetry.trace_context_of(trace_context),
            (),
        )
        if UnreadableText in map(type, row):  # text that is not UTF-8 (SQLite)
            raise ValueError("unreadable text")
    except Exception:  # a value the library would never have stored
        values = _decoded_field_by_field(row)
    job: JobView = _new_object(JobView)
    for setter, value in zip(_JOBVIEW_SETTERS, values, strict=True):
        setter(job, value)
    return job


def _decoded_field_by_field(row: Sequence[Any]) -> tuple[Any, ...]:
    """:func:`view`'s values for a row with a value it cannot decode: each
    decoded on its own, what fails read as unknown and listed."""
    (
        sequence, job_id, queue_name, lane, priority, payload_json, recovery_max, state,
        outcome, _token, recovery_count, cancellation_id, failure_reason, failure_detail,
        _lease, run_at, ready_at, attempt, max_attempts, retry_policy, timeout_ms,
        snoozes, failure_history, enqueued_at, started_at, settled_at, rerun_of, trace_context,
    ) = row[:_WIDTH]  # fmt: skip
    unknown: list[Undecodable] = []

    def decoded(field: str, column: str, decode: Callable[[Any], Any], value: Any, otherwise: Any) -> Any:
        if value is None:
            return None
        try:
            if type(value) is UnreadableText:
                raise UnicodeError("stored text is not UTF-8")
            return decode(value)
        except Exception as error:
            unknown.append(Undecodable.of(field, column, error))
            return unknown[-1] if otherwise is _ITSELF else otherwise

    def time_of(field: str, value: Any) -> datetime | None:
        return decoded(field, field, at_epoch_ms, value, None)  # type: ignore[no-any-return]

    payload = decoded("payload", "payload_json", payload_of, payload_json, _ITSELF)
    run = time_of("run_at", run_at)
    ready = time_of("ready_at", ready_at)
    timeout = decoded("timeout", "timeout_ms", lambda ms: timedelta(milliseconds=ms), timeout_ms, None)
    # The stored max_attempts (a plain, CHECKed column) still bounds the job's
    # attempts: only the backoff falls back to the defaults.
    fallback = None if max_attempts is None else RetryPolicy(max_attempts=max_attempts)
    retry = (
        None
        if max_attempts is None
        else decoded(
            "retry", "retry_policy", lambda text: RetryPolicy.from_stored(max_attempts, text), retry_policy, fallback
        )
        or fallback
    )
    history = decoded("failure_history", "failure_history", history_of, failure_history or None, ()) or ()
    enqueued = time_of("enqueued_at", enqueued_at)
    started = time_of("started_at", started_at)
    settled = time_of("settled_at", settled_at)
    trace = decoded("trace_context", "trace_context", telemetry.trace_context_of, trace_context, None)
    for field, column, value in (
        ("job_id", "job_id", job_id), ("queue", "queue_name", queue_name), ("lane", "lane", lane),
        ("cancellation_id", "cancellation_id", cancellation_id), ("failure_reason", "failure_reason", failure_reason),
        ("failure_detail", "failure_detail", failure_detail), ("rerun_of", "rerun_of", rerun_of),
    ):  # fmt: skip
        if type(value) is UnreadableText:  # read as it is (U+FFFD for the bytes), listed unknown
            unknown.append(Undecodable(field, column, "stored text is not UTF-8"))
    return (
        sequence,
        job_id,
        queue_name,
        lane,
        priority,
        payload,
        recovery_max,
        _STATES[state],
        None if outcome is None else _OUTCOMES[outcome],
        failure_reason,
        recovery_count,
        cancellation_id,
        failure_detail,
        run,
        ready,
        attempt,
        max_attempts,
        snoozes,
        timeout,
        retry,
        history,
        enqueued,
        started,
        settled,
        rerun_of,
        (),
        trace,
        tuple(unknown),
    )


#: ``decoded(..., otherwise=_ITSELF)``: an undecodable value reads as its :class:`Undecodable`.
_ITSELF: Any = object()


# -- the hot statements, precompiled ------------------------------------------


@dataclass(frozen=True, slots=True)
class _Precompiled:
    """A statement compiled once for one dialect: the SQL text the driver
    gets, the statement's own literal parameters, and -- for a positional
    paramstyle (SQLite's ``?``) -- the order of the parameter names."""

    text: str
    defaults: Mapping[str, Any]
    positions: tuple[str, ...] | None


#: Per dialect (an engine's), per statement (by identity: the builders of
#: :mod:`.statements` cache theirs, and the entry keeps it alive).
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
    for bind, name in compiled.bind_names.items():
        if bind.expanding or bind.type.dialect_impl(dialect).bind_processor(dialect) is not None:
            plain = False
        if not bind.required:
            defaults[name] = bind.effective_value
    result = None
    if plain and not compiled.literal_execute_params and not compiled.post_compile_params:
        positions = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
        result = _Precompiled(compiled.string, defaults, positions)
    cached[id(stmt)] = (stmt, result)
    return result


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
    statement the store sends.
    """
    pre = _precompiled(conn.dialect, stmt)
    if pre is None:
        return list(conn.execute(stmt, dict(params)))
    values = {**pre.defaults, **params}
    args: Any = values if pre.positions is None else tuple(values[name] for name in pre.positions)
    if _observed(conn):
        return list(conn.exec_driver_sql(pre.text, args))
    if not conn.in_transaction():
        # What Connection.execute does first (its autobegin): the caller's
        # commit() or rollback() then ends the transaction this statement is in.
        conn.begin()
    # Outside the try: SQLAlchemy's own errors (a connection left invalid
    # inside a transaction) propagate as they are, as from Connection.execute.
    dbapi_connection = conn.connection.dbapi_connection
    assert dbapi_connection is not None
    cursor = None
    try:
        cursor = dbapi_connection.cursor()
        cursor.execute(pre.text, args)
        # Every hot statement has RETURNING (and cursor.description would
        # build a column object per column per execute).
        rows: list[Sequence[Any]] = list(cursor.fetchall())
        cursor.close()
    except conn.dialect.loaded_dbapi.Error as error:
        # Wrapped as DBAPIError, the connection invalidated on a disconnect,
        # the cursor closed otherwise: SQLAlchemy's own handling.
        conn._handle_dbapi_exception(error, pre.text, args, cursor, None)
    return rows


# -- enqueue -----------------------------------------------------------------


def check_delay(delay: object, jobs: Sequence[Job]) -> int | None:
    """An enqueue's ``delay`` in milliseconds (None: none), checked."""
    if delay is None:
        return None
    check_duration("delay", delay)
    assert isinstance(delay, timedelta)
    for job in jobs:
        if isinstance(job, Job) and job.run_at is not None:
            raise InvalidJob("delay", f"cannot be combined with run_at (job {job.job_id!r} has one)")
    return duration_ms(delay)


def enqueue(conn: Connection, jobs: Sequence[Job], *, delay: timedelta | None = None) -> list[EnqueueResult]:
    """Admit ``jobs`` in the connection's current transaction.

    Identical replays (in the table or within ``jobs``) are duplicates; a
    conflicting replay raises :class:`EnqueueConflict` after the statement
    failed -- the caller must roll back (the public ``enqueue`` does).
    ``delay`` makes every job wait that long after the database clock (it
    is not part of a job's identity: a replay with another delay is a
    duplicate).
    """
    delay_ms = check_delay(delay, jobs)
    firsts: dict[str, Job] = {}
    for job in jobs:
        if not isinstance(job, Job):
            raise TypeError(f"enqueue takes Job objects, not {type(job).__name__}")
        seen = firsts.get(job.job_id)
        if seen is None:
            firsts[job.job_id] = job
        elif not _same(seen, job):
            raise EnqueueConflict(job.job_id)
    unique = list(firsts.values())
    try:
        return _enqueue_traced(conn, jobs, unique, delay_ms)
    except DBAPIError as error:
        refused = prepared_statement_failure(error)
        if refused is None:
            raise
        raise refused from error


def _enqueue_traced(
    conn: Connection, jobs: Sequence[Job], unique: list[Job], delay_ms: int | None
) -> list[EnqueueResult]:
    instrumentation = telemetry.active()
    if instrumentation is None:
        return _enqueue(conn, jobs, unique, delay_ms, None)
    trace = telemetry.EnqueueTrace()
    trace_context = None
    with telemetry.guarded("enqueue"):
        trace = instrumentation.enqueue(unique)
        trace_context = telemetry.storable_trace_context(trace.trace_context)
    try:
        results = _enqueue(conn, jobs, unique, delay_ms, trace_context)
    except BaseException as error:
        with telemetry.guarded("enqueue"):
            trace.failed(error)
            trace.end()
        raise
    with telemetry.guarded("enqueue"):
        trace.admitted(results)
        trace.end()
    return results


def _enqueue(
    conn: Connection, jobs: Sequence[Job], unique: Sequence[Job], delay_ms: int | None, trace_context: str | None
) -> list[EnqueueResult]:
    admitted: set[str] = set()
    dialect = conn.dialect.name
    stmt = sql.enqueue_rows(dialect)
    plain = delay_ms is None and trace_context is None
    for start in range(0, len(unique), ENQUEUE_CHUNK):
        chunk = unique[start : start + ENQUEUE_CHUNK]
        # A row may stop after its last non-NULL field (the statement reads a
        # missing one as NULL): most jobs are their first five fields, which
        # halves encoding the parameter.
        rows = [
            (job.job_id, job.queue, job.lane, job.priority, job.payload_json)
            if plain
            and job.max_recoveries is None
            and job.run_at is None
            and job.retry is None
            and job.timeout is None
            and job.rerun_of is None
            else (*_values(job), delay_ms, trace_context)
            for job in chunk
        ]
        params = sql.rows_params(dialect, "jobs", sql.ENQUEUE_FIELDS, rows)
        # One statement, no savepoint around it: one round trip in the
        # caller's transaction. A conflict's offender is named afterwards
        # (see _conflict_of).
        try:
            admitted.update(row[0] for row in execute_rows(conn, stmt, params))
        except IntegrityError as error:
            raise _conflict_of(conn, chunk, error) from error
    if len(admitted) == len(jobs):  # the common case: every job new, none twice
        return [_queued(job.job_id) for job in jobs]
    results: list[EnqueueResult] = []
    first_seen: set[str] = set()
    for job in jobs:
        queued = job.job_id in admitted and job.job_id not in first_seen
        first_seen.add(job.job_id)
        results.append(EnqueueResult(job.job_id, EnqueueStatus.QUEUED if queued else EnqueueStatus.DUPLICATE))
    return results


_set_result_job_id, _set_result_status = slot_setters(EnqueueResult, ("job_id", "status"))


def _queued(job_id: str) -> EnqueueResult:
    """``EnqueueResult(job_id, QUEUED)`` without the frozen dataclass's
    per-field ``object.__setattr__`` (a batch enqueue makes one per job)."""
    result = _new_object(EnqueueResult)
    _set_result_job_id(result, job_id)
    _set_result_status(result, EnqueueStatus.QUEUED)
    return result


def enqueue_each(conn: Connection, jobs: Sequence[Job]) -> list[EnqueueResult | None]:
    """Enqueue ``jobs`` one statement each; a conflicting replay is skipped
    (None) instead of failing the others -- for a runner enqueueing its
    schedules' slots, where another runner (or an older deploy with other
    contents) may have enqueued the same slot first."""
    results: list[EnqueueResult | None] = []
    for job in jobs:
        savepoint = conn.dialect.name == "postgresql" and not _autocommit(conn)
        try:
            if savepoint:
                with conn.begin_nested():
                    results.append(enqueue(conn, [job])[0])
            else:
                results.append(enqueue(conn, [job])[0])
        except EnqueueConflict:
            results.append(None)
    return results


def _autocommit(conn: Connection) -> bool:
    """Whether each statement on ``conn`` commits by itself (no look-up round trip)."""
    return bool(getattr(conn.connection.dbapi_connection, "autocommit", False))


def _first_conflict(conn: Connection, chunk: Sequence[Job]) -> str | None:
    """The first job of ``chunk`` stored with other contents, if any."""
    stored = {
        row.job_id: row._asdict()
        for row in conn.execute(sql.stored_contents(), {"job_ids": [job.job_id for job in chunk]})
    }
    for job in chunk:
        row = stored.get(job.job_id)
        if row is not None and row != _row(job):
            return job.job_id
    return None


def _same(a: Job, b: Job) -> bool:
    return _row(a) == _row(b)


def self_committing(dialect: str) -> bool:
    """Whether the store's operations run without BEGIN/COMMIT on ``dialect``.

    Every store operation but a multi-chunk enqueue is made of statements
    each correct on its own (one conditional write, plus reads), so on
    PostgreSQL they run in autocommit: one round trip instead of three.
    SQLite keeps ``BEGIN IMMEDIATE`` transactions (no round trips to save,
    and a reader that later writes must hold the lock from the start).
    """
    return dialect == "postgresql"


def one_statement(conn_or_dialect: Connection | str, jobs: Sequence[Job]) -> bool:
    """Whether enqueueing ``jobs`` writes with one statement (atomic by itself).

    Only on PostgreSQL: SQLite's writers want ``BEGIN IMMEDIATE``.
    """
    dialect = conn_or_dialect if isinstance(conn_or_dialect, str) else conn_or_dialect.dialect.name
    return dialect == "postgresql" and len({job.job_id for job in jobs}) <= ENQUEUE_CHUNK


def _values(job: Job) -> tuple[Any, ...]:
    """The job in :data:`statements.IDENTITY_FIELDS` order."""
    return (
        job.job_id,
        job.queue,
        job.lane,
        job.priority,
        job.payload_json,
        job.max_recoveries,
        job.run_at_ms,
        job.max_attempts,
        job.retry_json,
        job.timeout_ms,
        job.rerun_of,
    )


def _row(job: Job) -> dict[str, Any]:
    """The job's identity as the stored row's columns."""
    return dict(zip((name for name, _ in sql.IDENTITY_FIELDS), _values(job), strict=True))


def _conflict_of(conn: Connection, chunk: Sequence[Job], error: IntegrityError) -> Exception:
    """Name the job whose replay conflicted: only a NOT NULL failure on
    ``watchdog_jobs.job_id`` is ours (the conflicting replay sets it to
    NULL); any other integrity error is returned as it is, the database's."""
    if violation(error) != ("not_null", "job_id"):
        return error
    if len(chunk) == 1:
        return EnqueueConflict(chunk[0].job_id)
    if conn.dialect.name == "postgresql" and not _autocommit(conn):
        # PostgreSQL aborted the caller's transaction: ask on a connection of
        # its own, which sees the committed jobs (a conflict with a job this
        # same transaction enqueued is not found: the message says so).
        with conn.engine.connect() as other:
            offender = _first_conflict(other, chunk)
    else:
        # SQLite undid only the statement; an autocommit connection is idle.
        offender = _first_conflict(conn, chunk)
    if offender is not None:
        return EnqueueConflict(offender)
    # Not found: the conflicting job was enqueued earlier in the same
    # (now aborted) transaction, or a concurrent one rolled back since.
    conflict = EnqueueConflict(chunk[0].job_id)
    conflict.args = (
        f"one of {len(chunk)} jobs (the first is {chunk[0].job_id!r}) is already enqueued "
        "with different contents; the transaction was rolled back",
    )
    return conflict


#: PostgreSQL's SQLSTATEs of the integrity violations the store interprets.
_PG_VIOLATIONS = {"23502": "not_null", "23505": "unique"}
#: The unique constraints of ``watchdog_jobs`` (named by the model's naming
#: convention and by the migration alike), by column.
_UNIQUE_COLUMNS = {
    f"uq_{sql.t.name}_job_id": "job_id",
    f"uq_{sql.t.name}_cancellation_id": "cancellation_id",
}
#: SQLite's fixed wording of a one-column NOT NULL / UNIQUE failure.
_SQLITE_VIOLATION = re.compile(rf"(NOT NULL|UNIQUE) constraint failed: {re.escape(sql.t.name)}\.(\w+)")


def violation(error: IntegrityError) -> tuple[str, str] | None:
    """``(kind, column)`` when ``error`` is a NOT NULL (``"not_null"``) or a
    one-column UNIQUE (``"unique"``) violation on ``watchdog_jobs``, else None.

    Read from the driver's diagnostics, never from the message text as a
    whole (which carries the failing row's values on PostgreSQL): psycopg's
    SQLSTATE, table, column and constraint names; SQLite's message, whose
    format SQLite fixes, matched in full.
    """
    orig = error.orig
    # psycopg 3 and psycopg2 carry the server's fields as ``diag``; asyncpg's
    # own exception (the cause of SQLAlchemy's adapted one) as attributes.
    diag = getattr(orig, "diag", None)
    cause = getattr(orig, "__cause__", None)
    if diag is None and hasattr(cause, "table_name"):
        diag = cause
    if diag is not None:
        sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or ""
        kind = _PG_VIOLATIONS.get(sqlstate)
        if kind is None or getattr(diag, "table_name", None) != sql.t.name:
            return None
        if kind == "not_null":
            column = getattr(diag, "column_name", None)
            return (kind, column) if column else None
        column = _UNIQUE_COLUMNS.get(getattr(diag, "constraint_name", None) or "")
        return (kind, column) if column else None
    match = _SQLITE_VIOLATION.fullmatch(str(orig).strip())
    if match is None:
        return None
    return ("not_null" if match.group(1) == "NOT NULL" else "unique", match.group(2))


# -- reads -------------------------------------------------------------------


def read(conn: Connection, job_id: str) -> JobView | None:
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    row = conn.execute(sql.read_job(), {"job": job_id}).first()
    return None if row is None else view(row)


def read_claim(conn: Connection, job_id: str) -> tuple[JobView, str | None] | None:
    """The job and its current claim token (private to the runner)."""
    row = conn.execute(sql.read_job(), {"job": job_id}).first()
    return None if row is None else (view(row), row.claim_token)


def read_queue_head(conn: Connection, queue: str) -> JobView | None:
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    row = conn.execute(sql.read_queue_head(), {"queue": queue}).first()
    return None if row is None else view(row)


def read_settled(conn: Connection, limit: int, after_sequence: int = 0) -> list[JobView]:
    check_int("limit", limit, 1, 256)
    check_int("after_sequence", after_sequence, 0, 2**63 - 1)
    params = {"limit": limit, "after_sequence": after_sequence}
    return [view(row) for row in conn.execute(sql.read_settled(), params)]


def has_pending_work(conn: Connection) -> bool:
    return conn.execute(sql.has_pending_work()).first() is not None


def count_ready(conn: Connection, queues: Sequence[str], cap: int) -> int:
    """How many queued jobs of ``queues`` wait, counted up to ``cap``."""
    return int(conn.execute(sql.count_ready(), {"queues": list(queues), "cap": cap}).scalar_one())


# -- the claim life cycle ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Promotion:
    """What one promotion did: how many delayed jobs became queued, and in
    how many seconds the next delayed job is due (None: none is delayed)."""

    promoted: int
    next_in: float | None


def next_ready_in(conn: Connection) -> float | None:
    """Seconds until the earliest delayed job is due by the database clock
    (0 when one is due now; None when none is delayed)."""
    ready_at, clock = conn.execute(sql.next_ready()).one()
    if ready_at is None:
        return None
    seconds: float = max(0.0, (ready_at - clock) / 1000.0)
    return seconds


def promote(conn: Connection, *, limit: int = PROMOTE_BATCH) -> Promotion:
    """Make up to ``limit`` due delayed jobs ``queued`` (the earliest first)."""
    due = next_ready_in(conn)
    if due is None or due > 0:
        return Promotion(0, due)
    promoted = len(conn.execute(sql.promote(conn.dialect.name), {"limit": limit}).all())
    return Promotion(promoted, next_ready_in(conn))


@dataclass(frozen=True, slots=True)
class Claim:
    """A job this process claimed, with the secret token that settles it."""

    job: JobView
    token: str


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    """What one claim statement took: jobs to run, and jobs it found cancelled."""

    claimed: tuple[Claim, ...]
    cancelled: tuple[JobView, ...]


def claim(
    conn: Connection,
    *,
    queues: Sequence[str] | None,
    limit: int = 1,
    lease_ms: int,
) -> ClaimBatch:
    """Claim up to ``limit`` ready jobs of ``queues`` (all queues if None),
    leased for ``lease_ms`` from the database clock."""
    params: dict[str, Any] = {"token": new_claim_token(), "lease_ms": lease_ms, "limit": limit}
    if queues is None:
        stmt = sql.claim(conn.dialect.name, None)
    else:
        distinct = list(dict.fromkeys(queues))
        if not distinct:
            return ClaimBatch((), ())
        stmt = sql.claim(conn.dialect.name, len(distinct))
        params.update(sql.queue_params(distinct))
    # By priority, then admission (positions 4 and 0 of statements.COLUMNS).
    rows = sorted(execute_rows(conn, stmt, params), key=lambda r: (-r[4] if type(r[4]) is int else 0, r[0]))
    claimed: list[Claim] = []
    cancelled: list[JobView] = []
    for row in rows:
        if row[9] is not None and (columns := unreadable_columns(row)):
            # Text that is not UTF-8 (SQLite): its job_id may not read back as
            # stored, so no settle by job_id could find it. Failed here, by key.
            failed = {
                "key": row[0],
                "token": row[9],
                "why": f"stored value unreadable: {', '.join(columns)}",
            }
            cancelled.extend(view(settled) for settled in conn.execute(sql.settle_unreadable(), failed))
            continue
        job = view(row)
        if job.state is JobState.RUNNING:
            claimed.append(Claim(job, row[9]))
        elif job.state is JobState.SETTLED:
            cancelled.append(job)
        else:  # pragma: no cover - the CHECK grammar forbids it
            raise WatchdogError(ErrorCode.CLAIM_UNAVAILABLE, f"claim returned {job.state}")
    return ClaimBatch(tuple(claimed), tuple(cancelled))


@dataclass(frozen=True, slots=True)
class SettleRequest:
    """One settle of a batch: the exact claim and what its handler decided.

    ``now`` is the application clock (epoch milliseconds) when the handler
    returned; the database clock is consulted too (the later one counts).
    """

    job_id: str
    claim_token: str
    decision: Decision
    now: int | None = None
    #: The traceback of a handler that raised, kept with a ``failed`` job.
    detail: str | None = None
    #: Requeue instead of settling (a retry or a snooze): ready again this
    #: many milliseconds after the database clock. None settles the job
    #: with ``decision.outcome``.
    requeue_after_ms: int | None = None
    #: The failure history to store (JSON), when this attempt failed.
    history: str | None = None

    @property
    def row(self) -> tuple[Any, ...]:
        """The request in :data:`statements.SETTLE_FIELDS` order."""
        decision = self.decision
        delay = self.requeue_after_ms
        if delay is None and decision.snoozed:
            assert decision.after is not None
            delay = duration_ms(decision.after)
        requeued = delay is not None
        return (
            self.job_id,
            self.claim_token,
            None if requeued or decision.outcome is None else decision.outcome.value,
            decision.reason,
            _detail(self),
            delay,
            1 if requeued and not decision.snoozed else 0,
            1 if requeued and decision.snoozed else 0,
            self.history,
        )


class Settlement:
    """What one settle did, and the job as it now is.

    A settle statement's row becomes a :class:`JobView` only when ``job`` is
    first read: a busy runner reads it only to log or trace the settle."""

    __slots__ = ("_job", "_row", "status")

    def __init__(self, status: SettleStatus, job: JobView | None = None, *, row: Sequence[Any] | None = None) -> None:
        self.status = status
        self._job = job
        self._row = row

    @property
    def outcome(self) -> Outcome | None:
        """The settled job's outcome, read without building its view."""
        row = self._row
        if row is not None:
            return _OUTCOMES.get(row[8])
        return None if self._job is None else self._job.outcome

    @property
    def job(self) -> JobView | None:
        row = self._row
        if row is not None:
            self._job = view(row)
            self._row = None
        return self._job

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settlement):
            return NotImplemented
        return self.status is other.status and self.job == other.job

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Settlement(status={self.status!r}, job={self.job!r})"


def settle(
    conn: Connection,
    *,
    job_id: str,
    claim_token: str,
    decision: Decision,
    now: int | None = None,
) -> Settlement:
    """Settle the exact claim; see :func:`statements.settle`."""
    return settle_many(conn, [SettleRequest(job_id, claim_token, decision, now)])[0]


def settle_many(conn: Connection, requests: Sequence[SettleRequest]) -> list[Settlement]:
    """Settle exact claims in one statement of the caller's transaction.

    Every row keeps its own guard (exact token, live lease); only the
    statement and the commit are shared, which is what makes a busy runner
    fast on a durable database. The lease is checked against the latest
    ``now`` of the batch.
    """
    for request in requests:
        if not isinstance(request.decision, Decision):
            raise WatchdogError(
                ErrorCode.INVALID_INPUT,
                f"decision: must be a Decision, not {type(request.decision).__name__}",
            )
    job_ids = [request.job_id for request in requests]
    if len(set(job_ids)) < len(job_ids):  # one statement updates a row once
        return [result for request in requests for result in settle_many(conn, [request])]
    dialect = conn.dialect.name
    params = sql.rows_params(dialect, "settles", sql.SETTLE_FIELDS, [r.row for r in requests])
    params["now"] = max((r.now or now_ms()) for r in requests)
    settled = {row[1]: row for row in execute_rows(conn, sql.settle(dialect), params)}
    return [
        _settled(settled[r.job_id]) if r.job_id in settled else _unsettled(conn, r.job_id, r.claim_token, r.decision)
        for r in requests
    ]


def _settled(row: Sequence[Any]) -> Settlement:
    # Position 7 of statements.COLUMNS is the state.
    status = SettleStatus.SETTLED if row[7] == JobState.SETTLED.value else SettleStatus.REQUEUED
    return Settlement(status, row=row)


def _detail(request: SettleRequest) -> str | None:
    """The request's traceback, bounded to its last characters; only a
    ``failed`` decision keeps one."""
    detail = request.detail
    if detail is None or request.decision.outcome is not Outcome.FAILED:
        return None
    if not isinstance(detail, str):
        raise WatchdogError(ErrorCode.INVALID_INPUT, f"detail: must be a str, not {type(detail).__name__}")
    detail = detail.replace("\x00", "\\0")
    if len(detail) > FAILURE_DETAIL_MAX_LENGTH:
        detail = "…" + detail[-(FAILURE_DETAIL_MAX_LENGTH - 1) :]
    return detail


def _unsettled(conn: Connection, job_id: str, claim_token: str, decision: Decision) -> Settlement:
    """Why a settle updated nothing: a replay, a conflict, or no such job.

    A requeue (retry, snooze) drops its claim token, so its replay cannot be
    recognised and answers ``conflict``: the runner then leaves the job to
    whoever holds it now."""
    prior = read_claim(conn, job_id)
    if prior is None:
        return Settlement(SettleStatus.MISSING, None)
    job, token = prior
    expected = decision.outcome if job.cancellation_id is None else Outcome.CANCELLED
    if job.state is JobState.SETTLED and token == claim_token and job.outcome is expected:
        return Settlement(SettleStatus.REPLAYED, job)
    return Settlement(SettleStatus.CONFLICT, job)


def renew(conn: Connection, claims: Sequence[tuple[str, str]], *, lease_ms: int, now: int | None = None) -> set[str]:
    """Renew exact claims; returns the job_ids still held (the rest are lost)."""
    if not claims:
        return set()
    params = {"claims": list(claims), "now": now_ms() if now is None else now, "lease_ms": lease_ms}
    return {row.job_id for row in conn.execute(sql.renew(), params)}


def release(conn: Connection, claims: Sequence[tuple[str, str]]) -> set[str]:
    """End the leases of claims a stopping runner could not finish."""
    if not claims:
        return set()
    return set(conn.execute(sql.release(), {"claims": list(claims)}).scalars())


def cancel(conn: Connection, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelResult:
    """Record a cancellation.

    ``replayed`` when this ``cancellation_id`` is already recorded for this
    job; ``conflict`` when the job already has another cancellation, has
    settled (or, with ``only_if_queued``, is running), or when the
    ``cancellation_id`` names another job's cancellation. Two concurrent
    cancellations sharing one ``cancellation_id`` on different jobs fail the
    later statement with an ``IntegrityError``; the client reports it as a
    conflict. Identical requests answer ``recorded`` once and ``replayed``
    otherwise, whatever their interleaving.
    """
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    check_text("cancellation_id", cancellation_id, CANCELLATION_ID_MAX_LENGTH)
    if not isinstance(only_if_queued, bool):
        raise WatchdogError(ErrorCode.INVALID_INPUT, "only_if_queued: must be a bool")
    holder = conn.execute(sql.cancellation_holder(), {"cancellation": cancellation_id}).scalar()
    if holder is not None:
        status = CancelStatus.REPLAYED if holder == job_id else CancelStatus.CONFLICT
        return CancelResult(job_id, status)
    params = {"job": job_id, "cancellation": cancellation_id}
    if conn.execute(sql.cancel(only_if_queued), params).first() is not None:
        return CancelResult(job_id, CancelStatus.RECORDED)
    # Nothing updated. The read above and the update are separate statements
    # (each committed on its own on PostgreSQL): an identical request may have
    # recorded this very cancellation in between, so decide from the row as
    # it is now, never from the earlier read.
    return CancelResult(job_id, cancel_status_now(conn, job_id, cancellation_id))


def cancel_status_now(conn: Connection, job_id: str, cancellation_id: str) -> CancelStatus:
    """Why a cancellation was not recorded, read afresh: ``replayed`` if the
    job now holds this very ``cancellation_id``, ``missing`` if there is no
    such job, else ``conflict``."""
    prior = read(conn, job_id)
    if prior is None:
        return CancelStatus.MISSING
    if prior.cancellation_id == cancellation_id:
        return CancelStatus.REPLAYED
    return CancelStatus.CONFLICT


def notify(conn: Connection, event: str) -> None:
    """Wake listening runners when the transaction commits (PostgreSQL only)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sql.notify(), {"event": event})


def fail_lane(conn: Connection, lane: str, reason: str, *, batch: int = LANE_FAILURE_BATCH) -> LaneFailure:
    """Settle one batch of the lane's live jobs ``failed``; ``more`` if any remain."""
    check_text("lane", lane, LANE_MAX_LENGTH)
    if not isinstance(reason, str) or not reason:
        raise WatchdogError(ErrorCode.INVALID_INPUT, "reason: must be a non-empty str")
    params = {"lane_name": lane, "reason": bound_reason(reason), "batch": batch}
    rows = conn.execute(sql.fail_lane(conn.dialect.name), params).all()
    jobs = tuple(sorted((view(row) for row in rows), key=lambda j: j.sequence))
    more = bool(conn.execute(sql.lane_has_live_jobs(), {"lane_name": lane}).scalar())
    return LaneFailure(jobs, more)


def purge(conn: Connection, queue: str) -> int:
    """Delete the queue's queued and delayed jobs; returns how many."""
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    return conn.execute(sql.purge(), {"queue": queue}).rowcount


# -- recovery ----------------------------------------------------------------


def expired_claims(conn: Connection, *, limit: int) -> list[Claim]:
    """Running jobs whose lease has ended by the database clock, earliest first.

    Only the database clock decides whether another runner's claim is dead,
    so a recoverer whose own clock runs ahead cannot steal a live lease.
    """
    rows = conn.execute(sql.expired_claims(), {"limit": limit})
    return [Claim(view(row), row.claim_token) for row in rows]


class RecoveryStatus(str, enum.Enum):
    """What recovering one disappeared claim did."""

    #: Back in the queue, its recovery count one higher.
    REQUEUED = "requeued"
    #: Settled: ``interrupted`` (no budget left), or ``cancelled``.
    SETTLED = "settled"
    #: Somebody else recovered, renewed or settled it first; nothing changed.
    LOST_RACE = "lost_race"


class RecoveryCause(str, enum.Enum):
    """Why a claim is being recovered; an ``interrupted`` job's reason says which."""

    #: Its lease ended: the worker died, froze or lost its database.
    VANISHED = "vanished"
    #: Its runner shut down and the handler outlived the grace period.
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class Recovery:
    """What recovering one disappeared claim did."""

    job_id: str
    status: RecoveryStatus
    job: JobView | None


#: ``interrupted`` after a shutdown whose grace the handler outlived.
SHUTDOWN_REASON = "Runner shut down while the job was running (its handler outlived the grace period)"
_FROM_JOB: Any = object()


def recovery_reason(
    job: JobView, max_recoveries: int | None = _FROM_JOB, cause: RecoveryCause = RecoveryCause.VANISHED
) -> str:
    """The ``failure_reason`` of a job settled ``interrupted`` by recovery."""
    budget = job.max_recoveries if max_recoveries is _FROM_JOB else max_recoveries
    if cause is RecoveryCause.SHUTDOWN:
        policy = "no recovery policy" if budget is None else f"recovery budget exhausted ({budget} recoveries)"
        return f"{SHUTDOWN_REASON}; {policy}"
    if budget is None:
        return NO_POLICY_REASON
    return f"Restart recovery budget exhausted ({budget} recoveries)"


def reconcile(
    conn: Connection,
    expired: Claim,
    *,
    max_recoveries: int | None = _FROM_JOB,
    cause: RecoveryCause = RecoveryCause.VANISHED,
) -> Recovery:
    """Requeue the dead claim within its budget, else settle it ``interrupted``.

    The budget is ``max_recoveries`` (default: the job's own); ``cause``
    goes into an ``interrupted`` job's reason. One conditional statement:
    the same token, the same recovery count and an ended lease.
    """
    job = expired.job
    budget = job.max_recoveries if max_recoveries is _FROM_JOB else max_recoveries
    requeue = budget is not None and job.recovery_count < budget
    params = {
        "job": job.job_id,
        "token": expired.token,
        "count": job.recovery_count,
        "reason": recovery_reason(job, budget, cause),
    }
    row = conn.execute(sql.reconcile(requeue), params).first()
    if row is None:
        return Recovery(job.job_id, RecoveryStatus.LOST_RACE, None)
    after = view(row)
    status = RecoveryStatus.REQUEUED if after.state is JobState.QUEUED else RecoveryStatus.SETTLED
    return Recovery(job.job_id, status, after)


def release_and_recover(
    conn: Connection,
    claims: Sequence[tuple[str, str]],
    budgets: Mapping[str, int | None] | None = None,
    *,
    cause: RecoveryCause = RecoveryCause.SHUTDOWN,
) -> list[Recovery]:
    """End the leases of abandoned claims and recover them at once (shutdown).

    ``budgets`` maps a job_id to its recovery budget (default: the job's own).
    """
    release(conn, claims)
    # A set of pairs, not a job_id -> token map: a runner may hold two
    # executions of one job (a handler that overstayed its lease, and the
    # job's next claim), of which only the current claim's token matches.
    pairs = set(claims)
    results = []
    for expired in expired_claims(conn, limit=len(claims) + 64):
        if (expired.job.job_id, expired.token) in pairs:
            budget = _FROM_JOB if budgets is None else budgets.get(expired.job.job_id, _FROM_JOB)
            results.append(reconcile(conn, expired, max_recoveries=budget, cause=cause))
    return results


def seconds_until_next_expiry(conn: Connection) -> float | None:
    """Seconds until the earliest running lease ends (by the database clock)."""
    lease_until, clock = conn.execute(sql.next_lease_expiry()).one()
    if lease_until is None:
        return None
    seconds: float = (lease_until - clock) / 1000.0
    return max(0.0, seconds)


# -- operations: retention, listing, stats, pauses, reruns ------------------------

#: The largest page :func:`list_jobs` returns.
LIST_LIMIT_MAX = 1000
#: The largest ``sequence`` (a 64-bit signed integer): no job's is greater.
SEQUENCE_MAX = 2**63 - 1


def check_outcomes(outcomes: object) -> list[str] | None:
    """Outcome filters as stored values (None: every outcome)."""
    if outcomes is None:
        return None
    if isinstance(outcomes, (str, Outcome)):
        outcomes = [outcomes]
    if not isinstance(outcomes, Iterable):
        raise InvalidJob("outcomes", f"must be an iterable of outcomes, not {type(outcomes).__name__}")
    values = [_member(Outcome, "outcomes", outcome) for outcome in outcomes]
    if not values:
        raise InvalidJob("outcomes", "must name at least one outcome (None prunes every outcome)")
    return sorted(set(values))


@dataclass(frozen=True, slots=True)
class Pruning:
    """A checked ``prune`` request: what to delete, in batches of ``batch``."""

    older_than: timedelta
    outcomes: list[str] | None
    limit: int | None
    batch: int
    include_undated: bool

    @classmethod
    def of(
        cls,
        older_than: object,
        outcomes: object,
        limit: object,
        batch: object,
        include_undated: object,
    ) -> Pruning:
        """Check every argument before anything is deleted."""
        values = check_outcomes(outcomes)
        age = check_duration("older_than", older_than, low=timedelta(0))
        size = check_int("batch", batch, 1, PRUNE_BATCH_MAX)
        total = None if limit is None else check_int("limit", limit, 1, 2**63 - 1)
        if not isinstance(include_undated, bool):
            raise InvalidJob("include_undated", f"must be a bool, not {type(include_undated).__name__}")
        return cls(age, values, total, size, include_undated)

    def next_batch(self, deleted: int) -> int:
        """The size of the next batch after ``deleted`` rows (0: done)."""
        return self.batch if self.limit is None else min(self.batch, self.limit - deleted)

    def run_batch(self, conn: Connection, size: int) -> int:
        return prune_batch(
            conn, older_than=self.older_than, outcomes=self.outcomes, limit=size, include_undated=self.include_undated
        )


def prune_batch(
    conn: Connection,
    *,
    older_than: timedelta,
    outcomes: Sequence[str] | None = None,
    limit: int = 1000,
    include_undated: bool = False,
) -> int:
    """Delete at most ``limit`` settled jobs that settled more than
    ``older_than`` ago by the database clock (of ``outcomes``, default
    every outcome; with ``include_undated`` also those with no recorded
    time), outcome by outcome, each the oldest first; returns how many."""
    check_duration("older_than", older_than, low=timedelta(0))
    check_int("limit", limit, 1, PRUNE_BATCH_MAX)
    dialect = conn.dialect.name
    deleted = 0
    for outcome in outcomes if outcomes is not None else [o.value for o in Outcome]:
        for undated in (True, False) if include_undated else (False,):
            if deleted >= limit:
                return deleted
            params = {"outcome": outcome, "age_ms": duration_ms(older_than), "limit": limit - deleted}
            deleted += conn.execute(sql.prune(dialect, undated), params).rowcount
    return deleted


#: The key of the PostgreSQL advisory lock one pruning runner holds.
PRUNE_LOCK_KEY = 0x5741_5443_4844_4F47 & 0x7FFF_FFFF_FFFF_FFFF  # "WATCHDOG"


def prune_retention(conn: Connection, ages: Mapping[str, timedelta], batch: int) -> int | None:
    """One runner's retention pass: one batch per outcome of ``ages``, in one
    transaction (:data:`NEEDS_TRANSACTION`).

    On PostgreSQL it runs only if its transaction gets the advisory lock
    (another runner pruning at the same moment makes this one skip: None);
    the lock is the transaction's, never the session's, so it is correct
    behind a pooler in transaction mode and ends with the commit. On SQLite
    every batch holds the write lock, which is exclusive anyway.
    Returns how many jobs were deleted, or None when another runner prunes.
    """
    if (
        conn.dialect.name == "postgresql"
        and not conn.execute(sql.try_advisory_xact_lock(), {"key": PRUNE_LOCK_KEY}).scalar()
    ):
        return None
    return sum(prune_batch(conn, older_than=age, outcomes=[outcome], limit=batch) for outcome, age in ages.items())


def _member(kind: type[JobState] | type[Outcome], field: str, value: object) -> str:
    """``value`` as a stored member of ``kind``, or a clear error naming ``field``."""
    try:
        return str(kind(value).value)
    except ValueError:
        known = ", ".join(member.value for member in kind)
        raise InvalidJob(field, f"{value!r} is not a known {kind.__name__} (known: {known})") from None


def prefix_upper_bound(prefix: str) -> str | None:
    """The least text greater than every text starting with ``prefix``, in
    code point order: its last character the next code point (surrogates
    skipped). None when there is none to say (a last character U+10FFFF)."""
    last = ord(prefix[-1])
    if last >= 0x10FFFF:
        return None
    following = 0xE000 if 0xD800 <= last + 1 <= 0xDFFF else last + 1
    return prefix[:-1] + chr(following)


#: Databases (by engine URL) whose job_id order is code point order, as found.
_CODE_POINT_ORDER: dict[str, bool] = {}
#: PostgreSQL collations of a libc provider that sort by code point (byte order of UTF-8).
_CODE_POINT_COLLATIONS = frozenset({"C", "POSIX", "C.UTF-8", "C.utf8"})


def sorts_by_code_point(conn: Connection) -> bool:
    """Whether ``watchdog_jobs.job_id`` -- and so ``uq_watchdog_jobs_job_id`` --
    sorts by code point here, so that the jobs starting with a prefix are one
    range of it: always on SQLite (``BINARY``: UTF-8 bytes); on PostgreSQL
    when the column's collation is the database's and that one is ``C``,
    ``POSIX`` or ``C.UTF-8`` (libc) or the builtin provider's, never under a
    linguistic collation (glibc's ``en_US.UTF-8``, ICU). Asked once per
    database and remembered."""
    if conn.dialect.name != "postgresql":
        return True
    key = conn.engine.url.render_as_string(hide_password=True)
    known = _CODE_POINT_ORDER.get(key)
    if known is None:
        row = conn.execute(sql.job_id_collation()).first()
        known = _CODE_POINT_ORDER[key] = row is not None and (
            row[0] in ("C", "POSIX")  # the column's own (revision w0010: "C")
            or (row[0] == "default" and (row[2] == "b" or (row[2] == "c" and row[1] in _CODE_POINT_COLLATIONS)))
        )
    return known


def list_jobs(
    conn: Connection,
    *,
    queue: str | None = None,
    state: JobState | str | None = None,
    outcome: Outcome | str | None = None,
    lane: str | None = None,
    job_id_prefix: str | None = None,
    limit: int = 100,
    after_sequence: int = 0,
    before_sequence: int | None = None,
    newest_first: bool = False,
    with_payload: bool = True,
) -> list[JobView]:
    """Jobs between ``after_sequence`` and ``before_sequence`` (keyset
    paging) in admission order, or newest first; without ``with_payload``
    their payloads are not read (None)."""
    params: dict[str, Any] = {
        "limit": check_int("limit", limit, 1, LIST_LIMIT_MAX),
        "after_sequence": check_int("after_sequence", after_sequence, 0, SEQUENCE_MAX),
        "before_sequence": SEQUENCE_MAX
        if before_sequence is None
        else check_int("before_sequence", before_sequence, 1, SEQUENCE_MAX),
    }
    if not isinstance(newest_first, bool):
        raise InvalidJob("newest_first", f"must be a bool, not {type(newest_first).__name__}")
    if queue is not None:
        params["queue"] = check_text("queue", queue, QUEUE_MAX_LENGTH)
    if state is not None:
        params["state"] = _member(JobState, "state", state)
    if outcome is not None:
        params["outcome"] = _member(Outcome, "outcome", outcome)
    if lane is not None:
        params["lane"] = check_text("lane", lane, LANE_MAX_LENGTH)
    if job_id_prefix is not None:
        params["job_id_prefix"] = check_text("job_id_prefix", job_id_prefix, JOB_ID_MAX_LENGTH)
    if job_id_prefix is not None and (high := prefix_upper_bound(job_id_prefix)) and sorts_by_code_point(conn):
        # A marker (its values are the two below); SQLite's planner is told to read it first.
        params["job_id_range" if conn.dialect.name == "postgresql" else "job_id_range_first"] = True
        params["job_id_low"], params["job_id_high"] = job_id_prefix, high
    filters = tuple(
        f"state={params.pop('state')}" if name == "state" else name for name in sql.LIST_FILTERS if name in params
    )
    params.pop("job_id_range", None)
    params.pop("job_id_range_first", None)
    if not isinstance(with_payload, bool):
        raise InvalidJob("with_payload", f"must be a bool, not {type(with_payload).__name__}")
    return [view(row) for row in conn.execute(sql.list_jobs(filters, with_payload, newest_first), params)]


def stats(conn: Connection) -> Stats:
    """Every queue's counts, recent outcomes, oldest ready age and pause."""
    clock = conn.execute(sql.stats_clock()).scalar_one()
    queues: dict[str, dict[str, Any]] = {}

    def entry(queue: str) -> dict[str, Any]:
        return queues.setdefault(queue, {"minute": {}, "hour": {}})

    for queue, state, count, since in conn.execute(sql.live_counts()):
        e = entry(queue)
        e[state] = count
        if state == JobState.QUEUED.value and since is not None:
            try:
                e["oldest_ready_age"] = timedelta(milliseconds=max(0, clock - since))
            except (OverflowError, TypeError):  # a ready time written by hand, out of range: unknown
                pass
    for queue, count in conn.execute(sql.expired_counts()):
        entry(queue)["expired_leases"] = count
    for queue, outcome, last_minute, last_hour in conn.execute(sql.recent_outcomes()):
        e = entry(queue)
        e["minute"][Outcome(outcome)] = int(last_minute or 0)
        e["hour"][Outcome(outcome)] = int(last_hour)
    for queue, reason, paused_at in conn.execute(sql.paused_queues()):
        entry(queue)["pause"] = QueuePause(queue, reason, at_epoch_ms(paused_at))
    serving = live_workers_per_queue(conn)
    result = []
    for queue in sorted(queues):
        e = queues[queue]
        result.append(
            QueueStats(
                queue,
                delayed=e.get(JobState.DELAYED.value, 0),
                queued=e.get(JobState.QUEUED.value, 0),
                running=e.get(JobState.RUNNING.value, 0),
                expired_leases=e.get("expired_leases", 0),
                oldest_ready_age=e.get("oldest_ready_age"),
                settled_last_minute={o: n for o, n in e["minute"].items() if n},
                settled_last_hour=dict(e["hour"]),
                pause=e.get("pause"),
                workers=serving.get(queue, 0),
            )
        )
    return Stats(at_epoch_ms(clock), tuple(result))


# -- workers and schedules (revision w0009) ---------------------------------------

#: A worker is gone once it has not been seen for this many of its heartbeats
#: plus :data:`WORKER_GONE_MARGIN_MS` (a heartbeat late by a slow database or
#: a busy host is not a death): the bound is per worker, so a runner with a
#: long heartbeat is judged by its own period.
WORKER_GONE_HEARTBEATS = 3
WORKER_GONE_MARGIN_MS = 30_000
#: Gone workers are shown as gone this long, then pruned by the runners.
WORKER_KEEP_GONE_MS = 3_600_000
#: Recorded schedules not seen this long are forgotten.
SCHEDULE_KEEP_MS = 7 * 86_400_000
#: A recorded schedule is current when seen this recently (runners record
#: theirs at least every minute).
SCHEDULE_CURRENT_MS = 210_000
#: Rows each prune of workers or schedules deletes at most.
WORKER_PRUNE_BATCH = 100


def _gone_after_ms(heartbeat_ms: int) -> int:
    return heartbeat_ms * WORKER_GONE_HEARTBEATS + WORKER_GONE_MARGIN_MS


@dataclass(frozen=True, slots=True)
class WorkerRegistration:
    """What a runner writes of itself to ``watchdog_workers`` (cut to the
    columns' bounds, so registering never fails on a long host name)."""

    worker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    wakeups: str
    version: str
    heartbeat_ms: int

    def params(self, running: int) -> dict[str, Any]:
        from .model import HOST_MAX_LENGTH, VERSION_MAX_LENGTH, WAKEUPS_MAX_LENGTH, WORKER_QUEUES_MAX_LENGTH

        queues = list(self.queues)
        encoded = json.dumps(queues, ensure_ascii=False)
        while len(encoded) > WORKER_QUEUES_MAX_LENGTH and queues:  # thousands of long names: keep what fits
            queues.pop()
            encoded = json.dumps(queues, ensure_ascii=False)
        return {
            "worker_id": self.worker_id,
            "host": self.host[:HOST_MAX_LENGTH] or "?",
            "pid": max(0, self.pid),
            "queues": encoded,
            "concurrency": max(1, self.concurrency),
            "wakeups": self.wakeups[:WAKEUPS_MAX_LENGTH] or "?",
            "version": self.version[:VERSION_MAX_LENGTH] or "?",
            "heartbeat_ms": max(1, self.heartbeat_ms),
            "running": max(0, running),
        }


def register_worker(conn: Connection, registration: WorkerRegistration, running: int = 0) -> None:
    """Register the worker, or refresh its ``last_seen`` and ``running`` (one
    statement, database clock; a row pruned meanwhile comes back)."""
    conn.execute(sql.register_worker(conn.dialect.name), registration.params(running))


def deregister_worker(conn: Connection, worker_id: str) -> None:
    """Remove the worker's row (a clean shutdown)."""
    conn.execute(sql.deregister_worker(), {"worker_id": worker_id})


def _queues_of(encoded: str) -> tuple[str, ...]:
    try:
        value = json.loads(encoded)
    except ValueError:  # written by hand: shown as it is
        return (encoded,)
    return tuple(str(queue) for queue in value) if isinstance(value, list) else (encoded,)


def workers(conn: Connection) -> list[WorkerView]:
    """Every registered worker, oldest first; gone ones say so."""
    result = []
    for row in conn.execute(sql.list_workers()).mappings():
        heartbeat_ms = row["heartbeat_ms"]
        result.append(
            WorkerView(
                worker_id=row["worker_id"],
                host=row["host"],
                pid=row["pid"],
                queues=_queues_of(row["queues"]),
                concurrency=row["concurrency"],
                wakeups=row["wakeups"],
                version=row["version"],
                heartbeat=timedelta(milliseconds=heartbeat_ms),
                started_at=at_epoch_ms(row["started_at"]),
                last_seen=at_epoch_ms(row["last_seen"]),
                running=row["running"],
                silent_for=timedelta(milliseconds=max(0, row["now"] - row["last_seen"])),
                gone_after=timedelta(milliseconds=_gone_after_ms(heartbeat_ms)),
            )
        )
    return result


def live_workers_per_queue(conn: Connection) -> dict[str, int]:
    """How many live (not gone) workers serve each queue."""
    counts: dict[str, int] = {}
    for (encoded,) in conn.execute(sql.live_worker_queues(WORKER_GONE_HEARTBEATS, WORKER_GONE_MARGIN_MS)):
        for queue in set(_queues_of(encoded)):
            counts[queue] = counts.get(queue, 0) + 1
    return counts


def prune_workers(conn: Connection, limit: int = WORKER_PRUNE_BATCH) -> int:
    """Delete at most ``limit`` workers gone for over an hour and ``limit``
    recorded schedules not seen for a week; returns how many rows. Never
    touches a job."""
    workers_deleted = conn.execute(
        sql.prune_workers(WORKER_GONE_HEARTBEATS, WORKER_GONE_MARGIN_MS),
        {"keep_ms": WORKER_KEEP_GONE_MS, "limit": limit},
    ).rowcount
    schedules_deleted = conn.execute(sql.prune_schedules(), {"keep_ms": SCHEDULE_KEEP_MS, "limit": limit}).rowcount
    return int(workers_deleted or 0) + int(schedules_deleted or 0)


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """What a runner records of a schedule it serves."""

    name: str
    fingerprint: str
    cron: str
    timezone: str
    queue: str
    next_slot_ms: int | None
    last_enqueued_ms: int | None


def record_schedules(conn: Connection, records: Sequence[ScheduleRecord], recorded_by: str) -> None:
    """Record the schedules a runner serves (one row per name and definition)."""
    if not records:
        return
    conn.execute(
        sql.record_schedule(conn.dialect.name),
        [
            {
                "name": record.name,
                "fingerprint": record.fingerprint,
                "cron": record.cron,
                "timezone": record.timezone,
                "queue": record.queue,
                "next_slot": record.next_slot_ms,
                "last_enqueued": record.last_enqueued_ms,
                "recorded_by": recorded_by,
            }
            for record in records
        ],
    )


def schedules(conn: Connection) -> list[ScheduleView]:
    """Every recorded schedule by name, its most recently seen definition first."""
    rows = list(conn.execute(sql.list_schedules()).mappings())
    current = {
        (row["name"], row["fingerprint"]) for row in rows if row["now"] - row["last_seen"] <= SCHEDULE_CURRENT_MS
    }
    definitions: dict[str, int] = {}
    for name, _ in current:
        definitions[name] = definitions.get(name, 0) + 1
    return [
        ScheduleView(
            name=row["name"],
            fingerprint=row["fingerprint"],
            cron=row["cron"],
            timezone=row["timezone"],
            queue=row["queue_name"],
            next_slot=None if row["next_slot"] is None else at_epoch_ms(row["next_slot"]),
            last_enqueued=None if row["last_enqueued"] is None else at_epoch_ms(row["last_enqueued"]),
            recorded_by=row["recorded_by"],
            last_seen=at_epoch_ms(row["last_seen"]),
            current=(row["name"], row["fingerprint"]) in current,
            disputed=(row["name"], row["fingerprint"]) in current and definitions[row["name"]] > 1,
        )
        for row in rows
    ]


def pause(conn: Connection, queue: str, reason: str | None = None) -> PauseStatus:
    """Pause ``queue``: from the commit on no claim takes its jobs."""
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    if reason is not None:
        check_text("reason", reason, PAUSE_REASON_MAX_LENGTH)
    row = conn.execute(sql.pause(conn.dialect.name), {"queue": queue, "reason": reason}).first()
    return PauseStatus.PAUSED if row is not None else PauseStatus.ALREADY_PAUSED


def resume(conn: Connection, queue: str) -> PauseStatus:
    """Resume ``queue``; idle runners are woken (NOTIFY on PostgreSQL)."""
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    if conn.execute(sql.resume(), {"queue": queue}).first() is None:
        return PauseStatus.NOT_PAUSED
    notify(conn, EVENT_QUEUED)
    return PauseStatus.RESUMED


def read_with_reruns(conn: Connection, job_id: str) -> JobView | None:
    """:func:`read`, with the job's reruns listed."""
    job = read(conn, job_id)
    if job is None:
        return None
    reruns = tuple(conn.execute(sql.reruns_of(), {"job": job_id}).scalars())
    return dataclasses.replace(job, reruns=reruns) if reruns else job


def read_with_pause(conn: Connection, job_id: str) -> tuple[JobView, QueuePause | None] | None:
    """:func:`read_with_reruns`, and its queue's pause if it is paused (one read transaction)."""
    job = read_with_reruns(conn, job_id)
    if job is None:
        return None
    for queue, reason, paused_at in conn.execute(sql.paused_queues()):
        if queue == job.queue:
            return job, QueuePause(queue, reason, at_epoch_ms(paused_at))
    return job, None


#: The longest ``rerun_id`` accepted.
RERUN_ID_MAX_LENGTH = 128


def rerun(conn: Connection, job_id: str, rerun_id: str) -> EnqueueResult:
    """Enqueue a copy of settled job ``job_id`` as a new job (see
    :func:`~sqlalchemy_watchdog.jobs.rerun_job_id`); the same call again is
    a duplicate."""
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    check_text("rerun_id", rerun_id, RERUN_ID_MAX_LENGTH)
    original = read(conn, job_id)
    if original is None:
        raise InvalidJob("job_id", f"no job {job_id!r} to rerun")
    if original.state is not JobState.SETTLED:
        raise InvalidJob("job_id", f"job {job_id!r} is {original.state.value}; only a settled job can be rerun")
    return enqueue(conn, [_rerun_copy(original, rerun_id)])[0]


# -- bulk actions --------------------------------------------------------------


class BulkKind(str, enum.Enum):
    RERUN = "rerun"
    CANCEL = "cancel"


_MS_MIN, _MS_MAX = -(2**63), 2**63 - 1


def _time_bound(field: str, value: object) -> int:
    """An aware datetime bound as epoch milliseconds, or a clear error."""
    ms = epoch_ms(check_aware(field, value))
    if not _MS_MIN <= ms <= _MS_MAX:  # pragma: no cover - datetime cannot reach it
        raise InvalidJob(field, f"is out of range: {value!r}")
    return ms


@dataclass(frozen=True, slots=True)
class BulkAction:
    """A checked :meth:`Watchdog.rerun_many` / ``cancel_many`` request: which
    jobs (``params`` of :func:`statements.bulk_pick`), what to do to them,
    in batches of ``batch``, at most ``limit`` of them."""

    kind: BulkKind
    #: The ``rerun_id`` or the bulk ``cancellation_id``.
    action_id: str
    filters: tuple[str, ...]
    params: Mapping[str, Any]
    batch: int
    limit: int | None
    dry_run: bool
    only_if_queued: bool = False

    @classmethod
    def of(
        cls,
        kind: BulkKind,
        action_id: object,
        *,
        queue: object = None,
        lane: object = None,
        outcome: object = None,
        settled_after: object = None,
        settled_before: object = None,
        enqueued_after: object = None,
        enqueued_before: object = None,
        batch: object = 100,
        limit: object = None,
        dry_run: object = False,
        only_if_queued: object = False,
    ) -> BulkAction:
        """Check every argument before anything is read or written: a bad one
        raises :class:`InvalidJob` naming it."""
        if kind is BulkKind.RERUN:
            action = check_text("rerun_id", action_id, RERUN_ID_MAX_LENGTH)
        else:
            action = check_text("cancellation_id", action_id, CANCELLATION_ID_MAX_LENGTH)
            for field, value in (("outcome", outcome), ("settled_after", settled_after)):
                if value is not None:
                    raise InvalidJob(field, "cancel_many selects live jobs, which have not settled: no outcome or time")
            if settled_before is not None:
                raise InvalidJob("settled_before", "cancel_many selects live jobs, which have not settled")
        params: dict[str, Any] = {}
        if queue is not None:
            params["queue"] = check_text("queue", queue, QUEUE_MAX_LENGTH)
        if lane is not None:
            params["lane"] = check_text("lane", lane, LANE_MAX_LENGTH)
        if outcome is not None:
            params["outcomes"] = check_outcomes(outcome)
        times = {
            "settled_after": settled_after,
            "settled_before": settled_before,
            "enqueued_after": enqueued_after,
            "enqueued_before": enqueued_before,
        }
        for field, value in times.items():
            if value is not None:
                params[field] = _time_bound(field, value)
        for what in ("settled", "enqueued"):
            after, before = params.get(f"{what}_after"), params.get(f"{what}_before")
            if after is not None and before is not None and after >= before:
                raise InvalidJob(f"{what}_before", f"must be later than {what}_after (the range is empty)")
        if not params:
            raise InvalidJob(
                "filter",
                "a bulk action needs at least one of queue, lane, outcome or a time range (it never selects every job)",
            )
        size = check_int("batch", batch, 1, BULK_BATCH_MAX)
        total = None if limit is None else check_int("limit", limit, 1, 2**63 - 1)
        for field, flag in (("dry_run", dry_run), ("only_if_queued", only_if_queued)):
            if not isinstance(flag, bool):
                raise InvalidJob(field, f"must be a bool, not {type(flag).__name__}")
        filters = tuple(name for name in sql.BULK_FILTERS if name in params)
        return cls(kind, action, filters, params, size, total, bool(dry_run), bool(only_if_queued))

    def next_size(self, matched: int) -> int:
        """The size of the next batch after ``matched`` jobs (0: done)."""
        return self.batch if self.limit is None else min(self.batch, self.limit - matched)


@dataclass(frozen=True, slots=True)
class BulkStep:
    """What one batch did: the last sequence it read (None: nothing left)."""

    last_sequence: int | None
    #: Rows the batch read (its own copies included); fewer than asked: the last batch.
    picked: int
    matched: int
    done: tuple[str, ...] = ()
    repeated: tuple[str, ...] = ()
    skipped: tuple[BulkSkip, ...] = ()


class BulkProgress:
    """The running total of a bulk action's batches (the client's loop)."""

    def __init__(self, action: BulkAction) -> None:
        self.action = action
        self.after = 0
        self.matched = 0
        self.batches = 0
        self.done: list[str] = []
        self.repeated: list[str] = []
        self.skipped: list[BulkSkip] = []

    def add(self, step: BulkStep, size: int) -> bool:
        """Fold in one batch of ``size``; whether another may follow."""
        self.batches += 1
        self.matched += step.matched
        self.done += step.done
        self.repeated += step.repeated
        self.skipped += step.skipped
        if step.last_sequence is None or step.picked < size:
            return False
        self.after = step.last_sequence
        return True

    def result(self) -> BulkResult:
        return BulkResult(
            self.matched,
            tuple(self.done),
            tuple(self.repeated),
            tuple(self.skipped),
            self.batches,
            self.action.dry_run,
        )


def newest_sequence(conn: Connection) -> int:
    """The greatest sequence there is (0: no job): where a bulk action stops,
    so the jobs it creates are never selected by itself."""
    return int(conn.execute(sql.newest_sequence()).scalar() or 0)


def bulk_batch(conn: Connection, action: BulkAction, after: int, end: int, size: int) -> BulkStep:
    """One batch of a bulk action, in one transaction: the next ``size``
    selected jobs with ``after < sequence <= end``, acted on (or, dry run,
    counted)."""
    params = {**action.params, "after_sequence": after, "before_sequence": end + 1, "limit": size}
    rows = conn.execute(sql.bulk_pick(conn.dialect.name, action.kind.value, action.filters), params).all()
    if not rows:
        return BulkStep(None, 0, 0)
    last = rows[-1][0]
    if action.kind is BulkKind.CANCEL:
        return _cancel_batch(conn, action, [row[1] for row in rows], last)
    return _rerun_batch(conn, action, [view(row) for row in rows], last)


def _rerun_copy(original: JobView, rerun_id: str) -> Job:
    """The copy :func:`rerun` enqueues; InvalidJob when the original cannot be copied."""
    for unknown in original.undecodable:
        if unknown.field in ("payload", "retry", "timeout"):  # what the copy would carry
            raise InvalidJob(
                "job_id", f"job {original.job_id!r} cannot be rerun: its stored {unknown.column} is undecodable"
            )
    return Job(
        rerun_job_id(original.job_id, rerun_id),
        original.queue,
        lane=original.lane,
        priority=original.priority,
        payload=original.payload,
        max_recoveries=original.max_recoveries,
        retry=original.retry,
        timeout=original.timeout,
        rerun_of=original.job_id,
    )


def _rerun_batch(conn: Connection, action: BulkAction, originals: list[JobView], last: int) -> BulkStep:
    copies: list[Job] = []
    skipped: list[BulkSkip] = []
    for original in originals:
        if original.rerun_of is not None and original.job_id == rerun_job_id(original.rerun_of, action.action_id):
            continue  # a copy this very rerun_id made: never copied again
        try:
            copies.append(_rerun_copy(original, action.action_id))
        except InvalidJob as error:
            skipped.append(BulkSkip(original.job_id, str(error).split(": ", 1)[1]))
    matched = len(copies) + len(skipped)
    if action.dry_run or not copies:
        return BulkStep(last, len(originals), matched, skipped=tuple(skipped))
    # A job_id taken by a job with other contents: skipped, never a failed batch.
    stored = {
        row.job_id: row._asdict()
        for row in conn.execute(sql.stored_contents(), {"job_ids": [copy.job_id for copy in copies]})
    }
    fresh: list[Job] = []
    repeated: list[str] = []
    for copy in copies:
        row = stored.get(copy.job_id)
        if row is None:
            fresh.append(copy)
        elif row == _row(copy):
            repeated.append(copy.job_id)
        else:
            skipped.append(BulkSkip(copy.rerun_of or "", f"its rerun's job_id {copy.job_id!r} is another job's"))
    done: list[str] = []
    if fresh:
        for result in enqueue(conn, fresh):
            (done if result.status is EnqueueStatus.QUEUED else repeated).append(result.job_id)
    return BulkStep(last, len(originals), matched, tuple(done), tuple(repeated), tuple(skipped))


def _cancel_batch(conn: Connection, action: BulkAction, job_ids: list[str], last: int) -> BulkStep:
    if action.dry_run:
        return BulkStep(last, len(job_ids), len(job_ids))
    done: list[str] = []
    repeated: list[str] = []
    skipped: list[BulkSkip] = []
    for job_id in job_ids:
        cancellation_id = bulk_cancellation_id(action.action_id, job_id)
        result = cancel(conn, job_id, cancellation_id, only_if_queued=action.only_if_queued)
        if result.status is CancelStatus.RECORDED:
            done.append(job_id)
        elif result.status is CancelStatus.REPLAYED:
            repeated.append(job_id)
        elif result.status is CancelStatus.MISSING:
            skipped.append(BulkSkip(job_id, "deleted meanwhile (purged)"))
        else:
            skipped.append(
                BulkSkip(
                    job_id,
                    "settled meanwhile, "
                    + ("running, " if action.only_if_queued else "")
                    + "or already cancelled by another request",
                )
            )
    if done:
        notify(conn, EVENT_STOP)
    return BulkStep(last, len(job_ids), len(job_ids), tuple(done), tuple(repeated), tuple(skipped))


# -- testing only ------------------------------------------------------------


def make_due(conn: Connection, queues: Iterable[str] | None = None) -> int:
    """FOR TESTS ONLY: make every delayed job whose time has not come (of
    ``queues``; None: of every queue) due now, by the database clock -- a
    future ``run_at``, an enqueue's ``delay``, a retry's backoff, a snooze.
    They stay ``delayed`` until the next promotion (any runner's tick) makes
    them ``queued``. Returns how many jobs were changed.

    It rewrites the jobs' ``ready_at``, so it has no place in production:
    :func:`sqlalchemy_watchdog.testing.drain` (``advance_time=True``) runs it
    to play a test's delayed jobs without waiting.
    """
    if queues is None:
        return len(conn.execute(sql.make_due(False)).all())
    if isinstance(queues, str):
        raise InvalidJob("queues", "must be an iterable of queue names, not one string")
    names = [check_text("queue", queue, QUEUE_MAX_LENGTH) for queue in queues]
    if not names:
        return 0
    return len(conn.execute(sql.make_due(True), {"queues": names}).all())


def waiting_jobs(conn: Connection, queues: Sequence[str], limit: int = 10) -> list[tuple[str, str]]:
    """FOR TESTS ONLY: up to ``limit`` jobs of ``queues`` still waiting to
    run (delayed, or queued in a queue not paused), as (job_id, state)."""
    if not queues:
        return []
    rows = conn.execute(sql.waiting_jobs(), {"queues": list(queues), "limit": limit})
    return [(job_id, state) for job_id, state in rows]


# -- transactions ------------------------------------------------------------


#: Store functions that only read. In WAL mode they never take SQLite's write
#: lock, whatever ``write`` their caller passed: a WAL reader does not wait for
#: the writer, so a polling runner does not queue for the lock behind the
#: application's writes only to look.
READ_ONLY: frozenset[Callable[..., Any]] = frozenset(
    {
        read,
        read_claim,
        read_queue_head,
        read_settled,
        has_pending_work,
        expired_claims,
        seconds_until_next_expiry,
        next_ready_in,
        list_jobs,
        stats,
        read_with_reruns,
        waiting_jobs,
    }
)


#: Store functions that need a transaction of their own even where the
#: runner's operations run in autocommit: their statements hold a
#: transaction-scoped lock across several statements.
NEEDS_TRANSACTION: frozenset[Callable[..., Any]] = frozenset({prune_retention, bulk_batch})


def _prepares_per_statement(conn: Connection) -> bool:
    """Whether ``conn`` is asyncpg with its prepared-statement cache off --
    the setting for a pooler in transaction mode. asyncpg prepares every
    statement and executes it in a second round trip; outside a transaction
    the pooler may send the two to different server sessions, so there the
    store's operations keep their BEGIN/COMMIT."""
    if conn.dialect.driver != "asyncpg":
        return False
    dbapi_connection = conn.connection.dbapi_connection
    return getattr(dbapi_connection, "_prepared_statement_cache", True) is None


def reads_beside_writer(conn: Connection) -> bool:
    """Whether ``conn`` is SQLite in WAL mode, where reads never block the writer.

    With a rollback journal they do: a committing writer must wait (sleeping
    in the busy handler) until every reader's shared lock is gone, so there
    the store's reads keep taking the write lock, which serialises them with
    the writers instead. The journal mode is read once per pooled connection.
    """
    if conn.dialect.name != "sqlite":
        return False
    info = conn.connection.info
    mode = info.get("watchdog_journal_mode")
    if mode is None:
        mode = info["watchdog_journal_mode"] = str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()
    return bool(mode == "wal")


def begin_write(conn: Connection) -> None:
    """On SQLite, take the write lock at the start of the transaction.

    A deferred transaction that reads first and writes later cannot wait for
    the lock (SQLite returns "database is locked" at once, or
    ``SQLITE_BUSY_SNAPSHOT`` in WAL mode); ``BEGIN IMMEDIATE`` waits for it
    under the driver's busy timeout instead (pysqlite's ``timeout``, 5 s by
    default), in line with the application's own writers.
    """
    if conn.dialect.name != "sqlite":
        return
    dbapi = conn.connection.dbapi_connection
    if getattr(dbapi, "in_transaction", False):
        return
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _in_transaction(conn: Connection) -> bool:
    """Whether the DBAPI connection already runs a transaction of its own."""
    return bool(getattr(conn.connection.dbapi_connection, "in_transaction", False))


def _nothing_to_claim(conn: Connection, kwargs: Mapping[str, Any]) -> bool:
    """In WAL mode, whether a claim would find no queued job, read without the
    write lock (a claim that finds nothing must not queue for the lock)."""
    if _in_transaction(conn):
        # Already in a transaction (e.g. an explicit BEGIN from a "begin"
        # event): a read before the first write would make it a
        # read-then-write transaction. Claim directly.
        return False
    queues = kwargs.get("queues")
    params = {} if queues is None else {"queues": list(queues)}
    return conn.execute(sql.any_queued(queues is not None), params).first() is None


@dataclass(frozen=True)
class TxMode:
    """How :func:`transact_as` runs its function.

    ``write``: on SQLite, take the write lock first (:func:`begin_write`).
    ``autocommit``: run without BEGIN/COMMIT, for work whose one writing
    statement is atomic by itself (two round trips fewer).

    A value passed positionally, so that these options never collide with
    the keyword arguments of the store function being run.
    """

    write: bool = True
    autocommit: bool = False


#: A write transaction with BEGIN/COMMIT: what :func:`transact` runs.
WRITE = TxMode()
#: A reading transaction (no write lock taken up front on SQLite).
READ = TxMode(write=False)


def transact(conn: Connection, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn(conn, *args, **kwargs)`` in a write transaction of its own on
    ``conn`` (:func:`transact_as` with :data:`WRITE`)."""
    return transact_as(conn, WRITE, fn, *args, **kwargs)


def transact_as(
    conn: Connection,
    mode: TxMode,
    fn: Callable[Concatenate[Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run ``fn(conn, *args, **kwargs)`` in a transaction of its own on ``conn``
    (:func:`_transact_as`); on SQLite, text that is not UTF-8 reads as
    :class:`UnreadableText` meanwhile (:func:`tolerant_text`) instead of
    failing the whole statement: one row a producer wrote never stops the others."""
    with tolerant_text(conn):
        return _transact_as(conn, mode, fn, *args, **kwargs)


def _transact_as(
    conn: Connection,
    mode: TxMode,
    fn: Callable[Concatenate[Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run ``fn(conn, *args, **kwargs)`` in a transaction of its own on ``conn``.

    ``mode.autocommit`` runs it without BEGIN/COMMIT, for work whose one
    writing statement is atomic by itself: two round trips fewer. On SQLite a
    ``mode.write`` transaction takes the write lock first (:func:`begin_write`);
    in WAL mode (:func:`reads_beside_writer`) the functions of
    :data:`READ_ONLY` do not, and a :func:`claim` first looks, without the
    lock, whether any job is queued at all.
    """
    if mode.autocommit and fn not in NEEDS_TRANSACTION and not _prepares_per_statement(conn):
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        return fn(conn, *args, **kwargs)
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        conn = conn.execution_options(isolation_level=conn.default_isolation_level)
    with conn.begin():
        lock_free_reads = reads_beside_writer(conn)
        if fn is claim and lock_free_reads and _nothing_to_claim(conn, kwargs):
            # fn is claim, so T is ClaimBatch; mypy cannot narrow a TypeVar by identity.
            return cast(T, ClaimBatch((), ()))
        if fn is promote and lock_free_reads and not _in_transaction(conn):
            # Look first, without the write lock: usually nothing is due.
            due = next_ready_in(conn)
            if due is None or due > 0:
                return cast(T, Promotion(0, due))
        if mode.write and not (lock_free_reads and fn in READ_ONLY):
            begin_write(conn)
        return fn(conn, *args, **kwargs)


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A connection in a new write transaction, committed on success."""
    with engine.connect() as conn:
        with conn.begin():
            begin_write(conn)
            yield conn


def is_transient(error: BaseException) -> bool:
    """Whether retrying the whole transaction may succeed: a lost or refused
    connection (a bare ``OSError`` too: asyncpg's connect raises it as it
    is), a server going away or no longer writable (see
    :func:`~sqlalchemy_watchdog.connections.follow_failover`), contention."""
    if isinstance(error, OSError):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, OperationalError):
        if type(error.orig).__module__.startswith(("sqlite3", "aiosqlite")):
            # "no such table" is an OperationalError too; only contention passes.
            message = str(error.orig).lower()
            return "locked" in message or "busy" in message
        return True
    orig = getattr(error, "orig", None)
    sqlstate = getattr(orig, "sqlstate", None)
    # serialization_failure, deadlock_detected
    return sqlstate in ("40001", "40P01")


class Backoff:
    """Jittered exponential backoff over a bounded number of attempts.

    ``delay_after(error, what)`` returns how long to sleep before the next
    attempt, or raises ``WatchdogError(store_unavailable)`` when the error
    is not transient or the attempts are spent. Shared by the sync and the
    asyncio paths, which differ only in how they sleep.
    """

    def __init__(self, attempts: int = 8, base_delay: float = 0.02, max_delay: float = 1.0) -> None:
        self.attempts = attempts
        self.attempt = 0
        self.delay = base_delay
        self.max_delay = max_delay

    def delay_after(self, error: DBAPIError | OSError, what: str) -> float:
        self.attempt += 1
        refused = prepared_statement_failure(error)
        if refused is not None:
            raise refused from None
        if not is_transient(error) or self.attempt >= self.attempts:
            raise WatchdogError(ErrorCode.STORE_UNAVAILABLE, f"{what} failed: {redacted(error)}") from None
        log.debug("%s: transient failure (attempt %d): %s", what, self.attempt, redacted(error))
        delay = self.delay * (0.5 + random.random())
        self.delay = min(self.max_delay, self.delay * 2)
        return delay


def transient_failure(error: WatchdogError) -> bool:
    """Whether a store operation failed because the database was unreachable
    or contended (retried until the attempts ran out), rather than refusing
    the statement itself."""
    cause = error.__cause__ or error.__context__
    return isinstance(cause, BaseException) and is_transient(cause)


def retrying(work: Callable[[], T], *, what: str = "store operation", attempts: int = 8) -> T:
    """Run ``work`` (a whole transaction), retrying transient failures.

    "database is locked", a dropped connection, a serialization failure: each
    is retried with jittered backoff; after ``attempts`` the last one is
    raised as ``WatchdogError(store_unavailable)``.
    """
    backoff = Backoff(attempts)
    while True:
        try:
            return work()
        except DBAPIError as error:
            time.sleep(backoff.delay_after(error, what))


# -- the dashboard's chart --------------------------------------------------------


def throughput(conn: Connection) -> Throughput:
    """Jobs settled in each minute of the last hour (database clock), by
    queue and outcome: O(jobs settled in the last hour), like :func:`stats`."""
    clock = conn.execute(sql.stats_clock()).scalar_one()
    since = clock - THROUGHPUT_MINUTES * 60_000
    counts: dict[str, dict[Outcome, list[int]]] = {}
    for queue, outcome, minute, count in conn.execute(sql.settled_per_minute(), {"since": since}):
        # A job settled after the clock was read lands in the last minute.
        index = min(max(int(minute), 0), THROUGHPUT_MINUTES - 1)
        per_outcome = counts.setdefault(queue, {})
        per_outcome.setdefault(Outcome(outcome), [0] * THROUGHPUT_MINUTES)[index] += int(count)
    return Throughput(
        at_epoch_ms(clock),
        {
            queue: {outcome: tuple(per_outcome[outcome]) for outcome in Outcome if outcome in per_outcome}
            for queue, per_outcome in sorted(counts.items())
        },
    )
