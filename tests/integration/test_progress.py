"""Progress: job.progress(fraction, note) from a handler, checked, written under
the exact claim at most once a second per job, the last value kept by the
settle; on both dialects and both runner kinds."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from sqlalchemy_watchdog import InvalidJob, Job, Outcome, ProgressStatus, RetryPolicy, RunningJob, Watchdog
from sqlalchemy_watchdog.core.progress import PROGRESS_NOTE_MAX_LENGTH
from tests.helpers import present
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
