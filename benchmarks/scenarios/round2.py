"""The second round's scenarios (issue 13): enqueue inside an open transaction, many
producers at once, a runner in the enqueueing process, scale-out, and a large table."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Text, event, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from benchmarks import harness as h
from sqlalchemy_watchdog import Decision, Job, Runner, Watchdog, enqueue, store


class Base(DeclarativeBase):
    pass


class Order(Base):  # an application row about as wide as a job's
    __tablename__ = "bench_orders"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    reference: Mapped[str] = mapped_column(Text, unique=True)
    kind: Mapped[str] = mapped_column(Text)
    customer: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(BigInteger)
    payload: Mapped[str] = mapped_column(Text)


@h.scenario("txn", per_repeat=True, suite=True, options="samples")
def txn(bench: h.Bench, r: int) -> None:
    """Microseconds and round trips enqueue(session, ...) adds to an open transaction, beside session.add + flush."""
    target, samples = bench.target("watchdog", "postgresql"), bench.opt("samples", 300, 50)
    bench.measure("in an open transaction, PostgreSQL, watchdog", "", "watchdog", lambda: _txn_cost(target, samples))


def _txn_cost(target: h.Target, samples: int, warmup: int = 20) -> dict[str, float]:
    """Each way of adding 1 or 100 rows to an open transaction: p50/p99 us and round trips, counted
    in the warm-up rounds only (why: README.md, the ``txn`` row)."""
    h.truncate(target)
    sent, payload = list[int](), {"note": "x" * 40}
    same = {"kind": h.QUEUE, "priority": 0, "payload": json.dumps(payload)}

    def make(kind: str, n: int, tag: str) -> list[Any]:
        if kind == "enqueue":
            return [Job(f"{tag}-{i}", h.QUEUE, lane=f"customer-{i}", payload=payload) for i in range(n)]
        return [Order(reference=f"{tag}-{i}", customer=f"customer-{i}", **same) for i in range(n)]

    kinds = [(kind, n) for n in (1, 100) for kind in ("enqueue", "session.add")]
    times: dict[tuple[str, int], list[float]] = {k: [] for k in kinds}
    trips: dict[tuple[str, int], list[int]] = {k: [] for k in kinds}
    with h.disposed(h.engine(target)) as eng:
        Base.metadata.create_all(eng)
        count = lambda *args: sent.append(1)
        event.listen(eng, "before_cursor_execute", count)
        for i in range(warmup + samples):
            if i == warmup:
                event.remove(eng, "before_cursor_execute", count)
            for kind, n in h.rotate(kinds, i):
                rows = make(kind, n, f"t{i}-{kind[:3]}")  # built before the clock starts
                with Session(eng) as session:
                    session.execute(text("SELECT 1"))  # the caller's transaction is open
                    sent.clear()
                    started = time.perf_counter_ns()
                    if kind == "enqueue":
                        enqueue(session, rows[0] if n == 1 else rows)
                    else:
                        session.add_all(rows)
                        session.flush()
                    elapsed, statements = time.perf_counter_ns() - started, len(sent)
                    session.rollback()
                if i >= warmup:
                    times[(kind, n)].append(elapsed / 1000)
                else:
                    trips[(kind, n)].append(statements)
    out: dict[str, float] = {}
    for kind, n in kinds:
        out |= h.percentiles(times[(kind, n)], (50, 99), f"{kind} {n} row(s) p{{}} (us)")
        out[f"{kind} {n} row(s) round trips"] = statistics.median(trips[(kind, n)])
    return out


def producer_role(subject: str, target: h.Target, jobs: int, prefix: str, go: str) -> None:
    """Wait for the go file, then enqueue ``jobs`` jobs one per transaction; RESULT [start, end]."""
    h.say("READY")
    while not Path(go).exists():
        time.sleep(0.001)
    elapsed = h.SUBJECTS[subject]().enqueue_single(target, jobs, f"{prefix}-{os.getpid()}")
    h.say("RESULT", [time.time() - elapsed, time.time()])


def _trigger(target: h.Target, *, enabled: bool = True, notify_always: bool = False) -> None:
    """The NOTIFY trigger on or off; ``notify_always``: the trigger function of before revision w0007
    (a NOTIFY on every enqueue: the revision's downgrade SQL)."""
    from sqlalchemy_watchdog.migrations.versions import w0007_notify_when_waiting as w0007

    h.run_sql(target, f"ALTER TABLE watchdog_jobs {'ENABLE' if enabled else 'DISABLE'} TRIGGER watchdog_jobs_queued")
    h.run_sql(target, w0007.NOTIFY_ALWAYS_SQL if notify_always else w0007.NOTIFY_WHEN_WAITING_SQL)


def _produce(bench: h.Bench, name: str, jobs: int, tag: str, runner: bool = False, **trigger: bool) -> float:
    """16 producer processes enqueueing at once (``runner``: a worker with its defaults beside; ``trigger``:
    :func:`_trigger` meanwhile): jobs/s from the first start to the last end."""
    target, go = bench.target(name, "postgresql"), bench.workdir / f"{tag}.go"
    bench.subjects[name].reset(target)
    try:
        if trigger:
            _trigger(target, **trigger)
        runners = bench.workers(name, target, tag, int(runner), defaults=True)  # a runner beside, or none
        producers = bench.spawn(tag, 16, producer_role, subject=name, target=target, jobs=jobs, prefix=tag, go=str(go))
        with runners, producers as procs:
            go.touch()
            windows = [proc.result(600) for proc in procs]
    finally:
        if trigger:
            _trigger(target)
    if (stored := h.run_sql(target, f"SELECT count(*) FROM {bench.subjects[name].table}")) < 16 * jobs:
        raise h.ScenarioFailed(f"producers: {stored} of {16 * jobs} jobs stored")
    return 16 * jobs / (max(w[1] for w in windows) - min(w[0] for w in windows))


#: watchdog's own producer rows: row -> (a worker with its defaults draining meanwhile, :func:`_trigger` keywords)
TRIGGER_ROWS: dict[str, tuple[bool, dict[str, bool]]] = {
    "watchdog, NOTIFY trigger disabled": (False, {"enabled": False}),
    "watchdog, the trigger before w0007 (NOTIFY on every enqueue)": (False, {"notify_always": True}),
    "watchdog, a runner draining meanwhile (its defaults)": (True, {}),
    "watchdog, a runner draining meanwhile, the trigger before w0007": (True, {"notify_always": True}),
}


@h.scenario("producers", per_repeat=True, suite=True)
def producers(bench: h.Bench, r: int) -> None:
    """Jobs/s of 16 processes enqueueing one job per transaction at once."""
    table = "16 producer processes, 1 job per transaction (jobs/s), PostgreSQL"
    bench.table(table, ratios="watchdog")
    jobs = {"watchdog": 300, "procrastinate": 150, "pgqueuer": 300}
    cells: list[tuple[str, str, str, bool, dict[str, bool]]]  # subject, row, tag, runner, trigger
    cells = [(name, "every queue, its defaults", f"prod-{name}-{r}", False, {}) for name in bench.in_order(r)]
    if "watchdog" in bench.subjects:
        cells += [("watchdog", row, f"prod-{len(row)}-{r}", *rest) for row, rest in TRIGGER_ROWS.items()]
    for name, row, tag, runner, trigger in cells:
        run = partial(_produce, bench, name, jobs[name] // (6 if bench.quick else 1), tag, runner, **trigger)
        bench.measure(table, row, name, run, 900)


def inprocess_role(target: h.Target, concurrency: int | None, jobs: int, use_asyncio: bool) -> None:
    """The in-process drain (README.md, the ``inprocess`` row); ``concurrency`` None: the runner's
    defaults (its engine too: the application's own)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from sqlalchemy_watchdog.asyncio import AsyncRunner

    options = {} if concurrency is None else {"concurrency": concurrency}
    if use_asyncio:
        runner: Any = AsyncRunner(create_async_engine(target.url), {h.QUEUE: h.anoop}, **options)
    else:
        pool = {} if concurrency is None else {"pool_size": concurrency + 3}
        runner = Runner(h.engine(target, **pool), {h.QUEUE: lambda job: None}, **options)
    h.say("RESULT", h.drain_here(target, runner, jobs, prefill=False))


def pgqueuer_inprocess_role(target: h.Target, jobs: int) -> None:
    """pgqueuer with its defaults in this process, on the main thread (its ``run`` installs signal
    handlers), and the application's part of :func:`inprocess_role` on a second (README.md, ``inprocess``)."""
    peer = h.PgQueuer()

    def application() -> None:
        try:
            h.say("RESULT", h.drain_idle(peer, target, jobs, "drain", 2))
        except BaseException as error:  # reported as the role's failure
            h.say("ERROR", repr(error))
        finally:
            os._exit(0)

    threading.Thread(target=application, daemon=True).start()
    peer.worker_main(target, defaults=True)


def _in_child(bench: h.Bench, log: str, role: Any, target: h.Target, jobs: int, **kwargs: Any) -> float:
    """The ``RESULT`` of ``role`` in a child process, on an emptied queue of ``target``."""
    h.truncate(target)
    return float(h.Child(bench.workdir / f"inprocess-{log}.log", role, target=target, jobs=jobs, **kwargs).result(600))


@h.scenario("inprocess", per_repeat=True, suite=True, options="jobs")
def inprocess(bench: h.Bench, r: int) -> None:
    """Jobs/s of a Runner / AsyncRunner draining in the enqueueing process vs in a process of its own."""
    target, jobs = bench.target("watchdog", "postgresql"), bench.opt("jobs", 20_000, 300)
    table = "drain, runner in-process vs a process of its own (jobs/s), PostgreSQL"
    bench.table(table, chart="inprocess.png")
    for use_asyncio in (False, True):
        options = {"concurrency": 4, "use_asyncio": use_asyncio}
        inside = partial(_in_child, bench, f"{use_asyncio}-{r}", inprocess_role, target, jobs, **options)
        separate = partial(bench.drain_once, "watchdog", target, jobs, f"separate-{r}", **options)
        for column, fn in h.rotate([("in-process", inside), ("separate process", separate)], r):
            bench.measure(table, f"{'AsyncRunner' if use_asyncio else 'Runner'}, concurrency 4", column, fn, 600)
    # Each queue with its defaults in the application's process, pgqueuer in-process beside.
    table, row = "drain with defaults, in the application's process (jobs/s), PostgreSQL", "defaults, in-process"
    cells = []
    for a in (False, True):
        run = partial(
            _in_child, bench, f"defaults-{a}-{r}", inprocess_role, target, jobs, concurrency=None, use_asyncio=a
        )
        cells.append((f"watchdog {'AsyncRunner' if a else 'Runner'}", run))
    if "pgqueuer" in bench.subjects:
        peer = bench.target("pgqueuer", "postgresql")
        cells.append(("pgqueuer", partial(_in_child, bench, f"pgqueuer-{r}", pgqueuer_inprocess_role, peer, jobs)))
    for column, fn in h.rotate(cells, r):
        bench.measure(table, row, column, fn, 600)
    if r == bench.repeat - 1 and "pgqueuer" in bench.subjects:
        for column in ("watchdog Runner", "watchdog AsyncRunner"):
            goal = f"in-process drain with defaults >= 1.5x pgqueuer's in-process ({column})"
            bench.check_median(goal, table, row, column, lambda m: m >= 1.5, versus="pgqueuer")


@h.scenario("scaleout", per_repeat=True, suite=True, options="jobs processes")
def scaleout(bench: h.Bench, r: int) -> None:
    """Jobs/s of 1, 2, 4, 8 runner processes (concurrency 4 each) draining one queue."""
    target, jobs = bench.target("watchdog", "postgresql"), bench.opt("jobs", 5000, 600)
    table = "scale-out, runner processes at concurrency 4 (jobs/s), PostgreSQL"
    bench.table(table, chart="scaleout.png")
    for procs in bench.ints("processes", "1,2,4,8"):
        drain = partial(bench.drain_once, "watchdog", target, jobs, f"scaleout-{procs}-{r}", procs, concurrency=4)
        bench.measure(table, f"{procs} process(es)", "watchdog", drain, 900)


SCALE_BIG_LANE, CLOCK = 10_000, h.CLOCK_SQL["postgresql"]


def _rows(prefix: str, state: str = "settled", at: str | None = None, **columns: str) -> dict[str, str]:
    """Jobs ``<prefix>-n`` spread over 1,000 queues and 10,000 lanes (see ``h.job_rows``)."""
    spread = {"queue_name": "'scale-' || mod(n, 1000)", "lane": "'lane-' || mod(n, 10000)", "payload_json": "'{}'"}
    return h.job_rows(prefix, state, at, **spread, **columns)


def build_scale(target: h.Target, settled: int) -> None:
    """The scale table of ``settled`` settled jobs (what it holds: README.md, the ``scale`` row)."""
    h.install_watchdog(target, fresh=True)
    old = f"{CLOCK} - 2 * {h.DAY_MS} - (:rows - n) * CAST(:step AS BIGINT)"
    old_rows = _rows("old", at=old, outcome=h.FAILED_1_IN_20)
    h.insert_jobs(target, settled, old_rows, analyse=False, step=30 * h.DAY_MS // settled)
    h.insert_jobs(target, 3600, _rows("recent", at=f"{CLOCK} - n * 1000"), analyse=False)
    later = f"{CLOCK} + {h.DAY_MS} + n * 100"
    delayed = _rows("later", "delayed", run_at=later, ready_at=later, enqueued_at=CLOCK)
    h.insert_jobs(target, settled, delayed, analyse=False)
    queued = _rows("ready", "queued", enqueued_at=f"{CLOCK} - (:rows - n)")
    h.insert_jobs(target, max(2000, settled // 10), queued, analyse=False)
    big = {**queued, "job_id": "'big-' || n", "queue_name": "'scale-big'", "lane": "'big-lane'", "enqueued_at": CLOCK}
    h.insert_jobs(target, SCALE_BIG_LANE, big)


def measure_scale(target: h.Target, calls: int, prune_limit: int) -> dict[str, float]:
    """ms per operation on the scale table (median of ``calls``)."""
    with h.disposed(h.engine(target)) as eng:
        client, out, claimed = Watchdog(eng), {}, []
        ms = lambda call, n=calls: statistics.median(h.time_calls(call, n, 2))

        def claim(queue: str) -> None:
            with eng.begin() as conn:
                claimed.extend(store.claim(conn, queues=[queue], limit=1, lease_ms=60_000).claimed)

        def settle() -> None:
            one = claimed.pop()
            with eng.begin() as conn:
                store.settle(conn, job_id=one.job.job_id, claim_token=one.token, decision=Decision.completed())

        out["claim"] = ms(partial(claim, "scale-7"))
        out["claim, 10,000-job backlog"] = ms(partial(claim, "scale-big"))
        out["settle"] = ms(settle, min(calls, len(claimed) - 2))
        out["stats()"] = ms(client.stats)
        out["list_jobs(limit=100)"] = ms(lambda: client.list_jobs(limit=100))
        out["list_jobs(state=queued, limit=100)"] = ms(lambda: client.list_jobs(state="queued", limit=100))
        live = h.run_sql(target, "SELECT count(*) FROM watchdog_jobs WHERE lane = 'big-lane' AND state != 'settled'")
        started, total, more = time.perf_counter(), 0, True
        while more:  # one call settles a batch; a caller repeats until no live job is left
            failed = client.fail_lane("big-lane", "scale benchmark")
            total, more = total + failed.settled, failed.more
        out[f"fail_lane, {SCALE_BIG_LANE:,}-job lane"] = (time.perf_counter() - started) * 1000
        if total != live:
            raise h.ScenarioFailed(f"fail_lane settled {total} of {live}")
        started = time.perf_counter()
        if (deleted := client.prune(older_than=timedelta(days=1), limit=prune_limit)) != prune_limit:
            raise h.ScenarioFailed(f"prune deleted {deleted} of {prune_limit}")
        out["prune, per 1,000 old jobs"] = (time.perf_counter() - started) * 1000 / (prune_limit / 1000)
    return {f"{k} (ms)": v for k, v in out.items()}


@h.scenario("scale", suite=True, options="rows")
def scale(bench: h.Bench) -> None:
    """Milliseconds per operation on a large table (settled, scheduled, queued) vs one with 1% of its history."""
    settled = bench.opt("rows", 1_000_000, 20_000)
    table = f"scale, PostgreSQL, watchdog ({settled:,} settled and scheduled, {max(2000, settled // 10):,} queued)"
    prune_limit = max(100, min(10_000, settled // 200))  # the same number pruned in both: half the small one's history
    for label, rows in (("full", settled), ("1% of the history", max(1, settled // 100))):
        with bench.database("postgresql", f"scale_{rows}", install=False) as target:
            for _ in range(bench.repeat):
                started = time.perf_counter()
                build_scale(target, rows)
                bench.log(f"scale table ({label}) built in {time.perf_counter() - started:.0f}s")
                run = partial(measure_scale, target, 20 - 15 * bench.quick, prune_limit)
                bench.measure(table, "", label, run, 1800)
