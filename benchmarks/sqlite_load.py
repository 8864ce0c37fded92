#!/usr/bin/env python3
"""SQLite under a web application's writes: runners beside paced app writers.

    .venv/bin/python benchmarks/sqlite_load.py [--duration 20] [--repeat 3] [--json out.json]

The shape of a small web application on one SQLite file: ``--apps`` processes
(default 2) each commit, at a steady total ``--rate`` (default 150/s), one
transaction that inserts a row of their own table and enqueues one job with
``sqlalchemy_watchdog.enqueue(session, job)``, from a pool of request threads;
``--runners`` processes (default 2) run ``Runner(engine, concurrency=8)``
whose handler writes a row too. For every configuration (journal mode x busy
timeout) it reports:

* enqueue-to-start p50/p95/p99: the handler's start minus the moment the
  app's commit returned (one machine, one clock), over every job enqueued
  during the load window; a job that never started before the drain deadline
  counts as infinitely late;
* the drain rate under load (handler starts per second during the window) and
  the backlog left when the app writers stopped;
* the app's own transaction latency p50/p99 (begin to commit returned) and
  how many of its transactions failed ("database is locked");
* the quiet-file rate: the same runners, no app writers, draining
  ``--quiet-jobs`` jobs enqueued at once (first to last handler start).

Each figure is the median of ``--repeat`` runs, with the spread (min-max).
Everything runs on a fresh file in a temporary directory; nothing else is
touched. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

QUEUE = "orders"
#: journal mode -> the PRAGMAs every connection of every process runs
JOURNALS: dict[str, list[str]] = {
    "delete": [],  # SQLite's defaults: rollback journal, synchronous=FULL
    "wal": ["PRAGMA synchronous=NORMAL"],  # the recommended settings
    "wal-full": [],  # WAL at SQLite's default synchronous=FULL (not run by default)
}


# -- the processes' shared set-up ---------------------------------------------------


def make_engine(path: str, journal: str, timeout: float | None) -> Any:
    """The engine a user would build: ``create_engine(url)``, the driver's
    busy timeout unless ``timeout`` is given, and the journal's PRAGMAs
    on every new connection."""
    from sqlalchemy import create_engine, event

    connect_args = {} if timeout is None else {"timeout": timeout}
    engine = create_engine(f"sqlite:///{path}", connect_args=connect_args)
    pragmas = JOURNALS[journal]
    if pragmas:

        @event.listens_for(engine, "connect")
        def _set_pragmas(dbapi_connection: Any, record: Any) -> None:
            cursor = dbapi_connection.cursor()
            for pragma in pragmas:
                cursor.execute(pragma)
            cursor.close()

    return engine


def app_tables() -> Any:
    from sqlalchemy import Column, Float, Integer, MetaData, String, Table

    meta = MetaData()
    Table(
        "app_orders",
        meta,
        Column("id", Integer, primary_key=True),
        Column("job_id", String, nullable=False),
        Column("created_at", Float, nullable=False),
    )
    Table(
        "handled",
        meta,
        Column("id", Integer, primary_key=True),
        Column("job_id", String, nullable=False),
        Column("started_at", Float, nullable=False),
        Column("pid", Integer, nullable=False),
    )
    return meta


def setup_file(path: str, journal: str) -> None:
    from sqlalchemy_watchdog import metadata

    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA journal_mode={'WAL' if journal.startswith('wal') else 'DELETE'}")
    conn.close()
    engine = make_engine(path, journal, None)
    metadata.create_all(engine)
    app_tables().create_all(engine)
    engine.dispose()


# -- child roles --------------------------------------------------------------------


def runner_main(args: argparse.Namespace) -> None:
    from sqlalchemy import insert

    from sqlalchemy_watchdog import Runner

    engine = make_engine(args.db, args.journal, args.timeout)
    handled = app_tables().tables["handled"]
    pid = os.getpid()

    def handle(job: Any) -> None:
        started = time.time()
        with engine.begin() as conn:
            conn.execute(insert(handled), {"job_id": job.job_id, "started_at": started, "pid": pid})

    if os.environ.get("WATCHDOG_BENCH_TRACE"):
        _trace_store()
    runner = Runner(engine, {QUEUE: handle}, concurrency=args.concurrency, **_runner_options(args))
    print("READY", flush=True)
    runner.run_forever()
    engine.dispose()


def _runner_options(args: argparse.Namespace) -> dict[str, Any]:
    from datetime import timedelta

    if args.poll_interval is None:
        return {}
    return {"poll_interval": timedelta(seconds=args.poll_interval)}


def _trace_store() -> None:
    """Diagnostics (WATCHDOG_BENCH_TRACE=1): per store operation, how many
    were retried and how long the whole call and the lock wait took; printed
    to the runner's log at exit."""
    import atexit
    import collections

    from sqlalchemy_watchdog import store

    calls: dict[str, list[float]] = collections.defaultdict(list)
    waits: list[float] = []
    retried: collections.Counter[str] = collections.Counter()
    original_retrying, original_begin = store.retrying, store.begin_write

    def retrying(work: Any, *, what: str = "store operation", attempts: int = 8) -> Any:
        tries = 0

        def counted() -> Any:
            nonlocal tries
            tries += 1
            return work()

        began = time.perf_counter()
        try:
            return original_retrying(counted, what=what, attempts=attempts)
        finally:
            calls[what].append(time.perf_counter() - began)
            if tries > 1:
                retried[what] += 1

    def begin_write(conn: Any) -> None:
        began = time.perf_counter()
        original_begin(conn)
        waits.append(time.perf_counter() - began)

    claimed: collections.Counter[int] = collections.Counter()
    original_claim = store.claim

    @functools.wraps(original_claim)
    def claim(conn: Any, **kwargs: Any) -> Any:
        batch = original_claim(conn, **kwargs)
        claimed[len(batch.claimed)] += 1
        return batch

    store.retrying, store.begin_write, store.claim = retrying, begin_write, claim

    def report() -> None:
        for what, times in sorted(calls.items()):
            print(
                f"TRACE {what}: n={len(times)} retried={retried[what]} p50={percentile(times, 50) * 1000:.1f}ms "
                f"p99={percentile(times, 99) * 1000:.1f}ms max={max(times) * 1000:.0f}ms",
                file=sys.stderr,
            )
        print(f"TRACE claims by jobs taken: {dict(sorted(claimed.items()))}", file=sys.stderr)
        if waits:
            print(
                f"TRACE lock wait: n={len(waits)} p50={percentile(waits, 50) * 1000:.1f}ms "
                f"p99={percentile(waits, 99) * 1000:.1f}ms max={max(waits) * 1000:.0f}ms",
                file=sys.stderr,
            )

    atexit.register(report)


def app_main(args: argparse.Namespace) -> None:
    """Paced open-loop writer: request ``i`` is due at ``start + i / rate``,
    whatever the previous ones took (requests wait for a free thread)."""
    from sqlalchemy import insert
    from sqlalchemy.orm import Session

    from sqlalchemy_watchdog import Job, enqueue

    engine = make_engine(args.db, args.journal, args.timeout)
    orders = app_tables().tables["app_orders"]
    results: list[tuple[str, float, float, float, str | None]] = []
    lock = threading.Lock()

    def request(i: int, due: float) -> None:
        job_id = f"a{args.index}-{i}"
        began = time.time()
        error = None
        try:
            with Session(engine) as session:
                session.execute(insert(orders), {"job_id": job_id, "created_at": began})
                enqueue(session, Job(job_id, QUEUE, payload={"order": i}))
                session.commit()
        except Exception as exc:  # a failed request, as a web app would answer 500
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        done = time.time()
        with lock:
            results.append((job_id, due, began, done, error))

    # warm the pool's connections before the clock starts
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    print("READY", flush=True)
    start = args.start_at
    period = 1.0 / args.rate
    with ThreadPoolExecutor(args.threads) as pool:
        i = 0
        while True:
            due = start + i * period
            if due >= start + args.duration:
                break
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            pool.submit(request, i, due)
            i += 1
    Path(args.out).write_text(json.dumps(results))
    engine.dispose()


# -- the parent ----------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile; an infinite neighbour makes it infinite."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return ordered[lo]
    if math.inf in (ordered[lo], ordered[hi]):
        return math.inf
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Child:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = open(log, "w", buffering=1)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)

    def wait_ready(self, timeout: float = 60) -> None:
        assert self.proc.stdout is not None
        deadline = time.time() + timeout
        line = self.proc.stdout.readline()
        if not line.startswith("READY") or time.time() > deadline:
            raise RuntimeError(f"child not ready: {line!r}; see {self.log.name}")

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def child_argv(
    role: str, args: argparse.Namespace, db: str, journal: str, timeout: float | None, **extra: Any
) -> list[str]:
    argv = [sys.executable, __file__, "--role", role, "--db", db, "--journal", journal]
    if timeout is not None:
        argv += ["--timeout", str(timeout)]
    argv += ["--concurrency", str(args.concurrency), "--threads", str(args.threads)]
    if args.poll_interval is not None:
        argv += ["--poll-interval", str(args.poll_interval)]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def live_jobs(db: str) -> int:
    conn = sqlite3.connect(db, timeout=60)
    try:
        return conn.execute("SELECT count(*) FROM watchdog_jobs WHERE state != 'settled'").fetchone()[0]
    finally:
        conn.close()


def one_run(args: argparse.Namespace, journal: str, timeout: float | None, workdir: Path, tag: str) -> dict[str, Any]:
    db = str(workdir / f"{tag}.db")
    setup_file(db, journal)
    runners = [
        Child(child_argv("runner", args, db, journal, timeout), workdir / f"{tag}-runner{k}.log")
        for k in range(args.runners)
    ]
    apps: list[Child] = []
    try:
        for child in runners:
            child.wait_ready()
        time.sleep(0.5)
        start_at = time.time() + 2.0
        outs = [workdir / f"{tag}-app{k}.json" for k in range(args.apps)]
        apps = [
            Child(
                child_argv(
                    "app",
                    args,
                    db,
                    journal,
                    timeout,
                    index=k,
                    rate=args.rate / args.apps,
                    duration=args.duration,
                    start_at=start_at,
                    out=outs[k],
                ),
                workdir / f"{tag}-app{k}.log",
            )
            for k in range(args.apps)
        ]
        for child in apps:
            child.wait_ready()
        for child in apps:
            child.proc.wait(args.duration + 120)
        window_end = time.time()
        backlog = live_jobs(db)
        deadline = time.time() + args.drain_timeout
        while live_jobs(db) and time.time() < deadline:
            time.sleep(0.2)
        drained = live_jobs(db) == 0
        # the quiet file: the same runners, no app writers
        quiet_ids = [f"q-{i}" for i in range(args.quiet_jobs)]
        from sqlalchemy_watchdog import Job, Watchdog

        engine = make_engine(db, journal, 60)
        Watchdog(engine).enqueue([Job(j, QUEUE) for j in quiet_ids])
        deadline = time.time() + args.drain_timeout
        while live_jobs(db) and time.time() < deadline:
            time.sleep(0.1)
        engine.dispose()
    finally:
        for child in apps + runners:
            child.stop()
    rows: list[tuple[str, float, float, float, str | None]] = []
    for out in outs:
        rows += json.loads(out.read_text())
    conn = sqlite3.connect(db)
    starts = dict(conn.execute("SELECT job_id, min(started_at) FROM handled GROUP BY job_id"))
    runs = conn.execute("SELECT count(*) FROM handled WHERE job_id NOT LIKE 'q-%'").fetchone()[0]
    conn.close()
    ok = [r for r in rows if r[4] is None]
    errors: dict[str, int] = {}
    for r in rows:
        if r[4] is not None:
            errors[r[4]] = errors.get(r[4], 0) + 1
    latency = [(starts[r[0]] - r[3]) if r[0] in starts else math.inf for r in ok]
    in_window = [s for j, s in starts.items() if not j.startswith("q-") and start_at <= s <= window_end]
    quiet = sorted(s for j, s in starts.items() if j.startswith("q-"))
    tx = [r[3] - r[2] for r in ok]
    runner_errors = 0
    for k in range(args.runners):
        text = (workdir / f"{tag}-runner{k}.log").read_text(errors="replace")
        runner_errors += text.count("ERROR")
    return {
        "enqueued": len(ok),
        "app_failed": len(rows) - len(ok),
        "app_errors": errors,
        "app_rate": len(ok) / args.duration,
        "app_tx_p50_ms": percentile(tx, 50) * 1000,
        "app_tx_p99_ms": percentile(tx, 99) * 1000,
        "start_p50_ms": percentile(latency, 50) * 1000,
        "start_p95_ms": percentile(latency, 95) * 1000,
        "start_p99_ms": percentile(latency, 99) * 1000,
        "never_started": sum(1 for v in latency if v == math.inf),
        "handler_runs": runs,
        "drain_under_load": len(in_window) / max(1e-9, window_end - start_at),
        "backlog_at_end": backlog,
        "drained": drained,
        "quiet_rate": (len(quiet) - 1) / (quiet[-1] - quiet[0]) if len(quiet) > 1 else math.nan,
        "runner_error_lines": runner_errors,
    }


FIGURES = [
    ("start_p50_ms", "enqueue-to-start p50 (ms)", "{:,.0f}"),
    ("start_p95_ms", "enqueue-to-start p95 (ms)", "{:,.0f}"),
    ("start_p99_ms", "enqueue-to-start p99 (ms)", "{:,.0f}"),
    ("drain_under_load", "drain under load (jobs/s)", "{:,.0f}"),
    ("backlog_at_end", "backlog when the apps stopped (jobs)", "{:,.0f}"),
    ("quiet_rate", "quiet-file drain (jobs/s)", "{:,.0f}"),
    ("app_rate", "app commits (per s)", "{:,.0f}"),
    ("app_tx_p50_ms", "app transaction p50 (ms)", "{:,.1f}"),
    ("app_tx_p99_ms", "app transaction p99 (ms)", "{:,.1f}"),
    ("app_failed", "app transactions failed", "{:,.0f}"),
    ("runner_error_lines", "runner ERROR log lines", "{:,.0f}"),
]


def fmt(spec: str, value: float) -> str:
    if value == math.inf:
        return "inf"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return spec.format(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=["parent", "app", "runner"], default="parent")
    parser.add_argument("--apps", type=int, default=2)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--rate", type=float, default=150.0, help="app transactions per second, all apps together")
    parser.add_argument("--threads", type=int, default=8, help="request threads per app process")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of app load per run")
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument("--quiet-jobs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--journals", default="delete,wal")
    parser.add_argument("--timeouts", default="default,30", help="busy timeouts: 'default' (the driver's) or seconds")
    parser.add_argument(
        "--poll-interval", type=float, help="the runners' poll_interval in seconds (default: the Runner's)"
    )
    parser.add_argument("--json")
    parser.add_argument("--workdir", help="keep the files and logs here instead of a temporary directory")
    # child arguments
    parser.add_argument("--db")
    parser.add_argument("--journal", default="delete")
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--start-at", type=float)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.role == "runner":
        runner_main(args)
        return 0
    if args.role == "app":
        app_main(args)
        return 0

    import sqlalchemy

    import sqlalchemy_watchdog  # noqa: F401

    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, SQLAlchemy {sqlalchemy.__version__}"
    )
    print(
        f"shape: {args.apps} app processes x {args.threads} threads at {args.rate:g} tx/s in all, "
        f"{args.runners} runners x concurrency {args.concurrency}, {args.duration:g}s load, "
        f"{args.quiet_jobs} quiet jobs, {args.repeat} run(s) per configuration",
        flush=True,
    )
    configs = [
        (journal, None if t == "default" else float(t))
        for journal in args.journals.split(",")
        for t in args.timeouts.split(",")
    ]
    everything: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="watchdog-sqlite-load-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for rep in range(args.repeat):
            for journal, timeout in configs:
                name = f"{journal}, busy {'5s (default)' if timeout is None else f'{timeout:g}s'}"
                tag = f"{journal}-{timeout}-{rep}"
                result = one_run(args, journal, timeout, workdir, tag)
                everything.setdefault(name, []).append(result)
                print(
                    f"  run {rep + 1} {name}: "
                    + ", ".join(f"{key}={fmt(spec, result[key])}" for key, _, spec in FIGURES)
                    + (f" errors={result['app_errors']}" if result["app_errors"] else ""),
                    flush=True,
                )
    names = list(everything)
    width = max(len(label) for _, label, _ in FIGURES)
    print()
    print("median (min-max) of", args.repeat, "run(s)")
    header = f"| {'':{width}} | " + " | ".join(f"{n:^28}" for n in names) + " |"
    print(header)
    print("|" + "-" * (width + 2) + "|" + "|".join("-" * 30 for _ in names) + "|")
    for key, label, spec in FIGURES:
        cells = []
        for n in names:
            values = [r[key] for r in everything[n]]
            finite = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
            if not finite:
                cells.append("-")
                continue
            med = statistics.median(finite)
            cell = fmt(spec, med)
            if len(finite) > 1:
                cell += f" ({fmt(spec, min(finite))}-{fmt(spec, max(finite))})"
            cells.append(cell)
        print(f"| {label:{width}} | " + " | ".join(f"{c:>28}" for c in cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
