"""Enqueue: admitting jobs, conflicts, integrity violations.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from .. import telemetry
from ..backends import backend_of, backend_of_error
from ..columns import JOB_COLUMNS
from ..connections import prepared_statement_failure
from ..errors import EnqueueConflict, InvalidJob
from ..jobs import (
    EnqueueResult,
    EnqueueStatus,
    Job,
    check_duration,
    duration_ms,
    frozen_builder,
)
from ..jobs.uniqueness import UniqueKind
from . import dependencies_sql, enqueue_sql, sql
from .base import (
    ENQUEUE_CHUNK,
    _one_chunk,
    job_chars,
    sized_chunks,
)
from .dependencies import count_settled_parents
from .operation import Shape, operation
from .unique import Decision, admit
from .views import execute_rows

log = logging.getLogger("sqlalchemy_watchdog.store")


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


@operation(Shape.WRITE, autocommit_if=_one_chunk)
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
            raise EnqueueConflict(job.job_id, "after" if _row(seen) == _row(job) else None)
    unique = list(firsts.values())
    if any(job.unique is not None for job in unique):
        return _enqueue_keyed(conn, jobs, unique, delay_ms)
    waits = _dependencies(conn, unique) if any(job.after for job in unique) else None
    try:
        return _enqueue_traced(conn, jobs, unique, delay_ms, waits)
    except DBAPIError as error:
        refused = prepared_statement_failure(error)
        if refused is None:
            raise
        raise refused from error


def _enqueue_traced(
    conn: Connection, jobs: Sequence[Job], unique: list[Job], delay_ms: int | None, waits: Waits | None = None
) -> list[EnqueueResult]:
    instrumentation = telemetry.active()
    if instrumentation is None:
        return _enqueue(conn, jobs, unique, delay_ms, None, waits)
    trace = telemetry.EnqueueTrace()
    trace_context = None
    with telemetry.guarded("enqueue"):
        trace = instrumentation.enqueue(unique)
        trace_context = telemetry.storable_trace_context(trace.trace_context)
    try:
        results = _enqueue(conn, jobs, unique, delay_ms, trace_context, waits)
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
    conn: Connection,
    jobs: Sequence[Job],
    unique: Sequence[Job],
    delay_ms: int | None,
    trace_context: str | None,
    waits: Waits | None = None,
) -> list[EnqueueResult]:
    admitted: set[str] = set()
    backend = backend_of(conn)
    # One job (the common call) is its own statement form: short to plan
    # where statements are not prepared (see sql._bound_row).
    stmt = enqueue_sql.enqueue_rows(backend, one=len(unique) == 1) if backend.writes_return_rows else None
    plain = delay_ms is None and trace_context is None and waits is None
    # Chunks of at most ENQUEUE_CHUNK jobs and STATEMENT_CHARS_MAX characters:
    # a statement MariaDB's max_allowed_packet takes (one chunk, the common
    # call, is all _one_chunk lets run without a transaction).
    chunks = [unique] if len(unique) == 1 else sized_chunks(unique, job_chars, ENQUEUE_CHUNK)
    for chunk in chunks:
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
            and job.key is None
            else (*_values(job), delay_ms, trace_context, *_waiting(job, waits))
            for job in chunk
        ]
        if stmt is None:  # no ON CONFLICT: a locking read, then an INSERT of the new jobs
            admitted.update(_insert_new(conn, chunk, rows))
            continue
        if len(unique) == 1:
            params = sql.row_params("job", sql.ENQUEUE_FIELDS, rows[0])
        else:
            params = sql.rows_params(backend, "jobs", sql.ENQUEUE_FIELDS, rows)
        # One statement, no savepoint around it: one round trip in the
        # caller's transaction. A conflict's offender is named afterwards
        # (see _conflict_of).
        try:
            admitted.update(row[0] for row in execute_rows(conn, stmt, params))
        except IntegrityError as error:
            raise _conflict_of(conn, chunk, error) from error
    if waits is not None:
        _insert_edges(conn, unique, admitted, waits)
        _check_replayed_parents(conn, unique, admitted)
    if len(admitted) == len(jobs):  # the common case: every job new, none twice
        return [_queued(job.job_id) for job in jobs]
    results: list[EnqueueResult] = []
    first_seen: set[str] = set()
    for job in jobs:
        queued = job.job_id in admitted and job.job_id not in first_seen
        first_seen.add(job.job_id)
        results.append(EnqueueResult(job.job_id, EnqueueStatus.QUEUED if queued else EnqueueStatus.DUPLICATE))
    return results


#: How many times an enqueue without ``ON CONFLICT`` reads and inserts again
#: when a concurrent transaction stored one of its new job ids in between.
_INSERT_ATTEMPTS = 3


def _insert_new(conn: Connection, chunk: Sequence[Job], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Admit ``chunk`` (``rows``: its rows of :data:`sql.ENQUEUE_FIELDS`)
    where a write returns no rows (``Backend.writes_return_rows`` is False:
    MariaDB/MySQL), and return the job ids newly admitted.

    The stored rows of these job ids are read under a lock (``FOR
    UPDATE``): an identical one is a duplicate, another raises
    :class:`EnqueueConflict` naming the job before anything of the chunk is
    written; the others are inserted by one plain INSERT. A concurrent
    transaction that inserts one of them first makes the INSERT wait for it
    and then fail as a duplicate key (nothing of the statement is written):
    the read sees its row then, and the chunk is admitted again.
    """
    backend = backend_of(conn)
    ids = [job.job_id for job in chunk]
    for attempt in range(_INSERT_ATTEMPTS):
        stored = {
            row.job_id: row._asdict() for row in conn.execute(enqueue_sql.locked_contents(backend), {"job_ids": ids})
        }
        for job in chunk:
            found = stored.get(job.job_id)
            if found is not None and found != _row(job):
                raise EnqueueConflict(job.job_id)
        new = [row for job, row in zip(chunk, rows, strict=True) if job.job_id not in stored]
        if not new:
            return []
        if len(new) == 1:
            params = sql.row_params("job", sql.ENQUEUE_FIELDS, new[0])
        else:
            params = sql.rows_params(backend, "jobs", sql.ENQUEUE_FIELDS, new)
        try:
            conn.execute(enqueue_sql.insert_rows(backend, one=len(new) == 1), params)
        except IntegrityError as error:
            if violation(error) != ("unique", "job_id") or attempt == _INSERT_ATTEMPTS - 1:
                raise
            continue
        return [job.job_id for job in chunk if job.job_id not in stored]
    raise AssertionError("unreachable")  # pragma: no cover


_build_result = frozen_builder(EnqueueResult, ("job_id", "status", "unique_key"))


def _queued(job_id: str) -> EnqueueResult:
    """``EnqueueResult(job_id, QUEUED)`` without the frozen dataclass's
    per-field ``object.__setattr__`` (a batch enqueue makes one per job)."""
    return _build_result(job_id, EnqueueStatus.QUEUED, None)


def _enqueue_keyed(
    conn: Connection, jobs: Sequence[Job], unique: list[Job], delay_ms: int | None
) -> list[EnqueueResult]:
    """Enqueue a call in which some jobs have a ``unique_key``: one job at a
    time, in order, each keyed one after its key's decision
    (:func:`.unique.admit`), so a later job of the call sees what an earlier
    one did to a shared key."""
    keyed = {job.job_id for job in unique if job.unique is not None}
    for job in unique:
        if job.unique is not None and job.unique.kind is not UniqueKind.UNIQUE_FOR and delay_ms is not None:
            raise InvalidJob("delay", f"cannot be combined with {job.unique.kind.value} (job {job.job_id!r} has it)")
        for parent in job.after:
            if parent in keyed:
                raise InvalidJob(
                    "after",
                    f"job {job.job_id!r} waits for {parent!r}, which has a unique_key in the same call: it may be "
                    "a duplicate of another job; enqueue it first and name the job_id its enqueue returns",
                )
    by_id: dict[str, EnqueueResult] = {}
    for job in unique:
        if job.unique is None:
            by_id[job.job_id] = _enqueue_alone(conn, job, delay_ms)
            continue
        admission = admit(conn, job)
        if admission.decision is Decision.DUPLICATE:
            by_id[job.job_id] = EnqueueResult(admission.holder, EnqueueStatus.DUPLICATE, job.unique.key)
        elif admission.decision is Decision.REPLACED:
            by_id[job.job_id] = EnqueueResult(admission.holder, EnqueueStatus.REPLACED, job.unique.key)
        else:
            delay = admission.delay_ms if admission.delay_ms is not None else delay_ms
            by_id[job.job_id] = _enqueue_alone(conn, job, delay)
    results: list[EnqueueResult] = []
    seen: set[str] = set()
    for job in jobs:
        result = by_id[job.job_id]
        if job.job_id in seen:  # the same job twice in one call: the second is a duplicate
            result = EnqueueResult(result.job_id, EnqueueStatus.DUPLICATE, result.unique_key)
        seen.add(job.job_id)
        results.append(result)
    return results


def _enqueue_alone(conn: Connection, job: Job, delay_ms: int | None) -> EnqueueResult:
    """One job through the enqueue statement (its parents checked first)."""
    waits = _dependencies(conn, [job]) if job.after else None
    result = _enqueue_traced(conn, [job], [job], delay_ms, waits)[0]
    if result.status is EnqueueStatus.DUPLICATE or job.unique is None:
        return result
    return EnqueueResult(job.job_id, EnqueueStatus.QUEUED, job.unique.key)


@operation(Shape.WRITE)
def enqueue_each(conn: Connection, jobs: Sequence[Job]) -> list[EnqueueResult | None]:
    """Enqueue ``jobs`` one statement each; a conflicting replay is skipped
    (None) instead of failing the others -- for a runner enqueueing its
    schedules' slots, where another runner (or an older deploy with other
    contents) may have enqueued the same slot first."""
    results: list[EnqueueResult | None] = []
    for job in jobs:
        savepoint = backend_of(conn).aborts_on_error and not _autocommit(conn)
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


def _check_replayed_parents(conn: Connection, unique: Sequence[Job], admitted: set[str]) -> None:
    """Raise :class:`EnqueueConflict` naming ``after`` when a replayed job
    with parents names other parents than the stored one.

    The statement already compared everything else of the row, ``after_policy``
    included (so a replay with parents of a job stored without any, or the
    reverse, conflicted there); the parents are edges, read here for the
    replays only -- an enqueue of new jobs reads nothing more.
    """
    replays = {job.job_id: frozenset(job.after) for job in unique if job.after and job.job_id not in admitted}
    if not replays:
        return
    stored: dict[str, set[str]] = {job_id: set() for job_id in replays}
    names = sorted(replays)
    for start in range(0, len(names), 1000):
        for child, parent in conn.execute(
            dependencies_sql.parents_of_children(), {"job_ids": names[start : start + 1000]}
        ):
            stored[child].add(parent)
    for job_id in names:
        if stored[job_id] != replays[job_id]:
            raise EnqueueConflict(job_id, "after")


def _first_conflict(conn: Connection, chunk: Sequence[Job]) -> str | None:
    """The first job of ``chunk`` stored with other contents, if any."""
    stored = {
        row.job_id: row._asdict()
        for row in conn.execute(enqueue_sql.stored_contents(), {"job_ids": [job.job_id for job in chunk]})
    }
    for job in chunk:
        row = stored.get(job.job_id)
        if row is not None and row != _row(job):
            return job.job_id
    return None


def _same(a: Job, b: Job) -> bool:
    return _row(a) == _row(b) and set(a.after) == set(b.after)


def self_committing(dialect: str) -> bool:
    """Whether the store's operations run without BEGIN/COMMIT on ``dialect``.

    Every store operation but a multi-chunk enqueue is made of statements
    each correct on its own (one conditional write, plus reads), so on
    PostgreSQL they run in autocommit: one round trip instead of three.
    SQLite keeps ``BEGIN IMMEDIATE`` transactions (no round trips to save,
    and a reader that later writes must hold the lock from the start).
    """
    return backend_of(dialect).self_committing


#: The job in :data:`sql.IDENTITY_FIELDS` order: the attributes
#: :data:`~sqlalchemy_watchdog.columns.JOB_COLUMNS` names as each identity
#: column's source (one C call per job).
_values: Callable[[Job], tuple[Any, ...]] = operator.attrgetter(
    *(spec.identity.attribute for spec in JOB_COLUMNS if spec.identity is not None)
)


def _row(job: Job) -> dict[str, Any]:
    """The job's identity as the stored row's columns (:func:`enqueue_sql.stored_contents`):
    its :data:`sql.IDENTITY_FIELDS`, and ``after_policy`` (stored only
    for a job with parents)."""
    row = dict(zip((name for name, _ in sql.IDENTITY_FIELDS), _values(job), strict=True))
    row["after_policy"] = job.after_policy if job.after else None
    return row


def _conflict_of(conn: Connection, chunk: Sequence[Job], error: IntegrityError) -> Exception:
    """Name the job whose replay conflicted: only a NOT NULL failure on
    ``watchdog_jobs.job_id`` is ours (the conflicting replay sets it to
    NULL); any other integrity error is returned as it is, the database's."""
    if violation(error) != ("not_null", "job_id"):
        return error
    if len(chunk) == 1:
        return EnqueueConflict(chunk[0].job_id)
    if backend_of(conn).aborts_on_error and not _autocommit(conn):
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


#: The unique constraints of ``watchdog_jobs`` (named by the model's naming
#: convention and by the migration alike), by column.
_UNIQUE_COLUMNS = {
    f"uq_{sql.t.name}_job_id": "job_id",
    f"uq_{sql.t.name}_cancellation_id": "cancellation_id",
}


def violation(error: IntegrityError) -> tuple[str, str] | None:
    """``(kind, column)`` when ``error`` is a NOT NULL (``"not_null"``) or a
    one-column UNIQUE (``"unique"``) violation on ``watchdog_jobs``, else None.

    Read from the driver's diagnostics, never from the message text as a
    whole (which carries the failing row's values on PostgreSQL): psycopg's
    SQLSTATE, table, column and constraint names; SQLite's message, whose
    format SQLite fixes, matched in full.
    """
    return backend_of_error(error).violation(error, sql.t.name, _UNIQUE_COLUMNS)


# -- dependencies (revision w0012) -------------------------------------------------

#: Per job with parents: how many are not settled, and each edge's counted outcome.
Waits = dict[str, tuple[int, list[tuple[str, str | None]]]]


def _dependencies(conn: Connection, unique: Sequence[Job]) -> Waits:
    """Check every job's ``after`` before anything is written, and count
    what each waits for.

    A parent must be stored already or come earlier in this call: a cycle
    needs some job to name one enqueued after it, so this order alone makes
    every dependency graph acyclic (docs/design.md, "Dependencies"). A
    stored parent already settled counts as told; one that ended other than
    ``completed`` is refused for a job that needs it completed -- unless
    the job itself is stored already (a replay, judged by the enqueue
    statement). The stored parents are read ``FOR NO KEY UPDATE``
    (PostgreSQL): a settlement racing this enqueue waits for it to commit,
    and then counts the new edge.
    """
    position = {job.job_id: index for index, job in enumerate(unique)}
    names = sorted({parent for job in unique for parent in job.after})
    stored: dict[str, tuple[str, str | None]] = {}
    for start in range(0, len(names), 1000):
        rows = conn.execute(dependencies_sql.read_parents(), {"job_ids": names[start : start + 1000]})
        stored.update((row.job_id, (row.state, row.outcome)) for row in rows)
    waits: Waits = {}
    refused: list[tuple[Job, InvalidJob]] = []
    for index, job in enumerate(unique):
        if not job.after:
            continue
        try:
            waits[job.job_id] = _counted(job, index, stored, position)
        except InvalidJob as refusal:
            refused.append((job, refusal))
    if refused:
        # A replay of a stored job is judged by the enqueue statement (a
        # duplicate, or a conflict), not refused: its parents may have ended
        # or been pruned since it was first enqueued, and an identical replay
        # stays a no-op. Its edges exist already (a replay adds none).
        children = [job.job_id for job, _ in refused]
        replayed = {row.job_id for row in conn.execute(dependencies_sql.read_parents(), {"job_ids": children})}
        for job, why in refused:
            if job.job_id not in replayed:
                raise why
            waits[job.job_id] = (0, [])
    return waits


def _counted(
    job: Job, index: int, stored: dict[str, tuple[str, str | None]], position: dict[str, int]
) -> tuple[int, list[tuple[str, str | None]]]:
    """How many of ``job``'s parents it waits for, and its edges; or the
    clear refusal of a parent it cannot have."""
    pending = 0
    edges: list[tuple[str, str | None]] = []
    for parent in job.after:
        found = stored.get(parent)
        if found is not None and found[0] == "settled":
            outcome = found[1]
            if outcome != "completed" and job.after_policy == "completed":
                raise InvalidJob(
                    "after",
                    f"job {job.job_id!r} waits for {parent!r}, which already ended {outcome} "
                    "(after_policy='any_outcome' runs it anyway)",
                )
            edges.append((parent, outcome))
            continue
        if found is None:
            where = position.get(parent)
            if where is None:
                raise InvalidJob("after", f"job {job.job_id!r} waits for {parent!r}: no such job")
            if where > index:
                raise InvalidJob(
                    "after",
                    f"job {job.job_id!r} waits for {parent!r}, which comes later in this call: "
                    "a parent must be enqueued first",
                )
        pending += 1
        edges.append((parent, None))
    return pending, edges


def _waiting(job: Job, waits: Waits | None) -> tuple[int | None, str | None]:
    """The row's ``waiting_on`` and ``after_policy``."""
    if waits is None or not job.after:
        return None, None
    return waits[job.job_id][0] or None, job.after_policy


def _insert_edges(conn: Connection, unique: Sequence[Job], admitted: set[str], waits: Waits) -> None:
    """The edges of the jobs this enqueue admitted (a replay adds none)."""
    rows = [
        (job.job_id, parent, outcome)
        for job in unique
        if job.job_id in admitted and job.job_id in waits
        for parent, outcome in waits[job.job_id][1]
    ]
    backend = backend_of(conn)
    for start in range(0, len(rows), 5000):
        params = sql.rows_params(backend, "edges", dependencies_sql.EDGE_FIELDS, rows[start : start + 5000])
        conn.execute(dependencies_sql.insert_edges(backend), params)
    # Their live parents are watched from now on (revision w0013): only a
    # watched job's settlement runs the trigger that counts its edges, so a
    # job nobody depends on settles without it. Stored parents are locked
    # already (read_parents); parents of this call are this transaction's.
    parents = sorted({parent for _child, parent, outcome in rows if outcome is None})
    for start in range(0, len(parents), 1000):
        conn.execute(dependencies_sql.watch_parents(), {"job_ids": parents[start : start + 1000]})
    # A parent that settled after the check above read it (see
    # dependencies_sql.count_settled_parents) is counted now.
    children = sorted({child for child, _parent, outcome in rows if outcome is None})
    for start in range(0, len(children), 1000):
        count_settled_parents(conn, children[start : start + 1000])
