"""sqlalchemy_watchdog.testing: the helpers users' test suites call, on both dialects."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, String, event, insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_watchdog import (
    Decision,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    RetryPolicy,
    Runner,
    RunningJob,
    TickResult,
    TickStatus,
    Watchdog,
    enqueue,
    handler,
    testing,
)
from sqlalchemy_watchdog import asyncio as wd_asyncio
from sqlalchemy_watchdog.core.handlers import _registry
from sqlalchemy_watchdog.store import dependencies_sql, maintenance_sql
from sqlalchemy_watchdog.testing import (
    ANY,
    RunnerFactory,
    assert_enqueued,
    assert_enqueued_async,
    assert_not_enqueued,
    assert_not_enqueued_async,
    drain,
    drain_async,
    enqueued_jobs,
    enqueued_jobs_async,
    make_due,
    make_due_async,
)
from tests.conftest import make_async_engine
from tests.helpers import add, read, wait_until

# The dialect does not matter here but where a test says dialect_specific: the PostgreSQL copy
# runs under CI=true or WATCHDOG_ALL_DIALECTS=1 (tests/conftest.py).
pytestmark = pytest.mark.dialect_neutral

#: The plugin's end-to-end tests run a user's test module with pytest's pytester.
pytest_plugins = ["pytester"]

HOUR = timedelta(hours=1)


class AppBase(DeclarativeBase):
    pass


class Order(AppBase):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(100))


@pytest.fixture
def db(engine: Engine) -> Engine:
    """``engine`` with the application's ``orders`` table beside ``watchdog_jobs``."""
    AppBase.metadata.create_all(engine)
    return engine


@pytest.fixture
def empty_registry() -> Iterator[None]:
    """The @handler registry emptied for the test and restored after it."""
    saved = dict(_registry)
    _registry.clear()
    try:
        yield
    finally:
        _registry.clear()
        _registry.update(saved)


def ids(jobs: list[Any]) -> list[str]:
    return [job.job_id for job in jobs]


def completed(job: RunningJob) -> None:
    return None


# -- reading inside the caller's transaction -------------------------------------------


@pytest.mark.dialect_specific
def test_a_session_sees_the_jobs_it_enqueued_before_commit_and_nobody_else_does(db: Engine) -> None:
    with Session(db) as session:
        session.add(Order(id=1, email="ada@example.com"))
        enqueue(session, Job("confirm-1", "emails", payload={"order_id": 1}))
        [job] = enqueued_jobs(session)
        assert (job.job_id, job.state, job.payload) == ("confirm-1", JobState.QUEUED, {"order_id": 1})
        assert enqueued_jobs(db) == []  # not committed: another connection sees nothing
        assert_not_enqueued(db)
        session.rollback()
        assert enqueued_jobs(session) == []
    assert enqueued_jobs(db) == []


@pytest.mark.dialect_specific
def test_a_session_is_flushed_first_so_jobs_enqueued_by_flush_hooks_are_seen(db: Engine) -> None:
    # An application that enqueues from an ORM hook: the job exists only once
    # the session flushes, which the helper does before reading.
    with Session(db) as session:

        @event.listens_for(session, "after_flush")
        def confirm_new_orders(session: Session, context: Any) -> None:
            for order in session.new:
                if isinstance(order, Order):
                    enqueue(session, Job(f"confirm-{order.id}", "emails", payload={"order_id": order.id}))

        session.add(Order(id=7, email="bob@example.com"))
        [job] = assert_enqueued(session, queue="emails", payload={"order_id": 7})
        assert job.job_id == "confirm-7"
        session.commit()
    assert ids(enqueued_jobs(db)) == ["confirm-7"]


@pytest.mark.dialect_specific
def test_a_connection_is_read_inside_its_transaction(db: Engine) -> None:
    with db.connect() as conn:
        conn.execute(insert(Order).values(id=1, email="a@example.com"))
        enqueue(conn, Job("kept", "q"))
        assert ids(enqueued_jobs(conn)) == ["kept"]
        conn.commit()
        enqueue(conn, Job("dropped", "q"))
        assert ids(enqueued_jobs(conn)) == ["kept", "dropped"]
        conn.rollback()
        assert ids(enqueued_jobs(conn)) == ["kept"]
    assert ids(enqueued_jobs(db)) == ["kept"]


def test_filters_by_queue_job_id_and_state_in_admission_order(engine: Engine) -> None:
    watchdog = Watchdog(engine)
    watchdog.enqueue([Job("a", "emails"), Job("b", "sms"), Job("c", "emails", priority=9)])
    watchdog.enqueue(Job("later", "emails"), delay=HOUR)
    drain(engine, {"sms": completed})
    assert ids(enqueued_jobs(engine)) == ["a", "b", "c", "later"]
    assert ids(enqueued_jobs(engine, queue="emails")) == ["a", "c", "later"]
    assert ids(enqueued_jobs(engine, queue="emails", state="queued")) == ["a", "c"]
    assert ids(enqueued_jobs(engine, state=JobState.DELAYED)) == ["later"]
    assert ids(enqueued_jobs(engine, state="settled")) == ["b"]
    assert ids(enqueued_jobs(engine, job_id="c")) == ["c"]
    assert enqueued_jobs(engine, job_id="c", queue="sms") == []
    assert enqueued_jobs(engine, job_id="c", state="settled") == []
    assert enqueued_jobs(engine, job_id="missing") == []


def test_more_jobs_than_one_page_are_all_read(engine: Engine) -> None:
    jobs = [Job(f"bulk-{i:05}", "bulk") for i in range(1_005)]
    add(engine, *jobs, Job("other", "elsewhere"))
    assert ids(enqueued_jobs(engine, queue="bulk")) == [job.job_id for job in jobs]
    assert_enqueued(engine, queue="bulk", count=1_005)


@pytest.mark.parametrize(
    ("filters", "field"),
    [
        ({"state": "finished"}, "state"),
        ({"queue": ""}, "queue"),
        ({"queue": 7}, "queue"),
        ({"job_id": "x" * 257}, "job_id"),
    ],
    ids=["unknown state", "empty queue", "queue not a str", "job_id too long"],
)
def test_a_malformed_filter_is_refused_naming_it(engine: Engine, filters: dict[str, Any], field: str) -> None:
    for check in (enqueued_jobs, assert_enqueued, assert_not_enqueued):
        with pytest.raises(InvalidJob) as caught:
            check(engine, **filters)
        assert caught.value.field == field, check


def test_what_is_not_a_sync_target_is_refused(engine: Engine) -> None:
    with pytest.raises(TypeError, match="Session, Connection or Engine"):
        enqueued_jobs("sqlite:///watchdog.db")  # type: ignore[arg-type]
    async_engine = make_async_engine(engine)
    with pytest.raises(TypeError, match="_async"):
        assert_enqueued(async_engine)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="make_due_async"):
        make_due(async_engine)  # type: ignore[arg-type]


# -- assert_enqueued / assert_not_enqueued ----------------------------------------------

ORDER_PAYLOAD = {"order_id": 42, "customer": {"name": "ada", "tags": ["vip", "eu"]}, "express": True, "items": [1, 2]}


@pytest.mark.parametrize(
    "payload",
    [
        ANY,
        {},
        {"order_id": 42},
        {"customer": {"name": "ada"}},
        {"customer": {"tags": ["vip", "eu"]}},
        {"order_id": ANY, "items": [1, ANY]},
        {"items": (1, 2)},
        ORDER_PAYLOAD,
    ],
    ids=repr,
)
def test_a_payload_matches_when_the_stored_one_contains_it(engine: Engine, payload: Any) -> None:
    add(engine, Job("order-42", "orders", payload=ORDER_PAYLOAD))
    [job] = assert_enqueued(engine, payload=payload)
    assert job.job_id == "order-42"
    with pytest.raises(AssertionError):
        assert_not_enqueued(engine, payload=payload)


@pytest.mark.parametrize(
    "payload",
    [
        {"order_id": 43},
        {"order_id": "42"},
        {"express": 1},  # a bool is not an int
        {"customer": {"name": "ada", "age": 36}},  # a key it lacks
        {"customer": {"tags": ["vip"]}},  # lists are equal or not: no sub-lists
        {"items": [2, 1]},
        {"customer": "ada"},
        None,
        [ORDER_PAYLOAD],
    ],
    ids=repr,
)
def test_a_payload_does_not_match_otherwise(engine: Engine, payload: Any) -> None:
    add(engine, Job("order-42", "orders", payload=ORDER_PAYLOAD))
    with pytest.raises(AssertionError):
        assert_enqueued(engine, payload=payload)
    assert_not_enqueued(engine, payload=payload)


def test_scalar_and_null_payloads_match_by_equality(engine: Engine) -> None:
    add(engine, Job("none", "q"), Job("zero", "q", payload=0), Job("false", "q", payload=False))
    assert ids(assert_enqueued(engine, payload=None)) == ["none"]
    assert ids(assert_enqueued(engine, payload=0)) == ["zero"]
    assert ids(assert_enqueued(engine, payload=False)) == ["false"]


def test_the_failure_message_lists_what_is_enqueued(engine: Engine) -> None:
    add(
        engine,
        Job("confirm-order-1", "emails", payload={"order_id": 1}),
        Job("remind-order-1", "reminders", payload={"order_id": 1, "note": "x" * 500}),
        Job("done", "sms"),
    )
    drain(engine, {"sms": completed})
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(engine, queue="emails", payload={"order_id": 2})
    message = str(caught.value)
    assert message.startswith("expected a job matching queue='emails', payload containing {'order_id': 2}; found none")
    lines = message.splitlines()
    assert '  - confirm-order-1  queue=emails  state=queued  payload={"order_id": 1}' in lines
    assert "  - done  queue=sms  state=settled (completed)  payload=null" in lines
    [long] = [line for line in lines if line.startswith("  - remind-order-1")]
    assert long.endswith("...") and len(long.split("payload=", 1)[1]) == 200


def test_count_asks_for_exactly_that_many(engine: Engine) -> None:
    add(engine, Job("a", "q", payload={"k": 1}), Job("b", "q", payload={"k": 1}), Job("c", "q", payload={"k": 2}))
    assert ids(assert_enqueued(engine, queue="q", payload={"k": 1}, count=2)) == ["a", "b"]
    assert assert_enqueued(engine, queue="other", count=0) == []
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(engine, payload={"k": 1}, count=1)
    message = str(caught.value)
    assert message.startswith("expected 1 job(s) matching payload containing {'k': 1}; found 2:")
    assert "  - a  queue=q" in message and "  - b  queue=q" in message


@pytest.mark.parametrize("count", [-1, True, 1.0, "2"], ids=repr)
def test_a_bad_count_is_refused_naming_it(engine: Engine, count: Any) -> None:
    add(engine, Job("a", "q"))
    with pytest.raises(InvalidJob) as caught:
        assert_enqueued(engine, count=count)
    assert caught.value.field == "count"


def test_a_long_table_is_cut_in_the_message(engine: Engine) -> None:
    add(engine, *(Job(f"job-{i:02}", "q") for i in range(25)))
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(engine, queue="missing")
    lines = str(caught.value).splitlines()
    assert "  - job-19  queue=q  state=queued  payload=null" in lines
    assert not any(line.startswith("  - job-20") for line in lines)
    assert lines[-1] == "  - ... and more"


def test_assert_not_enqueued_fails_listing_the_matches(engine: Engine) -> None:
    assert_not_enqueued(engine)
    add(engine, Job("a", "emails", payload={"to": "ada"}), Job("b", "sms"))
    assert_not_enqueued(engine, queue="push")
    assert_not_enqueued(engine, job_id="a", queue="sms")
    assert_not_enqueued(engine, queue="emails", state="settled")
    with pytest.raises(AssertionError) as caught:
        assert_not_enqueued(engine, queue="emails")
    assert str(caught.value).splitlines() == [
        "expected no job matching queue='emails'; found 1:",
        '  - a  queue=emails  state=queued  payload={"to": "ada"}',
    ]
    with pytest.raises(AssertionError, match="expected no job matching \\(any job\\); found 2"):
        assert_not_enqueued(engine)


# -- drain --------------------------------------------------------------------------


def test_drain_settles_every_ready_job_and_returns_them_in_settle_order(engine: Engine) -> None:
    add(engine, Job("a", "emails"), Job("b", "emails", priority=5), Job("c", "sms"), Job("d", "other"))
    Watchdog(engine).cancel("a", "user-cancel")
    settled = drain(engine, {"emails": completed, "sms": lambda job: Decision.failed("no signal")})
    assert [(job.job_id, job.outcome) for job in settled] == [
        ("b", Outcome.COMPLETED),
        ("a", Outcome.CANCELLED),
        ("c", Outcome.FAILED),
    ]
    assert read(engine, "d").state is JobState.QUEUED  # no handler, not drained


def test_drain_runs_only_the_queues_asked_for(engine: Engine) -> None:
    add(engine, Job("a", "emails"), Job("b", "sms"))
    assert ids(drain(engine, {"emails": completed, "sms": completed}, queues=["sms"])) == ["b"]
    assert read(engine, "a").state is JobState.QUEUED


def test_drain_uses_the_registered_handlers_by_default(engine: Engine, empty_registry: None) -> None:
    @handler("emails")
    def send(job: RunningJob) -> None:
        return None

    add(engine, Job("a", "emails"), Job("b", "unregistered"))
    [job] = drain(engine)
    assert (job.job_id, job.outcome) == ("a", Outcome.COMPLETED)


def test_a_job_retried_without_a_wait_runs_again_in_the_same_drain(engine: Engine) -> None:
    attempts: list[int] = []

    def flaky(job: RunningJob) -> Decision | None:
        attempts.append(job.attempt)
        return Decision.retry("try again", after=timedelta(0)) if job.attempt < 3 else None

    add(engine, Job("a", "q", retry=RetryPolicy(max_attempts=3)))
    [job] = drain(engine, {"q": flaky})
    assert attempts == [1, 2, 3]
    assert (job.outcome, job.attempt, len(job.failure_history)) == (Outcome.COMPLETED, 3, 2)


def test_without_advance_time_delayed_jobs_wait(engine: Engine) -> None:
    ran: list[str] = []
    Watchdog(engine).enqueue(Job("later", "q"), delay=HOUR)
    add(engine, Job("now", "q"))
    before = read(engine, "later")
    assert ids(drain(engine, {"q": lambda job: ran.append(job.job_id)})) == ["now"]
    assert ran == ["now"]
    after = read(engine, "later")
    assert (after.state, after.ready_at) == (JobState.DELAYED, before.ready_at)


def test_a_failed_attempt_waiting_for_its_backoff_is_left_waiting_without_advance_time(engine: Engine) -> None:
    add(engine, Job("a", "q", retry=RetryPolicy(max_attempts=3, backoff=HOUR)))
    assert drain(engine, {"q": lambda job: Decision.failed("down")}) == []
    job = read(engine, "a")
    assert (job.state, job.attempt) == (JobState.DELAYED, 2)


def test_advance_time_plays_a_whole_retry_schedule_without_waiting(engine: Engine) -> None:
    attempts: list[int] = []

    def flaky(job: RunningJob) -> Decision | None:
        attempts.append(job.attempt)
        return Decision.failed(f"attempt {job.attempt} failed") if job.attempt < 4 else None

    add(
        engine,
        Job("a", "q", retry=RetryPolicy(max_attempts=5, backoff=HOUR, factor=10, max_backoff=timedelta(days=30))),
    )
    started = time.monotonic()
    [job] = drain(engine, {"q": flaky}, advance_time=True)
    assert time.monotonic() - started < 60
    assert attempts == [1, 2, 3, 4]
    assert (job.outcome, job.attempt) == (Outcome.COMPLETED, 4)
    assert [failure.reason for failure in job.failure_history] == [f"attempt {n} failed" for n in (1, 2, 3)]


SHORT_BACKOFF = RetryPolicy(max_attempts=6, backoff=timedelta(milliseconds=2), jitter=0.5)


def fails_five_times(job: RunningJob) -> Decision | None:
    return Decision.failed(f"attempt {job.attempt} failed") if job.attempt <= 5 else None


def slow_make_due(engine: Engine) -> None:
    """Let 10 ms pass before each make_due statement (a busy CI machine):
    a retry's 1-3 ms backoff then always ends between the idle tick and
    make_due, which finds nothing left to make due."""

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("UPDATE watchdog_jobs SET ready_at="):
            time.sleep(0.01)

    event.listen(engine, "before_cursor_execute", before)


def test_advance_time_returns_only_when_no_retry_with_a_short_backoff_is_left_waiting(engine: Engine) -> None:
    # A 2 ms backoff can expire between the idle tick and make_due, which
    # then changes nothing: drain must still go on until nothing waits.
    slow_make_due(engine)
    for round_ in range(3):
        add(engine, *(Job(f"r{round_}-{i}", "q", retry=SHORT_BACKOFF) for i in range(10)))
        settled = drain(engine, {"q": fails_five_times}, advance_time=True)
        assert sorted((job.job_id, job.outcome, job.attempt) for job in settled) == [
            (f"r{round_}-{i}", Outcome.COMPLETED, 6) for i in range(10)
        ]


async def test_drain_async_with_advance_time_leaves_no_retry_with_a_short_backoff_waiting(engine: Engine) -> None:
    async def flaky(job: RunningJob) -> Decision | None:
        return fails_five_times(job)

    async_engine = make_async_engine(engine)
    slow_make_due(async_engine.sync_engine)
    try:
        for round_ in range(2):
            add(engine, *(Job(f"r{round_}-{i}", "q", retry=SHORT_BACKOFF) for i in range(10)))
            settled = await drain_async(async_engine, {"q": flaky}, advance_time=True)
            assert sorted((job.job_id, job.outcome) for job in settled) == [
                (f"r{round_}-{i}", Outcome.COMPLETED) for i in range(10)
            ]
    finally:
        await async_engine.dispose()


def test_advance_time_returns_with_the_jobs_of_a_paused_queue_left_queued(engine: Engine) -> None:
    add(engine, Job("held", "q"))
    Watchdog(engine).pause("q", reason="maintenance")
    assert drain(engine, {"q": completed}, advance_time=True) == []
    assert read(engine, "held").state is JobState.QUEUED


def test_advance_time_raises_naming_the_jobs_left_when_nothing_runs_them(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(engine, Job("stuck", "q"))
    monkeypatch.setattr(Runner, "tick", lambda self: TickResult(TickStatus.IDLE))  # a runner that claims nothing
    with pytest.raises(AssertionError, match=r"jobs still wait to run .*: stuck \(queued\)"):
        drain(engine, {"q": completed}, advance_time=True)


def _chain(engine: Engine) -> None:
    """a -> b -> c, b due an hour after its release, c failing its first attempt with an hour's backoff."""
    retry = RetryPolicy(max_attempts=2, backoff=HOUR)
    add(
        engine,
        Job("a", "q", payload=1),
        Job("b", "q", after=["a"], run_at=datetime.now(UTC) + HOUR),
        Job("c", "q", after=["b"], retry=retry),
    )


def _step_of(job: RunningJob, parents: tuple[Any, ...]) -> Any:
    """1 for a, one more than its parent's result for b and c (whose first attempt fails)."""
    if job.job_id == "c" and job.attempt == 1:
        return Decision.failed("not yet")
    return 1 + sum(parent.result for parent in parents)


def _step(job: RunningJob) -> Any:
    return _step_of(job, job.parent_results())


def test_advance_time_drains_a_whole_chain_of_dependents_in_one_call(engine: Engine) -> None:
    _chain(engine)
    settled = drain(engine, {"q": _step}, advance_time=True)
    assert [(job.job_id, job.outcome, job.result) for job in settled] == [
        ("a", Outcome.COMPLETED, 1),
        ("b", Outcome.COMPLETED, 2),
        ("c", Outcome.COMPLETED, 3),
    ]


def test_advance_time_settles_a_cancelled_chain_in_one_call(engine: Engine) -> None:
    # a cancelled before it ran: its claim settles it cancelled, the edge trigger
    # cancels b, and c hears of it only from a runner's later pass (one hop each).
    add(engine, Job("a", "q"), Job("b", "q", after=["a"]), Job("c", "q", after=["b"]), Job("d", "q", after=["c"]))
    Watchdog(engine).cancel("a", "stop-a")
    drain(engine, {"q": completed}, advance_time=True)
    assert [(read(engine, j).state, read(engine, j).outcome) for j in "abcd"] == [
        (JobState.SETTLED, Outcome.CANCELLED)
    ] * 4


def test_advance_time_names_a_job_waiting_for_a_parent_in_a_queue_it_does_not_run(engine: Engine) -> None:
    add(engine, Job("elsewhere", "other"), Job("ran", "q"), Job("dependent", "q", after=["elsewhere", "ran"]))
    with pytest.raises(
        AssertionError,
        match=r"jobs still wait to run .*: dependent \(waiting for elsewhere: queued in queue 'other'\)$",
    ):
        drain(engine, {"q": completed}, queues=["q"], advance_time=True)
    assert read(engine, "ran").outcome is Outcome.COMPLETED  # what could run did
    assert read(engine, "dependent").state is JobState.WAITING
    # Without advance_time a drain stops when nothing is ready, as for delayed jobs.
    assert drain(engine, {"q": completed}, queues=["q"]) == []


@contextmanager
def _held_parent(engine: Engine) -> Iterator[threading.Event]:
    """Another runner (a thread of this process, as a deployed worker would be)
    serving queue ``other``, whose job ``parent`` is running -- held until the
    yielded event is set -- inside the block; ``dependent`` (queue ``q``)
    waits for it. Released and stopped at the block's end."""
    release = threading.Event()
    add(engine, Job("parent", "other"), Job("dependent", "q", after=["parent"]))
    other = Runner(engine, {"other": lambda job: release.wait(30) and None}, poll_interval=timedelta(seconds=0.05))
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        wait_until(lambda: read(engine, "parent").state is JobState.RUNNING, what="the other runner runs the parent")
        yield release
    finally:
        release.set()
        other.stop()
        thread.join(30)


def test_advance_time_waits_for_a_parent_another_runner_is_running(engine: Engine) -> None:
    with _held_parent(engine) as release:
        # Held for a second: far longer than the drain's idle passes take on their own.
        threading.Timer(1.0, release.set).start()
        settled = drain(engine, {"q": completed}, queues=["q"], advance_time=True)
        assert ids(settled) == ["dependent"]
        assert read(engine, "parent").outcome is Outcome.COMPLETED
        assert read(engine, "dependent").outcome is Outcome.COMPLETED


@contextmanager
def _parent_settles_after_the_first_read(
    engine: Engine, release: threading.Event, listened: Engine | None = None
) -> Iterator[threading.Event]:
    """Right after the drain's first read of an idle pass -- the jobs still
    ready or the jobs waiting for parents, whichever it makes first -- let
    the held parent go and wait until its settle has released ``dependent``,
    so that the release commits between the drain's two reads. ``listened``:
    the engine the drain runs on (an ``AsyncEngine``'s ``sync_engine``), when
    it is not ``engine``."""
    reads = (maintenance_sql.waiting_jobs(), dependencies_sql.waiting_for())
    listened = engine if listened is None else listened
    fired = threading.Event()

    def after_first_read(conn: Any, clauseelement: Any, *args: Any) -> None:
        if fired.is_set() or not any(clauseelement is statement for statement in reads):
            return
        fired.set()
        release.set()
        wait_until(lambda: read(engine, "dependent").state is JobState.QUEUED, what="the parent's settle")

    event.listen(listened, "after_execute", after_first_read)
    try:
        yield fired
    finally:
        event.remove(listened, "after_execute", after_first_read)


# Commits between two statements of a drain: PostgreSQL (on SQLite each read's
# transaction holds the write lock, so the parent cannot settle inside it).
@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", ["postgresql"])
def test_a_parent_settled_between_the_drains_two_reads_still_has_its_dependent_run(engine: Engine) -> None:
    with _held_parent(engine) as release, _parent_settles_after_the_first_read(engine, release) as fired:
        settled = drain(engine, {"q": completed}, queues=["q"], advance_time=True)
    assert fired.is_set()
    assert ids(settled) == ["dependent"]


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_drain_async_runs_a_dependent_released_between_its_two_reads(engine: Engine) -> None:
    async_engine = make_async_engine(engine)
    try:
        with _held_parent(engine) as release:
            with _parent_settles_after_the_first_read(engine, release, async_engine.sync_engine) as fired:
                settled = await drain_async(async_engine, {"q": completed}, queues=["q"], advance_time=True)
        assert fired.is_set()
        assert ids(settled) == ["dependent"]
    finally:
        await async_engine.dispose()


async def test_drain_async_waits_for_a_parent_another_runner_is_running(engine: Engine) -> None:
    async_engine = make_async_engine(engine)
    try:
        with _held_parent(engine) as release:
            threading.Timer(1.0, release.set).start()
            settled = await drain_async(async_engine, {"q": completed}, queues=["q"], advance_time=True)
            assert ids(settled) == ["dependent"]
            assert read(engine, "parent").outcome is Outcome.COMPLETED
    finally:
        await async_engine.dispose()


def test_advance_time_names_a_running_parent_that_does_not_settle_in_time(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(testing, "DRAIN_RUNNING_PARENT_WAIT", 0.3)
    with _held_parent(engine):
        started = time.monotonic()
        with pytest.raises(AssertionError, match=r": dependent \(waiting for parent: running in queue 'other'\)$"):
            drain(engine, {"q": completed}, queues=["q"], advance_time=True)
        assert time.monotonic() - started >= 0.3  # it waited for the parent first
        assert read(engine, "dependent").state is JobState.WAITING


async def test_drain_async_drains_a_chain_and_names_a_job_waiting_for_an_undrained_queue(engine: Engine) -> None:
    _chain(engine)
    add(engine, Job("elsewhere", "other"), Job("dependent", "q", after=["elsewhere"]))

    async def step(job: RunningJob) -> Any:
        return _step_of(job, await job.parent_results_async())

    async_engine = make_async_engine(engine)
    try:
        with pytest.raises(AssertionError, match=r": dependent \(waiting for elsewhere: queued in queue 'other'\)$"):
            await drain_async(async_engine, {"q": step}, advance_time=True)
        assert [(read(engine, j).outcome, read(engine, j).result) for j in "abc"] == [
            (Outcome.COMPLETED, 1),
            (Outcome.COMPLETED, 2),
            (Outcome.COMPLETED, 3),
        ]
    finally:
        await async_engine.dispose()


def test_advance_time_runs_future_jobs_delays_and_snoozes(engine: Engine) -> None:
    from datetime import UTC, datetime

    far = datetime.now(UTC) + timedelta(days=365)
    add(engine, Job("run-at", "q", run_at=far))
    Watchdog(engine).enqueue(Job("delayed", "q"), delay=timedelta(days=2))
    add(engine, Job("snoozer", "q"))

    def work(job: RunningJob) -> Decision | None:
        if job.job_id == "snoozer" and job.snoozes < 2:
            return Decision.snooze(HOUR)
        return None

    settled = drain(engine, {"q": work}, advance_time=True)
    assert sorted(ids(settled)) == ["delayed", "run-at", "snoozer"]
    assert {job.outcome for job in settled} == {Outcome.COMPLETED}
    snoozer = read(engine, "snoozer")
    assert (snoozer.snoozes, snoozer.attempt) == (2, 1)
    assert read(engine, "run-at").run_at == far.replace(microsecond=far.microsecond // 1000 * 1000)


def test_advance_time_leaves_the_other_queues_alone(engine: Engine) -> None:
    watchdog = Watchdog(engine)
    watchdog.enqueue([Job("mine", "q"), Job("theirs", "other")], delay=HOUR)
    before = read(engine, "theirs")
    assert ids(drain(engine, {"q": completed, "other": completed}, queues=["q"], advance_time=True)) == ["mine"]
    after = read(engine, "theirs")
    assert (after.state, after.ready_at) == (JobState.DELAYED, before.ready_at)


def test_max_jobs_bounds_a_handler_that_snoozes_forever(engine: Engine) -> None:
    calls: list[int] = []

    def sleepy(job: RunningJob) -> Decision:
        calls.append(job.snoozes)
        return Decision.snooze(HOUR)

    add(engine, Job("a", "q"))
    assert drain(engine, {"q": sleepy}, advance_time=True, max_jobs=5) == []
    assert calls == [0, 1, 2, 3, 4]
    assert read(engine, "a").state is JobState.DELAYED


def test_max_jobs_stops_a_long_drain_and_the_next_drain_goes_on(engine: Engine) -> None:
    add(engine, *(Job(f"j{i}", "q") for i in range(5)))
    assert ids(drain(engine, {"q": completed}, max_jobs=3)) == ["j0", "j1", "j2"]
    assert ids(drain(engine, {"q": completed})) == ["j3", "j4"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_jobs": 0}, "max_jobs"),
        ({"max_jobs": True}, "max_jobs"),
        ({"advance_time": "yes"}, "advance_time"),
        ({"queues": "q"}, "queues"),
        ({"concurrency": 0}, "concurrency"),
    ],
    ids=repr,
)
def test_bad_drain_settings_are_refused_and_nothing_runs(engine: Engine, kwargs: dict[str, Any], field: str) -> None:
    ran: list[str] = []
    add(engine, Job("a", "q"))
    with pytest.raises(InvalidJob) as caught:
        drain(engine, {"q": lambda job: ran.append(job.job_id)}, **kwargs)
    assert caught.value.field == field
    assert ran == [] and read(engine, "a").state is JobState.QUEUED


def test_drain_passes_runner_settings_on(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    [job] = drain(
        engine,
        {"q": lambda job: Decision.failed("down")},
        retry=RetryPolicy(max_attempts=2, backoff=HOUR),
        advance_time=True,
    )
    assert (job.outcome, job.attempt) == (Outcome.FAILED, 2)


# -- make_due ---------------------------------------------------------------------


def test_make_due_moves_only_delayed_jobs_whose_time_has_not_come(engine: Engine) -> None:
    watchdog = Watchdog(engine)
    watchdog.enqueue([Job("d1", "q"), Job("d2", "q"), Job("d-other", "other")], delay=HOUR)
    add(engine, Job("queued", "q"))
    before = {job.job_id: job for job in enqueued_jobs(engine)}
    assert make_due(engine, queues=["q"]) == 2
    for job_id in ("d1", "d2"):
        job, was = read(engine, job_id), before[job_id]
        # Still delayed -- promotion is what makes it queued -- but due now.
        assert job.state is JobState.DELAYED
        assert job.ready_at is not None and was.ready_at is not None
        assert job.ready_at <= was.ready_at - HOUR + timedelta(minutes=1)
    assert read(engine, "d-other") == before["d-other"]
    assert read(engine, "queued") == before["queued"]
    due = read(engine, "d1")
    assert make_due(engine, queues=["q"]) == 0  # already due: unchanged
    assert make_due(engine, queues=[]) == 0
    assert read(engine, "d1") == due
    assert make_due(engine) == 1  # every queue: d-other
    assert read(engine, "d-other").state is JobState.DELAYED


@pytest.mark.parametrize(("queues", "field"), [("q", "queues"), (["q", ""], "queue"), ([None], "queue")], ids=repr)
def test_make_due_refuses_bad_queues_and_changes_nothing(engine: Engine, queues: Any, field: str) -> None:
    Watchdog(engine).enqueue(Job("d", "q"), delay=HOUR)
    before = read(engine, "d")
    with pytest.raises(InvalidJob) as caught:
        make_due(engine, queues=queues)
    assert caught.value.field == field
    assert read(engine, "d") == before


# -- the asyncio twins --------------------------------------------------------------


@pytest.mark.dialect_specific
async def test_the_async_helpers_read_inside_an_async_session(db: Engine) -> None:
    async_engine = make_async_engine(db)
    try:
        async with AsyncSession(async_engine) as session:
            session.add(Order(id=1, email="ada@example.com"))
            await wd_asyncio.enqueue(session, Job("confirm-1", "emails", payload={"order_id": 1, "express": False}))
            [job] = await assert_enqueued_async(session, queue="emails", payload={"order_id": 1})
            assert job.job_id == "confirm-1"
            await assert_not_enqueued_async(async_engine)  # not committed
            await session.commit()
        assert ids(await enqueued_jobs_async(async_engine, queue="emails")) == ["confirm-1"]
        async with async_engine.connect() as conn:
            assert ids(await enqueued_jobs_async(conn, state="queued")) == ["confirm-1"]
        with pytest.raises(AssertionError, match="found none"):
            await assert_enqueued_async(async_engine, payload={"express": 0})
        with pytest.raises(TypeError, match="without _async"):
            await enqueued_jobs_async(db)  # type: ignore[arg-type]
    finally:
        await async_engine.dispose()


async def test_drain_async_runs_coroutine_handlers_and_advances_time(engine: Engine) -> None:
    attempts: list[int] = []

    async def flaky(job: RunningJob) -> Decision | None:
        attempts.append(job.attempt)
        return Decision.failed("not yet") if job.attempt < 3 else None

    add(engine, Job("a", "q", retry=RetryPolicy(max_attempts=3, backoff=HOUR)), Job("b", "q"))
    async_engine = make_async_engine(engine)
    try:
        settled = await drain_async(async_engine, {"q": flaky})
        assert ids(settled) == ["b"]  # a waits for its backoff
        settled = await drain_async(async_engine, {"q": flaky}, advance_time=True)
        assert [(job.job_id, job.outcome, job.attempt) for job in settled] == [("a", Outcome.COMPLETED, 3)]
        Watchdog(engine).enqueue(Job("later", "q"), delay=HOUR)
        assert await make_due_async(async_engine, queues=["q"]) == 1
        with pytest.raises(InvalidJob) as caught:
            await drain_async(async_engine, {"q": flaky}, max_jobs=-1)
        assert caught.value.field == "max_jobs"
        with pytest.raises(TypeError, match="use make_due"):
            await make_due_async(engine)  # type: ignore[arg-type]
    finally:
        await async_engine.dispose()


# -- RunnerFactory ------------------------------------------------------------------


def test_runner_factory_serves_in_the_background_and_close_stops_every_runner(engine: Engine) -> None:
    factory = RunnerFactory(engine)
    ran = threading.Event()
    served = factory.serve({"q": lambda job: ran.set()}, poll_interval=timedelta(milliseconds=50))
    ticking = factory({"q": completed})
    add(engine, Job("a", "q"))
    assert ran.wait(20), "the served runner ran the job"
    wait_until(lambda: read(engine, "a").state is JobState.SETTLED, what="a to settle")
    assert served is not ticking and factory.runners == [served, ticking]
    factory.close(timeout=30)
    assert not [t for t in threading.enumerate() if t.name.startswith("watchdog-test-runner")]
    assert factory.runners == []
    add(engine, Job("b", "q"))
    time.sleep(0.3)  # several poll intervals: a stopped runner claims nothing
    assert read(engine, "b").state is JobState.QUEUED


# -- the pytest plugin, end to end (pytester) ------------------------------------------
#: A user's test module using the plugin's fixtures and the helpers.
USER_TESTS = """
import threading
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import Job, Outcome, Watchdog, enqueue
from sqlalchemy_watchdog.testing import assert_enqueued, assert_not_enqueued, drain


def test_the_tables_are_migrated_to_the_packages_head(watchdog_engine):
    with watchdog_engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "{head}"
        assert conn.execute(text("SELECT count(*) FROM watchdog_queue_pauses")).scalar_one() == 0


def test_enqueue_in_a_session_then_drain(watchdog_engine):
    with Session(watchdog_engine) as session:
        enqueue(session, Job("confirm-order-1", "emails", payload={{"order_id": 1}}))
        assert_enqueued(session, queue="emails", payload={{"order_id": 1}})
        session.commit()
    [job] = drain(watchdog_engine, {{"emails": lambda job: None}})
    assert job.outcome is Outcome.COMPLETED


def test_every_test_starts_from_an_empty_table(watchdog_engine):
    assert_not_enqueued(watchdog_engine)


def test_a_runner_from_the_factory(watchdog_engine, watchdog_runner):
    Watchdog(watchdog_engine).enqueue(Job("a", "emails"))
    [job] = watchdog_runner({{"emails": lambda job: None}}).run_until_idle()
    assert job.job_id == "a"


def test_a_served_runner_is_stopped_at_teardown(watchdog_engine, watchdog_runner):
    ran = threading.Event()
    watchdog_runner.serve({{"emails": lambda job: ran.set()}}, poll_interval=timedelta(milliseconds=50))
    Watchdog(watchdog_engine).enqueue(Job("served", "emails"))
    assert ran.wait(20)


def test_a_failure_shows_what_is_enqueued(watchdog_engine):
    Watchdog(watchdog_engine).enqueue(Job("confirm-order-1", "emails", payload={{"order_id": 1}}))
    assert_enqueued(watchdog_engine, queue="emails", payload={{"order_id": 2}})
"""


def user_tests(pytester: pytest.Pytester) -> None:
    from tests.integration.test_migrations import HEAD

    pytester.makepyfile(test_user=USER_TESTS.format(head=HEAD))


def runner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("watchdog-test-runner")]


def test_the_plugin_is_installed_as_a_pytest11_entry_point() -> None:
    from importlib.metadata import entry_points

    [plugin] = [ep for ep in entry_points(group="pytest11") if ep.name == "sqlalchemy_watchdog"]
    assert plugin.value == "sqlalchemy_watchdog.pytest_plugin"


def test_a_users_tests_run_on_the_plugins_fixtures_sqlite(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WATCHDOG_TEST_DATABASE_URL", raising=False)
    user_tests(pytester)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*def test_a_failure_shows_what_is_enqueued(watchdog_engine):",
            "E*AssertionError: expected a job matching queue='emails', payload containing {'order_id': 2}; found none",
            "E*jobs enqueued (any queue, admission order):",
            'E*  - confirm-order-1  queue=emails  state=queued  payload={"order_id": 1}',
        ]
    )
    # The failure points at the user's line, not into the library.
    assert "sqlalchemy_watchdog/testing.py" not in result.stdout.str()
    assert runner_threads() == []  # the served runner was stopped at teardown


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", ["postgresql"])
def test_on_postgresql_each_test_gets_a_schema_of_its_own_dropped_afterwards(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, engine: Engine
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    monkeypatch.setenv("WATCHDOG_TEST_DATABASE_URL", url)
    user_tests(pytester)
    pytester.makepyfile(
        test_schema="""
        import asyncio

        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

        from sqlalchemy_watchdog import Job, Watchdog
        from sqlalchemy_watchdog.testing import assert_enqueued_async

        SEEN = []


        class Base(DeclarativeBase):
            pass


        class Order(Base):
            __tablename__ = "orders"
            id: Mapped[int] = mapped_column(primary_key=True)


        def test_a_schema_of_its_own(watchdog_engine, watchdog_database_url):
            assert watchdog_database_url.get_backend_name() == "postgresql"
            Base.metadata.create_all(watchdog_engine)  # the application's tables land there too
            with watchdog_engine.connect() as conn:
                schema = conn.execute(text("SELECT current_schema()")).scalar_one()
                tables = set(conn.execute(text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                )).scalars())
            assert schema.startswith("watchdog_test_")
            assert {"watchdog_jobs", "watchdog_queue_pauses", "alembic_version", "orders"} <= tables
            SEEN.append(schema)


        def test_another_schema_and_an_async_engine_on_the_same_url(watchdog_engine):
            Watchdog(watchdog_engine).enqueue(Job("a", "q"))

            async def check():
                async_engine = create_async_engine(watchdog_engine.url)
                try:
                    await assert_enqueued_async(async_engine, job_id="a")
                    async with async_engine.connect() as conn:
                        return (await conn.execute(text("SELECT current_schema()"))).scalar_one()
                finally:
                    await async_engine.dispose()

            schema = asyncio.run(check())
            assert schema.startswith("watchdog_test_") and schema not in SEEN
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=7, failed=1)
    with engine.connect() as conn:
        left = conn.exec_driver_sql("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'watchdog_test_%%'").all()
    assert left == []


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", ["mariadb"])
def test_on_mariadb_each_test_gets_a_database_of_its_own_dropped_afterwards(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, engine: Engine, tmp_path: Path
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    monkeypatch.setenv("WATCHDOG_TEST_DATABASE_URL", url)
    seen = tmp_path / "databases.txt"
    monkeypatch.setenv("WATCHDOG_SEEN_DATABASES", str(seen))
    user_tests(pytester)
    pytester.makepyfile(
        test_database="""
        import os

        from sqlalchemy import text


        def seen():
            with open(os.environ["WATCHDOG_SEEN_DATABASES"], "a+") as file:
                file.seek(0)
                return file.read().split()


        def record(name):
            with open(os.environ["WATCHDOG_SEEN_DATABASES"], "a") as file:
                file.write(name + "\\n")


        def test_a_database_of_its_own(watchdog_engine, watchdog_database_url):
            with watchdog_engine.connect() as conn:
                name = conn.execute(text("SELECT DATABASE()")).scalar_one()
            assert name.startswith("watchdog_test_") and name == watchdog_engine.url.database
            assert watchdog_database_url.database != name
            record(name)


        def test_another_database(watchdog_engine):
            name = watchdog_engine.url.database
            assert name.startswith("watchdog_test_") and name not in seen()
            record(name)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=7, failed=1)
    names = seen.read_text().split()
    assert len(names) == 2
    with engine.connect() as conn:
        left = set(conn.exec_driver_sql("SHOW DATABASES").scalars()) & set(names)
    assert left == set(), "each test's database is dropped after it"


def test_a_named_sqlite_file_gets_the_tables_for_each_test_and_loses_them_after(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    from sqlalchemy import create_engine, inspect, text

    database = tmp_path / "shared.db"
    seed = create_engine(f"sqlite:///{database}")
    with seed.begin() as conn:
        conn.execute(text("CREATE TABLE mine (id INTEGER PRIMARY KEY)"))
    pytester.makepyfile(
        test_file="""
        from sqlalchemy_watchdog import Job, Watchdog
        from sqlalchemy_watchdog.testing import assert_not_enqueued


        def test_one(watchdog_engine):
            assert_not_enqueued(watchdog_engine)
            Watchdog(watchdog_engine).enqueue(Job("a", "q"))


        def test_two(watchdog_engine):
            assert_not_enqueued(watchdog_engine)
            Watchdog(watchdog_engine).enqueue(Job("a", "q"))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", f"--watchdog-database-url=sqlite:///{database}")
    result.assert_outcomes(passed=2)
    assert set(inspect(seed).get_table_names()) == {"mine"}
    # A file holding the table already (an interrupted run) is refused, not reused.
    with seed.begin() as conn:
        conn.execute(text("CREATE TABLE watchdog_jobs (id INTEGER)"))
    result = pytester.runpytest("-p", "no:cacheprovider", f"--watchdog-database-url=sqlite:///{database}")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*already holds a watchdog_jobs table*"])
    assert set(inspect(seed).get_table_names()) == {"mine", "watchdog_jobs"}
    seed.dispose()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "*in-memory SQLite database*"),
        ("sqlite:///:memory:", "*in-memory SQLite database*"),
        ("oracle://app@localhost/app", "*runs on PostgreSQL, SQLite, MariaDB and MySQL, not oracle*"),
        ("not a url", "*--watchdog-database-url: Could not parse*"),
    ],
)
def test_an_unusable_database_url_is_an_error_saying_why(pytester: pytest.Pytester, url: str, message: str) -> None:
    pytester.makepyfile(test_any="def test_any(watchdog_engine):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--watchdog-database-url={url}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])


#: A password that must never reach pytest's output.
PASSWORD = "S3cret-Hunter2-Passw0rd"


@pytest.mark.parametrize(
    "url, host, database",
    [
        # PostgreSQL at 127.0.0.1:5432 trusts every password: a database that is not there fails the connection.
        (
            f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:5432/watchdog_no_such_db",
            "127.0.0.1:5432",
            "watchdog_no_such_db",
        ),
        # Nothing listens on port 1.
        (f"postgresql://app:{PASSWORD}@127.0.0.1:1/appdb?connect_timeout=5", "127.0.0.1:1", "appdb"),
    ],
    ids=["no-such-database", "closed-port"],
)
def test_a_database_that_cannot_be_reached_fails_in_one_line_without_the_password(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, url: str, host: str, database: str
) -> None:
    monkeypatch.setenv("WATCHDOG_TEST_DATABASE_URL", url)
    pytester.makepyfile(test_user="def test_uses_the_database(watchdog_engine):\n    pass\n")
    # The most telling traceback pytest can print: long, with every frame's locals.
    result = pytester.runpytest("-p", "no:cacheprovider", "--tb=long", "--showlocals")
    result.assert_outcomes(errors=1)
    output = result.stdout.str() + result.stderr.str()
    assert PASSWORD not in output
    assert "password=" not in output
    # The error itself is one line (the short summary repeats it, in full under CI=true).
    [line] = [line for line in output.splitlines() if line.startswith("watchdog_engine: cannot connect to the test")]
    assert host in line and database in line, line
