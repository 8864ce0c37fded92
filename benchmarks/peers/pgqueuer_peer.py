"""pgqueuer as a benchmark subject (PostgreSQL only).

Set up the way its README does: an ``asyncpg`` connection wrapped in
``AsyncpgDriver``; ``Queries.install()`` creates the schema (what ``pgq
install`` runs, durability ``durable``: every table logged); producers call
``Queries.enqueue``; the worker is ``pgqueuer.run(factory)``, the function
behind ``pgq run``, on uvloop as that command does. Completed jobs are
deleted from ``pgqueuer`` and logged in ``pgqueuer_log`` (buffered, many per
statement) -- pgqueuer's own design.

Worker settings: ``defaults`` runs ``pgq run``'s defaults (``batch_size=10``,
no cap on concurrent tasks). A concurrency ``c`` is mapped to its documented
knob, ``max_concurrent_tasks=c`` per worker, which must be at least twice
``batch_size``: ``batch_size = max(1, min(10, c // 2))``; ``c = 1`` cannot be
expressed and runs at ``max_concurrent_tasks = 2``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from harness import Target, truncate_public_tables

ENTRYPOINT = "bench"


def pgqueuer_settings(concurrency: int) -> dict[str, int]:
    """``batch_size`` and ``max_concurrent_tasks`` for a per-worker concurrency."""
    cap = max(2, concurrency)
    return {"batch_size": max(1, min(10, cap // 2)), "max_concurrent_tasks": cap}


async def _queries(dsn: str) -> tuple[Any, Any]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    return conn, Queries(AsyncpgDriver(conn))


class PgQueuer:
    name = "pgqueuer"
    dialects = ("postgresql",)

    def install(self, target: Target) -> None:
        async def go() -> None:
            conn, queries = await _queries(target.dsn)
            try:
                await queries.install()
            finally:
                await conn.close()

        asyncio.run(go())

    def reset(self, target: Target) -> None:
        truncate_public_tables(target)

    def enqueue_single(self, target: Target, n: int, tag: str) -> float:
        async def go() -> float:
            conn, queries = await _queries(target.dsn)
            try:
                await queries.enqueue(ENTRYPOINT, b'{"i":-1}')
                started = time.perf_counter()
                for i in range(n):
                    await queries.enqueue(ENTRYPOINT, b'{"i":%d}' % i)
                return time.perf_counter() - started
            finally:
                await conn.close()

        return asyncio.run(go())

    def enqueue_batch(self, target: Target, batches: int, size: int, tag: str) -> float:
        async def go() -> float:
            conn, queries = await _queries(target.dsn)
            try:
                await queries.enqueue(ENTRYPOINT, b'{"i":-1}')
                started = time.perf_counter()
                for _ in range(batches):
                    await queries.enqueue([ENTRYPOINT] * size, [b'{"i":%d}' % i for i in range(size)], [0] * size)
                return time.perf_counter() - started
            finally:
                await conn.close()

        return asyncio.run(go())

    def prefill(self, target: Target, n: int, tag: str) -> float:
        async def go() -> float:
            conn, queries = await _queries(target.dsn)
            try:
                await queries.enqueue([ENTRYPOINT] * n, [b'{"i":%d}' % i for i in range(n)], [0] * n)
                return time.perf_counter()
            finally:
                await conn.close()

        return asyncio.run(go())

    def probe(self, target: Target) -> Any:
        from subjects import _Probe

        # A completed job leaves the queue table; its log row says 'successful'.
        # The periodic log aggregation counts log rows into statistics and marks
        # them ``aggregated`` (pgqueuer 1.6 keeps them): count each row once, as a
        # log row or, once aggregated (and possibly gone), in the statistics.
        return _Probe(
            target,
            "SELECT EXISTS (SELECT 1 FROM pgqueuer)",
            "SELECT (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful' AND NOT aggregated)"
            " + (SELECT coalesce(sum(count), 0) FROM pgqueuer_statistics WHERE status = 'successful')",
        )

    def latency_client(self, target: Target) -> Any:
        return _LatencyClient(target)

    def worker_main(self, target: Target, concurrency: int, defaults: bool, latency: bool) -> None:
        import pgqueuer
        from pgqueuer import PgQueuer as App
        from pgqueuer.db import AsyncpgDriver

        @contextlib.asynccontextmanager
        async def factory() -> AsyncIterator[Any]:
            import asyncpg

            conn = await asyncpg.connect(target.dsn)
            app = App(AsyncpgDriver(conn))

            if latency:

                @app.entrypoint(ENTRYPOINT)
                async def bench(job: Any) -> None:
                    print(f"START {job.payload.decode()} {time.time():.6f}", flush=True)

            else:

                @app.entrypoint(ENTRYPOINT)
                async def bench(job: Any) -> None:
                    return None

            print("READY", flush=True)
            try:
                yield app
            finally:
                await conn.close()

        settings: dict[str, Any] = {} if defaults else dict(pgqueuer_settings(concurrency))
        try:
            import uvloop

            uvloop.run(pgqueuer.run(factory, **settings))
        except ImportError:  # pragma: no cover - uvloop comes with pgqueuer on Linux
            asyncio.run(pgqueuer.run(factory, **settings))


class _LatencyClient:
    def __init__(self, target: Target) -> None:
        self.loop = asyncio.new_event_loop()
        self.conn, self.queries = self.loop.run_until_complete(_queries(target.dsn))

    def enqueue(self, key: str) -> float:
        self.loop.run_until_complete(self.queries.enqueue(ENTRYPOINT, key.encode()))
        return time.time()

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


SUBJECT = PgQueuer()
