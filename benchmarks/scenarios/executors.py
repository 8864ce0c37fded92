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
#: How often the drain's end is looked for. Every 5 ms, the look itself (a query from the
#: runner's own process, 200 a second) took CPU from the children on 2 cores; every 20 ms
#: it ends a drain of 600 jobs (3 s and more) at most 0.7% late, in every row alike.
DRAINED_POLL_S = 0.02


def spin(job: RunningJob) -> None:
    """The CPU-bound handler: ``payload["loops"]`` rounds of pure Python (about 10 ms, calibrated)."""
    total = 0
    for i in range(job.payload["loops"]):
        total += i * i % 7


def noop(job: RunningJob) -> None:
    """The no-op handler: what remains is the executor's own cost per job."""


def _loops_for(ms: float, probe: int = 200_000) -> int:
    """How many rounds of :func:`spin` take ``ms`` milliseconds here, alone (best of 5)."""
    job: Any = type("J", (), {"payload": {"loops": probe}})()
    best = min(h.time_calls(partial(spin, job), 5, warmup=0)) / 1000
    return max(1, int(probe * ms / 1000 / best))


def _drain(target: h.Target, handler: Any, n: int, loops: int, tag: str, **options: Any) -> float:
    """Jobs/s of one runner (``options``: its executor or concurrency) serving ``n`` jobs of
    ``handler``, started after a warm-up that starts every child."""
    h.truncate(target)
    with h.disposed(h.engine(target)) as eng:
        watchdog = Watchdog(eng)
        drained = lambda timeout: h.poll_until(
            lambda: not watchdog.has_pending_work(), timeout=timeout, interval=DRAINED_POLL_S, what="drain"
        )
        runner = Runner(eng, {EXEC_QUEUE: handler}, poll_interval=timedelta(milliseconds=20), **options)
        with runner.running():
            slots = runner.settings.concurrency
            watchdog.enqueue([Job(f"{tag}-warm-{i}", EXEC_QUEUE, payload={"loops": loops}) for i in range(slots)])
            drained(120)
            jobs = [Job(f"{tag}-{i}", EXEC_QUEUE, payload={"loops": loops}) for i in range(n)]
            started = time.perf_counter()
            watchdog.enqueue(jobs)
            return n / (drained(60 + n) - started)


@h.scenario("executors", per_repeat=True, options=h.JOBS)
def executors(bench: h.Bench, r: int) -> None:
    """Jobs/s of a ~10 ms pure-Python handler: threads vs 1 and N child processes; the no-op drain's cost per job."""
    cores, loops = len(os.sched_getaffinity(0)), _loops_for(10.0)
    for dialect in bench.dialects():
        target, label = bench.target("watchdog", dialect), h.LABEL[dialect]
        cpu = f"CPU-bound handler, ~10 ms (jobs/s), {label}, {cores} core(s)"
        overhead = f"no-op handler (jobs/s), {label}"
        threads, one, many = f"threads c{cores}", "process p1", f"process p{cores}"
        options = {threads: {"concurrency": cores}, one: {"executor": ProcessExecutor(processes=1)}}
        options[many] = {"executor": ProcessExecutor(processes=cores)}
        for table, handler, rows, n, spins in (
            (cpu, spin, options, bench.opt("jobs", 600, 40), loops),
            (overhead, noop, (threads, many), bench.opt("jobs", 3000, 200), 0),
        ):
            bench.table(table)
            for row in rows:
                run = partial(_drain, target, handler, n, spins, f"{handler.__name__[:4]}-{row}-{r}", **options[row])
                bench.measure(table, row, "watchdog", run, timeout=120 + (n if handler is spin else n / 10))
        if r == bench.repeat - 1:
            if cores >= 2:
                goal = f"CPU-bound throughput scales with processes: p{cores} >= 1.8x p1 ({label})"
                bench.check_median(goal, cpu, many, "watchdog", lambda m: m >= 1.8, versus="watchdog", versus_row=one)
            t, p = bench.medians(overhead, threads).get("watchdog"), bench.medians(overhead, many).get("watchdog")
            if t and p:  # the drain's wall time per job that the children add
                bench.record(overhead, "process - threads (us per job)", "watchdog", (1 / p - 1 / t) * 1e6)
