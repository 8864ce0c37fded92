"""A runner process for the subprocess tests (``tests/test_runner_processes.py``).

    python tests/workers/worker.py URL --handle QUEUE=KIND [--handle ...]
        [--sleep-ms N] [--lease S] [--heartbeat S] [--grace S] [--poll S]
        [--concurrency N]

Builds a :class:`sqlalchemy_watchdog.Runner` on the database at ``URL`` and
calls ``run_forever()`` (SIGTERM/SIGINT stop it gracefully). Every handler
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
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, create_engine, text

from sqlalchemy_watchdog import Runner, RunningJob

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
    args = parser.parse_args(argv)

    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s [{os.getpid()}] %(name)s %(levelname)s %(message)s",
    )
    engine = create_engine(args.url)
    handlers = {}
    for spec in args.handle:
        queue, _, kind = spec.partition("=")
        handlers[queue] = make_handler(engine, kind, args.sleep_ms)
    runner = Runner(
        engine,
        handlers,
        concurrency=args.concurrency,
        lease=timedelta(seconds=args.lease),
        heartbeat=timedelta(seconds=args.heartbeat),
        grace=timedelta(seconds=args.grace),
        poll_interval=timedelta(seconds=args.poll),
    )
    audit(engine, "-", "ready")
    runner.run_forever()
    engine.dispose()


if __name__ == "__main__":
    main()
