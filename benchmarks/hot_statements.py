#!/usr/bin/env python3
"""What a drained job costs the client and the server, without a runner around it.

    .venv/bin/python benchmarks/hot_statements.py [--jobs 20000] [--batches 1,10,50] [--rounds 3]

One database of its own on the PostgreSQL server of ``WATCHDOG_BENCH_POSTGRES``
(dropped at the end), the table as ``metadata.create_all`` makes it. Per batch
size ``b`` and round: ``--jobs`` jobs are enqueued (untimed, then ``VACUUM
ANALYZE``), then one thread claims ``b`` jobs (``store.claim``) and settles
them ``completed`` (``store.settle_many``), one autocommit statement each, on one
held connection -- what the runner's loop and settler send -- until none is
left. Reported per job: wall time, the client's CPU (this process) and the
server's CPU (the backend's ``utime + stime`` from ``/proc``; the server must
run on this machine). The figures isolate the statements from the runner's
threads: what a drain at that batch size cannot go below.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness
import psycopg
from sqlalchemy import Connection, Engine, create_engine, text

from sqlalchemy_watchdog import Decision, Job, store
from sqlalchemy_watchdog.model import WatchdogBase

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the server process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def claim_and_settle(conn: Connection, batch: int) -> int:
    """Claim up to ``batch`` jobs and settle them completed, as a runner's
    loop and settler do; how many there were."""
    claimed = store.claim(conn, queues=["q"], limit=batch, lease_ms=60_000).claimed
    if not claimed:
        return 0
    settled = store.settle_many(
        conn, [store.SettleRequest(c.job.job_id, c.token, Decision.completed()) for c in claimed]
    )
    assert all(s.status is store.SettleStatus.SETTLED for s in settled)
    return len(claimed)


def one_round(target: harness.Target, engine: Engine, jobs: int, batch: int, tag: str) -> tuple[float, float, float]:
    """(wall, client CPU, server CPU) in microseconds per job."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE watchdog_jobs"))
        for start in range(0, jobs, 1000):
            store.enqueue(
                conn,
                [Job(job_id=f"{tag}-{i}", queue="q", payload={"i": i}) for i in range(start, min(jobs, start + 1000))],
            )
    with psycopg.connect(target.dsn, autocommit=True) as admin:
        admin.execute("VACUUM ANALYZE watchdog_jobs")
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        for _ in range(10):  # warm-up: psycopg prepares a statement after its fifth execution
            claim_and_settle(conn, 1)
        done = 10
        wall0, cpu0, server0 = time.perf_counter(), time.process_time(), backend_cpu_s(pid)
        while taken := claim_and_settle(conn, batch):
            done += taken
        wall, cpu, server = time.perf_counter() - wall0, time.process_time() - cpu0, backend_cpu_s(pid) - server0
    measured = done - 10
    assert measured == jobs - 10, (measured, jobs)
    return wall / measured * 1e6, cpu / measured * 1e6, server / measured * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batches", default="1,10,50")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    target = harness.create_database("hot")
    try:
        engine = create_engine(target.sqlalchemy_url)
        WatchdogBase.metadata.create_all(engine)
        results: dict[int, list[tuple[float, float, float]]] = {b: [] for b in batches}
        for r in range(args.rounds):
            for b in batches if r % 2 == 0 else reversed(batches):
                results[b].append(one_round(target, engine, args.jobs, b, f"r{r}b{b}"))
                wall, cpu, server = results[b][-1]
                print(
                    f"round {r + 1} batch {b}: wall {wall:.0f}, client {cpu:.0f}, server {server:.0f} us/job",
                    file=sys.stderr,
                )
        engine.dispose()
    finally:
        harness.drop_all_created()
    print(f"\nload: {os.getloadavg()[0]:.2f}; {args.jobs:,} jobs per round, medians of {args.rounds} (min-max)\n")
    print("| jobs per statement | wall (us/job) | client CPU (us/job) | server CPU (us/job) |")
    print("| --- | --- | --- | --- |")
    for b in batches:
        cols = []
        for i in range(3):
            values = [run[i] for run in results[b]]
            cols.append(f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})")
        print(f"| {b} | " + " | ".join(cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
