#!/usr/bin/env python3
"""The sqlalchemy_watchdog benchmark, with procrastinate and pgqueuer side by side.

    .venv/bin/python benchmarks/run.py [--quick] [--repeat N] [--json out.json]

Starts from empty databases (``watchdog_bench_<pid>_*`` on the PostgreSQL
server of ``WATCHDOG_BENCH_POSTGRES``, default
``postgresql://postgres@127.0.0.1:5432/postgres``, and SQLite files in a
temporary directory), runs every workload ``--repeat`` times per queue,
prints the medians as a table with ratios against watchdog, and drops its
databases. See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import harness
import round2
from harness import (
    Child,
    ScenarioFailed,
    ScenarioTimeout,
    Target,
    median,
    percentile,
    poll_until,
    stop_all,
)

SUBJECT_MODULES = {
    "watchdog": "subjects",
    "procrastinate": "peers.procrastinate_peer",
    "pgqueuer": "peers.pgqueuer_peer",
}
PEERS = ("procrastinate", "pgqueuer")


def load_subject(name: str) -> Any:
    return importlib.import_module(SUBJECT_MODULES[name]).SUBJECT


# -- configuration ----------------------------------------------------------------------


@dataclass
class Config:
    repeat: int = 3
    quick: bool = False
    #: jobs enqueued one per transaction, per subject
    single: dict[str, int] = field(default_factory=lambda: {"watchdog": 2000, "procrastinate": 1000, "pgqueuer": 2000})
    #: transactions of BATCH_SIZE jobs (one call each)
    batches: int = 10
    batch_size: int = 1000
    #: jobs drained per measurement, per subject (procrastinate drains ~100/s)
    #: (20,000 since the drain reached 10,000 jobs/s: a 5,000-job drain lasted half a
    #: second, and its wake-up and the second process's first claim moved it by a third)
    drain: dict[str, int] = field(default_factory=lambda: {"watchdog": 20000, "procrastinate": 1500, "pgqueuer": 20000})
    #: 64: what a no-op drain gains from claiming and settling 50-64 jobs per statement
    concurrencies: tuple[int, ...] = (1, 4, 16, 64)
    processes: tuple[int, ...] = (1, 2)
    #: AsyncRunner drains (watchdog only, PostgreSQL, one process)
    async_concurrencies: tuple[int, ...] = (4, 16, 64)
    latency_samples: int = 200
    latency_warmup: int = 5
    claim_jobs: int = 2000
    #: jobs per alternation between the empty and the long table
    claim_round: int = 250
    history_rows: int = 1_000_000
    #: jobs delayed far into the future beside the claimed ones ("delayed")
    delayed_rows: int = 1_000_000
    #: delayed-start lateness samples per run and dialect, after the warm-up
    lateness_samples: int = 100
    lateness_warmup: int = 3
    #: each lateness job's run_at is this many seconds after the enqueue (uniform)
    lateness_lead: tuple[float, float] = (0.1, 1.0)
    #: settled jobs older than the retention that a runner prunes while it serves ("prune")
    prune_rows: int = 1_000_000
    #: jobs enqueued one at a time per runner mode (without / while pruning), in rounds
    prune_samples: int = 200
    prune_round: int = 50
    prune_warmup: int = 3
    #: "stats": settled jobs spread over 30 days, queued jobs, calls timed per read
    stats_settled: int = 1_000_000
    stats_queued: int = 100_000
    stats_calls: int = 200
    sqlite_single: int = 300
    sqlite_drain: int = 500
    sqlite_concurrencies: tuple[int, ...] = (1, 4)
    #: drain rows to run, by a part of their key ("defaults", "c16", "async"); None: all
    drain_rows: tuple[str, ...] | None = None
    poll_pg: float = 0.005
    poll_sqlite: float = 0.02
    # -- round 2 (benchmarks/round2.py)
    #: "txn": samples per kind (enqueue / session.add, 1 and 100 rows)
    txn_samples: int = 300
    #: "producers": processes enqueueing at once, and jobs each (one per transaction)
    producers: int = 16
    producer_jobs: dict[str, int] = field(
        default_factory=lambda: {"watchdog": 300, "procrastinate": 150, "pgqueuer": 300}
    )
    #: "inprocess": Runner / AsyncRunner concurrencies (drain["watchdog"] jobs each)
    inprocess_concurrencies: tuple[int, ...] = (4,)
    #: "scaleout": runner processes of scaleout_concurrency each, draining scaleout_jobs
    scaleout_processes: tuple[int, ...] = (1, 2, 4, 8)
    scaleout_concurrency: int = 4
    scaleout_jobs: int = 5000
    #: "scale": settled history, jobs scheduled in the future, queued backlog; timed calls
    scale_settled: int = 1_000_000
    scale_scheduled: int = 1_000_000
    scale_queued: int = 100_000
    scale_calls: int = 20

    @classmethod
    def make(cls, quick: bool, repeat: int | None) -> Config:
        if not quick:
            return cls(repeat=repeat or 3)
        return cls(
            repeat=repeat or 1,
            quick=True,
            single={"watchdog": 200, "procrastinate": 100, "pgqueuer": 200},
            batches=3,
            drain={"watchdog": 300, "procrastinate": 100, "pgqueuer": 300},
            latency_samples=20,
            latency_warmup=3,
            claim_jobs=200,
            claim_round=100,
            history_rows=1_000_000,
            delayed_rows=100_000,
            lateness_samples=10,
            lateness_warmup=2,
            prune_rows=100_000,
            prune_samples=20,
            prune_round=20,
            prune_warmup=2,
            stats_settled=200_000,
            stats_queued=20_000,
            stats_calls=30,
            sqlite_single=50,
            sqlite_drain=60,
            txn_samples=50,
            producer_jobs={"watchdog": 50, "procrastinate": 30, "pgqueuer": 50},
            inprocess_concurrencies=(4,),
            scaleout_jobs=600,
            scale_settled=20_000,
            scale_scheduled=20_000,
            scale_queued=5_000,
            scale_calls=5,
        )


def drain_timeout(n: int) -> float:
    return 60.0 + n / 20.0


# -- the workloads -------------------------------------------------------------------------


class Bench:
    def __init__(self, config: Config, subjects: list[str], scenarios: set[str], workdir: Path) -> None:
        self.config = config
        self.subjects = {name: load_subject(name) for name in subjects}
        self.scenarios = scenarios
        self.workdir = workdir
        self.targets: dict[tuple[str, str], Target] = {}
        #: results[key][subject] = [value per repeat]; latency values are dicts
        self.results: dict[str, dict[str, list[Any]]] = {}
        self.errors: list[str] = []
        self.started = time.monotonic()

    # -- bookkeeping --------------------------------------------------------------------

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)

    def record(self, key: str, subject: str, value: Any) -> None:
        self.results.setdefault(key, {}).setdefault(subject, []).append(value)

    def measure(self, key: str, subject: str, what: str, fn: Callable[[], Any], timeout: float = 300.0) -> Any:
        # A full collection first: the benchmark's own start-up and earlier
        # scenarios leave garbage whose collection would otherwise land inside
        # whichever subject runs next (a 20-40 ms pause in a 0.15 s enqueue run).
        # Collections the measured code itself causes still count.
        gc.collect()
        try:
            with harness.deadline(timeout, f"{key} [{subject}]"):
                value = fn()
        except (ScenarioTimeout, ScenarioFailed, Exception) as error:
            message = f"{key} [{subject}]: {type(error).__name__}: {error}"
            if not isinstance(error, (ScenarioTimeout, ScenarioFailed)):
                message += "\n" + traceback.format_exc(limit=6)
            self.errors.append(message)
            self.log(f"FAILED {message}")
            value = None
        else:
            self.log(f"{key:<28} {subject:<13} {what.format(value) if value is not None else '-'}")
        self.record(key, subject, value)
        return value

    def target(self, subject: str, dialect: str) -> Target:
        key = (subject, dialect)
        if key not in self.targets:
            if dialect == "postgresql":
                target = harness.create_database(subject)
            else:
                path = self.workdir / f"{subject}.db"
                target = Target("sqlite", str(path), path.name)
            self.subjects[subject].install(target)
            self.targets[key] = target
        return self.targets[key]

    def in_order(self, r: int, dialect: str) -> list[str]:
        """Subjects for this dialect, rotated per repeat so none always goes first."""
        names = [n for n, s in self.subjects.items() if dialect in s.dialects]
        if not names:
            return []
        shift = r % len(names)
        return names[shift:] + names[:shift]

    # -- 1. and 2.: enqueue ----------------------------------------------------------------

    def enqueue_single(self, r: int, dialect: str) -> None:
        prefix = "pg" if dialect == "postgresql" else "sqlite"
        for name in self.in_order(r, dialect):
            subject = self.subjects[name]
            target = self.target(name, dialect)
            n = self.config.single[name] if dialect == "postgresql" else self.config.sqlite_single

            def run(subject: Any = subject, target: Target = target, n: int = n) -> float:
                subject.reset(target)
                return n / subject.enqueue_single(target, n, f"single-{r}")

            self.measure(f"{prefix}.enqueue_single", name, "{:,.0f} jobs/s", run)
            if hasattr(subject, "enqueue_single_in_session"):

                def run_in_session(subject: Any = subject, target: Target = target, n: int = n) -> float:
                    subject.reset(target)
                    return n / subject.enqueue_single_in_session(target, n, f"session-{r}")

                self.measure(f"{prefix}.enqueue_single_session", name, "{:,.0f} jobs/s", run_in_session)

    def enqueue_batch(self, r: int, dialect: str) -> None:
        prefix = "pg" if dialect == "postgresql" else "sqlite"
        c = self.config
        for name in self.in_order(r, dialect):
            subject = self.subjects[name]
            target = self.target(name, dialect)

            def run(subject: Any = subject, target: Target = target) -> float:
                subject.reset(target)
                seconds = subject.enqueue_batch(target, c.batches, c.batch_size, f"batch-{r}")
                return c.batches * c.batch_size / seconds

            self.measure(f"{prefix}.enqueue_batch", name, "{:,.0f} jobs/s", run)

    # -- 3.: drain ---------------------------------------------------------------------------

    def workers(
        self,
        name: str,
        target: Target,
        *,
        procs: int,
        concurrency: int,
        defaults: bool,
        latency: bool,
        tag: str,
        use_asyncio: bool = False,
    ) -> list[Child]:
        argv = [
            sys.executable,
            str(HERE / "run.py"),
            "worker",
            "--subject",
            name,
            "--target",
            target.to_json(),
            "--concurrency",
            str(concurrency),
        ]
        if defaults:
            argv.append("--defaults")
        if latency:
            argv.append("--latency")
        if use_asyncio:
            argv.append("--asyncio")
        children = [Child(argv, self.workdir / f"{tag}-{name}-{i}.log") for i in range(procs)]
        try:
            for child in children:
                child.wait_ready(60)
        except BaseException:
            stop_all(children)
            raise
        return children

    def drain_once(
        self,
        name: str,
        dialect: str,
        *,
        n: int,
        procs: int,
        concurrency: int,
        defaults: bool,
        tag: str,
        use_asyncio: bool = False,
    ) -> float:
        subject = self.subjects[name]
        target = self.target(name, dialect)
        subject.reset(target)
        interval = self.config.poll_pg if dialect == "postgresql" else self.config.poll_sqlite
        children = self.workers(
            name,
            target,
            procs=procs,
            concurrency=concurrency,
            defaults=defaults,
            latency=False,
            tag=tag,
            use_asyncio=use_asyncio,
        )
        probe = subject.probe(target)
        try:
            # Warm-up: a moment to reach the LISTEN, then one job per worker,
            # drained, so every worker has connected and is idle again before
            # the clock starts.
            time.sleep(0.3)
            subject.prefill(target, procs, f"{tag}-warm")
            poll_until(lambda: not probe.live(), timeout=60, interval=0.01, what="warm-up", children=children)
            before = probe.completed()
            started = subject.prefill(target, n, tag)
            finished = poll_until(
                lambda: not probe.live(), timeout=drain_timeout(n), interval=interval, what="drain", children=children
            )
            done = probe.completed() - before
            if done != n:
                raise ScenarioFailed(f"drain: {done} of {n} jobs completed")
            return n / (finished - started)
        finally:
            probe.close()
            stop_all(children)

    def drain(self, r: int, dialect: str) -> None:
        c = self.config
        prefix = "pg" if dialect == "postgresql" else "sqlite"
        concurrencies = c.concurrencies if dialect == "postgresql" else c.sqlite_concurrencies
        # key, processes, concurrency, each queue's defaults, AsyncRunner
        shapes: list[tuple[str, int, int, bool, bool]] = []
        for procs in c.processes:
            for concurrency in concurrencies:
                shapes.append((f"{prefix}.drain.c{concurrency}.p{procs}", procs, concurrency, False, False))
        if dialect == "postgresql":
            for procs in c.processes:
                shapes.append((f"{prefix}.drain.defaults.p{procs}", procs, 1, True, False))
            for concurrency in c.async_concurrencies:
                shapes.append((f"{prefix}.drain.async.c{concurrency}.p1", 1, concurrency, False, True))
        if c.drain_rows is not None:
            shapes = [s for s in shapes if any(part in s[0].split(".") for part in c.drain_rows)]
        for key, procs, concurrency, defaults, use_asyncio in shapes:
            for name in self.in_order(r, dialect):
                if use_asyncio and name != "watchdog":
                    continue  # the peers are asyncio already; this row is our AsyncRunner
                n = c.drain[name] if dialect == "postgresql" else c.sqlite_drain
                self.measure(
                    key,
                    name,
                    "{:,.0f} jobs/s",
                    functools.partial(
                        self.drain_once,
                        name,
                        dialect,
                        n=n,
                        procs=procs,
                        concurrency=concurrency,
                        defaults=defaults,
                        tag=f"{key}-{r}",
                        use_asyncio=use_asyncio,
                    ),
                    timeout=drain_timeout(n) + 180.0,  # + worker start, warm-up and shutdown
                )

    # -- 4.: enqueue-to-start latency -----------------------------------------------------

    def latency_once(self, name: str, r: int) -> dict[str, float]:
        subject = self.subjects[name]
        target = self.target(name, "postgresql")
        subject.reset(target)
        c = self.config
        (child,) = self.workers(name, target, procs=1, concurrency=1, defaults=True, latency=True, tag=f"latency-{r}")
        client = subject.latency_client(target)
        try:
            time.sleep(0.5)  # let the worker reach its idle wait
            samples = start_latencies(child, client, f"lat-{r}", c.latency_warmup, c.latency_samples)
        finally:
            client.close()
            stop_all([child])
        return {
            "p50": percentile(samples, 50),
            "p95": percentile(samples, 95),
            "p99": percentile(samples, 99),
            "samples": len(samples),
        }

    def latency(self, r: int) -> None:
        for name in self.in_order(r, "postgresql"):
            self.measure(
                "pg.latency",
                name,
                "p50 {0[p50]:.1f} ms, p95 {0[p95]:.1f} ms, p99 {0[p99]:.1f} ms",
                functools.partial(self.latency_once, name, r),
            )

    # -- 5. and 6.: claim cost against a settled history ---------------------------------

    def alternate_claims(self, prefix: str, targets: dict[str, Target], r: int) -> dict[str, list[float]] | None:
        """Claim and settle ``claim_jobs`` jobs on each target, in rounds of
        ``claim_round`` that alternate between the targets, so a change in
        machine load hits all of them; returns ms per job of every round, per
        label (None if a round failed: the failure is listed)."""
        from subjects import claim_settle

        c = self.config
        rounds = max(1, c.claim_jobs // c.claim_round)
        per_round: dict[str, list[float]] = {label: [] for label in targets}
        for k in range(rounds):
            order = list(targets.items())
            if k % 2:
                order.reverse()
            for label, target in order:
                try:
                    with harness.deadline(300.0, f"{prefix}.{label}"):
                        seconds = claim_settle(target, c.claim_round, f"claim-{label}-{r}-{k}")
                except Exception as error:
                    self.errors.append(f"{prefix}.{label}: {type(error).__name__}: {error}")
                    self.log(f"FAILED {prefix}.{label}: {error}")
                    return None
                # claim_settle adds a warm-up job to the round's jobs
                per_round[label].append(seconds / (c.claim_round + 1) * 1000.0)
        return per_round

    def scratch_target(self, dialect: str, name: str) -> Target:
        """An empty database of its own for one scenario: ``watchdog_bench_<pid>_<name>`` on
        the PostgreSQL server, or ``<name>.db`` in the work directory (drop it with
        ``harness.drop_database``)."""
        if dialect == "postgresql":
            return harness.create_database(name)
        return Target("sqlite", str(self.workdir / f"{name}.db"), f"{name}.db")

    def claim_cost(self, dialect: str) -> None:
        from subjects import Watchdog, insert_history

        if "watchdog" not in self.subjects:
            return
        c = self.config
        prefix = "pg" if dialect == "postgresql" else "sqlite"
        subject = Watchdog()
        empty = self.scratch_target(dialect, "claim_empty")
        history = self.scratch_target(dialect, "claim_history")
        try:
            subject.install(empty)
            subject.install(history)
            self.log(f"{prefix}: inserting {c.history_rows:,} settled rows ...")
            with harness.deadline(900.0, f"{prefix}: inserting the history"):
                seconds = insert_history(history, c.history_rows)
            self.log(f"{prefix}: history inserted and analysed in {seconds:.1f}s")
            for r in range(c.repeat):
                subject.reset(empty)
                rounds = self.alternate_claims(f"{prefix}.claim", {"empty": empty, "history": history}, r)
                if rounds is None:
                    continue
                # Every round has as many jobs: the mean of the rounds is the cost per job.
                per_job = {label: sum(values) / len(values) for label, values in rounds.items()}
                ratio = per_job["history"] / per_job["empty"]
                self.record(f"{prefix}.claim.empty", "watchdog", per_job["empty"])
                self.record(f"{prefix}.claim.history", "watchdog", per_job["history"])
                self.record(f"{prefix}.claim.ratio", "watchdog", ratio)
                jobs = len(rounds["empty"]) * (c.claim_round + 1)
                self.log(
                    f"{prefix}.claim  {jobs} jobs each: empty {per_job['empty']:.3f} ms/job,"
                    f" {c.history_rows:,} settled {per_job['history']:.3f} ms/job, ratio {ratio:.2f}x"
                )
        finally:
            harness.drop_database(empty)
            harness.drop_database(history)

    # -- 7.: claim cost beside jobs delayed far into the future ---------------------------

    def delayed_cost(self, dialect: str) -> None:
        """Claim+settle on an empty table vs one also holding ``delayed_rows``
        jobs of the same queue delayed far into the future: the delayed jobs
        must stay out of the claim's way (they are not in the ready index) and
        the runner's promotion step, run on every tick, must not grow with them."""
        from subjects import Watchdog

        if "watchdog" not in self.subjects:
            return
        c = self.config
        prefix = "pg" if dialect == "postgresql" else "sqlite"
        subject = Watchdog()
        empty = self.scratch_target(dialect, "delayed_empty")
        delayed = self.scratch_target(dialect, "delayed_far")
        try:
            subject.install(empty)
            subject.install(delayed)
            self.log(f"{prefix}: inserting {c.delayed_rows:,} delayed jobs ...")
            with harness.deadline(900.0, f"{prefix}: inserting the delayed jobs"):
                seconds = insert_delayed(delayed, c.delayed_rows)
            self.log(f"{prefix}: delayed jobs inserted and analysed in {seconds:.1f}s")
            for r in range(c.repeat):
                subject.reset(empty)
                rounds = self.alternate_claims(f"{prefix}.delayed", {"empty": empty, "delayed": delayed}, r)
                if rounds is None:
                    continue
                spread = {label: spread_of(values) for label, values in rounds.items()}
                ratio = spread["delayed"]["median"] / spread["empty"]["median"]
                self.record(f"{prefix}.delayed.empty", "watchdog", spread["empty"])
                self.record(f"{prefix}.delayed.far", "watchdog", spread["delayed"])
                self.record(f"{prefix}.delayed.ratio", "watchdog", ratio)
                self.log(
                    f"{prefix}.delayed  {len(rounds['empty'])} rounds each:"
                    f" empty {fmt_spread(spread['empty'])} ms/job,"
                    f" {c.delayed_rows:,} delayed {fmt_spread(spread['delayed'])} ms/job, ratio {ratio:.2f}x"
                )
            still = count_delayed(delayed)
            if still != c.delayed_rows:
                # None may have become due (and run) during the measurement.
                raise ScenarioFailed(f"{prefix}.delayed: {still:,} of {c.delayed_rows:,} jobs still delayed")
        except Exception as error:
            message = str(error)
            if not isinstance(error, ScenarioFailed):
                message = f"{prefix}.delayed: {type(error).__name__}: {error}"
            self.errors.append(message)
            self.log(f"FAILED {message}")
        finally:
            harness.drop_database(empty)
            harness.drop_database(delayed)

    # -- 8.: how late a delayed job starts -------------------------------------------------

    def lateness_once(self, dialect: str, r: int) -> dict[str, float]:
        """One idle runner with its defaults (``Runner(engine, handlers)``:
        the default poll interval); jobs enqueued one at a time, each with a
        ``run_at`` a little in the future; lateness = handler start - run_at."""
        from datetime import UTC, datetime

        from subjects import QUEUE, _engine

        from sqlalchemy_watchdog import Job
        from sqlalchemy_watchdog import Watchdog as Client

        c = self.config
        subject = self.subjects["watchdog"]
        target = self.target("watchdog", dialect)
        subject.reset(target)
        (child,) = self.workers(
            "watchdog", target, procs=1, concurrency=1, defaults=True, latency=True, tag=f"lateness-{dialect}-{r}"
        )
        engine = _engine(target)
        samples: list[float] = []
        try:
            client = Client(engine)
            time.sleep(0.5)  # let the worker reach its idle wait
            for i in range(c.lateness_warmup + c.lateness_samples):
                key = f"late-{r}-{i}"
                lead = random.uniform(*c.lateness_lead)
                # Whole milliseconds: run_at is stored as epoch milliseconds.
                due_ms = round((time.time() + lead) * 1000.0)
                client.enqueue(Job(key, QUEUE, run_at=datetime.fromtimestamp(due_ms / 1000.0, UTC)))
                wait = lead + 15.0
                try:
                    got, started = child.starts.get(timeout=wait)
                except Exception:
                    raise ScenarioTimeout(
                        f"lateness: job {key} did not start within {wait:.0f}s; {child.tail()}"
                    ) from None
                if got != key:
                    raise ScenarioFailed(f"lateness: expected {key} to start, got {got}")
                if started < due_ms / 1000.0 - 0.002:  # the clocks are one clock; allow rounding
                    raise ScenarioFailed(f"lateness: {key} started {due_ms / 1000.0 - started:.3f}s before its run_at")
                if i >= c.lateness_warmup:
                    samples.append(started * 1000.0 - due_ms)
                # Let the job settle and the runner go idle again, off any poll rhythm.
                time.sleep(random.uniform(0.03, 0.06))
        finally:
            engine.dispose()
            stop_all([child])
        return {
            "p50": percentile(samples, 50),
            "p95": percentile(samples, 95),
            "p99": percentile(samples, 99),
            "max": max(samples),
            "samples": len(samples),
        }

    def lateness(self, r: int, dialect: str) -> None:
        if "watchdog" not in self.subjects:
            return
        c = self.config
        prefix = "pg" if dialect == "postgresql" else "sqlite"
        self.measure(
            f"{prefix}.lateness",
            "watchdog",
            "p50 {0[p50]:.1f} ms, p95 {0[p95]:.1f} ms, p99 {0[p99]:.1f} ms",
            functools.partial(self.lateness_once, dialect, r),
            timeout=120.0 + (c.lateness_warmup + c.lateness_samples) * (c.lateness_lead[1] + 1.0),
        )

    # -- 9.: claim latency while a runner prunes a long history --------------------------

    def retention_worker(self, target: Target, *, prune: bool, tag: str) -> Child:
        """A runner process with its defaults serving the benchmark's queue, its
        handler reporting each start; with ``prune`` it also has
        ``retention=Retention(completed=timedelta(days=PRUNE_RETENTION_DAYS))``."""
        argv = [sys.executable, str(HERE / "run.py"), "retention-worker", "--target", target.to_json()]
        if prune:
            argv.append("--prune")
        child = Child(argv, self.workdir / f"{tag}.log")
        try:
            child.wait_ready(60)
        except BaseException:
            stop_all([child])
            raise
        return child

    def prune_latency_round(self, target: Target, *, prune: bool, tag: str) -> dict[str, Any]:
        """One runner process (pruning or not), ``prune_round`` jobs enqueued
        one at a time; returns their latencies and, when pruning, how many
        old rows went meanwhile."""
        from subjects import SUBJECT

        c = self.config
        child = self.retention_worker(target, prune=prune, tag=tag)
        client = SUBJECT.latency_client(target)
        try:
            time.sleep(0.5)  # let the runner reach its idle wait
            before = count_prunable(target)
            if prune:
                # Measure only once the runner is deleting: the first batch has gone.
                poll_until(
                    lambda: count_prunable(target) < before,
                    timeout=60,
                    interval=0.05,
                    what="waiting for the runner to start pruning",
                    children=[child],
                )
                before = count_prunable(target)
            started = time.perf_counter()
            samples = start_latencies(child, client, tag, c.prune_warmup, c.prune_round, PRUNE_PAUSE)
            elapsed = time.perf_counter() - started
            after = count_prunable(target)
        finally:
            client.close()
            stop_all([child])
        if prune and after == 0:
            raise ScenarioFailed(f"{tag}: the runner pruned every old row before the round ended; raise prune_rows")
        if prune and after >= before:
            raise ScenarioFailed(f"{tag}: the runner pruned nothing during the round")
        if not prune and after != before:
            raise ScenarioFailed(f"{tag}: {before - after} old rows vanished without retention")
        return {"samples": samples, "pruned": before - after, "seconds": elapsed, "left": after}

    def prune_cost(self, dialect: str) -> None:
        """Enqueue-to-start latency of a runner with its defaults, without
        retention and with ``retention=`` while it prunes ``prune_rows``
        settled jobs older than the retention; the two runner modes alternate
        in rounds so a change in machine load hits both."""
        if "watchdog" not in self.subjects:
            return
        from subjects import SUBJECT

        c = self.config
        prefix = "pg" if dialect == "postgresql" else "sqlite"
        target = self.scratch_target(dialect, "prune")
        try:
            SUBJECT.install(target)
            for r in range(c.repeat):
                rounds = max(1, c.prune_samples // c.prune_round)
                latencies: dict[bool, list[float]] = {False: [], True: []}
                pruned, pruning_s = 0, 0.0
                left = c.prune_rows
                try:
                    # Every repeat starts from the whole history.
                    SUBJECT.reset(target)
                    self.log(f"{prefix}: inserting {c.prune_rows:,} settled jobs older than the retention ...")
                    with harness.deadline(900.0, f"{prefix}: inserting the old settled jobs"):
                        seconds = insert_settled_before_retention(target, c.prune_rows)
                    self.log(f"{prefix}: old settled jobs inserted and analysed in {seconds:.1f}s")
                    for k in range(rounds):
                        for prune in (False, True) if k % 2 == 0 else (True, False):
                            tag = f"{prefix}-prune-{r}-{k}-{'pruning' if prune else 'plain'}"
                            with harness.deadline(300.0, tag):
                                result = self.prune_latency_round(target, prune=prune, tag=tag)
                            latencies[prune].extend(result["samples"])
                            if prune:
                                pruned += result["pruned"]
                                pruning_s += result["seconds"]
                                left = result["left"]
                except Exception as error:
                    message = f"{prefix}.prune: {type(error).__name__}: {error}"
                    self.errors.append(message)
                    self.log(f"FAILED {message}")
                    continue
                plain, pruning = latencies[False], latencies[True]
                value = {
                    "p50_plain": percentile(plain, 50),
                    "p99_plain": percentile(plain, 99),
                    "p50_pruning": percentile(pruning, 50),
                    "p99_pruning": percentile(pruning, 99),
                    "ratio": percentile(pruning, 99) / percentile(plain, 99),
                    "pruned_per_s": pruned / pruning_s if pruning_s else None,
                    "samples": len(pruning),
                }
                self.record(f"{prefix}.prune", "watchdog", value)
                self.log(
                    f"{prefix}.prune  {len(plain)} jobs each: p50/p99 {value['p50_plain']:.1f}/{value['p99_plain']:.1f} ms"
                    f" without pruning, {value['p50_pruning']:.1f}/{value['p99_pruning']:.1f} ms while pruning"
                    f" ({pruned:,} rows in {pruning_s:.1f}s, {left:,} left), p99 ratio {value['ratio']:.2f}x"
                )
        except Exception as error:
            message = f"{prefix}.prune: {type(error).__name__}: {error}"
            self.errors.append(message)
            self.log(f"FAILED {message}")
        finally:
            harness.drop_database(target)

    # -- 10.: stats() and list_jobs() beside a long history (PostgreSQL) ---------------------

    def stats_cost(self) -> None:
        """``Watchdog.stats()`` and one page of ``list_jobs()`` timed over
        repeated calls on a database holding ``stats_settled`` settled jobs
        spread over 30 days and ``stats_queued`` queued ones."""
        if "watchdog" not in self.subjects:
            return
        from subjects import SUBJECT, _engine

        from sqlalchemy_watchdog import Watchdog as Client

        c = self.config
        target = harness.create_database("stats")
        try:
            SUBJECT.install(target)
            self.log(f"pg: inserting {c.stats_settled:,} settled and {c.stats_queued:,} queued jobs ...")
            with harness.deadline(900.0, "pg: inserting the stats history"):
                seconds = insert_stats_history(target, c.stats_settled, c.stats_queued)
            self.log(f"pg: stats history inserted and analysed in {seconds:.1f}s")
            engine = _engine(target)
            try:
                client = Client(engine)
                last_hour = c.stats_settled * 3_600_000 // STATS_SPAN_MS
                stats = client.stats()
                queued = sum(q.queued for q in stats.queues)
                recent = sum(sum(q.settled_last_hour.values()) for q in stats.queues)
                if queued != c.stats_queued or len(stats.queues) != STATS_QUEUES:
                    raise ScenarioFailed(f"stats: {queued:,} queued in {len(stats.queues)} queues")
                # Time passes while the test runs: the last hour loses its oldest rows.
                if not 0.5 * last_hour <= recent <= last_hour + 1:
                    raise ScenarioFailed(f"stats: {recent:,} settled in the last hour, expected about {last_hour:,}")
                reads: dict[str, Callable[[], Any]] = {
                    "stats": client.stats,
                    "list_first": lambda: client.list_jobs(limit=100),
                    "list_queued": lambda: client.list_jobs(state="queued", limit=100),
                }
                for _ in range(c.repeat):
                    for name, read in reads.items():
                        self.measure(
                            f"pg.ops.{name}",
                            "watchdog",
                            "p50 {0[p50]:.2f} ms, p99 {0[p99]:.2f} ms",
                            functools.partial(time_calls, read, c.stats_calls),
                        )
            finally:
                engine.dispose()
        except Exception as error:
            message = str(error)
            if not isinstance(error, ScenarioFailed):
                message = f"pg.ops: {type(error).__name__}: {error}"
            self.errors.append(message)
            self.log(f"FAILED {message}")
        finally:
            harness.drop_database(target)

    # -- the whole run -----------------------------------------------------------------

    def run(self) -> None:
        c = self.config
        s = self.scenarios
        for r in range(c.repeat):
            self.log(f"=== repeat {r + 1} of {c.repeat} ===")
            for dialect in ("postgresql", "sqlite"):
                if dialect not in s:
                    continue
                if "enqueue" in s:
                    self.enqueue_single(r, dialect)
                    self.enqueue_batch(r, dialect)
                if "drain" in s:
                    self.drain(r, dialect)
                if "latency" in s and dialect == "postgresql":
                    self.latency(r)
                if "lateness" in s:
                    self.lateness(r, dialect)
        if "claim" in s:
            for dialect in ("postgresql", "sqlite"):
                if dialect in s:
                    self.claim_cost(dialect)
        if "delayed" in s:
            for dialect in ("postgresql", "sqlite"):
                if dialect in s:
                    self.delayed_cost(dialect)
        if "prune" in s:
            for dialect in ("postgresql", "sqlite"):
                if dialect in s:
                    self.prune_cost(dialect)
        if "stats" in s and "postgresql" in s:
            self.stats_cost()
        if "postgresql" in s:
            for r in range(c.repeat):
                if "txn" in s and "watchdog" in self.subjects:
                    round2.txn(self, r)
                if "producers" in s:
                    round2.producers(self, r)
                if "inprocess" in s and "watchdog" in self.subjects:
                    round2.inprocess(self, r)
                if "scaleout" in s and "watchdog" in self.subjects:
                    round2.scaleout(self, r)
            if "scale" in s and "watchdog" in self.subjects:
                round2.scale(self)

    def close(self) -> None:
        for target in self.targets.values():
            harness.drop_database(target)


def start_latencies(
    child: Child, client: Any, tag: str, warmup: int, samples: int, pause: tuple[float, float] = (0.03, 0.06)
) -> list[float]:
    """Enqueue ``warmup + samples`` jobs one at a time with ``client`` (each
    committed on its own) and wait for ``child``'s handler to start each,
    pausing a random ``pause`` seconds after each start; returns start -
    commit in ms of the jobs after the warm-up."""
    latencies: list[float] = []
    for i in range(warmup + samples):
        key = f"{tag}-{i}"
        committed = client.enqueue(key)
        # Warm-up jobs may wait for a worker still setting up its LISTEN
        # (pgqueuer's fallback poll is 30 s); measured ones must not.
        wait = 60 if i < warmup else 15
        try:
            got, started = child.starts.get(timeout=wait)
        except Exception:
            raise ScenarioTimeout(f"latency: job {key} did not start within {wait}s; {child.tail()}") from None
        if got != key:
            raise ScenarioFailed(f"latency: expected {key} to start, got {got}")
        if i >= warmup:
            latencies.append((started - committed) * 1000.0)
        # Let the job settle and the worker go idle again, off any poll rhythm.
        time.sleep(random.uniform(*pause))
    return latencies


# -- delayed jobs (watchdog only) ------------------------------------------------------------

#: The database clock in epoch milliseconds, as the library reads it.
_CLOCK_SQL = {
    "postgresql": "CAST(floor(EXTRACT(EPOCH FROM statement_timestamp()) * 1000) AS BIGINT)",
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
}
#: The first delayed job is due a day after the insert, the others one second apart
#: (1,000,000 jobs: over 12 days): none becomes due during a run.
_DELAYED_FROM_MS = 86_400_000
_DELAYED_STEP_MS = 1_000


def insert_delayed(target: Target, rows: int) -> float:
    """``rows`` delayed jobs of the benchmark's queue in one statement, as
    ``Job(run_at=...)`` leaves them, due from a day ahead on; then ANALYZE.
    Returns seconds taken."""
    from subjects import QUEUE

    started = time.perf_counter()
    columns = "job_id, queue_name, lane, priority, payload_json, state, run_at, ready_at"
    due = f"({_CLOCK_SQL[target.dialect]} + {_DELAYED_FROM_MS} + n * {_DELAYED_STEP_MS})"
    if target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.dsn, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO watchdog_jobs ({columns})"
                " SELECT 'delayed-' || n, %(queue)s, %(queue)s, 0, '{\"i\":' || n || '}', 'delayed',"
                f" {due}, {due} FROM generate_series(1, %(rows)s) AS g(n)",
                {"queue": QUEUE, "rows": rows},
            )
            # What autovacuum would have done to a table that grew this big over time.
            conn.execute("VACUUM (ANALYZE) watchdog_jobs")
    else:
        lite = sqlite3.connect(target.dsn, isolation_level=None, timeout=30)
        try:
            lite.execute("BEGIN")
            lite.execute(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?)"
                f" INSERT INTO watchdog_jobs ({columns})"
                " SELECT 'delayed-' || n, ?, ?, 0, '{\"i\":' || n || '}', 'delayed',"
                f" {due}, {due} FROM g",
                (rows, QUEUE, QUEUE),
            )
            lite.execute("COMMIT")
            lite.execute("ANALYZE")
        finally:
            lite.close()
    return time.perf_counter() - started


def count_delayed(target: Target) -> int:
    """How many jobs of ``target`` are delayed."""
    sql = "SELECT count(*) FROM watchdog_jobs WHERE state = 'delayed'"
    if target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.dsn, autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
    else:
        lite = sqlite3.connect(target.dsn, timeout=30)
        try:
            row = lite.execute(sql).fetchone()
        finally:
            lite.close()
    return int(row[0]) if row else 0


# -- operations: retention and stats (watchdog only) ------------------------------------------

#: The retention the pruning runner is given: completed jobs are kept this long.
PRUNE_RETENTION_DAYS = 7
#: Seconds between a job's start and the next enqueue: spread over more than a
#: poll interval (SQLite: 0.25 s) and a pruning runner's cycle (a batch every
#: 0.2 s), so jobs arrive at every phase of both rather than locked to one.
PRUNE_PAUSE = (0.03, 0.33)
#: The old settled jobs settled from 8 days before the insert on, one second apart
#: going back (1,000,000 jobs: over 11.6 more days), so every one is past the retention.
_PRUNE_NEWEST_MS = 8 * 86_400_000
_PRUNE_STEP_MS = 1_000


def _execute(target: Target, statement: str, params: tuple[Any, ...] | dict[str, Any], analyse: bool = True) -> None:
    """One statement in a transaction of its own on ``target``, then (by
    default) what autovacuum would have done to a table grown this big over
    time (PostgreSQL ``VACUUM (ANALYZE)``, SQLite ``ANALYZE``)."""
    if target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.dsn, autocommit=True) as conn:
            conn.execute(statement, params)
            if analyse:
                conn.execute("VACUUM (ANALYZE) watchdog_jobs")
    else:
        lite = sqlite3.connect(target.dsn, isolation_level=None, timeout=30)
        try:
            lite.execute("BEGIN")
            lite.execute(statement, params)
            lite.execute("COMMIT")
            if analyse:
                lite.execute("ANALYZE")
        finally:
            lite.close()


def _numbers(target: Target, rows_param: str) -> str:
    """A FROM clause yielding ``n`` = 1..rows: generate_series, or a recursive CTE on SQLite."""
    if target.dialect == "postgresql":
        return f"generate_series(1, {rows_param}) AS g(n)"
    return f"(WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows_param}) SELECT n FROM g)"


def insert_settled_before_retention(target: Target, rows: int) -> float:
    """``rows`` completed jobs of the benchmark's queue, settled between 8
    days and 8 days + ``rows`` seconds before now (oldest first in
    ``sequence``), with their enqueue and start times, in one statement;
    then ANALYZE. Returns seconds taken."""
    from subjects import QUEUE

    started = time.perf_counter()
    clock = _CLOCK_SQL[target.dialect]
    settled = f"({clock} - {_PRUNE_NEWEST_MS} - CAST(:rows - n AS BIGINT) * {_PRUNE_STEP_MS})"
    statement = (
        "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, outcome,"
        " claim_token, enqueued_at, started_at, settled_at)"
        " SELECT 'old-' || n, :queue, :queue, 0, '{\"i\":' || n || '}', 'settled', 'completed',"
        f" 'old-token-' || n, {settled} - 2000, {settled} - 1000, {settled}"
        f" FROM {_numbers(target, ':rows')}"
    )
    params = {"queue": QUEUE, "rows": rows}
    if target.dialect == "postgresql":
        statement = statement.replace(":queue", "%(queue)s").replace(":rows", "%(rows)s")
    _execute(target, statement, params)
    return time.perf_counter() - started


def count_prunable(target: Target) -> int:
    """How many settled jobs of ``target`` settled more than a day ago (by
    the database clock): the old rows only, not the benchmark's own jobs."""
    statement = (
        "SELECT count(*) FROM watchdog_jobs WHERE state = 'settled'"
        f" AND settled_at < {_CLOCK_SQL[target.dialect]} - 86400000"
    )
    if target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.dsn, autocommit=True) as conn:
            row = conn.execute(statement).fetchone()
    else:
        lite = sqlite3.connect(target.dsn, timeout=30)
        try:
            row = lite.execute(statement).fetchone()
        finally:
            lite.close()
    return int(row[0]) if row else 0


#: "stats": the settled jobs are spread evenly over the last 30 days, so 1/720 of
#: them settled in the last hour; the queued ones over the last hour; 10 queues.
STATS_SPAN_MS = 30 * 86_400_000
STATS_QUEUES = 10


def insert_stats_history(target: Target, settled: int, queued: int) -> float:
    """``settled`` jobs settled evenly over the last 30 days (one in 20
    ``failed``, the others ``completed``), then ``queued`` jobs enqueued
    evenly over the last hour, round-robin over ``STATS_QUEUES`` queues, in
    admission order; then ``VACUUM (ANALYZE)``. PostgreSQL. Returns seconds taken."""
    started = time.perf_counter()
    clock = _CLOCK_SQL["postgresql"]
    queue = f"'stats-' || mod(n, {STATS_QUEUES})"
    at = f"({clock} - CAST(%(rows)s - n + 1 AS BIGINT) * %(step)s)"
    columns = (
        "job_id, queue_name, lane, priority, payload_json, state, outcome, claim_token,"
        " enqueued_at, started_at, settled_at"
    )
    _execute(
        target,
        f"INSERT INTO watchdog_jobs ({columns})"
        f" SELECT 'settled-' || n, {queue}, {queue}, 0, '{{\"i\":' || n || '}}', 'settled',"
        " CASE WHEN mod(n, 20) = 0 THEN 'failed' ELSE 'completed' END, 'token-' || n,"
        f" {at} - 2000, {at} - 1000, {at} FROM generate_series(1, %(rows)s) AS g(n)",
        {"rows": settled, "step": STATS_SPAN_MS // settled},
        analyse=False,
    )
    _execute(
        target,
        f"INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"
        f" SELECT 'queued-' || n, {queue}, {queue}, 0, '{{\"i\":' || n || '}}', 'queued', {at}"
        " FROM generate_series(1, %(rows)s) AS g(n)",
        {"rows": queued, "step": 3_600_000 // queued},
    )
    return time.perf_counter() - started


def time_calls(call: Callable[[], Any], calls: int, warmup: int = 3) -> dict[str, float]:
    """``call()`` timed ``calls`` times after ``warmup`` untimed calls (ms)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000.0)
    return {"p50": percentile(times, 50), "p99": percentile(times, 99), "samples": len(times)}


def spread_of(values: list[float]) -> dict[str, float]:
    """Median and min-max of a figure measured in several rounds."""
    return {"median": median(values) or 0.0, "min": min(values), "max": max(values), "rounds": len(values)}


def fmt_spread(value: dict[str, float] | None, digits: int = 3) -> str:
    if not value or value.get("median") is None:
        return "-"
    return f"{value['median']:.{digits}f} ({value['min']:.{digits}f}-{value['max']:.{digits}f})"


# -- the report ------------------------------------------------------------------------------


def machine_facts(workdir: Path) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": os.getloadavg(),
    }
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                facts["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        facts["postgresql"] = harness.server_facts()
    except Exception as error:
        facts["postgresql"] = {"error": str(error)}
    probe = sqlite3.connect(str(workdir / "facts.db"))
    facts["sqlite"] = {
        "version": sqlite3.sqlite_version,
        "journal_mode": probe.execute("PRAGMA journal_mode").fetchone()[0],
        "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(
            probe.execute("PRAGMA synchronous").fetchone()[0]
        ),
    }
    probe.close()
    try:
        facts["sqlite"]["filesystem"] = subprocess.run(
            ["findmnt", "-n", "-o", "FSTYPE", "-T", str(workdir)], capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:
        pass
    versions: dict[str, str | None] = {}
    for package in ("sqlalchemy-watchdog", "SQLAlchemy", "psycopg", "procrastinate", "pgqueuer", "asyncpg"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    facts["packages"] = versions
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "sqlalchemy_watchdog"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        facts["watchdog_commit"] = head + ("+dirty" if dirty else "")
    except Exception:
        pass
    return facts


def describe_machine(f: dict[str, Any]) -> str:
    pg = f.get("postgresql", {})
    sq = f.get("sqlite", {})
    lines = [
        (
            f"machine: {f.get('nproc')} CPUs ({f.get('cpu', '?')}), {f.get('memory_gib', '?')} GiB RAM,"
            f" load {', '.join(f'{x:.2f}' for x in f['loadavg_at_start'])} at start; Python {f['python']}"
        ),
        (
            f"PostgreSQL {pg.get('version', '?')}: fsync={pg.get('fsync')},"
            f" synchronous_commit={pg.get('synchronous_commit')}, wal_sync_method={pg.get('wal_sync_method')},"
            f" full_page_writes={pg.get('full_page_writes')}, shared_buffers={pg.get('shared_buffers')}"
        ),
        (
            f"SQLite {sq.get('version')}: journal_mode={sq.get('journal_mode')},"
            f" synchronous={sq.get('synchronous')} (defaults), files on {sq.get('filesystem', '?')}"
        ),
        "versions: "
        + ", ".join(f"{k} {v}" for k, v in f["packages"].items() if v)
        + (f"; watchdog at {f['watchdog_commit']}" if "watchdog_commit" in f else ""),
    ]
    return "\n".join(lines)


THROUGHPUT_ROWS = [
    ("pg.enqueue_single", "enqueue, 1 job per transaction"),
    ("pg.enqueue_single_session", "enqueue, 1 job in the caller's Session + commit"),
    ("pg.enqueue_batch", "enqueue, 1,000 jobs per statement"),
    ("pg.drain.c1.p1", "drain, concurrency 1, 1 process"),
    ("pg.drain.c4.p1", "drain, concurrency 4, 1 process"),
    ("pg.drain.c16.p1", "drain, concurrency 16, 1 process"),
    ("pg.drain.c64.p1", "drain, concurrency 64, 1 process"),
    ("pg.drain.c1.p2", "drain, concurrency 1, 2 processes"),
    ("pg.drain.c4.p2", "drain, concurrency 4, 2 processes"),
    ("pg.drain.c16.p2", "drain, concurrency 16, 2 processes"),
    ("pg.drain.c64.p2", "drain, concurrency 64, 2 processes"),
    ("pg.drain.defaults.p1", "drain, each queue's defaults, 1 process"),
    ("pg.drain.defaults.p2", "drain, each queue's defaults, 2 processes"),
    ("pg.drain.async.c4.p1", "drain, AsyncRunner, concurrency 4, 1 process"),
    ("pg.drain.async.c16.p1", "drain, AsyncRunner, concurrency 16, 1 process"),
    ("pg.drain.async.c64.p1", "drain, AsyncRunner, concurrency 64, 1 process"),
]


def summarise(results: dict[str, dict[str, list[Any]]]) -> dict[str, dict[str, Any]]:
    """Medians over the repeats (latency: the median of each percentile;
    figures measured in rounds: the median of the medians, the spread over
    every round of every repeat)."""
    out: dict[str, dict[str, Any]] = {}
    for key, per_subject in results.items():
        out[key] = {}
        for subject, values in per_subject.items():
            if key.endswith("latency"):
                out[key][subject] = {p: median([v[p] for v in values if v is not None]) for p in ("p50", "p95", "p99")}
            elif any(isinstance(v, dict) for v in values):
                present = [v for v in values if v is not None]
                combined: dict[str, Any] = {}
                for name in present[0]:
                    xs = [v[name] for v in present if v.get(name) is not None]
                    if not xs:
                        combined[name] = None
                    elif name == "min":
                        combined[name] = min(xs)
                    elif name == "max":
                        combined[name] = max(xs)
                    elif name in ("samples", "rounds"):
                        combined[name] = sum(xs)
                    else:
                        combined[name] = median(xs)
                out[key][subject] = combined
            else:
                out[key][subject] = median(values)
    return out


def _fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render_table(summary: dict[str, dict[str, Any]], subjects: list[str], config: Config) -> str:
    peers = [p for p in PEERS if p in subjects]
    header = ["PostgreSQL", *subjects, *(f"wd vs {p}" for p in peers)]
    rows: list[list[str]] = []

    def ratio(wd: float | None, peer: float | None, lower_is_better: bool = False) -> float | None:
        if not wd or not peer:
            return None
        return peer / wd if lower_is_better else wd / peer

    for key, label in THROUGHPUT_ROWS:
        if key not in summary:
            continue
        values = summary[key]
        wd = values.get("watchdog")
        rows.append(
            [
                label + " (jobs/s)",
                *(_fmt_rate(values.get(s)) for s in subjects),
                *(_fmt_ratio(ratio(wd, values.get(p))) for p in peers),
            ]
        )
    if "pg.latency" in summary:
        values = summary["pg.latency"]
        for p in ("p50", "p95", "p99"):
            wd = (values.get("watchdog") or {}).get(p)

            def ms(s: str, p: str = p) -> str:
                v = (values.get(s) or {}).get(p)
                return "-" if v is None else f"{v:.1f}"

            rows.append(
                [
                    f"enqueue-to-start latency {p} (ms)",
                    *(ms(s) for s in subjects),
                    *(_fmt_ratio(ratio(wd, (values.get(q) or {}).get(p), lower_is_better=True)) for q in peers),
                ]
            )
    claim_rows = []
    for prefix, name in (("pg", "PostgreSQL"), ("sqlite", "SQLite")):
        if f"{prefix}.claim.empty" not in summary:
            continue
        empty = summary[f"{prefix}.claim.empty"].get("watchdog")
        history = summary[f"{prefix}.claim.history"].get("watchdog")
        ratio_value = summary.get(f"{prefix}.claim.ratio", {}).get("watchdog")
        claim_rows.append((name, empty, history, ratio_value))

    sqlite_rows = []
    for key, label in THROUGHPUT_ROWS:
        skey = "sqlite" + key[2:]
        if skey in summary:
            sqlite_rows.append([label + " (jobs/s)", _fmt_rate(summary[skey].get("watchdog"))])

    def table(head: list[str], body: list[list[str]]) -> list[str]:
        widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
        line = lambda r: (
            "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) + " |"
        )
        return [line(head), "|" + "|".join(("-" * (w + 2)) for w in widths) + "|", *(line(r) for r in body)]

    out: list[str] = []
    if rows:
        out.extend(table(header, rows))
        out.append("")
        out.append("ratios: throughput watchdog/peer, latency peer/watchdog -- above 1.00x watchdog is better")
    if sqlite_rows:
        out.append("")
        out.extend(table(["SQLite (watchdog only)", "watchdog"], sqlite_rows))
    if claim_rows:
        out.append("")
        body = []
        for name, empty, history, ratio_value in claim_rows:
            body.append(
                [
                    name,
                    "-" if empty is None else f"{empty:.3f}",
                    "-" if history is None else f"{history:.3f}",
                    _fmt_ratio(ratio_value),
                ]
            )
        out.extend(
            table(
                [
                    "claim+settle one job at a time (watchdog)",
                    "empty table (ms/job)",
                    f"{config.history_rows:,} settled rows (ms/job)",
                    "cost ratio",
                ],
                body,
            )
        )
    delayed_rows = []
    for prefix, name in (("pg", "PostgreSQL"), ("sqlite", "SQLite")):
        if f"{prefix}.delayed.ratio" not in summary:
            continue
        delayed_rows.append(
            [
                name,
                fmt_spread(summary.get(f"{prefix}.delayed.empty", {}).get("watchdog")),
                fmt_spread(summary.get(f"{prefix}.delayed.far", {}).get("watchdog")),
                _fmt_ratio(summary[f"{prefix}.delayed.ratio"].get("watchdog")),
            ]
        )
    if delayed_rows:
        out.append("")
        out.extend(
            table(
                [
                    "claim+settle beside delayed jobs (watchdog)",
                    "empty table (ms/job)",
                    f"{config.delayed_rows:,} delayed jobs (ms/job)",
                    "cost ratio",
                ],
                delayed_rows,
            )
        )
        out.append("ms/job: median (min-max) over rounds; the ratio is of the medians")
    lateness_rows = []
    for prefix, name in (("pg", "PostgreSQL"), ("sqlite", "SQLite")):
        value = summary.get(f"{prefix}.lateness", {}).get("watchdog")
        if not value:
            continue

        def ms(p: str, value: dict[str, Any] = value) -> str:
            v = value.get(p)
            return "-" if v is None else f"{v:.1f}"

        lateness_rows.append([name, ms("p50"), ms("p95"), ms("p99"), ms("max"), str(value.get("samples") or 0)])
    if lateness_rows:
        out.append("")
        out.extend(
            table(
                [
                    "delayed start lateness, idle runner (watchdog)",
                    "p50 (ms)",
                    "p95 (ms)",
                    "p99 (ms)",
                    "max (ms)",
                    "samples",
                ],
                lateness_rows,
            )
        )
        lead = config.lateness_lead
        out.append(f"lateness: handler start - run_at; run_at {lead[0]:g}-{lead[1]:g} s after each enqueue")
    prune_rows = []
    for prefix, name in (("pg", "PostgreSQL"), ("sqlite", "SQLite")):
        value = summary.get(f"{prefix}.prune", {}).get("watchdog")
        if not value:
            continue

        def num(key: str, digits: int = 1, value: dict[str, Any] = value) -> str:
            v = value.get(key)
            return "-" if v is None else f"{v:,.{digits}f}"

        prune_rows.append(
            [
                name,
                num("p50_plain"),
                num("p99_plain"),
                num("p50_pruning"),
                num("p99_pruning"),
                _fmt_ratio(value.get("ratio")),
                num("pruned_per_s", 0),
                str(value.get("samples") or 0),
            ]
        )
    if prune_rows:
        out.append("")
        out.extend(
            table(
                [
                    "claim latency while pruning (watchdog)",
                    "p50 (ms)",
                    "p99 (ms)",
                    "p50 pruning (ms)",
                    "p99 pruning (ms)",
                    "p99 ratio",
                    "pruned (rows/s)",
                    "samples",
                ],
                prune_rows,
            )
        )
        out.append(
            "claim latency: handler start - enqueue commit, one job at a time, runner with its defaults;"
            f" pruning: retention=Retention(completed={PRUNE_RETENTION_DAYS} days) deleting"
            f" {config.prune_rows:,} older settled jobs"
        )
    ops_rows = []
    for key, label in (
        ("pg.ops.stats", "stats()"),
        ("pg.ops.list_first", "list_jobs(limit=100), first page"),
        ("pg.ops.list_queued", "list_jobs(state='queued', limit=100), first page"),
    ):
        value = summary.get(key, {}).get("watchdog")
        if not value:
            continue
        ops_rows.append([label, f"{value['p50']:.2f}", f"{value['p99']:.2f}", str(value.get("samples") or 0)])
    if ops_rows:
        out.append("")
        out.extend(table(["operations reads, PostgreSQL (watchdog)", "p50 (ms)", "p99 (ms)", "calls"], ops_rows))
        last_hour = config.stats_settled * 3_600_000 // STATS_SPAN_MS
        out.append(
            f"{config.stats_settled:,} settled jobs over 30 days (~{last_hour:,} in the last hour),"
            f" then {config.stats_queued:,} queued ones, in {STATS_QUEUES} queues"
        )
    return "\n".join(out)


def check_targets(summary: dict[str, dict[str, Any]], config: Config) -> list[dict[str, Any]]:
    """The targets of issues 5, 9 and 10, as measured in this run."""
    checks: list[dict[str, Any]] = []

    def get(key: str, subject: str) -> Any:
        return summary.get(key, {}).get(subject)

    drain_keys = [k for k, _ in THROUGHPUT_ROWS if k.startswith("pg.drain.")]
    wd_best = max(((get(k, "watchdog"), k) for k in drain_keys if get(k, "watchdog") is not None), default=(None, None))
    for peer, factor in (("pgqueuer", 2.0), ("procrastinate", 10.0)):
        base = max(
            (v for v in (get("pg.drain.defaults.p1", peer), get("pg.drain.defaults.p2", peer)) if v is not None),
            default=None,
        )
        if wd_best[0] is not None and base:
            checks.append(
                {
                    "target": f"drain >= {factor:g}x {peer} with its defaults",
                    "measured": f"{wd_best[0] / base:.2f}x (watchdog best {wd_best[0]:,.0f} jobs/s at {wd_best[1]};"
                    f" {peer} defaults best of 1/2 processes {base:,.0f} jobs/s)",
                    "met": wd_best[0] >= factor * base,
                }
            )
    # Issue 13: watchdog's defaults against pgqueuer's, process count for process count.
    for procs in (1, 2):
        key = f"pg.drain.defaults.p{procs}"
        wd, pq = get(key, "watchdog"), get(key, "pgqueuer")
        if wd and pq:
            checks.append(
                {
                    "target": f"drain with defaults >= pgqueuer's defaults, {procs} process{'es' if procs > 1 else ''}",
                    "measured": f"{wd / pq:.2f}x ({wd:,.0f} vs {pq:,.0f} jobs/s)",
                    "met": wd >= pq,
                }
            )
    for key, label, factor in (
        ("pg.enqueue_batch", "batch enqueue >= pgqueuer", 1.0),
        ("pg.enqueue_single", "one-job-per-transaction enqueue >= 1.5x pgqueuer", 1.5),
    ):
        wd, pq = get(key, "watchdog"), get(key, "pgqueuer")
        if wd and pq:
            checks.append(
                {
                    "target": label,
                    "measured": f"{wd / pq:.2f}x ({wd:,.0f} vs {pq:,.0f} jobs/s)",
                    "met": wd >= factor * pq,
                }
            )
    latency = get("pg.latency", "watchdog")
    if latency and latency.get("p50") is not None:
        checks.append(
            {
                "target": "median wake latency <= 5 ms",
                "measured": f"{latency['p50']:.1f} ms",
                "met": latency["p50"] <= 5.0,
            }
        )
    for prefix in ("pg", "sqlite"):
        ratio_value = get(f"{prefix}.claim.ratio", "watchdog")
        if ratio_value is not None:
            checks.append(
                {
                    "target": f"{prefix}: claim cost with {config.history_rows:,} settled rows <= 1.3x empty",
                    "measured": f"{ratio_value:.2f}x",
                    "met": ratio_value <= 1.3,
                }
            )
    for prefix in ("pg", "sqlite"):
        ratio_value = get(f"{prefix}.delayed.ratio", "watchdog")
        if ratio_value is not None:
            checks.append(
                {
                    "target": f"{prefix}: claim cost with {config.delayed_rows:,} delayed jobs <= 1.3x empty (issue 9)",
                    "measured": f"{ratio_value:.2f}x",
                    "met": ratio_value <= 1.3,
                }
            )
    for prefix in ("pg", "sqlite"):
        value = get(f"{prefix}.prune", "watchdog")
        if value and value.get("ratio") is not None:
            checks.append(
                {
                    "target": f"{prefix}: claim latency p99 while pruning {config.prune_rows:,} old jobs"
                    " <= 2x without pruning (issue 10)",
                    "measured": f"{value['ratio']:.2f}x ({value['p99_pruning']:.1f} vs {value['p99_plain']:.1f} ms)",
                    "met": value["ratio"] <= 2.0,
                }
            )
    stats = get("pg.ops.stats", "watchdog")
    if stats and stats.get("p50") is not None:
        checks.append(
            {
                "target": f"stats() < 50 ms with {config.stats_settled:,} settled and {config.stats_queued:,} queued"
                " jobs (issue 10; median)",
                "measured": f"median {stats['p50']:.1f} ms, p99 {stats['p99']:.1f} ms",
                "met": stats["p50"] < 50.0,
            }
        )
    return checks


# -- entry points ------------------------------------------------------------------------


def worker_entry(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="run.py worker")
    parser.add_argument("--subject", required=True, choices=sorted(SUBJECT_MODULES))
    parser.add_argument("--target", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--defaults", action="store_true")
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--asyncio", action="store_true", help="watchdog only: AsyncRunner")
    args = parser.parse_args(argv)
    harness.exit_with_parent()
    extra = {"use_asyncio": True} if args.asyncio else {}
    load_subject(args.subject).worker_main(
        Target.from_json(args.target), args.concurrency, args.defaults, args.latency, **extra
    )


def retention_worker_entry(argv: list[str]) -> None:
    """A runner process with its defaults (``Runner(engine, handlers)`` on
    ``create_engine(url)``) whose handler prints ``START <job_id> <time>``;
    with ``--prune`` it is given ``retention=Retention(completed=7 days)``."""
    import logging
    from datetime import timedelta

    from sqlalchemy import create_engine, text
    from subjects import QUEUE

    from sqlalchemy_watchdog import Retention, Runner

    parser = argparse.ArgumentParser(prog="run.py retention-worker")
    parser.add_argument("--target", required=True)
    parser.add_argument("--prune", action="store_true")
    args = parser.parse_args(argv)
    harness.exit_with_parent()
    logging.basicConfig(level=logging.WARNING)
    target = Target.from_json(args.target)

    def handler(job: Any) -> None:
        print(f"START {job.job_id} {time.time():.6f}", flush=True)

    engine = create_engine(target.sqlalchemy_url)
    retention = Retention(completed=timedelta(days=PRUNE_RETENTION_DAYS)) if args.prune else None
    runner = Runner(engine, {QUEUE: handler}, retention=retention)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    print("READY", flush=True)
    runner.run_forever()
    engine.dispose()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_entry(sys.argv[2:])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "retention-worker":
        retention_worker_entry(sys.argv[2:])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "producer":
        round2.producer_entry(sys.argv[2:])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "inprocess":
        round2.inprocess_entry(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke test (~2 min)")
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs per figure; medians are reported (default 3, --quick 1)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every run and the medians here")
    parser.add_argument(
        "--subjects", default="watchdog,procrastinate,pgqueuer", help="comma-separated (default: all three)"
    )
    parser.add_argument(
        "--scenarios",
        default=(
            "enqueue,drain,latency,claim,delayed,lateness,prune,stats,txn,producers,inprocess,scaleout,scale,"
            "postgresql,sqlite"
        ),
        help=(
            "comma-separated subset of enqueue,drain,latency,claim,delayed,lateness,prune,stats,"
            "txn,producers,inprocess,scaleout,scale and of the dialects postgresql,sqlite"
        ),
    )
    parser.add_argument(
        "--scale-settled",
        type=int,
        default=None,
        help="scale: settled and scheduled jobs (default 1,000,000; --quick 20,000); queued: a tenth (at least 2,000)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write drain, latency and scale-out charts (PNG) here")
    parser.add_argument(
        "--drain-jobs", type=int, default=None, help="jobs per drain measurement for every queue (default: per queue)"
    )
    parser.add_argument(
        "--drain-rows",
        default=None,
        help="drain rows to run, by a part of their key: e.g. defaults,c16,p1 (a row runs if any part matches)",
    )
    parser.add_argument(
        "--concurrencies",
        default=None,
        help="drain concurrencies per worker process (default 1,4,16; the async rows use the same)",
    )
    args = parser.parse_args()
    config = Config.make(args.quick, args.repeat)
    if args.concurrencies:
        config.concurrencies = tuple(int(part) for part in args.concurrencies.split(",") if part.strip())
        config.async_concurrencies = config.concurrencies
    if args.drain_rows:
        config.drain_rows = tuple(part.strip() for part in args.drain_rows.split(",") if part.strip())
    if args.drain_jobs:
        config.drain = {name: args.drain_jobs for name in config.drain}
        config.sqlite_drain = args.drain_jobs
    if args.scale_settled:
        config.scale_settled = config.scale_scheduled = args.scale_settled
        config.scale_queued = max(2_000, args.scale_settled // 10)

    def terminated(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    subjects = [s.strip() for s in args.subjects.split(",") if s.strip()]
    available = []
    for name in subjects:
        if name not in SUBJECT_MODULES:
            parser.error(f"unknown subject {name!r}")
        try:
            if name != "watchdog":
                importlib.import_module(name)
            load_subject(name)
            available.append(name)
        except ImportError as error:
            print(f"skipping {name}: {error} (install the bench extra: pip install -e '.[bench]')", file=sys.stderr)
    scenarios = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    if not scenarios & {"postgresql", "sqlite"}:
        scenarios |= {"postgresql", "sqlite"}

    with tempfile.TemporaryDirectory(prefix="watchdog_bench_") as tmp:
        workdir = Path(tmp)
        facts = machine_facts(workdir)
        print(describe_machine(facts), file=sys.stderr, flush=True)
        pg = facts.get("postgresql", {})
        if pg.get("fsync") != "on" or pg.get("synchronous_commit") != "on":
            print("WARNING: the server is not at durable defaults; figures are not comparable", file=sys.stderr)
        bench = Bench(config, available, scenarios, workdir)
        try:
            bench.run()
        except KeyboardInterrupt:
            print("interrupted; reporting what was measured", file=sys.stderr)
        finally:
            bench.close()
            harness.drop_all_created()
        summary = summarise(bench.results)
        checks = check_targets(summary, config)
        elapsed = time.monotonic() - bench.started

    print()
    print(describe_machine(facts))
    mode = "quick" if config.quick else "full"
    print(f"mode: {mode}, medians of {config.repeat} run(s), {elapsed:.0f}s in all")
    print()
    print(render_table(summary, available, config))
    more = round2.render(bench.results, summary, config)
    if more:
        print()
        print(more)
    print(f"\nload at the end: {round2.load()}")
    if args.plot:
        for path in round2.plot(summary, available, args.plot):
            print(f"wrote {path}")
    if checks:
        print()
        print("targets:")
        for check in checks:
            print(f"  [{'met' if check['met'] else 'MISSED'}] {check['target']}: {check['measured']}")
    if bench.errors:
        print()
        print(f"{len(bench.errors)} measurement(s) failed:")
        for failure in bench.errors:
            print("  - " + failure.replace("\n", "\n    "))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": facts,
                    "config": asdict(config),
                    "subjects": available,
                    "runs": bench.results,
                    "medians": summary,
                    "targets": checks,
                    "errors": bench.errors,
                    "elapsed_s": elapsed,
                },
                indent=2,
                default=str,
            )
            + "\n"
        )
        print(f"\nwrote {args.json}")
    return 1 if bench.errors else 0


if __name__ == "__main__":
    sys.exit(main())
