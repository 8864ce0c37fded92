"""How a deployment choice moves the figures: the runner inside a web process, PgBouncer in
transaction mode, OpenTelemetry instrumentation, and the process executor against threads
(CPU-bound handlers over the cores; what a job costs when it crosses to a child process and back)."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from typing import Any

from sqlalchemy import create_engine, func, make_url, select

from benchmarks import harness as h
from sqlalchemy_watchdog import Job, ProcessExecutor, Runner, RunningJob, Watchdog, WatchdogJob


def _post(url: str, body: dict[str, Any]) -> float | None:
    """The request's latency in seconds, None when it failed."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            response.read()
            return time.perf_counter() - started if response.status == 201 else None
    except OSError:
        return None


def _phase(base: str, pid: int, rate: float, seconds: float, work_ms: int) -> dict[str, float]:
    """POST /orders at ``rate`` per second for ``seconds``: latency p50/p95, failures, server CPU."""
    answers: list[float | None] = []
    threads, cpu, wall = [], h.cpu_seconds(pid), time.monotonic()
    one = lambda: answers.append(_post(f"{base}/orders", {"customer": "bench", "work_ms": work_ms}))
    next_at = time.monotonic()
    while next_at < wall + seconds:
        time.sleep(max(0.0, next_at - time.monotonic()))
        threads.append(threading.Thread(target=one, daemon=True))
        threads[-1].start()
        next_at += 1.0 / rate
    for thread in threads:
        thread.join(15)
    latencies = [latency for latency in answers if latency is not None]
    figures: dict[str, float] = {"requests": len(latencies), "failed": len(answers) - len(latencies)}
    figures |= {f"p{p} (ms)": h.percentile(latencies, p) * 1000 for p in (50, 95)}
    return figures | {"server CPU (%)": 100 * (h.cpu_seconds(pid) - cpu) / (time.monotonic() - wall)}


@h.scenario("in-process", options="url rate seconds backlog work-ms")
def in_process(bench: h.Bench) -> None:
    """Request latency and CPU of examples/fastapi_in_process.py (uvicorn) with its runner idle and busy."""
    rate, seconds = bench.opt("rate", 75.0), bench.opt("seconds", 30.0, 5.0)
    backlog, work_ms = bench.opt("backlog", 2000, 200), bench.opt("work_ms", 5)
    scratch = None if bench.opt("url", None) else bench.scratch("postgresql", "in_process")
    env = {**h.child_env(), "WATCHDOG_DATABASE_URL": bench.opt("url", scratch.url if scratch else "")}
    examples = h.ROOT / "examples"
    upgrade = [sys.executable, "-m", "sqlalchemy_watchdog.cli", "upgrade"]
    subprocess.run(upgrade, cwd=examples, env=env, check=True, capture_output=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base, table = f"http://127.0.0.1:{port}", f"web process with its runner, POST /orders at {rate:g}/s"
    argv = [sys.executable, "-m", "uvicorn", "fastapi_in_process:app", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(argv, cwd=examples, env=env)
    try:
        deadline = time.monotonic() + 30
        while _post(f"{base}/orders", {"customer": "warmup"}) is None:
            if time.monotonic() > deadline or server.poll() is not None:
                raise h.ScenarioFailed("the app did not start")
            time.sleep(0.1)
        for _ in range(bench.repeat):
            bench.measure(table, "", "runner idle", partial(_phase, base, server.pid, rate, seconds, 0), seconds + 60)
            for _ in range(backlog):  # a backlog the runner works through during the busy phase
                _post(f"{base}/orders", {"customer": "backlog", "work_ms": work_ms})
            busy = partial(_phase, base, server.pid, rate, seconds, work_ms)
            bench.measure(table, "", "runner busy", busy, seconds + 60)
    finally:
        server.terminate()
        server.wait(60)
        if scratch:
            h.drop(scratch)


# -- PgBouncer ---------------------------------------------------------------------------------


def _pool_engine(url: Any, pooled: bool, pool_size: int = 5) -> Any:
    options = {"connect_args": {"prepare_threshold": None}} if pooled else {}
    return create_engine(url, pool_size=pool_size, max_overflow=70, **options)


def _pool_latency(target: h.Target, url: Any, samples: int, pooled: bool, **options: Any) -> dict[str, float]:
    """Commit -> handler start (ms) of an in-process Runner, jobs 5-300 ms apart (random
    phases of a 0.25 s poll)."""
    h.run_sql(target, "TRUNCATE watchdog_jobs RESTART IDENTITY")
    started: dict[str, float] = {}
    arrived = threading.Event()
    handler = lambda job: (started.__setitem__(job.job_id, time.perf_counter()), arrived.set())
    runner = Runner(_pool_engine(url, pooled), {"lat": handler}, **options)
    producer, stop, delays = _pool_engine(url, pooled), h.serve_in_thread(runner), []
    try:
        time.sleep(2.5)  # the session proof and the first idle pass
        for i in range(samples):
            arrived.clear()
            committed = h.Watchdog.commit_jobs(producer, Job(f"lat-{i}", "lat"))
            if not arrived.wait(10):
                raise h.ScenarioFailed(f"job lat-{i} did not start within 10 s")
            delays.append((started[f"lat-{i}"] - committed) * 1000)
            time.sleep(random.uniform(0.005, 0.3))
    finally:
        stop()
        runner.engine.dispose()
        producer.dispose()
    return {"p50 (ms)": h.percentile(delays, 50), "p95 (ms)": h.percentile(delays, 95)}


def _pool_drain(target: h.Target, url: Any, jobs: int, pooled: bool, concurrency: int | None) -> float:
    """jobs/s of one in-process Runner (``wakeups="poll"``) draining ``jobs`` prefilled jobs."""
    h.truncate(target)
    options = {} if concurrency is None else {"concurrency": concurrency}
    gc.collect()
    with h.disposed(_pool_engine(url, pooled, 5 if concurrency is None else concurrency + 3)) as eng:
        return h.drain_here(target, Runner(eng, {h.QUEUE: lambda job: None}, wakeups="poll", **options), jobs)


def _pool_enqueue(target: h.Target, url: Any, pooled: bool, batches: int, size: int) -> float:
    """jobs/s of ``batches`` transactions of ``size`` jobs (one ``enqueue`` call each)."""
    h.truncate(target)
    with h.disposed(_pool_engine(url, pooled)) as eng:
        return batches * size / h.Watchdog().enqueue_batch(target, batches, size, "enq", eng)


@h.scenario("poolers", options="jobs samples")
def poolers(bench: h.Bench) -> None:
    """Direct beside PgBouncer in transaction mode: start latency, drain, enqueue (needs /usr/sbin/pgbouncer)."""
    sys.path.insert(0, str(h.ROOT))
    from tests.servers.pgbouncer import MISSING, PgBouncer, available

    if not available():
        raise h.ScenarioFailed(MISSING)
    samples, jobs = bench.opt("samples", 150, 20), bench.opt("jobs", 20_000, 500)
    table = "direct beside PgBouncer (transaction mode, pool of 20)"
    bouncer = PgBouncer(make_url(h.ADMIN_DSN).set(drivername="postgresql+psycopg"))
    with bench.database("postgresql", "poolers") as target:
        direct = make_url(target.url)
        bouncer.start()
        pooled, listen = bouncer.url(target.name), _pool_engine(direct, False)
        try:
            for _ in range(bench.repeat):  # direct and pooled alternate round by round
                for column, url, is_pooled, options in [
                    ("direct, auto (listens)", direct, False, {}),
                    ("pooled, auto, no listen URL (polls 0.25 s)", pooled, True, {}),
                    ("pooled, auto + listen_engine", pooled, True, {"listen_engine": listen}),
                    ("direct, poll", direct, False, {"wakeups": "poll"}),
                ]:
                    run = partial(_pool_latency, target, url, samples, is_pooled, **options)
                    bench.measure(table, "start latency", column, run, 600)
                for column, url, is_pooled in (("direct", direct, False), ("pooled", pooled, True)):
                    for c in (None, 64):
                        row = f"drain (jobs/s), {'defaults' if c is None else f'concurrency {c}'}"
                        bench.measure(table, row, column, partial(_pool_drain, target, url, jobs, is_pooled, c), 900)
                    for batches, size, row in ((2000, 1, "one per transaction"), (20, 1000, "batches of 1,000")):
                        run = partial(_pool_enqueue, target, url, is_pooled, batches, size)
                        bench.measure(table, f"enqueue (jobs/s), {row}", column, run, 900)
        finally:
            bouncer.stop()
            listen.dispose()


# -- OpenTelemetry ---------------------------------------------------------------------------

MODES = ("off", "on", "on+stats")


def otel_role(target: h.Target, jobs: int, concurrency: int, mode: str) -> None:
    """One drain in a fresh process: ``off`` never imports OpenTelemetry (checked); ``on``
    instruments with the SDK (batch span processor to an exporter that drops the spans,
    metrics to an in-memory reader); ``on+stats`` adds the queue-depth gauges, collected
    every second. RESULT jobs/s from the runner's start until every job settled."""
    h.install_watchdog(target, fresh=True)
    eng, shutdown = h.engine(target), []
    if mode != "off":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        from sqlalchemy_watchdog.otel import instrument

        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        tracer, reader = TracerProvider(), InMemoryMetricReader()
        tracer.add_span_processor(BatchSpanProcessor(Drop()))
        meter = MeterProvider(metric_readers=[reader])
        instrument(tracer_provider=tracer, meter_provider=meter, stats_engine=eng if mode == "on+stats" else None)
        shutdown = [tracer.shutdown, meter.shutdown]

        def collect() -> None:
            while True:
                time.sleep(1.0)
                reader.get_metrics_data()

        if mode == "on+stats":
            threading.Thread(target=collect, daemon=True).start()
    rate = h.drain_here(target, Runner(eng, {h.QUEUE: lambda job: None}, concurrency=concurrency), jobs)
    for close in shutdown:
        close()
    if mode == "off" and (loaded := sorted(m for m in sys.modules if m.startswith("opentelemetry"))):
        raise SystemExit(f"mode off loaded OpenTelemetry: {loaded[:3]}")
    h.say("RESULT", rate)


@h.scenario("otel-overhead", options="jobs concurrency")
def otel_overhead(bench: h.Bench) -> None:
    """Drain jobs/s with OpenTelemetry off, on (SDK), on + queue-depth gauges; both dialects."""
    jobs, concurrency = bench.opt("jobs", 3000, 300), bench.opt("concurrency", 16)
    table = f"OpenTelemetry, drain of {jobs:,} jobs at concurrency {concurrency} (jobs/s)"
    bench.table(table, ratios="off")
    for dialect in bench.dialects():
        with bench.database(dialect, "otel", install=False) as target:
            for r in range(bench.repeat):
                for mode in h.rotate(MODES, r):  # so that no mode always runs first
                    log, options = bench.workdir / f"otel-{dialect}-{mode}-{r}.log", {"jobs": jobs, "mode": mode}
                    child = partial(h.Child, log, otel_role, target=target, concurrency=concurrency, **options)
                    bench.measure(table, dialect, mode, lambda child=child: float(child().result(900)), 900)


# -- executors -------------------------------------------------------------------------------

EXEC_QUEUE = "bench-exec"
#: The peer column of the CPU-bound rows: a bare process pool, no queue (the machine's ceiling).
BARE_POOL = "bare multiprocessing pool"
#: How often the drain's end is looked for: rarely, as the drain is timed by the database's own
#: timestamps (README.md, "Executors": on 2 cores, every 20 ms took CPU from the children).
DRAINED_POLL_S = 0.2


def spin_loops(loops: int) -> int:
    """``loops`` rounds of pure Python: the CPU-bound handler's work, also run by the bare pool."""
    total = 0
    for i in range(loops):
        total += i * i % 7
    return total


def spin(job: RunningJob) -> None:
    """The CPU-bound handler: ``payload["loops"]`` rounds of pure Python (about 10 ms, calibrated)."""
    spin_loops(job.payload["loops"])


def noop(job: RunningJob) -> None:
    """The no-op handler: what remains is the executor's own cost per job."""


def _loops_for(ms: float, probe: int = 200_000) -> int:
    """How many rounds of :func:`spin` take ``ms`` milliseconds here, alone (best of 5)."""
    job: Any = type("J", (), {"payload": {"loops": probe}})()
    best = min(h.time_calls(partial(spin, job), 5, warmup=0)) / 1000
    return max(1, int(probe * ms / 1000 / best))


def _drain(target: h.Target, handler: Any, n: int, loops: int, tag: str, **options: Any) -> float:
    """Jobs/s of one runner with its defaults (``options``: its executor or concurrency) serving ``n``
    jobs of ``handler`` after a warm-up: first claim to last settle on the database clock (README.md, "Executors")."""
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


def _bare_pool(processes: int, n: int, loops: int) -> float:
    """Jobs/s of a bare ``multiprocessing`` pool of ``processes`` spawned children running ``n``
    rounds of the CPU-bound handler's work, one task at a time, after one warm-up task each: no
    queue and no database, what this machine's cores give -- the ceiling of the executor's rows."""
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(spin_loops, [loops] * processes, chunksize=1)
        started = time.perf_counter()
        for _ in pool.imap_unordered(spin_loops, [loops] * n, chunksize=1):
            pass
        return n / (time.perf_counter() - started)


@h.scenario("executors", per_repeat=True, options="jobs")
def executors(bench: h.Bench, r: int) -> None:
    """Jobs/s of a ~10 ms pure-Python handler: threads vs 1 and N child processes, beside a bare process
    pool's (the machine's ceiling); the no-op drain's cost per job."""
    cores, loops = len(os.sched_getaffinity(0)), _loops_for(10.0)
    for dialect in bench.dialects():
        target, label = bench.target("watchdog", dialect), h.LABEL[dialect]
        cpu = f"CPU-bound handler, ~10 ms (jobs/s), {label}, {cores} core(s)"
        overhead = f"no-op handler (jobs/s), {label}"
        threads, one, many = f"threads c{cores}", "process p1", f"process p{cores}"
        # The same children claiming nothing ahead of them (prefetch=0): what prefetch buys, or costs.
        one_bare, many_bare = f"{one} prefetch 0", f"{many} prefetch 0"
        options = {threads: {"concurrency": cores}, one: {"executor": ProcessExecutor(processes=1)}}
        options[many] = {"executor": ProcessExecutor(processes=cores)}
        options[one_bare] = {"executor": ProcessExecutor(processes=1, prefetch=0)}
        options[many_bare] = {"executor": ProcessExecutor(processes=cores, prefetch=0)}
        for table, handler, rows, n, spins in (
            (cpu, spin, (threads, one, one_bare, many, many_bare), bench.opt("jobs", 600, 40), loops),
            (overhead, noop, (threads, many, many_bare), bench.opt("jobs", 3000, 200), 0),
        ):
            bench.table(table)
            for row in rows:
                run = partial(_drain, target, handler, n, spins, f"{handler.__name__[:4]}-{row}-{r}", **options[row])
                bench.measure(table, row, "watchdog", run, timeout=120 + (n if handler is spin else n / 10))
                if handler is spin and row in (one, many):  # the bare pool beside it, in the same minute
                    bare = partial(_bare_pool, 1 if row == one else cores, n, loops)
                    bench.measure(table, row, BARE_POOL, bare, timeout=120 + n)
        if r == bench.repeat - 1:
            if cores >= 2:
                goal = f"CPU-bound throughput scales with processes: p{cores} >= 1.8x p1 ({label})"
                bench.check_median(goal, cpu, many, "watchdog", lambda m: m >= 1.8, versus="watchdog", versus_row=one)
                for column in ("watchdog", BARE_POOL):  # the same ratio for the machine alone
                    p1, pn = bench.medians(cpu, one).get(column), bench.medians(cpu, many).get(column)
                    if p1 and pn:
                        bench.record(cpu, f"p{cores} / p1 (x)", column, pn / p1)
            t, p = bench.medians(overhead, threads).get("watchdog"), bench.medians(overhead, many).get("watchdog")
            if t and p:  # the drain's wall time per job that the children add
                bench.record(overhead, "process - threads (us per job)", "watchdog", (1 / p - 1 / t) * 1e6)
