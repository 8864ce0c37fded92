"""One table as it grows (issue 60): the rates, the start latency and the operations reads beside a
backlog and a settled history of growing sizes, a prune of settled jobs beside a draining runner
(``growth``), and a churn soak that samples the table's and each index's size, optionally with one
transaction holding back the vacuum horizon for part of it (``soak``). PostgreSQL, watchdog only."""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from benchmarks import harness as h
from sqlalchemy_watchdog import Job, Retention, Runner, enqueue
from sqlalchemy_watchdog import Watchdog as Client

CLOCK = h.CLOCK_SQL["postgresql"]
#: The queue an idle runner serves for the start latency (the backlog's queue is :data:`h.QUEUE`).
LATENCY_QUEUE = "growth-latency"
#: The queue the enqueue rates write to; its jobs are deleted after each measurement.
ENQUEUE_QUEUE = "growth-enqueue"
#: Settled jobs of the backlog's queue, settled evenly over the last 30 days (1/720 of them in the
#: last hour, what ``stats()`` and ``throughput()`` read), one in 20 failed; enqueued 2 s and started
#: 1 s before they settled.
HISTORY_AT = f"({CLOCK} - CAST(:rows - n + 1 AS BIGINT) * :step)"
HISTORY = h.job_rows("history", at=HISTORY_AT, outcome=h.FAILED_1_IN_20)
#: Completed jobs settled from 8 days before the insert on going back, 10 ms apart: all prunable.
OLD = h.job_rows("old", at=f"({CLOCK} - 8 * {h.DAY_MS} - CAST(:rows - n AS BIGINT) * 10)")
#: The claim order of the backlog's queued jobs, the ``k``-th one's sequence (the live index, in order).
HEAD_SQL = (
    "SELECT sequence FROM watchdog_jobs WHERE queue_name = :queue AND state = 'queued'"
    " ORDER BY priority DESC, sequence LIMIT 1 OFFSET :k"
)
LIVE_SQL = "SELECT count(*) FROM watchdog_jobs WHERE queue_name = :queue AND state IN ('delayed', 'queued', 'running')"
#: Completed jobs of the backlog's queue settled in [a, b) by the database clock (``ix_watchdog_jobs_settled``).
SETTLED_IN_SQL = (
    "SELECT count(*) FROM watchdog_jobs WHERE state = 'settled' AND outcome = 'completed'"
    " AND settled_at >= :a AND settled_at < :b AND queue_name = :queue"
)

_batches = iter(range(1, 1 << 30))  # a fresh job_id prefix for every backlog insert


def backlog_rows() -> dict[str, str]:
    """:func:`h.insert_jobs` columns of queued jobs of the benchmark's queue, enqueued now."""
    return h.job_rows(f"backlog{next(_batches)}", "queued", enqueued_at=CLOCK)


def build(target: h.Target, backlog: int, history: int) -> float:
    """Empty the table, insert ``history`` settled jobs, then ``backlog`` queued ones (so the history
    comes first in admission order, as it would have), then ``VACUUM (ANALYZE)``; seconds."""
    h.truncate(target)
    seconds = 0.0
    if history:
        step = max(1, 30 * h.DAY_MS // history)
        seconds += h.insert_jobs(target, history, HISTORY, analyse=False, step=step)
    return seconds + h.insert_jobs(target, backlog, backlog_rows())


def top_up(target: h.Target, backlog: int) -> int:
    """Insert queued jobs at the tail until the queue holds ``backlog`` live jobs again; how many."""
    missing = backlog - int(h.run_sql(target, LIVE_SQL, {"queue": h.QUEUE}))
    if missing > 0:
        h.insert_jobs(target, missing, backlog_rows(), analyse=False)
    return max(0, missing)


def clock(target: h.Target) -> int:
    """The database clock now, epoch ms."""
    return int(h.run_sql(target, f"SELECT {CLOCK}"))


def head(target: h.Target, *positions: int) -> list[int]:
    """The sequences of the queued jobs at these positions of the claim order."""
    found = [h.run_sql(target, HEAD_SQL, {"queue": h.QUEUE, "k": k}) for k in positions]
    if None in found:
        raise h.ScenarioFailed(f"the backlog holds fewer than {max(positions) + 1:,} queued jobs")
    return [int(s) for s in found]


def drain(bench: h.Bench, target: h.Target, jobs: int, warm: int, tag: str) -> float:
    """Jobs/s of one runner process at its defaults taking ``jobs`` jobs from the head of the backlog
    after ``warm`` jobs: from the last settle of the warm-up to the last of the ``jobs``, both read
    from the rows' ``settled_at`` (the database clock), so polling and start-up are outside."""
    first, warm_end, start, last = head(target, 0, warm - 1, warm, warm + jobs - 1)
    begun = clock(target)
    range_sql = (
        "SELECT count(*), max(settled_at) FROM watchdog_jobs WHERE sequence BETWEEN %s AND %s"
        " AND queue_name = %s AND state = 'settled' AND outcome = 'completed' AND settled_at >= %s"
    )
    with bench.workers("watchdog", target, tag, defaults=True) as children:
        with contextlib.closing(psycopg.connect(target.dsn, autocommit=True)) as conn:
            settled = lambda seq: conn.execute(
                "SELECT state = 'settled' FROM watchdog_jobs WHERE sequence = %s", (seq,)
            ).fetchone()[0]
            in_range = lambda a, b: conn.execute(range_sql, (a, b, h.QUEUE, begun)).fetchone()
            h.poll_until(lambda: settled(warm_end), timeout=120, interval=0.01, what="warm-up", children=children)
            h.poll_until(
                lambda: settled(last), timeout=60 + jobs / 100, interval=0.005, what="drain", children=children
            )
            h.poll_until(lambda: in_range(start, last)[0] >= jobs, timeout=30, interval=0.01, what="drain's last jobs")
            (done, t_b), (_, t_a) = in_range(start, last), in_range(first, warm_end)
    if done != jobs or t_a is None or t_b is None or t_b <= t_a:
        raise h.ScenarioFailed(f"drain: {done} of {jobs} jobs completed, settled from {t_a} to {t_b}")
    return jobs / ((t_b - t_a) / 1000.0)


def drain_figure(bench: h.Bench, target: h.Target, jobs: int, warm: int, tag: str) -> dict[str, float]:
    return {"drain (runner defaults)": drain(bench, target, jobs, warm, tag)}


def enqueue_rates(target: h.Target, single: int, batches: int, tag: str) -> dict[str, float]:
    """Jobs/s of ``single`` jobs one per transaction (``Watchdog(engine).enqueue``) and of ``batches``
    transactions of 1,000 (``enqueue(session, [jobs])`` + commit), into a queue nobody serves,
    whose jobs are deleted afterwards."""
    with h.disposed(h.engine(target)) as eng:
        client = Client(eng)
        client.enqueue(Job(f"{tag}-warm", ENQUEUE_QUEUE))  # warm the pool, as a long-lived application is
        started = time.perf_counter()
        for i in range(single):
            client.enqueue(Job(f"{tag}-{i}", ENQUEUE_QUEUE, payload={"i": i}))
        one = single / (time.perf_counter() - started)
        started = time.perf_counter()
        for b in range(batches):
            with Session(eng) as session:
                enqueue(session, [Job(f"{tag}-{b}-{i}", ENQUEUE_QUEUE, payload={"i": i}) for i in range(1000)])
                session.commit()
        many = batches * 1000 / (time.perf_counter() - started)
    # state as a literal: the planner then reads the queue's range of the live index, not the table
    h.run_sql(
        target, "DELETE FROM watchdog_jobs WHERE queue_name = :queue AND state = 'queued'", {"queue": ENQUEUE_QUEUE}
    )
    return {"enqueue, 1 per transaction": one, "enqueue, 1,000 per statement": many}


def latency_role(target: h.Target) -> None:
    """A runner with its defaults serving :data:`LATENCY_QUEUE` only, its handler reporting its starts."""
    logging.basicConfig(level=logging.WARNING)
    eng = create_engine(target.url)
    runner = Runner(eng, {LATENCY_QUEUE: lambda job: h.say("START", f"{job.job_id} {time.time():.6f}")})
    with eng.connect() as conn:
        conn.execute(text("SELECT 1"))
    h.say("READY")
    runner.run_forever()
    eng.dispose()


def start_latency(bench: h.Bench, target: h.Target, warmup: int, samples: int, tag: str) -> dict[str, float]:
    """Enqueue-to-start p50/p95 (ms) of an idle runner serving a queue of its own beside the backlog
    (README.md: the latency row, here in the grown table)."""
    with bench.spawn(tag, 1, latency_role, target=target) as (child,), h.disposed(h.engine(target)) as eng:
        client = Client(eng)

        def go(key: str) -> float:
            client.enqueue(Job(key, LATENCY_QUEUE, payload={"k": key}))
            return time.time()

        time.sleep(0.5)  # to its idle wait
        values = bench.start_latencies(child, go, tag, warmup, samples)
    return h.percentiles(values, (50, 95), "start latency p{}")


def reads(target: h.Target, calls: int) -> dict[str, float]:
    """Median ms of the reads the dashboard and the operations make: the first page of
    ``list_jobs`` (oldest first), the dashboard's jobs page (newest 50, no payloads), the first
    page of queued jobs, and the overview's two reads, ``stats()`` and ``throughput()``."""
    with h.disposed(h.engine(target)) as eng:
        client = Client(eng)
        timed: dict[str, tuple[Callable[[], Any], int]] = {
            "list_jobs first page": (lambda: client.list_jobs(limit=100), calls),
            "jobs page (newest 50)": (lambda: client.list_jobs(limit=50, newest_first=True, with_payload=False), calls),
            # walks admission order past the history first (list_jobs' docstring): fewer calls
            "list_jobs(state=queued) first page": (lambda: client.list_jobs(state="queued", limit=100), max(3, calls // 4)),
            "stats()": (client.stats, calls),
            "throughput()": (client.throughput, calls),
        }  # fmt: skip
        return {name: h.percentile(h.time_calls(read, n, 1), 50) for name, (read, n) in timed.items()}


def record(bench: h.Bench, table: str, row: str, figures: Callable[[], dict[str, float]], timeout: float) -> None:
    """``figures()`` under a deadline, each figure in its column of ``row``; a failure is listed and
    the run goes on (its cells stay empty)."""
    try:
        with h.deadline(timeout, row):
            values = figures()
    except Exception as error:
        bench.fail(f"{table} / {row}", error)
        return
    for column, value in values.items():
        bench.record(table, row, column, value)
        bench.log(f"{row:<36} {column:<36} {h.fmt(value)}")


RATES = "growth: rates by table size (jobs/s), PostgreSQL, watchdog"
RELATIVE = "growth: rates by table size, relative to the first cell (median / its median)"
TIMES = "growth: start latency and reads by table size (ms; reads: median), PostgreSQL, watchdog"


def cell(backlog: int, history: int) -> str:
    return f"backlog {backlog:,}, history {history:,}"


@h.scenario("growth", options="backlogs histories jobs samples prune-rows")
def growth(bench: h.Bench) -> None:
    """Drain and enqueue rates, start latency and the dashboard's reads beside growing backlogs and histories; a prune."""
    backlogs = [int(x) for x in str(bench.opt("backlogs", "10000,1000000,5000000", "1000,10000")).split(",") if x]
    histories = [int(x) for x in str(bench.opt("histories", "0,1000000,10000000", "0,10000")).split(",") if x]
    jobs, warm = bench.opt("jobs", 20_000, 300), (100 if bench.quick else 1000)
    single, batches = (200, 3) if bench.quick else (2000, 10)
    samples, calls = bench.opt("samples", 100, 10), (5 if bench.quick else 20)
    bench.table(RATES), bench.table(TIMES), bench.table(RELATIVE, chart="growth.png")  # in this order
    with bench.database("postgresql", "growth", fails="growth") as target:
        for history in histories:
            for backlog in backlogs:
                row, n = cell(backlog, history), min(jobs, backlog - warm)
                if n < 1:
                    bench.fail(row, h.ScenarioFailed(f"a backlog of {backlog:,} is not above the warm-up's {warm:,}"))
                    continue
                with h.deadline(3600, f"building {row}"):
                    seconds = build(target, backlog, history)
                bench.log(f"{row}: built and analysed in {seconds:.0f}s; drains of {n:,} jobs")
                for r in range(bench.repeat):
                    tag = f"g{backlog}-{history}-{r}"
                    record(bench, RATES, row, partial(drain_figure, bench, target, n, warm, tag), 900)
                    top_up(target, backlog)
                    record(bench, RATES, row, partial(enqueue_rates, target, single, batches, f"enq-{tag}"), 900)
                    record(bench, TIMES, row, partial(start_latency, bench, target, 3, samples, f"lat-{tag}"), 900)
                    record(bench, TIMES, row, partial(reads, target, calls), 1800)
        base, big = cell(backlogs[0], histories[0]), (1_000_000, 10_000_000)
        if big[0] not in backlogs or big[1] not in histories:
            big = (max(backlogs), max(histories))
        for column in ("drain (runner defaults)", "enqueue, 1 per transaction", "enqueue, 1,000 per statement"):
            goal = f"{column} at {cell(*big)} >= 0.9x at {base}"
            bench.check_median(goal, RATES, cell(*big), column, lambda m: m >= 0.9, versus=column, versus_row=base)
            first = bench.medians(RATES, base).get(column)
            for row in bench.tables[RATES].cells if RATES in bench.tables and first else ():
                if (value := bench.medians(RATES, row).get(column)) is not None:
                    bench.record(RELATIVE, row, column, value / first)
    if prune_rows := bench.opt("prune-rows", 1_000_000, 10_000):
        prune_beside_drain(bench, prune_rows, warm)


def prune_beside_drain(bench: h.Bench, rows: int, warm: int) -> None:
    """``Watchdog.prune`` of ``rows`` old settled jobs while a runner at its defaults drains a backlog
    twice as long: the prune's time, and the runner's rate before, during and after it (completed jobs
    settled in each window, by the database clock)."""
    backlog, window = max(20_000, 2 * rows), (1.0 if bench.quick else 5.0)
    table = f"growth: prune of {rows:,} settled jobs beside a runner draining, PostgreSQL, watchdog"

    def once(target: h.Target, tag: str) -> dict[str, float]:
        h.truncate(target)
        h.insert_jobs(target, rows, OLD, analyse=False)
        h.insert_jobs(target, backlog, backlog_rows())
        (warm_end,) = head(target, warm - 1)
        with bench.workers("watchdog", target, tag, defaults=True) as children, h.disposed(h.engine(target)) as eng:
            with contextlib.closing(psycopg.connect(target.dsn, autocommit=True)) as conn:
                state = lambda: conn.execute(
                    "SELECT state FROM watchdog_jobs WHERE sequence = %s", (warm_end,)
                ).fetchone()
                h.poll_until(
                    lambda: state() == ("settled",), timeout=120, interval=0.01, what="warm-up", children=children
                )
            marks = [clock(target)]
            time.sleep(window)
            marks.append(clock(target))
            started = time.perf_counter()
            deleted = Client(eng).prune(older_than=timedelta(days=1))
            seconds = time.perf_counter() - started
            marks.append(clock(target))
            time.sleep(window)
            marks.append(clock(target))
            if not h.run_sql(target, HEAD_SQL, {"queue": h.QUEUE, "k": 0}):
                raise h.ScenarioFailed("the runner drained the whole backlog before the last window ended")
        if deleted != rows:
            raise h.ScenarioFailed(f"prune deleted {deleted:,} of {rows:,}")
        rates = []
        for a, b in itertools.pairwise(marks):
            rates.append(h.run_sql(target, SETTLED_IN_SQL, {"a": a, "b": b, "queue": h.QUEUE}) / ((b - a) / 1000.0))
        return {
            "prune (s)": seconds, "pruned (rows/s)": rows / seconds, "drain before (jobs/s)": rates[0],
            "drain during the prune (jobs/s)": rates[1], "drain after (jobs/s)": rates[2],
            "during / before": rates[1] / rates[0] if rates[0] else float("nan"),
        }  # fmt: skip

    with bench.database("postgresql", "growth_prune", fails="growth prune") as target:
        for r in range(bench.repeat):
            bench.measure(table, "", "watchdog", lambda r=r: once(target, f"prune-{r}"), 1800)


# -- the churn soak ------------------------------------------------------------------------


def churn_role(target: h.Target, rate: float, seconds: float, prefix: str) -> None:
    """Enqueue ``rate`` jobs a second, one per transaction, for ``seconds``; RESULT how many and how far
    behind the schedule it fell at most (s)."""
    with h.disposed(h.engine(target)) as eng:
        client = Client(eng)
        client.enqueue(Job(f"{prefix}-warm", h.QUEUE))
        h.say("READY")
        started, n, behind = time.perf_counter(), 0, 0.0
        while (now := time.perf_counter() - started) < seconds:
            if (due := n / rate) > now:
                time.sleep(min(due - now, 0.05))
                continue
            client.enqueue(Job(f"{prefix}-{n}", h.QUEUE, payload={"i": n}))
            n, behind = n + 1, max(behind, now - due)
        h.say("RESULT", {"enqueued": n, "behind": behind})


def soak_runner_role(target: h.Target, retain_seconds: float) -> None:
    """A runner with its defaults that prunes completed jobs older than ``retain_seconds``."""
    logging.basicConfig(level=logging.WARNING)
    every = timedelta(seconds=max(1.0, min(60.0, retain_seconds / 4)))
    retention = Retention(completed=timedelta(seconds=retain_seconds), every=every)
    eng = create_engine(target.url)
    runner = Runner(eng, {h.QUEUE: lambda job: None}, retention=retention)
    with eng.connect() as conn:
        conn.execute(text("SELECT 1"))
    h.say("READY")
    runner.run_forever()
    eng.dispose()


#: One sample of the soak: sizes (bytes), the table's tuple counts, the age of the oldest xmin or xid a
#: session of this database holds (transactions; what keeps vacuum from removing dead rows).
SIZES_SQL = """
SELECT pg_total_relation_size(relid), pg_relation_size(relid), n_live_tup, n_dead_tup, autovacuum_count,
       (SELECT max(greatest(age(backend_xmin), age(backend_xid))) FROM pg_stat_activity
        WHERE datname = current_database())
FROM pg_stat_user_tables WHERE relname = 'watchdog_jobs'
"""
INDEX_SIZES_SQL = """
SELECT replace(indexrelname, 'watchdog_jobs_', ''), pg_relation_size(indexrelid)
FROM pg_stat_user_indexes WHERE relname = 'watchdog_jobs' ORDER BY indexrelname
"""
#: Completed jobs settled in [a, b): how many, and their wait from enqueue to start (ms), p50 and p95.
WAITS_SQL = """
SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY started_at - enqueued_at),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY started_at - enqueued_at)
FROM watchdog_jobs WHERE state = 'settled' AND outcome = 'completed' AND settled_at >= %s AND settled_at < %s
"""


def sample(conn: Any, since: int) -> tuple[int, dict[str, float], dict[str, float]]:
    """The database clock now, the sizes (MB) and the rest of one soak sample since ``since``."""
    now = int(conn.execute(f"SELECT {CLOCK}").fetchone()[0])
    total, heap, live, dead, vacuums, xmin_age = conn.execute(SIZES_SQL).fetchone()
    sizes = {"table + indexes (MB)": total / 2**20, "heap (MB)": heap / 2**20}
    sizes |= {f"{name} (MB)": size / 2**20 for name, size in conn.execute(INDEX_SIZES_SQL)}
    settled, p50, p95 = conn.execute(WAITS_SQL, (since, now)).fetchone()
    backlog = conn.execute(LIVE_SQL.replace(":queue", "%s"), (h.QUEUE,)).fetchone()[0]
    rest = {
        "settled/s": settled / max(0.001, (now - since) / 1000.0), "wait p50 (ms)": p50, "wait p95 (ms)": p95,
        "backlog": backlog, "live tuples": live, "dead tuples": dead, "autovacuums": vacuums,
        "oldest xmin age (xacts)": xmin_age,
    }  # fmt: skip
    return now, sizes, rest


@h.scenario("soak", options="rate minutes hold-minutes sample-every retain-seconds")
def soak(bench: h.Bench) -> None:
    """Churn at --rate jobs/s for --minutes, sampling table and index sizes; --hold-minutes holds xmin midway."""
    rate, minutes = float(bench.opt("rate", 500.0, 100.0)), float(bench.opt("minutes", 30.0, 1.0))
    every = float(bench.opt("sample-every", 30.0, 10.0))
    hold = float(bench.opt("hold-minutes", 0.0)) * 60
    retain = max(2 * every, float(bench.opt("retain-seconds", 300.0, 20.0)))
    seconds = minutes * 60
    hold_from, hold_to = (seconds - hold) / 2, (seconds + hold) / 2
    what = f"{rate:,.0f} jobs/s for {minutes:g} min, completed jobs kept {retain:g} s"
    what += f", xmin held {hold_from:.0f}-{hold_to:.0f} s" if hold else ""
    sizes_table, samples_table = f"soak sizes ({what})", f"soak samples ({what})"
    summary = f"soak summary ({what})"
    bench.table(sizes_table, chart="soak-sizes.png")
    with bench.database("postgresql", "soak", fails="soak") as target:
        runner = bench.spawn("soak-runner", 1, soak_runner_role, target=target, retain_seconds=retain)
        with runner as children, contextlib.closing(psycopg.connect(target.dsn, autocommit=True)) as conn:
            producer = h.Child(bench.workdir / "soak-producer.log", churn_role, target=target, rate=rate,
                               seconds=seconds, prefix="soak")  # fmt: skip
            holder: Any = None
            try:
                producer.wait_ready()
                started, since = time.monotonic(), int(conn.execute(f"SELECT {CLOCK}").fetchone()[0])
                phases: dict[str, list[float]] = {"before": [], "during": [], "after": []}
                waits: dict[str, list[float]] = {"before": [], "during": [], "after": []}
                first: dict[str, float] = {}
                history: list[float] = []
                backlogs: list[float] = []
                k = 0
                while (elapsed := time.monotonic() - started) < seconds:
                    next_sample = (k + 1) * every
                    if hold and holder is None and hold_from <= elapsed < hold_to:
                        holder = psycopg.connect(target.dsn)  # a transaction with an xid, open until hold_to
                        holder.execute("SELECT pg_current_xact_id()")
                        bench.log(f"soak: xmin held from {elapsed:.0f}s")
                    if holder is not None and elapsed >= hold_to:
                        holder.close()
                        holder = None
                        bench.log(f"soak: xmin released at {elapsed:.0f}s")
                    wake = [next_sample] + [t for t in (hold_from, hold_to) if hold and t > elapsed]
                    time.sleep(max(0.0, min(wake) - elapsed))
                    if time.monotonic() - started < next_sample:
                        continue
                    if not children[0].alive():
                        raise h.ScenarioFailed(f"soak: the runner died; {children[0].tail()}")
                    since, sizes, rest = sample(conn, since)
                    k += 1
                    at = f"t={round(next_sample)}s"
                    phase = "before" if not hold or next_sample <= hold_from else "during"
                    phase = "after" if hold and next_sample > hold_to else phase
                    for column, value in sizes.items():
                        bench.record(sizes_table, at, column, value)
                    rest["xmin held"] = float(holder is not None)
                    for column, value in rest.items():
                        bench.record(samples_table, at, column, value)
                    phases[phase].append(rest["settled/s"])
                    waits[phase].append(rest["wait p95 (ms)"] or 0.0)
                    history.append(sizes["table + indexes (MB)"])
                    backlogs.append(rest["backlog"])
                    first = first or sizes
                    bench.log(f"soak {at}: {sizes['table + indexes (MB)']:.1f} MB, {rest['settled/s']:.0f}/s, "
                              f"wait p95 {h.fmt(rest['wait p95 (ms)'])} ms, {rest['dead tuples']} dead, backlog {rest['backlog']}")  # fmt: skip
                result = producer.result(60)
            finally:
                if holder is not None:
                    holder.close()
                producer.stop()
        figures: dict[str, float | None] = {
            "enqueued": result["enqueued"], "producer behind schedule at most (s)": result["behind"],
            "size at the first sample (MB)": first.get("table + indexes (MB)"),
            "size at the end (MB)": history[-1] if history else None, "size at most (MB)": max(history, default=None),
            "backlog at most (jobs)": max(backlogs, default=None),
        }  # fmt: skip
        if len(history) >= 3:
            two_thirds = history[(2 * len(history)) // 3 - 1]
            figures["growth over the last third (%)"] = (history[-1] / two_thirds - 1) * 100
        for phase in ("before", "during", "after") if hold else ("before",):
            label = phase if hold else "all samples"
            figures[f"settled/s, {label} (median of samples)"] = h.median(phases[phase])
            figures[f"wait p95 (ms), {label} (worst sample)"] = max(waits[phase], default=None)
        for row, value in figures.items():
            bench.record(summary, row, "watchdog", value)
        if not bench.quick and not hold and "growth over the last third (%)" in figures:
            goal = "soak: table + index size grows < 10% over the last third of the churn"
            bench.check_median(goal, summary, "growth over the last third (%)", "watchdog", lambda m: m < 10, " %")
