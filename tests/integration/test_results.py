"""Results: a handler's return value kept by the settle that completes its job,
read by Watchdog.result / wait (and their async twins), on both dialects and
both runner kinds."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from sqlalchemy_watchdog import (
    Decision,
    InvalidJob,
    Job,
    JobResult,
    JobState,
    Outcome,
    ResultStatus,
    RetryPolicy,
    Runner,
    RunningJob,
    TaggedJSON,
    Watchdog,
    store,
)
from sqlalchemy_watchdog.asyncio import AsyncWatchdog
from sqlalchemy_watchdog.jobs import RESULT_MAX_BYTES
from tests.conftest import make_async_engine
from tests.helpers import present
from tests.runner_kinds import RunnerDriver

LONG = timedelta(seconds=30)


def test_a_returned_value_is_the_completed_jobs_result(engine: Engine, runners: RunnerDriver) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("plain", "q", payload={"n": 2}), Job("decided", "q", payload={"n": 3}), Job("none", "q")])

    def handle(job: RunningJob) -> Any:
        if job.job_id == "none":
            return None
        if job.job_id == "decided":
            return Decision.completed(result=[job.payload["n"], "three"])
        return {"ok": True, "double": job.payload["n"] * 2}

    runners.runner({"q": handle}).run_until_idle()
    plain = wd.result("plain")
    assert plain == JobResult("plain", ResultStatus.COMPLETED, {"double": 4, "ok": True}, Outcome.COMPLETED)
    assert plain.unwrap() == {"double": 4, "ok": True} and plain.completed
    assert wd.result("decided").value == [3, "three"]
    none = wd.result("none")
    assert none.status is ResultStatus.COMPLETED and none.value is None
    assert present(wd.read("plain")).result == {"double": 4, "ok": True}
    assert present(wd.read("none")).result is None


def test_results_go_through_the_runners_codec_and_back_through_the_readers(
    engine: Engine, runners: RunnerDriver
) -> None:
    wd = Watchdog(engine)
    wd.enqueue(Job("invoice", "q"))
    when = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)
    runners.runner({"q": lambda job: {"due": when, "amount": Decimal("19.90")}}, codec=TaggedJSON()).run_until_idle()
    stored = present(wd.read("invoice")).result
    assert stored == {"amount": {"$decimal": "19.90"}, "due": {"$datetime": "2025-03-01T09:30:00+00:00"}}
    assert wd.result("invoice", codec=TaggedJSON()).value == {"due": when, "amount": Decimal("19.90")}


def test_every_status_of_a_result(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(
        [
            Job("fails", "q"),
            Job("cancelled", "q"),
            Job("later", "q", run_at=datetime(2999, 1, 1, tzinfo=UTC)),
            Job("looks", "q"),
        ]
    )
    wd.cancel("cancelled", "c-1")
    seen: list[JobResult] = []

    def handle(job: RunningJob) -> Any:
        if job.job_id == "fails":
            return Decision.failed("no stock", retry=False)
        seen.append(wd.result(job.job_id))
        return 1

    Runner(engine, {"q": handle}).run_until_idle()
    assert wd.result("nothing") == JobResult("nothing", ResultStatus.UNKNOWN)
    assert wd.result("later") == JobResult("later", ResultStatus.PENDING)
    assert seen == [JobResult("looks", ResultStatus.RUNNING)]
    assert wd.result("fails") == JobResult("fails", ResultStatus.FAILED, None, Outcome.FAILED, "no stock")
    cancelled = wd.result("cancelled")
    assert cancelled.status is ResultStatus.CANCELLED and cancelled.outcome is Outcome.CANCELLED
    with pytest.raises(InvalidJob, match=r"'fails' has no result \(failed: no stock\)"):
        wd.result("fails").unwrap()
    with pytest.raises(InvalidJob, match="job_id"):
        wd.result("")


def test_a_result_that_cannot_be_kept_fails_the_job_without_retry_and_writes_none_of_it(
    engine: Engine, runners: RunnerDriver
) -> None:
    wd = Watchdog(engine)
    retry = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=1))
    wd.enqueue([Job("huge", "q", retry=retry), Job("object", "q", retry=retry), Job("nan", "q")])
    returned = {"huge": "x" * (RESULT_MAX_BYTES + 1), "object": {"at": object()}, "nan": float("nan")}
    runners.runner({"q": lambda job: returned[job.job_id]}).run_until_idle()
    for job_id, words in (
        ("huge", f"must be at most {RESULT_MAX_BYTES} bytes of JSON"),
        ("object", "object is not a JSON type"),
        ("nan", "nan is not a JSON number"),
    ):
        job = present(wd.read(job_id))
        assert job.outcome is Outcome.FAILED and job.attempt == 1, job_id
        assert job.result is None
        reason = present(job.failure_reason)
        assert reason.startswith("the handler's result: ") and words in reason, reason
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE result_json IS NOT NULL")).scalar() == 0


def test_a_cancellation_recorded_while_running_drops_the_result(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(Job("j", "q"))

    def handle(job: RunningJob) -> Any:
        wd.cancel(job.job_id, "stop-it")
        return {"done": True}

    (settled,) = Runner(engine, {"q": handle}).run_until_idle()
    assert settled.outcome is Outcome.CANCELLED and settled.result is None
    assert wd.result("j").status is ResultStatus.CANCELLED


def test_the_database_keeps_a_result_only_on_a_completed_job(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("failed", "q"), Job("queued", "q")])
    Runner(engine, {"q": lambda job: Decision.failed("no")}, queues=["q"]).tick()  # the first one
    assert present(wd.read("failed")).outcome is Outcome.FAILED
    for job_id in ("queued", "failed"):
        with pytest.raises(IntegrityError, match="result_completed"), engine.begin() as conn:
            conn.execute(text("UPDATE watchdog_jobs SET result_json = '1' WHERE job_id = :j"), {"j": job_id})


def test_a_pruned_job_takes_its_result_with_it(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(Job("j", "q"))
    Runner(engine, {"q": lambda job: "kept"}).run_until_idle()
    assert wd.result("j").value == "kept"
    time.sleep(0.01)
    assert wd.prune(older_than=timedelta(milliseconds=1)) == 1
    assert wd.result("j").status is ResultStatus.UNKNOWN


def _claim_all(engine: Engine, count: int) -> list[store.Claim]:
    with engine.begin() as conn:
        batch = store.claim(conn, queues=["q"], limit=count, lease_ms=60_000)
    assert len(batch.claimed) == count, batch
    return sorted(batch.claimed, key=lambda c: c.job.job_id)


def test_a_direct_settle_keeps_the_decisions_result(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("one", "q"), Job("many-a", "q"), Job("many-b", "q"), Job("many-c", "q")])
    claims = {c.job.job_id: c for c in _claim_all(engine, 4)}
    with engine.begin() as conn:
        one = store.settle(
            conn, job_id="one", claim_token=claims["one"].token, decision=Decision.completed(result={"n": 1})
        )
    assert one.job is not None and one.job.result == {"n": 1}
    requests = [
        store.SettleRequest("many-a", claims["many-a"].token, Decision.completed(result=["a", 2])),
        store.SettleRequest("many-b", claims["many-b"].token, Decision.completed()),
        store.SettleRequest("many-c", claims["many-c"].token, Decision.completed(result="c")),
    ]
    with engine.begin() as conn:
        settled = store.settle_many(conn, requests)
    assert [s.job.result for s in settled if s.job is not None] == [["a", 2], None, "c"]
    assert wd.result("one") == JobResult("one", ResultStatus.COMPLETED, {"n": 1}, Outcome.COMPLETED)
    assert [wd.result(j).value for j in ("many-a", "many-b", "many-c")] == [["a", 2], None, "c"]
    # A replay of the same settle is recognised and keeps the stored result.
    with engine.begin() as conn:
        again = store.settle(
            conn, job_id="one", claim_token=claims["one"].token, decision=Decision.completed(result={"n": 1})
        )
    assert again.job is not None and again.job.result == {"n": 1}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("x" * (RESULT_MAX_BYTES + 1), f"must be at most {RESULT_MAX_BYTES} bytes of JSON"),
        ({"at": object()}, "object is not a JSON type"),
        (Decimal("1.5"), "is not a JSON type"),
    ],
    ids=["too-large", "object", "decimal-without-codec"],
)
def test_a_direct_settle_whose_result_cannot_be_kept_is_refused_naming_result_with_nothing_written(
    engine: Engine, value: Any, words: str
) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("a", "q"), Job("b", "q")])
    a, b = _claim_all(engine, 2)
    with pytest.raises(InvalidJob, match="^result: ") as refused, engine.begin() as conn:
        store.settle(conn, job_id="a", claim_token=a.token, decision=Decision.completed(result=value))
    assert refused.value.field == "result" and words in str(refused.value), refused.value
    with pytest.raises(InvalidJob, match="^result: "), engine.begin() as conn:
        store.settle_many(
            conn,
            [
                store.SettleRequest("a", a.token, Decision.completed(result="fine")),
                store.SettleRequest("b", b.token, Decision.completed(result=value)),
            ],
        )
    for job_id in ("a", "b"):  # neither settled: the refusal came before the statement
        job = present(wd.read(job_id))
        assert job.state is JobState.RUNNING and job.result is None, job
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE result_json IS NOT NULL")).scalar() == 0


def test_a_requeueing_settle_request_refuses_a_result(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(Job("a", "q"))
    (a,) = _claim_all(engine, 1)
    with pytest.raises(InvalidJob, match="^result: a requeued settle keeps no result"):
        store.SettleRequest("a", a.token, Decision.completed(result=1), requeue_after_ms=10)
    assert present(wd.read("a")).state is JobState.RUNNING


def _settle_soon(engine: Engine, value: Any, delay: float = 0.3) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        Runner(engine, {"q": lambda job: value}).run_until_idle()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_wait_returns_the_result_once_the_job_settles(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(Job("j", "q"))
    thread = _settle_soon(engine, {"v": 1})
    try:
        # On PostgreSQL the poll interval outlasts the timeout: only the
        # settle's notification can end the wait in time. SQLite polls.
        poll = timedelta(seconds=60) if engine.dialect.name == "postgresql" else timedelta(milliseconds=50)
        result = wd.wait("j", timeout=LONG, poll_interval=poll)
    finally:
        thread.join()
    assert result == JobResult("j", ResultStatus.COMPLETED, {"v": 1}, Outcome.COMPLETED)


@pytest.mark.parametrize("dialect", ["postgresql"])  # SQLite waiters poll: no notification
def test_only_a_job_someone_waits_for_notifies_when_it_settles(engine: Engine) -> None:
    """A settlement notifies result waiters only for a job a waiter marked:
    the jobs nobody waits for (nearly all) settle without the trigger."""
    import psycopg

    wd = Watchdog(engine)
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN watchdog_results")
        wd.enqueue([Job("unwatched", "q")])
        Runner(engine, {"q": lambda job: 1}).run_until_idle()
        assert wd.result("unwatched").value == 1
        assert [note.payload for note in listener.notifies(timeout=0.5)] == []

        wd.enqueue(Job("watched", "q"))
        thread = _settle_soon(engine, 2)
        try:
            assert wd.wait("watched", timeout=LONG, poll_interval=timedelta(seconds=60)).value == 2
        finally:
            thread.join()
        assert [note.payload for note in listener.notifies(timeout=5, stop_after=1)] == ["watched"]


def test_wait_answers_at_once_for_a_settled_or_unknown_job_and_times_out_otherwise(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("done", "q")])
    Runner(engine, {"q": lambda job: 7}).run_until_idle()
    wd.enqueue(Job("waits", "q"))
    assert wd.wait("done", timeout=timedelta(0)).value == 7
    assert wd.wait("missing", timeout=LONG).status is ResultStatus.UNKNOWN
    assert wd.wait("waits", timeout=timedelta(milliseconds=200), poll_interval=timedelta(milliseconds=50)) == (
        JobResult("waits", ResultStatus.TIMED_OUT)
    )
    assert wd.wait("waits", timeout=timedelta(0)).status is ResultStatus.TIMED_OUT
    with pytest.raises(InvalidJob, match="timeout"):
        wd.wait("waits", timeout=timedelta(seconds=-1))
    with pytest.raises(InvalidJob, match="poll_interval"):
        wd.wait("waits", timeout=LONG, poll_interval=timedelta(0))


async def test_async_result_and_wait_are_twins(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("a", "q"), Job("b", "q")])
    Runner(engine, {"q": lambda job: {"job": job.job_id}}, queues=["q"]).tick()
    async_engine = make_async_engine(engine)
    try:
        awd = AsyncWatchdog(async_engine)
        first = await awd.result("a")
        assert first == wd.result("a") and first.value == {"job": "a"}
        assert (await awd.result("b")).status is ResultStatus.PENDING
        thread = _settle_soon(engine, {"job": "b"})
        try:
            poll = timedelta(seconds=60) if engine.dialect.name == "postgresql" else timedelta(milliseconds=50)
            waited = await awd.wait("b", timeout=LONG, poll_interval=poll)
        finally:
            thread.join()
        assert waited.value == {"job": "b"}
        assert (await awd.wait("none", timeout=LONG)).status is ResultStatus.UNKNOWN
    finally:
        await async_engine.dispose()
