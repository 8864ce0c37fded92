"""Transactional enqueue, and the :class:`Watchdog` client for reads and commands."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar, overload

from sqlalchemy import Connection, Engine, Select
from sqlalchemy.orm import Session

from .. import store
from ..applies import JobExplanation
from ..connections import follow_failover
from ..errors import EnqueueConflict, InvalidJob
from ..gateway import SyncGateway
from ..jobs import (
    BulkResult,
    CancelResult,
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
    ReplaceResult,
    ScheduleView,
    Stats,
    Throughput,
    WorkerView,
    job_batch,
)
from ..jobs.durable import JobSignal, JobStep, SignalResult
from ..jobs.encoding import PayloadCodec
from ..model import WatchdogJob
from ..results import wait_for
from ..wakeups import EVENT_QUEUED, EVENT_STOP
from . import operations as ops
from .operations import KEEP, Keep

__all__ = ["enqueue", "enqueue_select", "replace_job", "signal_job", "Watchdog", "EVENT_QUEUED", "EVENT_STOP"]

T = TypeVar("T")


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


def replace_job(
    target: Session | Connection,
    job_id: str,
    *,
    payload: Any = KEEP,
    run_at: datetime | Keep | None = KEEP,
    codec: PayloadCodec | None = None,
) -> ReplaceResult:
    """:meth:`Watchdog.replace` inside the caller's transaction: the job that
    still waits takes ``payload`` and/or ``run_at`` when the caller commits,
    with the caller's own writes (a rollback drops both). One statement
    guarded by the job's state; ``replaced``, ``not_waiting`` or ``missing``."""
    arguments = ops.replace_arguments(job_id, payload, run_at, codec)
    return store.replace(_connection(target), job_id, **arguments)


def signal_job(target: Session | Connection, job_id: str, name: str, payload: Any = None) -> SignalResult:
    """:meth:`Watchdog.signal` inside the caller's transaction: the signal is
    kept, and a job waiting for it made due, when the caller commits, with
    the caller's own writes (a rollback drops both). The job's row stays
    locked until then (PostgreSQL): commit soon."""
    return store.send_signal(_connection(target), *ops.signal_arguments(job_id, name, payload))


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

    Every method is declared once, with its
    :class:`~sqlalchemy_watchdog.asyncio.AsyncWatchdog` twin, in
    ``sqlalchemy_watchdog.client.operations``; here it runs over a sync
    ``Engine``.
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

    def _perform(self, program: ops.Program[T]) -> T:
        """Run an operation's program over the gateway."""
        return ops.drive(program, self._step)

    def _step(self, step: ops.Step) -> Any:
        if isinstance(step, ops.WaitFor):
            job_id, codec = step.job_id, step.codec
            return wait_for(lambda: self.result(job_id, codec=codec), self.engine, job_id, step.timeout_s, step.poll_s)
        if step.as_look:
            return self._gateway.read(step.fn, *step.args, **step.kwargs)
        return self._gateway.run(step.fn, *step.args, **step.kwargs)

    @overload
    def enqueue(self, jobs: Job, *, delay: timedelta | None = None) -> EnqueueResult: ...
    @overload
    def enqueue(self, jobs: Iterable[Job], *, delay: timedelta | None = None) -> list[EnqueueResult]: ...

    @ops.declared_by(ops.enqueue)
    def enqueue(
        self, jobs: Job | Iterable[Job], *, delay: timedelta | None = None
    ) -> EnqueueResult | list[EnqueueResult]:
        return self._perform(ops.enqueue(jobs, delay=delay))

    @ops.declared_by(ops.read)
    def read(self, job_id: str) -> JobView | None:
        return self._perform(ops.read(job_id))

    @ops.declared_by(ops.result)
    def result(self, job_id: str, *, codec: PayloadCodec | None = None) -> JobResult:
        return self._perform(ops.result(job_id, codec=codec))

    @ops.declared_by(ops.wait)
    def wait(
        self,
        job_id: str,
        *,
        timeout: timedelta,
        codec: PayloadCodec | None = None,
        poll_interval: timedelta = timedelta(seconds=1),
    ) -> JobResult:
        return self._perform(ops.wait(job_id, timeout=timeout, codec=codec, poll_interval=poll_interval))

    @ops.declared_by(ops.explain)
    def explain(self, job_id: str) -> JobExplanation | None:
        return self._perform(ops.explain(job_id))

    @ops.declared_by(ops.read_queue_head)
    def read_queue_head(self, queue: str) -> JobView | None:
        return self._perform(ops.read_queue_head(queue))

    @ops.declared_by(ops.read_settled)
    def read_settled(self, limit: int = 100, after_sequence: int = 0) -> list[JobView]:
        return self._perform(ops.read_settled(limit, after_sequence))

    @ops.declared_by(ops.has_pending_work)
    def has_pending_work(self) -> bool:
        return self._perform(ops.has_pending_work())

    @ops.declared_by(ops.list_jobs)
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
        return self._perform(
            ops.list_jobs(
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
        )

    @ops.declared_by(ops.stats)
    def stats(self) -> Stats:
        return self._perform(ops.stats())

    @ops.declared_by(ops.workers)
    def workers(self) -> list[WorkerView]:
        return self._perform(ops.workers())

    @ops.declared_by(ops.schedules)
    def schedules(self) -> list[ScheduleView]:
        return self._perform(ops.schedules())

    @ops.declared_by(ops.prune)
    def prune(
        self,
        *,
        older_than: timedelta,
        outcomes: Iterable[Outcome | str] | None = None,
        limit: int | None = None,
        batch: int = 1000,
        include_undated: bool = False,
    ) -> int:
        return self._perform(
            ops.prune(
                older_than=older_than, outcomes=outcomes, limit=limit, batch=batch, include_undated=include_undated
            )
        )

    @ops.declared_by(ops.pause)
    def pause(self, queue: str, *, reason: str | None = None) -> PauseStatus:
        return self._perform(ops.pause(queue, reason=reason))

    @ops.declared_by(ops.resume)
    def resume(self, queue: str) -> PauseStatus:
        return self._perform(ops.resume(queue))

    @ops.declared_by(ops.set_limits)
    def set_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        concurrency_per_key: int | None = None,
        rate: Rate | None = None,
        rate_per_key: Rate | None = None,
    ) -> QueueLimits:
        return self._perform(
            ops.set_limits(
                queue,
                concurrency=concurrency,
                concurrency_per_key=concurrency_per_key,
                rate=rate,
                rate_per_key=rate_per_key,
            )
        )

    @ops.declared_by(ops.clear_limits)
    def clear_limits(self, queue: str) -> bool:
        return self._perform(ops.clear_limits(queue))

    @ops.declared_by(ops.limits)
    def limits(self) -> tuple[QueueLimits, ...]:
        return self._perform(ops.limits())

    @ops.declared_by(ops.rerun)
    def rerun(self, job_id: str, *, rerun_id: str) -> EnqueueResult:
        return self._perform(ops.rerun(job_id, rerun_id=rerun_id))

    @ops.declared_by(ops.rerun_many)
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
        return self._perform(
            ops.rerun_many(
                rerun_id=rerun_id,
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
        )

    @ops.declared_by(ops.cancel_many)
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
        return self._perform(
            ops.cancel_many(
                cancellation_id=cancellation_id,
                queue=queue,
                lane=lane,
                enqueued_after=enqueued_after,
                enqueued_before=enqueued_before,
                only_if_queued=only_if_queued,
                batch=batch,
                limit=limit,
                dry_run=dry_run,
            )
        )

    @ops.declared_by(ops.cancel)
    def cancel(self, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelResult:
        return self._perform(ops.cancel(job_id, cancellation_id, only_if_queued=only_if_queued))

    @ops.declared_by(ops.replace)
    def replace(
        self,
        job_id: str,
        *,
        payload: Any = KEEP,
        run_at: datetime | Keep | None = KEEP,
        codec: PayloadCodec | None = None,
    ) -> ReplaceResult:
        return self._perform(ops.replace(job_id, payload=payload, run_at=run_at, codec=codec))

    @ops.declared_by(ops.steps)
    def steps(self, job_id: str) -> list[JobStep]:
        return self._perform(ops.steps(job_id))

    @ops.declared_by(ops.signal)
    def signal(self, job_id: str, name: str, payload: Any = None) -> SignalResult:
        return self._perform(ops.signal(job_id, name, payload))

    @ops.declared_by(ops.signals)
    def signals(self, job_id: str) -> list[JobSignal]:
        return self._perform(ops.signals(job_id))

    @ops.declared_by(ops.fail_lane)
    def fail_lane(self, lane: str, reason: str) -> LaneFailure:
        return self._perform(ops.fail_lane(lane, reason))

    @ops.declared_by(ops.purge)
    def purge(self, queue: str) -> int:
        return self._perform(ops.purge(queue))

    @ops.declared_by(ops.throughput)
    def throughput(self) -> Throughput:
        return self._perform(ops.throughput())
