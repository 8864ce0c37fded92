"""The asyncio API: enqueue with an ``AsyncSession`` or ``AsyncConnection``,
and :class:`AsyncWatchdog` over an ``AsyncEngine``.

Every call runs the same sync store code as the sync API, through
``AsyncSession.run_sync`` / ``AsyncConnection.run_sync`` -- the way
SQLAlchemy's own asyncio layer is built -- so both behave identically on
``postgresql+psycopg`` and ``sqlite+aiosqlite``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from sqlalchemy import Select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from . import client, store
from .jobs import CancelResult, EnqueueResult, Job, JobView, LaneFailure

__all__ = ["enqueue", "enqueue_select", "AsyncWatchdog"]

T = TypeVar("T")


async def _run_sync(target: AsyncSession | AsyncConnection, fn: Callable[..., T], *args: Any) -> T:
    if isinstance(target, (AsyncSession, AsyncConnection)):
        return await target.run_sync(fn, *args)
    raise TypeError(
        f"expected an AsyncSession or an AsyncConnection, not {type(target).__name__}"
        " (use sqlalchemy_watchdog.enqueue for a sync Session / Connection)"
    )


@overload
async def enqueue(target: AsyncSession | AsyncConnection, jobs: Job) -> EnqueueResult: ...
@overload
async def enqueue(target: AsyncSession | AsyncConnection, jobs: Iterable[Job]) -> list[EnqueueResult]: ...


async def enqueue(
    target: AsyncSession | AsyncConnection, jobs: Job | Iterable[Job]
) -> EnqueueResult | list[EnqueueResult]:
    """Async :func:`sqlalchemy_watchdog.enqueue`: same semantics, same code."""
    return await _run_sync(target, client.enqueue, jobs)


async def enqueue_select(target: AsyncSession | AsyncConnection, source: Select[Any]) -> list[EnqueueResult]:
    """Async :func:`sqlalchemy_watchdog.enqueue_select`."""
    return await _run_sync(target, client.enqueue_select, source)


class AsyncWatchdog:
    """Async twin of :class:`sqlalchemy_watchdog.Watchdog` over an ``AsyncEngine``."""

    def __init__(self, engine: AsyncEngine) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(f"AsyncWatchdog takes an AsyncEngine, not {type(engine).__name__}")
        self.engine = engine

    async def _run(self, fn: Callable[..., T], *args: Any, write: bool = True, **kwargs: Any) -> T:
        backoff = store.Backoff()
        while True:
            try:
                async with self.engine.connect() as conn:
                    return await conn.run_sync(
                        lambda sync: store.transact(sync, fn, *args, write=write, **kwargs)
                    )
            except DBAPIError as error:
                await asyncio.sleep(backoff.delay_after(error, fn.__name__))

    async def enqueue(self, jobs: Job | Iterable[Job]) -> Any:
        return await self._run(client.enqueue, jobs)

    async def read(self, job_id: str) -> JobView | None:
        return await self._run(store.read, job_id, write=False)

    async def read_queue_head(self, queue: str) -> JobView | None:
        return await self._run(store.read_queue_head, queue, write=False)

    async def read_settled(self, limit: int = 100, after_sequence: int = 0) -> list[JobView]:
        return await self._run(store.read_settled, limit, after_sequence, write=False)

    async def has_pending_work(self) -> bool:
        return await self._run(store.has_pending_work, write=False)

    async def cancel(self, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelResult:
        return await self._run(client.cancel_in, job_id, cancellation_id, only_if_queued=only_if_queued)

    async def fail_lane(self, lane: str, reason: str) -> LaneFailure:
        return await self._run(client.fail_lane_in, lane, reason)

    async def purge(self, queue: str) -> int:
        return await self._run(store.purge, queue)
