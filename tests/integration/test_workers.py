"""Live workers and recorded schedules (revision w0009), on both dialects and
both runner kinds.

A serving runner registers in ``watchdog_workers``, refreshes its row with
its heartbeat (database clock), removes it on a clean shutdown; a row not
refreshed for three heartbeats and 30 seconds is gone, and pruned an hour
later. Runners record the schedules they serve; two deploys disagreeing
about a definition show as two disputed views. (A SIGKILLed worker showing
as gone, and a restarted one as new: tests/faults/test_workers_faults.py.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

import sqlalchemy_watchdog
from sqlalchemy_watchdog import Job, RunningJob, Schedule, Watchdog, WorkerView, store
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.store import WORKER_GONE_MARGIN_MS, WORKER_KEEP_GONE_MS, WorkerRegistration
from tests.helpers import add, settled, wait_until
from tests.runner_kinds import RunnerDriver


def _workers(engine: Engine) -> list[WorkerView]:
    return Watchdog(engine).workers()


def test_a_serving_runner_is_listed_while_it_serves_and_removed_on_clean_shutdown(
    engine: Engine, runners: RunnerDriver
) -> None:
    worker = runners.runner({"q": lambda job: None, "r": lambda job: None}, concurrency=3)
    assert _workers(engine) == []
    with worker.serving():
        [row] = wait_until(lambda: _workers(engine), what="the worker's row")
        assert (row.host, row.pid) == (socket.gethostname()[:255], os.getpid())
        assert (row.queues, row.concurrency, row.running) == (("q", "r"), 3, 0)
        assert row.claim_ahead == 4 * 3  # the default: up to four jobs ahead per slot
        assert row.version == sqlalchemy_watchdog.__version__
        assert row.wakeups == str(worker.runner.wakeup_status)
        assert row.heartbeat == timedelta(seconds=10)
        assert row.started_at <= row.last_seen and not row.gone
        assert row.gone_after == timedelta(seconds=3 * 10 + 30)
        add(engine, Job("a", "q"))
        assert settled(engine, "a").outcome is not None
    assert _workers(engine) == []  # a clean shutdown removes the row


def test_the_heartbeat_refreshes_last_seen_and_the_jobs_running_now(engine: Engine, runners: RunnerDriver) -> None:
    release = threading.Event()

    def hold(job: RunningJob) -> None:
        release.wait(20)

    worker = runners.runner({"q": hold}, lease=timedelta(seconds=1.5), heartbeat=timedelta(seconds=0.3))
    add(engine, Job("held", "q"))
    try:
        with worker.serving():
            [first] = wait_until(lambda: _workers(engine), what="the worker's row")
            busy = wait_until(
                lambda: [w for w in _workers(engine) if w.running == 1 and w.last_seen > first.last_seen],
                what="a heartbeat refreshing the row with the held job",
            )
            assert busy[0].worker_id == first.worker_id and busy[0].started_at == first.started_at
            release.set()
            wait_until(lambda: [w for w in _workers(engine) if w.running == 0], what="the job done")
    finally:
        release.set()


@pytest.mark.parametrize(
    ("options", "ahead"), [({"claim_ahead": 0}, 0), ({"claim_ahead": 7}, 7)], ids=["none", "seven"]
)
def test_a_worker_says_how_many_jobs_it_may_claim_beyond_its_concurrency(
    engine: Engine, runners: RunnerDriver, options: dict[str, Any], ahead: int
) -> None:
    worker = runners.runner({"q": lambda job: None}, concurrency=2, **options)
    with worker.serving():
        [row] = wait_until(lambda: _workers(engine), what="the worker's row")
        assert (row.concurrency, row.claim_ahead) == (2, ahead)


def test_a_process_executor_worker_says_its_prefetch_as_its_claim_ahead(engine: Engine) -> None:
    from sqlalchemy_watchdog import ProcessExecutor, Runner
    from tests import process_handlers

    runner = Runner(engine, {"q": process_handlers.done}, executor=ProcessExecutor(processes=1, prefetch=3))
    with runner.running():
        [row] = wait_until(lambda: _workers(engine), what="the worker's row")
        assert (row.concurrency, row.claim_ahead) == (1, 3)
    assert _workers(engine) == []


def test_a_worker_says_which_of_its_queues_run_in_child_processes(engine: Engine, runners: RunnerDriver) -> None:
    """One runner serving a thread queue and a queue whose handler names the
    process executor: its row says which runs where, and its concurrency and
    claim ahead are both executors' (threads 2 + one per CPU, the claim
    ahead of threads capped at 4 x 2 + the children's prefetch)."""
    from tests import process_handlers

    worker = runners.runner({"io": lambda job: None, "crunch": process_handlers.crunch}, concurrency=2)
    settings = worker.runner.settings
    with worker.serving():
        [row] = wait_until(lambda: _workers(engine), what="the worker's row")
        assert row.queues == ("io", "crunch") and row.process_queues == ("crunch",)
        assert row.executors == {"io": "thread", "crunch": "process"}
        children = settings.slot_groups[1].concurrency
        assert (row.concurrency, row.claim_ahead) == (2 + children, 4 * 2 + children)
    assert _workers(engine) == []


def test_each_runner_object_is_a_worker_of_its_own(engine: Engine, runners: RunnerDriver) -> None:
    first = runners.runner({"q": lambda job: None})
    second = runners.runner({"q": lambda job: None})
    with first.serving(), second.serving():
        rows = wait_until(lambda: (lambda found: found if len(found) == 2 else [])(_workers(engine)), what="two rows")
        assert len({w.worker_id for w in rows}) == 2
    assert _workers(engine) == []


def _register(engine: Engine, worker_id: str, *, queues: tuple[str, ...] = ("q",), heartbeat_ms: int = 10_000) -> None:
    registration = WorkerRegistration(worker_id, "host-1", 7, queues, 2, "poll", "0.1.0", heartbeat_ms)
    with engine.begin() as conn:
        store.register_worker(conn, registration)


def _silent_for(engine: Engine, worker_id: str, ms: int) -> None:
    """Make the worker's last heartbeat ``ms`` ago (its start before that)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE watchdog_workers SET last_seen = last_seen - :ms, started_at = started_at - :ms"
                " WHERE worker_id = :id"
            ),
            {"ms": ms, "id": worker_id},
        )


def test_a_worker_silent_for_three_heartbeats_and_the_margin_is_gone_judged_by_its_own_heartbeat(
    engine: Engine,
) -> None:
    """The bound is per worker: a runner with a one-minute heartbeat silent
    for two minutes is alive; one with a ten-second heartbeat is gone."""
    _register(engine, "fast", heartbeat_ms=10_000)
    _register(engine, "slow", heartbeat_ms=60_000)
    _register(engine, "fresh", heartbeat_ms=10_000)
    _silent_for(engine, "fast", 3 * 10_000 + WORKER_GONE_MARGIN_MS + 5_000)
    _silent_for(engine, "slow", 120_000)
    gone = {w.worker_id: w.gone for w in _workers(engine)}
    assert gone == {"fast": True, "slow": False, "fresh": False}


def test_stats_count_live_workers_per_queue_and_flag_ready_jobs_without_one(engine: Engine) -> None:
    _register(engine, "w-1", queues=("q", "both"))
    _register(engine, "w-2", queues=("both",))
    _register(engine, "dead", queues=("q", "orphan"))
    _silent_for(engine, "dead", 10 * 60_000)
    add(engine, Job("q-1", "q"), Job("b-1", "both"), Job("o-1", "orphan"), Job("later", "idle", run_at=None))
    stats = Watchdog(engine).stats()
    assert {q.queue: q.workers for q in stats.queues} == {"q": 1, "both": 2, "orphan": 0, "idle": 0}
    assert [q.queue for q in stats.queues if q.unserved] == ["idle", "orphan"]


def test_registering_refreshing_and_pruning_workers_never_touch_a_job(engine: Engine) -> None:
    """Pruning deletes only workers gone for over an hour (a bounded batch),
    and recorded schedules not seen for a week; the jobs stay as they are."""
    add(engine, Job("a", "q"), Job("b", "q"))
    with engine.connect() as conn:
        jobs_before = conn.execute(select(jobs_table).order_by(jobs_table.c.sequence)).all()
    _register(engine, "alive")
    _register(engine, "recently-gone")
    _register(engine, "long-gone")
    _silent_for(engine, "recently-gone", 5 * 60_000)
    _silent_for(engine, "long-gone", 3 * 10_000 + WORKER_GONE_MARGIN_MS + WORKER_KEEP_GONE_MS + 1_000)
    _register(engine, "alive")  # a refresh
    with engine.begin() as conn:
        assert store.prune_workers(conn) == 1
        assert store.prune_workers(conn) == 0
    assert sorted(w.worker_id for w in _workers(engine)) == ["alive", "recently-gone"]
    with engine.connect() as conn:
        assert conn.execute(select(jobs_table).order_by(jobs_table.c.sequence)).all() == jobs_before


def test_a_refresh_brings_back_a_row_pruned_while_its_worker_was_frozen(engine: Engine) -> None:
    _register(engine, "frozen")
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM watchdog_workers"))
    _register(engine, "frozen")
    assert [w.worker_id for w in _workers(engine)] == ["frozen"]


def test_a_worker_row_is_cut_to_the_columns_bounds_never_refused(engine: Engine) -> None:
    registration = WorkerRegistration("w", "h" * 1000, 1, tuple(f"{i:0>250}" for i in range(400)), 1, "x", "v", 1)
    with engine.begin() as conn:
        store.register_worker(conn, registration)
    [row] = _workers(engine)
    assert len(row.host) == 255 and 0 < len(row.queues) < 400  # the queues that fit, in order
    assert row.queues == registration.queues[: len(row.queues)]


# -- schedules ---------------------------------------------------------------------------


def test_runners_record_the_schedules_they_serve_and_two_deploys_disagreeing_show_as_disputed(
    engine: Engine, runners: RunnerDriver
) -> None:
    hourly = Schedule("report", "0 * * * *", "periodic", timezone="Europe/Paris")
    redeployed = Schedule("report", "30 * * * *", "periodic", timezone="Europe/Paris")
    nightly = Schedule("nightly", "0 3 * * *", "periodic")
    old = runners.runner({"periodic": lambda job: None}, schedules=[hourly, nightly])
    before = datetime.now(UTC)
    old.run_until_idle()
    views = Watchdog(engine).schedules()
    assert [(v.name, v.cron, v.timezone, v.queue, v.current, v.disputed) for v in views] == [
        ("nightly", "0 3 * * *", "UTC", "periodic", True, False),
        ("report", "0 * * * *", "Europe/Paris", "periodic", True, False),
    ]
    report = views[1]
    assert report.next_slot == hourly.next_slot(before)
    assert report.last_enqueued == hourly.slots(before - timedelta(hours=1), 1)[0]
    assert report.recorded_by == old.runner.core.worker_id

    new = runners.runner({"periodic": lambda job: None}, schedules=[redeployed])
    new.run_until_idle()
    reports = [v for v in Watchdog(engine).schedules() if v.name == "report"]
    assert sorted(v.cron for v in reports) == ["0 * * * *", "30 * * * *"]
    assert all(v.current and v.disputed for v in reports)
    assert len({v.fingerprint for v in reports}) == 2


def test_a_recorded_schedule_not_seen_recently_is_no_longer_current_nor_disputed(engine: Engine) -> None:
    rows = [
        store.ScheduleRecord("s", "f-old", "0 * * * *", "UTC", "q", None, None),
        store.ScheduleRecord("s", "f-new", "5 * * * *", "UTC", "q", None, None),
    ]
    with engine.begin() as conn:
        store.record_schedules(conn, rows, "w-1")
        conn.execute(text("UPDATE watchdog_schedules SET last_seen = last_seen - 3600000 WHERE fingerprint = 'f-old'"))
    views = {v.fingerprint: (v.current, v.disputed) for v in Watchdog(engine).schedules()}
    assert views == {"f-new": (True, False), "f-old": (False, False)}


def test_the_latest_slot_enqueued_never_moves_back(engine: Engine) -> None:
    def record(last: int | None) -> None:
        with engine.begin() as conn:
            store.record_schedules(conn, [store.ScheduleRecord("s", "f", "* * * * *", "UTC", "q", 9, last)], "w")

    record(5_000)
    record(None)
    record(4_000)
    [view] = Watchdog(engine).schedules()
    assert view.last_enqueued == datetime.fromtimestamp(5, UTC)


def test_async_watchdog_reads_workers_and_schedules(engine: Engine) -> None:
    from sqlalchemy_watchdog.asyncio import AsyncWatchdog
    from tests.conftest import make_async_engine

    _register(engine, "w-1")
    with engine.begin() as conn:
        store.record_schedules(conn, [store.ScheduleRecord("s", "f", "* * * * *", "UTC", "q", None, None)], "w-1")

    async def read() -> tuple[Any, Any]:
        async_engine = make_async_engine(engine)
        try:
            watchdog = AsyncWatchdog(async_engine)
            return await watchdog.workers(), await watchdog.schedules()
        finally:
            await async_engine.dispose()

    workers, schedules = asyncio.run(read())
    assert [w.worker_id for w in workers] == ["w-1"] and workers[0].queues == ("q",)
    assert [(s.name, s.recorded_by) for s in schedules] == [("s", "w-1")]


@pytest.mark.parametrize("missing", ["table", "claim_ahead"])
def test_a_runner_that_cannot_register_serves_on_and_a_heartbeat_registers_it_later(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture, missing: str
) -> None:
    """A database not upgraded yet -- without the workers table (w0009), or
    with the table but not its ``claim_ahead`` column (w0017): the runner
    logs one WARNING, serves its jobs, and registers with the first
    heartbeat after the upgrade."""
    from sqlalchemy import MetaData, Table

    from sqlalchemy_watchdog.model import workers_table

    workers_table.drop(engine)
    before_w0017 = Table(
        workers_table.name, MetaData(), *(c._copy() for c in workers_table.columns if c.name != "claim_ahead")
    )
    if missing == "claim_ahead":
        before_w0017.create(engine)
    caplog.set_level(logging.INFO, logger="sqlalchemy_watchdog")
    worker = runners.runner(
        {"q": lambda job: None}, lease=timedelta(seconds=1.5), heartbeat=timedelta(seconds=0.3), claim_ahead=5
    )
    with worker.serving():
        add(engine, Job("a", "q"))
        assert settled(engine, "a").outcome is not None
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("could not register as worker" in m for m in warnings), warnings
        if missing == "claim_ahead":  # what revision w0017 adds
            with engine.begin() as conn:
                conn.execute(text("ALTER TABLE watchdog_workers ADD COLUMN claim_ahead INTEGER DEFAULT 0 NOT NULL"))
        else:
            workers_table.create(engine)
        [row] = wait_until(lambda: _workers(engine), what="a heartbeat registering the runner")
        assert (row.worker_id, row.claim_ahead) == (worker.runner.core.worker_id, 5)
    assert _workers(engine) == []
    if missing == "claim_ahead":  # as the model makes it, for the tests after this one
        before_w0017.drop(engine)
        workers_table.create(engine)
