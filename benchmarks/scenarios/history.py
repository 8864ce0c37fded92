"""watchdog beside a long table: claims next to settled or delayed jobs, delayed-start
lateness, claim latency while a runner prunes, and the operations reads."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from benchmarks import harness as h
from sqlalchemy_watchdog import Watchdog as Client

#: Delayed jobs are due from a day after the insert on, one second apart: none becomes due during a run.
DUE = f"({{clock}} + {h.DAY_MS} + n * 1000)"
DELAYED = h.job_rows("delayed", "delayed", run_at=DUE, ready_at=DUE)
#: Completed jobs settled from 8 days before the insert on going back, one second apart,
#: all past the pruning runner's retention (7 days).
OLD = f"({{clock}} - 8 * {h.DAY_MS} - CAST(:rows - n AS BIGINT) * 1000)"
PRUNABLE = h.job_rows("old", at=OLD)


def _beside(bench: h.Bench, name: str, what: str, columns: dict[str, str]) -> None:
    """Claim+settle ms/job in an empty table and in one holding ``--rows`` jobs of ``columns``, in
    alternating rounds so a change in machine load hits both; the ratio of the medians."""
    rows, (jobs, per_round) = bench.opt("rows", 1_000_000, 100_000), (200, 100) if bench.quick else (2000, 250)
    table = f"claim+settle one job at a time, watchdog (ms/job, rounds; ratio {what} / empty)"
    for dialect in bench.dialects():
        with bench.database(dialect, f"{name}_empty", fails=f"{dialect} {name}") as empty:
            with bench.database(dialect, f"{name}_full") as full:
                with h.deadline(900, f"{dialect}: inserting {rows:,} rows"):
                    seconds = h.insert_jobs(full, rows, columns)
                bench.log(f"{dialect}: {rows:,} {what} inserted and analysed in {seconds:.1f}s")
                for r in range(bench.repeat):
                    h.truncate(empty)
                    rounds: dict[str, list[float]] = {"empty": [], what: []}
                    for k in range(max(1, jobs // per_round)):
                        for label, target in h.rotate([("empty", empty), (what, full)], k):
                            with h.deadline(300, f"{name} round"):
                                rounds[label].append(
                                    h.Watchdog().claim_settle(target, per_round, f"{label[:5]}-{r}-{k}")
                                )
                    for label, values in rounds.items():
                        for value in values:
                            bench.record(table, "empty" if label == "empty" else f"{rows:,} {what}", dialect, value)
                    ratio = (h.median(rounds[what]) or 0) / (h.median(rounds["empty"]) or 1)
                    bench.record(table, "ratio", dialect, ratio)
                    bench.log(f"{dialect} {name}: ratio {ratio:.2f}x")
                still = h.run_sql(full, "SELECT count(*) FROM watchdog_jobs WHERE state = 'delayed'")
                if name == "delayed" and still != rows:  # none may have become due (and run) meanwhile
                    raise h.ScenarioFailed(f"{dialect}: {still:,} of {rows:,} jobs still delayed")
            goal = f"{dialect}: claim cost with {rows:,} {what} <= 1.3x empty"
            bench.check_median(goal, table, "ratio", dialect, lambda m: m <= 1.3)


#: The two scenarios that differ only in the history beside the claims -> (its rows, their columns, help).
BESIDE = {
    "claim": ("settled rows", h.SETTLED, "Claim+settle ms/job beside 1,000,000 settled jobs vs an empty table."),
    "delayed": ("delayed jobs", DELAYED, "Claim+settle ms/job beside 1,000,000 jobs delayed far ahead vs empty."),
}
for name, (what, history, text) in BESIDE.items():
    h.scenario(name, suite=True, options="rows", help=text)(partial(_beside, name=name, what=what, columns=history))


def _enqueue_due(client: Any, key: str) -> float:
    """One job due a random 0.1-1.0 s from now (in whole ms, as stored); when it is due."""
    due_ms = round((time.time() + random.uniform(0.1, 1.0)) * 1000.0)
    client.enqueue(key, run_at=datetime.fromtimestamp(due_ms / 1000.0, UTC))
    return due_ms / 1000.0


@h.scenario("lateness", per_repeat=True, suite=True, options="samples")
def lateness(bench: h.Bench, r: int) -> None:
    """Handler start - run_at (ms) of delayed jobs, an idle runner."""
    samples, warmup = bench.opt("samples", 100, 10), (2 if bench.quick else 3)
    table = "delayed start lateness, idle runner, watchdog (run_at 0.1-1.0 s after each enqueue)"
    for dialect in bench.dialects():
        target, tag = bench.target("watchdog", dialect), f"late-{dialect}-{r}"

        late = partial(bench.latencies, "watchdog", target, tag, warmup, samples, _enqueue_due, never_early=True)
        once = lambda late=late: {**h.percentiles(values := late()), "max (ms)": max(values)}
        bench.measure(table, "", dialect, once, timeout=120 + (warmup + samples) * 2)


def _prunable(target: h.Target) -> int:
    sql = f"SELECT count(*) FROM watchdog_jobs WHERE state = 'settled' AND settled_at < {h.CLOCK_SQL[target.dialect]} - {h.DAY_MS}"
    return int(h.run_sql(target, sql))


def _prune_round(bench: h.Bench, target: h.Target, prune: bool, tag: str, samples: int) -> dict[str, Any]:
    """One round of the prune row (README.md; ``prune``: with retention): latencies and what went."""
    options = {"retention_days": 7} if prune else {}
    with bench.idle_worker("watchdog", target, tag, **options) as (child, client):
        before = _prunable(target)
        if prune:  # measure only once the runner is deleting: its first batch has gone
            if before == 0:
                raise h.ScenarioFailed(f"{tag}: every old row was pruned before the round began; raise --rows")
            went = lambda: _prunable(target) < before
            h.poll_until(went, timeout=60, interval=0.05, what="pruning", children=[child])
            before = _prunable(target)
        started = time.perf_counter()
        values = bench.start_latencies(child, client.enqueue, tag, 2 if bench.quick else 3, samples, (0.03, 0.33))
        elapsed, after = time.perf_counter() - started, _prunable(target)
    if prune and after == 0:
        raise h.ScenarioFailed(f"{tag}: every old row was pruned before the round ended; raise --rows")
    if prune and after >= before:
        raise h.ScenarioFailed(f"{tag}: the runner pruned nothing during the round")
    if not prune and after != before:
        raise h.ScenarioFailed(f"{tag}: {before - after} old rows vanished without retention")
    return {"samples": values, "pruned": before - after, "seconds": elapsed}


@h.scenario("prune", suite=True, options="rows samples")
def prune(bench: h.Bench) -> None:
    """Claim latency (ms) of a runner while it prunes 1,000,000 old settled jobs vs without."""
    rows, samples = bench.opt("rows", 1_000_000, 100_000), bench.opt("samples", 200, 20)
    per_round = min(samples, 20 if bench.quick else 50)
    table = f"claim latency while pruning {rows:,} old jobs, watchdog (enqueue commit -> handler start)"
    for dialect in bench.dialects():
        with bench.database(dialect, "prune", fails=f"{dialect} prune") as target:
            for r in range(bench.repeat):
                h.truncate(target)  # every repeat starts from the whole history
                with h.deadline(900, "inserting the old jobs"):
                    seconds = h.insert_jobs(target, rows, PRUNABLE)
                bench.log(f"{dialect}: {rows:,} old settled jobs inserted and analysed in {seconds:.1f}s")
                got: dict[bool, list[float]] = {False: [], True: []}
                pruned = seconds = 0.0
                for k in range(max(1, samples // per_round)):
                    for mode in h.rotate([False, True], k):
                        tag = f"{dialect}-prune-{r}-{k}-{'pruning' if mode else 'plain'}"
                        with h.deadline(300, tag):
                            result = _prune_round(bench, target, mode, tag, per_round)
                        got[mode] += result["samples"]
                        pruned += result["pruned"] if mode else 0
                        seconds += result["seconds"] if mode else 0
                ratio = h.percentile(got[True], 99) / h.percentile(got[False], 99)
                figures: dict[str, float | None] = {
                    **h.percentiles(got[False], (50, 99)),
                    **h.percentiles(got[True], (50, 99), "p{} pruning (ms)"),
                }
                figures |= {"p99 ratio": ratio, "pruned (rows/s)": pruned / seconds if seconds else None}
                for row, value in figures.items():
                    bench.record(table, row, dialect, value)
                bench.log(f"{dialect} prune: p99 ratio {ratio:.2f}x, {pruned:,.0f} rows pruned")
            goal = f"{dialect}: claim latency p99 while pruning <= 2x without"
            bench.check_median(goal, table, "p99 ratio", dialect, lambda m: m <= 2)


STATS_QUEUES = 10
#: Settled jobs spread evenly over the last 30 days (1/720 in the last hour), one in 20
#: failed; then the queued ones over the last hour; round-robin over 10 queues.
STATS_AT = f"({h.CLOCK_SQL['postgresql']} - CAST(:rows - n + 1 AS BIGINT) * :step)"
STATS_QUEUE = f"'stats-' || mod(n, {STATS_QUEUES})"
STATS_SETTLED = h.job_rows("settled", at=STATS_AT, queue_name=STATS_QUEUE, lane=STATS_QUEUE, outcome=h.FAILED_1_IN_20)
STATS_QUEUED = h.job_rows("queued", "queued", queue_name=STATS_QUEUE, lane=STATS_QUEUE, enqueued_at=STATS_AT)


@h.scenario("stats", suite=True, options="rows samples")
def stats(bench: h.Bench) -> None:
    """stats() and list_jobs() ms beside 1,000,000 settled and 100,000 queued jobs, PostgreSQL."""
    settled, calls = bench.opt("rows", 1_000_000, 200_000), bench.opt("samples", 200, 30)
    queued = max(1000, settled // 10)
    with bench.database("postgresql", "stats") as target, h.disposed(h.engine(target)) as eng:
        with h.deadline(900, "inserting the stats history"):
            seconds = h.insert_jobs(target, settled, STATS_SETTLED, analyse=False, step=30 * h.DAY_MS // settled)
            seconds += h.insert_jobs(target, queued, STATS_QUEUED, step=3_600_000 // queued)
        bench.log(f"stats history inserted and analysed in {seconds:.1f}s")
        client = Client(eng)
        snapshot, last_hour = client.stats(), settled // 720
        counted = sum(q.queued for q in snapshot.queues)
        recent = sum(sum(q.settled_last_hour.values()) for q in snapshot.queues)
        if counted != queued or len(snapshot.queues) != STATS_QUEUES:
            raise h.ScenarioFailed(f"stats: {counted:,} queued in {len(snapshot.queues)} queues")
        if not 0.5 * last_hour <= recent <= last_hour + 1:  # the last hour loses its oldest rows as time passes
            raise h.ScenarioFailed(f"stats: {recent:,} settled in the last hour, expected about {last_hour:,}")
        table = f"operations reads, PostgreSQL, watchdog ({settled:,} settled over 30 days, {queued:,} queued)"
        reads: dict[str, Callable[[], Any]] = {
            "stats()": client.stats,
            "list_jobs(limit=100), first page": lambda: client.list_jobs(limit=100),
            "list_jobs(state='queued', limit=100), first page": lambda: client.list_jobs(state="queued", limit=100),
        }
        for name, read in [*reads.items()] * bench.repeat:
            bench.measure(table, name, "watchdog", lambda read=read: h.percentiles(h.time_calls(read, calls), (50, 99)))
        goal = f"stats() < 50 ms with {settled:,} settled and {queued:,} queued jobs (median)"
        bench.check_median(goal, table, "stats() p50 (ms)", "watchdog", lambda m: m < 50, " ms")
