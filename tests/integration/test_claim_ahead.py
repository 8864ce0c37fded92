"""Claiming ahead of short handlers, on a real database, for both runner kinds.

A runner whose handlers are short claims up to ``claim_ahead`` jobs beyond
its ``concurrency``; they wait in the runner for the next free slot
(sqlalchemy_watchdog/core/ahead.py). What users rely on: no more handlers
run at once than ``concurrency``; every job runs once; a job claimed ahead
that waits too long for a slot is given back -- queued again, its attempt
not counted -- and runs later; at shutdown the jobs claimed ahead are given
back at once, never started. The rules alone (how many, when) are in
tests/unit/test_claim_ahead.py.

How many jobs a runner claims ahead depends on its handlers' measured run
time (as many as start within 10 ms), so the tests that need jobs claimed
ahead give the runner :data:`SLOTS` slots (a no-op handler may take tens of
milliseconds on a loaded machine and still leave room for a few) and check
that the jobs were claimed ahead before they go on. A runner claims ahead
only while its handlers run several of its round trips (each job claimed
ahead waits one for the record of its start: ``AHEAD_MIN_ROUND_TRIPS``);
the tests of what claiming ahead does set that rule aside
(:func:`claims_ahead_of_any_handler`), and one test checks the rule itself.
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
from sqlalchemy_watchdog.core import ahead as ahead_rules

from ..helpers import add, raw, read, settled, wait_until
from ..runner_kinds import RunnerDriver

FAST_POLL = timedelta(milliseconds=50)
#: The slots of a runner kept busy by slow jobs while others wait claimed ahead.
SLOTS = 8
SLOW = [f"slow-{i}" for i in range(SLOTS)]


@pytest.fixture
def claims_ahead_of_any_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Claim ahead whatever the handlers' run time against the round trip
    (the premise of the tests of what claiming ahead does; the rule's own
    test is :func:`test_handlers_shorter_than_a_few_round_trips_are_not_claimed_ahead`)."""
    monkeypatch.setattr(ahead_rules, "AHEAD_MIN_ROUND_TRIPS", 0.0)


class Recorder:
    """A handler that records the jobs it ran, in order, and how many ran at once;
    a job named ``slow*`` takes ``slow_s`` seconds, or until :attr:`release`
    is set (a test that needs every slot busy while it looks holds them so,
    however slowly the machine starts the handlers, then lets them go)."""

    def __init__(self, slow_s: float = 0.0, each_s: float = 0.0) -> None:
        self.slow_s, self.each_s = slow_s, each_s
        self.release = threading.Event()
        self.ran: list[str] = []
        self.running = self.most = 0
        self._lock = threading.Lock()

    def __call__(self, job: RunningJob) -> None:
        with self._lock:
            self.ran.append(job.job_id)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if job.job_id.startswith("slow"):
                self.release.wait(self.slow_s)
            elif self.each_s:
                time.sleep(self.each_s)
        finally:
            with self._lock:
                self.running -= 1


def warmed(engine: Engine, handler: Recorder, prefix: str = "warm") -> None:
    """Ten short jobs run to the end: the runner knows its handlers are short."""
    ids = [f"{prefix}-{i}" for i in range(10)]
    add(engine, *(Job(job_id, "q") for job_id in ids))
    for job_id in ids:
        settled(engine, job_id)
    assert sorted(handler.ran) == sorted(ids)


def claimed_ahead(engine: Engine, handler: Recorder, job_ids: tuple[str, ...]) -> None:
    """Wait until ``job_ids`` are claimed (``running`` in the database) and none has started."""
    wait_until(
        lambda: all(read(engine, job_id).state is JobState.RUNNING for job_id in job_ids), 10, f"{job_ids} claimed"
    )
    assert not set(job_ids) & set(handler.ran), "claimed ahead: not started while every slot is busy"


@contextlib.contextmanager
def busy_with_slow_jobs(
    engine: Engine, runners: RunnerDriver, handler: Recorder, claim_ahead: int, *others: str
) -> Iterator[None]:
    """A serving runner with :data:`SLOTS` slots, warmed, then given a slow job
    for each slot and ``others`` in one transaction -- claimed together, the
    slow ones first -- and running the slow ones; stopped at the end of the
    block. With ``claim_ahead``, ``others`` are claimed ahead by then."""
    worker = runners.runner({"q": handler}, concurrency=SLOTS, claim_ahead=claim_ahead, poll_interval=FAST_POLL)
    with worker.serving():
        warmed(engine, handler)
        # The premise, whatever the machine's load: the runner takes its handlers
        # for short ones. Its estimate of their run time (the warm-ups' measured
        # times; tests/unit/test_claim_ahead.py tests the estimator) went over
        # the horizon when a loaded CI machine ran them slowly, and the runner
        # then rightly claimed fewer jobs ahead than this test needs.
        worker.runner.core.run_times.average = 0.001
        add(engine, *(Job(job_id, "q", priority=1) for job_id in SLOW), *(Job(job_id, "q") for job_id in others))
        wait_until(lambda: handler.running == SLOTS, 10, "every slot running a slow job")
        if claim_ahead:
            claimed_ahead(engine, handler, others)
        yield


WARM = [f"warm-{i}" for i in range(10)]


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
    assert sorted(handler.ran) == sorted([*WARM, *(f"job-{i}" for i in range(60))]), "each job ran once"


@pytest.mark.usefixtures("claims_ahead_of_any_handler")
def test_a_job_claimed_ahead_that_waits_too_long_is_given_back_and_runs_later_uncounted(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sqlalchemy_watchdog")
    handler = Recorder(slow_s=20.0)
    with busy_with_slow_jobs(engine, runners, handler, 1, "next"):
        job = wait_until(lambda: (job := read(engine, "next")).state is JobState.QUEUED and job, 10, "the give-back")
        assert job.attempt == 1 and job.recovery_count == 0, "given back: queued again, nothing counted"
        assert any("given back" in r.getMessage() for r in caplog.records)
        assert "next" not in handler.ran, "the job given back did not run"
        handler.release.set()  # the slow jobs end: a slot frees
        done = settled(engine, "next", timeout=20)
    assert done.outcome is Outcome.COMPLETED and done.attempt == 1
    assert handler.ran.count("next") == 1 and handler.ran[-1] == "next", "it ran once, after a slow job"


@pytest.mark.usefixtures("claims_ahead_of_any_handler")
def test_jobs_claimed_ahead_are_given_back_at_shutdown_never_started(engine: Engine, runners: RunnerDriver) -> None:
    handler = Recorder(slow_s=30.0)
    ahead = tuple(f"ahead-{i}" for i in range(3))
    with busy_with_slow_jobs(engine, runners, handler, 3, *ahead):
        # The slow jobs hold every slot however slowly the machine claimed the
        # others; they finish a moment after the shutdown begins, within its grace.
        threading.Timer(1.0, handler.release.set).start()
    # run_forever has returned: the slow jobs finished within the grace; the others never started.
    assert all(read(engine, job_id).outcome is Outcome.COMPLETED for job_id in SLOW)
    assert sorted(handler.ran) == sorted([*WARM, *SLOW])
    for job_id in ahead:
        job = read(engine, job_id)
        assert job.state is JobState.QUEUED and job.attempt == 1 and job.recovery_count == 0, job


def test_claim_ahead_zero_claims_only_the_free_slots(engine: Engine, runners: RunnerDriver) -> None:
    """With ``claim_ahead=0`` a runner whose slots are all busy leaves the next
    job to any other runner: it stays queued, unclaimed."""
    handler = Recorder(slow_s=1.0)
    with busy_with_slow_jobs(engine, runners, handler, 0, "next"):
        assert read(engine, "next").state is JobState.QUEUED, "not claimed while every slot is busy"
        settled(engine, "next")
    assert handler.ran[-1] == "next"


@pytest.mark.usefixtures("claims_ahead_of_any_handler")
def test_a_runner_claims_in_larger_batches_when_its_handlers_are_short(
    engine: Engine, runners: RunnerDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The point of claiming ahead: fewer claim statements per job. One claim
    gives its batch one token (each job's claim token is it + "." + the job's
    sequence), which the settled rows keep. The horizon is widened so that a
    loaded machine, where even a no-op handler's measured run time passes the
    10 ms a slot's worth of jobs claimed ahead may wait, still claims ahead up
    to the cap (CI once saw 15 claims of at most 4 with it)."""
    monkeypatch.setattr(ahead_rules, "AHEAD_HORIZON_S", 1.0)
    batches = {}
    for ahead in (0, 12):
        handler = Recorder()
        worker = runners.runner({"q": handler}, concurrency=4, claim_ahead=ahead, poll_interval=FAST_POLL)
        with worker.serving():
            warmed(engine, handler, f"warm-{ahead}")
            ids = [f"job-{ahead}-{i}" for i in range(60)]
            add(engine, *(Job(job_id, "q") for job_id in ids))
            for job_id in ids:
                assert settled(engine, job_id).outcome is Outcome.COMPLETED
        assert sorted(handler.ran) == sorted([*(f"warm-{ahead}-{i}" for i in range(10)), *ids]), "each ran once"
        batches[ahead] = len({raw(engine, job_id)["claim_token"].rsplit(".", 1)[0] for job_id in ids})
    assert batches[0] >= 15, f"without claiming ahead, batches of at most 4: {batches}"
    # Fewer claims than any run without claiming ahead can make (60 jobs, at most
    # 4 a claim: 15); typically 4-8, more on a loaded machine, whose handlers
    # finish before the runner's next claim as often as not.
    assert batches[12] < 15, f"claiming ahead, batches of more than 4: {batches}"


@pytest.mark.usefixtures("claims_ahead_of_any_handler")
def test_cancelling_a_job_claimed_ahead_settles_it_cancelled_and_it_never_runs(
    engine: Engine, runners: RunnerDriver
) -> None:
    """Waiting for a slot, it holds a live claim: a cancellation reaches it like
    a running job's, and it settles ``cancelled`` without its handler starting,
    long before the slow jobs free a slot."""
    handler = Recorder(slow_s=20.0)
    with busy_with_slow_jobs(engine, runners, handler, 1, "ahead"):
        Watchdog(engine).cancel("ahead", "not needed")
        cancelled = settled(engine, "ahead", timeout=3.5)
        assert handler.running == SLOTS, "the slow jobs still hold every slot"
        handler.release.set()
    assert (cancelled.outcome, cancelled.attempt) == (Outcome.CANCELLED, 1)
    assert "ahead" not in handler.ran


def test_handlers_shorter_than_a_few_round_trips_are_not_claimed_ahead(engine: Engine, runners: RunnerDriver) -> None:
    """Each job claimed ahead waits one round trip for the record of its
    start before its handler runs: with no-op handlers (far shorter than
    ``AHEAD_MIN_ROUND_TRIPS`` round trips) a runner with ``claim_ahead=12``
    claims only its free slots, in batches of at most ``concurrency`` as
    with ``claim_ahead=0`` -- no job is marked unstarted, no handler waits
    for a start record."""
    handler = Recorder()
    worker = runners.runner({"q": handler}, concurrency=4, claim_ahead=12, poll_interval=FAST_POLL)
    with worker.serving():
        warmed(engine, handler)
        assert worker.runner.core.run_times.round_trip is not None, "the claims' round trip is measured"
        ids = [f"job-{i}" for i in range(40)]
        add(engine, *(Job(job_id, "q") for job_id in ids))
        for job_id in ids:
            assert settled(engine, job_id).outcome is Outcome.COMPLETED
    tokens = [raw(engine, job_id)["claim_token"].rsplit(".", 1)[0] for job_id in ids]
    largest = max(tokens.count(token) for token in tokens)
    assert largest <= 4, f"a claim of {largest} jobs: claimed ahead of no-op handlers"
