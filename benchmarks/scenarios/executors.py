"""The process executor against threads: CPU-bound handlers over the cores, and what a job
costs when it crosses to a child process and back."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from functools import partial
from typing import Any

from benchmarks import harness as h
from sqlalchemy_watchdog import Job, ProcessExecutor, Runner, RunningJob, Watchdog

EXEC_QUEUE = "bench-exec"


def spin(job: RunningJob) -> None:
    """The CPU-bound handler: ``payload["loops"]`` rounds of pure Python (about 10 ms, calibrated)."""
    total = 0
    for i in range(job.payload["loops"]):
        total += i * i % 7


def noop(job: RunningJob) -> None:
    """The no-op handler: what remains is the executor's own cost per job."""


def _loops_for(ms: float) -> int:
    """How many rounds of :func:`spin` take ``ms`` milliseconds here, alone (best of 5)."""
    probe = 200_000
    best = min(_timed_spin(probe) for _ in range(5))
    return max(1, int(probe * ms / 1000 / best))


def _timed_spin(loops: int) -> float:
    job: Any = type("J", (), {"payload": {"loops": loops}})()
    started = time.perf_counter()
    spin(job)
    return time.perf_counter() - started


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _drain(target: h.Target, handler: Any, n: int, loops: int, tag: str, **options: Any) -> float:
    """Jobs/s of one runner (``options``: its executor or concurrency) serving ``n`` jobs of
    ``handler``, started after a warm-up that starts every child."""
    h.truncate(target)
    with h.disposed(h.engine(target)) as eng:
        watchdog = Watchdog(eng)
        runner = Runner(eng, {EXEC_QUEUE: handler}, poll_interval=timedelta(milliseconds=20), **options)
        slots = runner.settings.concurrency
        with runner.running():
            watchdog.enqueue([Job(f"{tag}-warm-{i}", EXEC_QUEUE, payload={"loops": loops}) for i in range(slots)])
            _wait_drained(watchdog, 120)
            jobs = [Job(f"{tag}-{i}", EXEC_QUEUE, payload={"loops": loops}) for i in range(n)]
            started = time.perf_counter()
            watchdog.enqueue(jobs)
            _wait_drained(watchdog, 60 + n)
            elapsed = time.perf_counter() - started
    return n / elapsed


#: How often the drain's end is looked for. Every 5 ms, the look itself (a query from the
#: runner's own process, 200 a second) took CPU from the children on 2 cores; every 20 ms
#: it ends a drain of 600 jobs (3 s and more) at most 0.7% late, in every row alike.
DRAINED_POLL_S = 0.02


def _wait_drained(watchdog: Watchdog, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while watchdog.has_pending_work():
        if time.monotonic() > deadline:
            raise h.ScenarioTimeout(f"jobs still pending after {timeout:.0f}s")
        time.sleep(DRAINED_POLL_S)


@h.scenario("executors", per_repeat=True, options=h.JOBS)
def executors(bench: h.Bench, r: int) -> None:
    """Jobs/s of a ~10 ms pure-Python handler: threads vs 1 and N child processes; the no-op drain's cost per job."""
    cores = _cores()
    loops = _loops_for(10.0)
    for dialect in bench.dialects():
        target = bench.target("watchdog", dialect)
        prefix = "PostgreSQL" if dialect == "postgresql" else "SQLite"
        cpu = f"CPU-bound handler, ~10 ms (jobs/s), {prefix}, {cores} core(s)"
        bench.table(cpu)
        n = bench.opt("jobs", 600, 40)
        rows = [
            (f"threads c{cores}", {"concurrency": cores}),
            ("process p1", {"executor": ProcessExecutor(processes=1)}),
            (f"process p{cores}", {"executor": ProcessExecutor(processes=cores)}),
        ]
        for row, options in rows:
            run = partial(_drain, target, spin, n, loops, f"cpu-{row}-{r}", **options)
            bench.measure(cpu, row, "watchdog", run, timeout=120 + n)
        overhead = f"no-op handler (jobs/s), {prefix}"
        bench.table(overhead)
        n = bench.opt("jobs", 3000, 200)
        for row, options in ((f"threads c{cores}", {"concurrency": cores}), (f"process p{cores}", rows[2][1])):
            run = partial(_drain, target, noop, n, 0, f"noop-{row}-{r}", **options)
            bench.measure(overhead, row, "watchdog", run, timeout=120 + n / 10)
        if r == bench.repeat - 1:
            one = bench.medians(cpu, "process p1").get("watchdog")
            many = bench.medians(cpu, f"process p{cores}").get("watchdog")
            if one and many and cores >= 2:
                goal = f"CPU-bound throughput scales with processes: p{cores} >= 1.8x p1 ({prefix})"
                bench.check(goal, f"{many / one:.2f}x", many / one >= 1.8)
            threads = bench.medians(overhead, f"threads c{cores}").get("watchdog")
            processes = bench.medians(overhead, f"process p{cores}").get("watchdog")
            if threads and processes:  # the drain's wall time per job that the children add
                bench.record(
                    overhead, "process - threads (us per job)", "watchdog", (1 / processes - 1 / threads) * 1e6
                )
