"""The client's operations, declared once for :class:`~sqlalchemy_watchdog.Watchdog`
and :class:`~sqlalchemy_watchdog.asyncio.AsyncWatchdog`.

Each operation is a generator function here: its name, parameters and
docstring are the public method's; its body is the operation's logic, which
never touches a connection -- it yields what it needs from the database
(:func:`look` or :func:`write` of a store function, whose transaction shape
the store declares with ``@store.operation(Shape.*)``, or one
:class:`WaitFor`), is sent the answer, and returns the method's result.

The facades are thin and typed: each method has its explicit signature and
returns ``self._perform(operations.<name>(...))`` (awaited in the async one),
where ``_perform`` drives the program with a
:class:`~sqlalchemy_watchdog.gateway.SyncGateway` or an
:class:`~sqlalchemy_watchdog.gateway.AsyncOperations`; :func:`declared_by`
gives each method the declaration's docstring. ``tests/unit/test_surface.py``
checks that every operation of :data:`OPERATIONS` is a method of both
facades with the declaration's parameters and docstring, and that neither
facade has a public name the other lacks (SQLAlchemy's ``ext/asyncio``
proxies are the model: one behaviour, two explicit surfaces).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from .. import store
from ..applies import JobExplanation
from ..applies import explain as explain_job
from ..backends import backend_of
from ..errors import InvalidJob
from ..jobs import (
    JOB_ID_MAX_LENGTH,
    BulkResult,
    CancelResult,
    CancelStatus,
    EnqueueResult,
    Job,
    JobResult,
    JobState,
    JobView,
    LaneFailure,
    Outcome,
    PauseStatus,
    QueueLimits,
    QueuePause,
    Rate,
    ReplaceResult,
    ScheduleView,
    Stats,
    Throughput,
    WorkerView,
    check_datetime,
    check_text,
    encode_payload,
    job_batch,
    result_of,
)
from ..jobs.durable import JobSignal, JobStep, SignalResult, check_step_name
from ..jobs.uniqueness import UniqueKeyHold
from ..results import check_wait
from ..wakeups import EVENT_STOP

if TYPE_CHECKING:
    from ..codecs import PayloadCodec

__all__ = [
    "KEEP",
    "OPERATIONS",
    "Call",
    "Keep",
    "Program",
    "Step",
    "WaitFor",
    "declared_by",
    "look",
    "write",
    # The client's own store operations (store/declaration.py: ClientStoreOperations).
    "cancel_in",
    "fail_lane_in",
]

T = TypeVar("T")
P = ParamSpec("P")
M = TypeVar("M", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """Run the store function ``fn(conn, *args, **kwargs)`` in a transaction
    of its own; the answer is its result. ``as_look``: as a look (the
    gateway's ``read``: never the write lock up front), else as its
    declaration says (``run``)."""

    fn: Callable[..., T]
    as_look: bool
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WaitFor:
    """Wait up to ``timeout_s`` for ``job_id`` to settle (each facade its
    own way: a listening thread, or an asyncio task); the answer is the
    :class:`JobResult` then."""

    job_id: str
    timeout_s: float
    poll_s: float
    codec: PayloadCodec | None


#: What an operation yields.
Step = Call[Any] | WaitFor
#: An operation in progress: yields steps, is sent their answers, returns the result.
Program = Generator[Step, Any, T]


def look(fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> Call[T]:
    """The step: ``fn`` as a look (no write lock taken up front)."""
    return Call(fn, True, args, kwargs)


def write(fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> Call[T]:
    """The step: ``fn`` as its ``@store.operation`` declaration says."""
    return Call(fn, False, args, kwargs)


def drive(program: Program[T], perform: Callable[[Step], Any]) -> T:
    """Run ``program`` to its result, answering each step with ``perform``
    (a failure is raised from the facade's method as it is)."""
    try:
        step = next(program)
        while True:
            step = program.send(perform(step))
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(program: Program[T], perform: Callable[[Step], Any]) -> T:
    """:func:`drive` with an async ``perform``."""
    try:
        step = next(program)
        while True:
            step = program.send(await perform(step))
    except StopIteration as done:
        result: T = done.value
        return result


def declared_by(declaration: Callable[..., Any]) -> Callable[[M], M]:
    """Mark a facade method as the surface of ``declaration`` (one of
    :data:`OPERATIONS`): it takes the declaration's docstring, written once
    here, and the parity test finds its declaration by this mark."""

    def mark(method: M) -> M:
        method.__doc__ = declaration.__doc__
        method.__watchdog_declaration__ = declaration  # type: ignore[attr-defined]
        return method

    return mark


# -- the operations -----------------------------------------------------------------


def enqueue(
    jobs: Job | Iterable[Job], *, delay: timedelta | None = None
) -> Program[EnqueueResult | list[EnqueueResult]]:
    """Enqueue in a transaction of its own (see :func:`enqueue`); on
    PostgreSQL up to 1,000 jobs go as one self-committing statement."""
    results: list[EnqueueResult] = yield write(store.enqueue, job_batch(jobs), delay=delay)
    return results[0] if isinstance(jobs, Job) else results


def read(job_id: str) -> Program[JobView | None]:
    """The job, or None if there is no such job (with its reruns listed)."""
    found: JobView | None = yield look(store.read_with_reruns, job_id)
    return found


def result(job_id: str, *, codec: PayloadCodec | None = None) -> Program[JobResult]:
    """The job's result now, or why there is none: a :class:`~sqlalchemy_watchdog.JobResult`
    whose ``status`` is ``completed`` (``value`` is the result, decoded
    by ``codec`` if given: use the runner's), ``failed`` (``reason``
    says why), ``cancelled``, ``pending``, ``running`` or ``unknown``
    (no such job: never enqueued, purged or pruned)."""
    found: JobView | None = yield look(store.read, job_id)
    return result_of(job_id, found, codec)


def wait(
    job_id: str,
    *,
    timeout: timedelta,
    codec: PayloadCodec | None = None,
    poll_interval: timedelta = timedelta(seconds=1),
) -> Program[JobResult]:
    """Wait up to ``timeout`` for the job to settle; its :meth:`result`
    then, ``unknown`` at once for no such job, or status ``timed_out``.

    On PostgreSQL (psycopg, psycopg2; the async client: psycopg and
    asyncpg) the wait listens for the job's settlement on a connection of
    its own and reads the job when told, else every ``poll_interval``; on
    SQLite, or where the connection is not one PostgreSQL session (a
    transaction-mode pooler), it reads the job every ``poll_interval``."""
    timeout_s, poll_s = check_wait(timeout, poll_interval)
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    settled: JobResult = yield WaitFor(job_id, timeout_s, poll_s, codec)
    return settled


def explain(job_id: str) -> Program[JobExplanation | None]:
    """What applies to the job (None if there is no such job): its
    effective timeout and retry policy and where each comes from (its
    own, else its queue's ``@handler`` registered in this process, else
    the runner's -- which a process other than the runner's cannot know,
    and says so), "attempt n of m", its queue's pause, and its reason in
    plain words (a :class:`~sqlalchemy_watchdog.JobExplanation`)."""
    found: tuple[JobView, QueuePause | None] | None = yield look(store.read_with_pause, job_id)
    if found is None:
        return None
    held: list[UniqueKeyHold] = yield look(store.keys_held_by, job_id)
    steps: list[JobStep] = yield look(store.read_steps, job_id)
    signals: list[JobSignal] = yield look(store.read_signals, job_id)
    job, pause = found
    return explain_job(job, pause, tuple(held), tuple(steps), tuple(signals))


def steps(job_id: str) -> Program[list[JobStep]]:
    """The durable steps the job's attempts finished (``job.step``,
    ``job.sleep``), in the order they were recorded: each step's name,
    kind, result as stored, the attempt that recorded it and when."""
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    found: list[JobStep] = yield look(store.read_steps, job_id)
    return found


def read_queue_head(queue: str) -> Program[JobView | None]:
    """The queue's running job, else its next queued job, else its next delayed one; None when idle."""
    found: JobView | None = yield look(store.read_queue_head, queue)
    return found


def read_settled(limit: int = 100, after_sequence: int = 0) -> Program[list[JobView]]:
    """Settled jobs in admission order, ``limit`` (1-256) after ``after_sequence``."""
    found: list[JobView] = yield look(store.read_settled, limit, after_sequence)
    return found


def has_pending_work() -> Program[bool]:
    """Whether any job is delayed, queued or running."""
    pending: bool = yield look(store.has_pending_work)
    return pending


def list_jobs(
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
) -> Program[list[JobView]]:
    """Jobs in admission order, ``limit`` (1-1000) with a sequence above
    ``after_sequence`` and below ``before_sequence`` (None: no bound),
    matching every filter given. Pass the last job's ``sequence`` as
    ``after_sequence`` to read the next page.

    ``newest_first=True`` reverses the order: the page is the newest
    ``limit`` jobs in the range, and the next (older) page is the one
    ``before_sequence`` the last job's ``sequence``. To page back towards
    the newest, read ``after_sequence`` the first job's ``sequence`` in
    admission order and reverse it.

    Cost: one read of the primary key in order from the bound, stopping
    after ``limit`` matches: O(limit) rows when the filters match most
    jobs; a filter that matches few jobs in a long history reads the
    rows between its matches (bound the range to page).
    ``with_payload=False`` does not read the payloads (each job's
    ``payload`` is then None): a list that does not show them.
    """
    found: list[JobView] = yield look(
        store.list_jobs,
        queue=queue,
        state=state,
        outcome=outcome,
        lane=lane,
        job_id_prefix=job_id_prefix,
        limit=limit,
        after_sequence=after_sequence,
        before_sequence=before_sequence,
        newest_first=newest_first,
        with_payload=with_payload,
    )
    return found


def stats() -> Program[Stats]:
    """How every queue is doing: counts by live state, jobs settled in the
    last minute and hour by outcome, the age of the oldest ready job,
    running jobs with expired leases, and pauses.

    Cost: index reads only -- a count of the live jobs with each queue's
    oldest ready time (``ix_watchdog_jobs_live_queue``), the expired leases
    (``ix_watchdog_jobs_lease``), and the jobs settled in the
    last hour, one range per outcome (``ix_watchdog_jobs_settled``):
    O(live jobs + jobs settled in the last hour), never the history.
    """
    found: Stats = yield look(store.stats)
    return found


def workers() -> Program[list[WorkerView]]:
    """Every registered runner, oldest first: a runner registers when it
    starts serving (``run_forever``), refreshes its row with every
    heartbeat (``last_seen`` by the database clock, jobs running now)
    and removes it when it shuts down cleanly. One that died or froze
    stops refreshing and shows as :attr:`~WorkerView.gone` once not
    seen for three of its heartbeats and 30 seconds; runners prune it an
    hour later. A restarted runner is a new worker.

    Cost: one read of ``watchdog_workers`` (one row per worker)."""
    found: list[WorkerView] = yield look(store.workers)
    return found


def schedules() -> Program[list[ScheduleView]]:
    """The schedules runners serve, as they recorded them: one view per
    name and definition, by name, the most recently seen first. Two
    deploys serving a name with different definitions leave two
    :attr:`~ScheduleView.current` views, each :attr:`~ScheduleView.disputed`.
    Runners record their schedules at least every minute; a record not
    seen for a week is forgotten."""
    found: list[ScheduleView] = yield look(store.schedules)
    return found


def prune(
    *,
    older_than: timedelta,
    outcomes: Iterable[Outcome | str] | None = None,
    limit: int | None = None,
    batch: int = 1000,
    include_undated: bool = False,
) -> Program[int]:
    """Delete settled jobs that settled more than ``older_than`` ago (by
    the database clock), oldest first, in batches of ``batch`` rows --
    each its own short transaction, so claims never wait long -- until
    none is left or ``limit`` were deleted. Returns how many.

    Queued, delayed and running jobs are never pruned. A pruned
    ``job_id`` is free again: enqueueing it creates a new job. Jobs
    settled before revision w0004 have no recorded time and are left
    alone unless ``include_undated``.
    """
    pruning = store.Pruning.of(older_than, outcomes, limit, batch, include_undated)
    total = 0
    while size := pruning.next_batch(total):
        deleted: int = yield write(pruning.run_batch, size)
        total += deleted
        if deleted < size:
            break
    return total


def pause(queue: str, *, reason: str | None = None) -> Program[PauseStatus]:
    """Pause ``queue``: from the moment this commits no runner claims its
    jobs (the claim statement itself checks); running jobs finish
    normally and enqueueing still works. Idempotent."""
    status: PauseStatus = yield write(store.pause, queue, reason)
    return status


def resume(queue: str) -> Program[PauseStatus]:
    """Resume ``queue`` and wake idle runners. Idempotent."""
    status: PauseStatus = yield write(store.resume, queue)
    return status


def set_limits(
    queue: str,
    *,
    concurrency: int | None = None,
    concurrency_per_key: int | None = None,
    rate: Rate | None = None,
    rate_per_key: Rate | None = None,
) -> Program[QueueLimits]:
    """Limit ``queue`` across every runner: at most ``concurrency`` of its
    jobs running at once, at most ``concurrency_per_key`` of one key's
    (``Job.key``), at most ``rate`` claims in any window of its period (a
    :class:`~sqlalchemy_watchdog.Rate`, database clock), at most
    ``rate_per_key`` claims of one key's jobs in any window of its
    period. A limited
    queue's claims also rotate across keys. Replaces the queue's
    limits (None: no such limit; at least one must be given); idempotent.
    Returns the limits as stored.

    Takes effect for every claim that starts after it commits; a runner
    learns that a queue became limited within a second and claims none
    of its jobs meanwhile. Lowering a limit stops no running job: it
    holds back new claims until the queue is under it. See
    :doc:`/howto/limits`."""
    limits: QueueLimits = yield write(
        store.set_limits,
        queue,
        concurrency=concurrency,
        concurrency_per_key=concurrency_per_key,
        rate=rate,
        rate_per_key=rate_per_key,
    )
    return limits


def clear_limits(queue: str) -> Program[bool]:
    """Remove ``queue``'s limits (it claims as an unlimited queue again);
    whether it had any. Idempotent."""
    had: bool = yield write(store.clear_limits, queue)
    return had


def limits() -> Program[tuple[QueueLimits, ...]]:
    """Every limited queue's limits, by queue name (one read of ``watchdog_limits``)."""
    found: tuple[QueueLimits, ...] = yield look(store.read_limits)
    return found


def rerun(job_id: str, *, rerun_id: str) -> Program[EnqueueResult]:
    """Enqueue a copy of settled job ``job_id`` as a new job (settled stays
    final). Its ``job_id`` is derived from the original's and ``rerun_id``
    (``<job_id>~rerun~<rerun_id>``, or a hash when that is too long), so
    the same call again is a duplicate; the copy's ``rerun_of`` names the
    original, whose :meth:`read` lists its reruns."""
    enqueued: EnqueueResult = yield write(store.rerun, job_id, rerun_id)
    return enqueued


def rerun_many(
    *,
    rerun_id: str,
    queue: str | None = None,
    lane: str | None = None,
    outcome: Outcome | str | Iterable[Outcome | str] | None = None,
    settled_after: datetime | None = None,
    settled_before: datetime | None = None,
    enqueued_after: datetime | None = None,
    enqueued_before: datetime | None = None,
    batch: int = 100,
    limit: int | None = None,
    dry_run: bool = False,
) -> Program[BulkResult]:
    """:meth:`rerun` every settled job matching all the filters given (at
    least one): ``queue``, ``lane``, ``outcome`` (one or several), and
    settled or enqueued strictly after / before a timezone-aware time.

    Each copy's ``job_id`` derives from its original's and ``rerun_id``
    as in :meth:`rerun`, so the same call again makes no second copy
    (``repeated``); it never selects the copies ``rerun_id`` made, and
    only jobs that existed when it started. It works in batches of
    ``batch`` (1-1000) jobs in admission order, each its own transaction
    (a copy is enqueued with its batch or not at all), up to ``limit``
    jobs. On PostgreSQL a batch's originals are share-locked until it
    commits, so a concurrent :meth:`prune` skips them meanwhile.
    ``dry_run=True`` counts the jobs it would rerun and changes nothing.

    Every argument is checked before anything is read: a bad one raises
    :class:`~sqlalchemy_watchdog.InvalidJob` naming it.
    """
    action = store.BulkAction.of(
        store.BulkKind.RERUN,
        rerun_id,
        queue=queue,
        lane=lane,
        outcome=outcome,
        settled_after=settled_after,
        settled_before=settled_before,
        enqueued_after=enqueued_after,
        enqueued_before=enqueued_before,
        batch=batch,
        limit=limit,
        dry_run=dry_run,
    )
    return (yield from _bulk(action))


def cancel_many(
    *,
    cancellation_id: str,
    queue: str | None = None,
    lane: str | None = None,
    enqueued_after: datetime | None = None,
    enqueued_before: datetime | None = None,
    only_if_queued: bool = False,
    batch: int = 100,
    limit: int | None = None,
    dry_run: bool = False,
) -> Program[BulkResult]:
    """:meth:`cancel` every live (delayed, queued or running) job matching
    all the filters given (at least one): ``queue``, ``lane``, enqueued
    strictly after / before a timezone-aware time.

    Each job's cancellation id derives from ``cancellation_id`` and its
    ``job_id`` (``<cancellation_id>~<job_id>``, or a hash when too long),
    so the same call again replays (``repeated``). A job that settled or
    was cancelled by another request meanwhile is ``skipped``. Batches
    as in :meth:`rerun_many`; ``dry_run=True`` counts and changes nothing.
    """
    action = store.BulkAction.of(
        store.BulkKind.CANCEL,
        cancellation_id,
        queue=queue,
        lane=lane,
        enqueued_after=enqueued_after,
        enqueued_before=enqueued_before,
        only_if_queued=only_if_queued,
        batch=batch,
        limit=limit,
        dry_run=dry_run,
    )
    return (yield from _bulk(action))


def _bulk(action: store.BulkAction) -> Program[BulkResult]:
    """A bulk action's batches up to the newest job when it started (each
    a look in a dry run)."""
    progress = store.BulkProgress(action)
    end: int = yield look(store.newest_sequence)
    step = look if action.dry_run else write
    while size := action.next_size(progress.matched):
        if not progress.add((yield step(store.bulk_batch, action, progress.after, end, size)), size):
            break
    return progress.result()


def cancel(job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> Program[CancelResult]:
    """Record a cancellation: a queued job is settled ``cancelled`` when next
    claimed; a running job's handler is told to stop and its settlement
    becomes ``cancelled``. Idempotent per ``cancellation_id``."""
    recorded: CancelResult = yield write(cancel_in, job_id, cancellation_id, only_if_queued=only_if_queued)
    return recorded


class Keep(enum.Enum):
    """The default of ``replace``'s ``payload`` and ``run_at``: keep the job's own."""

    KEEP = "keep"


#: ``replace(job_id, payload=...)`` leaves ``run_at`` as it is, and the reverse.
KEEP = Keep.KEEP


def replace(
    job_id: str,
    *,
    payload: Any = KEEP,
    run_at: datetime | Keep | None = KEEP,
    codec: PayloadCodec | None = None,
) -> Program[ReplaceResult]:
    """Change a job that still waits (delayed, queued, or waiting for its
    parents): its ``payload`` (encoded by ``codec`` if given, checked like
    an enqueued one) and/or its start ``run_at`` (an aware datetime; None:
    at once). One statement guarded by the job's state: ``replaced``, or
    ``not_waiting`` once a runner claimed it (nothing changed), or
    ``missing``. Idempotent: the same replacement again changes nothing
    more. A job's ``payload`` and ``run_at`` are part of its identity: a
    later replay of its original enqueue is an ``EnqueueConflict``."""
    arguments = replace_arguments(job_id, payload, run_at, codec)
    replaced: ReplaceResult = yield write(store.replace, job_id, **arguments)
    return replaced


def replace_arguments(job_id: object, payload: Any, run_at: object, codec: PayloadCodec | None) -> dict[str, Any]:
    """:func:`replace`'s arguments checked, as ``store.replace`` takes them
    (``payload`` encoded, ``start``, ``set_start``): bad input is refused
    by name before anything runs."""
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    if payload is KEEP and run_at is KEEP:
        raise InvalidJob("payload", "replace needs a payload or a run_at to change")
    encoded: str | None = None
    if payload is not KEEP:
        encoded = encode_payload(payload if codec is None else codec.encode(payload))
    start: datetime | None = None
    if run_at is not KEEP:
        start = None if run_at is None else check_datetime("run_at", run_at)
    return {"payload": encoded, "start": start, "set_start": run_at is not KEEP}


def signal(job_id: str, name: str, payload: Any = None) -> Program[SignalResult]:
    """Send signal ``name`` to job ``job_id`` with ``payload`` (JSON, as a
    job's payload is): the first signal of each name is kept, and a handler
    waiting for it (``job.wait_for(name, ...)``) is made due at once; one
    sent before the wait is kept for it. Idempotent: ``delivered``; a repeat
    is a ``duplicate`` (same payload) or a ``conflict`` (another payload:
    the first one stays); nothing is kept for a ``job_settled`` or
    ``no_such_job``. Lock the job's row, keep, wake: one transaction."""
    arguments = signal_arguments(job_id, name, payload)
    sent: SignalResult = yield write(store.send_signal, *arguments)
    return sent


def signal_arguments(job_id: object, name: object, payload: Any) -> tuple[str, str, str]:
    """:func:`signal`'s arguments checked, as ``store.send_signal`` takes
    them (``payload`` encoded): bad input is refused by name before anything runs."""
    checked_id = check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    checked_name = check_step_name(name)
    return checked_id, checked_name, encode_payload(payload)


def signals(job_id: str) -> Program[list[JobSignal]]:
    """The signals kept for the job (``signal``), oldest first: each one's
    name, payload and when it was kept."""
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    found: list[JobSignal] = yield look(store.read_signals, job_id)
    return found


def fail_lane(lane: str, reason: str) -> Program[LaneFailure]:
    """Settle up to one batch of the lane's live jobs ``failed``, running
    ones first (their handlers are told to stop), then its waiting jobs
    (their dependents are told by a runner's next pass). Call again while
    ``.more`` is true."""
    failed: LaneFailure = yield write(fail_lane_in, lane, reason)
    return failed


def purge(queue: str) -> Program[int]:
    """Delete the queue's waiting, queued and delayed jobs (running and
    settled ones stay); returns how many. Their dependents in other
    queues are told each ended ``purged``."""
    deleted: int = yield write(store.purge, queue)
    return deleted


def throughput() -> Program[Throughput]:
    """Jobs settled in each minute of the last hour (database clock), by
    queue and outcome: what the dashboard's chart draws. Cost: like
    :meth:`stats`, one range of ``ix_watchdog_jobs_settled`` per outcome,
    O(jobs settled in the last hour)."""
    found: Throughput = yield look(store.throughput)
    return found


# -- store operations of the client's own -------------------------------------------


@store.operation(store.Shape.WRITE)
def cancel_in(conn: Connection, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelResult:
    """:func:`store.cancel` plus the wake-up, in the caller's transaction."""
    # A concurrent request may take this cancellation_id between the store's
    # read and its update: the update then fails on the unique index, and the
    # status is read afresh. Where the failed statement aborts the transaction
    # (PostgreSQL) and there is one -- asyncpg with its statement cache off runs
    # the store's operations in a transaction, not in autocommit -- the update
    # runs in a savepoint, so only the savepoint is rolled back: a rollback of
    # the transaction would end the one the store began for this operation
    # ("Can't operate on closed transaction"). MariaDB and SQLite undo the
    # failed statement alone; the read then runs in the same transaction, at
    # READ COMMITTED on MariaDB, where the winner's commit is seen.
    aborts = backend_of(conn).aborts_on_error
    autocommit = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
    savepoint = conn.begin_nested() if aborts and not autocommit else None
    try:
        result = store.cancel(conn, job_id, cancellation_id, only_if_queued=only_if_queued)
    except IntegrityError as error:
        if store.violation(error) != ("unique", "cancellation_id"):
            raise
        if savepoint is not None:
            savepoint.rollback()
        elif aborts:
            conn.rollback()  # autocommit: the statement's own transaction, ended already
        return CancelResult(job_id, store.cancel_status_now(conn, job_id, cancellation_id))
    if savepoint is not None:
        savepoint.commit()
    if result.status is CancelStatus.RECORDED:
        store.notify(conn, EVENT_STOP)
    return result


@store.operation(store.Shape.WRITE)
def fail_lane_in(conn: Connection, lane: str, reason: str) -> LaneFailure:
    """:func:`store.fail_lane` plus the wake-up, in the caller's transaction."""
    result = store.fail_lane(conn, lane, reason)
    if result.jobs:
        store.notify(conn, EVENT_STOP)
    return result


#: The declaration: every operation both facades offer, by method name, in
#: the order the reference documents them.
OPERATIONS: Mapping[str, Callable[..., Program[Any]]] = {
    fn.__name__: fn
    for fn in (
        enqueue,
        read,
        result,
        replace,
        steps,
        signal,
        signals,
        wait,
        explain,
        read_queue_head,
        read_settled,
        has_pending_work,
        list_jobs,
        stats,
        workers,
        schedules,
        prune,
        pause,
        resume,
        set_limits,
        clear_limits,
        limits,
        rerun,
        rerun_many,
        cancel_many,
        cancel,
        fail_lane,
        purge,
        throughput,
    )
}
