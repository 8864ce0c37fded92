"""A handler is never called once its claim's lease may have ended.

A process frozen (SIGSTOP) or starved between the claim's last check and
the handler's first line would otherwise call the handler after its lease
ended -- while another runner may already have recovered and run the job.
The driver looks once more, in the handler's own thread or task, right
before calling it: over a heartbeat since the last check, it does not call
the handler, and ``execute`` renews the exact claim first -- running the
handler if the claim still holds, never if it was lost.

Here the freeze is made exact: the execution's claim is dated a lease ago
(its ``claimed_at``), as after a freeze that began just after the check.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from sqlalchemy_watchdog import Job, Runner, RunningJob, Watchdog, store
from sqlalchemy_watchdog.asyncio import AsyncRunner
from sqlalchemy_watchdog.core.loop import execute
from sqlalchemy_watchdog.core.state import Execution
from sqlalchemy_watchdog.core.steps import STARTED_LATE, drive, drive_async
from tests.conftest import make_async_engine

LEASE = timedelta(seconds=6)
HEARTBEAT = timedelta(seconds=1)


def _claimed(runner: Runner | AsyncRunner, engine: Engine, *, dated_ago: float) -> Execution:
    """Claim the job 'j' and admit it into ``runner``, its claim dated ``dated_ago`` seconds back."""
    with engine.begin() as conn:
        batch = store.claim(conn, queues=["q"], limit=1, lease_ms=int(LEASE.total_seconds() * 1000))
    (claim,) = batch.claimed
    return runner.core.admit(claim, time.monotonic() - dated_ago)


def _lease_ended(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET lease_until = 0 WHERE job_id = 'j'"))


@pytest.mark.parametrize("claim_lost", [False, True], ids=["claim-holds", "claim-lost"])
def test_a_sync_handler_about_to_start_late_runs_only_after_a_renewal_holds(engine: Engine, claim_lost: bool) -> None:
    calls: list[str] = []

    def handler(job: RunningJob) -> None:
        calls.append(job.job_id)

    Watchdog(engine).enqueue(Job("j", "q"))
    runner = Runner(engine, {"q": handler}, lease=LEASE, heartbeat=HEARTBEAT)
    execution = _claimed(runner, engine, dated_ago=10.0)
    # The driver alone: it does not call the handler of a claim last checked over a heartbeat ago.
    assert runner._run_handler(execution) is STARTED_LATE and calls == []
    execution.slot_held = True
    if claim_lost:
        _lease_ended(engine)  # the renewal finds the lease over: lost
    request = drive(execute(runner.core, execution), runner._perform)
    if claim_lost:
        assert calls == []  # lost meanwhile: never called
    else:
        assert calls == ["j"]  # renewed, then run once
    assert request is not None


@pytest.mark.parametrize("kind", ["coroutine", "plain"])
def test_an_async_runners_handler_about_to_start_late_is_not_called(engine: Engine, kind: str) -> None:
    calls: list[str] = []

    async def coroutine(job: RunningJob) -> None:
        calls.append(job.job_id)

    def plain(job: RunningJob) -> None:
        calls.append(job.job_id)

    Watchdog(engine).enqueue(Job("j", "q"))

    async def run() -> Any:
        aengine = make_async_engine(engine)
        try:
            runner = AsyncRunner(
                aengine, {"q": coroutine if kind == "coroutine" else plain}, lease=LEASE, heartbeat=HEARTBEAT
            )
            execution = _claimed(runner, engine, dated_ago=10.0)
            first = await runner._run_handler(execution)
            assert first is STARTED_LATE and calls == []
            execution.slot_held = True
            # Through execute: renewed (the claim holds), then called once.
            await drive_async(execute(runner.core, execution), runner._perform)
            assert calls == ["j"]
        finally:
            await aengine.dispose()

    asyncio.run(run())
