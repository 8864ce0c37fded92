"""procrastinate as a benchmark subject (PostgreSQL only).

Set up the way its documentation does: ``App(connector=PsycopgConnector(
conninfo=...))``, the schema from ``app.schema_manager.apply_schema_async()``
(what ``procrastinate schema --apply`` runs), an ``async def`` task on queue
``bench``, jobs deferred with ``defer_async`` / ``batch_defer_async``, and a
worker from ``app.run_worker_async(queues=[...], concurrency=c)``. Finished
jobs stay in ``procrastinate_jobs`` as ``succeeded`` (``delete_jobs``
defaults to ``never``).

``defaults`` runs the worker with its defaults (``concurrency=1``). With a
concurrency ``c`` the connection pool may grow to ``c + 2`` connections so
the pool does not cap the worker (psycopg_pool's default is 4).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from harness import Target, truncate_public_tables

QUEUE = "bench"


def make_app(dsn: str, *, latency: bool = False, **pool: Any) -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, **pool))

    if latency:

        @app.task(queue=QUEUE, name="bench")
        async def bench(i: int | None = None, k: str | None = None) -> None:
            if k is not None:
                print(f"START {k} {time.time():.6f}", flush=True)

    else:

        @app.task(queue=QUEUE, name="bench")
        async def bench(i: int | None = None, k: str | None = None) -> None:
            return None

    return app, bench


class Procrastinate:
    name = "procrastinate"
    dialects = ("postgresql",)

    def install(self, target: Target) -> None:
        async def go() -> None:
            app, _ = make_app(target.dsn)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(go())

    def reset(self, target: Target) -> None:
        truncate_public_tables(target)

    def enqueue_single(self, target: Target, n: int, tag: str) -> float:
        async def go() -> float:
            app, bench = make_app(target.dsn)
            async with app.open_async():
                await bench.defer_async(i=-1)
                started = time.perf_counter()
                for i in range(n):
                    await bench.defer_async(i=i)
                return time.perf_counter() - started

        return asyncio.run(go())

    def enqueue_batch(self, target: Target, batches: int, size: int, tag: str) -> float:
        async def go() -> float:
            app, bench = make_app(target.dsn)
            async with app.open_async():
                await bench.defer_async(i=-1)
                started = time.perf_counter()
                for _ in range(batches):
                    await bench.batch_defer_async(*({"i": i} for i in range(size)))
                return time.perf_counter() - started

        return asyncio.run(go())

    def prefill(self, target: Target, n: int, tag: str) -> float:
        async def go() -> float:
            app, bench = make_app(target.dsn)
            async with app.open_async():
                await bench.batch_defer_async(*({"i": i} for i in range(n)))
                return time.perf_counter()

        return asyncio.run(go())

    def probe(self, target: Target) -> Any:
        from subjects import _Probe

        return _Probe(
            target,
            "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))",
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        )

    def latency_client(self, target: Target) -> Any:
        return _LatencyClient(target)

    def worker_main(self, target: Target, concurrency: int, defaults: bool, latency: bool) -> None:
        pool = {} if defaults else {"min_size": min(4, concurrency + 2), "max_size": max(4, concurrency + 2)}
        app, _ = make_app(target.dsn, latency=latency, **pool)
        options: dict[str, Any] = {"queues": [QUEUE], "install_signal_handlers": True}
        if not defaults:
            options["concurrency"] = concurrency

        async def go() -> None:
            async with app.open_async():
                print("READY", flush=True)
                await app.run_worker_async(**options)

        asyncio.run(go())


class _LatencyClient:
    def __init__(self, target: Target) -> None:
        self.loop = asyncio.new_event_loop()
        self.app, self.bench = make_app(target.dsn)
        self.loop.run_until_complete(self.app.connector.open_async())

    def enqueue(self, key: str) -> float:
        self.loop.run_until_complete(self.bench.defer_async(k=key))
        return time.time()

    def close(self) -> None:
        self.loop.run_until_complete(self.app.close_async())
        self.loop.close()


SUBJECT = Procrastinate()
