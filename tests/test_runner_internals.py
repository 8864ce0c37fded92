"""Tests that reach into the sync Runner's private internals (``_claim``,
``_execute``, ``Execution.claimed_at``).

Kept as they were while the runners' internals are rewritten around one
core; the same guarantees are proven for both runners through the public
API in tests/test_runners.py (a pause between claim and start made with
SQLAlchemy pool events). Delete this file, or port it to the new core's
own tests, when the refactor lands.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, select

from sqlalchemy_watchdog import Job, Outcome, Runner, StopReason, TickStatus, enqueue, store
from sqlalchemy_watchdog.model import jobs_table


def add(engine: Engine, *jobs: Job) -> None:
    with engine.begin() as conn:
        enqueue(conn, list(jobs))


def raw(engine: Engine, job_id: str) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(select(jobs_table).where(jobs_table.c.job_id == job_id)).one()._mapping)


# -- a pause between claim and start -----------------------------------------


def test_a_handler_starting_long_after_its_claim_does_not_run_if_the_claim_was_lost(engine: Engine) -> None:
    """The process paused (stopped, starved) between claim and start, long
    enough for the lease to end: the runner re-checks the claim before the
    handler starts and leaves the job to recovery instead of running it."""
    ran: list[str] = []
    worker = Runner(
        engine,
        {"q": lambda job: ran.append(job.job_id)},
        lease=timedelta(seconds=3),
        heartbeat=timedelta(seconds=1),
    )
    add(engine, Job("paused", "q", max_recoveries=1))
    executions, _ = worker._claim(1)
    (execution,) = executions
    token = raw(engine, "paused")["claim_token"]
    with engine.begin() as conn:  # the lease ends while the process is paused
        assert store.release(conn, [("paused", token)]) == {"paused"}
    execution.claimed_at -= 2.0  # ... and the pause outlasted a heartbeat
    before = raw(engine, "paused")
    result = worker._execute(execution)
    assert ran == []
    assert result.status is TickStatus.REJECTED
    assert execution.job.stop_reason is StopReason.LEASE_LOST
    assert raw(engine, "paused") == before  # left to recovery, untouched
    [recovered] = worker.run_until_idle()
    assert (recovered.outcome, ran) == (Outcome.COMPLETED, ["paused"])


def test_a_handler_starting_late_runs_when_its_claim_still_holds(engine: Engine) -> None:
    ran: list[str] = []
    worker = Runner(
        engine,
        {"q": lambda job: ran.append(job.job_id)},
        lease=timedelta(seconds=30),
        heartbeat=timedelta(seconds=1),
    )
    add(engine, Job("late", "q"))
    (execution,), _ = worker._claim(1)
    execution.claimed_at -= 2.0
    result = worker._execute(execution)
    assert ran == ["late"]
    assert result.job is not None and result.job.outcome is Outcome.COMPLETED
