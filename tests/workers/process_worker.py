"""A runner process with the process executor, for tests/faults/test_executor_faults.py.

    python tests/workers/process_worker.py URL [--processes N] [--lease S]
        [--heartbeat S] [--grace S] [--asyncio]

Serves the queues ``block`` (:func:`tests.process_handlers.blocking`),
``stubborn`` (:func:`tests.process_handlers.stubborn`), ``pid``
(:func:`tests.process_handlers.pid`), ``hog`` (:func:`tests.process_handlers.hog`),
``chatty`` (:func:`tests.process_handlers.chatty`) and ``floods``
(:func:`tests.process_handlers.floods`) with ``Runner(...,
executor=ProcessExecutor(processes=N, kill_grace=1s))`` -- or an
``AsyncRunner`` with ``--asyncio`` -- until SIGTERM/SIGINT. Prints
``process-worker ready`` once the runner is built.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from datetime import timedelta

from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from sqlalchemy_watchdog import ProcessExecutor, Runner
from sqlalchemy_watchdog.asyncio import AsyncRunner
from tests import process_handlers as h


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--grace", type=float, default=0.5)
    parser.add_argument("--asyncio", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    options = {
        "executor": ProcessExecutor(processes=args.processes, kill_grace=timedelta(seconds=1)),
        "lease": timedelta(seconds=args.lease),
        "heartbeat": timedelta(seconds=args.heartbeat),
        "grace": timedelta(seconds=args.grace),
        "poll_interval": timedelta(milliseconds=100),
    }
    handlers = {
        "block": h.blocking,
        "stubborn": h.stubborn,
        "pid": h.pid,
        "hog": h.hog,
        "chatty": h.chatty,
        "floods": h.floods,
    }
    if args.asyncio:
        url = async_url(args.url)

        async def serve() -> None:
            runner = AsyncRunner(create_async_engine(url), handlers, **options)  # type: ignore[arg-type]
            print("process-worker ready", flush=True)
            await runner.run_forever()

        asyncio.run(serve())
        return
    runner = Runner(create_engine(args.url), handlers, **options)  # type: ignore[arg-type]
    print("process-worker ready", flush=True)
    runner.run_forever()


if __name__ == "__main__":
    main()
