"""Durable steps (revision w0021): job.step, job.transaction_step, job.sleep.

A recorded step is never run again by a later attempt of its job (a retry, a
resumed sleep), its result comes back instead; a transactional step's writes
and record commit together; a sleep ends the attempt and the job resumes
after it. On both dialects, with Runner and AsyncRunner (plain and coroutine
handlers), and in process children.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import InvalidJob, Job, JobState, Outcome, RetryPolicy, RunningJob, Watchdog
from sqlalchemy_watchdog.core.durable import SleepRequested, StepNotRecorded
from sqlalchemy_watchdog.jobs import StepKind
from tests import process_handlers as h
from tests.conftest import make_async_engine
from tests.helpers import add, present, read
from tests.runner_kinds import RunnerDriver, dual

pytestmark = pytest.mark.dialect_neutral

RETRY = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=1), factor=1.0, jitter=0.0)


def _drain(runner: Any, engine: Engine, job_id: str, timeout: float = 20.0) -> Any:
    """Run ``runner`` until ``job_id`` settles (a retry's backoff or a sleep may keep it delayed a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        runner.run_until_idle()
        job = present(Watchdog(engine).read(job_id))
        if job.state is JobState.SETTLED or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


def test_a_recorded_step_is_not_run_again_by_a_retry_and_its_result_comes_back(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("j", "q", retry=RETRY))
    ran: list[str] = []

    def reserve() -> dict[str, int]:
        ran.append("reserve")
        return {"seat": 12}

    def plain(job: RunningJob) -> Any:
        a = job.step("reserve", reserve)
        b = job.step("charge", lambda: ran.append("charge") or "ch_1")  # type: ignore[func-returns-value]
        if job.attempt == 1:
            raise RuntimeError("the mailer is down")
        return {"a": a, "b": b}

    async def coroutine(job: RunningJob) -> Any:
        async def charge() -> str:
            ran.append("charge")
            return "ch_1"

        a = await job.step_async("reserve", reserve)
        b = await job.step_async("charge", charge)
        if job.attempt == 1:
            raise RuntimeError("the mailer is down")
        return {"a": a, "b": b}

    job = _drain(runners.runner({"q": dual(plain, coroutine)}), engine, "j")
    assert (job.outcome, job.attempt) == (Outcome.COMPLETED, 2), job.failure_reason
    assert ran == ["reserve", "charge"], "each step ran once, on the first attempt"
    assert job.result == {"a": {"seat": 12}, "b": "ch_1"}, "the second attempt got the recorded results"
    steps = Watchdog(engine).steps("j")
    assert [(s.name, s.kind, s.attempt) for s in steps] == [("reserve", StepKind.STEP, 1), ("charge", StepKind.STEP, 1)]


def _orders(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM app_orders")).scalar_one())


def test_a_transaction_steps_writes_and_its_record_commit_together(engine: Engine, runners: RunnerDriver) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE app_orders (id VARCHAR(20) PRIMARY KEY)"))
    add(engine, Job("j", "q", retry=RetryPolicy(max_attempts=4, backoff=timedelta(milliseconds=1), jitter=0.0)))
    charged: list[int] = []

    def plain(job: RunningJob) -> Any:
        def charge(session: Session) -> str:
            session.execute(text("INSERT INTO app_orders VALUES ('o-1')"))
            charged.append(job.attempt)
            if job.attempt == 1:
                raise RuntimeError("declined after the write: rolled back with it")
            return "o-1"

        with Session(engine) as session:
            order = job.transaction_step(session, "charge", charge, session)
        if job.attempt == 2:
            raise RuntimeError("a later step failed")
        return order

    async def coroutine(job: RunningJob) -> Any:
        aengine = make_async_engine(engine)
        try:

            async def charge(session: AsyncSession) -> str:
                await session.execute(text("INSERT INTO app_orders VALUES ('o-1')"))
                charged.append(job.attempt)
                if job.attempt == 1:
                    raise RuntimeError("declined after the write: rolled back with it")
                return "o-1"

            async with AsyncSession(aengine) as session:
                order = await job.transaction_step_async(session, "charge", charge, session)
        finally:
            await aengine.dispose()
        if job.attempt == 2:
            raise RuntimeError("a later step failed")
        return order

    job = _drain(runners.runner({"q": dual(plain, coroutine)}), engine, "j")
    assert (job.outcome, job.attempt, job.result) == (Outcome.COMPLETED, 3, "o-1"), job.failure_reason
    assert charged == [1, 2], "attempt 1's write was rolled back with it; attempt 3 found the step recorded"
    assert _orders(engine) == 1


def test_a_durable_sleep_ends_the_attempt_and_the_job_resumes_after_it(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("j", "q"))
    ran: list[str] = []

    def plain(job: RunningJob) -> str:
        job.step("before", lambda: ran.append("before"))
        job.sleep(timedelta(milliseconds=300))
        job.step("after", lambda: ran.append("after"))
        return "woke"

    async def coroutine(job: RunningJob) -> str:
        await job.step_async("before", lambda: ran.append("before"))
        await job.sleep_async(timedelta(milliseconds=300))
        await job.step_async("after", lambda: ran.append("after"))
        return "woke"

    runner = runners.runner({"q": dual(plain, coroutine)}, poll_interval=timedelta(milliseconds=50))
    runner.run_until_idle()
    asleep = read(engine, "j")
    assert asleep.state is JobState.DELAYED and asleep.snoozes == 1, "the attempt ended: its slot is free"
    job = _drain(runner, engine, "j")
    assert (job.outcome, job.result, job.attempt, job.snoozes) == (Outcome.COMPLETED, "woke", 1, 1)
    assert ran == ["before", "after"]
    (_, sleep, _) = Watchdog(engine).steps("j")
    assert sleep.kind is StepKind.SLEEP and sleep.wake_at is not None


def test_step_names_are_unique_and_a_result_json_cannot_hold_is_refused_before_it_is_recorded(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("twice", "q"), Job("unencodable", "q"), Job("empty", "q"))
    seen: dict[str, str | None] = {}

    def attempt(job: RunningJob, call: Any) -> None:
        try:
            call()
        except InvalidJob as refused:
            seen[job.job_id] = refused.field

    def plain(job: RunningJob) -> None:
        if job.job_id == "twice":
            job.step("once", lambda: 1)
            attempt(job, lambda: job.step("once", lambda: 2))
        elif job.job_id == "unencodable":
            attempt(job, lambda: job.step("set", lambda: {1, 2}))
        else:
            attempt(job, lambda: job.step("", lambda: 1))

    async def coroutine(job: RunningJob) -> None:
        async def call(name: str, fn: Any) -> None:
            try:
                await job.step_async(name, fn)
            except InvalidJob as refused:
                seen[job.job_id] = refused.field

        if job.job_id == "twice":
            await job.step_async("once", lambda: 1)
            await call("once", lambda: 2)
        elif job.job_id == "unencodable":
            await call("set", lambda: {1, 2})
        else:
            await call("", lambda: 1)

    runners.runner({"q": dual(plain, coroutine)}).run_until_idle()
    assert seen == {"twice": "name", "unencodable": "result", "empty": "name"}
    assert [s.name for s in Watchdog(engine).steps("twice")] == ["once"]
    assert Watchdog(engine).steps("unencodable") == [], "nothing recorded"


def test_a_step_whose_claim_is_gone_is_not_recorded_and_says_so(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("j", "q"))
    seen: list[str] = []

    def steal() -> None:
        with engine.begin() as conn:  # another runner's claim now (as after a lost lease)
            conn.execute(text("UPDATE watchdog_jobs SET claim_token = 'someone-else' WHERE job_id = 'j'"))

    def plain(job: RunningJob) -> None:
        try:
            job.step("charge", steal)
        except StepNotRecorded as lost:
            seen.append(lost.name)

    async def coroutine(job: RunningJob) -> None:
        try:
            await job.step_async("charge", steal)
        except StepNotRecorded as lost:
            seen.append(lost.name)

    runners.runner({"q": dual(plain, coroutine)}).tick()
    assert seen == ["charge"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM watchdog_job_steps")).scalar_one() == 0


def test_without_a_runner_a_step_just_runs_and_a_sleep_says_it_needs_one() -> None:
    from sqlalchemy_watchdog.core.handlers import StopSignal

    job = RunningJob("j", "q", "q", 0, None, 0, None, StopSignal())
    assert job.step("x", lambda n: n + 1, 1) == 2
    with pytest.raises(InvalidJob):
        job.step("", lambda: 1)
    with pytest.raises(RuntimeError, match="needs a runner"):
        job.sleep(timedelta(seconds=1))
    assert issubclass(SleepRequested, Exception)


@pytest.mark.parametrize("kind", ["process", "async-process"])
def test_steps_and_a_sleep_in_a_process_child_are_recorded_by_the_runner(
    engine: Engine, kind: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    add(engine, Job("j", "q", payload={"dir": str(marks), "sleep_ms": 200, "fail_first": True}, retry=RETRY))
    driver = RunnerDriver(kind, engine.url)
    try:
        runner = driver.runner({"q": h.durable}, poll_interval=timedelta(milliseconds=50), concurrency=1)
        job = _drain(runner, engine, "j", timeout=60)
    finally:
        driver.close()
    assert (job.outcome, job.result, job.snoozes) == (Outcome.COMPLETED, {"a": {"a": 1}, "b": 2}, 1), job.failure_reason
    assert len(h.marks(marks, "j", "a")) == 1 and len(h.marks(marks, "j", "b")) == 1, "each step ran once"
    assert [s.name for s in Watchdog(engine).steps("j")] == ["a", "sleep#0", "b"]


def test_show_and_the_dashboard_list_a_jobs_steps(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("j", "q"))

    def plain(job: RunningJob) -> None:
        job.step("reserve", lambda: "12C")

    async def coroutine(job: RunningJob) -> None:
        await job.step_async("reserve", lambda: "12C")

    runners.runner({"q": dual(plain, coroutine)}).run_until_idle()
    explained = present(Watchdog(engine).explain("j"))
    (step,) = explained.steps
    assert (step.name, step.kind, step.result, step.attempt) == ("reserve", StepKind.STEP, "12C", 1)
    from sqlalchemy_watchdog.cli.output import applies_dict, render_show

    shown = dict(line.split(None, 1) for line in render_show(explained).splitlines() if line and not line[0].isspace())
    assert shown["steps"].startswith("reserve (attempt 1, ")
    assert applies_dict(explained)["steps"][0]["result"] == "12C"
