"""The sync Runner, in this process, on SQLite and on PostgreSQL.

Handlers run in real threads against a real database; a runner serving in
the background (``run_forever`` in a thread) is always stopped in a
``finally``. Nothing is mocked: leases run out by the database clock, or by
the runner's own ``clock=`` moved forward.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, select, text

import sqlalchemy_watchdog
from sqlalchemy_watchdog.execution import claim_steps, drive
from sqlalchemy_watchdog import (
    Decision,
    InvalidJob,
    Job,
    JobState,
    JobView,
    Outcome,
    Runner,
    RunningJob,
    StopReason,
    TickStatus,
    Watchdog,
    enqueue,
    execution,
    handler,
    store,
)
from sqlalchemy_watchdog.jobs import FAILURE_REASON_MAX_LENGTH
from sqlalchemy_watchdog.model import jobs_table

LEASE = timedelta(seconds=3)
HEARTBEAT = timedelta(seconds=1)
POLL = timedelta(milliseconds=100)
NO_POLICY = "Execution disappeared without a recovery policy"
SHUTDOWN_REASON = "Runner shut down while the job was running (its handler outlived the grace period)"


# -- helpers -------------------------------------------------------------------


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def add(engine: Engine, *jobs: Job) -> None:
    with engine.begin() as conn:
        enqueue(conn, list(jobs))


def read(engine: Engine, job_id: str) -> JobView:
    job = Watchdog(engine).read(job_id)
    assert job is not None, job_id
    return job


def raw(engine: Engine, job_id: str) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(select(jobs_table).where(jobs_table.c.job_id == job_id)).one()._mapping)


def settled(engine: Engine, job_id: str, timeout: float = 15.0) -> JobView:
    return wait_until(
        lambda: (job := read(engine, job_id)).state is JobState.SETTLED and job,
        timeout,
        f"{job_id} to settle",
    )


def runner(engine: Engine, handlers: dict[str, Callable[[RunningJob], Any]], **kwargs: Any) -> Runner:
    kwargs.setdefault("lease", LEASE)
    kwargs.setdefault("heartbeat", HEARTBEAT)
    kwargs.setdefault("poll_interval", POLL)
    return Runner(engine, handlers, **kwargs)


@contextlib.contextmanager
def serving(worker: Runner) -> Iterator[threading.Thread]:
    """``worker.run_forever()`` in a thread, stopped (and joined) on exit."""
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            worker.run_forever(install_signal_handlers=False)
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            failure.append(error)

    thread = threading.Thread(target=serve, name="test-runner", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive(), "run_forever did not return after stop()"
        assert failure == []


def done(job: RunningJob) -> None:
    return None


# -- decisions -----------------------------------------------------------------


def test_handler_returning_none_settles_completed(engine: Engine) -> None:
    add(engine, Job("a", "q", payload={"to": "x@example.com"}))
    result = runner(engine, {"q": done}).tick()
    assert result.status is TickStatus.SETTLED
    assert result.job is not None
    assert (result.job.job_id, result.job.outcome, result.job.failure_reason) == ("a", Outcome.COMPLETED, None)
    assert read(engine, "a").outcome is Outcome.COMPLETED


def test_handler_receives_the_running_job(engine: Engine) -> None:
    add(engine, Job("a", "q", lane="team-key:7", priority=3, payload={"n": [1, 2]}, max_recoveries=4))
    seen: list[tuple[Any, ...]] = []

    def record(job: RunningJob) -> None:
        seen.append(
            (job.job_id, job.queue, job.lane, job.priority, job.payload, job.recovery_count,
             job.max_recoveries, job.stop_requested.is_set(), job.stop_reason)
        )
        assert read(engine, "a").state is JobState.RUNNING

    runner(engine, {"q": record}).run_until_idle()
    assert seen == [("a", "q", "team-key:7", 3, {"n": [1, 2]}, 0, 4, False, None)]


def test_handler_decisions_settle_failed_and_outcome_unknown(engine: Engine) -> None:
    add(engine, Job("fail", "fail"), Job("unknown", "unknown"), Job("explicit", "explicit"))
    worker = runner(
        engine,
        {
            "fail": lambda job: Decision.failed("card declined"),
            "unknown": lambda job: Decision.outcome_unknown(),
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


def test_handler_exception_settles_failed_with_its_type_and_message(engine: Engine) -> None:
    add(engine, Job("a", "q"))

    def boom(job: RunningJob) -> None:
        raise ValueError("card declined for order 42")

    (job,) = runner(engine, {"q": boom}).run_until_idle()
    assert job.outcome is Outcome.FAILED
    assert job.failure_reason is not None
    assert "ValueError" in job.failure_reason and "card declined for order 42" in job.failure_reason
    assert read(engine, "a").failure_reason == job.failure_reason


def test_handler_exception_reason_is_bounded(engine: Engine) -> None:
    add(engine, Job("a", "q"))

    def boom(job: RunningJob) -> None:
        raise RuntimeError("x" * 100_000)

    (job,) = runner(engine, {"q": boom}).run_until_idle()
    assert job.outcome is Outcome.FAILED
    stored = read(engine, "a").failure_reason
    assert stored is not None and stored.startswith("RuntimeError")
    assert len(stored) <= FAILURE_REASON_MAX_LENGTH


@pytest.mark.parametrize("value", [42, "ok", {"status": "done"}], ids=["int", "str", "dict"])
def test_handler_returning_something_else_settles_failed(engine: Engine, value: Any) -> None:
    add(engine, Job("a", "q"))
    (job,) = runner(engine, {"q": lambda job: value}).run_until_idle()
    assert job.outcome is Outcome.FAILED
    assert job.failure_reason is not None and type(value).__name__ in job.failure_reason


# -- order and queues ----------------------------------------------------------


def test_run_until_idle_returns_the_settled_jobs_in_priority_then_admission_order(engine: Engine) -> None:
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
    settled_jobs = runner(engine, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()
    assert [j.job_id for j in settled_jobs] == ["e", "b", "d", "a", "c"]
    assert ran == ["b", "d", "a", "c"]
    assert [j.outcome for j in settled_jobs] == [Outcome.CANCELLED] + [Outcome.COMPLETED] * 4
    assert not Watchdog(engine).has_pending_work()


def test_run_until_idle_with_no_work_returns_nothing(engine: Engine) -> None:
    worker = runner(engine, {"q": done})
    assert worker.run_until_idle() == []
    assert worker.tick().status is TickStatus.IDLE


def test_run_until_idle_respects_max_ticks(engine: Engine) -> None:
    add(engine, *(Job(f"j{i}", "q") for i in range(3)))
    assert [j.job_id for j in runner(engine, {"q": done}).run_until_idle(max_ticks=2)] == ["j0", "j1"]
    assert read(engine, "j2").state is JobState.QUEUED


def test_runner_ignores_queues_it_does_not_serve(engine: Engine) -> None:
    add(engine, Job("mine", "emails"), Job("theirs", "sms", priority=10), Job("skipped", "reports"))
    ran: list[str] = []
    worker = runner(
        engine,
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
    saved = dict(execution._registry)
    execution._registry.clear()
    try:
        yield execution._registry
    finally:
        execution._registry.clear()
        execution._registry.update(saved)


def test_handlers_registered_with_the_decorator_are_used_when_handlers_is_none(
    engine: Engine, empty_registry: dict[str, Any]
) -> None:
    ran: list[str] = []

    @handler("emails")
    def send(job: RunningJob) -> None:
        ran.append(job.job_id)

    @sqlalchemy_watchdog.handler("sms")
    def text_message(job: RunningJob) -> Decision:
        return Decision.failed("no signal")

    add(engine, Job("e", "emails"), Job("s", "sms"), Job("x", "unregistered"))
    worker = Runner(engine, lease=LEASE, heartbeat=HEARTBEAT)
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


def test_no_handlers_at_all_is_refused(empty_registry: dict[str, Any]) -> None:
    with pytest.raises(InvalidJob) as caught:
        Runner(create_engine("sqlite://"))
    assert caught.value.field == "handlers"


# -- settings ------------------------------------------------------------------


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
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_settings_are_refused_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJob) as caught:
        Runner(create_engine("sqlite://"), {"q": done}, **kwargs)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}:")


def test_handlers_that_are_not_callable_are_refused() -> None:
    with pytest.raises(InvalidJob) as caught:
        Runner(create_engine("sqlite://"), {"q": "not a function"})  # type: ignore[dict-item]
    assert caught.value.field == "handlers"


def test_a_heartbeat_a_third_of_the_lease_is_accepted() -> None:
    Runner(create_engine("sqlite://"), {"q": done}, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=10))


# -- cancellation and lane failure ---------------------------------------------


def test_cancelling_a_queued_job_settles_it_cancelled_without_running_the_handler(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q"))
    assert Watchdog(engine).cancel("a", "stop-a").status.value == "recorded"
    ran: list[str] = []
    result = runner(engine, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()
    assert [(j.job_id, j.outcome) for j in result] == [("a", Outcome.CANCELLED), ("b", Outcome.COMPLETED)]
    assert ran == ["b"]
    assert read(engine, "a").outcome is Outcome.CANCELLED


class Blocking:
    """A handler that signals it started, then waits for ``stop_requested``."""

    def __init__(self, decision: Decision | None = None) -> None:
        self.started = threading.Event()
        self.reasons: list[StopReason | None] = []
        self.decision = decision

    def __call__(self, job: RunningJob) -> Decision | None:
        self.started.set()
        stopped = job.stop_requested.wait(30)
        self.reasons.append(job.stop_reason if stopped else None)
        return self.decision


def test_cancelling_a_running_job_stops_its_handler_and_settles_it_cancelled(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    blocking = Blocking()
    with serving(runner(engine, {"q": blocking})):
        assert blocking.started.wait(15)
        assert Watchdog(engine).cancel("a", "stop-a").status.value == "recorded"
        job = settled(engine, "a")
    assert blocking.reasons == [StopReason.CANCELLED]
    assert (job.outcome, job.failure_reason) == (Outcome.CANCELLED, None)


def test_fail_lane_stops_a_running_handler_and_the_job_keeps_the_lane_failure(engine: Engine) -> None:
    add(engine, Job("a", "q", lane="provider-x"), Job("b", "q", lane="provider-x"))
    blocking = Blocking()
    with serving(runner(engine, {"q": blocking})):
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


def test_settle_after_the_lease_ran_out_is_rejected_and_the_row_unchanged(engine: Engine) -> None:
    """The runner's clock jumps past the lease while the handler works."""
    add(engine, Job("a", "q"))
    offset = [0]
    snapshot: list[dict[str, Any]] = []

    def outlive_the_lease(job: RunningJob) -> None:
        offset[0] = 10 * 60 * 1000
        snapshot.append(raw(engine, "a"))

    worker = runner(engine, {"q": outlive_the_lease}, clock=lambda: store.now_ms() + offset[0])
    result = worker.tick()
    assert result.status is TickStatus.REJECTED
    after = raw(engine, "a")
    assert after == snapshot[0]
    assert after["state"] == "running" and after["outcome"] is None


def test_lost_lease_stops_the_handler_and_its_settle_is_rejected(engine: Engine) -> None:
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

    worker = runner(engine, {"q": lose_the_lease})
    result = worker.tick()
    assert reasons == [StopReason.LEASE_LOST]
    assert result.status is TickStatus.REJECTED
    assert raw(engine, "a") == snapshot[0]
    # the next tick recovers the disappeared claim
    recovered = worker.tick()
    assert recovered.status is TickStatus.RECOVERED
    assert recovered.job is not None
    assert (recovered.job.outcome, recovered.job.failure_reason) == (Outcome.INTERRUPTED, NO_POLICY)


def test_heartbeat_keeps_a_handler_running_longer_than_the_lease_alive(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    leases: list[int] = []

    def outlast(job: RunningJob) -> None:
        first = raw(engine, "a")["lease_until"]
        leases.append(first)
        with engine.connect() as conn:
            wait_until(
                lambda: conn.execute(select(store.sql.db_clock_ms())).scalar_one() > first + 500,
                what="the first lease to pass",
            )
        leases.append(raw(engine, "a")["lease_until"])

    worker = runner(engine, {"q": outlast}, lease=timedelta(milliseconds=1500), heartbeat=timedelta(milliseconds=500))
    (job,) = worker.run_until_idle()
    assert job.outcome is Outcome.COMPLETED
    assert leases[1] > leases[0]


# -- recovery and liveness probes ----------------------------------------------


def _expired_claim_of_another_process(engine: Engine, job: Job) -> dict[str, Any]:
    add(engine, job)
    with store.write_transaction(engine) as conn:
        store.claim(conn, queues=[job.queue], limit=1, lease_ms=1)
    row = raw(engine, job.job_id)
    with engine.connect() as conn:
        wait_until(
            lambda: conn.execute(select(store.sql.db_clock_ms())).scalar_one() > row["lease_until"],
            what="the lease to end",
        )
    return row


def test_runner_recovers_an_expired_claim_within_its_budget(engine: Engine) -> None:
    _expired_claim_of_another_process(engine, Job("a", "q", max_recoveries=1))
    counts: list[int] = []
    result = runner(engine, {"q": lambda job: counts.append(job.recovery_count)}).run_until_idle()
    assert [(j.job_id, j.outcome, j.recovery_count) for j in result] == [("a", Outcome.COMPLETED, 1)]
    assert counts == [1]


def test_runner_interrupts_an_expired_claim_without_a_policy(engine: Engine) -> None:
    _expired_claim_of_another_process(engine, Job("a", "q"))
    ran: list[str] = []
    result = runner(engine, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()
    assert [(j.job_id, j.outcome, j.failure_reason) for j in result] == [("a", Outcome.INTERRUPTED, NO_POLICY)]
    assert ran == []


def test_a_probe_that_raises_leaves_the_expired_job_running_and_the_runner_goes_on(engine: Engine) -> None:
    before = _expired_claim_of_another_process(engine, Job("external", "ext", max_recoveries=3))
    add(engine, Job("a", "q"), Job("b", "q"))
    probed: list[str] = []

    def probe(job: JobView) -> bool:
        probed.append(job.job_id)
        raise ConnectionError("orchestrator unreachable")

    worker = runner(engine, {"q": done}, is_alive=probe)
    assert [(j.job_id, j.outcome) for j in worker.run_until_idle()] == [
        ("a", Outcome.COMPLETED),
        ("b", Outcome.COMPLETED),
    ]
    assert "external" in probed
    assert raw(engine, "external") == before
    unknown = worker.tick()
    assert (unknown.status, unknown.job_id) == (TickStatus.LIVENESS_UNKNOWN, "external")
    assert raw(engine, "external") == before


def test_a_probe_saying_alive_keeps_the_expired_job_running(engine: Engine) -> None:
    before = _expired_claim_of_another_process(engine, Job("external", "ext"))
    probed: list[str] = []
    worker = runner(engine, {"q": done}, is_alive=lambda job: probed.append(job.job_id) or True)
    assert worker.run_until_idle() == []
    assert probed == ["external"]
    assert raw(engine, "external") == before


def test_a_probe_saying_dead_lets_the_expired_job_be_recovered(engine: Engine) -> None:
    _expired_claim_of_another_process(engine, Job("external", "ext"))
    worker = runner(engine, {"q": done}, is_alive=lambda job: False)
    assert [(j.job_id, j.outcome) for j in worker.run_until_idle()] == [("external", Outcome.INTERRUPTED)]


def test_an_idle_runner_recovers_a_claim_when_its_lease_ends_not_at_the_next_poll(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    with store.write_transaction(engine) as conn:
        store.claim(conn, queues=None, limit=1, lease_ms=1500)
    with serving(runner(engine, {"q": done}, poll_interval=timedelta(seconds=30))):
        job = settled(engine, "a", timeout=10)
    assert (job.outcome, job.failure_reason) == (Outcome.INTERRUPTED, NO_POLICY)


# -- concurrency and wake-ups --------------------------------------------------


def test_concurrency_runs_that_many_handlers_at_once_and_no_more(engine: Engine) -> None:
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

    with serving(runner(engine, {"q": meet}, concurrency=3)):
        jobs = [settled(engine, f"j{i}", timeout=30) for i in range(6)]
    assert [j.outcome for j in jobs] == [Outcome.COMPLETED] * 6, [j.failure_reason for j in jobs]
    assert most[0] == 3


def test_handlers_finishing_together_share_settle_statements_and_each_settles_once(engine: Engine) -> None:
    """Settles waiting at the same moment go out as one statement and one
    commit (each row still guarded by its own claim): a busy runner does not
    pay a durable commit per job."""
    jobs = 8
    add(engine, *(Job(f"j{i}", "q") for i in range(jobs)))
    barrier = threading.Barrier(jobs, timeout=15)
    settles: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "settles" in statement:
            settles.append(statement)

    def together(job: RunningJob) -> None:
        barrier.wait()

    event.listen(engine, "before_cursor_execute", count)
    try:
        with serving(runner(engine, {"q": together}, concurrency=jobs)):
            finished = [settled(engine, f"j{i}", timeout=30) for i in range(jobs)]
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert [j.outcome for j in finished] == [Outcome.COMPLETED] * jobs, [j.failure_reason for j in finished]
    assert 1 <= len(settles) < jobs


def _listening(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query ILIKE 'LISTEN %'"
                )
            ).scalar()
        )


@pytest.mark.parametrize("dialect", ["postgresql"])  # LISTEN/NOTIFY is PostgreSQL's
def test_notify_wakes_an_idle_runner_long_before_the_poll_interval(engine: Engine) -> None:
    worker = runner(engine, {"q": done}, poll_interval=timedelta(seconds=30))
    with serving(worker):
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


@pytest.mark.parametrize("dialect", ["postgresql"])  # LISTEN/NOTIFY is PostgreSQL's
def test_notify_stops_a_cancelled_handler_long_before_the_next_heartbeat(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    blocking = Blocking()
    worker = runner(
        engine, {"q": blocking}, lease=timedelta(seconds=90), heartbeat=timedelta(seconds=30),
        poll_interval=timedelta(seconds=30),
    )
    with serving(worker):
        assert blocking.started.wait(15)
        wait_until(lambda: _listening(engine), what="the runner to LISTEN")
        started = time.monotonic()
        Watchdog(engine).cancel("a", "stop-a")
        wait_until(lambda: blocking.reasons, timeout=10, what="the handler to stop")
        elapsed = time.monotonic() - started
        job = settled(engine, "a")
    assert blocking.reasons == [StopReason.CANCELLED]
    assert job.outcome is Outcome.CANCELLED
    assert elapsed < 5, f"took {elapsed:.1f}s with a 30 s heartbeat"


def test_an_idle_runner_picks_up_new_work_by_polling(engine: Engine) -> None:
    with serving(runner(engine, {"q": done}, poll_interval=timedelta(milliseconds=200))):
        add(engine, Job("warm-up", "q"))
        settled(engine, "warm-up")
        add(engine, Job("a", "q"))
        assert settled(engine, "a", timeout=10).outcome is Outcome.COMPLETED


# -- shutdown ------------------------------------------------------------------


def test_stop_lets_a_handler_finish_within_grace(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    started = threading.Event()

    def slow(job: RunningJob) -> None:
        started.set()
        time.sleep(0.5)

    worker = runner(engine, {"q": slow}, grace=timedelta(seconds=10))
    with serving(worker):
        assert started.wait(15)
    # run_forever returned: the job settled with the handler's own decision
    job = read(engine, "a")
    assert job.outcome is Outcome.COMPLETED


@pytest.mark.parametrize(
    ("max_recoveries", "state", "outcome"),
    [(1, JobState.QUEUED, None), (None, JobState.SETTLED, Outcome.INTERRUPTED)],
    ids=["requeued", "interrupted"],
)
def test_a_job_outliving_grace_is_handed_to_recovery_at_once(
    engine: Engine, max_recoveries: int | None, state: JobState, outcome: Outcome | None
) -> None:
    add(engine, Job("a", "q", max_recoveries=max_recoveries))
    started, release = threading.Event(), threading.Event()

    def stubborn(job: RunningJob) -> None:  # ignores stop_requested
        started.set()
        release.wait(60)

    worker = runner(engine, {"q": stubborn}, lease=timedelta(seconds=60), heartbeat=timedelta(seconds=5),
                    grace=timedelta(milliseconds=200))
    try:
        with serving(worker):
            assert started.wait(15)
        job = read(engine, "a")  # right after run_forever returned, long before the 60 s lease
        assert (job.state, job.outcome) == (state, outcome)
        assert job.recovery_count == (1 if max_recoveries else 0)
        if outcome is not None:
            # The reason says the shutdown outlived its grace, not that the worker vanished.
            assert job.failure_reason == f"{SHUTDOWN_REASON}; no recovery policy"
    finally:
        release.set()


def test_a_handler_stopped_by_shutdown_is_handed_to_recovery_not_settled_completed(engine: Engine) -> None:
    """A handler that honours ``stop_requested`` at shutdown and returns did
    not finish its work: the job is requeued (as the AsyncRunner does when it
    cancels a handler at shutdown), never reported ``completed``."""
    add(engine, Job("a", "q", max_recoveries=1))
    blocking = Blocking()
    worker = runner(engine, {"q": blocking}, lease=timedelta(seconds=60), heartbeat=timedelta(seconds=5),
                    grace=timedelta(milliseconds=200))
    with serving(worker):
        assert blocking.started.wait(15)
    assert blocking.reasons == [StopReason.SHUTDOWN]
    job = read(engine, "a")
    assert (job.state, job.outcome, job.recovery_count) == (JobState.QUEUED, None, 1)


# -- a pause between claim and start -----------------------------------------


def test_a_handler_starting_long_after_its_claim_does_not_run_if_the_claim_was_lost(engine: Engine) -> None:
    """The process paused (stopped, starved) between claim and start, long
    enough for the lease to end: the runner re-checks the claim before the
    handler starts and leaves the job to recovery instead of running it."""
    ran: list[str] = []
    worker = Runner(
        engine,
        {"q": lambda job: ran.append(job.job_id)},
        lease=timedelta(seconds=3),
        heartbeat=timedelta(seconds=1),
    )
    add(engine, Job("paused", "q", max_recoveries=1))
    executions, _ = drive(claim_steps(worker.core, 1), worker._perform)
    (execution,) = executions
    token = raw(engine, "paused")["claim_token"]
    with engine.begin() as conn:  # the lease ends while the process is paused
        assert store.release(conn, [("paused", token)]) == {"paused"}
    execution.claimed_at -= 2.0  # ... and the pause outlasted a heartbeat
    before = raw(engine, "paused")
    result = worker._execute(execution)
    assert ran == []
    assert result.status is TickStatus.REJECTED
    assert execution.job.stop_reason is StopReason.LEASE_LOST
    assert raw(engine, "paused") == before  # left to recovery, untouched
    [recovered] = worker.run_until_idle()
    assert (recovered.outcome, ran) == (Outcome.COMPLETED, ["paused"])


def test_a_handler_starting_late_runs_when_its_claim_still_holds(engine: Engine) -> None:
    ran: list[str] = []
    worker = Runner(
        engine,
        {"q": lambda job: ran.append(job.job_id)},
        lease=timedelta(seconds=30),
        heartbeat=timedelta(seconds=1),
    )
    add(engine, Job("late", "q"))
    (execution,), _ = drive(claim_steps(worker.core, 1), worker._perform)
    execution.claimed_at -= 2.0
    result = worker._execute(execution)
    assert ran == ["late"]
    assert result.job is not None and result.job.outcome is Outcome.COMPLETED
