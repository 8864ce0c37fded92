"""The runner contract, proven for both runners on both dialects.

Every test here runs four ways: ``Runner`` (sync, handler threads) and
``AsyncRunner`` (asyncio tasks) -- the ``runners`` fixture, see
tests/runner_kinds.py -- each on SQLite and on PostgreSQL. A test reads like
the guarantee; which runner it drives is invisible in its body. Handlers are
plain functions (AsyncRunner runs them in a thread), or :func:`dual` where
the behaviour is about coroutine handlers: a stop cancels their task. The
process executor's kinds (child processes need module-level handlers, not
these closures) run a few tests here and the whole contract in
tests/integration/test_process_executor.py.

Nothing is mocked: real databases, real threads and event loops; leases run
out by the database clock, or by the runner's own ``clock=`` moved forward.
A pause between claim and start is made with SQLAlchemy's own pool events
on the runner's engine (public API), not by reaching into the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.ext.asyncio import create_async_engine

import sqlalchemy_watchdog
from sqlalchemy_watchdog import (
    Decision,
    InvalidJob,
    Job,
    JobState,
    JobView,
    Outcome,
    RetryPolicy,
    Runner,
    RunningJob,
    StopReason,
    TickResult,
    TickStatus,
    Watchdog,
    enqueue,
    handler,
    store,
)
from sqlalchemy_watchdog.asyncio import AsyncRunner
from sqlalchemy_watchdog.core.handlers import _registry
from sqlalchemy_watchdog.jobs import FAILURE_REASON_MAX_LENGTH
from sqlalchemy_watchdog.store import sql
from tests.helpers import add, listening_sessions, raw, read, settled, wait_until, waiting_sessions
from tests.runner_kinds import KINDS, RunnerDriver, dual

# The dialect does not matter here but where a test says dialect_specific: the PostgreSQL copy
# runs under CI=true or WATCHDOG_ALL_DIALECTS=1 (tests/conftest.py).
pytestmark = pytest.mark.dialect_neutral

LEASE = timedelta(seconds=3)
HEARTBEAT = timedelta(seconds=1)
POLL = timedelta(milliseconds=100)
NO_POLICY = "Execution disappeared without a recovery policy"


# -- helpers -------------------------------------------------------------------


def db_clock(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(sql.db_clock_ms())).scalar_one())


def make(runners: RunnerDriver, handlers: dict[str, Callable[[RunningJob], Any]] | None, **kwargs: Any) -> Any:
    """A runner with this module's short lease, heartbeat and poll by default."""
    kwargs.setdefault("lease", LEASE)
    kwargs.setdefault("heartbeat", HEARTBEAT)
    kwargs.setdefault("poll_interval", POLL)
    # One handler at a time unless a test says otherwise: these bodies count
    # handler calls and stops one job at a time. The default (10) has its own test.
    kwargs.setdefault("concurrency", 1)
    return runners.runner(handlers, **kwargs)


def done(job: RunningJob) -> None:
    return None


#: A context variable a handler sets (see :func:`remembers`).
CURRENT_JOB: contextvars.ContextVar[str | None] = contextvars.ContextVar("current_job", default=None)


def remembers(job: RunningJob) -> str | None:
    """Returns the job_id an earlier job left in :data:`CURRENT_JOB` (None:
    nothing), then leaves its own there."""
    earlier = CURRENT_JOB.get()
    CURRENT_JOB.set(job.job_id)
    return earlier


class Blocking:
    """A handler that says it started, then runs until it is told to stop,
    recording why: a plain function waits for ``stop_requested``, a coroutine
    sleeps until its task is cancelled. :attr:`handler` has both shapes."""

    def __init__(self, decision: Decision | None = None) -> None:
        self.started = threading.Event()
        self.reasons: list[StopReason | None] = []
        self.decision = decision

        def plain(job: RunningJob) -> Decision | None:
            self.started.set()
            stopped = job.stop_requested.wait(30)
            self.reasons.append(job.stop_reason if stopped else None)
            return self.decision

        async def coroutine(job: RunningJob) -> Decision | None:
            self.started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.reasons.append(job.stop_reason)
                raise
            self.reasons.append(None)
            return self.decision

        self.handler = dual(plain, coroutine)


class Stubborn:
    """A handler that ignores every request to stop until :attr:`release`
    is set: a plain function blocks its thread, a coroutine swallows the
    cancellation of its task."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

        def plain(job: RunningJob) -> None:
            self.started.set()
            self.release.wait(60)

        async def coroutine(job: RunningJob) -> None:
            self.started.set()
            while not self.release.is_set():
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    continue

        self.handler = dual(plain, coroutine)


# -- decisions -----------------------------------------------------------------


@pytest.mark.parametrize("runner_kind", KINDS)  # module-level handlers: the process kinds too
def test_handler_returning_none_settles_completed(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", payload={"to": "x@example.com"}))
    result = make(runners, {"q": done}).tick()
    assert result.status is TickStatus.SETTLED
    assert result.job is not None
    assert (result.job.job_id, result.job.outcome, result.job.failure_reason) == ("a", Outcome.COMPLETED, None)
    assert read(engine, "a").outcome is Outcome.COMPLETED


def test_handler_receives_the_running_job(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", lane="team-key:7", priority=3, payload={"n": [1, 2]}, max_recoveries=4))
    seen: list[tuple[Any, ...]] = []

    def record(job: RunningJob) -> None:
        seen.append(
            (
                job.job_id,
                job.queue,
                job.lane,
                job.priority,
                job.payload,
                job.recovery_count,
                job.max_recoveries,
                job.stop_requested.is_set(),
                job.stop_reason,
            )
        )
        assert read(engine, "a").state is JobState.RUNNING

    async def record_async(job: RunningJob) -> None:
        record(job)

    make(runners, {"q": dual(record, record_async)}).run_until_idle()
    assert seen == [("a", "q", "team-key:7", 3, {"n": [1, 2]}, 0, 4, False, None)]


def test_handler_decisions_settle_failed_and_outcome_unknown(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("fail", "fail"), Job("unknown", "unknown"), Job("explicit", "explicit"))

    async def unknown(job: RunningJob) -> Decision:
        await asyncio.sleep(0)
        return Decision.outcome_unknown()

    worker = make(
        runners,
        {
            "fail": lambda job: Decision.failed("card declined"),
            "unknown": dual(lambda job: Decision.outcome_unknown(), unknown),
            "explicit": lambda job: Decision.completed(),
        },
    )
    outcomes = {job.job_id: (job.outcome, job.failure_reason) for job in worker.run_until_idle()}
    assert outcomes == {
        "fail": (Outcome.FAILED, "card declined"),
        "unknown": (Outcome.OUTCOME_UNKNOWN, None),
        "explicit": (Outcome.COMPLETED, None),
    }
    assert read(engine, "fail").failure_reason == "card declined"


def test_handler_exception_settles_failed_with_its_type_and_message(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q"))

    def boom(job: RunningJob) -> None:
        raise ValueError("card declined for order 42")

    async def boom_async(job: RunningJob) -> None:
        boom(job)

    (job,) = make(runners, {"q": dual(boom, boom_async)}).run_until_idle()
    assert job.outcome is Outcome.FAILED
    assert job.failure_reason is not None
    assert "ValueError" in job.failure_reason and "card declined for order 42" in job.failure_reason
    assert read(engine, "a").failure_reason == job.failure_reason


def test_handler_exception_reason_is_bounded(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q"))

    def boom(job: RunningJob) -> None:
        raise RuntimeError("x" * 100_000)

    (job,) = make(runners, {"q": boom}).run_until_idle()
    assert job.outcome is Outcome.FAILED
    stored = read(engine, "a").failure_reason
    assert stored is not None and stored.startswith("RuntimeError")
    assert len(stored) <= FAILURE_REASON_MAX_LENGTH


@pytest.mark.parametrize("value", [42, "ok", {"status": "done"}], ids=["int", "str", "dict"])
def test_handler_returning_a_value_completes_keeping_it_as_the_result(
    engine: Engine, runners: RunnerDriver, value: Any
) -> None:
    add(engine, Job("a", "q"))

    async def returns(job: RunningJob) -> Any:
        return value

    (job,) = make(runners, {"q": dual(lambda job: value, returns)}).run_until_idle()
    assert job.outcome is Outcome.COMPLETED and job.failure_reason is None
    assert job.result == value == read(engine, "a").result


@pytest.mark.parametrize("runner_kind", KINDS)  # module-level handler: the process kinds too
def test_a_plain_handler_never_sees_what_an_earlier_job_set_in_a_context_variable(
    engine: Engine, runners: RunnerDriver
) -> None:
    """Each job's plain handler runs in a context of its own, whatever thread
    or child process runs it: a context variable one job sets is unset for
    the next, and for the caller of the runner."""
    ids = [f"job-{i:02}" for i in range(12)]
    add(engine, *(Job(job_id, "q") for job_id in ids))
    jobs = make(runners, {"q": remembers}, concurrency=2).run_until_idle()
    assert sorted(job.job_id for job in jobs) == ids
    assert {job.job_id: job.result for job in jobs} == dict.fromkeys(ids), "a job saw what an earlier one set"
    assert CURRENT_JOB.get() is None


# -- order and queues ----------------------------------------------------------


def test_run_until_idle_returns_the_settled_jobs_in_priority_then_admission_order(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(
        engine,
        Job("a", "q"),
        Job("b", "q", priority=1),
        Job("c", "q"),
        Job("d", "q", priority=1),
        Job("e", "q", priority=2),
    )
    Watchdog(engine).cancel("e", "stop-e")
    ran: list[str] = []
    settled_jobs = make(runners, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()
    assert [j.job_id for j in settled_jobs] == ["e", "b", "d", "a", "c"]
    assert ran == ["b", "d", "a", "c"]
    assert [j.outcome for j in settled_jobs] == [Outcome.CANCELLED] + [Outcome.COMPLETED] * 4
    assert not Watchdog(engine).has_pending_work()


@pytest.mark.parametrize("runner_kind", KINDS)  # module-level handlers: the process kinds too
def test_run_until_idle_with_no_work_returns_nothing(engine: Engine, runners: RunnerDriver) -> None:
    worker = make(runners, {"q": done})
    assert worker.run_until_idle() == []
    assert worker.tick().status is TickStatus.IDLE


@pytest.mark.parametrize("runner_kind", KINDS)  # module-level handlers: the process kinds too
def test_run_until_idle_respects_max_ticks(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, *(Job(f"j{i}", "q") for i in range(3)))
    assert [j.job_id for j in make(runners, {"q": done}).run_until_idle(max_ticks=2)] == ["j0", "j1"]
    assert read(engine, "j2").state is JobState.QUEUED


def test_runner_ignores_queues_it_does_not_serve(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("mine", "emails"), Job("theirs", "sms", priority=10), Job("skipped", "reports"))
    ran: list[str] = []
    worker = make(
        runners,
        {"emails": lambda job: ran.append(job.job_id), "reports": lambda job: ran.append(job.job_id)},
        queues=["emails"],
    )
    assert worker.queues == ("emails",)
    assert [j.job_id for j in worker.run_until_idle()] == ["mine"]
    assert ran == ["mine"]
    assert read(engine, "theirs").state is JobState.QUEUED
    assert read(engine, "skipped").state is JobState.QUEUED


@pytest.fixture
def empty_registry() -> Iterator[dict[str, Any]]:
    saved = dict(_registry)
    _registry.clear()
    try:
        yield _registry
    finally:
        _registry.clear()
        _registry.update(saved)


def test_handlers_registered_with_the_decorator_are_used_when_handlers_is_none(
    engine: Engine, runners: RunnerDriver, empty_registry: dict[str, Any]
) -> None:
    ran: list[str] = []

    @handler("emails")
    def send(job: RunningJob) -> None:
        ran.append(job.job_id)

    @sqlalchemy_watchdog.handler("sms")
    def text_message(job: RunningJob) -> Decision:
        return Decision.failed("no signal")

    add(engine, Job("e", "emails"), Job("s", "sms"), Job("x", "unregistered"))
    worker = runners.runner(None, lease=LEASE, heartbeat=HEARTBEAT)
    assert set(worker.queues) == {"emails", "sms"}
    outcomes = {j.job_id: j.outcome for j in worker.run_until_idle()}
    assert outcomes == {"e": Outcome.COMPLETED, "s": Outcome.FAILED}
    assert ran == ["e"]
    assert read(engine, "x").state is JobState.QUEUED


def test_a_queue_can_have_only_one_registered_handler(empty_registry: dict[str, Any]) -> None:
    handler("q")(done)
    handler("q")(done)  # the same function again is fine
    with pytest.raises(ValueError):
        handler("q")(lambda job: None)


# -- settings ------------------------------------------------------------------


def build(runner_kind: str, handlers: Any = None, **kwargs: Any) -> Runner | AsyncRunner:
    """A runner of ``runner_kind`` on an in-memory SQLite database it never uses."""
    if runner_kind == "sync":
        return Runner(create_engine("sqlite://"), handlers, **kwargs)
    return AsyncRunner(create_async_engine("sqlite+aiosqlite://"), handlers, **kwargs)


def test_no_handlers_at_all_is_refused(runner_kind: str, empty_registry: dict[str, Any]) -> None:
    with pytest.raises(InvalidJob) as caught:
        build(runner_kind)
    assert caught.value.field == "handlers"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"lease": timedelta(seconds=30), "heartbeat": timedelta(seconds=15)}, "heartbeat"),
        ({"lease": timedelta(seconds=30), "heartbeat": timedelta(seconds=30)}, "heartbeat"),
        ({"lease": timedelta(seconds=30), "heartbeat": timedelta(seconds=60)}, "heartbeat"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": -1}, "concurrency"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"lease": 120}, "lease"),
        ({"heartbeat": 10.0}, "heartbeat"),
        ({"poll_interval": 2}, "poll_interval"),
        ({"grace": 30}, "grace"),
        ({"lease": timedelta(0)}, "lease"),
        ({"queues": ["q", "unhandled"]}, "queues"),
        ({"queues": "q"}, "queues"),
        ({"is_alive": True}, "is_alive"),
        ({"clock": 0}, "clock"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_settings_are_refused_naming_the_field(runner_kind: str, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJob) as caught:
        build(runner_kind, {"q": done}, **kwargs)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}:")


def test_handlers_that_are_not_callable_are_refused(runner_kind: str) -> None:
    with pytest.raises(InvalidJob) as caught:
        build(runner_kind, {"q": "not a function"})
    assert caught.value.field == "handlers"


def test_a_heartbeat_a_third_of_the_lease_is_accepted(runner_kind: str) -> None:
    build(runner_kind, {"q": done}, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=10))


def test_each_runner_refuses_the_other_kind_of_engine_naming_the_right_runner() -> None:
    with pytest.raises(TypeError, match="AsyncRunner"):
        Runner(create_async_engine("sqlite+aiosqlite://"), {"q": done})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sqlalchemy_watchdog.Runner"):
        AsyncRunner(create_engine("sqlite://"), {"q": done})  # type: ignore[arg-type]


# -- cancellation and lane failure ---------------------------------------------


def test_cancelling_a_queued_job_settles_it_cancelled_without_running_the_handler(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("a", "q"), Job("b", "q"))
    assert Watchdog(engine).cancel("a", "stop-a").status.value == "recorded"
    ran: list[str] = []
    result = make(runners, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()
    assert [(j.job_id, j.outcome) for j in result] == [("a", Outcome.CANCELLED), ("b", Outcome.COMPLETED)]
    assert ran == ["b"]
    assert read(engine, "a").outcome is Outcome.CANCELLED


def test_cancelling_a_running_job_stops_its_handler_and_settles_it_cancelled(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("a", "q"))
    blocking = Blocking()
    with make(runners, {"q": blocking.handler}).serving():
        assert blocking.started.wait(15)
        assert Watchdog(engine).cancel("a", "stop-a").status.value == "recorded"
        job = settled(engine, "a")
        wait_until(lambda: blocking.reasons, what="the handler to stop")
    assert blocking.reasons == [StopReason.CANCELLED]
    assert (job.outcome, job.failure_reason) == (Outcome.CANCELLED, None)


def test_cancelling_a_running_job_settles_it_cancelled_whatever_its_handler_then_decides(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The handler answers its stop with a decision of its own (here
    ``completed``): the recorded cancellation wins."""
    add(engine, Job("a", "q"))
    blocking = Blocking(Decision.completed())
    with make(runners, {"q": blocking.handler}).serving():
        assert blocking.started.wait(15)
        Watchdog(engine).cancel("a", "stop-a")
        job = settled(engine, "a")
    assert (job.outcome, job.failure_reason) == (Outcome.CANCELLED, None)


def test_the_default_concurrency_runs_ten_handlers_at_once(engine: Engine, runners: RunnerDriver) -> None:
    from sqlalchemy_watchdog.core.settings import DEFAULT_CONCURRENCY

    assert DEFAULT_CONCURRENCY == 10
    add(engine, *(Job(f"j{i}", "q") for i in range(12)))
    started: list[str] = []
    lock = threading.Lock()
    release = threading.Event()

    def hold(job: RunningJob) -> None:
        with lock:
            started.append(job.job_id)
        release.wait(15)

    settings: dict[str, Any] = {"lease": LEASE, "heartbeat": HEARTBEAT, "poll_interval": POLL}
    with runners.runner({"q": hold}, **settings).serving():
        wait_until(lambda: len(started) == 10, what="ten handlers to start")
        time.sleep(0.3)  # a slot-less runner claims nothing more meanwhile
        assert len(started) == 10
        with engine.connect() as conn:
            running = conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE state = 'running'")).scalar_one()
        assert running == 10
        release.set()
        wait_until(lambda: len(started) == 12, what="the last two to start")


def test_fail_lane_stops_a_running_handler_and_the_job_keeps_the_lane_failure(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("a", "q", lane="provider-x"), Job("b", "q", lane="provider-x"))
    blocking = Blocking()
    worker = make(runners, {"q": blocking.handler})
    with worker.serving():
        assert blocking.started.wait(15)
        result = Watchdog(engine).fail_lane("provider-x", "provider x is down")
        assert (result.settled, result.more) == (2, False)
        wait_until(lambda: blocking.reasons, what="the handler to stop")
    assert blocking.reasons == [StopReason.LANE_FAILED]
    for job_id in ("a", "b"):
        job = read(engine, job_id)
        assert (job.outcome, job.failure_reason) == (Outcome.FAILED, "provider x is down")


# -- lost leases ---------------------------------------------------------------


def _own_claim(engine: Engine, job_id: str) -> tuple[str, str]:
    return (job_id, raw(engine, job_id)["claim_token"])


def test_settle_after_the_lease_ran_out_is_rejected_and_the_row_unchanged(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The runner's clock jumps past the lease while the handler works."""
    add(engine, Job("a", "q"))
    offset = [0]
    snapshot: list[dict[str, Any]] = []

    def outlive_the_lease(job: RunningJob) -> None:
        offset[0] = 10 * 60 * 1000
        snapshot.append(raw(engine, "a"))

    worker = make(runners, {"q": outlive_the_lease}, clock=lambda: store.now_ms() + offset[0])
    result = worker.tick()
    assert result.status is TickStatus.REJECTED
    after = raw(engine, "a")
    assert after == snapshot[0]
    assert after["state"] == "running" and after["outcome"] is None


def test_lost_lease_stops_the_handler_and_its_settle_is_rejected(engine: Engine, runners: RunnerDriver) -> None:
    """The lease is ended under the handler: the heartbeat cannot renew it,
    the handler is told to stop, and its decision is never written."""
    add(engine, Job("a", "q"))
    reasons: list[StopReason | None] = []
    snapshot: list[dict[str, Any]] = []

    def lose_the_lease(job: RunningJob) -> None:
        with store.write_transaction(engine) as conn:
            assert store.release(conn, [_own_claim(engine, "a")]) == {"a"}
        snapshot.append(raw(engine, "a"))
        job.stop_requested.wait(15)
        reasons.append(job.stop_reason)

    worker = make(runners, {"q": lose_the_lease})
    result = worker.tick()
    wait_until(lambda: reasons, what="the handler to be told to stop")
    assert reasons == [StopReason.LEASE_LOST]
    assert result.status is TickStatus.REJECTED
    assert raw(engine, "a") == snapshot[0]
    # the next tick recovers the disappeared claim
    recovered = worker.tick()
    assert recovered.status is TickStatus.RECOVERED
    assert recovered.job is not None
    assert (recovered.job.outcome, recovered.job.failure_reason) == (Outcome.INTERRUPTED, NO_POLICY)


def test_lost_lease_stops_a_serving_handler_and_recovery_runs_the_job_again(
    engine: Engine, runners: RunnerDriver
) -> None:
    """Serving: a handler whose lease is ended under it is stopped with
    ``lease_lost`` (a coroutine's task is cancelled), the lost claim settles
    nothing, and recovery runs the job again within its budget."""
    add(engine, Job("a", "q", max_recoveries=1))
    blocking = Blocking(Decision.completed())

    def first_run_blocks(job: RunningJob) -> Decision | None:
        return blocking.handler.plain(job) if job.recovery_count == 0 else None

    async def first_run_blocks_async(job: RunningJob) -> Decision | None:
        return await blocking.handler.coroutine(job) if job.recovery_count == 0 else None

    worker = make(
        runners,
        {"q": dual(first_run_blocks, first_run_blocks_async)},
        lease=timedelta(milliseconds=1500),
        heartbeat=timedelta(milliseconds=300),
    )
    with worker.serving():
        assert blocking.started.wait(15)
        with store.write_transaction(engine) as conn:
            assert store.release(conn, [_own_claim(engine, "a")]) == {"a"}
        wait_until(lambda: blocking.reasons, what="the handler to stop")
        job = settled(engine, "a")
    assert blocking.reasons == [StopReason.LEASE_LOST]
    assert (job.outcome, job.recovery_count) == (Outcome.COMPLETED, 1)


def test_heartbeat_keeps_a_handler_running_longer_than_the_lease_alive(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q"))
    leases: list[int] = []

    def outlast(job: RunningJob) -> None:
        first = raw(engine, "a")["lease_until"]
        leases.append(first)
        wait_until(lambda: db_clock(engine) > first + 500, what="the first lease to pass")
        leases.append(raw(engine, "a")["lease_until"])

    worker = make(runners, {"q": outlast}, lease=timedelta(milliseconds=1500), heartbeat=timedelta(milliseconds=500))
    (job,) = worker.run_until_idle()
    assert job.outcome is Outcome.COMPLETED
    assert leases[1] > leases[0]


def test_heartbeat_keeps_a_coroutine_handler_alive_under_run_forever(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q"))
    leases: list[int] = []

    def outlast(job: RunningJob) -> None:
        first = raw(engine, "a")["lease_until"]
        leases.append(first)
        wait_until(lambda: db_clock(engine) > first + 500, what="the first lease to pass")
        leases.append(raw(engine, "a")["lease_until"])

    async def outlast_async(job: RunningJob) -> None:
        await asyncio.to_thread(outlast, job)

    worker = make(
        runners,
        {"q": dual(outlast, outlast_async)},
        lease=timedelta(milliseconds=1500),
        heartbeat=timedelta(milliseconds=500),
    )
    with worker.serving():
        job = settled(engine, "a")
    assert job.outcome is Outcome.COMPLETED
    assert leases[1] > leases[0]


# -- a pause between claim and start -----------------------------------------


class PauseAfterClaim:
    """SQLAlchemy events for a runner's engine that pause the runner for
    ``seconds`` right after its first claim committed (the connection goes
    back to the pool), as a process stopped or starved between claim and
    start would; :attr:`row` is the claimed row as it was then."""

    def __init__(self, engine: Engine, job_id: str, seconds: float) -> None:
        self.engine = engine
        self.job_id = job_id
        self.seconds = seconds
        self.row: dict[str, Any] | None = None
        self.listen = {"after_cursor_execute": self._after_execute, "checkin": self._checkin}

    def _after_execute(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        # The claim is the one statement that sets started_at (it reaches the
        # driver precompiled: there is no compiled construct to look at).
        if statement.startswith(("WITH ready", "UPDATE watchdog_jobs")) and "started_at=CASE" in statement:
            conn.info["test_claimed"] = True

    def _checkin(self, dbapi_connection: Any, record: Any) -> None:
        if record.info.pop("test_claimed", False) and self.row is None:
            self.row = raw(self.engine, self.job_id)
            time.sleep(self.seconds)


def test_a_handler_starting_long_after_its_claim_does_not_run_if_the_claim_was_lost(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The process paused between claim and start, long enough for the lease
    to end: the runner re-checks the claim before the handler starts and
    leaves the job to recovery instead of running it."""
    add(engine, Job("paused", "q", max_recoveries=1))
    ran: list[str] = []
    pause = PauseAfterClaim(engine, "paused", seconds=2.0)
    worker = make(
        runners,
        {"q": lambda job: ran.append(job.job_id)},
        lease=timedelta(milliseconds=1500),
        heartbeat=timedelta(milliseconds=500),
        listen=pause.listen,
    )
    result = worker.tick()
    assert pause.row is not None and pause.row["state"] == "running"
    assert ran == []
    assert result.status is TickStatus.REJECTED
    assert raw(engine, "paused") == pause.row  # left to recovery, untouched
    [recovered] = worker.run_until_idle()
    assert (recovered.outcome, recovered.recovery_count, ran) == (Outcome.COMPLETED, 1, ["paused"])


def test_a_handler_starting_late_runs_when_its_claim_still_holds(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("late", "q"))
    ran: list[str] = []
    pause = PauseAfterClaim(engine, "late", seconds=0.8)
    worker = make(
        runners,
        {"q": lambda job: ran.append(job.job_id)},
        lease=timedelta(seconds=30),
        heartbeat=timedelta(milliseconds=500),
        listen=pause.listen,
    )
    result = worker.tick()
    assert pause.row is not None
    assert ran == ["late"]
    assert result.job is not None and result.job.outcome is Outcome.COMPLETED


# -- recovery and liveness probes ----------------------------------------------


def _expired_claim_of_another_process(engine: Engine, job: Job) -> dict[str, Any]:
    add(engine, job)
    with store.write_transaction(engine) as conn:
        store.claim(conn, queues=[job.queue], limit=1, lease_ms=1)
    row = raw(engine, job.job_id)
    wait_until(lambda: db_clock(engine) > row["lease_until"], what="the lease to end")
    return row


def test_runner_recovers_an_expired_claim_within_its_budget(engine: Engine, runners: RunnerDriver) -> None:
    _expired_claim_of_another_process(engine, Job("a", "q", max_recoveries=1))
    counts: list[int] = []
    result = make(runners, {"q": lambda job: counts.append(job.recovery_count)}).run_until_idle()
    assert [(j.job_id, j.outcome, j.recovery_count) for j in result] == [("a", Outcome.COMPLETED, 1)]
    assert counts == [1]


def test_recovering_a_vanished_workers_jobs_logs_one_warning_each_and_no_error(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """The logging rule: a vanished worker's job being recovered (requeued or
    settled ``interrupted``) is a WARNING, never an ERROR."""
    _expired_claim_of_another_process(engine, Job("a", "q", max_recoveries=1))
    _expired_claim_of_another_process(engine, Job("b", "q"))
    caplog.set_level(logging.INFO, logger="sqlalchemy_watchdog")
    make(runners, {"q": done}).run_until_idle()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "recovered job a: requeued (recovery 1 of 1)" in warnings
    assert any(m.startswith("recovered job b: settled interrupted") for m in warnings)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_runner_interrupts_an_expired_claim_without_a_policy(engine: Engine, runners: RunnerDriver) -> None:
    _expired_claim_of_another_process(engine, Job("a", "q"))
    ran: list[str] = []
    result = make(runners, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()
    assert [(j.job_id, j.outcome, j.failure_reason) for j in result] == [("a", Outcome.INTERRUPTED, NO_POLICY)]
    assert ran == []


def test_runner_interrupts_an_expired_claim_whose_budget_is_spent(engine: Engine, runners: RunnerDriver) -> None:
    _expired_claim_of_another_process(engine, Job("a", "q", max_recoveries=0))
    ran: list[str] = []
    result = make(runners, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()
    assert [(j.job_id, j.outcome, j.failure_reason) for j in result] == [
        ("a", Outcome.INTERRUPTED, "Restart recovery budget exhausted (0 recoveries)")
    ]
    assert ran == []


def test_a_probe_that_raises_leaves_the_expired_job_running_and_the_runner_goes_on(
    engine: Engine, runners: RunnerDriver
) -> None:
    before = _expired_claim_of_another_process(engine, Job("external", "ext", max_recoveries=3))
    add(engine, Job("a", "q"), Job("b", "q"))
    probed: list[str] = []

    def probe(job: JobView) -> bool:
        probed.append(job.job_id)
        raise ConnectionError("orchestrator unreachable")

    worker = make(runners, {"q": done}, is_alive=probe)
    assert [(j.job_id, j.outcome) for j in worker.run_until_idle()] == [
        ("a", Outcome.COMPLETED),
        ("b", Outcome.COMPLETED),
    ]
    assert "external" in probed
    assert raw(engine, "external") == before
    unknown = worker.tick()
    assert (unknown.status, unknown.job_id) == (TickStatus.LIVENESS_UNKNOWN, "external")
    assert raw(engine, "external") == before


def test_a_probe_saying_alive_keeps_the_expired_job_running(engine: Engine, runners: RunnerDriver) -> None:
    before = _expired_claim_of_another_process(engine, Job("external", "ext"))
    probed: list[str] = []

    def is_alive(job: Any) -> bool:
        probed.append(job.job_id)
        return True

    worker = make(runners, {"q": done}, is_alive=is_alive)
    assert worker.run_until_idle() == []
    assert probed == ["external"]
    assert raw(engine, "external") == before


def test_a_probe_saying_dead_lets_the_expired_job_be_recovered(engine: Engine, runners: RunnerDriver) -> None:
    _expired_claim_of_another_process(engine, Job("external", "ext"))
    worker = make(runners, {"q": done}, is_alive=lambda job: False)
    assert [(j.job_id, j.outcome) for j in worker.run_until_idle()] == [("external", Outcome.INTERRUPTED)]


def test_an_idle_runner_recovers_a_claim_when_its_lease_ends_not_at_the_next_poll(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("a", "q"))
    with store.write_transaction(engine) as conn:
        store.claim(conn, queues=None, limit=1, lease_ms=1500)
    with make(runners, {"q": done}, poll_interval=timedelta(seconds=30)).serving():
        job = settled(engine, "a", timeout=10)
    assert (job.outcome, job.failure_reason) == (Outcome.INTERRUPTED, NO_POLICY)


def test_a_serving_runner_requeues_an_expired_claim_within_budget_and_runs_it(
    engine: Engine, runners: RunnerDriver
) -> None:
    _expired_claim_of_another_process(engine, Job("a", "q", max_recoveries=2))
    counts: list[int] = []
    with make(runners, {"q": lambda job: counts.append(job.recovery_count)}).serving():
        job = settled(engine, "a")
    assert (job.outcome, job.recovery_count, counts) == (Outcome.COMPLETED, 1, [1])


# -- concurrency and settle batching -----------------------------------------


def test_concurrency_runs_that_many_handlers_at_once_and_no_more(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, *(Job(f"j{i}", "q") for i in range(6)))
    barrier = threading.Barrier(3, timeout=15)
    lock = threading.Lock()
    now_running = [0]
    most = [0]

    def meet(job: RunningJob) -> None:
        with lock:
            now_running[0] += 1
            most[0] = max(most[0], now_running[0])
        try:
            barrier.wait()  # raises BrokenBarrierError unless 3 run at once
        finally:
            with lock:
                now_running[0] -= 1

    with make(runners, {"q": meet}, concurrency=3).serving():
        jobs = [settled(engine, f"j{i}", timeout=30) for i in range(6)]
    assert [j.outcome for j in jobs] == [Outcome.COMPLETED] * 6, [j.failure_reason for j in jobs]
    assert most[0] == 3


class Meeting:
    """A handler that returns once ``size`` handlers run at the same time
    (a plain function blocks its thread, a coroutine awaits), and counts
    the most that ever ran at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.arrived = 0
        self.running = 0
        self.most = 0
        self.everyone = threading.Event()
        self.broken = threading.Event()  # one gave up: the others give up at once

    def _arrive(self) -> None:
        with self.lock:
            self.arrived += 1
            self.running += 1
            self.most = max(self.most, self.running)
            if self.arrived >= self.size:
                self.everyone.set()

    def _leave(self) -> None:
        with self.lock:
            self.running -= 1

    def _give_up(self) -> None:
        self.broken.set()
        raise TimeoutError(f"only {self.running} of {self.size} handlers ran at once")

    def plain(self, job: RunningJob) -> None:
        self._arrive()
        try:
            deadline = time.monotonic() + 6
            while not self.everyone.wait(0.01):
                if self.broken.is_set() or time.monotonic() > deadline:
                    self._give_up()
        finally:
            self._leave()

    async def coroutine(self, job: RunningJob) -> None:
        self._arrive()
        try:
            deadline = time.monotonic() + 6
            while not self.everyone.is_set():
                if self.broken.is_set() or time.monotonic() > deadline:
                    self._give_up()
                await asyncio.sleep(0.01)
        finally:
            self._leave()


def test_concurrency_runs_that_many_coroutine_handlers_at_once_and_no_more(
    engine: Engine, runners: RunnerDriver
) -> None:
    meeting = Meeting(4)
    add(engine, *(Job(f"j{i}", "q") for i in range(8)))
    with make(runners, {"q": dual(meeting.plain, meeting.coroutine)}, concurrency=4).serving():
        jobs = [settled(engine, f"j{i}", timeout=30) for i in range(8)]
    assert [j.outcome for j in jobs] == [Outcome.COMPLETED] * 8, [j.failure_reason for j in jobs]
    assert meeting.most == 4


def test_concurrency_runs_that_many_plain_handlers_at_once_even_beyond_a_default_thread_pool(
    engine: Engine, runners: RunnerDriver
) -> None:
    """``concurrency=N`` means N blocking handlers at once, whatever the
    machine's core count (asyncio's default executor has ``cpus + 4``
    threads, at most 32)."""
    size = 40
    meeting = Meeting(size)
    add(engine, *(Job(f"j{i}", "q") for i in range(size)))
    with make(runners, {"q": meeting.plain}, concurrency=size).serving():
        jobs = [settled(engine, f"j{i}", timeout=60) for i in range(size)]
    assert [j.outcome for j in jobs] == [Outcome.COMPLETED] * size, {j.failure_reason for j in jobs}
    assert meeting.most == size


@pytest.mark.dialect_specific
def test_handlers_finishing_together_share_settle_statements_and_each_settles_once(
    engine: Engine, runners: RunnerDriver
) -> None:
    """Settles waiting at the same moment go out as one statement and one
    commit (each row still guarded by its own claim): a busy runner does not
    pay a durable commit per job, nor need a connection per handler."""
    jobs = 8
    add(engine, *(Job(f"j{i}", "q") for i in range(jobs)))
    meeting = Meeting(jobs)
    settles: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "settles" in statement:
            settles.append(statement)

    worker = make(
        runners,
        {"q": dual(meeting.plain, meeting.coroutine)},
        concurrency=jobs,
        listen={"before_cursor_execute": count},
    )
    with worker.serving():
        finished = [settled(engine, f"j{i}", timeout=30) for i in range(jobs)]
    assert [j.outcome for j in finished] == [Outcome.COMPLETED] * jobs, [j.failure_reason for j in finished]
    assert 1 <= len(settles) < jobs


# -- wake-ups ------------------------------------------------------------------


def _listening(engine: Engine) -> bool:
    """Whether an idle runner waits for NOTIFY: its listener holds the waiting lock."""
    return waiting_sessions(engine) > 0


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", ["postgresql"])  # LISTEN/NOTIFY is PostgreSQL's
def test_notify_wakes_an_idle_runner_long_before_the_poll_interval(engine: Engine, runners: RunnerDriver) -> None:
    worker = make(runners, {"q": done}, poll_interval=timedelta(seconds=30))
    with worker.serving():
        wait_until(lambda: _listening(engine), what="the runner to LISTEN")
        add(engine, Job("warm-up", "q"))
        settled(engine, "warm-up", timeout=10)
        time.sleep(0.3)  # let the loop go idle on its 30 s wait
        started = time.monotonic()
        add(engine, Job("a", "q"))
        job = settled(engine, "a", timeout=10)
        elapsed = time.monotonic() - started
    assert job.outcome is Outcome.COMPLETED
    assert elapsed < 5, f"took {elapsed:.1f}s with a 30 s poll interval"


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", ["postgresql"])  # LISTEN/NOTIFY is PostgreSQL's
def test_notify_stops_a_cancelled_handler_long_before_the_next_heartbeat(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q"))
    blocking = Blocking()
    worker = make(
        runners,
        {"q": blocking.handler},
        lease=timedelta(seconds=90),
        heartbeat=timedelta(seconds=30),
        poll_interval=timedelta(seconds=30),
    )
    with worker.serving():
        assert blocking.started.wait(15)
        # Busy (its one slot is taken), so it holds no waiting lock: only LISTENs.
        wait_until(lambda: listening_sessions(engine), what="the runner to LISTEN")
        started = time.monotonic()
        Watchdog(engine).cancel("a", "stop-a")
        wait_until(lambda: blocking.reasons, timeout=10, what="the handler to stop")
        elapsed = time.monotonic() - started
        job = settled(engine, "a")
    assert blocking.reasons == [StopReason.CANCELLED]
    assert job.outcome is Outcome.CANCELLED
    assert elapsed < 5, f"took {elapsed:.1f}s with a 30 s heartbeat"


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", ["postgresql"])  # LISTEN/NOTIFY is PostgreSQL's
def test_the_listener_connects_like_the_engine_and_notify_wakes_the_runner(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The runner's engine connects only through a ``do_connect`` hook (its
    URL names a database that does not exist; the hook puts the right one in):
    the LISTEN connection must be made the same way, so NOTIFY still wakes
    an idle runner long before its 30 s poll."""
    real = engine.url.database
    assert real is not None

    def connect_to_the_real_database(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        cparams["dbname"] = real

    worker = make(
        runners,
        {"q": done},
        poll_interval=timedelta(seconds=30),
        url=engine.url.set(database=f"{real}_no_such_database"),
        listen={"do_connect": connect_to_the_real_database},
    )
    add(engine, Job("warm-up", "q"))
    with worker.serving():
        settled(engine, "warm-up", timeout=10)  # the runner's own connections work
        time.sleep(1.0)  # the listener connects; the loop goes idle on its 30 s wait
        started = time.monotonic()
        add(engine, Job("a", "q"))
        job = wait_until(
            lambda: (j := read(engine, "a")).state is JobState.SETTLED and j,
            timeout=3,
            what="NOTIFY to wake the runner (the poll interval is 30 s)",
        )
        elapsed = time.monotonic() - started
    assert job.outcome is Outcome.COMPLETED
    assert elapsed < 3


def test_an_idle_runner_picks_up_new_work_by_polling(engine: Engine, runners: RunnerDriver) -> None:
    with make(runners, {"q": done}, poll_interval=timedelta(milliseconds=200)).serving():
        add(engine, Job("warm-up", "q"))
        settled(engine, "warm-up")
        add(engine, Job("a", "q"))
        assert settled(engine, "a", timeout=10).outcome is Outcome.COMPLETED


# -- shutdown ------------------------------------------------------------------


def test_stop_lets_a_handler_finish_within_grace(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q"))
    started = threading.Event()

    def slow(job: RunningJob) -> None:
        started.set()
        time.sleep(0.5)

    async def slow_async(job: RunningJob) -> None:
        started.set()
        await asyncio.sleep(0.5)

    worker = make(runners, {"q": dual(slow, slow_async)}, grace=timedelta(seconds=10))
    with worker.serving():
        assert started.wait(15)
    # run_forever returned: the job settled with the handler's own decision
    assert read(engine, "a").outcome is Outcome.COMPLETED


def test_stop_claims_nothing_more_while_running_handlers_finish(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("first", "q", priority=1), Job("waiting", "q"))
    started = threading.Event()

    def slow(job: RunningJob) -> None:
        started.set()
        time.sleep(0.5)

    async def slow_async(job: RunningJob) -> None:
        started.set()
        await asyncio.sleep(0.5)

    worker = make(runners, {"q": dual(slow, slow_async)}, grace=timedelta(seconds=10))
    with worker.serving():
        assert started.wait(15)
        worker.stop()
        # the slot frees within grace; serving() waits for run_forever to return
    assert read(engine, "first").outcome is Outcome.COMPLETED
    assert read(engine, "waiting").state is JobState.QUEUED


@pytest.mark.parametrize(
    ("max_recoveries", "state", "outcome"),
    [(1, JobState.QUEUED, None), (None, JobState.SETTLED, Outcome.INTERRUPTED)],
    ids=["requeued", "interrupted"],
)
def test_a_job_outliving_grace_is_handed_to_recovery_at_once(
    engine: Engine, runners: RunnerDriver, max_recoveries: int | None, state: JobState, outcome: Outcome | None
) -> None:
    """The handler ignores its stop (a blocked thread, a coroutine that
    swallows its cancellation): run_forever still returns, and the job is
    recovered at once instead of waiting for its 60 s lease."""
    add(engine, Job("a", "q", max_recoveries=max_recoveries))
    stubborn = Stubborn()
    worker = make(
        runners,
        {"q": stubborn.handler},
        lease=timedelta(seconds=60),
        heartbeat=timedelta(seconds=5),
        grace=timedelta(milliseconds=200),
    )
    try:
        with worker.serving():
            assert stubborn.started.wait(15)
        job = read(engine, "a")  # right after run_forever returned, long before the 60 s lease
        assert (job.state, job.outcome) == (state, outcome)
        assert job.recovery_count == (1 if max_recoveries else 0)
        if outcome is not None:
            # The reason says the shutdown outlived its grace, not that the worker vanished.
            assert job.failure_reason == f"{store.SHUTDOWN_REASON}; no recovery policy"
    finally:
        stubborn.release.set()


@pytest.mark.parametrize(
    ("max_recoveries", "state", "outcome"),
    [(1, JobState.QUEUED, None), (None, JobState.SETTLED, Outcome.INTERRUPTED)],
    ids=["requeued", "interrupted"],
)
def test_a_handler_that_gives_up_at_the_shutdown_stop_is_handed_to_recovery_not_settled_completed(
    engine: Engine, runners: RunnerDriver, max_recoveries: int | None, state: JobState, outcome: Outcome | None
) -> None:
    """After grace the handler is asked to stop (``stop_requested`` with
    reason ``shutdown``; a coroutine's task is cancelled) and says it gave
    up -- a plain handler by raising, a coroutine by letting its
    cancellation through: it did not finish its work, so the job is
    recovered -- requeued within its budget, else interrupted -- never
    reported ``completed`` or ``failed``."""
    add(engine, Job("a", "q", max_recoveries=max_recoveries))
    blocking = Blocking()
    plain = blocking.handler.plain

    def gives_up(job: RunningJob) -> None:
        plain(job)
        raise RuntimeError("stopped before the work was done")

    worker = make(
        runners,
        {"q": dual(gives_up, blocking.handler.coroutine)},
        lease=timedelta(seconds=60),
        heartbeat=timedelta(seconds=5),
        grace=timedelta(milliseconds=200),
    )
    with worker.serving():
        assert blocking.started.wait(15)
    assert blocking.reasons == [StopReason.SHUTDOWN]
    job = read(engine, "a")
    assert (job.state, job.outcome) == (state, outcome)
    assert job.recovery_count == (1 if max_recoveries else 0)


@pytest.mark.parametrize("answer", [None, Decision.completed()], ids=["returns-None", "returns-completed"])
def test_a_handler_that_returns_normally_after_the_shutdown_stop_settles_completed(
    engine: Engine, runners: RunnerDriver, answer: Decision | None
) -> None:
    """A handler that returns normally after the shutdown stop has done its
    work -- ``None`` as much as ``Decision.completed()``, a plain handler
    and a coroutine that catches its cancellation alike: the job settles
    ``completed`` and is never run again (even with a recovery budget)."""
    add(engine, Job("a", "q", max_recoveries=1))
    started = threading.Event()

    def finish(job: RunningJob) -> Decision | None:
        started.set()
        job.stop_requested.wait(30)
        return answer

    async def finish_async(job: RunningJob) -> Decision | None:
        started.set()
        while not job.stop_requested.is_set():
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                break
        return answer

    worker = make(
        runners,
        {"q": dual(finish, finish_async)},
        lease=timedelta(seconds=60),
        heartbeat=timedelta(seconds=5),
        grace=timedelta(milliseconds=200),
    )
    with worker.serving():
        assert started.wait(15)
    job = read(engine, "a")
    assert (job.state, job.outcome, job.recovery_count) == (JobState.SETTLED, Outcome.COMPLETED, 0)


# -- AsyncRunner only: handler shapes -------------------------------------------


@pytest.mark.parametrize("runner_kind", ["async"])
@pytest.mark.parametrize("shape", ["async-call-object", "lambda-returning-a-coroutine"])
def test_a_handler_of_any_shape_returning_a_coroutine_is_cancelled_like_a_coroutine_function(
    engine: Engine, runners: RunnerDriver, shape: str
) -> None:
    """A class-based handler (``async def __call__``) or a lambda returning a
    coroutine is a coroutine handler too: a cancellation cancels it."""
    add(engine, Job("a", "q"))
    blocking = Blocking()
    coroutine = blocking.handler.coroutine

    class Handler:
        async def __call__(self, job: RunningJob) -> None:
            await coroutine(job)

    handle = Handler() if shape == "async-call-object" else (lambda job: coroutine(job))
    with make(runners, {"q": handle}, grace=timedelta(milliseconds=200)).serving():
        assert blocking.started.wait(15)
        Watchdog(engine).cancel("a", "stop-a")
        wait_until(lambda: blocking.reasons, timeout=4, what="the handler to be cancelled")
    assert blocking.reasons == [StopReason.CANCELLED]
    assert settled(engine, "a").outcome is Outcome.CANCELLED


# -- time and failure policy ---------------------------------------------------
#
# Retries, snoozes and timeouts, for both runner kinds on both dialects.
# Backoffs are tens of milliseconds with jitter=0; a tick does not wait for a
# delayed job, so these tests tick (or serve) until the job settles, and
# judge every wait by the database clock the ready times are counted from.


def quick_retry(max_attempts: int, backoff_ms: int = 20, factor: float = 2.0) -> RetryPolicy:
    """A retry policy with a short backoff and no jitter."""
    return RetryPolicy(max_attempts=max_attempts, backoff=timedelta(milliseconds=backoff_ms), factor=factor, jitter=0.0)


def epoch_ms(value: datetime | None) -> int:
    assert value is not None
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def tick_until_settled(worker: Any, engine: Engine, *job_ids: str, timeout: float = 20.0) -> list[TickResult]:
    """Tick ``worker`` until every one of ``job_ids`` has settled; the tick
    results, idle ones left out (a retry waits for its time, a tick does not)."""
    results: list[TickResult] = []

    def all_settled() -> bool:
        result = worker.tick()
        if result.status is not TickStatus.IDLE:
            results.append(result)
        return all(read(engine, job_id).state is JobState.SETTLED for job_id in job_ids)

    wait_until(all_settled, timeout, what=f"{', '.join(job_ids)} to settle", interval=0.01)
    return results


def test_a_failing_job_is_retried_with_backoff_until_it_succeeds(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", retry=quick_retry(5, backoff_ms=50, factor=4.0)))
    starts: list[tuple[int, int]] = []  # (attempt, database clock when it started)

    def flaky(job: RunningJob) -> None:
        starts.append((job.attempt, db_clock(engine)))
        if job.attempt < 3:
            raise ConnectionError(f"provider down (attempt {job.attempt})")

    results = tick_until_settled(make(runners, {"q": flaky}), engine, "a")
    assert [r.status for r in results] == [TickStatus.REQUEUED, TickStatus.REQUEUED, TickStatus.SETTLED]
    requeued = [r.job for r in results[:2]]
    assert [(j.state, j.attempt) for j in requeued if j is not None] == [(JobState.DELAYED, 2), (JobState.DELAYED, 3)]
    assert [attempt for attempt, _ in starts] == [1, 2, 3]
    # The waits are the policy's: 50 ms, then 50 * 4 ms, from the failed attempt's settle;
    # the next attempt never starts before its ready time.
    for (_, started), (_, next_started), job, backoff in zip(starts, starts[1:], requeued, (50, 200)):
        assert job is not None
        ready = epoch_ms(job.ready_at)
        assert backoff <= ready - started < backoff + 5000
        assert next_started >= ready
    job = read(engine, "a")
    assert (job.state, job.outcome, job.attempt, job.failure_reason) == (JobState.SETTLED, Outcome.COMPLETED, 3, None)
    assert [(e.attempt, e.reason) for e in job.failure_history] == [
        (1, "ConnectionError: provider down (attempt 1)"),
        (2, "ConnectionError: provider down (attempt 2)"),
    ]
    assert raw(engine, "a")["attempt"] == 3


def test_a_job_failing_every_attempt_settles_failed_with_the_last_reason(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", retry=quick_retry(3)))

    def always(job: RunningJob) -> None:
        raise ValueError(f"bad row {job.attempt}")

    results = tick_until_settled(make(runners, {"q": always}), engine, "a")
    assert [r.status for r in results] == [TickStatus.REQUEUED, TickStatus.REQUEUED, TickStatus.SETTLED]
    job = read(engine, "a")
    assert (job.outcome, job.attempt, job.failure_reason) == (Outcome.FAILED, 3, "ValueError: bad row 3")
    assert [(e.attempt, e.reason) for e in job.failure_history] == [
        (1, "ValueError: bad row 1"),
        (2, "ValueError: bad row 2"),
        (3, "ValueError: bad row 3"),
    ]
    assert job.failure_detail is not None and "bad row 3" in job.failure_detail


def test_decision_failed_without_retry_fails_at_once(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", retry=quick_retry(5)))
    worker = make(runners, {"q": lambda job: Decision.failed("card is invalid", retry=False)}, retry=quick_retry(5))
    (job,) = worker.run_until_idle()
    assert (job.outcome, job.attempt, job.failure_reason) == (Outcome.FAILED, 1, "card is invalid")
    assert [(e.attempt, e.reason) for e in job.failure_history] == [(1, "card is invalid")]


def test_decision_failed_is_retried_under_the_policy(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", retry=quick_retry(2)))
    results = tick_until_settled(make(runners, {"q": lambda job: Decision.failed("busy")}), engine, "a")
    assert [r.status for r in results] == [TickStatus.REQUEUED, TickStatus.SETTLED]
    job = read(engine, "a")
    assert (job.outcome, job.attempt, [e.attempt for e in job.failure_history]) == (Outcome.FAILED, 2, [1, 2])


def test_decision_retry_waits_at_least_its_after(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", retry=quick_retry(3)))  # its own backoff would be 20 ms
    starts: list[int] = []

    def later(job: RunningJob) -> Decision | None:
        starts.append(db_clock(engine))
        return Decision.retry("rate limited", after=timedelta(milliseconds=400)) if job.attempt == 1 else None

    worker = make(runners, {"q": later})
    first = worker.tick()
    settled_by = db_clock(engine)
    assert first.status is TickStatus.REQUEUED and first.job is not None
    assert (first.job.state, first.job.attempt, first.job.failure_reason) == (JobState.DELAYED, 2, "rate limited")
    # ready = the settle's database clock + 400 ms, and the settle came between these two readings
    ready = epoch_ms(first.job.ready_at)
    assert starts[0] + 400 <= ready <= settled_by + 400
    tick_until_settled(worker, engine, "a")
    assert len(starts) == 2 and starts[1] >= ready
    assert read(engine, "a").outcome is Outcome.COMPLETED


def test_decision_retry_after_zero_is_queued_at_once_and_without_attempts_left_settles_failed(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("policy", "q", retry=quick_retry(2)), Job("no-policy", "q"))

    def again(job: RunningJob) -> Decision:
        return Decision.retry(f"again {job.attempt}", after=timedelta(0))

    worker = make(runners, {"q": again})
    first = worker.tick()
    assert first.status is TickStatus.REQUEUED and first.job is not None
    assert (first.job.job_id, first.job.state, first.job.attempt) == ("policy", JobState.QUEUED, 2)
    settled_jobs = worker.run_until_idle()  # queued: no wait for the next attempt
    assert {j.job_id: (j.outcome, j.attempt, j.failure_reason) for j in settled_jobs} == {
        "policy": (Outcome.FAILED, 2, "again 2"),
        "no-policy": (Outcome.FAILED, 1, "again 1"),
    }


def test_a_snooze_uses_no_attempt_and_counts_snoozes(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", retry=quick_retry(2)))
    seen: list[tuple[int, int, int]] = []

    def sleepy(job: RunningJob) -> Decision | None:
        seen.append((job.attempt, job.snoozes, job.max_attempts))
        if job.attempt == 1:
            raise RuntimeError("first failure")
        if job.snoozes < 2:
            return Decision.snooze(timedelta(milliseconds=20))
        return None

    results = tick_until_settled(make(runners, {"q": sleepy}), engine, "a")
    assert seen == [(1, 0, 2), (2, 0, 2), (2, 1, 2), (2, 2, 2)]
    snoozed = [r.job for r in results[1:3]]
    # While snoozed the job keeps its attempt and its last failure.
    assert [(j.state, j.attempt, j.snoozes, j.failure_reason) for j in snoozed if j is not None] == [
        (JobState.DELAYED, 2, 1, "RuntimeError: first failure"),
        (JobState.DELAYED, 2, 2, "RuntimeError: first failure"),
    ]
    job = read(engine, "a")
    assert (job.outcome, job.attempt, job.snoozes) == (Outcome.COMPLETED, 2, 2)
    assert [e.attempt for e in job.failure_history] == [1]


def test_outcome_unknown_is_never_retried(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", retry=quick_retry(5)))
    worker = make(runners, {"q": lambda job: Decision.outcome_unknown("bank did not answer")}, retry=quick_retry(5))
    (job,) = worker.run_until_idle()
    assert (job.outcome, job.attempt, job.failure_history) == (Outcome.OUTCOME_UNKNOWN, 1, ())
    assert worker.tick().status is TickStatus.IDLE


def test_the_retry_policy_is_the_jobs_own_else_its_handlers_else_the_runners(
    engine: Engine, runners: RunnerDriver, empty_registry: dict[str, Any]
) -> None:
    seen: dict[str, set[int]] = {}

    def failing(job: RunningJob) -> None:
        seen.setdefault(job.job_id, set()).add(job.max_attempts)
        raise RuntimeError("no")

    def on_h(job: RunningJob) -> None:
        failing(job)

    def on_r(job: RunningJob) -> None:
        failing(job)

    def on_off(job: RunningJob) -> None:
        failing(job)

    handler("h", retry=quick_retry(3))(on_h)
    handler("r")(on_r)
    handler("off", retry=None)(on_off)  # explicitly none: the runner's does not apply
    expected = {
        "own-on-h": 4,
        "handlers": 3,
        "own-on-r": 4,
        "runners": 2,
        "handler-says-none": 1,
        "own-on-off": 2,
    }
    add(
        engine,
        Job("own-on-h", "h", retry=quick_retry(4)),
        Job("handlers", "h"),
        Job("own-on-r", "r", retry=quick_retry(4)),
        Job("runners", "r"),
        Job("handler-says-none", "off"),
        Job("own-on-off", "off", retry=quick_retry(2)),
    )
    worker = make(runners, {"h": on_h, "r": on_r, "off": on_off}, retry=quick_retry(2))
    tick_until_settled(worker, engine, *expected)
    assert {job_id: read(engine, job_id).attempt for job_id in expected} == expected
    assert {job_id: read(engine, job_id).outcome for job_id in expected} == dict.fromkeys(expected, Outcome.FAILED)
    assert seen == {job_id: {attempts} for job_id, attempts in expected.items()}


def test_the_running_job_shows_attempt_max_attempts_snoozes_and_timeout(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("own", "q", retry=quick_retry(3), timeout=timedelta(seconds=5)), Job("plain", "p"))
    seen: list[tuple[str, int, int, int, timedelta | None]] = []

    def handle(job: RunningJob) -> Decision | None:
        seen.append((job.job_id, job.attempt, job.max_attempts, job.snoozes, job.timeout))
        if job.job_id == "own" and job.snoozes == 0:
            return Decision.snooze(timedelta(milliseconds=20))
        if job.job_id == "own" and job.attempt == 1:
            return Decision.failed("once")
        return None

    tick_until_settled(make(runners, {"q": handle, "p": handle}), engine, "own", "plain")
    five = timedelta(seconds=5)
    assert [s for s in seen if s[0] == "own"] == [
        ("own", 1, 3, 0, five),
        ("own", 1, 3, 1, five),
        ("own", 2, 3, 1, five),
    ]
    assert [s for s in seen if s[0] == "plain"] == [("plain", 1, 1, 0, None)]


def test_run_until_idle_leaves_a_job_delayed_into_the_future_waiting(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("now", "q"))
    with engine.begin() as conn:
        enqueue(conn, Job("later", "q"), delay=timedelta(hours=1))
    ran: list[str] = []
    assert [j.job_id for j in make(runners, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()] == ["now"]
    assert ran == ["now"]
    assert read(engine, "later").state is JobState.DELAYED


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"retry": 3}, "retry"),
        ({"retry": {"max_attempts": 3}}, "retry"),
        ({"timeout": 5}, "timeout"),
        ({"timeout": timedelta(0)}, "timeout"),
    ],
    ids=["retry-int", "retry-dict", "timeout-int", "timeout-zero"],
)
def test_invalid_retry_or_timeout_settings_are_refused_naming_the_field(
    runner_kind: str, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidJob) as caught:
        build(runner_kind, {"q": done}, **kwargs)
    assert caught.value.field == field


def test_the_handler_decorator_refuses_a_bad_retry_or_timeout(empty_registry: dict[str, Any]) -> None:
    with pytest.raises(InvalidJob) as caught:
        handler("q", retry=3)  # type: ignore[arg-type]
    assert caught.value.field == "retry"
    with pytest.raises(InvalidJob) as caught:
        handler("q", timeout=1.5)  # type: ignore[arg-type]
    assert caught.value.field == "timeout"
    assert empty_registry == {}


# -- timeouts ----------------------------------------------------------------------


class UntilStopped:
    """A handler whose first attempt runs until it is told to stop (a plain
    function waits for ``stop_requested``, a coroutine sleeps until its task
    is cancelled) and then ends as ``ending`` says: ``returns`` (None; a
    coroutine lets its cancellation through), ``raises`` (TimeoutError) or
    ``decides`` (``Decision.completed()``). Later attempts return at once.
    Records why it was stopped, whether a coroutine was cancelled, and how
    long the first attempt ran."""

    def __init__(self, ending: str) -> None:
        self.ending = ending
        self.reasons: list[StopReason | None] = []
        self.cancelled: list[bool] = []
        self.ran_for: list[float] = []

        def plain(job: RunningJob) -> Decision | None:
            if job.attempt > 1:
                return None
            started = time.monotonic()
            stopped = job.stop_requested.wait(30)
            self.ran_for.append(time.monotonic() - started)
            self.reasons.append(job.stop_reason if stopped else None)
            return self._end()

        async def coroutine(job: RunningJob) -> Decision | None:
            if job.attempt > 1:
                return None
            started = time.monotonic()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.ran_for.append(time.monotonic() - started)
                self.reasons.append(job.stop_reason)
                self.cancelled.append(True)
                if self.ending == "returns":
                    raise
                return self._end()
            self.reasons.append(None)
            return None

        self.handler = dual(plain, coroutine)

    def _end(self) -> Decision | None:
        if self.ending == "raises":
            raise TimeoutError("gave up")
        if self.ending == "decides":
            return Decision.completed()
        return None

    def shape(self, runners: RunnerDriver) -> Callable[[RunningJob], Any]:
        """The function the runner kind runs (for ``@handler`` registration)."""
        return self.handler.coroutine if runners.is_async else self.handler.plain


TIMED_OUT = "timed out after 0.2s"


@pytest.mark.parametrize(
    ("ending", "reason"),
    [("returns", TIMED_OUT), ("raises", f"{TIMED_OUT} (TimeoutError: gave up)")],
)
def test_a_handler_outliving_its_timeout_is_stopped_and_the_attempt_fails_and_is_retried(
    engine: Engine, runners: RunnerDriver, ending: str, reason: str
) -> None:
    add(engine, Job("a", "q", timeout=timedelta(milliseconds=200), retry=quick_retry(2)))
    slow = UntilStopped(ending)
    worker = make(runners, {"q": slow.handler})
    first = worker.tick()
    assert slow.reasons == [StopReason.TIMEOUT]
    assert slow.cancelled == ([True] if runners.is_async else [])  # a coroutine's task is cancelled
    assert 0.15 <= slow.ran_for[0] < 2.5, slow.ran_for  # by its timeout, long before the 3 s lease
    assert first.status is TickStatus.REQUEUED and first.job is not None
    assert (first.job.attempt, first.job.failure_reason) == (2, reason)
    tick_until_settled(worker, engine, "a")
    job = read(engine, "a")
    assert (job.outcome, job.attempt, job.recovery_count) == (Outcome.COMPLETED, 2, 0)
    assert [(e.attempt, e.reason) for e in job.failure_history] == [(1, reason)]


def test_a_timed_out_attempt_without_attempts_left_settles_failed(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", timeout=timedelta(milliseconds=200)))
    slow = UntilStopped("returns")
    result = make(runners, {"q": slow.handler}).tick()
    assert result.status is TickStatus.SETTLED and result.job is not None
    assert (result.job.outcome, result.job.failure_reason, result.job.attempt) == (Outcome.FAILED, TIMED_OUT, 1)
    assert slow.reasons == [StopReason.TIMEOUT]


def test_a_decision_returned_after_the_timeout_stop_is_honoured(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("a", "q", timeout=timedelta(milliseconds=200), retry=quick_retry(3)))
    slow = UntilStopped("decides")
    result = make(runners, {"q": slow.handler}).tick()
    assert slow.reasons == [StopReason.TIMEOUT]
    assert result.status is TickStatus.SETTLED and result.job is not None
    assert (result.job.outcome, result.job.attempt, result.job.failure_history) == (Outcome.COMPLETED, 1, ())


@pytest.mark.parametrize("where", ["handler", "runner"])
def test_a_handlers_or_runners_timeout_stops_the_handler_like_a_jobs_own(
    engine: Engine, runners: RunnerDriver, empty_registry: dict[str, Any], where: str
) -> None:
    slow = UntilStopped("returns")
    fn = slow.shape(runners)
    settings: dict[str, Any] = {}
    if where == "handler":
        handler("q", timeout=timedelta(milliseconds=200))(fn)
    else:
        settings["timeout"] = timedelta(milliseconds=200)
    add(engine, Job("a", "q"))
    result = make(runners, {"q": fn}, **settings).tick()
    assert slow.reasons == [StopReason.TIMEOUT]
    assert result.job is not None and (result.job.outcome, result.job.failure_reason) == (Outcome.FAILED, TIMED_OUT)


def test_the_timeout_is_the_jobs_own_else_its_handlers_else_the_runners(
    engine: Engine, runners: RunnerDriver, empty_registry: dict[str, Any]
) -> None:
    seen: dict[str, timedelta | None] = {}

    def on_h(job: RunningJob) -> None:
        seen[job.job_id] = job.timeout

    def on_r(job: RunningJob) -> None:
        seen[job.job_id] = job.timeout

    def on_off(job: RunningJob) -> None:
        seen[job.job_id] = job.timeout

    handler("h", timeout=timedelta(seconds=20))(on_h)
    handler("r")(on_r)
    handler("off", timeout=None)(on_off)
    add(
        engine,
        Job("own-on-h", "h", timeout=timedelta(seconds=10)),
        Job("handlers", "h"),
        Job("own-on-r", "r", timeout=timedelta(seconds=5)),
        Job("runners", "r"),
        Job("handler-says-none", "off"),
        Job("own-on-off", "off", timeout=timedelta(seconds=7)),
    )
    worker = make(runners, {"h": on_h, "r": on_r, "off": on_off}, timeout=timedelta(seconds=30))
    assert len(worker.run_until_idle()) == 6
    assert seen == {
        "own-on-h": timedelta(seconds=10),
        "handlers": timedelta(seconds=20),
        "own-on-r": timedelta(seconds=5),
        "runners": timedelta(seconds=30),
        "handler-says-none": None,
        "own-on-off": timedelta(seconds=7),
    }


class Concurrency:
    """Counts the handlers running at once (their peak), whatever the thread or task."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.peak = 0

    def enter(self) -> None:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)

    def leave(self) -> None:
        with self._lock:
            self.running -= 1


def test_a_handler_overstaying_its_lease_keeps_its_slot_so_concurrency_is_never_exceeded(
    engine: Engine, runners: RunnerDriver
) -> None:
    """Slots belong to executions, not to job ids: when a handler ignores
    its timeout past its lease, its job is recovered and this very runner
    claims it again -- the first execution still holds its slot until its
    handler returns, so two slots never run three handlers."""
    fillers = [f"f{i}" for i in range(12)]
    add(engine, Job("stubborn", "q", timeout=timedelta(milliseconds=200), max_recoveries=1))
    add(engine, *(Job(job_id, "q") for job_id in fillers))
    count = Concurrency()

    def recovered() -> bool:
        return read(engine, "stubborn").recovery_count == 1

    def plain(job: RunningJob) -> None:
        count.enter()
        try:
            if job.job_id == "stubborn" and job.recovery_count == 0:
                wait_until(recovered, timeout=20, what="the recovery")  # ignores its stop, past its lease
                time.sleep(0.6)  # and overstays while the job runs again
            else:
                time.sleep(0.15)
        finally:
            count.leave()

    async def coroutine(job: RunningJob) -> None:
        count.enter()
        try:
            if job.job_id == "stubborn" and job.recovery_count == 0:
                deadline = time.monotonic() + 20
                while not recovered() and time.monotonic() < deadline:  # swallows every cancellation
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(0.05)
                until = time.monotonic() + 0.6
                while time.monotonic() < until:
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(0.05)
            else:
                await asyncio.sleep(0.15)
        finally:
            count.leave()

    worker = make(runners, {"q": dual(plain, coroutine)}, concurrency=2, lease=timedelta(milliseconds=600),
                  heartbeat=timedelta(milliseconds=200))  # fmt: skip
    with worker.serving():
        wait_until(
            lambda: all(read(engine, j).state is JobState.SETTLED for j in ["stubborn", *fillers]),
            timeout=30,
            what="every job to settle",
        )
        wait_until(lambda: count.running == 0, timeout=10, what="the overstaying handler to return")
    assert read(engine, "stubborn").recovery_count == 1
    assert count.peak == 2, f"{count.peak} handlers ran at once with concurrency=2"


def test_a_handler_ignoring_its_timeout_loses_its_lease_and_the_job_is_recovered_not_retried(
    engine: Engine, runners: RunnerDriver
) -> None:
    """A timed-out claim is no longer renewed: a handler that keeps running
    (a blocked thread; a coroutine swallowing its cancellation) loses its
    lease, its late settle is refused, and recovery takes the job -- counted
    in recovery_count, never as an attempt."""
    add(engine, Job("a", "q", timeout=timedelta(milliseconds=200), max_recoveries=1, retry=quick_retry(3)))
    seen: list[tuple[int, int]] = []
    reasons: list[StopReason | None] = []

    def lease_passed() -> bool:
        lease_until: int = raw(engine, "a")["lease_until"]
        return db_clock(engine) > lease_until

    def plain(job: RunningJob) -> None:
        seen.append((job.attempt, job.recovery_count))
        if job.recovery_count:
            return
        job.stop_requested.wait(10)
        reasons.append(job.stop_reason)
        wait_until(lease_passed, timeout=10, what="the lease to run out")  # ignores the stop

    async def coroutine(job: RunningJob) -> None:
        seen.append((job.attempt, job.recovery_count))
        if job.recovery_count:
            return
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            reasons.append(job.stop_reason)
        deadline = time.monotonic() + 10
        while not lease_passed() and time.monotonic() < deadline:  # swallows every cancellation
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass

    worker = make(runners, {"q": dual(plain, coroutine)}, lease=timedelta(milliseconds=600),
                  heartbeat=timedelta(milliseconds=200))  # fmt: skip
    first = worker.tick()
    assert reasons == [StopReason.TIMEOUT]
    assert lease_passed()
    assert first.status is TickStatus.REJECTED
    stuck = read(engine, "a")
    assert (stuck.state, stuck.attempt, stuck.recovery_count, stuck.failure_history) == (JobState.RUNNING, 1, 0, ())
    worker.run_until_idle()
    job = read(engine, "a")
    assert (job.outcome, job.attempt, job.recovery_count, job.failure_history) == (Outcome.COMPLETED, 1, 1, ())
    assert seen == [(1, 0), (1, 1)]


# -- delayed jobs under run_forever -------------------------------------------------


def test_run_forever_starts_a_delayed_job_when_it_is_due_not_at_the_next_poll(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The runner learns of the delayed job by its own look at start-up (no
    wake-up) and sleeps until it is due, not for its 30 s poll interval."""
    with engine.begin() as conn:
        enqueue(conn, Job("a", "q"), delay=timedelta(milliseconds=800))
    ready = epoch_ms(read(engine, "a").ready_at)
    starts: list[int] = []
    with make(
        runners, {"q": lambda job: starts.append(db_clock(engine))}, poll_interval=timedelta(seconds=30)
    ).serving():
        job = settled(engine, "a", timeout=10)
    assert job.outcome is Outcome.COMPLETED
    assert ready <= starts[0] < ready + 3000, starts[0] - ready


def test_an_idle_polling_runner_starts_a_delayed_job_enqueued_meanwhile_soon_after_its_time(
    engine: Engine, runners: RunnerDriver
) -> None:
    starts: dict[str, int] = {}

    def record(job: RunningJob) -> None:
        starts[job.job_id] = db_clock(engine)

    with make(runners, {"q": record}, poll_interval=timedelta(milliseconds=200)).serving():
        add(engine, Job("warm-up", "q"))
        settled(engine, "warm-up")
        with engine.begin() as conn:
            enqueue(conn, Job("a", "q"), delay=timedelta(milliseconds=500))
        job = settled(engine, "a", timeout=10)
    ready = epoch_ms(job.ready_at)
    assert job.outcome is Outcome.COMPLETED
    assert ready <= starts["a"] < ready + 3000, starts["a"] - ready


def test_a_serving_runner_runs_its_retry_when_due_not_at_the_next_poll(engine: Engine, runners: RunnerDriver) -> None:
    backoff_ms = 300
    add(engine, Job("a", "q", retry=quick_retry(2, backoff_ms=backoff_ms)))
    starts: list[int] = []

    def flaky(job: RunningJob) -> None:
        starts.append(db_clock(engine))
        if job.attempt == 1:
            raise ConnectionError("try later")

    with make(runners, {"q": flaky}, poll_interval=timedelta(seconds=30)).serving():
        job = settled(engine, "a", timeout=10)  # a third of the poll interval
    assert (job.outcome, job.attempt) == (Outcome.COMPLETED, 2)
    assert len(starts) == 2
    assert backoff_ms <= starts[1] - starts[0] < backoff_ms + 3000, starts[1] - starts[0]


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", ["postgresql"])  # LISTEN/NOTIFY is PostgreSQL's
def test_notify_makes_an_idle_runner_start_a_new_delayed_job_soon_after_its_time(
    engine: Engine, runners: RunnerDriver
) -> None:
    starts: dict[str, int] = {}

    def record(job: RunningJob) -> None:
        starts[job.job_id] = db_clock(engine)

    worker = make(runners, {"q": record}, poll_interval=timedelta(seconds=30))
    with worker.serving():
        wait_until(lambda: _listening(engine), what="the runner to LISTEN")
        add(engine, Job("warm-up", "q"))
        settled(engine, "warm-up", timeout=10)
        time.sleep(0.3)  # let the loop go idle on its 30 s wait
        with engine.begin() as conn:
            enqueue(conn, Job("a", "q"), delay=timedelta(milliseconds=500))
        job = settled(engine, "a", timeout=10)
    ready = epoch_ms(job.ready_at)
    assert job.outcome is Outcome.COMPLETED
    assert ready <= starts["a"] < ready + 3000, starts["a"] - ready


def test_a_plain_handler_ignoring_its_timeout_keeps_its_attempt_until_recovery_takes_the_job(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The same plain function for both kinds (Runner's handler thread,
    AsyncRunner's daemon thread): a thread cannot be cancelled, so while it
    keeps running its attempt is not over -- it is neither settled nor
    retried beside the running thread; it loses its lease and recovery takes
    the job (recovery_count + 1, attempt unchanged)."""
    add(engine, Job("a", "q", timeout=timedelta(milliseconds=200), max_recoveries=1, retry=quick_retry(3)))
    seen: list[tuple[int, int]] = []
    reasons: list[StopReason | None] = []
    first_returned = threading.Event()

    def lease_passed() -> bool:
        lease = raw(engine, "a")["lease_until"]
        return lease is None or db_clock(engine) > lease

    def sleeps_past_the_lease(job: RunningJob) -> None:
        seen.append((job.attempt, job.recovery_count))
        if len(seen) > 1:
            return
        try:
            job.stop_requested.wait(10)
            reasons.append(job.stop_reason)
            wait_until(lease_passed, timeout=10, what="the lease to run out")  # ignores the stop
        finally:
            first_returned.set()

    worker = make(runners, {"q": sleeps_past_the_lease}, lease=timedelta(milliseconds=600),
                  heartbeat=timedelta(milliseconds=200))  # fmt: skip
    first = worker.tick()
    try:
        assert reasons == [StopReason.TIMEOUT]
        assert first.status is TickStatus.REJECTED, first
        assert first_returned.is_set()  # the tick ended with the handler, not before it
        stuck = read(engine, "a")
        assert (stuck.state, stuck.attempt, stuck.recovery_count) == (JobState.RUNNING, 1, 0)
        worker.run_until_idle()
        job = read(engine, "a")
        assert (job.outcome, job.attempt, job.recovery_count, job.failure_history) == (Outcome.COMPLETED, 1, 1, ())
        assert seen == [(1, 0), (1, 1)]
    finally:
        first_returned.wait(15)


def test_a_serving_runner_stops_a_handler_at_its_timeout_and_retries_the_job(
    engine: Engine, runners: RunnerDriver
) -> None:
    add(engine, Job("a", "q", timeout=timedelta(milliseconds=200), retry=quick_retry(2, backoff_ms=300)))
    slow = UntilStopped("returns")
    with make(runners, {"q": slow.handler}, poll_interval=timedelta(seconds=30)).serving():
        job = settled(engine, "a", timeout=15)
    assert slow.reasons == [StopReason.TIMEOUT]
    assert slow.cancelled == ([True] if runners.is_async else [])
    assert 0.15 <= slow.ran_for[0] < 2.5, slow.ran_for
    assert (job.outcome, job.attempt) == (Outcome.COMPLETED, 2)
    assert [(e.attempt, e.reason) for e in job.failure_history] == [(1, TIMED_OUT)]


class HoldTheRow:
    """Holds job ``job_id``'s row for ``seconds`` from another connection
    (PostgreSQL: a row lock; SQLite: the write lock), as a busy database
    would: a settle of that job waits meanwhile; reads do not."""

    def __init__(self, engine: Engine, job_id: str, seconds: float) -> None:
        self.engine = engine
        self.job_id = job_id
        self.seconds = seconds
        self.held = threading.Event()
        self.released = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._hold, name="test-hold-row", daemon=True).start()
        assert self.held.wait(10)

    def _hold(self) -> None:
        try:
            with self.engine.connect() as conn:
                if self.engine.dialect.name == "sqlite":
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    conn.execute(text("SELECT 1 FROM watchdog_jobs WHERE job_id = :j FOR UPDATE"), {"j": self.job_id})
                self.held.set()
                time.sleep(self.seconds)
                conn.rollback()
        finally:
            self.held.set()
            self.released.set()


def test_a_serving_runner_runs_a_retry_soon_even_when_its_requeue_commits_late(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The requeue of a failed attempt waits a second for a row another
    connection holds; meanwhile the runner's loop looks for due delayed jobs
    (the retry's 1 ms backoff made it due) and finds none yet. Once the
    requeue commits, the retry must still run long before the 30 s poll.
    (SQLite in WAL mode: the loop's look reads beside the held write lock.)"""
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode=WAL").scalar() == "wal"
    add(engine, Job("a", "q", retry=quick_retry(2, backoff_ms=1)))
    hold = HoldTheRow(engine, "a", seconds=1.0)
    starts: list[int] = []

    def flaky(job: RunningJob) -> None:
        starts.append(db_clock(engine))
        if job.attempt == 1:
            hold.start()
            raise ConnectionError("try later")

    with make(runners, {"q": flaky}, poll_interval=timedelta(seconds=30)).serving():
        assert hold.released.wait(15)
        job = settled(engine, "a", timeout=10)  # a third of the poll interval
    assert (job.outcome, job.attempt, len(starts)) == (Outcome.COMPLETED, 2, 2)


# -- structured logging ------------------------------------------------------------------


def test_log_records_about_a_job_carry_its_fields(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler's ``job.log`` / ``job.logger(name)`` records, and the
    runner's own records about the job, carry job_id, queue, lane, attempt
    and recovery_count as attributes (a JSON formatter writes them out)."""

    def handler(job: RunningJob) -> None:
        job.log.info("working", extra={"step": 1})
        job.logger("myapp.emails").warning("careful", extra={"attempt": "mine"})

    add(engine, Job("logged", "q", lane="team:1", retry=RetryPolicy(max_attempts=2)))
    with caplog.at_level(logging.DEBUG):  # a job's claim and settle lines are DEBUG
        runners.runner({"q": handler}).run_until_idle()
    fields = {"job_id": "logged", "queue": "q", "lane": "team:1", "attempt": 1, "recovery_count": 0}

    def of(record: logging.LogRecord) -> dict[str, object]:
        return {name: getattr(record, name, None) for name in fields}

    working = next(r for r in caplog.records if r.getMessage() == "working")
    assert working.name == "sqlalchemy_watchdog.job" and of(working) == fields and working.step == 1  # type: ignore[attr-defined]
    careful = next(r for r in caplog.records if r.getMessage() == "careful")
    assert careful.name == "myapp.emails" and of(careful) == {**fields, "attempt": "mine"}  # the call's extra wins
    runner_records = [
        r for r in caplog.records if r.name == "sqlalchemy_watchdog.runner" and "logged" in r.getMessage()
    ]
    assert {r.getMessage().split(" ")[0] for r in runner_records} >= {"claimed", "settled"}
    assert all(of(r) == fields for r in runner_records), [(r.getMessage(), of(r)) for r in runner_records]
