"""The asyncio client: enqueue with an ``AsyncSession`` or ``AsyncConnection``,
and :class:`AsyncWatchdog` over an ``AsyncEngine``.

Every call runs the same sync store code as the sync client, through
``AsyncSession.run_sync`` / ``AsyncConnection.run_sync`` -- the way
SQLAlchemy's own asyncio layer is built -- and every :class:`AsyncWatchdog`
method is the same declared operation as :class:`~sqlalchemy_watchdog.Watchdog`'s
(:mod:`sqlalchemy_watchdog.client.operations`), so both behave identically
on ``postgresql+psycopg`` and ``sqlite+aiosqlite``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from sqlalchemy import Connection, Select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from .. import store
from ..applies import JobExplanation
from ..connections import follow_failover
from ..gateway import AsyncGateway, AsyncOperations
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
)
from ..jobs.durable import JobSignal, JobStep, SignalResult
from ..jobs.encoding import PayloadCodec
from ..results import wait_for_async
from . import operations as ops
from . import sync
from .operations import KEEP, Keep

__all__ = ["enqueue", "enqueue_select", "AsyncWatchdog"]

T = TypeVar("T")
P = ParamSpec("P")


async def _run_sync(target: AsyncSession | AsyncConnection, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    if isinstance(target, (AsyncSession, AsyncConnection)):
        return await target.run_sync(fn, *args, **kwargs)
    raise TypeError(
        f"expected an AsyncSession or an AsyncConnection, not {type(target).__name__}"
        " (use sqlalchemy_watchdog.enqueue for a sync Session / Connection)"
    )


@overload
async def enqueue(
    target: AsyncSession | AsyncConnection, jobs: Job, *, delay: timedelta | None = None
) -> EnqueueResult: ...
@overload
async def enqueue(
    target: AsyncSession | AsyncConnection, jobs: Iterable[Job], *, delay: timedelta | None = None
) -> list[EnqueueResult]: ...


async def enqueue(
    target: AsyncSession | AsyncConnection, jobs: Job | Iterable[Job], *, delay: timedelta | None = None
) -> EnqueueResult | list[EnqueueResult]:
    """Async :func:`sqlalchemy_watchdog.enqueue`: same semantics, same code."""
    return await _run_sync(target, sync.enqueue, jobs, delay=delay)


async def enqueue_select(target: AsyncSession | AsyncConnection, source: Select[Any]) -> list[EnqueueResult]:
    """Async :func:`sqlalchemy_watchdog.enqueue_select`."""
    return await _run_sync(target, sync.enqueue_select, source)


async def replace_job(
    target: AsyncSession | AsyncConnection,
    job_id: str,
    *,
    payload: Any = KEEP,
    run_at: datetime | Keep | None = KEEP,
    codec: PayloadCodec | None = None,
) -> ReplaceResult:
    """Async :func:`sqlalchemy_watchdog.replace_job`: same semantics, same code."""
    return await _run_sync(target, sync.replace_job, job_id, payload=payload, run_at=run_at, codec=codec)


async def signal_job(
    target: AsyncSession | AsyncConnection, job_id: str, name: str, payload: Any = None
) -> SignalResult:
    """Async :func:`sqlalchemy_watchdog.signal_job`: same semantics, same code."""
    return await _run_sync(target, sync.signal_job, job_id, name, payload)


async def run_store(
    engine: AsyncEngine,
    fn: Callable[Concatenate[Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Internal: run the sync store function ``fn(conn, ...)`` in a write
    transaction of its own, through ``AsyncConnection.run_sync``, retrying
    transient failures (:func:`run_store_as` with :data:`store.WRITE`).

    Not part of the public API; kept importable for the test suite."""
    return await run_store_as(engine, store.WRITE, fn, *args, **kwargs)


async def run_store_as(
    engine: AsyncEngine,
    mode: store.TxMode,
    fn: Callable[Concatenate[Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Internal: :func:`run_store` in the given transaction ``mode``
    (:meth:`AsyncGateway.perform <sqlalchemy_watchdog.gateway.AsyncGateway.perform>`)."""
    return await AsyncGateway(engine).perform(mode, fn.__name__, fn, *args, **kwargs)


class AsyncWatchdog:
    """Async twin of :class:`sqlalchemy_watchdog.Watchdog` over an ``AsyncEngine``:
    the same operations (declared once, in ``sqlalchemy_watchdog.client.operations``),
    each a coroutine."""

    def __init__(self, engine: AsyncEngine) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(f"AsyncWatchdog takes an AsyncEngine, not {type(engine).__name__}")
        self.engine = engine
        self._gateway: AsyncOperations = AsyncGateway(engine)
        follow_failover(engine)

    @classmethod
    def _over(cls, gateway: AsyncOperations) -> AsyncWatchdog:
        """The same operations over another gateway (the dashboard's over a
        sync engine: a :class:`~sqlalchemy_watchdog.gateway.SyncGateway` in
        a thread pool)."""
        watchdog = cls.__new__(cls)
        watchdog._gateway = gateway
        return watchdog

    async def _perform(self, program: ops.Program[T]) -> T:
        """Run an operation's program over the gateway."""
        return await ops.drive_async(program, self._step)

    async def _step(self, step: ops.Step) -> Any:
        if isinstance(step, ops.WaitFor):
            job_id, codec = step.job_id, step.codec
            engine: AsyncEngine | None = getattr(self, "engine", None)
            return await wait_for_async(
                lambda: self.result(job_id, codec=codec), engine, job_id, step.timeout_s, step.poll_s
            )
        if step.as_look:
            return await self._gateway.read(step.fn, *step.args, **step.kwargs)
        return await self._gateway.run(step.fn, *step.args, **step.kwargs)

    @overload
    async def enqueue(self, jobs: Job, *, delay: timedelta | None = None) -> EnqueueResult: ...
    @overload
    async def enqueue(self, jobs: Iterable[Job], *, delay: timedelta | None = None) -> list[EnqueueResult]: ...

    @ops.declared_by(ops.enqueue)
    async def enqueue(
        self, jobs: Job | Iterable[Job], *, delay: timedelta | None = None
    ) -> EnqueueResult | list[EnqueueResult]:
        return await self._perform(ops.enqueue(jobs, delay=delay))

    @ops.declared_by(ops.read)
    async def read(self, job_id: str) -> JobView | None:
        return await self._perform(ops.read(job_id))

    @ops.declared_by(ops.result)
    async def result(self, job_id: str, *, codec: PayloadCodec | None = None) -> JobResult:
        return await self._perform(ops.result(job_id, codec=codec))

    @ops.declared_by(ops.wait)
    async def wait(
        self,
        job_id: str,
        *,
        timeout: timedelta,
        codec: PayloadCodec | None = None,
        poll_interval: timedelta = timedelta(seconds=1),
    ) -> JobResult:
        return await self._perform(ops.wait(job_id, timeout=timeout, codec=codec, poll_interval=poll_interval))

    @ops.declared_by(ops.explain)
    async def explain(self, job_id: str) -> JobExplanation | None:
        return await self._perform(ops.explain(job_id))

    @ops.declared_by(ops.read_queue_head)
    async def read_queue_head(self, queue: str) -> JobView | None:
        return await self._perform(ops.read_queue_head(queue))

    @ops.declared_by(ops.read_settled)
    async def read_settled(self, limit: int = 100, after_sequence: int = 0) -> list[JobView]:
        return await self._perform(ops.read_settled(limit, after_sequence))

    @ops.declared_by(ops.has_pending_work)
    async def has_pending_work(self) -> bool:
        return await self._perform(ops.has_pending_work())

    @ops.declared_by(ops.list_jobs)
    async def list_jobs(
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
        return await self._perform(
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
    async def stats(self) -> Stats:
        return await self._perform(ops.stats())

    @ops.declared_by(ops.workers)
    async def workers(self) -> list[WorkerView]:
        return await self._perform(ops.workers())

    @ops.declared_by(ops.schedules)
    async def schedules(self) -> list[ScheduleView]:
        return await self._perform(ops.schedules())

    @ops.declared_by(ops.prune)
    async def prune(
        self,
        *,
        older_than: timedelta,
        outcomes: Iterable[Outcome | str] | None = None,
        limit: int | None = None,
        batch: int = 1000,
        include_undated: bool = False,
    ) -> int:
        return await self._perform(
            ops.prune(
                older_than=older_than, outcomes=outcomes, limit=limit, batch=batch, include_undated=include_undated
            )
        )

    @ops.declared_by(ops.pause)
    async def pause(self, queue: str, *, reason: str | None = None) -> PauseStatus:
        return await self._perform(ops.pause(queue, reason=reason))

    @ops.declared_by(ops.resume)
    async def resume(self, queue: str) -> PauseStatus:
        return await self._perform(ops.resume(queue))

    @ops.declared_by(ops.set_limits)
    async def set_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        concurrency_per_key: int | None = None,
        rate: Rate | None = None,
        rate_per_key: Rate | None = None,
    ) -> QueueLimits:
        return await self._perform(
            ops.set_limits(
                queue,
                concurrency=concurrency,
                concurrency_per_key=concurrency_per_key,
                rate=rate,
                rate_per_key=rate_per_key,
            )
        )

    @ops.declared_by(ops.clear_limits)
    async def clear_limits(self, queue: str) -> bool:
        return await self._perform(ops.clear_limits(queue))

    @ops.declared_by(ops.limits)
    async def limits(self) -> tuple[QueueLimits, ...]:
        return await self._perform(ops.limits())

    @ops.declared_by(ops.rerun)
    async def rerun(self, job_id: str, *, rerun_id: str) -> EnqueueResult:
        return await self._perform(ops.rerun(job_id, rerun_id=rerun_id))

    @ops.declared_by(ops.rerun_many)
    async def rerun_many(
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
        return await self._perform(
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
    async def cancel_many(
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
        return await self._perform(
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
    async def cancel(self, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelResult:
        return await self._perform(ops.cancel(job_id, cancellation_id, only_if_queued=only_if_queued))

    @ops.declared_by(ops.replace)
    async def replace(
        self,
        job_id: str,
        *,
        payload: Any = KEEP,
        run_at: datetime | Keep | None = KEEP,
        codec: PayloadCodec | None = None,
    ) -> ReplaceResult:
        return await self._perform(ops.replace(job_id, payload=payload, run_at=run_at, codec=codec))

    @ops.declared_by(ops.steps)
    async def steps(self, job_id: str) -> list[JobStep]:
        return await self._perform(ops.steps(job_id))

    @ops.declared_by(ops.signal)
    async def signal(self, job_id: str, name: str, payload: Any = None) -> SignalResult:
        return await self._perform(ops.signal(job_id, name, payload))

    @ops.declared_by(ops.signals)
    async def signals(self, job_id: str) -> list[JobSignal]:
        return await self._perform(ops.signals(job_id))

    @ops.declared_by(ops.fail_lane)
    async def fail_lane(self, lane: str, reason: str) -> LaneFailure:
        return await self._perform(ops.fail_lane(lane, reason))

    @ops.declared_by(ops.purge)
    async def purge(self, queue: str) -> int:
        return await self._perform(ops.purge(queue))

    @ops.declared_by(ops.throughput)
    async def throughput(self) -> Throughput:
        return await self._perform(ops.throughput())
