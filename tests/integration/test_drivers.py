"""PostgreSQL through the other drivers: psycopg2 (sync) and asyncpg (asyncio).

The package's own tests run on psycopg 3; these check that an application
whose engine uses ``postgresql+psycopg2`` or ``postgresql+asyncpg`` gets the
same queue: enqueue inside its session (including a conflicting replay),
``Watchdog`` / ``AsyncWatchdog`` reads and commands, a runner draining jobs,
and the LISTEN/NOTIFY wake-up of an idle runner (whose listener connection is
always opened with psycopg 3, a dependency of the package, from the engine's
URL). What the docs' "Drivers" section (docs/howto/deployment.md) says is what this module proves.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import (
    CancelStatus,
    EnqueueConflict,
    EnqueueStatus,
    Job,
    JobState,
    Outcome,
    Runner,
    Watchdog,
    enqueue,
    metadata,
)
from sqlalchemy_watchdog.asyncio import AsyncRunner, AsyncWatchdog
from sqlalchemy_watchdog.asyncio import enqueue as async_enqueue

pytest.importorskip("psycopg2")
pytest.importorskip("asyncpg")

#: An idle runner polls this rarely, so a job started sooner was woken by NOTIFY.
SLOW_POLL = timedelta(seconds=30)
WAKE_WITHIN = 5.0


@pytest.fixture
def pg_url(postgres_url: URL) -> URL:
    """The throwaway PostgreSQL database, emptied, with a fresh ``watchdog_jobs`` table."""
    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    metadata.create_all(engine)
    engine.dispose()
    return postgres_url


@pytest.fixture
def psycopg2_engine(pg_url: URL) -> Iterator[Engine]:
    engine = create_engine(pg_url.set(drivername="postgresql+psycopg2"))
    assert engine.dialect.driver == "psycopg2"
    yield engine
    engine.dispose()


def asyncpg_engine(pg_url: URL) -> AsyncEngine:
    """Create inside the test's event loop; ``await dispose()`` it at the end."""
    engine = create_async_engine(pg_url.set(drivername="postgresql+asyncpg"))
    assert engine.dialect.driver == "asyncpg"
    return engine


def completed(job_id: str) -> Job:
    return Job(job_id, "emails", lane="customer:1", payload={"n": job_id})


# -- psycopg2 -------------------------------------------------------------------


def test_psycopg2_enqueue_in_session_reads_and_commands(psycopg2_engine: Engine) -> None:
    with Session(psycopg2_engine) as session:
        results = enqueue(session, [completed("a"), completed("b"), completed("c")])
        assert [r.status for r in results] == [EnqueueStatus.QUEUED] * 3
        assert enqueue(session, completed("a")).status is EnqueueStatus.DUPLICATE
        session.commit()
    with Session(psycopg2_engine) as session:
        with pytest.raises(EnqueueConflict) as conflict:
            enqueue(session, Job("a", "other-queue"))
        assert conflict.value.job_id == "a"

    watchdog = Watchdog(psycopg2_engine)
    job = watchdog.read("a")
    assert job is not None and job.state is JobState.QUEUED and job.payload == {"n": "a"}
    head = watchdog.read_queue_head("emails")
    assert head is not None and head.job_id == "a"
    assert watchdog.cancel("a", "cancel-a").status is CancelStatus.RECORDED
    assert watchdog.cancel("a", "cancel-a").status is CancelStatus.REPLAYED
    failure = watchdog.fail_lane("customer:1", "customer closed")
    assert {j.job_id for j in failure.jobs} == {"a", "b", "c"} and not failure.more
    watchdog.enqueue([Job("d", "reports"), Job("e", "reports")])
    assert watchdog.purge("reports") == 2
    assert [j.job_id for j in watchdog.read_settled()] == ["a", "b", "c"]
    assert not watchdog.has_pending_work()


def test_psycopg2_runner_drains_jobs(psycopg2_engine: Engine) -> None:
    Watchdog(psycopg2_engine).enqueue([completed(f"job-{i}") for i in range(20)])
    ran: list[str] = []
    lock = threading.Lock()

    def handle(job: object) -> None:
        with lock:
            ran.append(job.job_id)  # type: ignore[attr-defined]

    settled = Runner(psycopg2_engine, {"emails": handle}, concurrency=4).run_until_idle()
    assert sorted(j.job_id for j in settled) == sorted(f"job-{i}" for i in range(20))
    assert {j.outcome for j in settled} == {Outcome.COMPLETED}
    assert sorted(ran) == sorted(f"job-{i}" for i in range(20))


def test_psycopg2_idle_runner_is_woken_by_notify(psycopg2_engine: Engine) -> None:
    started = threading.Event()
    runner = Runner(psycopg2_engine, {"emails": lambda job: started.set()}, poll_interval=SLOW_POLL)
    thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        time.sleep(1.5)  # the runner is idle, its listener connected
        with Session(psycopg2_engine) as session:
            enqueue(session, completed("wake-me"))
            session.commit()
        assert started.wait(WAKE_WITHIN), f"the job did not start within {WAKE_WITHIN}s of its commit"
    finally:
        runner.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    job = Watchdog(psycopg2_engine).read("wake-me")
    assert job is not None and job.outcome is Outcome.COMPLETED


# -- asyncpg --------------------------------------------------------------------


async def test_asyncpg_enqueue_in_session_reads_and_commands(pg_url: URL) -> None:
    engine = asyncpg_engine(pg_url)
    try:
        new_session = async_sessionmaker(engine, expire_on_commit=False)
        async with new_session() as session:
            results = await async_enqueue(session, [completed("a"), completed("b"), completed("c")])
            assert [r.status for r in results] == [EnqueueStatus.QUEUED] * 3
            assert (await async_enqueue(session, completed("a"))).status is EnqueueStatus.DUPLICATE
            await session.commit()
        async with new_session() as session:
            with pytest.raises(EnqueueConflict) as conflict:
                await async_enqueue(session, Job("a", "other-queue"))
            assert conflict.value.job_id == "a"

        watchdog = AsyncWatchdog(engine)
        job = await watchdog.read("a")
        assert job is not None and job.state is JobState.QUEUED and job.payload == {"n": "a"}
        head = await watchdog.read_queue_head("emails")
        assert head is not None and head.job_id == "a"
        assert (await watchdog.cancel("a", "cancel-a")).status is CancelStatus.RECORDED
        assert (await watchdog.cancel("a", "cancel-a")).status is CancelStatus.REPLAYED
        failure = await watchdog.fail_lane("customer:1", "customer closed")
        assert {j.job_id for j in failure.jobs} == {"a", "b", "c"} and not failure.more
        await watchdog.enqueue([Job("d", "reports"), Job("e", "reports")])
        assert await watchdog.purge("reports") == 2
        assert [j.job_id for j in await watchdog.read_settled()] == ["a", "b", "c"]
        assert not await watchdog.has_pending_work()
    finally:
        await engine.dispose()


async def test_asyncpg_async_runner_drains_jobs(pg_url: URL) -> None:
    engine = asyncpg_engine(pg_url)
    try:
        await AsyncWatchdog(engine).enqueue([completed(f"job-{i}") for i in range(20)])
        ran: list[str] = []

        async def handle(job: object) -> None:
            await asyncio.sleep(0)
            ran.append(job.job_id)  # type: ignore[attr-defined]

        settled = await AsyncRunner(engine, {"emails": handle}, concurrency=4).run_until_idle()
        assert sorted(j.job_id for j in settled) == sorted(f"job-{i}" for i in range(20))
        assert {j.outcome for j in settled} == {Outcome.COMPLETED}
        assert sorted(ran) == sorted(f"job-{i}" for i in range(20))
    finally:
        await engine.dispose()


async def test_asyncpg_idle_async_runner_is_woken_by_notify(pg_url: URL) -> None:
    engine = asyncpg_engine(pg_url)
    started = asyncio.Event()

    async def handle(job: object) -> None:
        started.set()

    runner = AsyncRunner(engine, {"emails": handle}, poll_interval=SLOW_POLL)
    serving = asyncio.create_task(runner.run_forever(install_signal_handlers=False))
    try:
        await asyncio.sleep(1.5)  # the runner is idle, its listener connected
        new_session = async_sessionmaker(engine, expire_on_commit=False)
        async with new_session() as session:
            await async_enqueue(session, completed("wake-me"))
            await session.commit()
        await asyncio.wait_for(started.wait(), WAKE_WITHIN)
    finally:
        runner.stop()
        await asyncio.wait_for(serving, 30)
        job = await AsyncWatchdog(engine).read("wake-me")
        await engine.dispose()
    assert job is not None and job.outcome is Outcome.COMPLETED
