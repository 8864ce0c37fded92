"""Claiming ahead of short handlers (``sqlalchemy_watchdog.core.ahead``), with no database.

The rules: how many jobs a runner claims beyond ``concurrency`` (none until a
handler returned, as many as start within the horizon at the recent run time,
never more than the cap, none while a limit holds claims back), that the next
claim waits for the jobs already claimed ahead, that a give-back stops it, and
that a given-back execution settles untouched without running. The drivers'
side (threads and tasks taking parked jobs in order, the give-back after a
wait, at shutdown) is in tests/integration/test_claim_ahead.py.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqlalchemy_watchdog import Decision, ProcessExecutor, store
from sqlalchemy_watchdog.core.ahead import (
    AHEAD_HORIZON_S,
    AHEAD_MIN_ROUND_TRIPS,
    AHEAD_WAIT_MAX_S,
    RUN_TIME_WEIGHT,
    Parking,
    RunTimes,
)
from sqlalchemy_watchdog.core.loop import claim_steps, execute, record_starts
from sqlalchemy_watchdog.core.steps import NEVER_STARTED, RunHandler, StoreCall
from sqlalchemy_watchdog.errors import ErrorCode, InvalidJob, WatchdogError
from sqlalchemy_watchdog.jobs import Outcome
from sqlalchemy_watchdog.store import ClaimBatch, SettleRequest

from .scripted import Expect, FakeTime, admitted, claim, core, run


@pytest.fixture
def time() -> FakeTime:
    return FakeTime()


def ran(runner: Any, time: FakeTime, seconds: float) -> None:
    """One job admitted and run for ``seconds`` of the fake clock, then retired."""
    execution = admitted(runner)

    def handler_runs(step: Any) -> Decision:
        time.advance(seconds)
        return Decision.completed()

    request = run(execute(runner, execution), Expect(RunHandler, handler_runs, computed=True))
    assert isinstance(request, SettleRequest)
    runner.release_slot(execution)
    runner.retire(execution)


def test_nothing_is_claimed_ahead_until_a_handler_returned(time: FakeTime) -> None:
    runner = core(time, concurrency=10)
    assert runner.settings.ahead_cap == 40, "the default cap is four times the concurrency"
    assert runner.free_slots() == 10, "the run time is unknown: only the free slots"


def test_short_handlers_let_the_runner_claim_ahead_up_to_its_cap(time: FakeTime) -> None:
    runner = core(time, concurrency=10)
    ran(runner, time, 0.0001)
    assert runner.claim_ahead() == 40 and runner.free_slots() == 50


def test_how_many_are_claimed_ahead_follows_the_run_time(time: FakeTime) -> None:
    """As many as the handlers start within the horizon: concurrency x horizon / run time."""
    runner = core(time, concurrency=10, claim_ahead=1000)
    ran(runner, time, 0.005)
    assert runner.claim_ahead() == int(10 * AHEAD_HORIZON_S / 0.005) == 20
    runner = core(time, concurrency=10)
    ran(runner, time, 0.5)
    assert runner.claim_ahead() == 0 and runner.free_slots() == 10, "long handlers: nothing claimed ahead"


def test_one_long_handler_stops_claiming_ahead_until_short_ones_bring_the_average_down(time: FakeTime) -> None:
    runner = core(time, concurrency=10)
    ran(runner, time, 0.0001)
    assert runner.claim_ahead() == 40
    ran(runner, time, 2.0)
    assert runner.claim_ahead() == 0
    resumed = full = 0
    while runner.claim_ahead() < 40:
        ran(runner, time, 0.0001)
        full += 1
        resumed = resumed or (full if runner.claim_ahead() > 0 else 0)
    assert 5 <= resumed <= 10 and 15 <= full <= 30, f"claiming ahead resumed after {resumed}, whole after {full}"


def test_claim_ahead_zero_never_claims_ahead(time: FakeTime) -> None:
    runner = core(time, concurrency=4, claim_ahead=0)
    ran(runner, time, 0.0)
    assert runner.claim_ahead() == 0 and runner.free_slots() == 4


def test_a_limit_holding_claims_back_stops_claiming_ahead(time: FakeTime) -> None:
    """A job claimed ahead would hold its room in a limited queue unused."""
    runner = core(time, concurrency=2)
    ran(runner, time, 0.0)
    run(claim_steps(runner, 2), Expect(store.claim, ClaimBatch((claim(),), (), held_back=True)))
    assert runner.held_back and runner.claim_ahead() == 0 and runner.free_slots() == 1


def test_the_next_claim_waits_until_the_jobs_claimed_ahead_have_started(time: FakeTime) -> None:
    """Claims ahead go in batches: while jobs claimed ahead wait for a slot,
    a freed slot is not claimed for one job at a time."""
    runner = core(time, concurrency=2, claim_ahead=2)
    ran(runner, time, 0.0)
    executions = [admitted(runner) for _ in range(4)]  # two run, two wait for a slot
    assert runner.free_slots() == 0
    runner.release_slot(executions[0])  # a handler returned; a job claimed ahead takes its slot
    assert runner.free_slots() == 0, "a job claimed ahead still waits: no claim for one slot"
    runner.release_slot(executions[1])
    assert runner.free_slots() == 2, "the jobs claimed ahead started: claim a batch"


def test_a_give_back_stops_claiming_ahead(time: FakeTime) -> None:
    runner = core(time, concurrency=4)
    ran(runner, time, 0.0)
    assert runner.claim_ahead() == 16
    runner.run_times.gave_back()
    assert runner.run_times.average is not None and runner.run_times.average >= AHEAD_WAIT_MAX_S * 0.2
    assert runner.claim_ahead() == 0


def test_a_given_back_execution_settles_untouched_without_running(time: FakeTime) -> None:
    """Queued again with the failure fields its claim found, nothing counted: no handler step."""
    runner = core(time)
    execution = admitted(runner, failure_reason="earlier attempt", failure_detail="trace")
    execution.given_back = True
    request = run(execute(runner, execution))
    assert isinstance(request, SettleRequest)
    assert request.decision is NEVER_STARTED and request.given_back == ("earlier attempt", "trace")
    assert (request.job_id, request.claim_token) == execution.pair
    assert request.decision.outcome is Outcome.FAILED  # the store reads given_back: queued again, uncounted


def child_handler(job: Any) -> None:
    """A handler the process executor can locate (module level)."""


def test_the_process_executor_claims_ahead_by_its_prefetch_only(time: FakeTime) -> None:
    handlers = {"q": child_handler}
    with pytest.raises(InvalidJob) as refused:
        core(time, handlers, executor=ProcessExecutor(processes=2), claim_ahead=1)
    assert refused.value.field == "claim_ahead" and "prefetch" in str(refused.value)
    runner = core(time, handlers, executor=ProcessExecutor(processes=2, prefetch=3))
    assert runner.settings.ahead_cap == 0 and runner.claim_ahead() == 3


@pytest.mark.parametrize("value", [-1, 10_001, True, 1.5, "2"])
def test_a_bad_claim_ahead_is_refused_by_name(time: FakeTime, value: object) -> None:
    with pytest.raises(InvalidJob) as refused:
        core(time, claim_ahead=value)
    assert refused.value.field == "claim_ahead"


# -- the run times and the parking, on their own ------------------------------------------


def test_run_times_are_unknown_until_noted_and_then_a_weighted_average() -> None:
    times = RunTimes()
    assert times.average is None and times.ahead(10, 20) == 0
    times.note(0.010)
    assert times.average == pytest.approx(0.010) and times.ahead(10, 20) == 10
    times.note(0.0)
    assert times.average == pytest.approx(0.008)
    times.note(-1.0)  # a clock that stepped back counts as nothing
    assert times.average == pytest.approx(0.0064)


def test_a_vanishing_run_time_claims_the_cap_ahead_and_never_overflows() -> None:
    """Hypothesis found a denormal average (2e-311 s) whose quotient is infinite."""
    for run_time in (0.0, 5e-324, 2.225073858507e-311, 1e-9):
        times = RunTimes()
        times.note(run_time)
        assert times.ahead(1, 1) == 1 and times.ahead(10, 10_000) == 10_000, run_time


def test_parked_executions_start_in_claim_order_as_slots_free() -> None:
    parking = Parking(2)
    first, second, third, fourth = (object() for _ in range(4))
    assert parking.offer(first, 0.0) and parking.offer(second, 0.0)  # type: ignore[arg-type]
    assert not parking.offer(third, 1.0) and not parking.offer(fourth, 2.0)  # type: ignore[arg-type]
    assert len(parking) == 2 and parking.due(AHEAD_WAIT_MAX_S) == 1.0 + AHEAD_WAIT_MAX_S
    assert parking.next() is third and parking.next() is fourth
    assert parking.next() is None and parking.next() is None, "both slots free now"
    assert parking.offer(first, 3.0) and parking.offer(second, 3.0), "free slots run at once"  # type: ignore[arg-type]


def test_stale_parked_executions_are_taken_out_oldest_first_and_never_run() -> None:
    parking = Parking(1)
    running, old, new = (SimpleNamespace() for _ in range(3))  # executions the parking marks
    parking.offer(running, 0.0)  # type: ignore[arg-type]
    parking.offer(old, 0.0)  # type: ignore[arg-type]
    parking.offer(new, 0.9)  # type: ignore[arg-type]
    assert parking.stale(0.5, 1.0) == []
    assert parking.stale(1.0, 1.0) == [old]
    assert parking.take_all() == [new] and len(parking) == 0 and parking.due(1.0) is None
    assert parking.next() is None, "nothing parked: the slot is free"


# -- the parking and the claim-ahead rule under any interleaving (Hypothesis) --------------

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.integers(1, 8)),  # the loop's claim: as many as free_slots() allows
        st.tuples(st.just("finish"), st.integers(0, 7)),  # a slot's handler returned (the n-th running)
        st.tuples(st.just("wait"), st.floats(0.0, 2.0)),  # time passes; the heartbeat gives back stale ones
        st.tuples(st.just("run_time"), st.floats(0.0, 0.2)),  # a handler's run time noted
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(concurrency=st.integers(1, 4), cap=st.integers(0, 8), operations=OPERATIONS)
def test_jobs_claimed_ahead_never_run_beyond_concurrency_and_each_ends_once(
    concurrency: int, cap: int, operations: list[tuple[str, Any]]
) -> None:
    """Whatever the order of claims, returns, run times and waits: never more
    than ``concurrency`` executions run; the claim never takes more than
    ``concurrency + cap`` jobs in flight; parked jobs start in claim order;
    and every claimed job either runs or is given back, exactly once."""
    time = FakeTime()
    runner = core(time, concurrency=concurrency, claim_ahead=cap)
    parking = Parking(concurrency)
    running: list[Any] = []
    started: list[str] = []
    given_back: list[str] = []
    claimed: list[str] = []
    for operation, value in operations:
        if operation == "claim":
            free = runner.free_slots()
            assert len(runner.active()) + max(free, 0) <= concurrency + cap
            for _ in range(min(free, value)):
                execution = admitted(runner)
                claimed.append(execution.job_id)
                if parking.offer(execution, time.mono):
                    running.append(execution)
                    started.append(execution.job_id)
        elif operation == "finish" and running:
            done = running.pop(value % len(running))
            runner.release_slot(done)
            runner.retire(done)
            successor = parking.next()
            if successor is not None:
                running.append(successor)
                started.append(successor.job_id)
        elif operation == "wait":
            time.advance(value)
            for stale in parking.stale(time.mono, AHEAD_WAIT_MAX_S):
                runner.run_times.gave_back()
                given_back.append(stale.job_id)
                runner.retire(stale)
        elif operation == "run_time":
            runner.run_times.note(value)
        assert len(running) <= concurrency
    ends = started + given_back + [e.job_id for e in parking.take_all()]
    assert sorted(ends) == sorted(claimed) and len(set(ends)) == len(ends), "each claimed job ends once"
    order = [job_id for job_id in claimed if job_id in set(started)]
    assert started == order, "jobs start in claim order"


def test_handlers_shorter_than_a_few_round_trips_are_not_claimed_ahead() -> None:
    """A job claimed ahead waits one round trip for its start record: below
    ``AHEAD_MIN_ROUND_TRIPS`` round trips of run time nothing is claimed
    ahead; at or above it the horizon decides as before."""
    run_times = RunTimes()
    run_times.note(0.001)
    assert run_times.ahead(10, 40) == 40, "no round trip measured yet: the horizon alone"
    run_times.note_round_trip(0.001)
    assert run_times.ahead(10, 40) == 0, "handlers of one round trip: nothing claimed ahead"
    run_times.average = AHEAD_MIN_ROUND_TRIPS * 0.001
    assert run_times.ahead(10, 40) == 25 == int(10 * AHEAD_HORIZON_S / run_times.average)


def test_the_round_trip_is_a_weighted_average_of_claims_and_starts() -> None:
    run_times = RunTimes()
    assert run_times.round_trip is None
    run_times.note_round_trip(0.002)
    run_times.note_round_trip(0.001)
    assert run_times.round_trip == pytest.approx(0.002 - RUN_TIME_WEIGHT * 0.001)
    run_times.note_round_trip(-1.0)  # a clock step back counts as nothing, never negative
    assert run_times.round_trip is not None and run_times.round_trip >= 0


def test_the_starts_asked_for_at_once_are_one_store_start_whose_round_trip_is_noted(time: FakeTime) -> None:
    """``record_starts`` -- what both drivers run for a ``RecordStart``, alone
    or for their settler's batch -- asks for one ``store.start`` of every
    claim, with the runner's lease and its application clock, answers the
    claims that held, and notes the call's round trip as a claim's is."""
    runner = core(time, lease=timedelta(seconds=30))
    pairs = [("job-a", "token-a"), ("job-b", "token-b")]

    def answered(step: StoreCall[Any]) -> set[str]:
        assert step.args == (pairs,)
        assert step.kwargs == {"lease_ms": 30_000, "now": time.now_ms()}
        time.advance(0.004)  # the database's answer takes 4 ms
        return {"job-a"}

    held = run(record_starts(runner, pairs), Expect(store.start, answered, computed=True))
    assert held == {"job-a"}
    assert runner.run_times.round_trip == pytest.approx(0.004)


def test_a_failed_start_record_is_raised_and_not_noted(time: FakeTime) -> None:
    runner = core(time)
    lost = WatchdogError(ErrorCode.STORE_UNAVAILABLE, "connection lost")
    with pytest.raises(WatchdogError) as raised:
        run(record_starts(runner, [("job-a", "token-a")]), Expect(store.start, lost))
    assert raised.value is lost
    assert runner.run_times.round_trip is None
