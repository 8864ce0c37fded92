"""AsyncRunner does what Runner does, on ``sqlite+aiosqlite`` and ``postgresql+psycopg``.

Coroutine handlers run as tasks on the test's event loop; a cancellation, a
lane failure or the end of the shutdown grace cancels the task. Each test
makes its AsyncEngine inside its own loop and disposes of it at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from sqlalchemy_watchdog import (
    Decision,
    Job,
    JobState,
    JobView,
    Outcome,
    RunningJob,
    StopReason,
    TickStatus,
    store,
)
from sqlalchemy_watchdog.asyncio import AsyncRunner, AsyncWatchdog
from sqlalchemy_watchdog.jobs import FAILURE_REASON_MAX_LENGTH
from sqlalchemy_watchdog.model import jobs_table
from tests.conftest import make_async_engine

LEASE = timedelta(seconds=3)
HEARTBEAT = timedelta(seconds=1)
POLL = timedelta(milliseconds=100)
NO_POLICY = "Execution disappeared without a recovery policy"
SHUTDOWN_REASON = "Runner shut down while the job was running (its handler outlived the grace period)"


# -- helpers -------------------------------------------------------------------


@contextlib.asynccontextmanager
async def async_engine_of(engine: Engine) -> AsyncIterator[AsyncEngine]:
    aengine = make_async_engine(engine)
    try:
        yield aengine
    finally:
        await aengine.dispose()


async def wait_until(predicate: Callable[[], Awaitable[Any]], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def read(aengine: AsyncEngine, job_id: str) -> JobView:
    job = await AsyncWatchdog(aengine).read(job_id)
    assert job is not None, job_id
    return job


async def settled(aengine: AsyncEngine, job_id: str, timeout: float = 15.0) -> JobView:
    async def check() -> JobView | None:
        job = await read(aengine, job_id)
        return job if job.state is JobState.SETTLED else None

    return await wait_until(check, timeout, f"{job_id} to settle")  # type: ignore[no-any-return]


def runner(aengine: AsyncEngine, handlers: dict[str, Callable[[RunningJob], Any]], **kwargs: Any) -> AsyncRunner:
    kwargs.setdefault("lease", LEASE)
    kwargs.setdefault("heartbeat", HEARTBEAT)
    kwargs.setdefault("poll_interval", POLL)
    return AsyncRunner(aengine, handlers, **kwargs)


@contextlib.asynccontextmanager
async def serving(worker: AsyncRunner) -> AsyncIterator[asyncio.Task[None]]:
    """``worker.run_forever()`` as a task, stopped and awaited on exit."""
    task = asyncio.create_task(worker.run_forever(install_signal_handlers=False))
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def done(job: RunningJob) -> None:
    return None


class Blocking:
    """A coroutine handler (:attr:`handler`, an ``async def`` function) that
    signals it started, then sleeps until its task is cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled_with: list[StopReason | None] = []

        async def handler(job: RunningJob) -> None:
            self.started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled_with.append(job.stop_reason)
                raise

        self.handler = handler


# -- decisions -----------------------------------------------------------------


async def test_async_handler_decisions_settle_their_outcomes(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        await AsyncWatchdog(aengine).enqueue(
            [Job("none", "none"), Job("fail", "fail"), Job("unknown", "unknown"), Job("sync", "sync")]
        )

        async def fail(job: RunningJob) -> Decision:
            return Decision.failed("card declined")

        async def unknown(job: RunningJob) -> Decision:
            await asyncio.sleep(0)
            return Decision.outcome_unknown()

        def plain(job: RunningJob) -> None:  # a plain function runs in a thread
            return None

        worker = runner(aengine, {"none": done, "fail": fail, "unknown": unknown, "sync": plain})
        result = {j.job_id: (j.outcome, j.failure_reason) for j in await worker.run_until_idle()}
        assert result == {
            "none": (Outcome.COMPLETED, None),
            "fail": (Outcome.FAILED, "card declined"),
            "unknown": (Outcome.OUTCOME_UNKNOWN, None),
            "sync": (Outcome.COMPLETED, None),
        }
        assert (await read(aengine, "fail")).failure_reason == "card declined"


async def test_async_handler_exception_settles_failed_with_its_type_and_bounded_message(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        await AsyncWatchdog(aengine).enqueue([Job("short", "short"), Job("long", "long")])

        async def short(job: RunningJob) -> None:
            raise KeyError("order 42")

        async def long(job: RunningJob) -> None:
            raise RuntimeError("x" * 100_000)

        jobs = {j.job_id: j for j in await runner(aengine, {"short": short, "long": long}).run_until_idle()}
        assert jobs["short"].outcome is Outcome.FAILED
        assert "KeyError" in jobs["short"].failure_reason and "order 42" in jobs["short"].failure_reason  # type: ignore[operator]
        stored = (await read(aengine, "long")).failure_reason
        assert stored is not None and stored.startswith("RuntimeError")
        assert len(stored) <= FAILURE_REASON_MAX_LENGTH


async def test_async_handler_returning_something_else_settles_failed(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        await AsyncWatchdog(aengine).enqueue(Job("a", "q"))

        async def wrong(job: RunningJob) -> int:
            return 42

        (job,) = await runner(aengine, {"q": wrong}).run_until_idle()
        assert job.outcome is Outcome.FAILED
        assert job.failure_reason is not None and "int" in job.failure_reason


async def test_async_run_until_idle_returns_settled_jobs_in_priority_then_admission_order(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        watchdog = AsyncWatchdog(aengine)
        await watchdog.enqueue(
            [Job("a", "q"), Job("b", "q", priority=1), Job("c", "q"), Job("d", "q", priority=1),
             Job("e", "q", priority=2), Job("other", "not-served", priority=9)]
        )
        await watchdog.cancel("e", "stop-e")
        ran: list[str] = []

        async def record(job: RunningJob) -> None:
            ran.append(job.job_id)

        worker = runner(aengine, {"q": record})
        result = await worker.run_until_idle()
        assert [j.job_id for j in result] == ["e", "b", "d", "a", "c"]
        assert [j.outcome for j in result] == [Outcome.CANCELLED] + [Outcome.COMPLETED] * 4
        assert ran == ["b", "d", "a", "c"]
        assert (await read(aengine, "other")).state is JobState.QUEUED
        assert await worker.run_until_idle() == []
        assert (await worker.tick()).status is TickStatus.IDLE


# -- cancellation, lane failure, lost lease ------------------------------------


async def test_async_cancelling_a_running_job_cancels_its_task_and_settles_it_cancelled(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        watchdog = AsyncWatchdog(aengine)
        await watchdog.enqueue(Job("a", "q"))
        blocking = Blocking()
        async with serving(runner(aengine, {"q": blocking.handler})):
            await asyncio.wait_for(blocking.started.wait(), 15)
            assert (await watchdog.cancel("a", "stop-a")).status.value == "recorded"
            job = await settled(aengine, "a")
        assert blocking.cancelled_with == [StopReason.CANCELLED]
        assert (job.outcome, job.failure_reason) == (Outcome.CANCELLED, None)


@pytest.mark.parametrize("shape", ["async-call-object", "lambda-returning-a-coroutine"])
async def test_async_handler_of_any_shape_returning_a_coroutine_is_cancelled_like_a_coroutine_function(
    engine: Engine, shape: str
) -> None:
    """A class-based handler (``async def __call__``) or a lambda returning a
    coroutine is a coroutine handler too: a cancellation cancels it."""
    async with async_engine_of(engine) as aengine:
        watchdog = AsyncWatchdog(aengine)
        await watchdog.enqueue(Job("a", "q"))
        blocking = Blocking()

        class Handler:
            async def __call__(self, job: RunningJob) -> None:
                await blocking.handler(job)

        handler = Handler() if shape == "async-call-object" else (lambda job: blocking.handler(job))

        async def stopped() -> bool:
            return bool(blocking.cancelled_with)

        async with serving(runner(aengine, {"q": handler}, grace=timedelta(milliseconds=200))):
            await asyncio.wait_for(blocking.started.wait(), 15)
            await watchdog.cancel("a", "stop-a")
            await wait_until(stopped, timeout=4, what="the handler to be cancelled")
        assert blocking.cancelled_with == [StopReason.CANCELLED]
        assert (await settled(aengine, "a")).outcome is Outcome.CANCELLED


async def test_async_heartbeat_keeps_a_handler_running_longer_than_the_lease_alive(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        await AsyncWatchdog(aengine).enqueue(Job("a", "q"))
        leases: list[int] = []

        async def lease_until() -> int:
            async with aengine.connect() as conn:
                return int(await conn.scalar(select(jobs_table.c.lease_until).where(jobs_table.c.job_id == "a")))

        async def outlast(job: RunningJob) -> None:
            first = await lease_until()
            leases.append(first)

            async def past_first_lease() -> bool:
                async with aengine.connect() as conn:
                    return int(await conn.scalar(select(store.sql.db_clock_ms()))) > first + 500

            await wait_until(past_first_lease, what="the first lease to pass")
            leases.append(await lease_until())

        worker = runner(aengine, {"q": outlast}, lease=timedelta(milliseconds=1500), heartbeat=timedelta(milliseconds=500))
        (job,) = await worker.run_until_idle()
        assert job.outcome is Outcome.COMPLETED
        assert leases[1] > leases[0]


async def test_async_cancelling_a_queued_job_never_runs_its_handler(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        watchdog = AsyncWatchdog(aengine)
        await watchdog.enqueue(Job("a", "q"))
        await watchdog.cancel("a", "stop-a")
        ran: list[str] = []

        async def record(job: RunningJob) -> None:
            ran.append(job.job_id)

        assert [(j.job_id, j.outcome) for j in await runner(aengine, {"q": record}).run_until_idle()] == [
            ("a", Outcome.CANCELLED)
        ]
        assert ran == []


async def test_async_fail_lane_cancels_the_running_task_and_the_job_keeps_the_lane_failure(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        watchdog = AsyncWatchdog(aengine)
        await watchdog.enqueue([Job("a", "q", lane="provider-x"), Job("b", "q", lane="provider-x")])
        blocking = Blocking()
        async with serving(runner(aengine, {"q": blocking.handler})):
            await asyncio.wait_for(blocking.started.wait(), 15)
            result = await watchdog.fail_lane("provider-x", "provider x is down")
            assert (result.settled, result.more) == (2, False)

            async def stopped() -> bool:
                return bool(blocking.cancelled_with)

            await wait_until(stopped, what="the handler's task to be cancelled")
        assert blocking.cancelled_with == [StopReason.LANE_FAILED]
        for job_id in ("a", "b"):
            job = await read(aengine, job_id)
            assert (job.outcome, job.failure_reason) == (Outcome.FAILED, "provider x is down")


async def test_async_settle_after_the_lease_ran_out_is_rejected_and_the_job_stays_running(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        await AsyncWatchdog(aengine).enqueue(Job("a", "q"))
        offset = [0]
        snapshot: list[JobView] = []

        async def outlive_the_lease(job: RunningJob) -> None:
            offset[0] = 10 * 60 * 1000
            snapshot.append(await read(aengine, "a"))

        worker = runner(aengine, {"q": outlive_the_lease}, clock=lambda: store.now_ms() + offset[0])
        result = await worker.tick()
        assert result.status is TickStatus.REJECTED
        after = await read(aengine, "a")
        assert after == snapshot[0]
        assert (after.state, after.outcome) == (JobState.RUNNING, None)


async def test_async_probe_that_raises_leaves_the_expired_job_running_and_the_runner_goes_on(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        watchdog = AsyncWatchdog(aengine)
        await watchdog.enqueue(Job("external", "ext", max_recoveries=2))
        await store_call(aengine, store.claim, queues=["ext"], limit=1, lease_ms=1)
        await wait_until(lambda: store_call(aengine, store.expired_claims, limit=1), what="the lease to end")
        await watchdog.enqueue(Job("a", "q"))
        before = await read(aengine, "external")

        async def probe(job: JobView) -> bool:
            raise ConnectionError("orchestrator unreachable")

        worker = runner(aengine, {"q": done}, is_alive=probe)
        assert [(j.job_id, j.outcome) for j in await worker.run_until_idle()] == [("a", Outcome.COMPLETED)]
        assert (await worker.tick()).status is TickStatus.LIVENESS_UNKNOWN
        assert await read(aengine, "external") == before


async def store_call(aengine: AsyncEngine, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    from sqlalchemy_watchdog.asyncio import run_store

    return await run_store(aengine, fn, *args, **kwargs)


# -- wake-ups and shutdown -----------------------------------------------------


@pytest.mark.parametrize("dialect", ["postgresql"])  # LISTEN/NOTIFY is PostgreSQL's
async def test_async_notify_wakes_an_idle_runner_long_before_the_poll_interval(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        watchdog = AsyncWatchdog(aengine)

        async def listening() -> bool:
            async with aengine.connect() as conn:
                return bool(
                    await conn.scalar(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND query ILIKE 'LISTEN %'"
                        )
                    )
                )

        async with serving(runner(aengine, {"q": done}, poll_interval=timedelta(seconds=30))):
            await wait_until(listening, what="the runner to LISTEN")
            await watchdog.enqueue(Job("warm-up", "q"))
            await settled(aengine, "warm-up", timeout=10)
            await asyncio.sleep(0.3)  # let the loop go idle on its 30 s wait
            started = time.monotonic()
            await watchdog.enqueue(Job("a", "q"))
            job = await settled(aengine, "a", timeout=10)
            elapsed = time.monotonic() - started
        assert job.outcome is Outcome.COMPLETED
        assert elapsed < 5, f"took {elapsed:.1f}s with a 30 s poll interval"


async def test_async_handlers_finishing_together_share_settle_statements_and_each_settles_once(
    engine: Engine,
) -> None:
    """As the sync runner: settles waiting together are one statement and
    one commit, so ``concurrency=N`` does not need N connections to settle."""
    jobs = 16
    settles: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "settles" in statement:
            settles.append(statement)

    async with async_engine_of(engine) as aengine:
        await AsyncWatchdog(aengine).enqueue([Job(f"j{i}", "q") for i in range(jobs)])
        started = 0
        go = asyncio.Event()

        async def together(job: RunningJob) -> None:
            nonlocal started
            started += 1
            if started == jobs:
                go.set()
            await asyncio.wait_for(go.wait(), 15)

        event.listen(aengine.sync_engine, "before_cursor_execute", count)
        try:
            async with serving(runner(aengine, {"q": together}, concurrency=jobs)):
                finished = [await settled(aengine, f"j{i}", timeout=30) for i in range(jobs)]
        finally:
            event.remove(aengine.sync_engine, "before_cursor_execute", count)
    assert [j.outcome for j in finished] == [Outcome.COMPLETED] * jobs, [j.failure_reason for j in finished]
    assert 1 <= len(settles) < jobs


async def test_async_stop_lets_a_handler_finish_within_grace(engine: Engine) -> None:
    async with async_engine_of(engine) as aengine:
        await AsyncWatchdog(aengine).enqueue(Job("a", "q"))
        started = asyncio.Event()

        async def slow(job: RunningJob) -> None:
            started.set()
            await asyncio.sleep(0.5)

        async with serving(runner(aengine, {"q": slow}, grace=timedelta(seconds=10))):
            await asyncio.wait_for(started.wait(), 15)
        assert (await read(aengine, "a")).outcome is Outcome.COMPLETED


@pytest.mark.parametrize(
    ("max_recoveries", "state", "outcome"),
    [(1, JobState.QUEUED, None), (None, JobState.SETTLED, Outcome.INTERRUPTED)],
    ids=["requeued", "interrupted"],
)
async def test_async_stop_hands_a_job_still_running_after_grace_to_recovery_at_once(
    engine: Engine, max_recoveries: int | None, state: JobState, outcome: Outcome | None
) -> None:
    async with async_engine_of(engine) as aengine:
        await AsyncWatchdog(aengine).enqueue(Job("a", "q", max_recoveries=max_recoveries))
        blocking = Blocking()
        worker = runner(
            aengine, {"q": blocking.handler}, lease=timedelta(seconds=60), heartbeat=timedelta(seconds=5),
            grace=timedelta(milliseconds=200),
        )
        async with serving(worker):
            await asyncio.wait_for(blocking.started.wait(), 15)
        assert blocking.cancelled_with == [StopReason.SHUTDOWN]
        job = await read(aengine, "a")  # long before the 60 s lease would end
        assert (job.state, job.outcome) == (state, outcome)
        assert job.recovery_count == (1 if max_recoveries else 0)
        if outcome is not None:
            # The reason says the shutdown outlived its grace, not that the worker vanished.
            assert job.failure_reason == f"{SHUTDOWN_REASON}; no recovery policy"
