"""Progress: job.progress(fraction, note) from a handler, checked, written under
the exact claim at most once a second per job, the last value kept by the
settle; on both dialects and both runner kinds."""

from __future__ import annotations

import math
import threading
from datetime import timedelta
from queue import Queue
from typing import Any

import pytest
from sqlalchemy import Engine, text

from sqlalchemy_watchdog import (
    InvalidJob,
    Job,
    JobState,
    Outcome,
    ProgressStatus,
    RetryPolicy,
    RunningJob,
    StopReason,
    Watchdog,
    store,
)
from sqlalchemy_watchdog.core.progress import PROGRESS_NOTE_MAX_LENGTH
from tests.helpers import add, present, read
from tests.runner_kinds import RunnerDriver, dual


def stored(engine: Engine, job_id: str) -> tuple[float | None, str | None]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT progress, progress_note FROM watchdog_jobs WHERE job_id = :j"), {"j": job_id}
        ).one()
    return row[0], row[1]


def test_progress_is_written_at_most_once_a_second_and_the_last_value_with_the_settle(
    engine: Engine, runners: RunnerDriver
) -> None:
    Watchdog(engine).enqueue(Job("j", "q"))
    seen: dict[str, Any] = {}

    def plain(job: RunningJob) -> None:
        seen["first"] = job.progress(0.25, "a quarter")
        seen["second"] = job.progress(0.5)  # within the second: kept back
        seen["stored"] = stored(engine, job.job_id)

    async def coroutine(job: RunningJob) -> None:
        seen["first"] = await job.progress_async(0.25, "a quarter")
        seen["second"] = await job.progress_async(0.5)
        seen["stored"] = stored(engine, job.job_id)

    (settled,) = runners.runner({"q": dual(plain, coroutine)}).run_until_idle()
    assert seen == {"first": ProgressStatus.WRITTEN, "second": ProgressStatus.DEFERRED, "stored": (0.25, "a quarter")}
    assert settled.outcome is Outcome.COMPLETED
    assert (settled.progress, settled.progress_note) == (0.5, None) == stored(engine, "j")
    job = present(Watchdog(engine).read("j"))
    assert (job.progress, job.progress_note) == (0.5, None)


@pytest.mark.parametrize(
    ("fraction", "note", "field"),
    [
        (1.5, None, "fraction"),
        (-0.01, None, "fraction"),
        (math.nan, None, "fraction"),
        (math.inf, None, "fraction"),
        (True, None, "fraction"),
        ("0.5", None, "fraction"),
        (0.5, "n" * (PROGRESS_NOTE_MAX_LENGTH + 1), "note"),
        (0.5, 7, "note"),
        (0.5, "a\x00b", "note"),
    ],
    ids=["above-1", "below-0", "nan", "inf", "bool", "str", "note-too-long", "note-not-text", "note-nul"],
)
def test_bad_progress_is_refused_by_name_and_writes_nothing(
    engine: Engine, runners: RunnerDriver, fraction: Any, note: Any, field: str
) -> None:
    Watchdog(engine).enqueue(Job("j", "q"))
    refused: list[InvalidJob] = []

    def handle(job: RunningJob) -> None:
        with pytest.raises(InvalidJob) as error:
            job.progress(fraction, note)
        refused.append(error.value)

    runners.runner({"q": handle}).run_until_idle()
    (error,) = refused
    assert error.field == field
    assert stored(engine, "j") == (None, None)


def test_a_job_that_lost_its_claim_writes_no_progress(engine: Engine, runners: RunnerDriver) -> None:
    wd = Watchdog(engine)
    wd.enqueue(Job("j", "q"))
    answers: list[ProgressStatus] = []

    def handle(job: RunningJob) -> None:
        wd.fail_lane(job.lane, "the lane is down")  # settles the running job: the claim is gone
        answers.append(job.progress(0.9, "too late"))

    runners.runner({"q": handle}).run_until_idle()
    assert answers == [ProgressStatus.LOST]
    job = present(wd.read("j"))
    assert job.outcome is Outcome.FAILED and (job.progress, job.progress_note) == (None, None)


def test_a_job_whose_claim_was_recovered_and_taken_by_another_runner_writes_no_progress(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The thread executor's side of the process executor's test of the same
    name: told to stop (``lease_lost``), the handler reports progress and
    hears LOST; nothing is written over the new claim."""
    add(engine, Job("a", "q", max_recoveries=1))
    started, reported = threading.Event(), Queue[tuple[Any, ProgressStatus]]()

    def handle(job: RunningJob) -> None:
        started.set()
        job.stop_requested.wait(30)
        reported.put((job.stop_reason, job.progress(0.75, "after the stop")))

    runner = runners.runner({"q": handle}, lease=timedelta(seconds=3), heartbeat=timedelta(seconds=1))
    with runner.serving():
        assert started.wait(30)
        with store.write_transaction(engine) as conn:  # one transaction: the serving runner cannot step in
            conn.execute(text("UPDATE watchdog_jobs SET lease_until = 0 WHERE job_id = 'a'"))
            (expired,) = store.expired_claims(conn, limit=10)
            assert store.reconcile(conn, expired).status is store.RecoveryStatus.REQUEUED
            (taken,) = store.claim(conn, queues=["q"], limit=1, lease_ms=600_000).claimed
        assert reported.get(timeout=30) == (StopReason.LEASE_LOST, ProgressStatus.LOST)
    assert stored(engine, "a") == (None, None)
    assert taken.token != expired.token and read(engine, "a").state is JobState.RUNNING


def test_a_retry_starts_the_next_attempt_without_progress(engine: Engine, runners: RunnerDriver) -> None:
    wd = Watchdog(engine)
    wd.enqueue(Job("j", "q", retry=RetryPolicy(max_attempts=2, backoff=timedelta(hours=1))))

    def handle(job: RunningJob) -> None:
        job.progress(0.3, "halfway there")
        raise RuntimeError("flaky")

    runners.runner({"q": handle}).tick()
    job = present(wd.read("j"))
    assert job.attempt == 2 and (job.progress, job.progress_note) == (None, None)


def test_the_database_refuses_progress_out_of_range(engine: Engine) -> None:
    from sqlalchemy.exc import IntegrityError

    Watchdog(engine).enqueue(Job("j", "q"))
    for assignment in ("progress = 1.5", "progress = -1", f"progress_note = '{'n' * 501}'"):
        with pytest.raises(IntegrityError, match="progress"), engine.begin() as conn:
            conn.execute(text(f"UPDATE watchdog_jobs SET {assignment}"))
