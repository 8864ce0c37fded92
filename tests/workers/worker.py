"""A runner process for the subprocess tests (``tests/integration/test_runner_processes.py``).

    python tests/workers/worker.py URL --handle QUEUE=KIND [--handle ...]
        [--sleep-ms N] [--lease S] [--heartbeat S] [--grace S] [--poll S]
        [--concurrency N] [--asyncio]

Builds a :class:`sqlalchemy_watchdog.Runner` on the database at ``URL`` and
calls ``run_forever()`` (SIGTERM/SIGINT stop it gracefully). With
``--asyncio`` it runs an ``AsyncRunner`` on an ``AsyncEngine`` instead, as
``asyncio.run(runner.run_forever())``, with coroutine handlers (``work``,
``block``; a stop cancels their task) and the plain ``hang`` (a blocking
call that ignores every stop, run in a thread). Every handler
writes to the ``audit`` table (``job_id``, ``pid``, ``event``) of the same
database, which the test creates; a ``ready`` row (job_id ``-``) is written
before the runner starts. Handler kinds:

``work``
    writes ``started``, sleeps ``--sleep-ms``, returns None (completed).
``block``
    writes ``started``, waits for ``stop_requested``, writes
    ``stopped:<stop_reason>``, returns None.
``hang``
    writes ``started``, then sleeps forever, ignoring ``stop_requested``.

The coroutine twins write the same rows (through a thread: the audit uses
the sync engine); ``block`` records ``stopped:<stop_reason>`` when its task
is cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from sqlalchemy_watchdog import Runner, RunningJob
from sqlalchemy_watchdog.asyncio import AsyncRunner

AUDIT = text("INSERT INTO audit (job_id, pid, event) VALUES (:job_id, :pid, :event)")


def audit(engine: Engine, job_id: str, event: str) -> None:
    with engine.begin() as conn:
        conn.execute(AUDIT, {"job_id": job_id, "pid": os.getpid(), "event": event})


def make_handler(engine: Engine, kind: str, sleep_ms: int) -> Callable[[RunningJob], Any]:
    def work(job: RunningJob) -> None:
        audit(engine, job.job_id, "started")
        time.sleep(sleep_ms / 1000)

    def block(job: RunningJob) -> None:
        audit(engine, job.job_id, "started")
        job.stop_requested.wait(300)
        reason = job.stop_reason.value if job.stop_reason is not None else "timeout"
        audit(engine, job.job_id, f"stopped:{reason}")

    def hang(job: RunningJob) -> None:
        audit(engine, job.job_id, "started")
        while True:
            time.sleep(3600)

    return {"work": work, "block": block, "hang": hang}[kind]


def make_async_handler(engine: Engine, kind: str, sleep_ms: int) -> Callable[[RunningJob], Any]:
    async def work(job: RunningJob) -> None:
        await asyncio.to_thread(audit, engine, job.job_id, "started")
        await asyncio.sleep(sleep_ms / 1000)

    async def block(job: RunningJob) -> None:
        await asyncio.to_thread(audit, engine, job.job_id, "started")
        try:
            await asyncio.sleep(300)
        except asyncio.CancelledError:
            reason = job.stop_reason.value if job.stop_reason is not None else "unknown"
            await asyncio.to_thread(audit, engine, job.job_id, f"stopped:{reason}")
            raise
        await asyncio.to_thread(audit, engine, job.job_id, "stopped:timeout")

    if kind == "hang":
        return make_handler(engine, kind, sleep_ms)  # a blocking call: a thread
    return {"work": work, "block": block}[kind]


def async_url(url: str) -> str:
    """``url`` with the async driver of its database: aiosqlite, aiomysql
    (MariaDB and MySQL), async psycopg."""
    backend, rest = url.split(":", 1)
    name = backend.split("+", 1)[0]
    if name == "sqlite":
        return "sqlite+aiosqlite:" + rest
    if name in ("mysql", "mariadb"):
        return f"{name}+aiomysql:" + rest
    return "postgresql+psycopg:" + rest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--handle", action="append", required=True, metavar="QUEUE=KIND")
    parser.add_argument("--sleep-ms", type=int, default=0)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--asyncio", action="store_true", help="run an AsyncRunner instead")
    args = parser.parse_args(argv)

    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s [{os.getpid()}] %(name)s %(levelname)s %(message)s",
    )
    engine = create_engine(args.url)
    make = make_async_handler if args.asyncio else make_handler
    handlers = {}
    for spec in args.handle:
        queue, _, kind = spec.partition("=")
        handlers[queue] = make(engine, kind, args.sleep_ms)
    settings: dict[str, Any] = dict(
        concurrency=args.concurrency,
        lease=timedelta(seconds=args.lease),
        heartbeat=timedelta(seconds=args.heartbeat),
        grace=timedelta(seconds=args.grace),
        poll_interval=timedelta(seconds=args.poll),
    )
    if args.asyncio:

        async def serve() -> None:
            aengine = create_async_engine(async_url(args.url))
            try:
                await AsyncRunner(aengine, handlers, **settings).run_forever()
            finally:
                await aengine.dispose()

        audit(engine, "-", "ready")
        asyncio.run(serve())
    else:
        runner = Runner(engine, handlers, **settings)
        audit(engine, "-", "ready")
        runner.run_forever()
    engine.dispose()


if __name__ == "__main__":
    main()
