"""Fault 8: a runner whose clock runs 10 minutes ahead or behind.

The runner's ``clock=`` is its application clock. Whatever it says, a lease
must be measured by the database: a skewed runner can neither hold a lease
longer than ``lease`` of database time, nor treat another runner's live lease
as expired and take its job. Proven for ``Runner`` and ``AsyncRunner``
(the ``runners`` driver of tests/runner_kinds.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Decision, Job, TickResult, TickStatus, store
from sqlalchemy_watchdog.jobs import SettleStatus
from tests.faults.helpers import db_now_ms, enqueue_jobs, jobs_by_id, wait_until
from tests.runner_kinds import RunnerDriver

TEN_MINUTES = 10 * 60 * 1000

SKEWS = [
    pytest.param(-TEN_MINUTES, id="behind"),
    pytest.param(TEN_MINUTES, id="ahead"),
]


def skewed(offset_ms: int) -> Callable[[], int]:
    return lambda: store.now_ms() + offset_ms


def _tx(engine: Engine, fn: Callable, *args, **kwargs):  # type: ignore[no-untyped-def, type-arg]
    with engine.connect() as conn:
        return store.transact(conn, fn, *args, **kwargs)


def _blocking_runner(
    runners: RunnerDriver, clock: Callable[[], int], lease_s: float, heartbeat_s: float
) -> tuple[threading.Event, Future[TickResult]]:
    """A runner whose handler blocks until released; its ``tick`` runs in the background."""
    started = threading.Event()
    release = threading.Event()

    def handle(job):  # type: ignore[no-untyped-def]
        started.set()
        release.wait(30)

    runner = runners.runner(
        {"q": handle},
        lease=timedelta(seconds=lease_s),
        heartbeat=timedelta(seconds=heartbeat_s),
        clock=clock,
    )
    result = runner.tick_in_background()
    assert started.wait(30), "the handler did not start"
    return release, result


@pytest.mark.parametrize("offset", SKEWS)
def test_skewed_runner_cannot_steal_a_live_lease(engine: Engine, runners: RunnerDriver, offset: int) -> None:
    enqueue_jobs(engine, [Job("held", "q", max_recoveries=3)])
    release, result = _blocking_runner(runners, store.now_ms, lease_s=30, heartbeat_s=1)
    try:
        held = jobs_by_id(engine)["held"]
        thief = runners.runner(
            {"q": lambda job: None},
            lease=timedelta(seconds=30),
            heartbeat=timedelta(seconds=1),
            clock=skewed(offset),
        )
        outcome = thief.tick()
        after = jobs_by_id(engine)["held"]
        assert outcome.status is TickStatus.IDLE, outcome
        assert (after["state"], after["claim_token"], after["recovery_count"]) == (
            "running",
            held["claim_token"],
            0,
        )
    finally:
        release.set()
    assert result.result(30).status is TickStatus.SETTLED
    assert jobs_by_id(engine)["held"]["outcome"] == "completed"


@pytest.mark.parametrize("offset", SKEWS)
def test_skewed_runner_lease_never_outlives_database_time(engine: Engine, runners: RunnerDriver, offset: int) -> None:
    """While a skewed runner runs a job, heartbeats included, its lease
    stays within ``lease`` of the database clock."""
    lease_ms = 1500
    enqueue_jobs(engine, [Job("mine", "q")])
    release, result = _blocking_runner(runners, skewed(offset), lease_s=lease_ms / 1000, heartbeat_s=0.3)
    try:
        ahead_by = []
        deadline = time.monotonic() + 1.2  # spans a few heartbeats
        while time.monotonic() < deadline:
            ahead_by.append(jobs_by_id(engine)["mine"]["lease_until"] - db_now_ms(engine))
            time.sleep(0.1)
    finally:
        release.set()
        result.result(30)
    assert max(ahead_by) <= lease_ms + 250, f"lease ran {max(ahead_by)} ms past the database clock"


@pytest.mark.parametrize("offset", SKEWS)
def test_skewed_claim_ends_by_database_time(engine: Engine, runners: RunnerDriver, offset: int) -> None:
    """A skewed claimer that stops renewing loses its claim when the
    database says the lease ended: its renew and settle are refused and a
    correct runner recovers the job."""
    clock = skewed(offset)
    enqueue_jobs(engine, [Job("dies", "q", max_recoveries=1)])
    batch = _tx(engine, store.claim, queues=["q"], lease_ms=400)
    (claim,) = batch.claimed
    row = jobs_by_id(engine)["dies"]
    assert row["lease_until"] <= db_now_ms(engine) + 400, "the lease was measured by the skewed clock"
    time.sleep(0.6)
    assert _tx(engine, store.renew, [("dies", claim.token)], lease_ms=400, now=clock()) == set()
    settled = _tx(
        engine, store.settle, job_id="dies", claim_token=claim.token, decision=Decision.completed(), now=clock()
    )
    assert settled.status is SettleStatus.CONFLICT
    rescuer = runners.runner({"q": lambda job: None}, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=1))
    assert rescuer.tick().status is TickStatus.REQUEUED
    assert rescuer.tick().status is TickStatus.SETTLED
    final = wait_until(lambda: jobs_by_id(engine)["dies"], timeout=5, what="the row")
    assert final["outcome"] == "completed" and final["recovery_count"] == 1
