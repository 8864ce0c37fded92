"""Workers killed for real: a SIGKILLed worker stops refreshing its row and
shows as gone once its bound has passed; its jobs are recovered as always;
a restarted worker is a new one.

Real ``tests/faults/chaos_worker.py`` processes (``Runner`` and, with
``runner_kind`` async, ``AsyncRunner``) on both dialects. The gone bound is
three heartbeats and 30 seconds; rather than sleep half a minute, the test
reads the workers through an engine whose database clock it sets
(``controlled_db_clock``): the row's ``last_seen`` is what the dead process
last wrote by the real clock, and the library decides goneness in its
statement.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, Watchdog, WorkerView
from tests.faults.helpers import (
    WorkerPool,
    assert_settled_exactly_once,
    audit_rows,
    controlled_db_clock,
    enqueue_jobs,
    jobs_by_id,
    wait_until,
)

LEASE = 3.0
HEARTBEAT = 0.5
TIMING = {"lease": LEASE, "heartbeat": HEARTBEAT, "poll": 0.2}


def _by_pid(engine: Engine, pid: int) -> WorkerView | None:
    return next((w for w in Watchdog(engine).workers() if w.pid == pid), None)


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


def test_a_sigkilled_worker_shows_as_gone_its_job_is_recovered_and_a_restart_is_a_new_worker(
    instrumented: Engine, db_url: URL, workers: WorkerPool, runner_kind: str
) -> None:
    engine = instrumented
    enqueue_jobs(engine, [Job("victim", "chaos", payload={"action": "block", "only_first": 1}, max_recoveries=1)])
    w1 = workers.start(db_url, "w1", concurrency=2, **TIMING, asyncio=runner_kind == "async")
    wait_until(lambda: audit_rows(engine, "victim"), timeout=60, what="the victim's handler to start")
    busy = wait_until(
        lambda: (lambda row: row if row is not None and row.running == 1 else None)(_by_pid(engine, w1.pid)),
        timeout=30,
        what="w1's row showing its running job",
    )
    assert not busy.gone and busy.queues == ("chaos",) and busy.heartbeat == timedelta(seconds=HEARTBEAT)

    w1.kill()
    assert w1.proc.returncode == -signal.SIGKILL
    dead = _by_pid(engine, w1.pid)
    assert dead is not None
    time.sleep(4 * HEARTBEAT)  # heartbeats a live worker would have sent
    frozen = _by_pid(engine, w1.pid)
    assert frozen is not None and frozen.last_seen == dead.last_seen, "a dead worker's row was refreshed"
    assert frozen.running == 1  # as it was when it died: nothing lies about it

    last_seen_ms = int(dead.last_seen.timestamp() * 1000)
    bound_ms = _ms(dead.gone_after)
    assert bound_ms == 3 * _ms(timedelta(seconds=HEARTBEAT)) + 30_000
    with controlled_db_clock(db_url, last_seen_ms + bound_ms) as (clocked, set_clock):
        assert _by_pid(clocked, w1.pid).gone is False  # type: ignore[union-attr]  # exactly at the bound: not yet
        set_clock(last_seen_ms + bound_ms + 1)
        gone = _by_pid(clocked, w1.pid)
        assert gone is not None and gone.gone and gone.silent_for > gone.gone_after
        stats = Watchdog(clocked).stats().queue("chaos")
        assert stats.workers == 0

    # The same host restarts its worker: a new worker, and the job is recovered as always.
    w2 = workers.start(db_url, "w2", concurrency=2, **TIMING, asyncio=runner_kind == "async")
    fresh = wait_until(lambda: _by_pid(engine, w2.pid), timeout=60, what="w2's row")
    assert fresh.worker_id != dead.worker_id and fresh.started_at > dead.started_at and not fresh.gone
    wait_until(lambda: jobs_by_id(engine)["victim"]["state"] == "settled", timeout=60, what="the victim recovered")
    rows = assert_settled_exactly_once(engine, ["victim"])
    assert rows["victim"]["outcome"] == "completed" and rows["victim"]["recovery_count"] == 1
    assert [r["pid"] for r in audit_rows(engine, "victim")] == [w1.pid, w2.pid]
    assert Watchdog(engine).stats().queue("chaos").workers >= 1  # w2 (w1 still within its bound by the real clock)

    w2.send(signal.SIGTERM)
    assert w2.wait(60) == 0
    assert _by_pid(engine, w2.pid) is None  # a clean shutdown removes its row; the dead one's stays until pruned
    assert _by_pid(engine, w1.pid) is not None
