"""Through PgBouncer in transaction mode beside direct, in one run.

    python benchmarks/poolers.py [--rounds 3] [--latency-samples 200] [--drain-jobs 20000]

Needs Debian's pgbouncer (``/usr/sbin/pgbouncer``) and the PostgreSQL of
``WATCHDOG_BENCH_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``).
A PgBouncer of the run's own (tests/servers/pgbouncer.py: ``pool_mode =
transaction``, ``default_pool_size = 20``) is started on a loopback port
and stopped at the end. Every row is measured in the same run, direct and
pooled alternating round by round; each cell is the median of the rounds
with the min-max spread.

Rows:

* **start latency** (enqueue commit -> handler start, p50 and p95 over
  ``--latency-samples`` jobs enqueued one at a time with a random 5-300 ms
  gap, so arrivals fall at random phases of a 0.25 s poll; the runner idle): direct (the runner listens), pooled with
  ``wakeups="auto"`` and no listen URL (it polls at 0.25 s), pooled with
  ``listen_engine`` on a direct URL, and ``wakeups="poll"`` direct;
* **drain** (``--drain-jobs`` prefilled jobs, no-op handler, one sync
  ``Runner`` in this process): defaults (concurrency 10) and concurrency 64;
* **enqueue**: 2,000 jobs one per transaction, and 20 batches of 1,000.

Goal (the deployment guide): with ``listen_engine``, within 1.2x of direct
on every row; without it, p50 start latency at most the fast poll interval.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import ADMIN_DSN, create_database, drop_database
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import Job, Runner, RunningJob, enqueue, metadata
from tests.servers.pgbouncer import PgBouncer, available

POOLED_ARGS: dict[str, Any] = {"prepare_threshold": None}


def _engine(url: Any, pooled: bool, pool_size: int = 5) -> Engine:
    return create_engine(url, connect_args=POOLED_ARGS if pooled else {}, pool_size=pool_size, max_overflow=70)


def _reset(direct: Engine) -> None:
    with direct.begin() as conn:
        conn.execute(text("TRUNCATE watchdog_jobs RESTART IDENTITY"))
    with direct.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE watchdog_jobs"))


def _serving(runner: Runner) -> Callable[[], None]:
    thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()

    def stop() -> None:
        runner.stop()
        thread.join(60)

    return stop


def latency(url: Any, direct: Engine, samples: int, *, pooled: bool, **options: Any) -> tuple[float, float]:
    """p50, p95 of commit -> handler start, in milliseconds."""
    _reset(direct)
    started: dict[str, float] = {}
    arrived = threading.Event()

    def handler(job: RunningJob) -> None:
        started[job.job_id] = time.perf_counter()
        arrived.set()

    runner = Runner(_engine(url, pooled), {"lat": handler}, **options)
    producer = _engine(url, pooled)
    stop = _serving(runner)
    try:
        time.sleep(2.5)  # the session proof and the first idle pass
        delays = []
        for i in range(samples):
            job_id = f"lat-{i}"
            arrived.clear()
            with Session(producer) as session:
                enqueue(session, Job(job_id, "lat"))
                session.commit()
                committed = time.perf_counter()
            if not arrived.wait(10):
                raise RuntimeError(f"job {job_id} did not start within 10 s")
            delays.append((started[job_id] - committed) * 1000)
            time.sleep(random.uniform(0.005, 0.3))  # past a whole poll interval: arrivals at random phases
    finally:
        stop()
        runner.engine.dispose()
        producer.dispose()
    delays.sort()
    return statistics.median(delays), delays[int(0.95 * (len(delays) - 1))]


def drain(url: Any, direct: Engine, jobs: int, *, pooled: bool, concurrency: int | None) -> float:
    """Jobs per second of one in-process Runner draining ``jobs`` prefilled jobs."""
    _reset(direct)
    with Session(direct) as session:
        enqueue(session, [Job(f"d-{i}", "drain") for i in range(jobs)])
        session.commit()
    done = threading.Semaphore(0)
    counter = [0]
    lock = threading.Lock()

    def handler(job: RunningJob) -> None:
        with lock:
            counter[0] += 1
            if counter[0] == jobs:
                done.release()

    options: dict[str, Any] = {} if concurrency is None else {"concurrency": concurrency}
    pool = 5 if concurrency is None else concurrency + 3
    runner = Runner(_engine(url, pooled, pool), {"drain": handler}, wakeups="poll", **options)
    gc.collect()
    began = time.perf_counter()
    stop = _serving(runner)
    try:
        if not done.acquire(timeout=600):
            raise RuntimeError("drain did not finish within 600 s")
        elapsed = time.perf_counter() - began
    finally:
        stop()
        runner.engine.dispose()
    return jobs / elapsed


def enqueue_rate(url: Any, direct: Engine, *, pooled: bool, batched: bool) -> float:
    """Jobs per second: 2,000 one per transaction, or 20 x 1,000."""
    _reset(direct)
    engine = _engine(url, pooled)
    tag = uuid.uuid4().hex[:6]
    try:
        with Session(engine) as session:
            enqueue(session, Job(f"{tag}-warm", "enq"))
            session.commit()
        gc.collect()
        began = time.perf_counter()
        if batched:
            for b in range(20):
                with Session(engine) as session:
                    enqueue(session, [Job(f"{tag}-{b}-{i}", "enq", payload={"i": i}) for i in range(1000)])
                    session.commit()
            count = 20_000
        else:
            for i in range(2000):
                with Session(engine) as session:
                    enqueue(session, Job(f"{tag}-{i}", "enq", payload={"i": i}))
                    session.commit()
            count = 2000
        return count / (time.perf_counter() - began)
    finally:
        engine.dispose()


def cell(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=150)
    parser.add_argument("--drain-jobs", type=int, default=20_000)
    args = parser.parse_args()
    if not available():
        print("pgbouncer is not installed (apt-get install pgbouncer)", file=sys.stderr)
        return 2
    target = create_database("poolers")
    direct_url = make_url(target.sqlalchemy_url)
    direct = create_engine(direct_url)
    metadata.create_all(direct)
    bouncer = PgBouncer(make_url(ADMIN_DSN).set(drivername="postgresql+psycopg"))
    bouncer.start()
    pooled_url = bouncer.url(target.name)
    listen = create_engine(direct_url)
    rows: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)
        print(f"  {name}: {value:,.2f}", flush=True)

    try:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1} of {args.rounds}", flush=True)
            n = args.latency_samples
            for label, url, pooled, options in [
                ("direct, auto (listens)", direct_url, False, {}),
                ("pooled, auto, no listen URL (polls 0.25 s)", pooled_url, True, {}),
                ("pooled, auto + listen_engine", pooled_url, True, {"listen_engine": listen}),
                ("direct, poll", direct_url, False, {"wakeups": "poll"}),
            ]:
                p50, p95 = latency(url, direct, n, pooled=pooled, **options)
                record(f"start latency p50 ms | {label}", p50)
                record(f"start latency p95 ms | {label}", p95)
            for concurrency in (None, 64):
                for label, url, pooled in (("direct", direct_url, False), ("pooled", pooled_url, True)):
                    name = "defaults" if concurrency is None else f"concurrency {concurrency}"
                    record(
                        f"drain jobs/s {name} | {label}",
                        drain(url, direct, args.drain_jobs, pooled=pooled, concurrency=concurrency),
                    )
            for batched in (False, True):
                for label, url, pooled in (("direct", direct_url, False), ("pooled", pooled_url, True)):
                    name = "batches of 1,000" if batched else "one per transaction"
                    record(
                        f"enqueue jobs/s {name} | {label}", enqueue_rate(url, direct, pooled=pooled, batched=batched)
                    )
    finally:
        bouncer.stop()
        listen.dispose()
        direct.dispose()
        drop_database(target)
    print("\n| row | median (min-max) |\n| --- | --- |")
    for name, values in rows.items():
        print(f"| {name} | {cell(values, 2 if 'latency' in name else 0)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
