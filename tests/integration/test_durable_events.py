"""Events and compensation (revision w0022): job.wait_for / Watchdog.signal,
and job.step(..., undo=...).

A signal sent before the wait is kept for it; a wait with no signal ends the
attempt and the signal makes the job due at once; a wait whose timeout passed
raises WaitTimedOut (the job fails, not retried, unless the handler goes on);
a signal is idempotent, kept only for a live job, and part of the caller's
transaction in its session form. A job that fails for good runs the undos of
its recorded steps, last first, each once. On both dialects -- the signals and
waits on MariaDB too (with ``WATCHDOG_TEST_MYSQL_URL``; aiomysql there) --, with
Runner and AsyncRunner (plain and coroutine handlers), and in process children
for waits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, text
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import (
    InvalidJob,
    Job,
    JobState,
    Outcome,
    RetryPolicy,
    RunningJob,
    SignalStatus,
    TickStatus,
    Watchdog,
    signal_job,
    store,
)
from sqlalchemy_watchdog.core.durable import WaitTimedOut
from sqlalchemy_watchdog.jobs import StepKind
from sqlalchemy_watchdog.model import job_steps_table, jobs_table
from tests import process_handlers as h
from tests.conftest import WITH_MARIADB
from tests.helpers import add, present, read, wait_until
from tests.runner_kinds import RunnerDriver, dual

pytestmark = pytest.mark.dialect_neutral

#: The tests of signals and waits run on MariaDB too (with WATCHDOG_TEST_MYSQL_URL):
#: a signal is each backend's own SQL. The undos' tests stay on SQLite and
#: PostgreSQL: the steps they record are the conformance suite's on MariaDB.
ALSO_ON_MARIADB = pytest.mark.parametrize("dialect", WITH_MARIADB)


RETRY = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=1), factor=1.0, jitter=0.0)
HOUR = timedelta(hours=1)


def _drain(runner: Any, engine: Engine, job_id: str, timeout: float = 20.0) -> Any:
    """Run ``runner`` until ``job_id`` settles (a backoff, a sleep or a short wait may keep it delayed a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        runner.run_until_idle()
        job = present(Watchdog(engine).read(job_id))
        if job.state is JobState.SETTLED or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


def _approval(ran: list[str], timeout: timedelta = HOUR) -> Any:
    def plain(job: RunningJob) -> Any:
        job.step("draft", lambda: ran.append("draft"))
        approval = job.wait_for("approved", timeout=timeout)
        job.step("publish", lambda: ran.append("publish"))
        return approval

    async def coroutine(job: RunningJob) -> Any:
        await job.step_async("draft", lambda: ran.append("draft"))
        approval = await job.wait_for_async("approved", timeout=timeout)
        await job.step_async("publish", lambda: ran.append("publish"))
        return approval

    return dual(plain, coroutine)


@ALSO_ON_MARIADB
def test_a_signal_sent_before_the_wait_is_kept_and_the_wait_returns_it_at_once(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("j", "q"))
    assert Watchdog(engine).signal("j", "approved", {"by": "ann"}).status is SignalStatus.DELIVERED
    ran: list[str] = []
    runners.runner({"q": _approval(ran)}).run_until_idle()
    job = read(engine, "j")
    assert (job.outcome, job.result, job.snoozes) == (Outcome.COMPLETED, {"by": "ann"}, 0), job.failure_reason
    assert ran == ["draft", "publish"]
    kinds = [(s.name, s.kind) for s in Watchdog(engine).steps("j")]
    assert kinds == [("draft", StepKind.STEP), ("approved", StepKind.WAIT), ("publish", StepKind.STEP)]


@ALSO_ON_MARIADB
def test_a_waiting_job_sleeps_until_its_signal_makes_it_due_and_then_returns_the_payload(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("j", "q"))
    ran: list[str] = []
    runner = runners.runner({"q": _approval(ran)}, poll_interval=timedelta(milliseconds=50))
    runner.run_until_idle()
    waiting = read(engine, "j")
    assert (waiting.state, waiting.snoozes) == (JobState.DELAYED, 1), "the attempt ended; its slot is free"
    runner.run_until_idle()
    assert read(engine, "j").state is JobState.DELAYED, "no signal: it sleeps on (an hour)"
    assert Watchdog(engine).signal("j", "approved", {"by": "ann"}).status is SignalStatus.DELIVERED
    assert read(engine, "j").state is JobState.QUEUED, "the signal made it due now"
    job = _drain(runner, engine, "j")
    assert (job.outcome, job.result, job.attempt) == (Outcome.COMPLETED, {"by": "ann"}, 1), job.failure_reason
    assert ran == ["draft", "publish"], "the recorded step did not run again"


@ALSO_ON_MARIADB
def test_a_serving_runner_is_woken_by_the_signal_not_by_its_poll(engine: Engine, runners: RunnerDriver) -> None:
    """The signal wakes an idle runner (NOTIFY on PostgreSQL, this process's
    runners on SQLite): with an hour's poll interval and an hour's wait, the
    job completes with the payload soon after the signal."""
    add(engine, Job("j", "q"))
    runner = runners.runner({"q": _approval([])}, poll_interval=HOUR)
    with runner.serving():
        wait_until(lambda: read(engine, "j").state is JobState.DELAYED, timeout=30, what="the wait")
        Watchdog(engine).signal("j", "approved", {"by": "ann"})
        wait_until(lambda: read(engine, "j").state is JobState.SETTLED, timeout=30, what="the signal's wake-up")
    job = read(engine, "j")
    assert (job.outcome, job.result) == (Outcome.COMPLETED, {"by": "ann"}), job.failure_reason


@ALSO_ON_MARIADB
def test_a_wait_whose_timeout_passed_raises_wait_timed_out_and_fails_the_job_without_a_retry(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("j", "q", retry=RETRY), Job("caught", "q", retry=RETRY))
    short = timedelta(milliseconds=300)

    def plain(job: RunningJob) -> Any:
        try:
            return job.wait_for("approved", timeout=short)
        except WaitTimedOut:
            if job.job_id == "caught":
                return "escalated"
            raise

    async def coroutine(job: RunningJob) -> Any:
        try:
            return await job.wait_for_async("approved", timeout=short)
        except WaitTimedOut:
            if job.job_id == "caught":
                return "escalated"
            raise

    runner = runners.runner({"q": dual(plain, coroutine)}, poll_interval=timedelta(milliseconds=50))
    failed = _drain(runner, engine, "j")
    caught = _drain(runner, engine, "caught")
    assert (failed.outcome, failed.attempt) == (Outcome.FAILED, 1), "a timed-out wait is not retried"
    assert "no signal 'approved' came before the wait's timeout" in (failed.failure_reason or "")
    assert (caught.outcome, caught.result) == (Outcome.COMPLETED, "escalated")
    assert Watchdog(engine).signal("caught", "approved", 1).status is SignalStatus.JOB_SETTLED


@ALSO_ON_MARIADB
def test_a_signal_is_idempotent_and_a_different_repeat_keeps_the_first(engine: Engine) -> None:
    add(engine, Job("j", "q"))
    watchdog = Watchdog(engine)
    first = watchdog.signal("j", "approved", {"by": "ann"})
    assert (first.status, first.kept) == (SignalStatus.DELIVERED, True)
    assert watchdog.signal("j", "approved", {"by": "ann"}).status is SignalStatus.DUPLICATE
    conflict = watchdog.signal("j", "approved", {"by": "bob"})
    assert (conflict.status, conflict.payload_json) == (SignalStatus.CONFLICT, '{"by":"ann"}')
    assert [(s.name, s.payload) for s in watchdog.signals("j")] == [("approved", {"by": "ann"})]


@ALSO_ON_MARIADB
def test_a_settled_or_unknown_job_keeps_no_signal(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("j", "q"))
    runners.runner({"q": lambda job: None}).run_until_idle()
    watchdog = Watchdog(engine)
    assert watchdog.signal("j", "approved").status is SignalStatus.JOB_SETTLED
    assert watchdog.signal("nobody", "approved").status is SignalStatus.NO_SUCH_JOB
    assert watchdog.signals("j") == []


@ALSO_ON_MARIADB
def test_a_signal_in_the_callers_transaction_is_kept_only_when_it_commits(engine: Engine) -> None:
    add(engine, Job("j", "q"))
    with Session(engine) as session:
        assert signal_job(session, "j", "approved", 1).status is SignalStatus.DELIVERED
        session.rollback()
    assert Watchdog(engine).signals("j") == [], "rolled back with the caller's transaction"
    with Session(engine) as session:
        signal_job(session, "j", "approved", 2)
        session.commit()
    assert [s.payload for s in Watchdog(engine).signals("j")] == [2]


@ALSO_ON_MARIADB
async def test_the_async_api_signals_too_in_its_own_and_in_the_callers_transaction(engine: Engine) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    from sqlalchemy_watchdog.asyncio import AsyncWatchdog
    from sqlalchemy_watchdog.asyncio import signal_job as signal_job_async
    from tests.conftest import make_async_engine

    add(engine, Job("j", "q"))
    aengine = make_async_engine(engine)
    try:
        watchdog = AsyncWatchdog(aengine)
        assert (await watchdog.signal("j", "approved", 1)).status is SignalStatus.DELIVERED
        async with AsyncSession(aengine) as session:
            assert (await signal_job_async(session, "j", "shipped", 2)).status is SignalStatus.DELIVERED
            await session.rollback()
        assert [(s.name, s.payload) for s in await watchdog.signals("j")] == [("approved", 1)]
    finally:
        await aengine.dispose()


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda w: w.signal("j", "", 1), "name"),
        (lambda w: w.signal("j", "x" * 257, 1), "name"),
        (lambda w: w.signal("j", "approved", {1, 2}), "payload"),
        (lambda w: w.signal("", "approved", 1), "job_id"),
    ],
)
def test_bad_signals_are_refused_by_name_before_anything_is_kept(engine: Engine, call: Any, field: str) -> None:
    add(engine, Job("j", "q"))
    with pytest.raises(InvalidJob) as refused:
        call(Watchdog(engine))
    assert refused.value.field == field
    assert Watchdog(engine).signals("j") == []


def _saga(undone: list[tuple[str, Any]], fail_undo: str | None = None) -> Any:
    def undo(name: str) -> Any:
        def run(result: Any) -> None:
            if name == fail_undo:
                raise RuntimeError(f"cannot undo {name}")
            undone.append((name, result))

        return run

    def plain(job: RunningJob) -> None:
        job.step("reserve", lambda: {"seat": 12}, undo=undo("reserve"))
        job.step("audit", lambda: "logged")  # no undo
        job.step("charge", lambda: "ch_1", undo=undo("charge"))
        if job.attempt == 1:
            raise RuntimeError("a retry follows: nothing is undone yet")
        job.step("ship", lambda: 1 / 0, undo=undo("ship"))  # raised: never recorded, never undone

    async def coroutine(job: RunningJob) -> None:
        async def charge() -> str:
            return "ch_1"

        async def undo_charge(result: Any) -> None:
            undo("charge")(result)

        await job.step_async("reserve", lambda: {"seat": 12}, undo=undo("reserve"))
        await job.step_async("audit", lambda: "logged")
        await job.step_async("charge", charge, undo=undo_charge)
        if job.attempt == 1:
            raise RuntimeError("a retry follows: nothing is undone yet")
        await job.step_async("ship", lambda: 1 / 0, undo=undo("ship"))

    return dual(plain, coroutine)


def test_a_job_that_fails_for_good_undoes_its_recorded_steps_last_first_each_once(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("j", "q", retry=RetryPolicy(max_attempts=2, backoff=timedelta(milliseconds=1), jitter=0.0)))
    undone: list[tuple[str, Any]] = []
    job = _drain(runners.runner({"q": _saga(undone)}), engine, "j")
    assert (job.outcome, job.attempt) == (Outcome.FAILED, 2)
    assert undone == [("charge", "ch_1"), ("reserve", {"seat": 12})], "last first, with each step's result"
    assert "compensated: undid 'charge', 'reserve'" in (job.failure_reason or "")
    steps = [(s.name, s.kind) for s in Watchdog(engine).steps("j")]
    assert steps[-2:] == [("undo:charge", StepKind.UNDO), ("undo:reserve", StepKind.UNDO)]


def test_an_undo_that_raises_stops_the_compensation_and_the_job_says_so(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("j", "q", retry=RetryPolicy(max_attempts=2, backoff=timedelta(milliseconds=1), jitter=0.0)))
    undone: list[tuple[str, Any]] = []
    job = _drain(runners.runner({"q": _saga(undone, fail_undo="charge")}), engine, "j")
    assert job.outcome is Outcome.FAILED and undone == [], "stopped at the first undo"
    assert "compensation stopped: the undo of step 'charge' raised RuntimeError" in (job.failure_reason or "")
    assert [s.name for s in Watchdog(engine).steps("j") if s.kind is StepKind.UNDO] == []


def _recorded_before(engine: Engine, job_id: str, *steps: tuple[str, str, str | None]) -> None:
    """Record ``(name, kind, result_json)`` steps of ``job_id`` as an earlier
    run would have (attempt 1): that run then crashed, its job requeued."""
    with engine.begin() as conn:
        sequence = conn.execute(select(jobs_table.c.sequence).where(jobs_table.c.job_id == job_id)).scalar_one()
        conn.execute(
            insert(job_steps_table),
            [
                {"job_sequence": sequence, "job_id": job_id, "name": name, "kind": kind, "result_json": result,
                 "wake_at": None, "attempt": 1, "recorded_at": 0}
                for name, kind, result in steps
            ],
        )  # fmt: skip


def test_a_run_that_finishes_an_earlier_compensation_runs_no_new_step_and_undoes_the_rest(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """An earlier run recorded steps A and B, failed for good and recorded
    B's undo, then crashed. The next run passes A and B, stops at C (never
    run: a run that compensates does no new work), undoes A only, and the
    job fails saying it compensated -- not why C stopped -- in an ERROR line
    that does not say its handler decided the failure (it decided nothing)."""
    caplog.set_level(logging.INFO, logger="sqlalchemy_watchdog")
    add(engine, Job("j", "q"))
    _recorded_before(engine, "j", ("A", "step", '"a"'), ("B", "step", '"b"'), ("undo:B", "undo", None))
    ran: list[str] = []

    def plain(job: RunningJob) -> None:
        job.step("A", lambda: ran.append("A"), undo=lambda a: ran.append(f"undo {a}"))
        job.step("B", lambda: ran.append("B"), undo=lambda b: ran.append(f"undo {b}"))
        job.step("C", lambda: ran.append("C"), undo=lambda c: ran.append(f"undo {c}"))
        job.sleep(timedelta(hours=1))

    async def coroutine(job: RunningJob) -> None:
        await job.step_async("A", lambda: ran.append("A"), undo=lambda a: ran.append(f"undo {a}"))
        await job.step_async("B", lambda: ran.append("B"), undo=lambda b: ran.append(f"undo {b}"))
        await job.step_async("C", lambda: ran.append("C"), undo=lambda c: ran.append(f"undo {c}"))
        await job.sleep_async(timedelta(hours=1))

    job = _drain(runners.runner({"q": dual(plain, coroutine)}), engine, "j")
    assert ran == ["undo a"], "no new step ran; only the undo not recorded yet"
    assert job.outcome is Outcome.FAILED
    assert job.failure_reason == "compensation began in an earlier run; compensated: undid 'A'"
    assert job.failure_detail is None, "the stop at C is no failure of the handler's"
    # The listing orders the rows of one millisecond by name: the undos' order is ``undone``'s.
    assert sorted(s.name for s in Watchdog(engine).steps("j")) == ["A", "B", "undo:A", "undo:B"]
    (line,) = [r for r in caplog.records if "the job failed" in r.getMessage()]
    assert line.levelno == logging.ERROR and "as its handler decided" not in line.getMessage(), line.getMessage()


@pytest.mark.parametrize("new_work", ["sleep", "wait", "recorded sleep", "recorded wait"])
def test_a_run_that_finishes_an_earlier_compensation_neither_sleeps_nor_waits_anew(
    engine: Engine, runners: RunnerDriver, new_work: str
) -> None:
    """Nor on: a recorded sleep whose end has not come, or a recorded wait
    with no signal before its timeout, stops it too (no snooze first)."""
    add(engine, Job("j", "q"))
    _recorded_before(engine, "j", ("A", "step", '"a"'), ("undo:A", "undo", None))
    if new_work.startswith("recorded"):
        later = int(time.time() * 1000) + 3_600_000
        name = "sleep#0" if new_work == "recorded sleep" else "approved"
        with engine.begin() as conn:
            sequence = conn.execute(select(jobs_table.c.sequence).where(jobs_table.c.job_id == "j")).scalar_one()
            conn.execute(
                insert(job_steps_table).values(
                    job_sequence=sequence, job_id="j", name=name, kind=new_work.split()[1], result_json=None,
                    wake_at=later, attempt=1, recorded_at=1,
                )
            )  # fmt: skip
    undone: list[str] = []

    def plain(job: RunningJob) -> None:
        job.step("A", lambda: "a", undo=undone.append)
        if new_work.endswith("sleep"):
            job.sleep(timedelta(hours=1))
        else:
            job.wait_for("approved", timeout=HOUR)

    async def coroutine(job: RunningJob) -> None:
        await job.step_async("A", lambda: "a", undo=undone.append)
        if new_work.endswith("sleep"):
            await job.sleep_async(timedelta(hours=1))
        else:
            await job.wait_for_async("approved", timeout=HOUR)

    job = _drain(runners.runner({"q": dual(plain, coroutine)}), engine, "j")
    assert (job.outcome, job.snoozes, undone) == (Outcome.FAILED, 0, []), "failed at once, A undone already"
    assert job.failure_reason == "compensation began in an earlier run"
    assert [s.name for s in Watchdog(engine).steps("j")][:2] == ["A", "undo:A"]
    assert len(Watchdog(engine).steps("j")) == (3 if new_work.startswith("recorded") else 2), "nothing recorded"


def test_a_handler_that_swallows_the_stop_of_a_compensating_run_still_fails_compensated(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("j", "q"))
    _recorded_before(engine, "j", ("A", "step", '"a"'), ("B", "step", '"b"'), ("undo:B", "undo", None))
    undone: list[str] = []

    def plain(job: RunningJob) -> str:
        job.step("A", lambda: "a", undo=undone.append)
        try:
            job.step("C", lambda: undone.append("C ran"))
        except Exception:
            pass
        return "done anyway"

    async def coroutine(job: RunningJob) -> str:
        await job.step_async("A", lambda: "a", undo=undone.append)
        try:
            await job.step_async("C", lambda: undone.append("C ran"))
        except Exception:
            pass
        return "done anyway"

    job = _drain(runners.runner({"q": dual(plain, coroutine)}), engine, "j")
    assert (job.outcome, job.result, undone) == (Outcome.FAILED, None, ["a"])
    assert job.failure_reason == "compensation began in an earlier run; compensated: undid 'A'"


def _stalled_saga(undone: list[Any]) -> Any:
    """Steps A and B (each with an undo), then a stall until the runner stops
    the handler: a function waits for its stop and returns, a coroutine
    sleeps until its task is cancelled. Later attempts return at once."""

    def plain(job: RunningJob) -> None:
        job.step("A", lambda: "a", undo=undone.append)
        job.step("B", lambda: "b", undo=undone.append)
        if job.attempt == 1:
            job.stop_requested.wait(10)

    async def coroutine(job: RunningJob) -> None:
        await job.step_async("A", lambda: "a", undo=undone.append)
        await job.step_async("B", lambda: "b", undo=undone.append)
        if job.attempt == 1:
            await asyncio.sleep(10)

    return dual(plain, coroutine)


STOPPING: dict[str, Any] = {"lease": timedelta(seconds=3), "heartbeat": timedelta(milliseconds=200)}


def test_a_job_that_times_out_on_its_last_attempt_runs_the_undos_of_its_steps(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("j", "q", timeout=timedelta(milliseconds=200)))
    undone: list[Any] = []
    job = _drain(runners.runner({"q": _stalled_saga(undone)}, **STOPPING), engine, "j")
    assert (job.outcome, undone) == (Outcome.FAILED, ["b", "a"]), "last step first"
    assert job.failure_reason == "timed out after 0.2s; compensated: undid 'B', 'A'"
    # The listing orders the rows of one millisecond by name: the undos' order is ``undone``'s.
    assert sorted(s.name for s in Watchdog(engine).steps("j")) == ["A", "B", "undo:A", "undo:B"]


def test_a_serving_runner_compensates_a_timed_out_last_attempt_too(engine: Engine, runners: RunnerDriver) -> None:
    """Under ``run_forever`` a coroutine handler runs in its execution's own
    task, which the timeout cancels: the undos still run there after it."""
    add(engine, Job("j", "q", timeout=timedelta(milliseconds=200)))
    undone: list[Any] = []
    runner = runners.runner({"q": _stalled_saga(undone)}, **STOPPING, poll_interval=timedelta(milliseconds=50))
    with runner.serving():
        wait_until(lambda: read(engine, "j").state is JobState.SETTLED, what="the job to settle")
    job = read(engine, "j")
    assert (job.outcome, undone) == (Outcome.FAILED, ["b", "a"])
    assert job.failure_reason == "timed out after 0.2s; compensated: undid 'B', 'A'"


def test_a_timeout_followed_by_a_retry_undoes_nothing(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("j", "q", timeout=timedelta(milliseconds=200), retry=RETRY))
    undone: list[Any] = []
    job = _drain(runners.runner({"q": _stalled_saga(undone)}, **STOPPING), engine, "j")
    assert (job.outcome, job.attempt, undone) == (Outcome.COMPLETED, 2, [])
    assert [e.reason for e in job.failure_history] == ["timed out after 0.2s"]


def test_a_cancelled_job_undoes_nothing(engine: Engine, runners: RunnerDriver) -> None:
    """A cancellation is no failure: the job ends ``cancelled``, its steps kept as they are."""
    add(engine, Job("j", "q"))
    undone: list[Any] = []
    with runners.runner({"q": _stalled_saga(undone)}, **STOPPING, poll_interval=timedelta(milliseconds=50)).serving():
        wait_until(lambda: len(Watchdog(engine).steps("j")) == 2, what="steps A and B")
        Watchdog(engine).cancel("j", "stop-j")
        wait_until(lambda: read(engine, "j").state is JobState.SETTLED, what="the cancellation")
    assert (read(engine, "j").outcome, undone) == (Outcome.CANCELLED, [])
    assert [s.name for s in Watchdog(engine).steps("j")] == ["A", "B"]


@pytest.mark.parametrize("runner_kind", ["sync", "async"])  # a plain handler: in a thread on both
def test_a_handler_that_outlives_its_timeout_and_its_lease_undoes_nothing_under_the_lost_claim(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The heartbeat stops renewing a timed-out claim; a handler that goes
    on past the lease may have been recovered and run elsewhere meanwhile:
    its runner renews the claim before the undos run, finds it gone, and
    leaves the job to recovery (its settle refused) -- no undo runs there."""
    add(engine, Job("j", "q", timeout=timedelta(milliseconds=100)))
    undone: list[Any] = []

    def stubborn(job: RunningJob) -> None:
        job.step("A", lambda: "a", undo=undone.append)
        job.stop_requested.wait(10)
        time.sleep(1.6)  # past the 1 s lease, counted from the timeout's stop at the latest

    result = runners.runner({"q": stubborn}, lease=timedelta(seconds=1), heartbeat=timedelta(milliseconds=200)).tick()
    assert result.status is TickStatus.REJECTED
    assert undone == []
    assert read(engine, "j").state is JobState.RUNNING, "left to recovery"


@pytest.mark.parametrize("runner_kind", ["sync", "async"])  # a plain handler: in a thread on both
def test_the_undos_after_a_timeout_may_outlast_the_lease_the_heartbeat_renews_the_claim_again(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("j", "q", timeout=timedelta(milliseconds=100)))
    undone: list[Any] = []

    def slowly(result: Any) -> None:
        time.sleep(1.2)  # the two undos take longer than the 2 s lease
        undone.append(result)

    def handler(job: RunningJob) -> None:
        job.step("A", lambda: "a", undo=slowly)
        job.step("B", lambda: "b", undo=slowly)
        job.stop_requested.wait(10)

    runner = runners.runner({"q": handler}, lease=timedelta(seconds=2), heartbeat=timedelta(milliseconds=200))
    result = runner.tick()
    assert result.status is TickStatus.SETTLED and result.job is not None
    assert (result.job.outcome, undone) == (Outcome.FAILED, ["b", "a"])
    assert result.job.failure_reason == "timed out after 0.1s; compensated: undid 'B', 'A'"


def _vanished(engine: Engine, job_id: str, *steps: str) -> store.Claim:
    """A runner claimed ``job_id``, recorded ``steps`` (results: the names
    lowercased) and vanished: its lease ended."""
    with store.write_transaction(engine) as conn:
        [taken] = store.claim(conn, queues=["q"], limit=1, lease_ms=60_000).claimed
        for name in steps:
            assert store.record_step(
                conn, job_id, taken.token, name, kind=StepKind.STEP, result_json=f'"{name.lower()}"', delay_ms=None,
                attempt=taken.job.attempt,
            ) is not None  # fmt: skip
        store.release(conn, [(job_id, taken.token)])
    return taken


def _saga_ab(ran: list[str]) -> Any:
    def plain(job: RunningJob) -> None:
        job.step("A", lambda: ran.append("A"), undo=lambda a: ran.append(f"undo {a}"))
        job.step("B", lambda: ran.append("B"), undo=lambda b: ran.append(f"undo {b}"))
        job.step("C", lambda: ran.append("C"), undo=lambda c: ran.append(f"undo {c}"))

    async def coroutine(job: RunningJob) -> None:
        await job.step_async("A", lambda: ran.append("A"), undo=lambda a: ran.append(f"undo {a}"))
        await job.step_async("B", lambda: ran.append("B"), undo=lambda b: ran.append(f"undo {b}"))
        await job.step_async("C", lambda: ran.append("C"), undo=lambda c: ran.append(f"undo {c}"))

    return dual(plain, coroutine)


@pytest.mark.parametrize("max_recoveries", [None, 0])
def test_a_job_recovery_would_settle_interrupted_runs_once_more_to_undo_its_recorded_steps(
    engine: Engine, runners: RunnerDriver, max_recoveries: int | None
) -> None:
    """Its runner vanished after steps A and B, its recovery budget spent:
    recovery requeues it (its reason kept, the ``undo:`` marker recorded in
    the same transaction) for one run that passes A and B, runs no new step,
    undoes B then A, and fails saying both."""
    add(engine, Job("j", "q", max_recoveries=max_recoveries))
    _vanished(engine, "j", "A", "B")
    ran: list[str] = []
    job = _drain(runners.runner({"q": _saga_ab(ran)}), engine, "j")
    assert ran == ["undo b", "undo a"], "no step ran again, C never; the undos last first"
    recovered = "Execution disappeared without a recovery policy" if max_recoveries is None else (
        "Restart recovery budget exhausted (0 recoveries)"
    )  # fmt: skip
    assert (job.outcome, job.recovery_count, job.attempt) == (Outcome.FAILED, 0, 1), "no recovery counted"
    assert job.failure_reason == f"{recovered}; compensated: undid 'B', 'A'"
    assert [(s.name, s.kind) for s in Watchdog(engine).steps("j")][2:] == [
        ("undo:", StepKind.UNDO), ("undo:B", StepKind.UNDO), ("undo:A", StepKind.UNDO),
    ]  # fmt: skip
    from sqlalchemy_watchdog.cli.output import render_show

    shown = render_show(present(Watchdog(engine).explain("j")))
    assert "undo: (recovery asked for a compensating run, attempt 1," in shown
    assert "undo:B (undone, attempt 1," in shown


def test_a_job_requeued_to_compensate_ends_failed_even_if_its_handler_never_reaches_a_step(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("j", "q"))
    _vanished(engine, "j", "A")
    job = _drain(runners.runner({"q": dual(lambda job: "done", _returns_done)}), engine, "j")
    assert (job.outcome, job.result) == (Outcome.FAILED, None)
    assert job.failure_reason == "Execution disappeared without a recovery policy"


async def _returns_done(job: RunningJob) -> str:
    return "done"


@pytest.mark.parametrize("kind", ["process", "async-process"])
def test_a_job_requeued_to_compensate_in_a_process_child_runs_no_new_step_and_fails(
    engine: Engine, kind: str, tmp_path: Path
) -> None:
    """A handler in a child names no undo: nothing is undone, but the run
    still does no new step (the runner refuses it) and the job fails, not
    retried, with recovery's reason."""
    add(engine, Job("j", "q", payload={"dir": str(tmp_path)}, retry=RETRY))
    _vanished(engine, "j", "a")
    driver = RunnerDriver(kind, engine.url)
    try:
        runner = driver.runner({"q": h.durable}, poll_interval=timedelta(milliseconds=50), concurrency=1)
        job = _drain(runner, engine, "j", timeout=60)
    finally:
        driver.close()
    assert (job.outcome, job.attempt) == (Outcome.FAILED, 1)
    assert job.failure_reason == "Execution disappeared without a recovery policy"
    assert h.marks(tmp_path, "j", "a") == [] and h.marks(tmp_path, "j", "b") == [], "no step ran"
    assert [s.name for s in Watchdog(engine).steps("j")] == ["a", "undo:"]


def _in_child(engine: Engine, kind: str, handler: Any, job_id: str, **options: Any) -> Any:
    driver = RunnerDriver(kind, engine.url)
    try:
        runner = driver.runner({"q": handler}, poll_interval=timedelta(milliseconds=50), concurrency=1, **options)
        return _drain(runner, engine, job_id, timeout=60)
    finally:
        driver.close()


def _undone(directory: Path) -> dict[str, tuple[int, float]]:
    """The undo marks :func:`tests.process_handlers.undo_booking` left: their pid and time."""
    found = {}
    for path in directory.glob("undo-*"):
        pid, at = path.read_text().split()
        found[path.name.removeprefix("undo-")] = (int(pid), float(at))
    return found


@pytest.mark.parametrize("kind", ["process", "async-process"])
def test_a_process_childs_steps_name_undos_that_the_runner_runs_last_first_when_the_job_fails_for_good(
    engine: Engine, kind: str, tmp_path: Path
) -> None:
    """The child sends each undo by reference; the runner records the steps,
    and once the job fails with no retry left runs the undos in its own
    process, last step first, each recorded once."""
    add(engine, Job("saga", "q", payload={"dir": str(tmp_path)}))
    job = _in_child(engine, kind, h.saga, "saga")
    assert (job.outcome, job.attempt) == (Outcome.FAILED, 1)
    assert job.failure_reason == "RuntimeError: declined; compensated: undid 'charge', 'reserve'"
    undone = _undone(tmp_path)
    assert set(undone) == {"charge", "reserve"} and undone["charge"][1] <= undone["reserve"][1]
    assert {pid for pid, _ in undone.values()} == {os.getpid()}, "the undos ran in the runner's process"
    # The listing orders the rows of one millisecond by name: the undos' order is their marks'.
    steps = Watchdog(engine).steps("saga")
    assert sorted((s.name, s.kind) for s in steps) == [
        ("charge", StepKind.STEP), ("reserve", StepKind.STEP),
        ("undo:charge", StepKind.UNDO), ("undo:reserve", StepKind.UNDO),
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["process", "async-process"])
def test_a_process_child_killed_at_the_timeout_of_its_last_attempt_is_compensated_by_the_runner(
    engine: Engine, kind: str, tmp_path: Path
) -> None:
    add(engine, Job("late", "q", payload={"dir": str(tmp_path), "timeout_sleep": 30}, timeout=timedelta(seconds=1)))
    job = _in_child(engine, kind, h.saga, "late")
    assert job.outcome is Outcome.FAILED
    assert job.failure_reason == (
        "killed after timeout (timed out after 1s, then 1s to stop); compensated: undid 'charge', 'reserve'"
    )
    assert set(_undone(tmp_path)) == {"charge", "reserve"}


@pytest.mark.parametrize("kind", ["process", "async-process"])
def test_a_process_child_requeued_to_compensate_undoes_the_steps_an_earlier_run_recorded(
    engine: Engine, kind: str, tmp_path: Path
) -> None:
    """Recovery requeues a vanished run with a recorded step (its budget
    spent): the child's handler passes that step (its undo sent again), runs
    no new one, and the runner undoes it."""
    add(engine, Job("resumed", "q", payload={"dir": str(tmp_path)}))
    with store.write_transaction(engine) as conn:
        [taken] = store.claim(conn, queues=["q"], limit=1, lease_ms=60_000).claimed
        result = json.dumps({"dir": str(tmp_path), "what": "reserve"})
        assert store.record_step(
            conn, "resumed", taken.token, "reserve", kind=StepKind.STEP, result_json=result, delay_ms=None,
            attempt=taken.job.attempt,
        ) is not None  # fmt: skip
        store.release(conn, [("resumed", taken.token)])
    job = _in_child(engine, kind, h.saga, "resumed")
    assert job.outcome is Outcome.FAILED
    assert job.failure_reason == "Execution disappeared without a recovery policy; compensated: undid 'reserve'"
    assert set(_undone(tmp_path)) == {"reserve"}, "charge, a new step, never ran"
    assert [s.name for s in Watchdog(engine).steps("resumed")] == ["reserve", "undo:", "undo:reserve"]


@pytest.mark.parametrize("kind", ["process", "async-process"])
def test_a_process_childs_undo_must_be_a_plain_module_level_function(engine: Engine, kind: str, tmp_path: Path) -> None:
    """A lambda cannot be sent by reference, a coroutine function is not
    called by the runner: each refused at its step, naming ``undo``, and the
    step does not run."""
    add(engine, Job("refused", "q", payload={"dir": str(tmp_path)}))
    job = _in_child(engine, kind, h.undo_refused, "refused")
    assert job.outcome is Outcome.COMPLETED
    result = job.result
    assert result["ran"] == [], "neither step ran"
    assert result["lambda"][0] == "undo" and "module-level function" in result["lambda"][1]
    assert result["coroutine"][0] == "undo" and "plain function" in result["coroutine"][1]
    assert Watchdog(engine).steps("refused") == [], "nothing recorded"


def test_recovery_requeues_a_job_to_compensate_once_and_only_for_a_vanished_claim_with_steps(engine: Engine) -> None:
    """Once: the compensating run vanishing too settles ``interrupted``. A
    job without steps, or one a shutdown gave up (no failure), settles
    ``interrupted`` as before. A cancelled one settles ``cancelled``."""
    add(engine, Job("twice", "q"))
    first = _vanished(engine, "twice", "A")
    with store.write_transaction(engine) as conn:
        recovery = store.reconcile(conn, first)
        assert (recovery.status, recovery.compensating) == (store.RecoveryStatus.REQUEUED, True)
        assert store.reconcile(conn, first).status is store.RecoveryStatus.LOST_RACE, "one statement, guarded"
    second = _vanished(engine, "twice")
    with store.write_transaction(engine) as conn:
        assert store.reconcile(conn, second).status is store.RecoveryStatus.SETTLED
    assert read(engine, "twice").outcome is Outcome.INTERRUPTED
    assert [s.name for s in Watchdog(engine).steps("twice")] == ["A", "undo:"]

    for job_id in ("plain", "shutdown", "cancelled"):
        add(engine, Job(job_id, "q"))
        taken = _vanished(engine, job_id, *([] if job_id == "plain" else ["A"]))
        if job_id == "cancelled":
            Watchdog(engine).cancel(job_id, "stop")
        with store.write_transaction(engine) as conn:
            cause = store.RecoveryCause.SHUTDOWN if job_id == "shutdown" else store.RecoveryCause.VANISHED
            assert store.reconcile(conn, taken, cause=cause).status is store.RecoveryStatus.SETTLED
        expected = Outcome.CANCELLED if job_id == "cancelled" else Outcome.INTERRUPTED
        assert read(engine, job_id).outcome is expected
        assert all(s.kind is StepKind.STEP for s in Watchdog(engine).steps(job_id)), "no marker"


def test_an_undo_must_be_callable_and_leave_room_for_its_name(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("not-callable", "q"), Job("long", "q"))
    seen: dict[str, str | None] = {}

    def plain(job: RunningJob) -> None:
        name, undo = ("x", "release") if job.job_id == "not-callable" else ("y" * 252, print)
        try:
            job.step(name, lambda: 1, undo=undo)  # type: ignore[arg-type]
        except InvalidJob as refused:
            seen[job.job_id] = refused.field

    async def coroutine(job: RunningJob) -> None:
        name, undo = ("x", "release") if job.job_id == "not-callable" else ("y" * 252, print)
        try:
            await job.step_async(name, lambda: 1, undo=undo)  # type: ignore[arg-type]
        except InvalidJob as refused:
            seen[job.job_id] = refused.field

    runners.runner({"q": dual(plain, coroutine)}).run_until_idle()
    assert seen == {"not-callable": "undo", "long": "name"}
    assert Watchdog(engine).steps("not-callable") == [], "nothing ran or was recorded"


@pytest.mark.parametrize("kind", ["process", "async-process"])
@ALSO_ON_MARIADB
def test_a_wait_in_a_process_child_is_woken_by_its_signal(engine: Engine, kind: str) -> None:
    add(engine, Job("j", "q"))
    driver = RunnerDriver(kind, engine.url)
    try:
        runner = driver.runner({"q": h.waits}, poll_interval=timedelta(milliseconds=50), concurrency=1)
        runner.run_until_idle()
        assert read(engine, "j").state is JobState.DELAYED
        Watchdog(engine).signal("j", "approved", {"by": "ann"})
        job = _drain(runner, engine, "j", timeout=60)
    finally:
        driver.close()
    assert (job.outcome, job.result) == (Outcome.COMPLETED, {"approval": {"by": "ann"}}), job.failure_reason


@ALSO_ON_MARIADB
def test_show_and_the_dashboard_list_waits_signals_and_undos(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("j", "q"))
    runners.runner({"q": _approval([])}).run_until_idle()
    from sqlalchemy_watchdog.cli.output import applies_dict, render_show

    def shown() -> dict[str, str]:
        explained = present(Watchdog(engine).explain("j"))
        lines = render_show(explained).splitlines()
        return dict(line.split(None, 1) for line in lines if line and not line[0].isspace())

    assert "approved (wait for the signal: waiting until " in shown()["steps"]
    Watchdog(engine).signal("j", "approved", "yes")
    assert "approved (wait for the signal: signalled at " in shown()["steps"]
    assert shown()["signals"].startswith("approved (kept at ")
    as_json = applies_dict(present(Watchdog(engine).explain("j")))
    assert as_json["signals"][0]["payload"] == "yes"
    assert as_json["steps"][1]["wait"].startswith("signalled at ")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM watchdog_job_signals")).scalar_one() == 1
