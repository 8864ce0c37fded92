"""Reads through ``Watchdog(engine)``: read, read_queue_head, read_settled, has_pending_work."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from sqlalchemy_watchdog import (
    Decision,
    InvalidJob,
    Job,
    JobState,
    JobView,
    Outcome,
    Watchdog,
    enqueue,
    store,
)
from sqlalchemy_watchdog.store import Claim

# The dialect does not matter here but where a test says dialect_specific: the PostgreSQL copy
# runs under CI=true or WATCHDOG_ALL_DIALECTS=1 (tests/conftest.py).
pytestmark = pytest.mark.dialect_neutral

LEASE_MS = 60_000


def add(engine: Engine, *jobs: Job) -> None:
    with engine.begin() as conn:
        enqueue(conn, list(jobs))


def claim(engine: Engine, queue: str) -> Claim:
    """Make the best queued job of ``queue`` running."""
    with store.write_transaction(engine) as conn:
        batch = store.claim(conn, queues=[queue], lease_ms=LEASE_MS)
    assert len(batch.claimed) == 1
    return batch.claimed[0]


def run(engine: Engine, queue: str, decision: Decision | None = None) -> JobView:
    """Claim the next job of ``queue`` and settle it with ``decision``."""
    taken = claim(engine, queue)
    with store.write_transaction(engine) as conn:
        settlement = store.settle(
            conn, job_id=taken.job.job_id, claim_token=taken.token, decision=decision or Decision.completed()
        )
    assert settlement.job is not None
    return settlement.job


# -- read ------------------------------------------------------------------------------


def test_read_of_a_missing_job_is_none(engine: Engine) -> None:
    assert Watchdog(engine).read("nope") is None


@pytest.mark.dialect_specific
def test_read_returns_every_field_of_a_queued_job(engine: Engine) -> None:
    payload = {"to": "ann@example.com", "lines": [1, 2.5, None, True], "meta": {"ü": "😀"}}
    add(engine, Job("r1", "emails", lane="team:7", priority=-3, payload=payload, max_recoveries=2))
    job = Watchdog(engine).read("r1")
    assert isinstance(job, JobView)
    assert (job.job_id, job.queue, job.lane, job.priority) == ("r1", "emails", "team:7", -3)
    assert job.payload == payload
    assert job.max_recoveries == 2
    assert job.state is JobState.QUEUED
    assert (job.outcome, job.failure_reason, job.cancellation_id) == (None, None, None)
    assert job.recovery_count == 0
    assert job.cancellation_requested is False
    assert isinstance(job.sequence, int) and job.sequence >= 1


def test_read_reports_states_and_outcomes_as_str_enums(engine: Engine) -> None:
    add(engine, Job("done", "q"), Job("waiting", "q2"))
    run(engine, "q")
    watchdog = Watchdog(engine)
    done, waiting = watchdog.read("done"), watchdog.read("waiting")
    assert done is not None and waiting is not None
    assert done.state is JobState.SETTLED and done.state == "settled" and isinstance(done.state, str)  # type: ignore[comparison-overlap]  # a str enum: equal to its value
    assert done.outcome is Outcome.COMPLETED and done.outcome == "completed" and isinstance(done.outcome, str)  # type: ignore[comparison-overlap]
    assert waiting.state == "queued"


def test_read_shows_a_running_job(engine: Engine) -> None:
    add(engine, Job("r1", "q"))
    claim(engine, "q")
    job = Watchdog(engine).read("r1")
    assert job is not None and job.state is JobState.RUNNING and job.outcome is None


def test_read_shows_a_failure_and_its_reason(engine: Engine) -> None:
    add(engine, Job("r1", "q"))
    run(engine, "q", Decision.failed("card declined"))
    job = Watchdog(engine).read("r1")
    assert job is not None
    assert (job.state, job.outcome, job.failure_reason) == (JobState.SETTLED, Outcome.FAILED, "card declined")


def test_read_shows_a_recorded_cancellation(engine: Engine) -> None:
    add(engine, Job("r1", "q"))
    Watchdog(engine).cancel("r1", "cancel-r1")
    job = Watchdog(engine).read("r1")
    assert job is not None
    assert job.cancellation_id == "cancel-r1" and job.cancellation_requested is True


def test_job_view_is_frozen(engine: Engine) -> None:
    add(engine, Job("r1", "q"))
    job = Watchdog(engine).read("r1")
    assert job is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.state = JobState.SETTLED  # type: ignore[misc]


def test_read_refuses_an_invalid_job_id(engine: Engine) -> None:
    with pytest.raises(InvalidJob) as caught:
        Watchdog(engine).read("")
    assert caught.value.field == "job_id"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3),
    max_leaves=12,
)


_counter = itertools.count()


@pytest.mark.dialect_specific
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=json_values)
def test_any_strict_json_payload_reads_back_equal(engine: Engine, payload: Any) -> None:
    job_id = f"p-{next(_counter)}"
    add(engine, Job(job_id, "q", payload=payload))
    job = Watchdog(engine).read(job_id)
    assert job is not None and job.payload == payload


# -- read_queue_head -------------------------------------------------------------------------


def test_queue_head_is_none_for_an_idle_queue(engine: Engine) -> None:
    watchdog = Watchdog(engine)
    assert watchdog.read_queue_head("q") is None
    add(engine, Job("other-queue", "elsewhere"), Job("done", "q"))
    run(engine, "q")
    assert watchdog.read_queue_head("q") is None


def test_queue_head_is_the_highest_priority_then_the_earliest_job(engine: Engine) -> None:
    add(
        engine,
        Job("low", "q", priority=1),
        Job("high-first", "q", priority=9),
        Job("high-second", "q", priority=9),
        Job("other-queue-higher", "other", priority=100),
    )
    head = Watchdog(engine).read_queue_head("q")
    assert head is not None and head.job_id == "high-first" and head.state is JobState.QUEUED


def test_queue_head_is_the_running_job_before_any_queued_one(engine: Engine) -> None:
    add(engine, Job("runs", "q", priority=0))
    claim(engine, "q")
    add(engine, Job("urgent", "q", priority=1_000))
    head = Watchdog(engine).read_queue_head("q")
    assert head is not None and head.job_id == "runs" and head.state is JobState.RUNNING


def test_queue_head_moves_on_when_the_head_settles(engine: Engine) -> None:
    add(engine, Job("first", "q", priority=5), Job("second", "q", priority=1))
    run(engine, "q")
    head = Watchdog(engine).read_queue_head("q")
    assert head is not None and head.job_id == "second"


def test_queue_head_reports_a_requested_cancellation(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    watchdog = Watchdog(engine)
    head = watchdog.read_queue_head("q")
    assert head is not None and head.cancellation_requested is False
    watchdog.cancel("a", "cancel-a")
    head = watchdog.read_queue_head("q")
    assert head is not None and head.job_id == "a" and head.cancellation_requested is True


# -- read_settled ------------------------------------------------------------------------------


def test_read_settled_pages_settled_jobs_in_admission_order(engine: Engine) -> None:
    add(engine, *(Job(f"s{i}", "q", priority=i) for i in range(5)), Job("pending", "later"))
    for _ in range(5):
        run(engine, "q")  # settles s4, s3, ... s0: settlement order is not admission order
    watchdog = Watchdog(engine)
    first = watchdog.read_settled(limit=2)
    assert [j.job_id for j in first] == ["s0", "s1"]
    second = watchdog.read_settled(limit=2, after_sequence=first[-1].sequence)
    assert [j.job_id for j in second] == ["s2", "s3"]
    third = watchdog.read_settled(limit=2, after_sequence=second[-1].sequence)
    assert [j.job_id for j in third] == ["s4"]
    assert watchdog.read_settled(limit=2, after_sequence=third[-1].sequence) == []
    assert all(j.state is JobState.SETTLED and j.outcome is Outcome.COMPLETED for j in first + second + third)
    assert [j.job_id for j in watchdog.read_settled()] == ["s0", "s1", "s2", "s3", "s4"]


def test_read_settled_leaves_out_queued_and_running_jobs(engine: Engine) -> None:
    add(engine, Job("queued", "q1"), Job("running", "q2"), Job("failed", "q3"))
    claim(engine, "q2")
    Watchdog(engine).fail_lane("q3", "lane down")
    settled = Watchdog(engine).read_settled(limit=256)
    assert [(j.job_id, j.outcome, j.failure_reason) for j in settled] == [("failed", Outcome.FAILED, "lane down")]


def test_read_settled_refuses_a_limit_outside_1_to_256(engine: Engine) -> None:
    for limit in [0, -1, 257, True, 1.5, "10"]:
        with pytest.raises(InvalidJob) as caught:
            Watchdog(engine).read_settled(limit=limit)  # type: ignore[arg-type]
        assert caught.value.field == "limit", limit
        assert "limit" in str(caught.value)


def test_read_settled_accepts_limits_1_and_256(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q"))
    run(engine, "q")
    run(engine, "q")
    assert [j.job_id for j in Watchdog(engine).read_settled(limit=1)] == ["a"]
    assert [j.job_id for j in Watchdog(engine).read_settled(limit=256)] == ["a", "b"]


def test_read_settled_refuses_a_negative_after_sequence(engine: Engine) -> None:
    with pytest.raises(InvalidJob) as caught:
        Watchdog(engine).read_settled(limit=10, after_sequence=-1)
    assert caught.value.field == "after_sequence"


# -- has_pending_work -----------------------------------------------------------------------------


def test_has_pending_work_follows_queued_and_running_jobs(engine: Engine) -> None:
    watchdog = Watchdog(engine)
    assert watchdog.has_pending_work() is False
    add(engine, Job("a", "q"))
    assert watchdog.has_pending_work() is True
    taken = claim(engine, "q")
    assert watchdog.has_pending_work() is True  # running only
    with store.write_transaction(engine) as conn:
        store.settle(conn, job_id="a", claim_token=taken.token, decision=Decision.completed())
    assert watchdog.has_pending_work() is False  # settled only


def test_watchdog_refuses_an_async_engine_or_anything_else(engine: Engine) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    with pytest.raises(TypeError, match="AsyncWatchdog"):
        Watchdog(create_async_engine("sqlite+aiosqlite://"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Watchdog("sqlite://")  # type: ignore[arg-type]
