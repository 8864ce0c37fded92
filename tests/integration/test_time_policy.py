"""Delayed jobs, retries, snoozes and timeouts at the store and client level,
on SQLite and on PostgreSQL (the ``engine`` fixture), sync and asyncio.

Time is never asserted with fixed sleeps: a test reads the database's own
clock (the one every ready time is counted from) and polls with
``wait_until`` until something is due. Delays are short (well under a
second) where a test waits for them, long (an hour or more) where it
asserts that something has *not* happened yet.
"""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import DateTime, Engine, Integer, String, Table, TypeDecorator, insert, literal, select, text
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_watchdog import (
    CancelStatus,
    Decision,
    EnqueueConflict,
    EnqueueResult,
    EnqueueStatus,
    FailedAttempt,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    RetryPolicy,
    Runner,
    RunningJob,
    Watchdog,
    enqueue,
    enqueue_select,
    store,
)
from sqlalchemy_watchdog import asyncio as watchdog_asyncio
from sqlalchemy_watchdog.asyncio import AsyncWatchdog
from sqlalchemy_watchdog.jobs import (
    FAILURE_HISTORY_LENGTH,
    FAILURE_HISTORY_REASON_LENGTH,
    MAX_DELAY,
    SettleStatus,
)
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.store import Claim, SettleRequest, sql
from tests.conftest import make_async_engine
from tests.helpers import add, raw, read, wait_until
from tests.runner_kinds import RunnerDriver

QUEUED = EnqueueStatus.QUEUED
DUPLICATE = EnqueueStatus.DUPLICATE
LEASE_MS = 60_000
HOUR = timedelta(hours=1)
HOUR_MS = 3_600_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The database's clock and ours may round a millisecond apart.
TOLERANCE_MS = 2


# -- helpers -------------------------------------------------------------------


def run(engine: Engine, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(conn, ...)`` in a write transaction of its own, committed."""
    with store.write_transaction(engine) as conn:
        return fn(conn, *args, **kwargs)


def db_clock(engine: Engine) -> int:
    """The database's own clock, epoch milliseconds."""
    with engine.connect() as conn:
        return int(conn.execute(select(sql.db_clock_ms())).scalar_one())


def ms(value: datetime | None) -> int:
    """An aware datetime in epoch milliseconds."""
    assert value is not None and value.tzinfo is not None
    return (value - EPOCH) // timedelta(milliseconds=1)


def at(epoch_ms: int) -> datetime:
    """Epoch milliseconds as an aware UTC datetime."""
    return EPOCH + timedelta(milliseconds=epoch_ms)


def delayed(engine: Engine, *jobs: Job, delay: timedelta = HOUR) -> None:
    """Enqueue ``jobs`` with ``delay`` in one committed transaction."""
    with engine.begin() as conn:
        enqueue(conn, list(jobs), delay=delay)


def promote(engine: Engine, limit: int = store.PROMOTE_BATCH) -> store.Promotion:
    promotion: store.Promotion = run(engine, store.promote, limit=limit)
    return promotion


def claim(engine: Engine, *, limit: int = 1, queues: list[str] | None = None) -> store.ClaimBatch:
    batch: store.ClaimBatch = run(engine, store.claim, queues=queues, limit=limit, lease_ms=LEASE_MS)
    return batch


def claim_one(engine: Engine, queues: list[str] | None = None) -> Claim:
    batch = claim(engine, queues=queues)
    assert len(batch.claimed) == 1, batch
    return batch.claimed[0]


def states(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {job_id: state for job_id, state in conn.execute(select(jobs_table.c.job_id, jobs_table.c.state))}


def job_rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(select(jobs_table).order_by(jobs_table.c.sequence)).mappings()
        return [dict(row) for row in rows]


def promote_until(engine: Engine, count: int, what: str = "the delayed jobs to be promoted") -> None:
    """Promote until ``count`` jobs in all were made queued."""
    moved = [0]

    def enough() -> bool:
        moved[0] += promote(engine).promoted
        return moved[0] >= count

    wait_until(enough, what=what, interval=0.02)
    assert moved[0] == count


# -- validation ----------------------------------------------------------------

NAIVE = datetime(2030, 1, 1, 12, 0)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Job("j", "q", run_at=NAIVE), "run_at"),
        (lambda: Job("j", "q", run_at="2030-01-01T00:00:00+00:00"), "run_at"),  # type: ignore[arg-type]
        (lambda: Job("j", "q", run_at=datetime(1969, 12, 31, tzinfo=UTC)), "run_at"),
        (lambda: Job("j", "q", run_at=datetime(9999, 6, 1, tzinfo=UTC)), "run_at"),
        (lambda: Job("j", "q", retry=5), "retry"),  # type: ignore[arg-type]
        (lambda: Job("j", "q", timeout=timedelta(0)), "timeout"),
        (lambda: Job("j", "q", timeout=timedelta(microseconds=999)), "timeout"),
        (lambda: Job("j", "q", timeout=30), "timeout"),  # type: ignore[arg-type]
        (lambda: Job("j", "q", timeout=MAX_DELAY + timedelta(milliseconds=1)), "timeout"),
        (lambda: RetryPolicy(max_attempts=0), "max_attempts"),
        (lambda: RetryPolicy(max_attempts=1001), "max_attempts"),
        (lambda: RetryPolicy(max_attempts=True), "max_attempts"),
        (lambda: RetryPolicy(backoff=timedelta(0)), "backoff"),
        (lambda: RetryPolicy(backoff=1), "backoff"),  # type: ignore[arg-type]
        (lambda: RetryPolicy(backoff=timedelta(seconds=10), max_backoff=timedelta(seconds=9)), "max_backoff"),
        (lambda: RetryPolicy(factor=0.5), "factor"),
        (lambda: RetryPolicy(factor=101), "factor"),
        (lambda: RetryPolicy(factor=float("nan")), "factor"),
        (lambda: RetryPolicy(jitter=-0.1), "jitter"),
        (lambda: RetryPolicy(jitter=1.5), "jitter"),
        (lambda: Decision.snooze(timedelta(0)), "after"),
        (lambda: Decision.retry("x", after=timedelta(seconds=-1)), "after"),
        (lambda: Decision(None), "decision"),
        (lambda: Decision(Outcome.COMPLETED, after=timedelta(seconds=1)), "after"),
    ],
)
def test_bad_time_and_retry_settings_are_refused_naming_the_field(build: Any, field: str) -> None:
    with pytest.raises(InvalidJob) as caught:
        build()
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}:")


def test_retry_policy_delay_grows_by_the_factor_up_to_max_backoff_and_jitter_stays_within_its_fraction() -> None:
    policy = RetryPolicy(backoff=timedelta(seconds=1), factor=2.0, max_backoff=timedelta(seconds=5), jitter=0.0)
    assert [policy.delay(n).total_seconds() for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    spread = RetryPolicy(backoff=timedelta(seconds=10), jitter=0.1)
    rng = random.Random(9)
    waits = [spread.delay(1, rng=rng).total_seconds() for _ in range(200)]
    assert all(9.0 <= w <= 11.0 for w in waits)
    assert len(set(waits)) > 100  # really spread


@settings(max_examples=300, deadline=None)
@given(
    factor=st.floats(min_value=1.0, max_value=100.0),
    backoff_ms=st.integers(min_value=1, max_value=3_600_000),
    extra_ms=st.integers(min_value=0, max_value=30 * 86_400_000),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    attempt=st.integers(min_value=1, max_value=10**9),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_retry_delay_never_raises_never_exceeds_max_backoff_and_grows_with_the_attempt(
    factor: float, backoff_ms: int, extra_ms: int, jitter: float, attempt: int, seed: int
) -> None:
    policy = RetryPolicy(
        max_attempts=1000,
        backoff=timedelta(milliseconds=backoff_ms),
        factor=factor,
        max_backoff=timedelta(milliseconds=backoff_ms + extra_ms),
        jitter=jitter,
    )
    rng = random.Random(seed)
    for n in (attempt, attempt + 1, 310, 648, 10**12):
        assert timedelta(0) < policy.delay(n, rng=rng) <= policy.max_backoff
    steady = RetryPolicy(
        max_attempts=1000, backoff=policy.backoff, factor=factor, max_backoff=policy.max_backoff, jitter=0.0
    )
    assert steady.delay(attempt) <= steady.delay(attempt + 1) <= policy.max_backoff


@pytest.mark.parametrize(("factor", "attempt"), [(10, 310), (3, 648), (100, 156), (100, 1000)])
def test_a_long_retry_schedule_waits_max_backoff_instead_of_overflowing(factor: float, attempt: int) -> None:
    policy = RetryPolicy(max_attempts=1000, factor=factor, max_backoff=HOUR, jitter=0.5)
    assert HOUR / 2 <= policy.delay(attempt) <= HOUR


def test_a_job_at_a_high_attempt_of_a_long_schedule_is_requeued_by_a_served_runner(
    engine: Engine, runners: RunnerDriver
) -> None:
    policy = RetryPolicy(max_attempts=1000, factor=10, max_backoff=HOUR)
    add(engine, Job("late", "q", retry=policy))
    with engine.begin() as conn:  # as a producer may write it, or after 309 failures
        conn.execute(jobs_table.update().where(jobs_table.c.job_id == "late").values(attempt=310))

    def fail(job: RunningJob) -> None:
        raise RuntimeError("still failing")

    worker = runners.runner({"q": fail}, poll_interval=timedelta(milliseconds=50))
    with worker.serving():
        job = wait_until(lambda: (j := read(engine, "late")).state is JobState.DELAYED and j, what="the requeue")
    assert (job.attempt, job.outcome) == (311, None)
    assert job.failure_history[-1].reason.endswith("still failing")
    assert job.ready_at is not None and job.enqueued_at is not None
    assert job.ready_at - datetime.now(UTC) <= HOUR


@pytest.mark.parametrize(
    "delay",
    [timedelta(0), timedelta(microseconds=999), timedelta(seconds=-1), MAX_DELAY + timedelta(milliseconds=1), 5],
    ids=["zero", "sub-millisecond", "negative", "beyond-max", "int"],
)
def test_a_bad_delay_is_refused_naming_it_and_nothing_is_written(engine: Engine, delay: Any) -> None:
    with engine.connect() as conn:
        with pytest.raises(InvalidJob) as caught:
            enqueue(conn, [Job("a", "q"), Job("b", "q")], delay=delay)
        conn.commit()
    assert caught.value.field == "delay"
    with pytest.raises(InvalidJob):
        Watchdog(engine).enqueue(Job("a", "q"), delay=delay)
    assert job_rows(engine) == []


def test_delay_together_with_a_jobs_run_at_is_refused_and_nothing_is_written(engine: Engine) -> None:
    jobs = [Job("plain", "q"), Job("scheduled", "q", run_at=datetime(2999, 1, 1, tzinfo=UTC))]
    with engine.connect() as conn:
        with pytest.raises(InvalidJob) as caught:
            enqueue(conn, jobs, delay=timedelta(seconds=5))
        conn.commit()
    assert caught.value.field == "delay" and "scheduled" in str(caught.value)
    assert job_rows(engine) == []


def test_the_longest_delay_is_accepted(engine: Engine) -> None:
    before = db_clock(engine)
    delayed(engine, Job("a", "q"), delay=MAX_DELAY)
    job = read(engine, "a")
    assert job.state is JobState.DELAYED
    assert ms(job.ready_at) >= before + MAX_DELAY // timedelta(milliseconds=1)


# -- what a job shows ----------------------------------------------------------


def test_a_job_shows_its_own_time_and_retry_policy_read_back_as_given(engine: Engine) -> None:
    policy = RetryPolicy(
        max_attempts=7, backoff=timedelta(seconds=3), factor=1.5, max_backoff=timedelta(minutes=2), jitter=0.25
    )
    run_at = datetime(2999, 1, 2, 3, 4, 5, 678_000, tzinfo=timezone(timedelta(hours=2)))
    add(engine, Job("own", "q", run_at=run_at, retry=policy, timeout=timedelta(seconds=45)), Job("plain", "q"))
    own = read(engine, "own")
    assert (own.state, own.run_at, own.ready_at) == (JobState.DELAYED, run_at, run_at)
    assert own.run_at is not None and own.run_at.utcoffset() == timedelta(0)  # read back in UTC
    assert (own.retry, own.max_attempts, own.timeout) == (policy, 7, timedelta(seconds=45))
    assert (own.attempt, own.snoozes, own.failure_history) == (1, 0, ())
    plain = read(engine, "plain")
    assert (plain.state, plain.run_at, plain.ready_at, plain.retry, plain.max_attempts, plain.timeout) == (
        JobState.QUEUED,
        None,
        None,
        None,
        None,
        None,
    )
    assert (plain.attempt, plain.snoozes, plain.failure_history) == (1, 0, ())


# -- delayed jobs --------------------------------------------------------------


def test_a_delayed_job_is_not_claimable_before_its_time_and_is_after(engine: Engine) -> None:
    with engine.begin() as conn:
        assert enqueue(conn, Job("later", "q"), delay=timedelta(seconds=1)).status is QUEUED
    job = read(engine, "later")
    assert job.state is JobState.DELAYED
    ready = ms(job.ready_at)
    early = promote(engine)
    batch = claim(engine, limit=10)
    looked_at = db_clock(engine)
    assert looked_at < ready, "the machine was too slow for this test's premise"
    assert (early.promoted, batch) == (0, store.ClaimBatch((), ()))
    assert early.next_in is not None and 0 < early.next_in <= 1.0
    assert read(engine, "later").state is JobState.DELAYED

    promote_until(engine, 1)
    assert db_clock(engine) >= ready
    taken = claim_one(engine)
    assert (taken.job.job_id, taken.job.state, taken.job.ready_at) == ("later", JobState.RUNNING, job.ready_at)


def test_a_run_at_in_the_past_is_queued_at_once(engine: Engine) -> None:
    past = datetime.now(UTC) - timedelta(hours=1)
    add(engine, Job("overdue", "q", run_at=past))
    job = read(engine, "overdue")
    assert job.state is JobState.QUEUED
    assert ms(job.run_at) == ms(job.ready_at) == ms(past)
    assert promote(engine).promoted == 0  # nothing to promote: it was never delayed
    assert claim_one(engine).job.job_id == "overdue"


def test_a_run_at_in_the_future_waits_until_then(engine: Engine) -> None:
    now = db_clock(engine)
    add(engine, Job("soon", "q", run_at=at(now + 1000)), Job("much-later", "q", run_at=at(now + HOUR_MS)))
    assert states(engine) == {"soon": "delayed", "much-later": "delayed"}
    assert ms(read(engine, "soon").ready_at) == now + 1000
    promote_until(engine, 1)
    assert db_clock(engine) >= now + 1000
    assert states(engine) == {"soon": "queued", "much-later": "delayed"}


def test_ready_jobs_are_claimed_by_priority_then_admission_even_when_some_were_promoted(engine: Engine) -> None:
    soon = timedelta(milliseconds=300)
    delayed(engine, Job("d-low", "q"), delay=soon)
    add(engine, Job("q-low", "q"))
    delayed(engine, Job("d-high", "q", priority=5), delay=soon)
    add(engine, Job("q-high", "q", priority=5), Job("q-low-2", "q"))
    sequences = {row["job_id"]: row["sequence"] for row in job_rows(engine)}
    promote_until(engine, 2)
    order = [claim_one(engine).job.job_id for _ in range(5)]
    assert order == ["d-high", "q-high", "d-low", "q-low", "q-low-2"]
    assert claim(engine) == store.ClaimBatch((), ())
    assert {row["job_id"]: row["sequence"] for row in job_rows(engine)} == sequences  # promotion keeps admission


def test_read_queue_head_shows_a_delayed_job_only_when_nothing_is_queued(engine: Engine) -> None:
    delayed(engine, Job("later", "q", priority=9))
    watchdog = Watchdog(engine)
    head = watchdog.read_queue_head("q")
    assert head is not None and head.job_id == "later"
    add(engine, Job("now", "q"))
    head = watchdog.read_queue_head("q")
    assert head is not None and head.job_id == "now"  # queued before delayed, whatever the priority
    assert watchdog.has_pending_work()


# -- identity ----------------------------------------------------------------------

FAR = datetime(2999, 1, 1, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=3, backoff=timedelta(seconds=2), factor=2.0, max_backoff=timedelta(minutes=1),
                     jitter=0.0)  # fmt: skip


def original(**changes: Any) -> Job:
    fields: dict[str, Any] = {"run_at": FAR, "retry": POLICY, "timeout": timedelta(seconds=30)}
    fields.update(changes)
    return Job("x", "q", payload={"n": 1}, **fields)


CONFLICTS = {
    "run_at a second later": original(run_at=FAR + timedelta(seconds=1)),
    "run_at a millisecond later": original(run_at=FAR + timedelta(milliseconds=1)),
    "no run_at": original(run_at=None),
    "max_attempts": original(retry=RetryPolicy(max_attempts=4, backoff=timedelta(seconds=2),
                                               max_backoff=timedelta(minutes=1), jitter=0.0)),
    "backoff": original(retry=RetryPolicy(max_attempts=3, backoff=timedelta(seconds=3),
                                          max_backoff=timedelta(minutes=1), jitter=0.0)),
    "factor": original(retry=RetryPolicy(max_attempts=3, backoff=timedelta(seconds=2), factor=3.0,
                                         max_backoff=timedelta(minutes=1), jitter=0.0)),
    "max_backoff": original(retry=RetryPolicy(max_attempts=3, backoff=timedelta(seconds=2),
                                              max_backoff=timedelta(minutes=2), jitter=0.0)),
    "jitter": original(retry=RetryPolicy(max_attempts=3, backoff=timedelta(seconds=2),
                                         max_backoff=timedelta(minutes=1), jitter=0.5)),
    "no retry": original(retry=None),
    "timeout": original(timeout=timedelta(seconds=31)),
    "no timeout": original(timeout=None),
}  # fmt: skip


class AppBase(DeclarativeBase):
    pass


class Note(AppBase):
    """The application's own row, written beside the job."""

    __tablename__ = "notes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    body: Mapped[str] = mapped_column(String(200))


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on both dialects (stored as naive UTC)."""

    impl = DateTime()
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name in ("mysql", "mariadb"):  # a plain DATETIME there keeps whole seconds
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Reminder(AppBase):
    """An application table whose rows say when each job should run."""

    __tablename__ = "reminders"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    due: Mapped[datetime | None] = mapped_column(UTCDateTime())
    due_naive: Mapped[datetime | None] = mapped_column(DateTime())


notes = Note.__table__
reminders = cast(Table, Reminder.__table__)


@pytest.fixture
def db(engine: Engine) -> Engine:
    AppBase.metadata.create_all(engine)
    return engine


def note_bodies(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(notes.c.body).order_by(notes.c.id)).scalars())


def test_run_at_retry_and_timeout_are_identity_a_different_one_conflicts_and_rolls_back_the_callers_writes(
    db: Engine,
) -> None:
    add(db, original())
    before = job_rows(db)
    for kind, conflicting in CONFLICTS.items():
        with Session(db) as session:
            session.add(Note(body=f"written with {kind}"))
            session.flush()
            with pytest.raises(EnqueueConflict) as caught:
                enqueue(session, conflicting)
            session.commit()  # the caller ignores the error and commits anyway
        assert caught.value.job_id == "x", kind
        assert note_bodies(db) == [], kind
        assert job_rows(db) == before, kind
    with pytest.raises(EnqueueConflict):
        Watchdog(db).enqueue(CONFLICTS["timeout"])
    assert job_rows(db) == before


def test_a_batch_names_the_job_whose_run_at_retry_or_timeout_conflicts(engine: Engine) -> None:
    add(engine, original(), Job("other", "q", timeout=timedelta(seconds=1)))
    before = job_rows(engine)
    for conflicting in (
        Job("other", "q", timeout=timedelta(seconds=2)),
        Job("other", "q", timeout=timedelta(seconds=1), run_at=FAR),
        Job("other", "q", timeout=timedelta(seconds=1), retry=POLICY),
    ):
        with engine.connect() as conn:
            with pytest.raises(EnqueueConflict) as caught:
                enqueue(conn, [original(), Job("new", "q"), conflicting])
            conn.commit()
        assert caught.value.job_id == "other"
        assert job_rows(engine) == before
    # Within one batch too, before anything is written.
    with engine.connect() as conn:
        with pytest.raises(EnqueueConflict) as caught:
            enqueue(conn, [Job("n", "q", run_at=FAR), Job("n", "q", run_at=FAR + timedelta(seconds=1))])
        conn.commit()
    assert caught.value.job_id == "n"
    assert job_rows(engine) == before


def test_the_same_run_at_in_another_time_zone_is_the_same_job(engine: Engine) -> None:
    add(engine, original())
    before = job_rows(engine)
    same_instant = FAR.astimezone(timezone(timedelta(hours=-5)))
    with engine.begin() as conn:
        assert enqueue(conn, original(run_at=same_instant)).status is DUPLICATE
    assert job_rows(engine) == before


def test_a_replay_with_another_delay_is_a_duplicate_and_keeps_the_stored_ready_at(engine: Engine) -> None:
    delayed(engine, Job("x", "q"), delay=HOUR)
    add(engine, Job("now", "q"))
    before = job_rows(engine)
    for delay in (timedelta(hours=2), timedelta(milliseconds=1), None):
        with engine.begin() as conn:
            assert enqueue(conn, [Job("x", "q"), Job("now", "q")], delay=delay) == [
                EnqueueResult("x", DUPLICATE),
                EnqueueResult("now", DUPLICATE),
            ]
        assert Watchdog(engine).enqueue(Job("x", "q"), delay=delay).status is DUPLICATE
        assert job_rows(engine) == before, delay
    assert states(engine) == {"x": "delayed", "now": "queued"}


def test_delay_is_counted_from_the_database_clock(engine: Engine) -> None:
    delay_ms = 10 * 60 * 1000
    before = db_clock(engine)
    delayed(engine, Job("session", "q"), delay=timedelta(milliseconds=delay_ms))
    Watchdog(engine).enqueue(Job("client", "q"), delay=timedelta(milliseconds=delay_ms))
    after = db_clock(engine)
    for job_id in ("session", "client"):
        ready = ms(read(engine, job_id).ready_at)
        assert before + delay_ms - TOLERANCE_MS <= ready <= after + delay_ms + TOLERANCE_MS, job_id


def test_a_run_at_is_stored_to_the_millisecond_and_is_its_ready_time(engine: Engine) -> None:
    when = datetime(2999, 5, 6, 7, 8, 9, 123_456, tzinfo=UTC)
    add(engine, Job("x", "q", run_at=when))
    assert ms(read(engine, "x").ready_at) == ms(when) == raw(engine, "x")["run_at"]


# -- enqueue_select --------------------------------------------------------------


def test_enqueue_select_takes_a_run_at_column(db: Engine) -> None:
    now = db_clock(db)
    future, past = at(now + HOUR_MS), at(now - HOUR_MS)
    with db.begin() as conn:
        conn.execute(insert(reminders), [{"id": 1, "due": future}, {"id": 2, "due": past}, {"id": 3, "due": None}])
    source = select(
        ("r-" + reminders.c.id.cast(String)).label("job_id"),
        literal("q").label("queue"),
        reminders.c.due.label("run_at"),
    ).order_by(reminders.c.id)
    with Session(db) as session:
        assert [r.status for r in enqueue_select(session, source)] == [QUEUED] * 3
        session.commit()
    first, second, third = (read(db, f"r-{i}") for i in (1, 2, 3))
    assert (first.state, ms(first.run_at), ms(first.ready_at)) == (JobState.DELAYED, ms(future), ms(future))
    assert (second.state, ms(second.run_at)) == (JobState.QUEUED, ms(past))
    assert (third.state, third.run_at, third.ready_at) == (JobState.QUEUED, None, None)
    # The same rows again are the same jobs.
    with db.begin() as conn:
        assert [r.status for r in enqueue_select(conn, source)] == [DUPLICATE] * 3


def test_enqueue_select_refuses_a_naive_run_at_naming_the_field_and_row_and_writes_nothing(db: Engine) -> None:
    with db.begin() as conn:
        conn.execute(insert(reminders), [{"id": 1, "due_naive": None}, {"id": 2, "due_naive": NAIVE}])
    source = select(
        ("r-" + reminders.c.id.cast(String)).label("job_id"),
        literal("q").label("queue"),
        reminders.c.due_naive.label("run_at"),
    ).order_by(reminders.c.id)
    with db.connect() as conn:
        with pytest.raises(InvalidJob) as caught:
            enqueue_select(conn, source)
        conn.commit()
    assert caught.value.field == "run_at"
    assert "row 1" in str(caught.value) and "naive" in str(caught.value)
    assert job_rows(db) == []


# -- promotion -------------------------------------------------------------------


def test_promotion_moves_due_jobs_earliest_first_in_bounded_batches_and_is_idempotent(engine: Engine) -> None:
    now = db_clock(engine)
    # j4 is due first, j0 last; admission order is the other way round.
    add(engine, *(Job(f"j{i}", "q", run_at=at(now + 1200 - 10 * i)) for i in range(5)))
    add(engine, Job("later", "q", run_at=at(now + HOUR_MS)))
    before = {row["job_id"]: (row["sequence"], row["ready_at"]) for row in job_rows(engine)}
    assert set(states(engine).values()) == {"delayed"}
    nothing_due = promote(engine)
    assert nothing_due.promoted == 0 and nothing_due.next_in is not None and 0 < nothing_due.next_in <= 1.2
    wait_until(lambda: db_clock(engine) >= now + 1200, what="every j to be due")

    first = promote(engine, limit=2)
    assert (first.promoted, first.next_in) == (2, 0.0)
    assert {j for j, s in states(engine).items() if s == "queued"} == {"j4", "j3"}
    second = promote(engine, limit=2)
    assert (second.promoted, second.next_in) == (2, 0.0)
    assert {j for j, s in states(engine).items() if s == "queued"} == {"j4", "j3", "j2", "j1"}
    third = promote(engine, limit=2)
    assert third.promoted == 1 and third.next_in is not None and 3500 < third.next_in <= 3600
    again = promote(engine, limit=2)
    assert again.promoted == 0 and again.next_in is not None and 3500 < again.next_in <= 3600
    assert states(engine) == {**{f"j{i}": "queued" for i in range(5)}, "later": "delayed"}
    # Sequence (admission) and ready time are kept.
    assert {row["job_id"]: (row["sequence"], row["ready_at"]) for row in job_rows(engine)} == before


def test_promotion_with_no_delayed_job_reports_none_due(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    assert promote(engine) == store.Promotion(0, None)


def test_two_concurrent_promoters_never_move_a_job_twice(engine: Engine) -> None:
    jobs = 300
    now = db_clock(engine)
    add(engine, *(Job(f"j{i:03}", "q", run_at=at(now + 1500)) for i in range(jobs)))
    assert set(states(engine).values()) == {"delayed"}
    wait_until(lambda: db_clock(engine) > now + 1500, what="the jobs to be due")
    barrier = threading.Barrier(2, timeout=15)
    counts: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def promoter(index: int) -> None:
        try:
            barrier.wait()
            for _ in range(jobs):
                promotion = promote(engine, limit=7)
                counts[index].append(promotion.promoted)
                if promotion.next_in is None:
                    return
            raise AssertionError("promotion never finished")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=promoter, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sum(counts[0]) + sum(counts[1]) == jobs
    assert all(0 <= c <= 7 for c in counts[0] + counts[1])
    assert set(states(engine).values()) == {"queued"}


# -- cancel, fail_lane, purge ------------------------------------------------------


def test_cancelling_a_delayed_job_lets_the_next_claim_settle_it_cancelled_without_waiting(engine: Engine) -> None:
    delayed(engine, Job("later", "q"), delay=timedelta(days=30))
    result = Watchdog(engine).cancel("later", "stop-later")
    assert result.status is CancelStatus.RECORDED
    job = read(engine, "later")
    assert (job.state, job.cancellation_id) == (JobState.QUEUED, "stop-later")
    batch = claim(engine, limit=5)
    assert batch.claimed == ()
    assert [(j.job_id, j.state, j.outcome) for j in batch.cancelled] == [("later", JobState.SETTLED, Outcome.CANCELLED)]
    assert Watchdog(engine).cancel("later", "stop-later").status is CancelStatus.REPLAYED


def test_cancel_only_if_queued_accepts_a_delayed_job(engine: Engine) -> None:
    delayed(engine, Job("later", "q"))
    watchdog = Watchdog(engine)
    assert watchdog.cancel("later", "c-1", only_if_queued=True).status is CancelStatus.RECORDED
    assert watchdog.cancel("later", "c-1", only_if_queued=True).status is CancelStatus.REPLAYED
    assert read(engine, "later").cancellation_id == "c-1"


def test_fail_lane_settles_delayed_jobs_too(engine: Engine) -> None:
    delayed(engine, Job("later", "q", lane="provider"), Job("elsewhere", "q", lane="other"))
    add(engine, Job("running", "q", lane="provider", priority=1), Job("waiting", "q", lane="provider"))
    claim_one(engine)  # "running", the best
    result = Watchdog(engine).fail_lane("provider", "provider is down")
    assert (result.settled, result.more) == (3, False)
    for job_id in ("later", "running", "waiting"):
        job = read(engine, job_id)
        assert (job.state, job.outcome, job.failure_reason) == (JobState.SETTLED, Outcome.FAILED, "provider is down")
        stored = raw(engine, job_id)
        assert (stored["claim_token"], stored["lease_until"]) == (None, None)
    assert read(engine, "elsewhere").state is JobState.DELAYED


def test_purge_deletes_delayed_and_queued_jobs_and_keeps_running_and_settled_ones(engine: Engine) -> None:
    add(engine, Job("done", "q"))
    finished = claim_one(engine)
    run(engine, store.settle, job_id="done", claim_token=finished.token, decision=Decision.completed())
    add(engine, Job("running", "q"))
    claim_one(engine)
    add(engine, Job("waiting", "q"))
    delayed(engine, Job("later", "q"), Job("other-queue", "other"))
    assert Watchdog(engine).purge("q") == 2
    assert states(engine) == {"running": "running", "done": "settled", "other-queue": "delayed"}


# -- the CHECK grammar ---------------------------------------------------------------

#: A valid delayed row; each case changes it into one the database must refuse.
VALID_DELAYED: dict[str, Any] = {
    "queue_name": "q",
    "lane": "q",
    "priority": 0,
    "payload_json": "null",
    "state": "delayed",
    "outcome": None,
    "claim_token": None,
    "lease_until": None,
    "ready_at": 32_503_680_000_000,
    "attempt": 1,
    "max_attempts": None,
    "snoozes": 0,
    "timeout_ms": None,
    "recovery_count": 0,
}

REFUSED_ROWS: dict[str, tuple[dict[str, Any], str]] = {
    "delayed with a claim token": ({"claim_token": "t.1"}, "state_grammar"),
    "delayed with a lease": ({"lease_until": 32_503_680_000_000}, "state_grammar"),
    "delayed with an outcome": ({"outcome": "completed"}, "state_grammar"),
    "delayed without a ready time": ({"ready_at": None}, "state_grammar"),
    "attempt beyond max_attempts": ({"attempt": 4, "max_attempts": 3}, "attempt_bounds"),
    "attempt 0": ({"attempt": 0}, "attempt_bounds"),
    "max_attempts beyond the limit": ({"max_attempts": 1001}, "max_attempts_range"),
    "negative snoozes": ({"snoozes": -1}, "snoozes_nonnegative"),
    "zero timeout": ({"timeout_ms": 0}, "timeout_positive"),
}


def insert_raw(engine: Engine, job_id: str, **changes: Any) -> None:
    row = {**VALID_DELAYED, "job_id": job_id, **changes}
    columns = ", ".join(row)
    values = ", ".join(f":{name}" for name in row)
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO watchdog_jobs ({columns}) VALUES ({values})"), row)


def refused_by(error: IntegrityError, check: str) -> bool:
    """Whether the database named CHECK ``check`` as the one violated."""
    return f"ck_watchdog_jobs_{check}" in str(error.orig)


@pytest.mark.parametrize("case", list(REFUSED_ROWS))
def test_the_database_refuses_a_row_outside_the_grammar_on_insert(engine: Engine, case: str) -> None:
    changes, check = REFUSED_ROWS[case]
    insert_raw(engine, "valid")  # the statement itself is fine
    insert_raw(engine, "valid-at-the-last-attempt", state="queued", attempt=3, max_attempts=3)
    with pytest.raises(IntegrityError) as caught:
        insert_raw(engine, "refused", **changes)
    assert refused_by(caught.value, check), str(caught.value.orig)
    assert set(states(engine)) == {"valid", "valid-at-the-last-attempt"}


@pytest.mark.parametrize(
    ("assignment", "check"),
    [
        ("claim_token = 't.1'", "state_grammar"),
        ("lease_until = 32503680000000", "state_grammar"),
        ("outcome = 'failed'", "state_grammar"),
        ("ready_at = NULL", "state_grammar"),
        ("attempt = 0", "attempt_bounds"),
        ("attempt = max_attempts + 1", "attempt_bounds"),
        ("max_attempts = attempt - 1", "attempt_bounds"),
    ],
)
def test_the_database_refuses_an_update_outside_the_grammar(engine: Engine, assignment: str, check: str) -> None:
    insert_raw(engine, "d", attempt=2, max_attempts=3)
    before = raw(engine, "d")
    with pytest.raises(IntegrityError) as caught:
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE watchdog_jobs SET {assignment} WHERE job_id = 'd'"))
    assert refused_by(caught.value, check), str(caught.value.orig)
    assert raw(engine, "d") == before


# -- settle with a requeue -----------------------------------------------------------


def requeue(
    engine: Engine,
    claimed: Claim,
    *,
    after_ms: int | None = 60_000,
    decision: Decision | None = None,
    token: str | None = None,
    now: int | None = None,
    history: str | None = None,
) -> store.Settlement:
    request = SettleRequest(
        claimed.job.job_id,
        claimed.token if token is None else token,
        decision or Decision.failed("try again"),
        now,
        requeue_after_ms=after_ms,
        history=history,
    )
    settlement: store.Settlement
    (settlement,) = run(engine, store.settle_many, [request])
    return settlement


def test_a_requeue_moves_the_job_to_its_next_attempt_delayed_from_the_database_clock(engine: Engine) -> None:
    add(engine, Job("a", "q", retry=RetryPolicy(max_attempts=3)))
    claimed = claim_one(engine)
    before = db_clock(engine)
    settlement = requeue(engine, claimed, after_ms=60_000, decision=Decision.failed("card declined"))
    after = db_clock(engine)
    assert settlement.status is SettleStatus.REQUEUED
    job = settlement.job
    assert job is not None and job == read(engine, "a")
    assert (job.state, job.outcome, job.attempt, job.snoozes, job.failure_reason) == (
        JobState.DELAYED,
        None,
        2,
        0,
        "card declined",
    )
    assert before + 60_000 - TOLERANCE_MS <= ms(job.ready_at) <= after + 60_000 + TOLERANCE_MS
    stored = raw(engine, "a")
    assert (stored["claim_token"], stored["lease_until"]) == (None, None)
    # Its replay cannot be told from another runner's claim: a conflict, nothing changes.
    assert requeue(engine, claimed).status is SettleStatus.CONFLICT
    assert raw(engine, "a") == stored


def test_a_requeue_after_zero_is_queued_at_once(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    settlement = requeue(engine, claim_one(engine), after_ms=0)
    assert settlement.status is SettleStatus.REQUEUED
    assert settlement.job is not None and (settlement.job.state, settlement.job.attempt) == (JobState.QUEUED, 2)
    again = claim_one(engine)
    assert (again.job.job_id, again.job.attempt) == ("a", 2)


def test_a_requeue_needs_the_exact_token(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claimed = claim_one(engine)
    before = raw(engine, "a")
    assert requeue(engine, claimed, token=claimed.token + "x").status is SettleStatus.CONFLICT
    assert requeue(engine, claimed, token="").status is SettleStatus.CONFLICT
    assert raw(engine, "a") == before


def test_a_requeue_needs_a_live_lease(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claimed = claim_one(engine)
    before = raw(engine, "a")
    ten_days = store.now_ms() + 10 * 24 * 3600 * 1000
    assert requeue(engine, claimed, now=ten_days).status is SettleStatus.CONFLICT
    assert raw(engine, "a") == before
    run(engine, store.release, [("a", claimed.token)])  # the lease ends by the database clock
    ended = raw(engine, "a")
    assert requeue(engine, claimed).status is SettleStatus.CONFLICT
    assert raw(engine, "a") == ended


@pytest.mark.parametrize(
    "decision",
    [Decision.failed("try again"), Decision.snooze(timedelta(minutes=5))],
    ids=["retry", "snooze"],
)
def test_a_recorded_cancellation_turns_a_requeue_into_cancelled(engine: Engine, decision: Decision) -> None:
    add(engine, Job("a", "q"))
    claimed = claim_one(engine)
    assert Watchdog(engine).cancel("a", "stop-a").status is CancelStatus.RECORDED
    settlement = requeue(engine, claimed, decision=decision, after_ms=None if decision.snoozed else 60_000)
    assert settlement.status is SettleStatus.SETTLED
    job = settlement.job
    assert job is not None
    assert (job.state, job.outcome, job.failure_reason, job.attempt, job.snoozes) == (
        JobState.SETTLED,
        Outcome.CANCELLED,
        None,
        1,
        0,
    )


def test_a_snooze_uses_no_attempt_counts_itself_and_keeps_the_last_failure(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    requeue(engine, claim_one(engine), after_ms=0, decision=Decision.failed("first failure"))
    snoozed = requeue(engine, claim_one(engine), after_ms=None, decision=Decision.snooze(timedelta(minutes=5)))
    assert snoozed.status is SettleStatus.REQUEUED
    job = snoozed.job
    assert job is not None
    assert (job.state, job.attempt, job.snoozes, job.failure_reason) == (JobState.DELAYED, 2, 1, "first failure")


def test_the_database_refuses_a_requeue_past_the_jobs_max_attempts(engine: Engine) -> None:
    """The CHECK holds even for a writer that ignores the policy."""
    add(engine, Job("a", "q", retry=RetryPolicy(max_attempts=1)))
    claimed = claim_one(engine)
    before = raw(engine, "a")
    with pytest.raises(IntegrityError) as caught:
        requeue(engine, claimed)
    assert refused_by(caught.value, "attempt_bounds")
    assert raw(engine, "a") == before


# -- failure history -----------------------------------------------------------------


def test_failure_history_keeps_only_the_latest_attempts_and_bounds_their_reasons(engine: Engine) -> None:
    attempts = FAILURE_HISTORY_LENGTH + 3
    add(engine, Job("a", "q", retry=RetryPolicy(max_attempts=attempts, backoff=timedelta(milliseconds=1), jitter=0)))

    def fail(job: RunningJob) -> Decision:
        return Decision.failed(f"attempt {job.attempt}: " + "x" * 1000)

    runner = Runner(engine, {"q": fail}, poll_interval=timedelta(milliseconds=50))
    wait_until(lambda: runner.tick() and read(engine, "a").state is JobState.SETTLED, interval=0.005,
               what="every attempt to fail")  # fmt: skip
    job = read(engine, "a")
    assert (job.outcome, job.attempt) == (Outcome.FAILED, attempts)
    assert job.failure_reason is not None and job.failure_reason.startswith(f"attempt {attempts}: ")
    history = job.failure_history
    assert [entry.attempt for entry in history] == list(range(attempts - FAILURE_HISTORY_LENGTH + 1, attempts + 1))
    for entry in history:
        assert isinstance(entry, FailedAttempt)
        assert entry.reason.startswith(f"attempt {entry.attempt}: xxx")
        assert len(entry.reason) == FAILURE_HISTORY_REASON_LENGTH and entry.reason.endswith("…")
        assert entry.at.utcoffset() == timedelta(0)
    times = [entry.at for entry in history]
    assert times == sorted(times)
    assert abs(ms(times[-1]) - db_clock(engine)) < 60_000


# -- asyncio -------------------------------------------------------------------------


async def test_async_watchdog_and_async_enqueue_take_a_delay_counted_from_the_database_clock(db: Engine) -> None:
    aengine = make_async_engine(db)
    try:
        before = db_clock(db)
        watchdog = AsyncWatchdog(aengine)
        assert (await watchdog.enqueue(Job("client", "q"), delay=timedelta(minutes=10))).status is QUEUED
        async with AsyncSession(aengine) as session:
            session.add(Note(body="beside the job"))
            result = await watchdog_asyncio.enqueue(session, [Job("session", "q")], delay=timedelta(minutes=10))
            assert [r.status for r in result] == [QUEUED]
            await session.commit()
        after = db_clock(db)
        for job_id in ("client", "session"):
            job = await watchdog.read(job_id)
            assert job is not None and job.state is JobState.DELAYED, job_id
            assert before + 600_000 - TOLERANCE_MS <= ms(job.ready_at) <= after + 600_000 + TOLERANCE_MS
        # A replay with another delay is a duplicate; another run_at conflicts and rolls back.
        assert (await watchdog.enqueue(Job("client", "q"), delay=timedelta(seconds=1))).status is DUPLICATE
        kept = job_rows(db)
        async with AsyncSession(aengine) as session:
            session.add(Note(body="must not commit"))
            with pytest.raises(EnqueueConflict):
                await watchdog_asyncio.enqueue(session, Job("session", "q", run_at=FAR))
            await session.commit()
        with pytest.raises(InvalidJob) as caught:
            await watchdog.enqueue(Job("bad", "q"), delay=timedelta(0))
        assert caught.value.field == "delay"
        # A delayed job cancelled from asyncio is made queued for its cancelled settle.
        assert (await watchdog.cancel("client", "stop", only_if_queued=True)).status is CancelStatus.RECORDED
    finally:
        await aengine.dispose()
    assert note_bodies(db) == ["beside the job"]
    assert [r for r in job_rows(db) if r["job_id"] != "client"] == [r for r in kept if r["job_id"] != "client"]
    assert read(db, "client").state is JobState.QUEUED


async def test_async_watchdog_reads_the_policy_fields_as_watchdog_does(engine: Engine) -> None:
    add(engine, Job("a", "q", retry=RetryPolicy(max_attempts=2), timeout=timedelta(seconds=9)))
    aengine = make_async_engine(engine)
    try:
        job = await AsyncWatchdog(aengine).read("a")
    finally:
        await aengine.dispose()
    assert job == read(engine, "a")
    assert job is not None and (job.max_attempts, job.timeout) == (2, timedelta(seconds=9))
