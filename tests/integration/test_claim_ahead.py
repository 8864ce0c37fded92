"""Claiming ahead of short handlers, on a real database, for both runner kinds.

A runner whose handlers are short claims up to ``claim_ahead`` jobs beyond
its ``concurrency``; they wait in the runner for the next free slot
(sqlalchemy_watchdog/core/ahead.py). What users rely on: no more handlers
run at once than ``concurrency``; every job runs once; a job claimed ahead
that waits too long for a slot is given back -- queued again, its attempt
not counted -- and runs later; at shutdown the jobs claimed ahead are given
back at once, never started. The rules alone (how many, when) are in
tests/unit/test_claim_ahead.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Job, JobState, Outcome, RunningJob, Watchdog

from ..helpers import add, raw, read, settled, wait_until
from ..runner_kinds import RunnerDriver

FAST_POLL = timedelta(milliseconds=50)


class Recorder:
    """A handler that records the jobs it ran, in order, and how many ran at once;
    a job named ``slow*`` takes ``slow_s`` seconds."""

    def __init__(self, slow_s: float = 0.0, each_s: float = 0.0) -> None:
        self.slow_s, self.each_s = slow_s, each_s
        self.ran: list[str] = []
        self.running = self.most = 0
        self.slow_started = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, job: RunningJob) -> None:
        with self._lock:
            self.ran.append(job.job_id)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if job.job_id.startswith("slow"):
                self.slow_started.set()
                time.sleep(self.slow_s)
            elif self.each_s:
                time.sleep(self.each_s)
        finally:
            with self._lock:
                self.running -= 1


def warmed(engine: Engine, handler: Recorder) -> None:
    """One short job run to the end: the runner knows its handlers are short."""
    add(engine, Job("warm", "q"))
    settled(engine, "warm")
    assert handler.ran == ["warm"]


@contextlib.contextmanager
def busy_with_a_slow_job(
    engine: Engine, runners: RunnerDriver, handler: Recorder, claim_ahead: int, *others: str
) -> Iterator[None]:
    """A serving runner with one slot (``concurrency=1``), warmed, then given a
    slow job and ``others`` in one transaction -- claimed together, the slow
    one first -- and running the slow one; stopped at the end of the block."""
    worker = runners.runner({"q": handler}, concurrency=1, claim_ahead=claim_ahead, poll_interval=FAST_POLL)
    with worker.serving():
        warmed(engine, handler)
        add(engine, Job("slow", "q", priority=1), *(Job(job_id, "q") for job_id in others))
        assert handler.slow_started.wait(10)
        yield


def test_no_more_handlers_run_at_once_than_concurrency_and_each_job_runs_once(
    engine: Engine, runners: RunnerDriver
) -> None:
    handler = Recorder(each_s=0.002)
    worker = runners.runner({"q": handler}, concurrency=2, poll_interval=FAST_POLL)
    with worker.serving():
        warmed(engine, handler)
        add(engine, *(Job(f"job-{i}", "q") for i in range(60)))
        for i in range(60):
            assert settled(engine, f"job-{i}").outcome is Outcome.COMPLETED
    assert handler.most <= 2, f"{handler.most} handlers ran at once with concurrency=2"
    assert sorted(handler.ran) == sorted(["warm", *(f"job-{i}" for i in range(60))]), "each job ran once"


def test_a_job_claimed_ahead_that_waits_too_long_is_given_back_and_runs_later_uncounted(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sqlalchemy_watchdog")
    handler = Recorder(slow_s=3.0)
    with busy_with_a_slow_job(engine, runners, handler, 1, "next"):
        wait_until(lambda: any("given back" in r.getMessage() for r in caplog.records), 10, "the give-back")
        assert handler.ran == ["warm", "slow"], "the job given back did not run"
        job = read(engine, "next")
        assert job.state is JobState.QUEUED and job.attempt == 1, "given back: queued again, nothing counted"
        done = settled(engine, "next", timeout=20)
    assert done.outcome is Outcome.COMPLETED and done.attempt == 1
    assert handler.ran == ["warm", "slow", "next"], "it ran once, after the slow job"


def test_jobs_claimed_ahead_are_given_back_at_shutdown_never_started(engine: Engine, runners: RunnerDriver) -> None:
    handler = Recorder(slow_s=1.0)
    with busy_with_a_slow_job(engine, runners, handler, 3, *(f"ahead-{i}" for i in range(3))):
        pass
    # run_forever has returned: the slow job finished within the grace; the others never started.
    assert read(engine, "slow").outcome is Outcome.COMPLETED
    assert handler.ran == ["warm", "slow"]
    for i in range(3):
        job = read(engine, f"ahead-{i}")
        assert job.state is JobState.QUEUED and job.attempt == 1, f"ahead-{i}: {job}"


def test_claim_ahead_zero_claims_only_the_free_slots(engine: Engine, runners: RunnerDriver) -> None:
    """With ``claim_ahead=0`` a runner busy with a long job leaves the next one
    to any other runner: it stays queued, unclaimed."""
    handler = Recorder(slow_s=1.0)
    with busy_with_a_slow_job(engine, runners, handler, 0, "next"):
        assert read(engine, "next").state is JobState.QUEUED, "not claimed while the slot is busy"
        settled(engine, "next")
    assert handler.ran == ["warm", "slow", "next"]


def test_a_runner_claims_in_larger_batches_when_its_handlers_are_short(engine: Engine, runners: RunnerDriver) -> None:
    """The point of claiming ahead: fewer claim statements per job. One claim
    gives its batch one token (each job's claim token is it + "." + the job's
    sequence), which the settled rows keep."""
    batches = {}
    for ahead in (0, 6):
        handler = Recorder()
        worker = runners.runner({"q": handler}, concurrency=2, claim_ahead=ahead, poll_interval=FAST_POLL)
        with worker.serving():
            add(engine, Job(f"warm-{ahead}", "q"))
            settled(engine, f"warm-{ahead}")
            ids = [f"job-{ahead}-{i}" for i in range(40)]
            add(engine, *(Job(job_id, "q") for job_id in ids))
            for job_id in ids:
                assert settled(engine, job_id).outcome is Outcome.COMPLETED
        assert sorted(handler.ran) == sorted([f"warm-{ahead}", *ids]), "each job ran once"
        batches[ahead] = len({raw(engine, job_id)["claim_token"].rsplit(".", 1)[0] for job_id in ids})
    assert batches[0] >= 20, f"without claiming ahead, batches of at most 2: {batches}"
    assert batches[6] <= 13, f"claiming ahead, batches of about 8: {batches}"


def test_cancelling_a_job_claimed_ahead_settles_it_cancelled_and_it_never_runs(
    engine: Engine, runners: RunnerDriver
) -> None:
    """Waiting for a slot, it holds a live claim: a cancellation reaches it like
    a running job's, and it settles ``cancelled`` without its handler starting,
    long before the slow job frees the slot."""
    handler = Recorder(slow_s=4.0)
    with busy_with_a_slow_job(engine, runners, handler, 1, "ahead"):
        wait_until(lambda: read(engine, "ahead").state is JobState.RUNNING, 10, "the job claimed ahead")
        Watchdog(engine).cancel("ahead", "not needed")
        cancelled = settled(engine, "ahead", timeout=3.5)
        assert read(engine, "slow").state is JobState.RUNNING, "the slow job still holds the slot"
    assert (cancelled.outcome, cancelled.attempt) == (Outcome.CANCELLED, 1)
    assert handler.ran == ["warm", "slow"]
