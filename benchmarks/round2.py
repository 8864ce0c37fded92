"""The scenarios of the second performance round (issue 13), run by run.py.

* ``txn``: the marginal cost ``enqueue(session, job)`` adds to an open transaction,
  beside a plain ORM ``session.add`` + ``flush`` of a row of similar size (1 and 100
  rows), p50/p99 microseconds and round trips (statements counted by a
  ``before_cursor_execute`` listener during the warm-up rounds, none listening
  during the timed ones).
* ``producers``: 16 client processes enqueueing one job per transaction at once,
  every queue; watchdog three times more: with the trigger of before revision w0007
  (a NOTIFY on every enqueue), with the trigger disabled, and with a runner (its
  defaults, a process of its own) draining while they enqueue.
* ``inprocess``: drains by a Runner thread in a process whose main thread enqueues
  the jobs and polls for the end (run.py's drain rows run the runner in a process
  of its own).
* ``scaleout``: 1, 2, 4, 8 runner processes (concurrency 4 each) draining one queue.
* ``scale``: a large table (settled history, jobs scheduled in the future, a
  backlog over many queues and lanes) against the same table with 1% of the history.

``render`` draws their tables, ``plot`` the charts (matplotlib).
See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import harness
from harness import ScenarioFailed, Target, percentile
from sqlalchemy import BigInteger, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

HERE = Path(__file__).resolve().parent
QUEUE = "bench"


def load() -> str:
    out = subprocess.run(["uptime"], capture_output=True, text=True).stdout
    return out.split("load average:")[-1].strip()


# -- txn: enqueue inside the caller's open transaction ------------------------------------


class OrderBase(DeclarativeBase):
    pass


class Order(OrderBase):
    """An application row about as wide as a job's: keys, a queue-like name, a JSON payload."""

    __tablename__ = "bench_orders"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    reference: Mapped[str] = mapped_column(Text, unique=True)
    kind: Mapped[str] = mapped_column(Text)
    customer: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(BigInteger)
    payload: Mapped[str] = mapped_column(Text)


def txn_cost(target: Target, samples: int, warmup: int = 20) -> dict[str, Any]:
    """p50/p99 us and round trips of each way of adding 1 or 100 rows to an open transaction."""
    from sqlalchemy import create_engine, event, text
    from sqlalchemy.orm import Session

    from sqlalchemy_watchdog import Job, enqueue

    engine = create_engine(target.sqlalchemy_url)
    OrderBase.metadata.create_all(engine)
    statements = [0]
    armed = [False]

    def count(*args: Any) -> None:
        if armed[0]:
            statements[0] += 1

    # Round trips are counted in the warm-up rounds only: a listener makes the
    # store send its hot statements through SQLAlchemy's execution (so that it
    # sees them), and the timed rounds must cost what they cost an application
    # without one.
    event.listen(engine, "before_cursor_execute", count)

    def jobs(tag: str, n: int) -> list[Any]:
        return [
            Job(f"{tag}-{i}", QUEUE, lane=f"customer-{i}", payload={"order_id": i, "note": "x" * 40}) for i in range(n)
        ]

    def orders(tag: str, n: int) -> list[Any]:
        return [
            Order(
                reference=f"{tag}-{i}",
                kind=QUEUE,
                customer=f"customer-{i}",
                priority=0,
                payload=json.dumps({"order_id": i, "note": "x" * 40}),
            )
            for i in range(n)
        ]

    def do_enqueue(session: Session, rows: list[Any]) -> None:
        enqueue(session, rows[0] if len(rows) == 1 else rows)

    def do_add(session: Session, rows: list[Any]) -> None:
        session.add_all(rows)
        session.flush()

    kinds = {
        "enqueue 1": (jobs, do_enqueue, 1),
        "session.add 1": (orders, do_add, 1),
        "enqueue 100": (jobs, do_enqueue, 100),
        "session.add 100": (orders, do_add, 100),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    trips: dict[str, list[int]] = {k: [] for k in kinds}
    names = list(kinds)
    try:
        for i in range(warmup + samples):
            if i == warmup:
                event.remove(engine, "before_cursor_execute", count)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                make, add, n = kinds[name]
                rows = make(f"t{i}-{name[:3]}", n)
                with Session(engine) as session:
                    # The caller's transaction is open: BEGIN sent, its connection held.
                    session.execute(text("SELECT 1"))
                    statements[0] = 0
                    armed[0] = True
                    started = time.perf_counter_ns()
                    add(session, rows)
                    elapsed = time.perf_counter_ns() - started
                    armed[0] = False
                    session.rollback()
                if i >= warmup:
                    times[name].append(elapsed / 1000)
                else:
                    trips[name].append(statements[0])
    finally:
        engine.dispose()
    out: dict[str, Any] = {}
    for name in kinds:
        key = name.replace(" ", "_").replace(".", "_")
        out[f"{key}_p50"] = percentile(times[name], 50)
        out[f"{key}_p99"] = percentile(times[name], 99)
        out[f"{key}_trips"] = statistics.median(trips[name])
    return out


def txn(bench: Any, r: int) -> None:
    target = bench.target("watchdog", "postgresql")
    subject = bench.subjects["watchdog"]
    c = bench.config

    def run() -> dict[str, Any]:
        subject.reset(target)
        return txn_cost(target, c.txn_samples)

    bench.measure(
        "pg.txn",
        "watchdog",
        "enqueue 1: p50 {0[enqueue_1_p50]:.0f} us vs add {0[session_add_1_p50]:.0f} us;"
        " 100: {0[enqueue_100_p50]:.0f} vs {0[session_add_100_p50]:.0f} us",
        run,
    )


# -- producers: many processes enqueueing at once -------------------------------------------


def producer_entry(argv: list[str]) -> None:
    """``run.py producer``: wait for the go file, then enqueue ``--jobs`` jobs one per
    transaction with the subject's own single-job enqueue; print ``DONE start end``."""
    import argparse

    from run import load_subject

    parser = argparse.ArgumentParser(prog="run.py producer")
    parser.add_argument("--subject", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--go", required=True)
    args = parser.parse_args(argv)
    harness.exit_with_parent()
    subject = load_subject(args.subject)
    target = Target.from_json(args.target)
    print("READY", flush=True)
    go = Path(args.go)
    while not go.exists():
        time.sleep(0.001)
    elapsed = subject.enqueue_single(target, args.jobs, args.tag)
    end = time.time()
    print(f"DONE {end - elapsed:.6f} {end:.6f}", flush=True)


def producers_once(bench: Any, name: str, jobs: int, tag: str, *, runner: bool = False) -> float:
    target = bench.target(name, "postgresql")
    bench.subjects[name].reset(target)
    workers = (
        bench.workers(name, target, procs=1, concurrency=1, defaults=True, latency=False, tag=tag) if runner else []
    )
    try:
        return _produce(bench, name, target, jobs, tag)
    finally:
        harness.stop_all(workers)


def _produce(bench: Any, name: str, target: Target, jobs: int, tag: str) -> float:
    c = bench.config
    go = bench.workdir / f"{tag}.go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "run.py"),
                "producer",
                "--subject",
                name,
                "--target",
                target.to_json(),
                "--jobs",
                str(jobs),
                "--tag",
                f"{tag}-{i}",
                "--go",
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=open(bench.workdir / f"{tag}-{i}.log", "w"),
            text=True,
        )
        for i in range(c.producers)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "READY":
                raise ScenarioFailed(f"producer said {line!r}; see {bench.workdir}/{tag}-*.log")
        go.touch()
        windows = []
        for proc in procs:
            assert proc.stdout is not None
            out, _ = proc.communicate(timeout=600)
            fields = out.split()
            if proc.returncode != 0 or not fields or fields[0] != "DONE":
                raise ScenarioFailed(f"producer exited {proc.returncode}: {out!r}")
            windows.append((float(fields[1]), float(fields[2])))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    probe = bench.subjects[name].probe(target)
    try:
        total = c.producers * jobs
        # Each queue's own table of jobs: every enqueued job must be there.
        counted = _count_jobs(target, name)
        if counted < total:
            raise ScenarioFailed(f"producers: {counted} of {total} jobs stored")
    finally:
        probe.close()
    return c.producers * jobs / (max(end for _, end in windows) - min(start for start, _ in windows))


_JOB_TABLES = {"watchdog": "watchdog_jobs", "pgqueuer": "pgqueuer", "procrastinate": "procrastinate_jobs"}


def _count_jobs(target: Target, name: str) -> int:
    import psycopg

    with psycopg.connect(target.dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {_JOB_TABLES[name]}").fetchone()  # type: ignore[arg-type]
        return int(row[0]) if row else 0


def _trigger(target: Target, enabled: bool) -> None:
    import psycopg

    with psycopg.connect(target.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE watchdog_jobs {'ENABLE' if enabled else 'DISABLE'} TRIGGER watchdog_jobs_queued")  # type: ignore[arg-type]


def _notify_always(target: Target, always: bool) -> None:
    """Put back the trigger function of before revision w0007 (a NOTIFY on
    every enqueue; the revision's downgrade SQL), or the shipped one."""
    import psycopg

    from sqlalchemy_watchdog.migrations.versions.w0007_notify_when_waiting import (
        NOTIFY_ALWAYS_SQL,
        NOTIFY_WHEN_WAITING_SQL,
    )

    with psycopg.connect(target.dsn, autocommit=True) as conn:
        conn.execute(NOTIFY_ALWAYS_SQL if always else NOTIFY_WHEN_WAITING_SQL)  # type: ignore[arg-type]


def _with_old_trigger(target: Target, run: Any) -> float:
    """``run()`` with the trigger of before revision w0007 in place."""
    _notify_always(target, True)
    try:
        return float(run())
    finally:
        _notify_always(target, False)


def producers(bench: Any, r: int) -> None:
    c = bench.config
    for name in bench.in_order(r, "postgresql"):
        jobs = c.producer_jobs[name]
        bench.measure(
            "pg.producers",
            name,
            "{:,.0f} jobs/s",
            lambda name=name, jobs=jobs: producers_once(bench, name, jobs, f"producers-{name}-{r}"),
            timeout=900,
        )
    if "watchdog" in bench.subjects:
        target = bench.target("watchdog", "postgresql")

        def without_notify() -> float:
            _trigger(target, False)
            try:
                return producers_once(bench, "watchdog", c.producer_jobs["watchdog"], f"producers-quiet-{r}")
            finally:
                _trigger(target, True)

        bench.measure("pg.producers_no_notify", "watchdog", "{:,.0f} jobs/s", without_notify, timeout=900)

        jobs = c.producer_jobs["watchdog"]
        for key, tag, runner, old_trigger in (
            ("pg.producers_notify_always", "always", False, True),
            ("pg.producers_with_runner", "runner", True, False),
            ("pg.producers_with_runner_notify_always", "runner-always", True, True),
        ):

            def once(tag: str = tag, runner: bool = runner) -> float:
                return producers_once(bench, "watchdog", jobs, f"producers-{tag}-{r}", runner=runner)

            run = (lambda once=once: _with_old_trigger(target, once)) if old_trigger else once
            bench.measure(key, "watchdog", "{:,.0f} jobs/s", run, timeout=900)


# -- in-process drain ------------------------------------------------------------------------


def inprocess_entry(argv: list[str]) -> None:
    """``run.py inprocess``: a Runner thread (or an AsyncRunner on a thread's event loop)
    in this process; the main thread enqueues ``--jobs`` jobs in one transaction and
    polls every 5 ms until none is left; prints ``RATE jobs/s``."""
    import argparse
    import asyncio
    import logging
    import threading

    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    from sqlalchemy_watchdog import Job, Runner, enqueue

    parser = argparse.ArgumentParser(prog="run.py inprocess")
    parser.add_argument("--target", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--asyncio", action="store_true")
    args = parser.parse_args(argv)
    harness.exit_with_parent()
    logging.basicConfig(level=logging.WARNING)
    target = Target.from_json(args.target)
    engine = create_engine(target.sqlalchemy_url, pool_size=args.concurrency + 3, max_overflow=10)

    def handler(job: Any) -> None:
        return None

    stop: Any
    if args.asyncio:
        from sqlalchemy.ext.asyncio import create_async_engine

        from sqlalchemy_watchdog.asyncio import AsyncRunner

        async def async_handler(job: Any) -> None:
            return None

        loop = asyncio.new_event_loop()
        holder: dict[str, Any] = {}

        async def serve() -> None:
            async_engine = create_async_engine(target.sqlalchemy_url)
            holder["runner"] = AsyncRunner(async_engine, {QUEUE: async_handler}, concurrency=args.concurrency)
            try:
                await holder["runner"].run_forever()
            finally:
                await async_engine.dispose()

        thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
        thread.start()

        def stop() -> None:
            while "runner" not in holder:
                time.sleep(0.01)
            loop.call_soon_threadsafe(holder["runner"].stop)
    else:
        runner = Runner(engine, {QUEUE: handler}, concurrency=args.concurrency)
        thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False}, daemon=True)
        thread.start()
        stop = runner.stop

    def live() -> bool:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    text("SELECT EXISTS (SELECT 1 FROM watchdog_jobs WHERE state IN ('queued', 'running'))")
                ).scalar()
            )

    def put(tag: str, n: int) -> float:
        with Session(engine) as session:
            enqueue(session, [Job(f"{tag}-{i}", QUEUE, payload={"i": i}) for i in range(n)])
            session.commit()
        return time.perf_counter()

    time.sleep(0.5)
    put("warm", 2)
    while live():
        time.sleep(0.005)
    started = put("drain", args.jobs)
    while live():
        time.sleep(0.005)
    finished = time.perf_counter()
    with engine.connect() as conn:
        done = conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE outcome = 'completed'")).scalar()
    stop()
    thread.join(timeout=30)
    if done != args.jobs + 2:
        print(f"FAILED {done} of {args.jobs + 2} completed", flush=True)
        return
    print(f"RATE {args.jobs / (finished - started):.3f}", flush=True)


def inprocess_once(bench: Any, concurrency: int, jobs: int, use_asyncio: bool, tag: str) -> float:
    target = bench.target("watchdog", "postgresql")
    bench.subjects["watchdog"].reset(target)
    argv = [sys.executable, str(HERE / "run.py"), "inprocess", "--target", target.to_json()]
    argv += ["--concurrency", str(concurrency), "--jobs", str(jobs)]
    if use_asyncio:
        argv.append("--asyncio")
    with open(bench.workdir / f"{tag}.log", "w") as log:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, text=True, timeout=600).stdout
    fields = out.split()
    if not fields or fields[0] != "RATE":
        raise ScenarioFailed(f"in-process drain: {out.strip()!r} (log {tag}.log)")
    return float(fields[1])


def inprocess(bench: Any, r: int) -> None:
    """Each in-process drain beside the same runner in a process of its own (run.py's
    drain row of that shape), measured one after the other so load hits both alike."""
    c = bench.config
    jobs = c.drain["watchdog"]
    for concurrency in c.inprocess_concurrencies:
        for use_asyncio in (False, True):
            kind = "async" if use_asyncio else "sync"
            key = f"pg.inproc.{kind}.c{concurrency}"
            pair = [
                (
                    key,
                    lambda concurrency=concurrency, use_asyncio=use_asyncio, key=key: inprocess_once(
                        bench, concurrency, jobs, use_asyncio, f"{key}-{r}"
                    ),
                ),
                (
                    f"pg.separate.{kind}.c{concurrency}",
                    lambda concurrency=concurrency, use_asyncio=use_asyncio, key=key: bench.drain_once(
                        "watchdog",
                        "postgresql",
                        n=jobs,
                        procs=1,
                        concurrency=concurrency,
                        defaults=False,
                        tag=f"{key}-separate-{r}",
                        use_asyncio=use_asyncio,
                    ),
                ),
            ]
            for name, fn in pair if r % 2 == 0 else reversed(pair):
                bench.measure(name, "watchdog", "{:,.0f} jobs/s", fn, timeout=600)


# -- scale-out ---------------------------------------------------------------------------------


def scaleout(bench: Any, r: int) -> None:
    c = bench.config
    for procs in c.scaleout_processes:
        bench.measure(
            f"pg.scaleout.p{procs}",
            "watchdog",
            "{:,.0f} jobs/s",
            lambda procs=procs: bench.drain_once(
                "watchdog",
                "postgresql",
                n=c.scaleout_jobs,
                procs=procs,
                concurrency=c.scaleout_concurrency,
                defaults=False,
                tag=f"scaleout-p{procs}-{r}",
            ),
            timeout=900,
        )


# -- scale: a large table against one with 1% of its history ----------------------------------

SCALE_QUEUES = 1_000
SCALE_LANES = 10_000
SCALE_BIG_LANE = 10_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000


def build_scale(target: Target, settled: int, scheduled: int, queued: int) -> float:
    """The scale table: ``settled`` jobs settled 2 to 32 days ago, 3,600 more in the
    last hour (the same in every size), ``scheduled`` jobs delayed a day and more into
    the future, ``queued`` jobs over ``SCALE_QUEUES`` queues and ``SCALE_LANES`` lanes,
    and one lane (``big-lane``, queue ``scale-big``) of ``SCALE_BIG_LANE`` queued jobs;
    then ``VACUUM (ANALYZE)``. Returns seconds."""
    import psycopg
    from sqlalchemy import create_engine

    from sqlalchemy_watchdog import metadata

    engine = create_engine(target.sqlalchemy_url)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    engine.dispose()
    clock = "CAST(floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)"
    started = time.perf_counter()
    cols = "job_id, queue_name, lane, priority, payload_json, state, outcome, claim_token, enqueued_at, started_at, settled_at"
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        step = 30 * DAY_MS // max(settled, 1)
        conn.execute(
            f"INSERT INTO watchdog_jobs ({cols}) SELECT 'old-' || n, 'scale-' || mod(n, {SCALE_QUEUES}),"  # type: ignore[arg-type]
            f" 'lane-' || mod(n, {SCALE_LANES}), 0, '{{}}', 'settled',"
            " CASE WHEN mod(n, 20) = 0 THEN 'failed' ELSE 'completed' END, 'tok-' || n,"
            f" {clock} - 2 * {DAY_MS} - (%(rows)s - n) * CAST(%(step)s AS BIGINT) - 2000,"
            f" {clock} - 2 * {DAY_MS} - (%(rows)s - n) * CAST(%(step)s AS BIGINT) - 1000,"
            f" {clock} - 2 * {DAY_MS} - (%(rows)s - n) * CAST(%(step)s AS BIGINT)"
            " FROM generate_series(1, %(rows)s) AS g(n)",
            {"rows": settled, "step": step},
        )
        conn.execute(
            f"INSERT INTO watchdog_jobs ({cols}) SELECT 'recent-' || n, 'scale-' || mod(n, {SCALE_QUEUES}),"  # type: ignore[arg-type]
            f" 'lane-' || mod(n, {SCALE_LANES}), 0, '{{}}', 'settled', 'completed', 'tok-r' || n,"
            f" {clock} - n * 1000 - 2000, {clock} - n * 1000 - 1000, {clock} - n * 1000"
            " FROM generate_series(1, 3600) AS g(n)"
        )
        conn.execute(
            "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, run_at, ready_at,"  # type: ignore[arg-type]
            f" enqueued_at) SELECT 'later-' || n, 'scale-' || mod(n, {SCALE_QUEUES}), 'lane-' || mod(n, {SCALE_LANES}),"
            f" 0, '{{}}', 'delayed', {clock} + {DAY_MS} + n * 100, {clock} + {DAY_MS} + n * 100, {clock}"
            " FROM generate_series(1, %(rows)s) AS g(n)",
            {"rows": scheduled},
        )
        conn.execute(
            "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"  # type: ignore[arg-type]
            f" SELECT 'ready-' || n, 'scale-' || mod(n, {SCALE_QUEUES}), 'lane-' || mod(n, {SCALE_LANES}), 0, '{{}}',"
            f" 'queued', {clock} - (%(rows)s - n) FROM generate_series(1, %(rows)s) AS g(n)",
            {"rows": queued},
        )
        conn.execute(
            "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"  # type: ignore[arg-type]
            f" SELECT 'big-' || n, 'scale-big', 'big-lane', 0, '{{}}', 'queued', {clock}"
            f" FROM generate_series(1, {SCALE_BIG_LANE}) AS g(n)"
        )
        conn.execute("VACUUM (ANALYZE) watchdog_jobs")
    return time.perf_counter() - started


def _timed(call: Any, calls: int, warmup: int = 2) -> float:
    """Median ms of ``calls`` calls after ``warmup``."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure_scale(target: Target, calls: int, prune_limit: int) -> dict[str, float]:
    """ms per operation on the scale table (median of ``calls``)."""
    from sqlalchemy import create_engine

    from sqlalchemy_watchdog import Decision, Watchdog, store

    engine = create_engine(target.sqlalchemy_url)
    client = Watchdog(engine)
    out: dict[str, float] = {}
    lease = 60_000
    try:
        claimed: list[Any] = []

        def claim(queue: str) -> Any:
            def go() -> None:
                with engine.begin() as conn:
                    claimed.extend(store.claim(conn, queues=[queue], limit=1, lease_ms=lease).claimed)

            return go

        out["claim"] = _timed(claim("scale-7"), calls)
        out["claim, 10,000-job backlog"] = _timed(claim("scale-big"), calls)
        pending = list(claimed)

        def settle() -> None:
            one = pending.pop()
            with engine.begin() as conn:
                store.settle(conn, job_id=one.job.job_id, claim_token=one.token, decision=Decision.completed())

        out["settle"] = _timed(settle, min(calls, len(pending) - 2))
        out["stats()"] = _timed(client.stats, calls)
        out["list_jobs(limit=100)"] = _timed(lambda: client.list_jobs(limit=100), calls)
        out["list_jobs(state=queued, limit=100)"] = _timed(lambda: client.list_jobs(state="queued", limit=100), calls)
        with engine.connect() as conn:
            live = conn.exec_driver_sql(
                "SELECT count(*) FROM watchdog_jobs WHERE lane = 'big-lane' AND state IN ('delayed', 'queued', 'running')"
            ).scalar_one()
        started = time.perf_counter()
        total = 0
        while True:  # one call settles a batch; a caller repeats until no live job is left
            failed = client.fail_lane("big-lane", "scale benchmark")
            total += failed.settled
            if not failed.more:
                break
        out[f"fail_lane, {SCALE_BIG_LANE:,}-job lane"] = (time.perf_counter() - started) * 1000
        if total != live:
            raise ScenarioFailed(f"fail_lane settled {total} of {live}")
        started = time.perf_counter()
        deleted = client.prune(older_than=timedelta(days=1), limit=prune_limit)
        out["prune, per 1,000 old jobs"] = (time.perf_counter() - started) * 1000 / (prune_limit / 1000)
        if deleted != prune_limit:
            raise ScenarioFailed(f"prune deleted {deleted} of {prune_limit}")
    finally:
        engine.dispose()
    return out


def scale(bench: Any) -> None:
    c = bench.config
    sizes = {"full": c.scale_settled, "1%": max(1, c.scale_settled // 100)}
    # The same number of old jobs pruned in both tables: half the small one's history.
    prune_limit = max(100, min(10_000, c.scale_settled // 200))
    for label, settled in sizes.items():
        target = harness.create_database(f"scale_{label.strip('%')}")
        try:
            seconds = build_scale(target, settled, c.scale_scheduled, c.scale_queued)
            bench.log(f"scale table ({label}: {settled:,} settled) built in {seconds:.0f}s, load {load()}")
            for r in range(c.repeat):
                if r:
                    build_scale(target, settled, c.scale_scheduled, c.scale_queued)
                bench.measure(
                    f"pg.scale.{label}",
                    "watchdog",
                    "{}",
                    lambda target=target: measure_scale(target, c.scale_calls, prune_limit),
                    timeout=1800,
                )
        finally:
            harness.drop_database(target)


# -- rendering ----------------------------------------------------------------------------------


def _spread(values: list[Any]) -> str:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return ""
    return f" ({min(present):,.0f}-{max(present):,.0f})"


def render(results: dict[str, dict[str, list[Any]]], summary: dict[str, dict[str, Any]], config: Any) -> str:
    """The round-2 tables (medians of the repeats, spread min-max)."""
    parts: list[str] = []
    txn_runs = [v for v in results.get("pg.txn", {}).get("watchdog", []) if v]
    if txn_runs:
        med = summary["pg.txn"]["watchdog"]
        lines = [
            "| in an open transaction (PostgreSQL) | p50 (us) | p99 (us) | round trips | vs session.add p50 |",
            "| --- | --- | --- | --- | --- |",
        ]
        for n in (1, 100):
            for kind in ("enqueue", "session_add"):
                k = f"{kind}_{n}"
                label = (
                    f"enqueue(session, {'job' if n == 1 else '[100 jobs]'})"
                    if kind == "enqueue"
                    else (f"session.add{'' if n == 1 else '_all'}({'row' if n == 1 else '[100 rows]'}) + flush()")
                )
                ratio = med[f"{k}_p50"] / med[f"session_add_{n}_p50"]
                lines.append(
                    f"| {label} | {med[f'{k}_p50']:,.0f}{_spread([v[f'{k}_p50'] for v in txn_runs])}"
                    f" | {med[f'{k}_p99']:,.0f}{_spread([v[f'{k}_p99'] for v in txn_runs])}"
                    f" | {med[f'{k}_trips']:.0f} | {ratio:.2f}x |"
                )
        parts.append("\n".join(lines))
    prod = results.get("pg.producers", {})
    if prod:
        lines = ["| 16 producer processes, 1 job per transaction (jobs/s) | median (min-max) |", "| --- | --- |"]
        for name, values in prod.items():
            lines.append(f"| {name} | {summary['pg.producers'][name] or 0:,.0f}{_spread(values)} |")
        for key, label in (
            ("pg.producers_notify_always", "watchdog, the trigger before w0007 (NOTIFY on every enqueue)"),
            ("pg.producers_no_notify", "watchdog, NOTIFY trigger disabled"),
            ("pg.producers_with_runner", "watchdog, a runner draining meanwhile (its defaults)"),
            (
                "pg.producers_with_runner_notify_always",
                "watchdog, a runner draining meanwhile, the trigger before w0007",
            ),
        ):
            values = results.get(key, {}).get("watchdog")
            if values:
                lines.append(f"| {label} | {summary[key]['watchdog'] or 0:,.0f}{_spread(values)} |")
        parts.append("\n".join(lines))
    inproc = sorted(k for k in results if k.startswith("pg.inproc."))
    if inproc:
        lines = [
            "| drain, runner in-process (jobs/s) | in-process | separate process | in-process / separate |",
            "| --- | --- | --- | --- |",
        ]
        for key in inproc:
            _, _, kind, conc = key.split(".")
            value = summary[key]["watchdog"]
            separate_key = f"pg.separate.{kind}.{conc}"
            separate = summary.get(separate_key, {}).get("watchdog")
            ratio = f"{value / separate:.2f}x" if value and separate else "-"
            sep = f"{separate:,.0f}{_spread(results[separate_key]['watchdog'])}" if separate else "-"
            runner = "AsyncRunner" if kind == "async" else "Runner"
            lines.append(
                f"| {runner}, concurrency {conc[1:]} | {value or 0:,.0f}{_spread(results[key]['watchdog'])} | {sep} | {ratio} |"
            )
        parts.append("\n".join(lines))
    outs = sorted((k for k in results if k.startswith("pg.scaleout.p")), key=lambda k: int(k.rsplit("p", 1)[1]))
    if outs:
        lines = ["| runner processes (concurrency 4 each) | jobs/s | vs 1 process |", "| --- | --- | --- |"]
        one = summary[outs[0]]["watchdog"]
        for key in outs:
            value = summary[key]["watchdog"]
            lines.append(
                f"| {key.rsplit('p', 1)[1]} | {value or 0:,.0f}{_spread(results[key]['watchdog'])} | {(value or 0) / one:.2f}x |"
                if one
                else f"| {key} | - | - |"
            )
        parts.append("\n".join(lines))
    full = summary.get("pg.scale.full", {}).get("watchdog")
    small = summary.get("pg.scale.1%", {}).get("watchdog")
    if full:
        runs = [v for v in results["pg.scale.full"]["watchdog"] if v]
        lines = [
            f"| scale (ms; {config.scale_settled:,} settled, {config.scale_scheduled:,} scheduled, {config.scale_queued:,} queued"
            f" over {SCALE_QUEUES:,} queues / {SCALE_LANES:,} lanes) | full | 1% of the history | full / 1% |",
            "| --- | --- | --- | --- |",
        ]
        for op, value in full.items():
            spread = [v[op] for v in runs]
            low = f" ({min(spread):.2f}-{max(spread):.2f})" if len(spread) > 1 else ""
            other = small.get(op) if small else None
            ratio = f"{value / other:.2f}x" if value and other else "-"
            lines.append(
                f"| {op} | {value:.2f}{low} | {other:.2f} | {ratio} |"
                if other
                else f"| {op} | {value:.2f}{low} | - | - |"
            )
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


# -- charts ---------------------------------------------------------------------------------------


def plot(summary: dict[str, dict[str, Any]], subjects: list[str], directory: Path) -> list[Path]:
    """drain.png, latency.png and scaleout.png (those with data) in ``directory``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    drains = [k for k in summary if k.startswith(("pg.drain.", "pg.inproc.", "pg.separate."))]
    if drains:
        subjects = [n for n in subjects if any(summary[k].get(n) for k in drains)]
        fig, ax = plt.subplots(figsize=(11, 5))
        width = 0.8 / max(1, len(subjects))
        for i, name in enumerate(subjects):
            values = [summary[k].get(name) or 0 for k in drains]
            ax.bar([x + i * width for x in range(len(drains))], values, width, label=name)
        ax.set_xticks([x + width * (len(subjects) - 1) / 2 for x in range(len(drains))])
        ax.set_xticklabels([k.removeprefix("pg.") for k in drains], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("jobs/s")
        ax.set_title("Drain on PostgreSQL (median of the repeats)")
        ax.legend()
        fig.tight_layout()
        path = directory / "drain.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    if "pg.latency" in summary:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = [n for n in subjects if summary["pg.latency"].get(n)]
        width = 0.25
        for i, p in enumerate(("p50", "p95", "p99")):
            ax.bar(
                [x + i * width for x in range(len(names))],
                [summary["pg.latency"][n][p] or 0 for n in names],
                width,
                label=p,
            )
        ax.set_xticks([x + width for x in range(len(names))])
        ax.set_xticklabels(names)
        ax.set_ylabel("enqueue-to-start (ms)")
        ax.set_title("Latency, each queue's defaults")
        ax.legend()
        fig.tight_layout()
        path = directory / "latency.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    outs = sorted((k for k in summary if k.startswith("pg.scaleout.p")), key=lambda k: int(k.rsplit("p", 1)[1]))
    if outs:
        procs = [int(k.rsplit("p", 1)[1]) for k in outs]
        rates = [summary[k]["watchdog"] or 0 for k in outs]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(procs, rates, marker="o", label="watchdog")
        if rates[0]:
            ax.plot(procs, [rates[0] * p for p in procs], linestyle=":", color="grey", label="linear")
        ax.set_xscale("log", base=2)
        ax.set_xticks(procs)
        ax.set_xticklabels([str(p) for p in procs])
        ax.set_xlabel("runner processes (concurrency 4 each)")
        ax.set_ylabel("jobs/s")
        ax.set_title("Scale-out on PostgreSQL")
        ax.legend()
        fig.tight_layout()
        path = directory / "scaleout.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
