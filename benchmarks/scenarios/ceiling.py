"""The raw-SQL ceiling: pgbench running a batched claim + settle on the
library's own table, beside the library's best drain on the same jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks import harness as h

SCRIPT = Path(__file__).resolve().parents[1] / "pgbench" / "claim_settle.sql"

OPTIONS = {
    **h.JOBS,
    "--clients": {"help": "pgbench clients (comma-separated; default 2,4)"},
    "--batch": {"help": "jobs per claim, pgbench and the library's runner alike (default 64)"},
}


def _pgbench(target: h.Target, clients: int, batch: int, n: int) -> float:
    """Jobs/s of ``clients`` pgbench clients draining ``n`` queued jobs with
    :data:`SCRIPT`, each running its share of the batches; checked drained."""
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        raise h.ScenarioFailed("pgbench is not installed (Debian: postgresql-client)")
    transactions = -(-n // (batch * clients))  # enough for every job; the surplus claims nothing
    command = [
        pgbench, "--no-vacuum", "--file", str(SCRIPT), "--define", f"batch={batch}",
        "--client", str(clients), "--jobs", str(clients), "--transactions", str(transactions),
        target.dsn,
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PGCONNECT_TIMEOUT": "10"})
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise h.ScenarioFailed(f"pgbench failed ({done.returncode}): {done.stderr[-500:]}")
    left = h.run_sql(target, "SELECT count(*) FROM watchdog_jobs WHERE state <> 'settled'")
    if left:
        raise h.ScenarioFailed(f"pgbench left {left} jobs unsettled")
    return n / elapsed


@h.scenario("ceiling", per_repeat=True, options=OPTIONS)
def ceiling(bench: h.Bench, r: int) -> None:
    """Jobs/s of pgbench claiming and settling in batches on the library's table (the raw-SQL ceiling),
    beside the library's c64 p2 drain of as many jobs."""
    if "postgresql" not in bench.dialects():
        return
    table = "ceiling: batched claim + settle (jobs/s), PostgreSQL"
    bench.table(table)
    target = bench.target("watchdog", "postgresql")
    n = bench.opt("jobs", 20_000 if bench.quick else 100_000)
    batch = int(bench.opt("batch", "64"))
    clients = bench.ints("clients", "2,4")
    subject = h.Watchdog()

    for count in clients:

        def raw(count: int = count) -> float:
            subject.reset(target)
            h.insert_jobs(target, n, h.job_rows(f"raw{r}-{count}", state="queued"))
            return _pgbench(target, count, batch, n)

        bench.measure(table, f"raw SQL, pgbench {count} clients", "watchdog", raw, timeout=120 + n / 500)

    def best() -> float:
        return bench.drain_once("watchdog", target, n, f"ceil{r}", 2, concurrency=batch)

    bench.measure(table, f"sqlalchemy_watchdog, c{batch} p2", "watchdog", best, timeout=120 + n / 500)
