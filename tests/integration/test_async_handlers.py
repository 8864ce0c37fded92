"""Coroutine handlers under ``AsyncRunner.run_forever``, on a real database.

Each execution runs in a task of its own, and awaits its coroutine handler
in that task rather than in one more task per job; its settle is handed to
the settler, so the task ends (or takes the next job claimed ahead, in a new
task) without waiting for the commit. What users rely on is what a task per
handler gave them:

- each handler starts in a fresh copy of the runner's context: what one job
  sets in a context variable never reaches the next;
- a stop (a timeout, a cancellation) cancels the handler it is meant for,
  and only that one: a handler that swallows the cancellation and returns
  settles as the stop says, and the jobs after it run undisturbed;
- every handed-off settle is in once ``run_forever`` returns.
"""

from __future__ import annotations

import asyncio
import contextvars
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import CancelStatus, Job, JobState, Outcome, RunningJob, Watchdog

from ..helpers import add, read, settled, wait_until
from ..runner_kinds import RunnerDriver

FAST_POLL = timedelta(milliseconds=50)

#: Set by a handler; a fresh context per job leaves it unset for the next.
CURRENT_JOB: contextvars.ContextVar[str | None] = contextvars.ContextVar("current_job", default=None)


@pytest.fixture
def runner_kind() -> str:
    """These are the async runner's tests (the conftest's fixture runs both kinds)."""
    return "async"


def test_each_coroutine_handler_starts_in_a_fresh_context(engine: Engine, runners: RunnerDriver) -> None:
    seen: list[str | None] = []

    async def handler(job: RunningJob) -> None:
        seen.append(CURRENT_JOB.get())
        CURRENT_JOB.set(job.job_id)
        await asyncio.sleep(0)

    ids = [f"job-{i}" for i in range(40)]
    worker = runners.runner({"q": handler}, concurrency=2, poll_interval=FAST_POLL)
    with worker.serving():
        add(engine, *(Job(job_id, "q") for job_id in ids))
        for job_id in ids:
            assert settled(engine, job_id).outcome is Outcome.COMPLETED
    assert seen == [None] * len(ids), "a job saw a context variable an earlier job set"


def test_a_handler_swallowing_its_timeout_fails_by_it_and_the_next_jobs_run_undisturbed(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The stop's cancellation is taken back once its handler ended: it never
    reaches the settle or a later job's handler (each awaits several times)."""
    finished: list[str] = []

    async def handler(job: RunningJob) -> None:
        if job.job_id == "stubborn":
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                finished.append("stubborn swallowed its cancellation")
            return
        for _ in range(5):
            await asyncio.sleep(0.005)
        finished.append(job.job_id)

    after = [f"after-{i}" for i in range(20)]
    add(engine, Job("stubborn", "q", priority=1, timeout=timedelta(milliseconds=200)))
    add(engine, *(Job(job_id, "q") for job_id in after))
    worker = runners.runner({"q": handler}, concurrency=1, poll_interval=FAST_POLL)
    with worker.serving():
        stubborn = settled(engine, "stubborn")
        for job_id in after:
            job = settled(engine, job_id)
            assert (job.outcome, job.attempt, job.recovery_count) == (Outcome.COMPLETED, 1, 0), job
    assert stubborn.outcome is Outcome.FAILED and stubborn.failure_reason == "timed out after 0.2s", stubborn
    assert finished == ["stubborn swallowed its cancellation", *after]


def test_a_cancelled_job_stops_its_handler_and_the_others_run_on(engine: Engine, runners: RunnerDriver) -> None:
    started: list[str] = []
    stopped: list[str] = []

    async def handler(job: RunningJob) -> None:
        started.append(job.job_id)
        if job.job_id == "long":
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped.append(job.job_id)
                raise
        else:
            await asyncio.sleep(0.01)

    add(engine, Job("long", "q", priority=1))
    worker = runners.runner(
        {"q": handler}, concurrency=2, poll_interval=FAST_POLL, heartbeat=timedelta(milliseconds=200)
    )
    with worker.serving():
        wait_until(lambda: started == ["long"], 10, "the long job to start")
        assert Watchdog(engine).cancel("long", "stop-it").status is CancelStatus.RECORDED
        others = [f"other-{i}" for i in range(10)]
        add(engine, *(Job(job_id, "q") for job_id in others))
        assert settled(engine, "long").outcome is Outcome.CANCELLED
        for job_id in others:
            assert settled(engine, job_id).outcome is Outcome.COMPLETED
    assert stopped == ["long"]


def test_every_handed_off_settle_is_in_when_run_forever_returns(engine: Engine, runners: RunnerDriver) -> None:
    ran: list[str] = []

    async def handler(job: RunningJob) -> None:
        ran.append(job.job_id)

    ids = [f"job-{i}" for i in range(200)]
    worker = runners.runner({"q": handler}, concurrency=4, poll_interval=FAST_POLL)
    with worker.serving():
        add(engine, *(Job(job_id, "q") for job_id in ids))
        wait_until(lambda: len(ran) >= 100, 20, "half the jobs to run")
    # Stopped mid-drain: each job that ran is settled; the others are queued, none left running.
    states = {job_id: read(engine, job_id) for job_id in ids}
    assert all(states[job_id].outcome is Outcome.COMPLETED for job_id in ran), "a job that ran was not settled"
    assert sorted(ran) == sorted(set(ran)), "a job ran twice"
    rest = [job for job_id, job in states.items() if job_id not in ran]
    assert all(job.state is JobState.QUEUED and job.attempt == 1 for job in rest), rest
