"""The runner's rules, driven step by step with no database.

Each test drives the real core (``sqlalchemy_watchdog.core``) with a
scripted performer (:mod:`tests.unit.scripted`): the steps a rule must ask
for, in order, and the answers a database and a handler would give. The
tests are named by the guarantee they check.
"""

from __future__ import annotations

import functools
import inspect
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sqlalchemy_watchdog import Decision, RetryPolicy, Schedule, handler, store
from sqlalchemy_watchdog.core import handlers as handlers_module
from sqlalchemy_watchdog.core.handlers import StopReason
from sqlalchemy_watchdog.core.loop import claim_steps, execute, loop_pass, renew, shutdown, time_out
from sqlalchemy_watchdog.core.maintenance import enqueue_schedules, recover
from sqlalchemy_watchdog.core.rules.settle import Fate, decision_of_result, settle_batch, settle_request, verdict
from sqlalchemy_watchdog.core.settings import LAST_STATEMENTS_S, RunnerSettings
from sqlalchemy_watchdog.core.state import Execution, RunnerCore, TickStatus
from sqlalchemy_watchdog.core.steps import Pause, RunHandler, Spawn, Stop, WaitDone, drive
from sqlalchemy_watchdog.errors import ErrorCode, WatchdogError
from sqlalchemy_watchdog.jobs import JobState, Outcome
from sqlalchemy_watchdog.store import ClaimBatch, Promotion, Recovery, RecoveryStatus, SettleRequest

from .scripted import Expect, FakeTime, admitted, claim, core, job, run, settings

NO_JITTER = RetryPolicy(max_attempts=3, backoff=timedelta(seconds=4), jitter=0.0)


@pytest.fixture
def time() -> FakeTime:
    return FakeTime()


# -- claim -> run -> settle -----------------------------------------------------------


def test_a_claimed_job_runs_once_and_settles_with_its_exact_claim(time: FakeTime) -> None:
    runner = core(time)
    taken = claim()

    def claimed(step: Any) -> None:
        assert dict(step.kwargs) == {"queues": ("q",), "limit": 3, "lease_ms": 120_000}

    executions, cancelled = run(claim_steps(runner, 3), Expect(store.claim, ClaimBatch((taken,), ()), check=claimed))
    assert cancelled == () and [e.claim for e in executions] == [taken]
    assert runner.free_slots() == runner.settings.concurrency - 1, "a claimed job holds a slot until it returns"

    request = run(execute(runner, executions[0]), Expect(RunHandler, Decision.completed()))
    assert isinstance(request, SettleRequest)
    assert (request.job_id, request.claim_token) == (taken.job.job_id, taken.token)
    assert request.decision.outcome is Outcome.COMPLETED
    assert request.now == time.now_ms(), "the settle carries the runner's clock"
    assert request.requeue_after_ms is None and request.history is None


def child_handler(job: Any) -> None:
    """A handler the process executor can locate (module level)."""


async def local_handler(job: Any) -> None:
    """A coroutine handler: an async runner runs it in its own process."""


def test_jobs_claimed_ahead_of_busy_children_are_claimed_again_in_batches(time: FakeTime) -> None:
    """Two children, two jobs claimed ahead: while a job claimed ahead still
    waits for a child, a freed slot is not claimed for at once -- every child
    has its next job -- so the claims come one statement for two jobs, not one
    for each child that frees; once no job waits (or ``prefetch`` slots are
    free) the runner claims for every free slot."""
    from sqlalchemy_watchdog import ProcessExecutor

    runner = core(time, {"q": child_handler}, executor=ProcessExecutor(processes=2, prefetch=2))
    assert runner.free_slots() == 4
    executions = [admitted(runner) for _ in range(4)]
    assert all(e.killable for e in executions) and runner.free_slots() == 0
    runner.release_slot(executions[0])  # a child answered; it takes the first job waiting
    assert runner.free_slots() == 0, "a job claimed ahead still waits for a child: no claim yet"
    runner.release_slot(executions[1])  # the other child answered and took the last one waiting
    assert runner.free_slots() == 2, "nothing waits for a child now: one claim for both slots"


def test_slots_of_coroutine_or_thread_handlers_are_claimed_for_at_once_beside_children(time: FakeTime) -> None:
    """The batching counts only jobs for children: a runner whose other
    queue's handlers run in its own process claims for their freed slots at
    once, as without the process executor."""
    from sqlalchemy_watchdog import ProcessExecutor
    from sqlalchemy_watchdog.core.state import RunnerCore

    options: Any = {"summary_every": None, "executor": ProcessExecutor(processes=2, prefetch=2)}
    # What AsyncRunner builds: its coroutine handlers stay in its process.
    handlers = {"q": child_handler, "local": local_handler}
    stays = inspect.iscoroutinefunction
    built = RunnerSettings.build(handlers, options, default_poll_interval=timedelta(seconds=2), stays=stays)
    runner = RunnerCore(built, time.clock, store)
    local = [admitted(runner, "local") for _ in range(4)]
    assert not any(e.killable for e in local) and runner.free_slots() == 0
    runner.release_slot(local[0])
    assert runner.free_slots() == 1, "no job waits for a child: the freed slot is claimed for at once"


def test_each_executor_is_claimed_for_apart_up_to_its_own_slots(time: FakeTime) -> None:
    """A runner with a thread queue and a queue whose handler names a process
    executor (2 children, 1 claimed ahead): each group's free slots are its
    own, and a pass claims each group's queues with its own limit -- busy
    threads never stop the children's claim, nor busy children the threads'."""
    from sqlalchemy_watchdog import ProcessExecutor
    from sqlalchemy_watchdog.core.handlers import HandlerRegistry

    registry = HandlerRegistry()
    registry.register("cpu", executor=ProcessExecutor(processes=2, prefetch=1))(child_handler)
    runner = core(time, {"io": lambda job: None, "cpu": child_handler}, concurrency=3, claim_ahead=0)
    assert runner.free_by_group() == [(0, 3), (1, 3)] and runner.free_slots() == 6
    io = [admitted(runner, "io") for _ in range(3)]
    assert not any(e.killable for e in io)
    assert runner.free_by_group() == [(0, 0), (1, 3)], "busy threads leave the children's slots free"
    cpu = [admitted(runner, "cpu") for _ in range(3)]
    assert all(e.killable for e in cpu) and runner.free_by_group() == [(0, 0), (1, 0)]
    runner.release_slot(io[0])
    assert runner.free_by_group() == [(0, 1), (1, 0)], "a thread's freed slot is the threads' alone"

    claimed: list[tuple[tuple[str, ...], int]] = []

    def claims(step: Any) -> None:
        claimed.append((step.kwargs["queues"], step.kwargs["limit"]))

    runner.retire(io[0])
    for execution in cpu[:2]:
        runner.release_slot(execution)  # two children answered; one took the job claimed ahead
    assert runner.free_by_group() == [(0, 1), (1, 2)]
    run(
        loop_pass(runner),
        Expect(store.expired_claims, []),
        Expect(store.seconds_until_next_expiry, None),
        Expect(store.promote, Promotion(0, None)),
        Expect(store.propagate, 0),
        Expect(store.claim, ClaimBatch((), ()), check=claims),
        Expect(store.claim, ClaimBatch((), ()), check=claims),
    )
    assert claimed == [(("io",), 1), (("cpu",), 2)]


def test_a_slot_held_back_by_a_limit_is_free_again_only_when_its_settle_is_in(time: FakeTime) -> None:
    """A limit holds the runner back (its claim used up a limited queue's room):
    a slot whose handler returned is claimed for only once its settle commits --
    until then the job still counts as running in the database, and a claim
    could only come back empty (a wasted round trip per job). Without a limit
    the slot is claimed for at once, beside the settle (claiming ahead off: see
    the claim-ahead tests for what it adds)."""
    for held in (True, False):
        runner = core(time, concurrency=2, claim_ahead=0)
        taken = (claim(), claim())
        executions, _ = run(claim_steps(runner, 2), Expect(store.claim, ClaimBatch(taken, (), held_back=held)))
        assert runner.held_back is held and runner.free_slots() == 0
        run(execute(runner, executions[0]), Expect(RunHandler, Decision.completed()))
        assert runner.release_slot(executions[0])  # what the driver does as the handler returns
        assert runner.free_slots() == (0 if held else 1), "the handler returned; its settle is not in yet"
        runner.retire(executions[0])
        assert runner.free_slots() == 1, "the settle is in: the slot is free"


def test_a_job_cancelled_while_queued_is_never_run(time: FakeTime) -> None:
    runner = core(time)
    gone = job(state=JobState.SETTLED, outcome=Outcome.CANCELLED)
    executions, cancelled = run(claim_steps(runner, 1), Expect(store.claim, ClaimBatch((), (gone,))))
    assert executions == [] and cancelled == (gone,)
    assert runner.active() == []


def test_a_handler_that_starts_over_a_heartbeat_late_renews_its_claim_first(time: FakeTime) -> None:
    runner = core(time)
    execution = admitted(runner)
    time.advance(runner.settings.heartbeat_s + 0.5)  # the process was paused between claim and start
    request = run(
        execute(runner, execution),
        Expect(store.renew, {execution.job_id}),
        Expect(RunHandler, Decision.completed()),
    )
    assert isinstance(request, SettleRequest) and request.decision.outcome is Outcome.COMPLETED


def test_a_late_start_whose_claim_was_lost_never_runs_the_handler(time: FakeTime) -> None:
    runner = core(time)
    execution = admitted(runner)
    time.advance(runner.settings.heartbeat_s + 0.5)
    request = run(
        execute(runner, execution),
        Expect(store.renew, set()),
        Expect(store.read, None),
        Expect(Stop, check=lambda step: assert_reason(step, StopReason.LEASE_LOST)),
    )  # no RunHandler in the script: running it would fail the test
    assert isinstance(request, SettleRequest)
    assert request.decision.outcome is Outcome.FAILED
    assert request.decision.reason == "execution stopped before it started (lease_lost)"


def assert_reason(step: Stop, reason: StopReason) -> None:
    assert step.reason is reason


# -- the settle verdict ----------------------------------------------------------------


def test_a_failed_attempt_with_attempts_left_is_retried_after_the_backoff(time: FakeTime) -> None:
    runner = core(time, retry=NO_JITTER)
    execution = admitted(runner)
    request = settle_request(runner, execution, Decision.failed("boom"))
    assert request.requeue_after_ms == 4000, "the policy's first backoff"
    assert request.history is not None and "boom" in request.history
    assert execution.requeue_in == 4.0, "the runner promotes when the retry is due"


def test_the_last_attempt_settles_the_job_failed(time: FakeTime, caplog: pytest.LogCaptureFixture) -> None:
    runner = core(time, retry=NO_JITTER)
    execution = admitted(runner, attempt=3)
    execution.error = RuntimeError("boom")  # its handler raised
    with caplog.at_level(logging.WARNING, "sqlalchemy_watchdog.runner"):
        request = settle_request(runner, execution, Decision.failed("boom"))
    assert request.requeue_after_ms is None and request.history is not None
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, f"job {execution.job_id}: attempt 3 of 3 failed (boom); the job failed")
    ]


def test_a_failure_the_handler_returned_is_a_warning_and_a_timeout_an_error(
    time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    """``Decision.failed(...)`` returned is the handler's answer (a declined
    card), not a fault: one WARNING line with its reason; what raised, was
    killed or timed out stays an ERROR."""
    runner = core(time, retry=NO_JITTER)
    decided, timed_out = admitted(runner), admitted(runner, attempt=3)
    timed_out.signal.request(StopReason.TIMEOUT)
    with caplog.at_level(logging.WARNING, "sqlalchemy_watchdog.runner"):
        settle_request(runner, decided, Decision.failed("card declined", retry=False))
        settle_request(runner, timed_out, Decision.failed("timed out after 5s"))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.WARNING,
            f"job {decided.job_id}: attempt 1 of 3 failed (card declined); not retried; "
            "the job failed, as its handler decided",
        ),
        (logging.ERROR, f"job {timed_out.job_id}: attempt 3 of 3 failed (timed out after 5s); the job failed"),
    ]


def test_a_retry_is_one_warning_line_saying_when_the_next_attempt_is(
    time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    runner = core(time, retry=NO_JITTER)
    execution = admitted(runner)
    with caplog.at_level(logging.WARNING, "sqlalchemy_watchdog.runner"):
        settle_request(runner, execution, Decision.failed("boom"))
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"job {execution.job_id}: attempt 1 of 3 failed (boom); next attempt at 2026-03-01 10:30:04.000 UTC (in 4.000s)"
    )


def test_retry_false_is_final_even_with_attempts_left() -> None:
    judged = verdict(Decision.failed("bad input", retry=False), job(), NO_JITTER, None)
    assert (judged.fate, judged.level, judged.not_retried) == (Fate.SETTLE, logging.ERROR, True)


def test_without_a_policy_a_failed_attempt_is_final() -> None:
    judged = verdict(Decision.failed("boom"), job(), None, None)
    assert (judged.fate, judged.wait, judged.max_attempts, judged.recorded) == (Fate.SETTLE, None, None, True)


def test_an_exception_retry_on_does_not_list_is_final() -> None:
    policy = RetryPolicy(max_attempts=3, jitter=0.0, retry_on=(TimeoutError,))
    assert verdict(Decision.failed("x"), job(), policy, KeyError("x")).fate is Fate.SETTLE
    assert verdict(Decision.failed("x"), job(), policy, TimeoutError("x")).fate is Fate.RETRY


def test_decision_retry_after_waits_what_the_handler_asked() -> None:
    judged = verdict(Decision.retry("busy", after=timedelta(seconds=30)), job(), NO_JITTER, None)
    assert (judged.fate, judged.wait) == (Fate.RETRY, timedelta(seconds=30))


def test_a_snooze_waits_after_and_uses_no_attempt(time: FakeTime) -> None:
    runner = core(time, retry=NO_JITTER)
    execution = admitted(runner, attempt=3)  # no attempts left: a snooze needs none
    decision = Decision.snooze(timedelta(minutes=5))
    assert verdict(decision, execution.claim.job, NO_JITTER, None).fate is Fate.SNOOZE
    request = settle_request(runner, execution, decision)
    assert request.history is None and request.requeue_after_ms is None and request.decision.snoozed
    assert execution.requeue_in == 300.0


def test_completed_is_never_retried() -> None:
    judged = verdict(Decision.completed(), job(), NO_JITTER, None)
    assert (judged.fate, judged.level, judged.recorded) == (Fate.SETTLE, None, False)


# -- timeouts and lost leases ---------------------------------------------------------------


def test_an_attempt_past_its_timeout_is_stopped_and_counts_as_failed(time: FakeTime) -> None:
    runner = core(time, timeout=timedelta(seconds=5))
    execution = admitted(runner)

    def the_handler_runs_past_its_deadline(step: RunHandler) -> Decision | None:
        time.advance(4.9)
        run(time_out(runner))  # not yet: no step
        time.advance(0.2)
        run(time_out(runner), Expect(Stop, check=lambda stop: assert_reason(stop, StopReason.TIMEOUT)))
        return decision_of_result(None, step.execution.job)  # the handler returned None after the stop

    request = run(execute(runner, execution), Expect(RunHandler, the_handler_runs_past_its_deadline, computed=True))
    assert isinstance(request, SettleRequest)
    assert request.decision.outcome is Outcome.FAILED and request.decision.reason == "timed out after 5s"


def test_the_heartbeat_stops_a_handler_whose_job_was_cancelled(time: FakeTime) -> None:
    runner = core(time)
    execution = admitted(runner)
    cancelled = job(job_id=execution.job_id, cancellation_id="c-1")
    run(
        renew(runner),
        Expect(store.renew, set(), check=lambda step: assert_renewed_now(step, time)),
        Expect(store.read, cancelled),
        Expect(Stop, check=lambda step: assert_reason(step, StopReason.CANCELLED)),
    )


def assert_renewed_now(step: Any, time: FakeTime) -> None:
    assert step.kwargs["now"] == time.now_ms(), "a renewal sends the runner's clock"


def test_the_heartbeat_does_not_renew_a_timed_out_attempt(time: FakeTime) -> None:
    runner = core(time)
    execution = admitted(runner)
    execution.signal.request(StopReason.TIMEOUT)
    run(renew(runner))  # no step: its lease is left to run out


# -- recovery ---------------------------------------------------------------------------------


def test_a_vanished_claim_is_requeued_within_its_budget(time: FakeTime) -> None:
    runner = core(time, max_recoveries=2)
    vanished = claim()
    requeued = Recovery(vanished.job.job_id, RecoveryStatus.REQUEUED, job(state=JobState.QUEUED))

    def budget(step: Any) -> None:
        assert step.args == (vanished,) and step.kwargs == {"max_recoveries": 2}

    result = run(
        recover(runner), Expect(store.expired_claims, [vanished]), Expect(store.reconcile, requeued, check=budget)
    )
    assert result is not None and result.status is TickStatus.REQUEUED


def test_this_runners_own_lapsed_claim_is_stopped_before_it_is_recovered(time: FakeTime) -> None:
    runner = core(time)
    own = admitted(runner)
    interrupted = Recovery(own.job_id, RecoveryStatus.SETTLED, job(state=JobState.SETTLED))
    result = run(
        recover(runner),
        Expect(store.expired_claims, [own.claim]),
        Expect(Stop, check=lambda step: assert_reason(step, StopReason.LEASE_LOST)),
        Expect(store.reconcile, interrupted),
    )
    assert result is not None and result.status is TickStatus.RECOVERED


def test_a_claim_the_database_refuses_to_recover_is_skipped_for_a_while(time: FakeTime) -> None:
    runner = core(time)
    poison = claim()
    refused = WatchdogError(ErrorCode.STORE_UNAVAILABLE, "a check constraint refused it")  # not transient
    assert run(recover(runner), Expect(store.expired_claims, [poison]), Expect(store.reconcile, refused)) is None
    assert runner.isolated_jobs == (poison.job.job_id,)
    assert run(recover(runner), Expect(store.expired_claims, [poison])) is None, "skipped: no reconcile"
    time.advance(5.0)  # the first isolation lasts 5 s
    assert not runner.isolated_jobs, "its isolation ran out: the next pass tries again"


# -- the loop ---------------------------------------------------------------------------------


def test_a_loop_pass_recovers_promotes_then_claims_for_every_free_slot(time: FakeTime) -> None:
    runner = core(time, concurrency=2)
    taken = (claim(), claim())
    wait = run(
        loop_pass(runner),
        Expect(store.expired_claims, []),
        Expect(store.seconds_until_next_expiry, None),
        Expect(store.promote, Promotion(0, None)),
        # Revision w0012: tell the dependents of jobs settled while waiting (none here).
        Expect(store.propagate, 0),
        Expect(store.claim, ClaimBatch(taken, ()), check=lambda step: assert_limit(step, 2)),
        Expect(Spawn, check=lambda step: assert_spawned(step, taken)),
    )
    assert wait == 0.0, "every free slot was filled: there may be more, look again at once"
    assert runner.free_slots() == 0


def assert_limit(step: Any, limit: int) -> None:
    assert step.kwargs["limit"] == limit


def assert_spawned(step: Spawn, taken: tuple[Any, ...]) -> None:
    assert [e.claim for e in step.executions] == list(taken)


def test_an_idle_loop_waits_until_the_next_delayed_job_is_due(time: FakeTime) -> None:
    runner = core(time, concurrency=2)
    wait = run(
        loop_pass(runner),
        Expect(store.expired_claims, []),
        Expect(store.seconds_until_next_expiry, None),
        Expect(store.promote, Promotion(0, 0.75)),
        Expect(store.propagate, 0),
        Expect(store.claim, ClaimBatch((), ())),
    )
    assert wait == pytest.approx(0.75)
    time.advance(0.75)
    assert runner.promotion_is_due() and not runner.recovery_is_due()


# -- schedules on the runner's clock ------------------------------------------------------------


def test_schedules_enqueue_their_next_slot_by_the_runners_clock(time: FakeTime) -> None:
    hourly = Schedule("hourly", "0 * * * *", "q", catch_up=0)
    runner = core(time, schedules=[hourly])
    enqueued: list[Any] = []

    def slots(step: Any) -> None:
        enqueued.extend(step.args[0])

    run(
        enqueue_schedules(runner),
        Expect(store.enqueue_each, [None], check=slots),
        Expect(store.record_schedules, None),
    )
    # The runner's clock says 10:30: the next slot is 11:00, whatever the machine's clock says.
    assert [j.run_at for j in enqueued] == [datetime(2026, 3, 1, 11, 0, tzinfo=UTC)]
    time.advance(59.0)
    assert not runner.schedules_are_due()
    time.advance(1.0)
    assert runner.schedules_are_due(), "looked at again within a minute"


# -- the summary ------------------------------------------------------------------------------------


def test_the_summary_is_due_each_period_with_its_measured_length(time: FakeTime) -> None:
    runner = core(time, summary_every=timedelta(seconds=60))
    runner.count("completed", 3)
    time.advance(59.0)
    assert not runner.summary_is_due()
    time.advance(1.5)
    assert runner.summary_is_due()
    seconds, counts, running = runner.take_summary()
    assert (seconds, counts, running) == (60.5, {"completed": 3}, 0)


def test_an_idle_runner_logs_no_summary(time: FakeTime) -> None:
    runner = core(time, summary_every=timedelta(seconds=60))
    time.advance(61.0)
    assert not runner.summary_is_due()


# -- handler policy goes with the handler --------------------------------------------------------


@pytest.fixture
def registry() -> Any:
    saved = dict(handlers_module._registry)
    handlers_module._registry.clear()
    yield handlers_module._registry
    handlers_module._registry.clear()
    handlers_module._registry.update(saved)


def test_a_wrapped_handler_keeps_its_retry_and_timeout(registry: Any) -> None:
    policy = RetryPolicy(max_attempts=7)

    @handler("unit-wrapped", retry=policy, timeout=timedelta(seconds=9), max_recoveries=4)
    def send(job: Any) -> None:
        return None

    @functools.wraps(send)
    def logged(job: Any) -> None:
        send(job)

    built = settings({"unit-wrapped": logged})
    view = job("unit-wrapped")
    assert built.policy_for(view) is policy
    assert built.timeout_for(view) == timedelta(seconds=9)
    assert built.budget_for(view) == 4


def test_a_handler_decorated_after_its_wrapper_keeps_its_policy(registry: Any) -> None:
    def send(job: Any) -> None:
        return None

    wrapper = functools.partial(send)
    wrapper.__wrapped__ = send  # type: ignore[attr-defined]
    handler("unit-inner", timeout=timedelta(seconds=3))(send)
    assert settings({"unit-inner": wrapper}).timeout_for(job("unit-inner")) == timedelta(seconds=3)


def test_a_handler_policy_belongs_to_its_queue(registry: Any) -> None:
    @handler("unit-a", retry=NO_JITTER)
    def send(job: Any) -> None:
        return None

    built = settings({"unit-a": send, "unit-b": send})
    assert built.policy_for(job("unit-a")) is NO_JITTER
    assert built.policy_for(job("unit-b")) is None


def test_an_undecorated_handler_uses_the_runners_options() -> None:
    built = settings({"q": lambda job: None}, retry=NO_JITTER)
    assert built.policy_for(job()) is NO_JITTER


def test_runner_options_take_their_defaults_when_left_out() -> None:
    built = settings()
    assert isinstance(built, RunnerSettings)
    assert (built.concurrency, built.lease_ms, built.heartbeat_s, built.poll_interval_s, built.grace_s) == (
        10,
        120_000,
        10.0,
        2.0,
        20.0,
    )


# -- typed store calls ------------------------------------------------------------------------


def test_every_store_call_of_the_core_is_made_through_the_typed_call() -> None:
    """``yield from call(store.fn, ...)`` types the answer and checks the
    arguments against the store function; a bare ``yield StoreCall(...)``
    would answer Any. Only ``call`` itself makes one."""
    import pathlib

    import sqlalchemy_watchdog.core as core_package

    root = pathlib.Path(core_package.__file__).parent
    bare = {
        str(path.relative_to(root)): path.read_text().count("yield StoreCall(")
        for path in sorted(root.rglob("*.py"))
        if "yield StoreCall(" in path.read_text()
    }
    assert bare == {"steps.py": 1}


def test_a_retry_that_commits_while_a_promotion_reads_is_promoted_when_due(time: FakeTime) -> None:
    """A promotion reads the delayed jobs (none yet) while a settle thread
    commits a retry due in 0.3 s and expects it: the promotion's answer
    ("nothing delayed: look again in a poll interval") must not push the
    runner's next promotion past the retry's time. It did: with a 30 s poll
    interval the retried job waited up to 30 s."""
    from sqlalchemy_watchdog.core.maintenance import promote

    runner = core(time, poll_interval=timedelta(seconds=30))

    def read_before_the_retry_committed(step: Any) -> Promotion:
        runner.expect_ready(0.3)  # the settle thread's retire(), while the promotion's read ran
        return Promotion(0, None)

    run(promote(runner), Expect(store.promote, read_before_the_retry_committed, computed=True))
    assert runner.promotion_due - time.mono == pytest.approx(0.3)
    time.advance(0.3)
    assert runner.promotion_is_due()
    # The next promotion, at the retry's time, reads it: the expectation is done with.
    run(promote(runner), Expect(store.promote, Promotion(1, None)))
    assert runner.promotion_due - time.mono == pytest.approx(30.0)


# -- a database that does not answer (issue 54) --------------------------------------------


def unreachable() -> WatchdogError:
    """What a store call raises once its own retries of a refused connection are spent."""
    error = WatchdogError(ErrorCode.STORE_UNAVAILABLE, "settle_many failed: connection refused")
    error.__cause__ = ConnectionRefusedError("connection refused")
    return error


def settling(runner: RunnerCore) -> tuple[Execution, SettleRequest]:
    """An execution whose handler returned ``completed``, and its settle request."""
    execution = admitted(runner)
    runner.release_slot(execution)
    request = SettleRequest(execution.job_id, execution.claim.token, Decision.completed(), runner.clock.now_ms())
    return execution, request


def test_a_settle_the_database_cannot_take_is_kept_and_retried_while_its_lease_may_live(
    time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    runner = core(time, lease=timedelta(seconds=10), heartbeat=timedelta(seconds=2))
    _, request = settling(runner)
    settled = object()
    caplog.set_level(logging.DEBUG, logger="sqlalchemy_watchdog")
    result = run(
        settle_batch(runner, [request]),
        Expect(store.settle_many, unreachable()),
        Expect(Pause, True, check=lambda step: time.advance(step.seconds)),
        Expect(store.settle_many, unreachable()),
        Expect(Pause, True, check=lambda step: time.advance(step.seconds)),
        Expect(store.settle_many, [settled], check=lambda step: assert_same_requests(step, [request])),
    )
    assert result == [settled], "the decision was kept through the failures"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "database unreachable" in warnings[0] and "1 settle(s) waiting" in warnings[0]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "nothing was lost: no ERROR"


def assert_same_requests(step: Any, requests: list[SettleRequest]) -> None:
    assert step.args == (requests,), "the retry sends the same decision"


def test_a_settle_is_given_up_only_once_its_lease_has_surely_ended(
    time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    runner = core(time, lease=timedelta(seconds=3), heartbeat=timedelta(seconds=1))
    execution, request = settling(runner)
    started = time.mono
    tries = 0

    def perform(step: Any) -> Any:
        nonlocal tries
        if isinstance(step, Pause):
            assert time.mono + step.seconds <= execution.lease_ends_by + 0.01, "no pause past the lease's end"
            time.advance(step.seconds)
            return True
        assert step.fn is store.settle_many
        tries += 1
        raise unreachable()

    caplog.set_level(logging.WARNING, logger="sqlalchemy_watchdog")
    assert drive(settle_batch(runner, [request]), perform) == [None]
    assert time.mono - started >= 3.0, "given up before the lease could have ended"
    assert tries >= 4, "retried with back-off meanwhile"
    lost = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "given up" in r.getMessage()]
    assert len(lost) == 1 and execution.job_id in lost[0], "the lost decision is one ERROR, naming the job"


def test_a_held_renewal_moves_the_end_of_the_lease_the_settles_wait_for(time: FakeTime) -> None:
    runner = core(time, lease=timedelta(seconds=3), heartbeat=timedelta(seconds=1))
    execution = admitted(runner)
    first = execution.lease_ends_by
    time.advance(1.0)
    run(renew(runner), Expect(store.renew, {execution.job_id}))
    assert execution.lease_ends_by == pytest.approx(first + 1.0)


def test_a_renewal_that_fails_transiently_tells_no_handler_and_is_tried_again_soon(time: FakeTime) -> None:
    runner = core(time, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=10))
    execution = admitted(runner)
    waits = [run(renew(runner), Expect(store.renew, unreachable())) for _ in range(7)]
    assert not execution.signal.is_set(), "a renewal the database never answered says nothing of the lease"
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0], "back-off up to the heartbeat interval"
    assert run(renew(runner), Expect(store.renew, {execution.job_id})) == 10.0
    assert run(renew(runner), Expect(store.renew, unreachable())) == 0.5, "a new failure starts over"


def test_shutdown_neither_stops_nor_abandons_an_execution_whose_settle_waits_for_the_database(
    time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    runner = core(time, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=10), grace=timedelta(seconds=5))
    execution, _ = settling(runner)
    caplog.set_level(logging.WARNING, logger="sqlalchemy_watchdog")
    waits: list[float] = []
    run(
        shutdown(runner),
        Expect(WaitDone, check=lambda step: waits.append(step.timeout)),
        Expect(WaitDone, check=lambda step: waits.append(step.timeout)),
    )
    assert not execution.signal.is_set(), "its handler has returned: nothing to stop"
    assert waits[0] == 5.0 and 0 < waits[1] <= runner.settings.shutdown_budget_s
    assert any("1 settle(s) still waiting" in r.getMessage() for r in caplog.records)


def test_shutdown_with_its_budget_spent_still_gives_a_settle_in_flight_its_last_statement_time(
    time: FakeTime,
) -> None:
    """No grace: the budget (0.1 s) is spent before a hand-off or a settle
    just begun can finish; it still gets LAST_STATEMENTS_S, never past its
    lease."""
    runner = core(time, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=10), grace=timedelta(0))
    settling(runner)
    waits: list[float] = []
    run(
        shutdown(runner),
        Expect(WaitDone, check=lambda step: waits.append(step.timeout)),
        Expect(WaitDone, check=lambda step: waits.append(step.timeout)),
    )
    assert waits[0] == 0.0
    assert waits[1] == pytest.approx(LAST_STATEMENTS_S)


def test_a_process_executor_stops_claiming_ahead_of_children_whose_handlers_are_shorter_than_a_few_round_trips(
    time: FakeTime,
) -> None:
    """Each job claimed ahead of busy children waits one round trip for its
    start record as a child frees up: with handlers of fewer than
    ``AHEAD_MIN_ROUND_TRIPS`` round trips the runner claims only for idle
    children (and its settler waits for no other child's answer), as with
    ``prefetch=0``; longer handlers get the whole ``prefetch`` again. Unknown
    run times (the first claims) keep the ``prefetch`` asked for. The run time
    counts from the moment the handler began in its child, never the wait
    for a free child."""
    from sqlalchemy_watchdog import ProcessExecutor
    from sqlalchemy_watchdog.core.ahead import AHEAD_MIN_ROUND_TRIPS

    runner = core(time, {"q": child_handler}, executor=ProcessExecutor(processes=2, prefetch=2))
    assert runner.claim_ahead() == 2 and runner.free_slots() == 4, "run times unknown: the prefetch asked for"
    assert runner.settle_gather()[0] == 2
    runner.run_times.note_round_trip(0.002)

    def child_ran(seconds: float, waited: float = 0.0) -> None:
        execution = admitted(runner)
        time.advance(waited)  # the wait for a free child does not count
        runner.start_deadline(execution)

        def handler_runs(step: Any) -> Decision:
            time.advance(seconds)
            return Decision.completed()

        run(execute(runner, execution), Expect(RunHandler, handler_runs, computed=True))
        runner.release_slot(execution)
        runner.retire(execution)

    child_ran(0.001, waited=1.0)  # half a round trip of handler after a second's wait for a child
    assert runner.child_run_times(0).average == pytest.approx(0.001)
    assert runner.claim_ahead() == 0, "handlers shorter than a few round trips: nothing claimed ahead"
    assert runner.free_slots() == 2, "only the idle children are claimed for"
    assert runner.settle_gather() == (1, 0.0), "no child has a next job: settles go at once"
    assert runner.run_times.average is None, "the threads' run times are their own"
    for _ in range(40):
        child_ran(AHEAD_MIN_ROUND_TRIPS * 0.002 * 2)
    assert runner.claim_ahead() == 2 and runner.free_slots() == 4, "long enough again: the whole prefetch"
    assert runner.settle_gather()[0] == 2
