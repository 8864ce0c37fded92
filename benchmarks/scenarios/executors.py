"""The process executor against threads: CPU-bound handlers over the cores, and what a job
costs when it crosses to a child process and back."""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from sqlalchemy import func, select

from benchmarks import harness as h
from sqlalchemy_watchdog import Job, ProcessExecutor, Runner, RunningJob, Watchdog, WatchdogJob

EXEC_QUEUE = "bench-exec"
#: How often the drain's end is looked for. The drain is timed by the database's own
#: timestamps (see :func:`_drain`), so the look may be rare: each is a query from the runner's
#: own process, which on 2 cores takes CPU from the children (every 20 ms, as once, that was
#: 50 queries a second).
DRAINED_POLL_S = 0.2


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
    """Jobs/s of one runner with its default settings (``options``: its executor or
    concurrency) serving ``n`` jobs of ``handler``, started after a warm-up that starts every
    child: ``n`` over the time from the first claim (``started_at``) to the last settle
    (``settled_at``), both on the database clock -- the runner's throughput while busy, with
    neither its pick-up of the first job nor the look for the drain's end in it."""
    h.truncate(target)
    with h.disposed(h.engine(target)) as eng:
        watchdog = Watchdog(eng)

        def drained(timeout: float) -> float:
            check = lambda: not watchdog.has_pending_work()
            return h.poll_until(check, timeout=timeout, interval=DRAINED_POLL_S, what="drain")

        runner = Runner(eng, {EXEC_QUEUE: handler}, **options)
        with runner.running():
            slots = runner.settings.concurrency
            watchdog.enqueue([Job(f"{tag}-warm-{i}", EXEC_QUEUE, payload={"loops": loops}) for i in range(slots)])
            drained(120)
            watchdog.enqueue([Job(f"{tag}-{i}", EXEC_QUEUE, payload={"loops": loops}) for i in range(n)])
            drained(60 + n)
        row = WatchdogJob.__table__.c
        span = select(func.min(row.started_at), func.max(row.settled_at), func.count()).where(
            row.job_id.like(f"{tag}-%"), row.job_id.not_like(f"{tag}-warm-%")
        )
        with eng.connect() as conn:
            first, last, count = conn.execute(span).one()
        if count != n or first is None or last is None or last <= first:
            raise h.ScenarioFailed(f"drain {tag}: {count} of {n} jobs timed ({first}, {last})")
        return n / ((last - first) / 1000)


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
