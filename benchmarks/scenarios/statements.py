"""What the statements cost: claim+settle without a runner, each index's cost and worth,
and a py-spy profile of a draining runner process."""

from __future__ import annotations

import collections
import contextlib
import shutil
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event

from benchmarks import harness as h
from sqlalchemy_watchdog import Decision, store


def _claim_and_settle(conn: Any, batch: int) -> int:
    """Claim up to ``batch`` jobs and settle them completed, as a runner's loop and settler do."""
    claimed = store.claim(conn, queues=[h.QUEUE], limit=batch, lease_ms=60_000).claimed
    if claimed:
        requests = [store.SettleRequest(c.job.job_id, c.token, Decision.completed()) for c in claimed]
        settled = store.settle_many(conn, requests)
        assert all(s.status is store.SettleStatus.SETTLED for s in settled)
    return len(claimed)


def _hot_round(target: h.Target, jobs: int, batch: int, tag: str) -> dict[str, float]:
    """``jobs`` enqueued (untimed, VACUUM ANALYZE), then claimed ``batch`` at a time and settled on
    one held autocommit connection: wall, client CPU and server CPU in us per job."""
    h.run_sql(target, "TRUNCATE watchdog_jobs")
    h.Watchdog().enqueue_batch(target, jobs // 1000 or 1, min(jobs, 1000), tag)
    h.run_sql(target, "SELECT 1", analyse=True)
    with h.disposed(h.engine(target)) as eng, eng.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        done = sum(_claim_and_settle(conn, 1) for _ in range(10))  # psycopg prepares after the fifth execution
        wall, cpu, server = time.perf_counter(), time.process_time(), h.cpu_seconds(pid)
        measured = 0
        while taken := _claim_and_settle(conn, batch):
            measured += taken
        wall, cpu, server = time.perf_counter() - wall, time.process_time() - cpu, h.cpu_seconds(pid) - server
    if done + measured != (jobs // 1000 or 1) * min(jobs, 1000) + 1:
        raise h.ScenarioFailed(f"claimed {done + measured} jobs")
    figures = {"wall": wall, "client CPU": cpu, "server CPU": server}
    return {f"{name} (us/job)": seconds / measured * 1e6 for name, seconds in figures.items()}


@h.scenario("hot-statements", options="jobs batch-sizes")
def hot_statements(bench: h.Bench) -> None:
    """Microseconds per job (wall, client CPU, server CPU) of store.claim + settle_many without a runner, PostgreSQL."""
    table = "claim + settle_many, one held connection (the server on this machine)"
    sizes, jobs = bench.ints("batch_sizes", "1,10,50"), bench.opt("jobs", 20_000, 2000)
    with bench.database("postgresql", "hot") as target:
        for r in range(bench.repeat):
            for b in sizes if r % 2 == 0 else sizes[::-1]:
                bench.measure(table, f"{b} per statement", "", partial(_hot_round, target, jobs, b, f"r{r}b{b}"))


MODEL = "model (as in model.py)"
LIVE = "state IN ('delayed', 'queued', 'running')"
BEFORE_W0008 = "the set before w0008 (7 entries per ready job)"
CANCELLATION_FULL = [
    "DROP INDEX uq_watchdog_jobs_cancellation_id",
    "ALTER TABLE watchdog_jobs ADD CONSTRAINT uq_watchdog_jobs_cancellation_id UNIQUE (cancellation_id)",
]
READY = ["CREATE INDEX ix_watchdog_jobs_ready ON watchdog_jobs (priority DESC, sequence) WHERE state = 'queued'"]
KEPT_OUT = ("delayed", "settled", "rerun_of", "lease", "live_lane", "live_queue", "lane_history")
#: Each variant: the DDL turning the model's index set into it.
VARIANTS: dict[str, list[str]] = {
    MODEL: [],
    BEFORE_W0008: [  # revisions w0010 and w0008 back to w0007
        "DROP INDEX ix_watchdog_jobs_lane_history",
        *CANCELLATION_FULL,
        *READY,
        "CREATE INDEX ix_watchdog_jobs_queued_since ON watchdog_jobs (queue_name, coalesce(ready_at, enqueued_at)) WHERE state = 'queued'",
        "DROP INDEX ix_watchdog_jobs_live_lane",
        f"CREATE INDEX ix_watchdog_jobs_live_lane ON watchdog_jobs (lane, state DESC, sequence) WHERE {LIVE}",
        "DROP INDEX ix_watchdog_jobs_live_queue",
        f"CREATE INDEX ix_watchdog_jobs_live_queue ON watchdog_jobs (queue_name, state, priority DESC, sequence) WHERE {LIVE}",
    ],
    "+ ix_watchdog_jobs_ready (dropped in w0008)": READY,
    "cancellation_id NULLs indexed again (before w0008)": CANCELLATION_FULL,
    "- ix_watchdog_jobs_live_queue": ["DROP INDEX ix_watchdog_jobs_live_queue"],
    "- ix_watchdog_jobs_live_lane": ["DROP INDEX ix_watchdog_jobs_live_lane"],
    "- ix_watchdog_jobs_lane_history (added in w0010)": ["DROP INDEX ix_watchdog_jobs_lane_history"],
    "- the NOTIFY trigger (not an index)": ["ALTER TABLE watchdog_jobs DISABLE TRIGGER watchdog_jobs_queued"],
    "PK + job_id unique only": [
        f"DROP INDEX {name}"
        for name in ("uq_watchdog_jobs_cancellation_id", *(f"ix_watchdog_jobs_{name}" for name in KEPT_OUT))
    ],
}


def _build(bench: h.Bench, variant: str, name: str) -> h.Target:
    """A database of its own with the model's tables turned into ``variant``."""
    h.install_watchdog(target := bench.scratch("postgresql", name), fresh=True)
    for statement in VARIANTS[variant]:
        h.run_sql(target, statement)
    return target


class _Enqueuer:
    """One variant's database: ``enqueue()`` through a Session, and the same statement alone over
    psycopg (its parameter built beforehand, prepared): jobs/s per 1,000-job transaction."""

    def __init__(self, target: h.Target) -> None:
        self.target, self.engine, sent = target, h.engine(target), []
        keep = lambda conn, cursor, statement, parameters, *rest: (
            sent.append((statement, parameters)) if statement.startswith("INSERT INTO watchdog_jobs") else None
        )
        event.listen(self.engine, "before_cursor_execute", keep)
        self.batch("warm")
        event.remove(self.engine, "before_cursor_execute", keep)
        self.statement, self.parameters = sent[0]
        self.raw = psycopg.connect(target.dsn)

    def batch(self, tag: str) -> float:
        started = time.perf_counter()
        return 1000 / (h.Watchdog.commit_jobs(self.engine, h.Watchdog.jobs(tag, 1000)) - started)

    def statement_alone(self, tag: str) -> float:
        body = self.parameters["jobs"].replace('"warm-', f'"{tag}-')
        started = time.perf_counter()
        self.raw.execute(self.statement, {**self.parameters, "jobs": body}, prepare=True)
        self.raw.commit()
        return 1000 / (time.perf_counter() - started)

    def close(self) -> None:
        self.raw.close()
        self.engine.dispose()


@h.scenario("index-review", options="batches rows jobs")
def index_review(bench: h.Bench) -> None:
    """Each index set of watchdog_jobs: batch enqueue jobs/s, and claim+settle ms/job beside a history."""
    batches, rows = bench.opt("batches", 40, 10), bench.opt("rows", 1_000_000, 100_000)
    claims = bench.opt("jobs", 500, 200)
    table = "index sets: enqueue(), 1,000 jobs per statement (jobs/s); claim+settle (ms/job)"
    bench.table(table, ratios=MODEL)
    # One database per variant; the batches interleave across the variants (the order
    # rotated every batch), so load changes and checkpoints hit them all alike.
    clients: dict[str, _Enqueuer] = {}
    try:
        for i, variant in enumerate(VARIANTS):
            clients[variant] = _Enqueuer(_build(bench, variant, f"indexes{i}"))
        for b in range(batches):
            for variant in h.rotate(list(VARIANTS), b):
                bench.record(table, "enqueue() (jobs/s)", variant, clients[variant].batch(f"e{b}"))
                bench.record(table, "the statement alone (jobs/s)", variant, clients[variant].statement_alone(f"s{b}"))
    finally:
        for client in clients.values():
            client.close()
            h.drop(client.target)
    # The claim beside a history: a database per index set, the rounds alternating.
    targets: dict[str, h.Target] = {}
    try:
        for i, variant in enumerate((MODEL, BEFORE_W0008)):
            targets[variant] = target = _build(bench, variant, f"indexes_history{i}")
            bench.log(f"{variant}: {rows:,} settled rows in {h.insert_jobs(target, rows, h.SETTLED):.1f}s")
        for r in range(bench.repeat):
            for variant, target in targets.items():
                claim = partial(h.Watchdog().claim_settle, target, claims, f"c{r}{variant[:3]}")
                bench.measure(table, f"claim+settle, {rows:,} settled rows (ms/job)", variant, claim, 900)
    finally:
        h.drop(*targets.values())


#: (group, path fragments of the innermost frame's file), first match wins.
GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("ours: sqlalchemy_watchdog", ("sqlalchemy_watchdog/",)),
    ("SQLAlchemy: SQL build/compile/cache key", ("sqlalchemy/sql/",)),
    ("SQLAlchemy: result rows", tuple(f"sqlalchemy/engine/{name}.py" for name in ("result", "cursor", "row"))),
    ("SQLAlchemy: engine/connection/pool/events", ("sqlalchemy/engine/", "sqlalchemy/pool/", "sqlalchemy/event/")),
    ("SQLAlchemy: other (util, dialect, orm)", ("sqlalchemy/",)),
    ("driver: psycopg (Python layer)", ("psycopg/", "psycopg_pool/", "psycopg_binary/")),
    ("thread hand-offs: threading/queue/futures", ("threading.py", "queue.py", "concurrent/futures/")),
    ("asyncio event loop", ("asyncio/",)),
    ("logging", ("logging/",)),
    ("json", ("json/",)),
]


def _group(frame: str) -> str:
    if not frame.strip():
        return "native (GIL held, no Python frame)"
    return next((name for name, parts in GROUPS if any(p in frame for p in parts)), "other (stdlib, interpreter)")


def _operation(frames: list[str]) -> str:
    """The store operation a sample is in: the outermost frame in store.py, else the outermost of ours."""
    for marker in ("sqlalchemy_watchdog/store.py", "sqlalchemy_watchdog/"):
        for frame in frames:
            if marker in frame:
                name, where = frame.split(" (")[0], frame.rsplit("/", 1)[-1].split(":")[0]
                return f"store.{name}" if marker.endswith("store.py") else f"{name} ({where})"
    return "outside sqlalchemy_watchdog"


def _profile(bench: h.Bench, shape: str, jobs: int) -> dict[str, float]:
    """us per job of a drain worker under ``py-spy record --gil`` (README.md, "Where a drained job's time goes")."""
    kind, concurrency = shape.split("-c")
    count_sql = bool(bench.opt("count_sql", False))
    options = {"concurrency": int(concurrency), "use_asyncio": kind == "async", "count_sql": count_sql}
    stacks, subject = bench.workdir / f"{shape}.txt", h.Watchdog()
    with (
        bench.database("postgresql", f"profile_{kind}_{concurrency}") as target,
        bench.workers("watchdog", target, f"profile-{shape}", **options) as (child,),
        contextlib.closing(h.Probe(subject, target)) as probe,
    ):
        time.sleep(0.5)
        subject.prefill(target, 20, "warm")
        h.poll_until(lambda: not probe.live(), timeout=60, interval=0.005, what="warm-up")
        spy_bin = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        rate, pid = str(int(bench.opt("rate", 1000))), str(child.proc.pid)
        argv = [spy_bin, "record", "--gil", "--format", "raw", "--rate", rate, "--output", str(stacks), "--pid", pid]
        spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(bench.workdir / f"{shape}-py-spy.log", "w"))
        try:
            time.sleep(1.0)
            cpu = h.cpu_seconds(child.proc.pid)
            started = subject.prefill(target, jobs, "profile")
            finished = h.poll_until(lambda: not probe.live(), timeout=600, interval=0.005, what="drain")
            cpu = h.cpu_seconds(child.proc.pid) - cpu
            spy.send_signal(2)
            spy.wait(timeout=60)
        finally:
            if spy.poll() is None:
                spy.kill()
    groups: collections.Counter[str] = collections.Counter()
    operations: collections.Counter[str] = collections.Counter()
    for line in stacks.read_text().splitlines():  # py-spy's raw format: frame;frame;... count
        stack, _, count = line.rpartition(" ")
        groups[_group(stack.split(";")[-1])] += int(count)
        operations[_operation(stack.split(";"))] += int(count)
    if raw := bench.opt("raw", None):
        Path(raw).mkdir(parents=True, exist_ok=True)
        shutil.copy(stacks, Path(raw) / stacks.name)
    cpu_us, total = cpu / jobs * 1e6, sum(groups.values()) or 1
    lines = child.log_path.read_text().splitlines()
    statements = [line.split(" ", 2) for line in lines if line.startswith("SQLCOUNT ")]
    per_job = {f"statements per job: {words}": int(n) / (jobs + 20) for _, n, words in statements}
    return {
        "wall (1 / drain rate)": (finished - started) / jobs * 1e6,
        "worker CPU (all threads)": cpu_us,
        **{name: cpu_us * n / total for name, n in groups.most_common()},
        **{f"op {name}": cpu_us * n / total for name, n in operations.most_common() if cpu_us * n / total >= 5},
        **{k: v for k, v in per_job.items() if v >= 0.01},
    }


@h.scenario("profile-drain", options="jobs rate shapes raw count-sql")
def profile_drain(bench: h.Bench) -> None:
    """Where a drained job's time goes: py-spy samples of a runner process by function group (pip install py-spy)."""
    table = "us per job, py-spy --gil samples of the worker by group"
    for shape in bench.opt("shapes", "sync-c1,sync-c16,async-c16").split(","):
        bench.measure(table, "", shape, partial(_profile, bench, shape, bench.opt("jobs", 3000, 500)), 900)


def _bytecodes(bench: h.Bench, shape: str, jobs: int) -> dict[str, float]:
    """Bytecodes a runner on a thread of this process executes per job of a drain, by group
    (README.md, "The sync runner's lean found"): counted, so two runs agree within a few
    per cent where a drain's CPU time here varies by fifteen."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from sqlalchemy_watchdog import Runner
    from sqlalchemy_watchdog.asyncio import AsyncRunner

    kind, concurrency = shape.split("-c")
    counts: collections.Counter[str] = collections.Counter()
    counting = [False]

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if counting[0] and event == "opcode":
            counts[frame.f_code.co_filename] += 1
        return tracer

    subject = h.Watchdog()
    with bench.database("postgresql", f"bytecodes_{kind}_{concurrency}") as target:
        size = int(concurrency) + 3
        runner: Any
        if kind == "async":
            eng: Any = create_async_engine(target.url, pool_size=size)
            runner = AsyncRunner(eng, {h.QUEUE: h.anoop}, concurrency=int(concurrency))
        else:
            eng = h.engine(target, pool_size=size)
            runner = Runner(eng, {h.QUEUE: lambda job: None}, concurrency=int(concurrency))
        # Every thread started from here on (the runner's, its handlers'), not this one.
        threading.settrace(tracer)
        stop = h.serve_in_thread(runner)
        try:
            with contextlib.closing(h.Probe(subject, target)) as probe:
                subject.prefill(target, 20, "warm")
                h.poll_until(lambda: not probe.live(), timeout=60, interval=0.01, what="warm-up")
                counting[0] = True
                subject.prefill(target, jobs, "counted")
                h.poll_until(lambda: not probe.live(), timeout=600, interval=0.01, what="drain")
                counting[0] = False
        finally:
            threading.settrace(None)  # type: ignore[arg-type]
            stop()
            if kind != "async":  # an async engine's connections belong to the runner's loop: dropped with the database
                eng.dispose()
    groups: collections.Counter[str] = collections.Counter()
    for filename, n in counts.items():
        groups[_group(filename)] += n
    return {"all": sum(counts.values()) / jobs, **{name: n / jobs for name, n in groups.most_common()}}


@h.scenario("bytecodes", options="jobs shapes")
def bytecodes(bench: h.Bench) -> None:
    """Bytecodes per drained job of a runner in this process, by group: a CPU figure that repeats."""
    table = "bytecodes per job, a runner draining on a thread of this process, by group"
    for shape in bench.opt("shapes", "sync-c16,async-c16").split(","):
        bench.measure(table, "", shape, partial(_bytecodes, bench, shape, bench.opt("jobs", 2000, 200)), 900)
