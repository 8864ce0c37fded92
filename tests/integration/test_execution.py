"""The runner core's own rules, proven for both runners on both dialects:
a row the database refuses to settle or recover cannot stall a runner, the
default recovery budgets, bounded settings, the payload codec, and handler
failures logged with their tracebacks."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from sqlalchemy_watchdog import (
    Decision,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    RetryPolicy,
    RunningJob,
    handler,
    store,
)
from sqlalchemy_watchdog.codecs import TaggedJSON
from sqlalchemy_watchdog.core.handlers import Flag, StopSignal
from sqlalchemy_watchdog.core.rules.settle import REFUSED_SETTLE_REASON
from sqlalchemy_watchdog.jobs import SettleStatus
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.records import StopReason
from tests.helpers import add, read, settled, wait_until
from tests.runner_kinds import RunnerDriver

# The dialect does not matter here but where a test says dialect_specific: the PostgreSQL copy
# runs under CI=true or WATCHDOG_ALL_DIALECTS=1 (tests/conftest.py).
pytestmark = pytest.mark.dialect_neutral

LEASE = timedelta(seconds=2)
HEARTBEAT = timedelta(milliseconds=300)
POLL = timedelta(milliseconds=100)


def refuse(engine: Engine, name: str, condition_pg: str, condition_sqlite: str) -> None:
    """A rule of the user's own that the library did not create: a CHECK on
    PostgreSQL (its error's DETAIL echoes the whole row, claim token
    included) and MariaDB, a trigger raising a constraint error on SQLite."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"ALTER TABLE watchdog_jobs ADD CONSTRAINT {name} CHECK ({condition_pg}) NOT VALID"))
        elif engine.dialect.name in ("mysql", "mariadb"):
            conn.execute(text(f"ALTER TABLE watchdog_jobs ADD CONSTRAINT {name} CHECK ({condition_pg})"))
        else:
            conn.execute(
                text(
                    f"CREATE TRIGGER {name} BEFORE UPDATE ON watchdog_jobs "
                    f"WHEN NOT ({condition_sqlite}) BEGIN SELECT RAISE(ABORT, '{name}'); END"
                )
            )


# -- a row the database refuses ------------------------------------------------------


@pytest.mark.dialect_specific
def test_a_decision_the_database_refuses_settles_failed_and_other_jobs_go_on(
    engine: Engine, runners: RunnerDriver
) -> None:
    """A handler's long reason breaks a CHECK of the user's (``length <
    40``): that job alone is settled ``failed`` with a short reason saying
    the database refused its settlement; the jobs settled beside it in the
    same batches are not dragged down."""
    long_reason = "x" * 100
    refuse(
        engine,
        "ck_short_reason",
        "failure_reason IS NULL OR length(failure_reason) < 40",
        "NEW.failure_reason IS NULL OR length(NEW.failure_reason) < 40",
    )
    add(engine, Job("poison", "p"), *(Job(f"ok-{i}", "q") for i in range(12)))
    worker = runners.runner(
        {"p": lambda job: Decision.failed(long_reason), "q": lambda job: None},
        concurrency=8,
        lease=LEASE,
        heartbeat=HEARTBEAT,
        poll_interval=POLL,
    )
    with worker.serving():
        jobs = [settled(engine, f"ok-{i}") for i in range(12)]
        poison = settled(engine, "poison")
    assert [j.outcome for j in jobs] == [Outcome.COMPLETED] * 12
    assert (poison.outcome, poison.failure_reason) == (Outcome.FAILED, REFUSED_SETTLE_REASON)


@pytest.mark.dialect_specific
def test_a_job_the_database_refuses_to_settle_or_recover_is_isolated_and_never_stalls_the_runner(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """The database refuses every settle of one job, and its recovery too.
    Its claim lapses; the runner's recovery is refused, logged and skipped
    for a while (``isolated_jobs``), and every other queue goes on being
    claimed and settled. The logs never carry the claim token, although
    PostgreSQL's error DETAIL echoes the row."""
    refuse(
        engine,
        "ck_never_settle_poison",
        "job_id <> 'poison' OR state <> 'settled'",
        "NEW.job_id <> 'poison' OR NEW.state <> 'settled'",
    )
    add(engine, Job("poison", "p"))
    worker = runners.runner(
        {"p": lambda job: None, "q": lambda job: None},
        lease=LEASE,
        heartbeat=HEARTBEAT,
        poll_interval=POLL,
    )
    caplog.set_level(logging.INFO, logger="sqlalchemy_watchdog")
    with worker.serving():
        wait_until(lambda: worker.runner.isolated_jobs == ("poison",), timeout=30, what="poison to be isolated")
        token = read_token(engine, "poison")
        add(engine, *(Job(f"later-{i}", "q") for i in range(5)))
        later = [settled(engine, f"later-{i}") for i in range(5)]
    assert [j.outcome for j in later] == [Outcome.COMPLETED] * 5
    assert read(engine, "poison").state is JobState.RUNNING  # left alone, nothing lost
    assert token is not None and token not in caplog.text
    assert "refused its recovery" in caplog.text


def read_token(engine: Engine, job_id: str) -> str | None:
    with engine.connect() as conn:
        token = conn.execute(select(jobs_table.c.claim_token).where(jobs_table.c.job_id == job_id)).scalar()
    return None if token is None else str(token)


# -- default recovery budgets ------------------------------------------------------------


def abandon_claim(engine: Engine, queue: str) -> None:
    """A worker claims the queue's job and vanishes: its lease ends at once."""
    with engine.begin() as conn:
        store.begin_write(conn)
        batch = store.claim(conn, queues=[queue], limit=1, lease_ms=1)
        assert batch.claimed
    time.sleep(0.05)


def test_a_runner_default_budget_requeues_jobs_without_one_of_their_own(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q"), Job("own-zero", "q", max_recoveries=0))
    worker = runners.runner({"q": lambda job: None}, max_recoveries=2, lease=LEASE, heartbeat=HEARTBEAT)
    abandon_claim(engine, "q")  # "a": the first admitted
    result = worker.tick()
    assert (result.job_id, result.status.value) == ("a", "requeued")
    assert read(engine, "a").recovery_count == 1
    abandon_claim(engine, "q")
    abandon_claim(engine, "q")
    worker.tick()
    worker.tick()
    own = read(engine, "own-zero")  # its own budget (0) wins over the runner's
    assert (own.outcome, own.failure_reason) == (
        Outcome.INTERRUPTED,
        "Restart recovery budget exhausted (0 recoveries)",
    )


def test_a_handler_default_budget_overrides_the_runners(engine: Engine, runners: RunnerDriver) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"

    @handler(queue, max_recoveries=0)
    def work(job: RunningJob) -> None:
        return None

    add(engine, Job("a", queue))
    worker = runners.runner({queue: work}, max_recoveries=5, lease=LEASE, heartbeat=HEARTBEAT)
    abandon_claim(engine, queue)
    result = worker.tick()
    assert result.job is not None
    assert (result.job.outcome, result.job.failure_reason) == (
        Outcome.INTERRUPTED,
        "Restart recovery budget exhausted (0 recoveries)",
    )


@pytest.mark.parametrize("budget", [-1, True, 1.5, "3", 10**9])
def test_a_bad_default_budget_is_refused_naming_the_field(engine: Engine, budget: Any) -> None:
    with pytest.raises(InvalidJob) as caught:
        handler("q-bad", max_recoveries=budget)
    assert caught.value.field == "max_recoveries"
    from sqlalchemy_watchdog import Runner

    with pytest.raises(InvalidJob) as caught:
        Runner(engine, {"q": lambda job: None}, max_recoveries=budget)
    assert caught.value.field == "max_recoveries"


# -- bounded settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"poll_interval": timedelta(days=10**6)}, "poll_interval"),
        ({"grace": timedelta(days=10**6)}, "grace"),
        ({"heartbeat": timedelta(days=10**6)}, "heartbeat"),
        ({"lease": timedelta(days=10**6)}, "lease"),
        ({"heartbeat": timedelta(milliseconds=1001), "lease": timedelta(seconds=3)}, "heartbeat"),
        ({"poll_interval": timedelta(microseconds=10)}, "poll_interval"),
        ({"concurrency": 10**6}, "concurrency"),
        ({"grace": timedelta(seconds=-1)}, "grace"),
    ],
)
def test_durations_beyond_what_the_runner_can_wait_are_refused_naming_the_field(
    runners: RunnerDriver, settings: dict[str, Any], field: str
) -> None:
    """``threading`` cannot wait longer than ``TIMEOUT_MAX``; a 1,001 ms
    heartbeat is more than a third of a 3 s lease (compared exactly)."""
    with pytest.raises(InvalidJob) as caught:
        runners.runner({"q": lambda job: None}, **settings)
    assert caught.value.field == field


def test_a_heartbeat_of_exactly_a_third_of_the_lease_is_accepted(runners: RunnerDriver) -> None:
    runners.runner({"q": lambda job: None}, heartbeat=timedelta(seconds=1), lease=timedelta(seconds=3))


# -- the payload codec --------------------------------------------------------------------


def test_handlers_see_payloads_decoded_by_the_runners_codec(engine: Engine, runners: RunnerDriver) -> None:
    due = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    add(engine, Job("inv", "billing", codec=TaggedJSON(), payload={"due": due, "amount": Decimal("19.90")}))
    seen: list[Any] = []
    worker = runners.runner({"billing": lambda job: seen.append(job.payload)}, codec=TaggedJSON())
    [job] = worker.run_until_idle()
    assert job.outcome is Outcome.COMPLETED
    assert seen == [{"due": due, "amount": Decimal("19.90")}]


def test_a_payload_the_codec_cannot_decode_fails_the_job_without_running_it(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("bad", "billing", payload={"$decimal": "not a number"}))
    ran: list[str] = []
    worker = runners.runner({"billing": lambda job: ran.append(job.job_id)}, codec=TaggedJSON())
    [job] = worker.run_until_idle()
    assert ran == []
    assert job.outcome is Outcome.FAILED
    assert job.failure_reason is not None and job.failure_reason.startswith("payload could not be decoded")


# -- handler failures --------------------------------------------------------------------------


def test_logs_fit_alerting_a_retried_attempt_warns_once_and_only_the_final_failure_is_an_error(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """The logging rule (docs/howto/observability.md): an attempt that will
    be retried logs one WARNING line -- reason, "attempt n of m", the next
    run time -- and no traceback (DEBUG has it, and ``failure_detail``); the
    final failure logs one ERROR with the handler's traceback. A job that
    fails and then succeeds logs no ERROR at all."""

    def broken(job: RunningJob) -> None:
        if job.job_id == "flaky" and job.attempt == 2:
            return
        {}["missing"]  # type: ignore[index]  # the KeyError is the point

    retry = RetryPolicy(max_attempts=2, backoff=timedelta(milliseconds=1))
    add(engine, Job("flaky", "q", retry=retry), Job("doomed", "q", retry=retry))
    caplog.set_level(logging.DEBUG, logger="sqlalchemy_watchdog")
    worker = runners.runner({"q": broken})
    worker.run_until_idle()
    time.sleep(0.05)  # the retries' 1 ms backoff
    worker.run_until_idle()
    assert read(engine, "flaky").outcome is Outcome.COMPLETED
    doomed = read(engine, "doomed")
    assert (doomed.outcome, doomed.failure_reason) == (Outcome.FAILED, "KeyError: 'missing'")
    assert doomed.failure_detail is not None and "in broken" in doomed.failure_detail

    def of(job_id: str, level: int) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno == level and f"job {job_id}:" in r.getMessage()]

    for job_id in ("flaky", "doomed"):
        [warning] = of(job_id, logging.WARNING)
        message = warning.getMessage()
        assert "attempt 1 of 2 failed (KeyError: 'missing')" in message and "next attempt at 20" in message
        assert warning.exc_info is None  # no traceback: nobody is paged for a retry
        [debug] = [r for r in of(job_id, logging.DEBUG) if "handler raised" in r.getMessage()][:1]
        assert debug.exc_info is not None and debug.exc_info[0] is KeyError
    assert of("flaky", logging.ERROR) == []
    [error] = of("doomed", logging.ERROR)
    assert "attempt 2 of 2 failed (KeyError: 'missing')" in error.getMessage()
    assert error.exc_info is not None and error.exc_info[0] is KeyError  # the traceback, with the final failure
    assert "in broken" in caplog.text  # the traceback names the handler's frame


def test_a_failure_without_retries_is_one_error_with_its_traceback(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(job: RunningJob) -> None:
        {}["missing"]  # type: ignore[index]  # the KeyError is the point

    add(engine, Job("a", "q"))
    caplog.set_level(logging.INFO, logger="sqlalchemy_watchdog")
    [job] = runners.runner({"q": broken}).run_until_idle()
    assert (job.outcome, job.failure_reason) == (Outcome.FAILED, "KeyError: 'missing'")
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "job a: attempt 1 failed (KeyError: 'missing')" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_a_handler_exception_keeps_its_traceback_with_the_job(engine: Engine, runners: RunnerDriver) -> None:
    """``read`` (and the CLI's ``show``) carry the traceback of a handler
    that raised; a job that did not raise carries none."""

    def broken(job: RunningJob) -> None:
        if job.job_id == "bad":
            raise ValueError("no such customer")

    add(engine, Job("bad", "q"), Job("good", "q"))
    runners.runner({"q": broken}).run_until_idle()
    bad, good = read(engine, "bad"), read(engine, "good")
    assert bad.failure_detail is not None
    assert bad.failure_detail.startswith("Traceback (most recent call last):")
    assert 'raise ValueError("no such customer")' in bad.failure_detail
    assert bad.failure_detail.rstrip().endswith("ValueError: no such customer")
    assert good.failure_detail is None


# -- the hot path's lazy parts ---------------------------------------------------------


def test_a_stop_requested_before_the_handler_looks_is_seen_on_its_event() -> None:
    """A stop signal makes its ``threading.Event`` only when asked for; a stop
    requested before that is still seen, and one requested after wakes a waiter."""
    early = StopSignal()
    assert early.request(StopReason.CANCELLED) is True
    assert early.request(StopReason.TIMEOUT) is False  # the first reason wins
    assert early.is_set() and early.event.is_set() and early.reason is StopReason.CANCELLED

    late = StopSignal()
    event = late.event
    assert not event.is_set() and not late.is_set()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(event.wait(10)))
    waiter.start()
    late.request(StopReason.LEASE_LOST)
    waiter.join(10)
    assert woke == [True] and late.event is event


def test_a_flag_set_while_its_event_is_being_made_is_never_missed() -> None:
    """Many threads setting and asking for the event at once: every event
    handed out ends up set."""
    for _ in range(200):
        flag = Flag()
        events: list[threading.Event] = []
        threads = [threading.Thread(target=lambda: events.append(flag.event)) for _ in range(3)]
        threads.insert(1, threading.Thread(target=flag.set))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert flag.is_set() and flag.wait(0)
        assert all(event is flag.event and event.is_set() for event in events)


@pytest.mark.dialect_specific
def test_a_settlement_reads_its_job_from_the_settle_row_when_asked(engine: Engine) -> None:
    """``settle_many`` hands back the statement's row, read into the job view on
    first access: the same view a read of the row gives."""
    job_id = f"lazy-{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        store.enqueue(conn, [Job(job_id=job_id, queue="lazy", payload={"n": 1})])
    with engine.begin() as conn:
        (claim,) = store.claim(conn, queues=["lazy"], limit=1, lease_ms=60_000).claimed
    with engine.begin() as conn:
        (settlement,) = store.settle_many(conn, [store.SettleRequest(job_id, claim.token, Decision.completed())])
    with engine.connect() as conn:
        stored = store.read(conn, job_id)
    assert settlement.status is SettleStatus.SETTLED
    assert settlement.job == stored and settlement.job is settlement.job
    assert settlement == store.Settlement(SettleStatus.SETTLED, stored)
    assert settlement != store.Settlement(SettleStatus.REPLAYED, stored)
