"""Wake-ups on PostgreSQL: an enqueue notifies only while a runner waits.

The INSERT trigger sends NOTIFY only while some runner's listener holds the
*waiting lock* exclusively (the sentinel); otherwise it takes the lock shared
for its transaction, which keeps any runner from starting to wait until that
transaction has ended -- and a runner that then starts waiting looks for work
once more, so it sees the job. These tests check each half against a real
server: what the trigger sends, who holds the lock when, and that no job
waits for a poll interval in the races the lock is there for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from sqlalchemy_watchdog import Job, JobState, Outcome, RunningJob, enqueue
from sqlalchemy_watchdog.wakeups import EVENT_QUEUED, WAIT_SQL, WAITING_LOCK
from tests.helpers import (
    Notifications,
    add,
    listening_sessions,
    read,
    settled,
    wait_until,
    waiting_lock_holders,
    waiting_sessions,
)
from tests.runner_kinds import RunnerDriver

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])  # LISTEN/NOTIFY is PostgreSQL's

#: Long enough that a job found within a few seconds was not found by polling.
POLL = timedelta(seconds=30)


class Gate:
    """A handler that says it started and returns once the gate opens."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.started: list[str] = []

    def __call__(self, job: RunningJob) -> None:
        self.started.append(job.job_id)
        assert self.open.wait(30), "the test never opened the gate"


@pytest.fixture
def notifications(engine: Engine) -> Iterator[Notifications]:
    listening = Notifications(engine)
    yield listening
    listening.close()


def _take_waiting_lock(conn: Any) -> bool:
    return bool(
        conn.execute(text("SELECT pg_try_advisory_lock(:a, :b)"), dict(a=WAITING_LOCK[0], b=WAITING_LOCK[1])).scalar()
    )


def test_an_enqueue_sends_no_notification_while_no_runner_waits(engine: Engine, notifications: Notifications) -> None:
    add(engine, Job("a", "q"))
    assert notifications.received(within=0.5) == []
    assert read(engine, "a").state is JobState.QUEUED


def test_an_enqueue_notifies_while_a_session_holds_the_waiting_lock_and_stops_when_it_lets_go(
    engine: Engine, notifications: Notifications
) -> None:
    with engine.connect() as sentinel:
        assert _take_waiting_lock(sentinel)
        add(engine, Job("a", "q"))
        assert notifications.received(within=5) == [EVENT_QUEUED]
        # A batch is one statement: one notification, however many jobs.
        add(engine, Job("b", "q"), Job("c", "q"))
        assert notifications.received(within=5) == [EVENT_QUEUED]
        sentinel.execute(text("SELECT pg_advisory_unlock_all()"))
        add(engine, Job("d", "q"))
        assert notifications.received(within=0.5) == []


def test_an_open_enqueueing_transaction_keeps_a_runner_from_starting_to_wait(engine: Engine) -> None:
    """The trigger's shared lock lasts until the enqueue's transaction ends,
    and a runner cannot take the lock exclusively before then."""
    with engine.connect() as producer, engine.connect() as runner:
        with producer.begin():
            enqueue(producer, Job("a", "q"))
            assert runner.execute(text(WAIT_SQL)).scalar() == "open"
            runner.rollback()
        assert runner.execute(text(WAIT_SQL)).scalar() == "sentinel"
        with engine.connect() as other_runner:
            assert other_runner.execute(text(WAIT_SQL)).scalar() == "covered"


def test_an_idle_runner_holds_the_waiting_lock_and_a_busy_one_lets_it_go(engine: Engine, runners: RunnerDriver) -> None:
    gate = Gate()
    worker = runners.runner({"q": gate}, concurrency=1, poll_interval=POLL)
    with worker.serving():
        wait_until(lambda: waiting_sessions(engine) == 1, what="the idle runner to wait")
        add(engine, Job("a", "q"))
        wait_until(lambda: gate.started == ["a"], timeout=5, what="NOTIFY to start the job")
        # Its one slot is taken: nobody needs waking, so enqueues stop notifying.
        wait_until(lambda: waiting_sessions(engine) == 0, timeout=5, what="the busy runner to let the lock go")
        assert listening_sessions(engine) == 1
        gate.open.set()
        settled(engine, "a", timeout=10)
        wait_until(lambda: waiting_sessions(engine) == 1, timeout=5, what="the runner to wait again")
        add(engine, Job("b", "q"))
        assert settled(engine, "b", timeout=5).outcome is Outcome.COMPLETED


def test_a_job_committed_after_the_runner_went_idle_by_a_transaction_open_before_starts_without_a_poll(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The race the lock closes: the enqueue's trigger found no runner
    waiting (so it did not notify) and its transaction is still open when
    the runner's claim comes back empty. The runner must not sleep its poll
    interval: it cannot take the lock while the transaction is open, so it
    looks again until it can, and its last look finds the job."""
    worker = runners.runner({"q": lambda job: None}, concurrency=1, poll_interval=POLL)
    with engine.connect() as producer:
        producer.begin()
        enqueue(producer, Job("a", "q"))  # no runner waits: no notification
        with worker.serving():
            wait_until(lambda: listening_sessions(engine), what="the runner to listen")
            time.sleep(0.5)  # the runner claims nothing and tries, and fails, to wait
            assert waiting_sessions(engine) == 0
            started = time.monotonic()
            producer.commit()
            job = settled(engine, "a", timeout=10)
            elapsed = time.monotonic() - started
            wait_until(lambda: waiting_sessions(engine) == 1, timeout=5, what="the runner to wait")
    assert job.outcome is Outcome.COMPLETED
    assert elapsed < 3, f"took {elapsed:.1f}s with a {POLL.total_seconds():.0f} s poll interval"


def test_of_two_idle_runners_one_waits_and_the_other_takes_over_when_it_gets_busy(
    engine: Engine, runners: RunnerDriver
) -> None:
    gate = Gate()
    first = runners.runner({"q": gate}, concurrency=1, poll_interval=POLL)
    second = runners.runner({"q": gate}, concurrency=1, poll_interval=POLL)
    with first.serving(), second.serving():
        wait_until(lambda: listening_sessions(engine) + waiting_sessions(engine) >= 3, what="both runners to listen")
        time.sleep(0.3)
        assert waiting_sessions(engine) == 1  # one sentinel; the other is covered by it
        add(engine, Job("a", "q"))
        wait_until(lambda: gate.started == ["a"], timeout=5, what="NOTIFY to start the first job")
        # Whichever took it, the other still waits (handed over if it was the sentinel) ...
        wait_until(lambda: waiting_sessions(engine) == 1, timeout=5, what="the idle runner to wait")
        started = time.monotonic()
        add(engine, Job("b", "q"))
        wait_until(lambda: sorted(gate.started) == ["a", "b"], timeout=5, what="NOTIFY to start the second job")
        assert time.monotonic() - started < 3
        # ... and with both busy, nobody does.
        wait_until(lambda: waiting_sessions(engine) == 0, timeout=5, what="both busy runners to let the lock go")
        gate.open.set()
        assert settled(engine, "a", timeout=10).outcome is Outcome.COMPLETED
        assert settled(engine, "b", timeout=10).outcome is Outcome.COMPLETED


def test_a_runner_whose_waiting_session_is_terminated_waits_again_and_is_still_woken(
    engine: Engine, runners: RunnerDriver
) -> None:
    worker = runners.runner({"q": lambda job: None}, concurrency=1, poll_interval=POLL)
    with worker.serving():
        wait_until(lambda: waiting_sessions(engine) == 1, what="the idle runner to wait")
        pid = _lock_holder(engine)
        assert pid is not None
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        wait_until(
            lambda: waiting_sessions(engine) == 1 and _lock_holder(engine) not in (None, pid),
            timeout=15,
            what="the listener to reconnect and wait again",
        )
        started = time.monotonic()
        add(engine, Job("a", "q"))
        assert settled(engine, "a", timeout=5).outcome is Outcome.COMPLETED
        assert time.monotonic() - started < 3


def test_a_listener_whose_session_is_terminated_says_it_listens_again_and_nothing_misleading(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """After ``pg_terminate_backend`` of the listening session -- and of every
    other session of the database, the pooled ones its proof borrows
    included -- the log says the listener lost it and then that it listens
    again: not that the new connection "is not one PostgreSQL session" and
    the runner polls, while it in fact listens."""
    observer = create_engine(engine.url, poolclass=NullPool)  # never a connection the kill ended
    worker = runners.runner({"q": lambda job: None}, concurrency=1, poll_interval=POLL)
    try:
        with caplog.at_level(logging.INFO, logger="sqlalchemy_watchdog"), worker.serving():
            wait_until(lambda: waiting_sessions(observer) == 1, what="the idle runner to wait")
            pid = _lock_holder(observer)
            assert pid is not None
            with observer.connect() as conn:
                ended = conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).scalar_one()
            assert ended >= 2  # the listener and at least one pooled session
            wait_until(
                lambda: waiting_sessions(observer) == 1 and _lock_holder(observer) not in (None, pid),
                timeout=15,
                what="the listener to reconnect and wait again",
            )
            wait_until(lambda: "listening again" in caplog.text, timeout=5, what="the log to say it listens again")
            started = time.monotonic()
            add(observer, Job("a", "q"))
            assert settled(observer, "a", timeout=5).outcome is Outcome.COMPLETED
            assert time.monotonic() - started < 3
    finally:
        observer.dispose()
    messages = [record.getMessage() for record in caplog.records if record.name.startswith("sqlalchemy_watchdog")]
    listener = [m for m in messages if m.startswith("listener:")]
    assert not [m for m in listener if "not one PostgreSQL session" in m or m.endswith("; polling")], listener
    lost = next(i for i, m in enumerate(listener) if "connection lost" in m)
    again = next(i for i, m in enumerate(listener) if "listening again" in m)
    assert lost < again, listener


def _lock_holder(engine: Engine) -> int | None:
    holders = waiting_lock_holders(engine)
    return holders[0] if holders else None


def test_a_stopped_runner_lets_the_waiting_lock_go(engine: Engine, runners: RunnerDriver) -> None:
    worker = runners.runner({"q": lambda job: None}, concurrency=1, poll_interval=POLL)
    with worker.serving():
        wait_until(lambda: waiting_sessions(engine) == 1, what="the idle runner to wait")
    wait_until(lambda: waiting_sessions(engine) == 0, timeout=10, what="the stopped runner to let the lock go")


def test_when_the_waiting_runner_stops_another_idle_runner_waits_in_its_place_at_once(
    engine: Engine, runners: RunnerDriver
) -> None:
    """A stopping sentinel hands over (notifies as it lets the lock go), so
    the covered runner does not leave enqueues unannounced until its poll."""
    first = runners.runner({"q": lambda job: None}, concurrency=1, poll_interval=POLL)
    second = runners.runner({"q": lambda job: None}, concurrency=1, poll_interval=POLL)
    serving_first = first.start()
    try:
        wait_until(lambda: waiting_sessions(engine) == 1, what="the first runner to wait")
        sentinel = _lock_holder(engine)
        with second.serving():
            wait_until(lambda: listening_sessions(engine) >= 2, what="both runners to listen")
            time.sleep(0.3)
            assert _lock_holder(engine) == sentinel  # the second is covered
            first.stop()
            serving_first.result(30)
            stopped = time.monotonic()
            wait_until(
                lambda: _lock_holder(engine) not in (None, sentinel),
                timeout=5,
                what="the second runner to wait in the first one's place",
            )
            assert time.monotonic() - stopped < 3
            started = time.monotonic()
            add(engine, Job("a", "q"))
            assert settled(engine, "a", timeout=5).outcome is Outcome.COMPLETED
            assert time.monotonic() - started < 3
    finally:
        first.stop()


def test_a_busy_runner_promotes_a_delayed_job_enqueued_meanwhile_soon_after_its_time(
    engine: Engine, runners: RunnerDriver
) -> None:
    """A runner with every slot taken waits for nothing, so the enqueue of a
    delayed job does not notify it; it looks for due delayed jobs every
    quarter second instead of every poll interval."""
    gate = Gate()
    worker = runners.runner({"q": gate}, concurrency=1, poll_interval=POLL)
    with worker.serving():
        wait_until(lambda: waiting_sessions(engine) == 1, what="the idle runner to wait")
        add(engine, Job("a", "q"))
        wait_until(lambda: gate.started == ["a"] and waiting_sessions(engine) == 0, timeout=5, what="a busy runner")
        with engine.begin() as conn:
            enqueue(conn, Job("b", "q"), delay=timedelta(milliseconds=300))
        enqueued = time.monotonic()
        assert read(engine, "b").state is JobState.DELAYED
        wait_until(lambda: read(engine, "b").state is JobState.QUEUED, timeout=5, what="the busy runner to promote b")
        assert time.monotonic() - enqueued < 2, "promoted by the poll, not by the busy runner's look"
        gate.open.set()
        assert settled(engine, "b", timeout=10).outcome is Outcome.COMPLETED
