"""Jobs claimed ahead of a worker's free slots, when the worker is SIGKILLed.

A runner with short handlers claims jobs beyond its ``concurrency``; they wait
in the runner for a slot, under a lease the heartbeat renews
(sqlalchemy_watchdog/core/ahead.py). The database cannot tell them from
running jobs, so a worker killed while they wait leaves them to recovery like
its running job: with a recovery budget they are requeued and run once on
another worker; without one they settle ``interrupted`` (at most once) and
never run. None is lost, none settled twice, none run twice.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job
from tests.faults.helpers import (
    WorkerPool,
    assert_settled_exactly_once,
    audit_rows,
    enqueue_jobs,
    jobs_by_id,
    wait_until,
)

pytestmark = pytest.mark.slow

TIMING: dict[str, Any] = {"lease": 3.0, "heartbeat": 0.5, "poll": 0.2}
#: The worker's slots, each held by a victim that blocks: room to claim a few
#: jobs ahead even when a no-op handler takes tens of milliseconds.
SLOTS = 8
VICTIMS = [f"victim-{i}" for i in range(SLOTS)]
AHEAD = [f"ahead-{i}" for i in range(3)]


def test_sigkill_with_jobs_claimed_ahead_loses_none_and_runs_each_at_most_once(
    instrumented: Engine, db_url: URL, workers: WorkerPool, runner_kind: str
) -> None:
    engine = instrumented
    asyncio = {"asyncio": runner_kind == "async"}
    w1 = workers.start(db_url, "w1", concurrency=SLOTS, claim_ahead=4, **TIMING, **asyncio)
    # Short runs: the worker then claims ahead (up to the horizon's worth of them).
    enqueue_jobs(engine, [Job(f"warm-{i}", "chaos", payload={"action": "noop"}) for i in range(10)])
    wait_until(
        lambda: all(jobs_by_id(engine)[f"warm-{i}"]["state"] == "settled" for i in range(10)),
        timeout=60,
        what="the warm-up jobs",
    )
    block = {"action": "block", "only_first": 1}
    jobs = [
        *(Job(job_id, "chaos", payload=block, max_recoveries=1, priority=9) for job_id in VICTIMS),
        *(Job(job_id, "chaos", max_recoveries=1) for job_id in AHEAD),
        Job("no-budget", "chaos"),  # at most once: interrupted if its claim vanishes
    ]
    enqueue_jobs(engine, jobs)  # one transaction: claimed together, the victims first
    wait_until(
        lambda: (
            len({r["job_id"] for r in audit_rows(engine)}) == SLOTS
            and all(jobs_by_id(engine)[j.job_id]["state"] == "running" for j in jobs)
        ),
        timeout=30,
        what="the victims to run and the others to be claimed ahead",
    )
    assert sorted({r["job_id"] for r in audit_rows(engine)}) == sorted(VICTIMS), "only the victims started"
    w1.kill()

    w2 = workers.start(db_url, "w2", concurrency=SLOTS, **TIMING, **asyncio)
    ids = [j.job_id for j in jobs]
    wait_until(lambda: all(jobs_by_id(engine)[j]["state"] == "settled" for j in ids), timeout=60, what="recovery")
    rows = assert_settled_exactly_once(engine, ids)
    for job_id in AHEAD:
        runs = audit_rows(engine, job_id)
        assert len(runs) == 1 and runs[0]["pid"] == w2.pid, f"{job_id} ran once, on the survivor: {runs}"
        assert (rows[job_id]["outcome"], rows[job_id]["attempt"], rows[job_id]["recovery_count"]) == ("completed", 1, 1)
    for job_id in VICTIMS:
        assert [r["pid"] for r in audit_rows(engine, job_id)] == [w1.pid, w2.pid], job_id
        assert rows[job_id]["outcome"] == "completed"
    assert rows["no-budget"]["outcome"] == "interrupted" and audit_rows(engine, "no-budget") == []
