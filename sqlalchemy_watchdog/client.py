"""Transactional enqueue, and the :class:`Watchdog` client for reads and commands."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import Connection, Engine, Select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from . import store
from .applies import JobExplanation, explain
from .connections import follow_failover
from .errors import EnqueueConflict, InvalidJob
from .gateway import SyncGateway
from .jobs import (
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
    Rate,
    ScheduleView,
    Stats,
    Throughput,
    WorkerView,
    check_text,
    job_batch,
    result_of,
)
from .model import WatchdogJob
from .results import check_wait, wait_for
from .wakeups import EVENT_QUEUED, EVENT_STOP

if TYPE_CHECKING:
    from .codecs import PayloadCodec

__all__ = ["enqueue", "enqueue_select", "Watchdog", "EVENT_QUEUED", "EVENT_STOP"]


def _connection(target: Session | Connection) -> Connection:
    if isinstance(target, Session):
        # The bind our table maps to, inside the session's transaction.
        return target.connection(bind_arguments={"mapper": WatchdogJob})
    if isinstance(target, Connection):
        return target
    raise TypeError(
        f"expected a Session or a Connection, not {type(target).__name__}"
        " (use sqlalchemy_watchdog.asyncio for AsyncSession / AsyncConnection)"
    )


def _roll_back(target: Session | Connection) -> None:
    """Roll back the caller's innermost transaction after a conflicting replay.

    PostgreSQL has already aborted it; SQLite only undid the one statement,
    so without this the caller's other writes could commit without their job.
    """
    if isinstance(target, Session):
        nested = target.get_nested_transaction()
        if nested is not None:
            nested.rollback()
        else:
            target.rollback()
        return
    transaction = target.get_nested_transaction() or target.get_transaction()
    if transaction is not None:
        transaction.rollback()
    else:
        target.rollback()


@overload
def enqueue(target: Session | Connection, jobs: Job, *, delay: timedelta | None = None) -> EnqueueResult: ...
@overload
def enqueue(
    target: Session | Connection, jobs: Iterable[Job], *, delay: timedelta | None = None
) -> list[EnqueueResult]: ...


def enqueue(
    target: Session | Connection, jobs: Job | Iterable[Job], *, delay: timedelta | None = None
) -> EnqueueResult | list[EnqueueResult]:
    """Add a job (or many, in one statement) inside the caller's transaction.

    Nothing is committed here: the caller's ``commit()`` makes the job durable
    together with the caller's own writes, and a rollback drops both.

    :param delay: make the jobs wait this long (counted from the database
        clock at insert) before any runner may claim them. Not part of a
        job's identity: replaying a job with another delay is a duplicate.
        For a fixed time use ``Job(run_at=...)`` instead (not both).
    :returns: an :class:`EnqueueResult` per job (``queued`` or ``duplicate``
        for an identical replay), in input order.
    :raises EnqueueConflict: the ``job_id`` exists with other contents. The
        caller's transaction (its innermost savepoint, if any) is rolled back,
        so its other writes cannot commit without their job.
    """
    single = isinstance(jobs, Job)
    batch = job_batch(jobs)
    conn = _connection(target)
    try:
        results = store.enqueue(conn, batch, delay=delay)
    except EnqueueConflict:
        _roll_back(target)
        raise
    # On PostgreSQL a statement trigger NOTIFYs idle runners at commit.
    return results[0] if single else results


_SELECT_COLUMNS = ("job_id", "queue", "lane", "priority", "payload", "max_recoveries", "run_at")


def enqueue_select(target: Session | Connection, source: Select[Any]) -> list[EnqueueResult]:
    """Enqueue one job per row of an arbitrary SELECT, in the caller's transaction.

    The SELECT's columns are labelled ``job_id`` and ``queue`` (required), and
    optionally ``lane``, ``priority``, ``payload`` (JSON text),
    ``max_recoveries`` and ``run_at`` (a timezone-aware datetime, or NULL).
    Every row is validated like a :class:`Job` before anything is written;
    an invalid row raises :class:`InvalidJob` naming the field and the row.
    """
    # Through the Session when there is one, so its pending rows are flushed
    # and the SELECT sees what the caller just added.
    result = target.execute(source) if isinstance(target, Session) else _connection(target).execute(source)
    names = set(result.keys())
    unknown = names - set(_SELECT_COLUMNS)
    if unknown:
        raise InvalidJob("select", f"unknown column(s) {sorted(unknown)}; label columns as {list(_SELECT_COLUMNS)}")
    for required in ("job_id", "queue"):
        if required not in names:
            raise InvalidJob("select", f"must have a column labelled {required!r}")
    jobs = [_job_of_row(index, row) for index, row in enumerate(result.mappings())]
    return enqueue(target, jobs) if jobs else []


def _job_of_row(index: int, row: Any) -> Job:
    try:
        payload_text = row.get("payload")
        if payload_text is None:
            payload = None
        elif isinstance(payload_text, str):
            try:
                payload = json.loads(payload_text, parse_constant=_refuse_constant)
            except ValueError as error:
                raise InvalidJob("payload", f"is not valid JSON text: {error}") from None
        else:
            raise InvalidJob("payload", f"must be JSON text, not {type(payload_text).__name__}")
        return Job(
            row["job_id"],
            row["queue"],
            lane=row.get("lane"),
            priority=row.get("priority", 0),
            payload=payload,
            max_recoveries=row.get("max_recoveries"),
            run_at=row.get("run_at"),
        )
    except InvalidJob as error:
        raise InvalidJob(error.field, f"row {index}: {str(error).split(': ', 1)[1]}") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


class Watchdog:
    """Reads and commands on the queue, from any process.

    Each call runs in its own short transaction on ``engine``. To enqueue
    next to your own writes, use :func:`enqueue` with your session instead;
    :meth:`enqueue` here is the stand-alone convenience.
    """

    def __init__(self, engine: Engine) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(
                f"Watchdog takes an Engine, not {type(engine).__name__}"
                " (use sqlalchemy_watchdog.asyncio.AsyncWatchdog for an AsyncEngine)"
            )
        self.engine = engine
        self._gateway = SyncGateway(engine)
        follow_failover(engine)

    @overload
    def enqueue(self, jobs: Job, *, delay: timedelta | None = None) -> EnqueueResult: ...
    @overload
    def enqueue(self, jobs: Iterable[Job], *, delay: timedelta | None = None) -> list[EnqueueResult]: ...

    def enqueue(
        self, jobs: Job | Iterable[Job], *, delay: timedelta | None = None
    ) -> EnqueueResult | list[EnqueueResult]:
        """Enqueue in a transaction of its own (see :func:`enqueue`); on
        PostgreSQL up to 1,000 jobs go as one self-committing statement."""
        results = self._gateway.run(store.enqueue, job_batch(jobs), delay=delay)
        return results[0] if isinstance(jobs, Job) else results

    def read(self, job_id: str) -> JobView | None:
        """The job, or None if there is no such job (with its reruns listed)."""
        return self._gateway.read(store.read_with_reruns, job_id)

    def result(self, job_id: str, *, codec: PayloadCodec | None = None) -> JobResult:
        """The job's result now, or why there is none: a :class:`JobResult`
        whose ``status`` is ``completed`` (``value`` is the result, decoded
        by ``codec`` if given: use the runner's), ``failed`` (``reason``
        says why), ``cancelled``, ``pending``, ``running`` or ``unknown``
        (no such job: never enqueued, purged or pruned)."""
        return result_of(job_id, self._gateway.read(store.read, job_id), codec)

    def wait(
        self,
        job_id: str,
        *,
        timeout: timedelta,
        codec: PayloadCodec | None = None,
        poll_interval: timedelta = timedelta(seconds=1),
    ) -> JobResult:
        """Wait up to ``timeout`` for the job to settle; its :meth:`result`
        then, ``unknown`` at once for no such job, or status ``timed_out``.

        On PostgreSQL (psycopg, psycopg2) the wait listens for the job's
        settlement on a connection of its own and reads the job when told,
        else every ``poll_interval``; on SQLite, or where the connection is
        not one PostgreSQL session (a transaction-mode pooler), it reads the
        job every ``poll_interval``."""
        timeout_s, poll_s = check_wait(timeout, poll_interval)
        check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
        return wait_for(lambda: self.result(job_id, codec=codec), self.engine, job_id, timeout_s, poll_s)

    def explain(self, job_id: str) -> JobExplanation | None:
        """What applies to the job (None if there is no such job): its
        effective timeout and retry policy and where each comes from (its
        own, else its queue's ``@handler`` registered in this process, else
        the runner's -- which a process other than the runner's cannot know,
        and says so), "attempt n of m", its queue's pause, and its reason in
        plain words (a :class:`~sqlalchemy_watchdog.JobExplanation`)."""
        found = self._gateway.read(store.read_with_pause, job_id)
        return None if found is None else explain(*found)

    def read_queue_head(self, queue: str) -> JobView | None:
        """The queue's running job, else its next queued job, else its next delayed one; None when idle."""
        return self._gateway.read(store.read_queue_head, queue)

    def read_settled(self, limit: int = 100, after_sequence: int = 0) -> list[JobView]:
        """Settled jobs in admission order, ``limit`` (1-256) after ``after_sequence``."""
        return self._gateway.read(store.read_settled, limit, after_sequence)

    def has_pending_work(self) -> bool:
        """Whether any job is delayed, queued or running."""
        return self._gateway.read(store.has_pending_work)

    def list_jobs(
        self,
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
        return self._gateway.read(
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

    def stats(self) -> Stats:
        """How every queue is doing: counts by live state, jobs settled in the
        last minute and hour by outcome, the age of the oldest ready job,
        running jobs with expired leases, and pauses.

        Cost: index reads only -- a count of the live jobs with each queue's
        oldest ready time (``ix_watchdog_jobs_live_queue``), the expired leases
        (``ix_watchdog_jobs_lease``), and the jobs settled in the
        last hour, one range per outcome (``ix_watchdog_jobs_settled``):
        O(live jobs + jobs settled in the last hour), never the history.
        """
        return self._gateway.read(store.stats)

    def workers(self) -> list[WorkerView]:
        """Every registered runner, oldest first: a runner registers when it
        starts serving (``run_forever``), refreshes its row with every
        heartbeat (``last_seen`` by the database clock, jobs running now)
        and removes it when it shuts down cleanly. One that died or froze
        stops refreshing and shows as :attr:`~WorkerView.gone` once not
        seen for three of its heartbeats and 30 seconds; runners prune it an
        hour later. A restarted runner is a new worker.

        Cost: one read of ``watchdog_workers`` (one row per worker)."""
        return self._gateway.read(store.workers)

    def schedules(self) -> list[ScheduleView]:
        """The schedules runners serve, as they recorded them: one view per
        name and definition, by name, the most recently seen first. Two
        deploys serving a name with different definitions leave two
        :attr:`~ScheduleView.current` views, each :attr:`~ScheduleView.disputed`.
        Runners record their schedules at least every minute; a record not
        seen for a week is forgotten."""
        return self._gateway.read(store.schedules)

    def prune(
        self,
        *,
        older_than: timedelta,
        outcomes: Iterable[Outcome | str] | None = None,
        limit: int | None = None,
        batch: int = 1000,
        include_undated: bool = False,
    ) -> int:
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
            deleted = self._gateway.run(pruning.run_batch, size)
            total += deleted
            if deleted < size:
                break
        return total

    def pause(self, queue: str, *, reason: str | None = None) -> PauseStatus:
        """Pause ``queue``: from the moment this commits no runner claims its
        jobs (the claim statement itself checks); running jobs finish
        normally and enqueueing still works. Idempotent."""
        return self._gateway.run(store.pause, queue, reason)

    def resume(self, queue: str) -> PauseStatus:
        """Resume ``queue`` and wake idle runners. Idempotent."""
        return self._gateway.run(store.resume, queue)

    def set_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        concurrency_per_key: int | None = None,
        rate: Rate | None = None,
        rate_per_key: Rate | None = None,
    ) -> QueueLimits:
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
        return self._gateway.run(
            store.set_limits,
            queue,
            concurrency=concurrency,
            concurrency_per_key=concurrency_per_key,
            rate=rate,
            rate_per_key=rate_per_key,
        )

    def clear_limits(self, queue: str) -> bool:
        """Remove ``queue``'s limits (it claims as an unlimited queue again);
        whether it had any. Idempotent."""
        return self._gateway.run(store.clear_limits, queue)

    def limits(self) -> tuple[QueueLimits, ...]:
        """Every limited queue's limits, by queue name (one read of ``watchdog_limits``)."""
        return self._gateway.read(store.read_limits)

    def rerun(self, job_id: str, *, rerun_id: str) -> EnqueueResult:
        """Enqueue a copy of settled job ``job_id`` as a new job (settled stays
        final). Its ``job_id`` is derived from the original's and ``rerun_id``
        (``<job_id>~rerun~<rerun_id>``, or a hash when that is too long), so
        the same call again is a duplicate; the copy's ``rerun_of`` names the
        original, whose :meth:`read` lists its reruns."""
        return self._gateway.run(store.rerun, job_id, rerun_id)

    def rerun_many(
        self,
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
    ) -> BulkResult:
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
        return self._bulk(action)

    def cancel_many(
        self,
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
    ) -> BulkResult:
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
        return self._bulk(action)

    def _bulk(self, action: store.BulkAction) -> BulkResult:
        progress = store.BulkProgress(action)
        end = self._gateway.read(store.newest_sequence)
        run = self._gateway.read if action.dry_run else self._gateway.run
        while size := action.next_size(progress.matched):
            if not progress.add(run(store.bulk_batch, action, progress.after, end, size), size):
                break
        return progress.result()

    def cancel(self, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelResult:
        """Record a cancellation: a queued job is settled ``cancelled`` when next
        claimed; a running job's handler is told to stop and its settlement
        becomes ``cancelled``. Idempotent per ``cancellation_id``."""
        return self._gateway.run(cancel_in, job_id, cancellation_id, only_if_queued=only_if_queued)

    def fail_lane(self, lane: str, reason: str) -> LaneFailure:
        """Settle up to one batch of the lane's live jobs ``failed``, running
        ones first (their handlers are told to stop), then its waiting jobs
        (their dependents are told by a runner's next pass). Call again while
        ``.more`` is true."""
        return self._gateway.run(fail_lane_in, lane, reason)

    def purge(self, queue: str) -> int:
        """Delete the queue's waiting, queued and delayed jobs (running and
        settled ones stay); returns how many. Their dependents in other
        queues are told each ended ``purged``."""
        return self._gateway.run(store.purge, queue)

    def throughput(self) -> Throughput:
        """Jobs settled in each minute of the last hour (database clock), by
        queue and outcome: what the dashboard's chart draws. Cost: like
        :meth:`stats`, one range of ``ix_watchdog_jobs_settled`` per outcome,
        O(jobs settled in the last hour)."""
        return self._gateway.read(store.throughput)


@store.operation(store.Shape.WRITE)
def cancel_in(conn: Connection, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelResult:
    """:func:`store.cancel` plus the wake-up, in the caller's transaction."""
    try:
        result = store.cancel(conn, job_id, cancellation_id, only_if_queued=only_if_queued)
    except IntegrityError as error:
        if store.violation(error) != ("unique", "cancellation_id"):
            raise
        # A concurrent request took this cancellation_id between our read and
        # our update: another job's (a conflict), or this job's (a replay).
        conn.rollback()
        return CancelResult(job_id, store.cancel_status_now(conn, job_id, cancellation_id))
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
