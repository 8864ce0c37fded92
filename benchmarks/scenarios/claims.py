"""Claim + settle below the runner's machinery: the raw-SQL ceiling (pgbench running a batched
claim + settle on the library's own table, beside the library's best drain of as many jobs),
and dependencies (revision w0012; store calls in one process, as a runner makes them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from functools import partial
from typing import Any

from benchmarks import harness as h
from sqlalchemy_watchdog import Decision, Job, Watchdog, store

SCRIPT = h.HERE / "pgbench" / "claim_settle.sql"


def _pgbench(target: h.Target, clients: int, batch: int, n: int, tag: str) -> float:
    """Jobs/s of ``clients`` pgbench clients draining ``n`` freshly queued jobs with :data:`SCRIPT`, each
    running its share of the batches; fails unless every job settled."""
    if (pgbench := shutil.which("pgbench")) is None:
        raise h.ScenarioFailed("pgbench is not installed (Debian: postgresql-client)")
    h.truncate(target)
    h.insert_jobs(target, n, h.job_rows(tag, state="queued"))
    transactions = -(-n // (batch * clients))  # enough for every job; the surplus claims nothing
    command = [
        pgbench, "--no-vacuum", "--file", str(SCRIPT), "--define", f"batch={batch}",
        "--client", str(clients), "--jobs", str(clients), "--transactions", str(transactions), target.dsn,
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PGCONNECT_TIMEOUT": "10"})
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise h.ScenarioFailed(f"pgbench failed ({done.returncode}): {done.stderr[-500:]}")
    if left := h.run_sql(target, "SELECT count(*) FROM watchdog_jobs WHERE state <> 'settled'"):
        raise h.ScenarioFailed(f"pgbench left {left} jobs unsettled")
    return n / elapsed


@h.scenario("ceiling", per_repeat=True, options="jobs clients batch")
def ceiling(bench: h.Bench, r: int) -> None:
    """Jobs/s of pgbench claiming and settling in batches on the library's table (the raw-SQL ceiling),
    beside the library's c64 p2 drain of as many jobs."""
    if "postgresql" not in bench.dialects():
        return
    table, target = "ceiling: batched claim + settle (jobs/s), PostgreSQL", bench.target("watchdog", "postgresql")
    n, batch = bench.opt("jobs", 20_000 if bench.quick else 100_000), int(bench.opt("batch", "64"))
    for count in bench.ints("clients", "2,4"):
        raw = partial(_pgbench, target, count, batch, n, f"raw{r}-{count}")
        bench.measure(table, f"raw SQL, pgbench {count} clients", "watchdog", raw, timeout=120 + n / 500)
    best = partial(bench.drain_once, "watchdog", target, n, f"ceil{r}", 2, concurrency=batch)
    bench.measure(table, f"sqlalchemy_watchdog, c{batch} p2", "watchdog", best, timeout=120 + n / 500)


def _claimed_all(eng: Any, queue: str, jobs: list[Job]) -> float:
    """Enqueue ``jobs`` (untimed), then ms per job of claiming and settling them one by one until the
    claim comes back empty: two transactions each, as a runner makes them."""
    Watchdog(eng).enqueue(jobs)
    started, done = time.perf_counter(), 0
    while True:
        with store.write_transaction(eng) as conn:
            claimed = store.claim(conn, queues=[queue], limit=1, lease_ms=60_000).claimed
        if not claimed:
            break
        with store.write_transaction(eng) as conn:
            store.settle(
                conn, job_id=claimed[0].job.job_id, claim_token=claimed[0].token, decision=Decision.completed()
            )
        done += 1
    if done != len(jobs):
        raise h.ScenarioFailed(f"{queue}: claimed {done} of {len(jobs)} jobs")
    return (time.perf_counter() - started) * 1000 / len(jobs)


@h.scenario("dependencies", suite=True, options="parents links")
def dependencies(bench: h.Bench) -> None:
    """Fan-in of 1,000 parents, a 10,000-job chain per link, and claim+settle without dependencies."""
    parents, links = bench.opt("parents", 1_000, 100), bench.opt("links", 10_000, 200)
    table = "dependencies, watchdog (in one process, store calls as a runner makes them)"
    for dialect in bench.dialects():
        with (
            bench.database(dialect, "deps", fails=f"{dialect} dependencies") as target,
            h.disposed(h.engine(target)) as eng,
        ):
            for r in range(bench.repeat):
                # Claim + settle with no dependencies: the baseline of the two below.
                plain = _claimed_all(eng, f"plain-{r}", [Job(f"plain-{r}-{n}", f"plain-{r}") for n in range(links)])
                bench.record(table, "claim + settle, no dependencies (ms per job)", dialect, plain)
                # A chain: each link released by the settle of the one before.
                chain = [
                    Job(f"link-{r}-{n}", f"chain-{r}", after=[f"link-{r}-{n - 1}"] if n else None) for n in range(links)
                ]
                per_link = _claimed_all(eng, f"chain-{r}", chain)
                bench.record(table, f"chain of {links:,}: claim + settle per link (ms)", dialect, per_link)
                # A fan-in: the last parent's settle releases the child.
                fan = [Job(f"parent-{r}-{n}", f"fan-{r}") for n in range(parents)]
                Watchdog(eng).enqueue([*fan, Job(f"child-{r}", f"child-{r}", after=[j.job_id for j in fan])])
                with store.write_transaction(eng) as conn:
                    claimed = store.claim(conn, queues=[f"fan-{r}"], limit=parents, lease_ms=600_000).claimed
                requests = [store.SettleRequest(c.job.job_id, c.token, Decision.completed()) for c in claimed]
                started = time.perf_counter()
                for start in range(0, len(requests), 100):  # a runner settles in batches
                    with store.write_transaction(eng) as conn:
                        store.settle_many(conn, requests[start : start + 100])
                seconds = time.perf_counter() - started
                child = Watchdog(eng).read(f"child-{r}")
                assert child is not None and child.state.value == "queued", child
                bench.record(table, f"fan-in of {parents:,}: settle every parent (ms)", dialect, seconds * 1000)
                bench.log(f"{dialect}: plain {plain:.2f} ms/job, chain {per_link:.2f} ms/link, fan-in {seconds:.2f}s")
