"""The side-by-side rows: enqueue, drain and enqueue-to-start latency of every subject (watchdog alone
on SQLite and MariaDB); and a drain of a limited queue (flow control) beside the same drain unlimited."""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any

from benchmarks import harness as h
from sqlalchemy_watchdog import Decision, Job, Watchdog, store
from sqlalchemy_watchdog.gateway import SyncGateway

PEER_JOBS = {"watchdog": 1.0, "procrastinate": 0.5, "pgqueuer": 1.0}  # procrastinate enqueues/drains slower
DRAIN_JOBS = {"watchdog": 20_000, "procrastinate": 1_500, "pgqueuer": 20_000}
QUICK_DRAIN_JOBS = {"watchdog": 300, "procrastinate": 100, "pgqueuer": 300}
#: watchdog's drain of each other dialect: (jobs, --quick jobs). MariaDB's runners poll (0.25 s by
#: default), and a drain's clock includes the wake-up: enough jobs that it is a small part.
OTHER_DRAIN_JOBS = {"sqlite": (500, 60), "mariadb": (5000, 300)}
#: Drain concurrencies of each dialect, and its AsyncRunner rows' (none on SQLite).
DRAIN_CONCURRENCIES = {"postgresql": ("1,4,16,64", "4,16,64"), "sqlite": ("1,4", ""), "mariadb": ("1,4,16", "16")}
PLAIN_ROW = "baseline: session.add(row) + commit, no queue"  # an application's own row, no queue
SESSION_ROW = "1 job in the caller's Session + commit"


def _rate(subject: Any, target: h.Target, call: Any, args: Any, jobs: int) -> float:
    """jobs/s of ``call(target, *args)`` (seconds for ``jobs`` jobs) on an emptied queue."""
    subject.reset(target)
    return float(jobs / call(target, *args))


@h.scenario("enqueue", per_repeat=True, suite=True, options="jobs")
def enqueue(bench: h.Bench, r: int) -> None:
    """Jobs/s: one job per transaction (also in the caller's Session), 1,000 per statement."""
    batches = 3 if bench.quick else 10
    for dialect in bench.dialects(h.QUEUE_DIALECTS):
        table = f"enqueue (jobs/s), {h.LABEL[dialect]}"
        bench.table(table, ratios="watchdog")
        base = (50 if bench.quick else 300) if dialect == "sqlite" else (200 if bench.quick else 2000)
        for name in bench.in_order(r, dialect):
            subject, target = bench.subjects[name], bench.target(name, dialect)
            n = bench.opt("jobs", int(base * PEER_JOBS[name]))
            runs: list[tuple[str, Any, tuple[Any, ...], int]] = [
                ("1 job per transaction", subject.enqueue_single, (n, f"s{r}"), n)
            ]
            if name == "watchdog":
                runs.append((SESSION_ROW, subject.enqueue_batch, (n, 1, f"t{r}"), n))
                runs.append((PLAIN_ROW, subject.session_add_single, (n, f"p{r}"), n))
            runs.append(("1,000 jobs per statement", subject.enqueue_batch, (batches, 1000, f"b{r}"), batches * 1000))
            for row, call, args, jobs in runs:
                bench.measure(table, row, name, partial(_rate, subject, target, call, args, jobs))
    if r < bench.repeat - 1:
        return
    pg, single = "enqueue (jobs/s), PostgreSQL", "1 job per transaction"
    for row, factor in (("1,000 jobs per statement", 1.2), (single, 1.5)):
        ok = lambda m, factor=factor: m >= factor
        bench.check_median(f"{row}: watchdog >= {factor:g}x pgqueuer", pg, row, "watchdog", ok, versus="pgqueuer")
    goal = "enqueue in the caller's Session + commit >= 1.0x pgqueuer's one-call enqueue"
    bench.check_median(goal, pg, SESSION_ROW, "watchdog", lambda m: m >= 1, versus="pgqueuer", versus_row=single)
    for label in (h.LABEL[dialect] for dialect in bench.dialects(h.QUEUE_DIALECTS)):
        goal = f"{label}: enqueue in a Session + commit within 1.3x of session.add(row) + commit"
        table = f"enqueue (jobs/s), {label}"
        bench.check_median(
            goal, table, PLAIN_ROW, "watchdog", lambda m: m <= 1.3, "x the time", "watchdog", SESSION_ROW
        )


@h.scenario("drain", per_repeat=True, suite=True, options="jobs concurrencies drain-rows")
def drain(bench: h.Bench, r: int) -> None:
    """Jobs/s of worker processes draining a prefilled queue (concurrency x processes, defaults, AsyncRunner)."""
    for dialect in bench.dialects(h.QUEUE_DIALECTS):
        pg = dialect == "postgresql"
        table = f"drain (jobs/s), {h.LABEL[dialect]}"
        bench.table(table, ratios="watchdog", chart="drain.png" if pg else None)
        # row, processes, options; watchdog_only: the AsyncRunner rows (the peers are asyncio already)
        shapes: list[tuple[str, int, dict[str, Any], bool]] = []
        sync_c, async_c = DRAIN_CONCURRENCIES[dialect]
        for procs in (1, 2):
            for c in bench.ints("concurrencies", sync_c):
                shapes.append((f"c{c} p{procs}", procs, {"concurrency": c}, False))
            if dialect != "sqlite":
                shapes.append((f"defaults p{procs}", procs, {"defaults": True}, False))
        for c in bench.ints("concurrencies", async_c) if async_c else []:
            shapes.append((f"async c{c} p1", 1, {"concurrency": c, "use_asyncio": True}, True))
        if wanted := set(bench.opt("drain_rows", "").split(",")) - {""}:
            shapes = [s for s in shapes if wanted & set(s[0].split())]
        for row, procs, options, watchdog_only in shapes:
            for name in (n for n in bench.in_order(r, dialect) if n == "watchdog" or not watchdog_only):
                if pg:
                    default = (QUICK_DRAIN_JOBS if bench.quick else DRAIN_JOBS)[name]
                else:
                    default = OTHER_DRAIN_JOBS[dialect][1 if bench.quick else 0]
                n, tag, target = bench.opt("jobs", default), f"{row.replace(' ', '-')}-{r}", bench.target(name, dialect)
                run = partial(bench.drain_once, name, target, n, tag, procs, **options)
                bench.measure(table, row, name, run, timeout=60 + n / 20 + 180)  # + worker start, warm-up and shutdown
    if r < bench.repeat - 1 or (rows := bench.tables.get("drain (jobs/s), PostgreSQL")) is None:
        return
    best = max(((bench.medians(rows.title, row).get("watchdog") or 0, row) for row in rows.cells), default=(0, ""))
    for peer, factor in (("pgqueuer", 4.0), ("procrastinate", 10.0)):
        base = max((bench.medians(rows.title, f"defaults p{p}").get(peer) or 0 for p in (1, 2)), default=0)
        measured = f"{best[0] / base if base else 0:.2f}x (watchdog best {best[0]:,.0f} jobs/s at {best[1]}; {peer} {base:,.0f})"
        if best[0] and base:
            bench.check(f"drain >= {factor:g}x {peer} with its defaults", measured, best[0] >= factor * base)
    for procs in (1, 2):
        goal = f"drain with defaults >= 1.5x pgqueuer's, {procs} process(es)"
        bench.check_median(goal, rows.title, f"defaults p{procs}", "watchdog", lambda m: m >= 1.5, versus="pgqueuer")


POLL_ROW = "the runner's poll_interval (ms)"


def _polled_latencies(
    bench: h.Bench, target: h.Target, tag: str, warmup: int, samples: int, polls: list[float]
) -> dict[str, float]:
    """:meth:`h.Bench.latencies` of watchdog's runner with its defaults where it polls (MariaDB): each
    pause a random 0.03 s to 0.03 s + its poll_interval, so jobs arrive at every phase of its poll (a
    fixed pause would meet it at the same phase each time); the percentiles (the poll_interval the
    runner said it uses: appended to ``polls``, in ms)."""
    h.Watchdog().reset(target)
    with bench.idle_worker("watchdog", target, tag) as (child, client):
        h.poll_until(lambda: child.wakeup is not None, timeout=30, interval=0.05, what="wake-ups", children=[child])
        assert child.wakeup is not None
        poll_s, how = child.wakeup
        if how.startswith("listen"):
            raise h.ScenarioFailed(f"expected a polling runner, got: {how}")
        bench.log(f"{target.dialect} runner wake-ups: {how}")
        polls.append(poll_s * 1000.0)
        pause = (0.03, 0.03 + poll_s)
        return h.percentiles(bench.start_latencies(child, client.enqueue, tag, warmup, samples, pause=pause))


@h.scenario("latency", per_repeat=True, suite=True, options="samples")
def latency(bench: h.Bench, r: int) -> None:
    """Enqueue-to-start ms (p50/p95/p99) of one idle worker with its defaults, PostgreSQL (and MariaDB: polling)."""
    samples, warmup = bench.opt("samples", 200, 20), (3 if bench.quick else 5)
    # PostgreSQL unless --dialects names MariaDB without it (SQLite has no rows here).
    for dialect in bench.dialects(("postgresql", "mariadb")) or ["postgresql"]:
        if dialect == "mariadb" and "watchdog" in bench.subjects:  # watchdog alone on MariaDB
            table = "enqueue-to-start latency (ms), MariaDB (runner polls)"
            bench.table(table, ratios="watchdog")
            target = bench.target("watchdog", dialect)
            polls: list[float] = []
            polled = partial(_polled_latencies, bench, target, f"lat-maria-{r}", warmup, samples, polls)
            bench.measure(table, "enqueue-to-start", "watchdog", polled)
            bench.record(table, POLL_ROW, "watchdog", polls[0] if polls else None)
        if dialect != "postgresql":
            continue
        table = "enqueue-to-start latency (ms), PostgreSQL"
        bench.table(table, ratios="watchdog", chart="latency.png")
        for name in bench.in_order(r):
            target = bench.target(name, "postgresql")
            once = lambda name=name, target=target: h.percentiles(
                bench.latencies(name, target, f"lat-{r}", warmup, samples)
            )
            bench.measure(table, "enqueue-to-start", name, once)
    if r == bench.repeat - 1 and "enqueue-to-start latency (ms), PostgreSQL" in bench.tables:
        goal, row = "median wake latency <= 5 ms", "enqueue-to-start p50 (ms)"
        table = "enqueue-to-start latency (ms), PostgreSQL"
        bench.check_median(goal, table, row, "watchdog", lambda m: m <= 5, " ms")


KEYS = 100  # job i of the keyed rows has key k<i mod KEYS>


class KeyedWatchdog(h.Watchdog):
    def __init__(self, keys: int = KEYS) -> None:
        super().__init__()
        self.keys = keys

    def jobs(self, tag: str, n: int) -> list[Any]:  # type: ignore[override]
        return [Job(f"{tag}-{i}", h.QUEUE, payload={"i": i}, key=f"k{i % self.keys}") for i in range(n)]


#: row -> (keyed jobs, set_limits keywords; None: no limits)
LIMITS: dict[str, tuple[bool, dict[str, Any] | None]] = {
    "unlimited": (False, None),
    "unlimited, keyed jobs": (True, None),
    "concurrency 16": (False, {"concurrency": 16}),
    "concurrency 1,000 (never reached)": (False, {"concurrency": 1000}),
    f"concurrency 16, 1 per key ({KEYS} keys)": (True, {"concurrency": 16, "concurrency_per_key": 1}),
}
PER_KEY_ROW = f"concurrency 16, 1 per key ({KEYS} keys)"


def _limited_queue(target: h.Target, subject: h.Watchdog, limits: Any) -> None:
    """The benchmark's queue emptied, under ``limits`` only (None: unlimited)."""
    subject.reset(target)
    with h.disposed(h.engine(target)) as eng:
        Watchdog(eng).clear_limits(h.QUEUE)
        if limits is not None:
            Watchdog(eng).set_limits(h.QUEUE, **limits)


def _limited_drain(bench: h.Bench, target: h.Target, n: int, tag: str, keyed: bool, limits: Any) -> float:
    """jobs/s of one worker process at concurrency 16 (:func:`h.drain_idle`) under ``limits``."""
    subject = KeyedWatchdog() if keyed else h.Watchdog()
    _limited_queue(target, subject, limits)
    with bench.workers("watchdog", target, tag, 1, concurrency=16) as children:
        return h.drain_idle(subject, target, n, tag, 1, children)


#: The claim-cost rows -> (keys of the jobs, 0 for none; set_limits keywords): LIMITS', a queue limit
#: over keyed jobs (the fair rotation without per-key limits), and the per-key row over many more keys.
MANY_KEYS = 10_000
CLAIM_ROWS: dict[str, tuple[int, dict[str, Any] | None]] = {
    **{row: (KEYS if keyed else 0, limited) for row, (keyed, limited) in LIMITS.items()},
    f"concurrency 16, keyed jobs ({KEYS} keys)": (KEYS, {"concurrency": 16}),  # the fair rotation alone
    f"concurrency 16, 1 per key ({MANY_KEYS:,} keys)": (MANY_KEYS, LIMITS[PER_KEY_ROW][1]),
}
CLAIM_BATCH = 16  # what a runner at concurrency 16 asks for when its slots are free


def _claim_cost(target: h.Target, n: int, tag: str, keys: int, limits: Any) -> float:
    """Median ms of one claim of up to :data:`CLAIM_BATCH` jobs as a runner's loop sends it (store-level,
    one held connection, autocommit on PostgreSQL), ``n`` jobs queued; each claim's jobs are then settled
    untimed, so the next claim finds the room they held free again. ``keys`` 0: unkeyed jobs."""
    subject = KeyedWatchdog(keys) if keys else h.Watchdog()
    _limited_queue(target, subject, limits)
    subject.prefill(target, n, tag)
    h.run_sql(target, "SELECT 1", analyse=True)  # as autovacuum keeps a table this size
    times: list[float] = []
    with h.disposed(h.engine(target)) as eng:
        gateway = SyncGateway(eng)
        with gateway.holding():
            while True:
                started = time.perf_counter()
                claimed = gateway.run(store.claim, queues=[h.QUEUE], limit=CLAIM_BATCH, lease_ms=60_000).claimed
                times.append(time.perf_counter() - started)
                if not claimed:
                    break
                done = [store.SettleRequest(c.job.job_id, c.token, Decision.completed()) for c in claimed]
                gateway.run(store.settle_many, done)
    if (claims := len(times) - 1) < -(-n // CLAIM_BATCH):
        raise h.ScenarioFailed(f"claim cost: {claims} claims drained {n} jobs")
    return statistics.median(times[5:-1] or times) * 1000  # the first five: psycopg prepares at the fifth


@h.scenario("limits", per_repeat=True, options="jobs")
def limits(bench: h.Bench, r: int) -> None:
    """Jobs/s of one worker process at concurrency 16 draining a limited queue, beside the same queue unlimited;
    and what one claim of 16 costs under each limit (store-level)."""
    for dialect in bench.dialects():
        pg = dialect == "postgresql"
        n = bench.opt("jobs", (2000 if pg else 300) if bench.quick else (10_000 if pg else 1000))
        target = bench.target("watchdog", dialect)
        for row, (keyed, limited) in LIMITS.items():
            run = partial(_limited_drain, bench, target, n, f"l{r}-{row.split()[0]}{len(row)}", keyed, limited)
            bench.measure(
                f"limits: drain at concurrency 16 (jobs/s), {h.LABEL[dialect]}", row, "watchdog", run, 120 + n / 20
            )
        table = f"limits: one claim of {CLAIM_BATCH} (ms), {h.LABEL[dialect]}"
        bench.table(table, ratios=None)
        for row, (keys, limited) in CLAIM_ROWS.items():
            run = partial(_claim_cost, target, n, f"c{r}-{row.split()[0]}{len(row)}", keys, limited)
            bench.measure(table, row, "watchdog", run, 120 + n / 20)
    if r < bench.repeat - 1:
        return
    for dialect in bench.dialects():
        table = f"limits: one claim of {CLAIM_BATCH} (ms), {h.LABEL[dialect]}"
        for row in list(CLAIM_ROWS)[2:]:
            goal = f"{h.LABEL[dialect]}: claim under '{row}' within 1.5x of unlimited"
            bench.check_median(goal, table, row, "watchdog", lambda m: m <= 1.5, "x", "watchdog", "unlimited")


@h.scenario("claim-ahead", per_repeat=True, options="jobs concurrencies handler-ms processes")
def claim_ahead(bench: h.Bench, r: int) -> None:
    """Jobs/s of --processes worker processes (default 1) sharing one queue, whose handlers sleep
    --handler-ms (default 0,1,2,5), each at --concurrencies, claiming ahead or not."""
    target = bench.target("watchdog", "postgresql")
    works = [float(w) for w in str(bench.opt("handler_ms", "0,1,2,5")).split(",")]
    for procs in bench.ints("processes", "1"):
        table = f"claim-ahead drain (jobs/s), PostgreSQL, {procs} worker process{'es' if procs > 1 else ''}"
        bench.table(table)
        for c in bench.ints("concurrencies", "1,4,16"):
            for work in works:
                # Each handler's sleep bounds the drain at procs * c * 1000 / work jobs/s: ~2 s of it.
                ceiling = procs * c * 1000.0 / work if work else 5000.0
                n = bench.opt("jobs", max(200, min(5000, int(ceiling * (0.4 if bench.quick else 2.0)))))
                for label, ahead in (("claim_ahead default", None), ("claim_ahead=0", 0)):
                    row = f"c{c} handler {work:g} ms"
                    tag = f"ahead-p{procs}-c{c}-w{work:g}-{ahead}-{r}"
                    options: dict[str, Any] = {"concurrency": c, "work_ms": work, "claim_ahead": ahead}
                    run = partial(bench.drain_once, "watchdog", target, n, tag, procs, **options)
                    bench.measure(table, row, label, run, timeout=60 + n / 20 + 180)
