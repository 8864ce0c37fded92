"""SQLite under a web application's writes: runners beside paced app writers on one file (the
processes, figures and ``WATCHDOG_BENCH_TRACE=1``: README.md, "SQLite under an application's writes")."""

from __future__ import annotations

import collections
import math
import os
import sqlite3
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from typing import Any

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, create_engine, event, insert
from sqlalchemy.orm import Session

from benchmarks import harness as h
from sqlalchemy_watchdog import Job, Runner, Watchdog, enqueue, metadata

QUEUE = "orders"
#: journal mode -> the PRAGMAs every connection of every process runs
JOURNALS: dict[str, list[str]] = {
    "delete": [],  # SQLite's defaults: rollback journal, synchronous=FULL
    "wal": ["PRAGMA synchronous=NORMAL"],  # the recommended settings
    "wal-full": [],  # WAL at SQLite's default synchronous=FULL (not run by default)
}


def make_engine(path: str, journal: str, timeout: float | None) -> Any:
    """``create_engine(url)``, the driver's busy timeout unless ``timeout``, the journal's PRAGMAs."""
    eng = create_engine(f"sqlite:///{path}", connect_args={} if timeout is None else {"timeout": timeout})

    @event.listens_for(eng, "connect")
    def pragmas(dbapi_connection: Any, record: Any) -> None:
        for pragma in JOURNALS[journal]:
            dbapi_connection.execute(pragma)

    return eng


def app_tables() -> Any:
    """The app's ``app_orders`` (a row per request) and the handlers' ``handled`` (a row per start)."""
    meta, key = MetaData(), lambda: Column("id", Integer, primary_key=True)
    Table("app_orders", meta, key(), Column("job_id", String), Column("created_at", Float))
    Table("handled", meta, key(), Column("job_id", String), Column("started_at", Float), Column("pid", Integer))
    return meta


def runner_role(db: str, journal: str, timeout: float | None, concurrency: int, poll_interval: float | None) -> None:
    eng, handled, pid = make_engine(db, journal, timeout), app_tables().tables["handled"], os.getpid()

    def handle(job: Any) -> None:
        started = time.time()
        with eng.begin() as conn:
            conn.execute(insert(handled), {"job_id": job.job_id, "started_at": started, "pid": pid})

    if os.environ.get("WATCHDOG_BENCH_TRACE"):
        _trace_store()
    options = {} if poll_interval is None else {"poll_interval": timedelta(seconds=poll_interval)}
    runner = Runner(eng, {QUEUE: handle}, concurrency=concurrency, **options)
    h.say("READY")
    runner.run_forever()


def _trace_store() -> None:
    """Per store operation: calls, how many were retried, call and lock-wait times, and how many
    jobs each claim took (stderr at exit)."""
    import atexit
    import functools

    from sqlalchemy_watchdog import store
    from sqlalchemy_watchdog.store import transactions

    calls: dict[str, list[float]] = collections.defaultdict(list)  # operation (or "lock wait") -> seconds
    retried: collections.Counter[str] = collections.Counter()
    original_retrying, original_begin = store.retrying, store.begin_write

    def retrying(work: Any, *, what: str = "store operation", attempts: int = 8) -> Any:
        tries = [0]

        def counted() -> Any:
            tries[0] += 1
            return work()

        began = time.perf_counter()
        try:
            return original_retrying(counted, what=what, attempts=attempts)
        finally:
            calls[what].append(time.perf_counter() - began)
            retried[what] += tries[0] > 1

    def begin_write(conn: Any) -> None:
        began = time.perf_counter()
        original_begin(conn)
        calls["lock wait"].append(time.perf_counter() - began)

    claimed: collections.Counter[int] = collections.Counter()
    original_claim = store.claim

    @functools.wraps(original_claim)  # keeps its declaration as a store operation
    def claim(conn: Any, **kwargs: Any) -> Any:
        batch = original_claim(conn, **kwargs)
        claimed[len(batch.claimed)] += 1
        return batch

    store.retrying, store.claim = retrying, claim
    store.begin_write = transactions.begin_write = begin_write  # transactions calls its own

    def report() -> None:
        for what, times in sorted(calls.items(), key=lambda item: item[0] == "lock wait"):
            ms = {p: f"{h.percentile(times, p) * 1000:.1f}" for p in (50, 99)}
            line = f"n={len(times)} retried={retried[what]} p50={ms[50]}ms p99={ms[99]}ms max={max(times) * 1000:.0f}ms"
            print(f"TRACE {what}: {line}", file=sys.stderr)
        print(f"TRACE claims by jobs taken: {dict(sorted(claimed.items()))}", file=sys.stderr)

    atexit.register(report)


def app_role(
    db: str, journal: str, timeout: float | None, index: int, rate: float, duration: float, start: float, threads: int
) -> None:
    """Paced open-loop writer: request ``i`` is due at ``start + i / rate`` whatever the
    previous ones took (requests wait for a free thread); RESULT its requests."""
    eng, orders, lock = make_engine(db, journal, timeout), app_tables().tables["app_orders"], threading.Lock()
    results: list[tuple[str, float, float, str | None]] = []

    def request(i: int) -> None:
        job_id, began, error = f"a{index}-{i}", time.time(), None
        try:
            with Session(eng) as session:
                session.execute(insert(orders), {"job_id": job_id, "created_at": began})
                enqueue(session, Job(job_id, QUEUE, payload={"order": i}))
                session.commit()
        except Exception as exc:  # a failed request, as a web app would answer 500
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        with lock:
            results.append((job_id, began, time.time(), error))

    with eng.connect() as conn:  # warm the pool before the clock starts
        conn.exec_driver_sql("SELECT 1")
    h.say("READY")
    with ThreadPoolExecutor(threads) as pool:
        for i in range(int(duration * rate)):
            time.sleep(max(0.0, start + i / rate - time.time()))
            pool.submit(request, i)
    h.say("RESULT", results)


def _live(db: str) -> int:
    with sqlite3.connect(db, timeout=60) as conn:
        return int(conn.execute("SELECT count(*) FROM watchdog_jobs WHERE state != 'settled'").fetchone()[0])


def _drain(db: str, timeout: float, interval: float) -> bool:
    """Wait up to ``timeout`` s for no live job; whether none is left."""
    deadline = time.time() + timeout
    while _live(db) and time.time() < deadline:
        time.sleep(interval)
    return _live(db) == 0


def one_run(bench: h.Bench, journal: str, timeout: float | None, tag: str) -> dict[str, float]:
    opt = bench.opt
    apps_n, rate, duration = opt("apps", 2), opt("rate", 150.0), opt("duration", 20.0, 5.0)
    db = str(bench.workdir / f"{tag}.db")
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA journal_mode={'WAL' if journal.startswith('wal') else 'DELETE'}")
    eng = make_engine(db, journal, 60)
    metadata.create_all(eng)
    app_tables().create_all(eng)
    common = {"db": db, "journal": journal, "timeout": timeout}
    each_runner = {"concurrency": opt("concurrency", 8), "poll_interval": opt("poll_interval", None), **common}
    apps: list[h.Child] = []
    with bench.spawn(f"{tag}-runner", opt("runners", 2), runner_role, **each_runner) as runners:
        try:
            time.sleep(0.5)
            start_at = time.time() + 2.0
            each = {"rate": rate / apps_n, "duration": duration, "start": start_at, "threads": opt("threads", 8)}
            log = lambda k: bench.workdir / f"{tag}-app{k}.log"
            apps = [h.Child(log(k), app_role, index=k, **each, **common) for k in range(apps_n)]
            for child in apps:
                child.wait_ready()
            rows = [row for child in apps for row in child.result(duration + 120)]
            window_end, backlog = time.time(), _live(db)
            drained = _drain(db, opt("drain_timeout", 60.0), 0.2)
            quiet_file = [Job(f"q-{i}", QUEUE) for i in range(opt("quiet_jobs", 2000, 300))]
            Watchdog(eng).enqueue(quiet_file)
            _drain(db, opt("drain_timeout", 60.0), 0.1)
        finally:
            eng.dispose()
            h.stop_all(apps)
    with sqlite3.connect(db) as conn:
        starts = dict(conn.execute("SELECT job_id, min(started_at) FROM handled GROUP BY job_id").fetchall())
    ok = [r for r in rows if r[3] is None]
    latency = sorted((starts[r[0]] - r[2]) * 1000 if r[0] in starts else math.inf for r in ok)
    in_window = [s for j, s in starts.items() if not j.startswith("q-") and start_at <= s <= window_end]
    quiet = sorted(s for j, s in starts.items() if j.startswith("q-"))
    tx = [(r[2] - r[1]) * 1000 for r in ok]
    errors = collections.Counter(r[3] for r in rows if r[3] is not None)
    if errors:
        bench.log(f"{tag}: app errors {dict(errors)}")
    return {
        **{f"enqueue-to-start p{p} (ms)": h.percentile(latency, p) for p in (50, 95, 99)},
        "drain under load (jobs/s)": len(in_window) / max(1e-9, window_end - start_at),
        "backlog when the apps stopped (jobs)": backlog,
        "drained afterwards (1 = yes)": float(drained),
        "quiet-file drain (jobs/s)": (len(quiet) - 1) / (quiet[-1] - quiet[0]) if len(quiet) > 1 else math.nan,
        "app commits (per s)": len(ok) / duration,
        **{f"app transaction p{p} (ms)": h.percentile(tx, p) for p in (50, 99)},
        "app transactions failed": len(rows) - len(ok),
        "jobs never started": sum(1 for v in latency if v == math.inf),
        "runner ERROR log lines": sum(r.log_path.read_text(errors="replace").count("ERROR") for r in runners),
    }


@h.scenario(
    "sqlite-load",
    options="rate concurrency apps runners threads duration drain-timeout quiet-jobs journals timeouts poll-interval",
)
def sqlite_load(bench: h.Bench) -> None:
    """SQLite: runners beside paced app writers (journal modes x busy timeouts): latency, drain, app failures."""
    table = "SQLite under an application's writes"
    journals, timeouts = bench.opt("journals", "delete,wal").split(","), bench.opt("timeouts", "default,30").split(",")
    configs = [(j, None if t == "default" else float(t)) for j in journals for t in timeouts]
    for rep in range(bench.repeat):
        for journal, timeout in configs:
            column = f"{journal}, busy {'5s (default)' if timeout is None else f'{timeout:g}s'}"
            run = partial(one_run, bench, journal, timeout, f"{journal}-{timeout}-{rep}")
            bench.measure(table, "", column, run, 900)
