"""The queue runs on MariaDB end to end (issue 57, phase 2): a sync ``Runner``
(PyMySQL) and an ``AsyncRunner`` (aiomysql) drain jobs with retries, a job
cancelled while queued, and a job cancelled while its handler runs (the
heartbeat sees it and the handler is stopped).

Needs ``WATCHDOG_TEST_MYSQL_URL`` (e.g. ``mysql+pymysql://root@127.0.0.1:3306/test``);
skipped without it, failing under ``CI=true`` (tests/conftest.py ``mysql_server``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine

from sqlalchemy_watchdog import (
    Job,
    JobState,
    JobView,
    Outcome,
    RetryPolicy,
    Runner,
    RunningJob,
    StopReason,
    Watchdog,
    enqueue,
    metadata,
)
from sqlalchemy_watchdog.asyncio import AsyncRunner
from tests.conftest import mysql_database
from tests.helpers import read, settled, wait_until

RETRY = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=50))
POLL = timedelta(milliseconds=50)
LEASE = timedelta(seconds=3)
HEARTBEAT = timedelta(seconds=1)


@pytest.fixture
def maria(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine on a MariaDB database of its own, the schema created."""
    server: URL = request.getfixturevalue("mysql_server")
    with mysql_database(server, "watchdog_e2e") as url:
        engine = create_engine(url)
        metadata.create_all(engine)
        yield engine
        engine.dispose()


class Flaky:
    """A handler whose first attempt of each job fails (thread-safe)."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, job: RunningJob) -> None:
        with self.lock:
            self.attempts[job.job_id] = self.attempts.get(job.job_id, 0) + 1
            first = self.attempts[job.job_id] == 1
        if first:
            raise RuntimeError("the first attempt fails")


def _enqueue_with_one_cancelled(engine: Engine, prefix: str) -> None:
    with engine.begin() as conn:
        enqueue(conn, [Job(f"{prefix}{n}", "q", retry=RETRY) for n in range(4)])
    assert Watchdog(engine).cancel(f"{prefix}3", "stop").status.value == "recorded"


def _outcomes(jobs: list[JobView]) -> dict[str, tuple[Outcome | None, int]]:
    return {job.job_id: (job.outcome, job.attempt) for job in jobs}


EXPECTED = {
    "0": (Outcome.COMPLETED, 2),
    "1": (Outcome.COMPLETED, 2),
    "2": (Outcome.COMPLETED, 2),
    "3": (Outcome.CANCELLED, 1),
}


def test_a_sync_runner_drains_the_queue_with_retries_and_a_cancellation(maria: Engine) -> None:
    _enqueue_with_one_cancelled(maria, "s")
    flaky = Flaky()
    runner = Runner(maria, {"q": flaky}, poll_interval=POLL)
    done: list[JobView] = []

    def drained() -> bool:
        done.extend(runner.run_until_idle())
        return len(done) >= 4

    # A retry waits its backoff (delayed, then promoted): drain until every job settled.
    wait_until(drained, what="every job to settle")
    assert _outcomes(done) == {f"s{n}": outcome for n, outcome in EXPECTED.items()}
    assert flaky.attempts == {"s0": 2, "s1": 2, "s2": 2}  # the cancelled job never ran
    assert all(read(maria, f"s{n}").state is JobState.SETTLED for n in range(4))


def test_an_async_runner_on_aiomysql_drains_the_queue_with_retries_and_a_cancellation(maria: Engine) -> None:
    _enqueue_with_one_cancelled(maria, "a")
    flaky = Flaky()

    async def drain() -> list[JobView]:
        engine = create_async_engine(maria.url.set(drivername="mysql+aiomysql"))
        try:
            runner = AsyncRunner(engine, {"q": flaky}, poll_interval=POLL)
            done: list[JobView] = []
            for _ in range(200):
                done.extend(await runner.run_until_idle())
                if len(done) >= 4:
                    break
                await asyncio.sleep(0.05)
            return done
        finally:
            await engine.dispose()

    done = asyncio.run(drain())
    assert _outcomes(done) == {f"a{n}": outcome for n, outcome in EXPECTED.items()}
    assert flaky.attempts == {"a0": 2, "a1": 2, "a2": 2}


class Blocking:
    """A handler that runs until its job is asked to stop, recording why."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.reasons: list[StopReason | None] = []

    def __call__(self, job: RunningJob) -> None:
        self.started.set()
        job.stop_requested.wait(30)
        self.reasons.append(job.stop_reason)


def test_a_sync_runner_stops_a_running_handler_whose_job_is_cancelled(maria: Engine) -> None:
    with maria.begin() as conn:
        enqueue(conn, [Job("long", "q")])
    blocking = Blocking()
    runner = Runner(maria, {"q": blocking}, poll_interval=POLL, lease=LEASE, heartbeat=HEARTBEAT)
    with runner.running():
        assert blocking.started.wait(15)
        assert Watchdog(maria).cancel("long", "stop-long").status.value == "recorded"
        job = settled(maria, "long")
        wait_until(lambda: blocking.reasons, what="the handler to stop")
    assert blocking.reasons == [StopReason.CANCELLED]
    assert job.outcome is Outcome.CANCELLED


def test_an_async_runner_stops_a_running_handler_whose_job_is_cancelled(maria: Engine) -> None:
    with maria.begin() as conn:
        enqueue(conn, [Job("long", "q")])

    async def handler(job: RunningJob) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            reasons.append(job.stop_reason)

    started = threading.Event()
    reasons: list[StopReason | None] = []

    async def serve() -> JobView:
        engine = create_async_engine(maria.url.set(drivername="mysql+aiomysql"))
        try:
            runner = AsyncRunner(engine, {"q": handler}, poll_interval=POLL, lease=LEASE, heartbeat=HEARTBEAT)
            async with runner.running():
                await asyncio.to_thread(started.wait, 15)
                assert Watchdog(maria).cancel("long", "stop-long").status.value == "recorded"
                job = await asyncio.to_thread(settled, maria, "long")
                await asyncio.to_thread(wait_until, lambda: reasons, what="the handler to stop")
            return job
        finally:
            await engine.dispose()

    job = asyncio.run(serve())
    assert reasons == [StopReason.CANCELLED]
    assert job.outcome is Outcome.CANCELLED
