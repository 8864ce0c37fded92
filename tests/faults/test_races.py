"""Fault 6: races between recovery, completion and cancellation.

Each race runs the store operations on separate connections in threads
released together by a barrier (and, for two recoverers, in separate
processes), many times over, on SQLite and PostgreSQL. The database
serialises them; the conditional statements must let exactly one side win.
"""

from __future__ import annotations

import functools
import multiprocessing
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Decision, Job, Runner, Watchdog, store
from sqlalchemy_watchdog.jobs import CancelStatus, SettleStatus
from tests.faults.helpers import (
    assert_settled_exactly_once,
    enqueue_jobs,
    jobs_by_id,
    transition_rows,
    url_string,
)
from tests.faults.recoverer import recover_all

T = TypeVar("T")

ROUNDS = 15


def _tx(engine: Engine, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` in a write transaction of its own, retried like the runner does."""

    def work() -> T:
        with engine.connect() as conn:
            return store.transact(conn, fn, *args, **kwargs)

    return store.retrying(work, what=getattr(fn, "__name__", "op"), attempts=30)


def _together(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at once in threads released by one barrier."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _claim_one(engine: Engine, job_id: str, *, lease_ms: int) -> store.Claim:
    batch = _tx(engine, store.claim, queues=[job_id], limit=1, lease_ms=lease_ms)
    (claim,) = batch.claimed
    assert claim.job.job_id == job_id
    return claim


def test_late_recovery_of_a_completed_claim_loses(engine: Engine) -> None:
    """The completion commits first; a recoverer acting on that claim later
    (after its lease would have ended) loses: completed stays completed."""
    enqueue_jobs(engine, [Job(f"j{i}", "q", max_recoveries=3) for i in range(5)])
    # The five settles must all land inside the lease: two seconds leaves room
    # for a loaded machine (150 ms did not, once, in CI's parallel run).
    claims = _tx(engine, store.claim, queues=["q"], limit=5, lease_ms=2_000).claimed
    for claim in claims:
        done = _tx(
            engine, store.settle, job_id=claim.job.job_id, claim_token=claim.token, decision=Decision.completed()
        )
        assert done.status is SettleStatus.SETTLED
    before = jobs_by_id(engine)
    time.sleep(2.1)  # every lease would have ended by now
    assert _tx(engine, store.expired_claims, limit=10) == []
    for claim in claims:
        assert _tx(engine, store.reconcile, claim).status == "lost_race"
    assert jobs_by_id(engine) == before
    assert {r["outcome"] for r in before.values()} == {"completed"}


def test_stale_recovery_after_a_new_claim_completed_loses(engine: Engine) -> None:
    """Recoverer A lists a dead claim; recoverer B requeues it first, a
    runner claims and completes it again. A's stale recovery loses and the
    completion stands."""
    enqueue_jobs(engine, [Job("j", "q", max_recoveries=3)])
    _tx(engine, store.claim, queues=["q"], lease_ms=1)
    time.sleep(0.01)
    (stale_a,) = _tx(engine, store.expired_claims, limit=10)
    (seen_b,) = _tx(engine, store.expired_claims, limit=10)
    assert _tx(engine, store.reconcile, seen_b).status == "requeued"
    (again,) = _tx(engine, store.claim, queues=["q"], lease_ms=60_000).claimed
    assert again.token != stale_a.token
    done = _tx(engine, store.settle, job_id="j", claim_token=again.token, decision=Decision.completed())
    assert done.status is SettleStatus.SETTLED
    before = jobs_by_id(engine)["j"]
    assert _tx(engine, store.reconcile, stale_a).status == "lost_race"
    assert jobs_by_id(engine)["j"] == before
    assert (before["outcome"], before["recovery_count"]) == ("completed", 1)


def test_recovery_racing_completion_at_the_lease_boundary_one_wins(engine: Engine) -> None:
    """The completion is sent right around the moment the lease ends while a
    recoverer hammers the same claim. Every round exactly one of them wins
    and the row agrees with the winner."""
    lease_ms = 150
    jobs = [Job(f"r{i}", f"r{i}", max_recoveries=3) for i in range(ROUNDS)]
    enqueue_jobs(engine, jobs)
    wins: Counter[str] = Counter()
    rng = random.Random(4)
    for job in jobs:
        claim = _claim_one(engine, job.job_id, lease_ms=lease_ms)
        claimed_at = time.monotonic()
        delay = (lease_ms + rng.uniform(-40, 40)) / 1000

        def complete(job: Job = job, claim: store.Claim = claim, at: float = claimed_at + delay) -> Any:
            time.sleep(max(0.0, at - time.monotonic()))
            return _tx(engine, store.settle, job_id=job.job_id, claim_token=claim.token, decision=Decision.completed())

        def recover(job: Job = job, claim: store.Claim = claim) -> list[store.RecoveryStatus]:
            statuses: list[store.RecoveryStatus] = []
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                statuses.append(_tx(engine, store.reconcile, claim).status)
                if statuses[-1] != "lost_race" or jobs_by_id(engine)[job.job_id]["state"] != "running":
                    break
                time.sleep(0.003)
            return statuses

        settled, recoveries = _together(complete, recover)
        won = [s for s in recoveries if s != "lost_race"]
        row = jobs_by_id(engine)[job.job_id]
        if settled.status is SettleStatus.SETTLED:
            wins["completion"] += 1
            assert won == []
            assert row["state"] == "settled" and row["outcome"] == "completed" and row["recovery_count"] == 0
            assert _tx(engine, store.reconcile, claim).status == "lost_race"
            assert jobs_by_id(engine)[job.job_id] == row
        else:
            wins["recovery"] += 1
            assert settled.status is SettleStatus.CONFLICT
            assert won == ["requeued"]
            assert row["state"] == "queued" and row["recovery_count"] == 1
    assert sum(wins.values()) == ROUNDS


@pytest.mark.parametrize("max_recoveries", [2, None])
def test_cancellation_during_recovery_never_runs_again(engine: Engine, max_recoveries: int | None) -> None:
    """A cancellation recorded while a dead claim is being recovered: in
    either order the job ends ``cancelled`` and its handler never runs again."""
    ids = [f"c{i}" for i in range(ROUNDS)]
    enqueue_jobs(engine, [Job(j, "q", max_recoveries=max_recoveries) for j in ids])
    claims = _tx(engine, store.claim, queues=["q"], limit=len(ids), lease_ms=50).claimed
    assert {c.job.job_id for c in claims} == set(ids)
    time.sleep(0.1)  # every lease has ended by the database clock
    dead = {c.job.job_id: c for c in _tx(engine, store.expired_claims, limit=100)}
    assert set(dead) == set(ids)
    orders: Counter[str] = Counter()
    expected: dict[str, str] = {}
    for job_id in ids:
        recovery, cancel = _together(
            functools.partial(_tx, engine, store.reconcile, dead[job_id]),
            functools.partial(_tx, engine, store.cancel, job_id, f"cancel-{job_id}"),
        )
        if cancel.status is CancelStatus.RECORDED:
            expected[job_id] = "cancelled"
        else:
            # Without a recovery policy the recovery may settle it first
            # (interrupted); a cancellation of a settled job is a conflict.
            assert max_recoveries is None and cancel.status is CancelStatus.CONFLICT
            assert recovery.status == "settled" and recovery.job.outcome.value == "interrupted"
            expected[job_id] = "interrupted"
        assert recovery.status in ("requeued", "settled")
        orders[f"{recovery.status}/{cancel.status.value}"] += 1

    ran: list[str] = []
    runner = Runner(
        engine, {"q": lambda job: ran.append(job.job_id)}, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=5)
    )
    runner.run_until_idle()
    assert ran == [], f"cancelled jobs ran again: {ran}"
    rows = jobs_by_id(engine)
    assert {j: rows[j]["outcome"] for j in ids} == expected, orders
    assert all(rows[j]["recovery_count"] <= (max_recoveries or 0) for j in ids)
    assert not Watchdog(engine).has_pending_work()


def test_two_recoverers_in_threads_one_wins(engine: Engine) -> None:
    """Four threads reconcile the same dead claim at once: exactly one wins."""
    ids = [f"t{i}" for i in range(ROUNDS)]
    enqueue_jobs(engine, [Job(j, "q", max_recoveries=5) for j in ids])
    _tx(engine, store.claim, queues=["q"], limit=len(ids), lease_ms=50)
    time.sleep(0.1)
    dead = {c.job.job_id: c for c in _tx(engine, store.expired_claims, limit=100)}
    for job_id in ids:
        results = _together(*[lambda j=job_id: _tx(engine, store.reconcile, dead[j])] * 4)
        statuses = Counter(r.status for r in results)
        assert statuses == Counter({"requeued": 1, "lost_race": 3}), statuses
        row = jobs_by_id(engine)[job_id]
        assert row["state"] == "queued" and row["recovery_count"] == 1


@pytest.mark.slow
def test_two_recoverer_processes_each_claim_recovered_once(instrumented: Engine, db_url: URL) -> None:
    """Two processes sweep the same 200 dead claims concurrently: every
    claim is recovered by exactly one of them, once."""
    engine = instrumented
    ids = [f"p{i:03d}" for i in range(200)]
    half = set(ids[::2])
    enqueue_jobs(engine, [Job(j, "q", max_recoveries=1 if j in half else None) for j in ids])
    for _ in range(4):
        _tx(engine, store.claim, queues=["q"], limit=50, lease_ms=100)
    time.sleep(0.2)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.map(recover_all, [url_string(db_url)] * 2)
    won = Counter(j for result in results for j in result)
    assert set(won) == set(ids)
    assert max(won.values()) == 1
    rows = jobs_by_id(engine)
    for job_id in ids:
        from_running = [t for t in transition_rows(engine, job_id) if t["old_state"] == "running"]
        assert len(from_running) == 1, from_running
        if job_id in half:
            assert rows[job_id]["state"] == "queued" and rows[job_id]["recovery_count"] == 1
        else:
            assert rows[job_id]["outcome"] == "interrupted"
    assert_settled_exactly_once(engine, [j for j in ids if j not in half])


def test_heartbeat_racing_its_own_settle_reports_no_lost_lease(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat fires in the instant between a settle's commit and the
    runner forgetting the execution (forced here by running it right after
    the settle returns). A successful settlement is not a lost lease."""
    enqueue_jobs(engine, [Job("j", "q")])
    runner = Runner(engine, {"q": lambda job: None}, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=10))
    real_store = runner._store
    settles = {store.settle, getattr(store, "settle_many", store.settle)}

    def store_then_heartbeat(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = real_store(fn, *args, **kwargs)
        if fn in settles:
            runner._renew_all()  # the heartbeat thread wins the race
        return result

    runner._store = store_then_heartbeat  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="sqlalchemy_watchdog"):
        (settled,) = runner.run_until_idle()
    assert settled.outcome is not None and settled.outcome.value == "completed"
    lost = [r.getMessage() for r in caplog.records if "claim not renewed" in r.getMessage()]
    assert lost == [], lost


# -- idempotent commands under concurrency ---------------------------------------

CALLERS = 6


def test_concurrent_identical_cancels_all_answer_recorded_or_replayed(engine: Engine) -> None:
    """Six callers send the same cancellation of a queued job at the same
    moment: one is ``recorded`` and the other five ``replayed``, never a
    ``conflict``, whatever the interleaving; the job holds that cancellation."""
    ids = [f"k{i}" for i in range(ROUNDS)]
    enqueue_jobs(engine, [Job(j, "q") for j in ids])
    watchdog = Watchdog(engine)
    for job_id in ids:
        results = _together(*[lambda j=job_id: watchdog.cancel(j, f"cid-{j}")] * CALLERS)
        statuses = Counter(r.status for r in results)
        assert statuses == Counter({CancelStatus.RECORDED: 1, CancelStatus.REPLAYED: CALLERS - 1}), statuses
        assert jobs_by_id(engine)[job_id]["cancellation_id"] == f"cid-{job_id}"


def test_concurrent_identical_cancels_from_the_cli_all_exit_0(engine: Engine, db_url: URL) -> None:
    """The command-line ``cancel`` sent six times at once succeeds six times."""
    from sqlalchemy_watchdog.cli import main

    ids = [f"cli{i}" for i in range(5)]
    enqueue_jobs(engine, [Job(j, "q") for j in ids])
    url = url_string(db_url)
    for job_id in ids:
        statuses = _together(*[lambda j=job_id: main(["--url", url, "cancel", j, f"cid-{j}"])] * CALLERS)
        assert statuses == [0] * CALLERS


def test_one_cancellation_id_sent_for_two_jobs_at_once_is_recorded_for_one(engine: Engine) -> None:
    """The same cancellation id sent at once for two different jobs: one job
    records it, the other answers ``conflict`` (through the unique index when
    the statements overlap) and stays uncancelled. Repeating the winner's
    request is then a replay."""
    pairs = [(f"a{i}", f"b{i}") for i in range(ROUNDS)]
    enqueue_jobs(engine, [Job(j, "q") for pair in pairs for j in pair])
    watchdog = Watchdog(engine)
    for a, b in pairs:
        cid = f"shared-{a}"
        results = _together(lambda: watchdog.cancel(a, cid), lambda: watchdog.cancel(b, cid))
        assert sorted(r.status.value for r in results) == ["conflict", "recorded"], results
        winner = next(r.job_id for r in results if r.status is CancelStatus.RECORDED)
        loser = b if winner == a else a
        rows = jobs_by_id(engine)
        assert (rows[winner]["cancellation_id"], rows[loser]["cancellation_id"]) == (cid, None)
        assert watchdog.cancel(winner, cid).status is CancelStatus.REPLAYED
        assert watchdog.cancel(loser, cid).status is CancelStatus.CONFLICT


def test_concurrent_lane_failures_settle_each_job_once_and_leave_the_lane_empty(engine: Engine) -> None:
    """Four callers fail one lane at once, each calling again while ``more``:
    every live job is reported by exactly one of them, all end ``failed``,
    and a caller told ``more=False`` finds the lane empty."""
    count = store.LANE_FAILURE_BATCH * 2 + 17
    ids = [f"l{i:03d}" for i in range(count)]
    enqueue_jobs(engine, [Job(j, "q", lane="team:9") for j in ids] + [Job("elsewhere", "q", lane="team:1")])
    _tx(engine, store.claim, queues=["q"], limit=10, lease_ms=60_000)  # some running
    watchdog = Watchdog(engine)

    def fail_all() -> list[str]:
        taken: list[str] = []
        while True:
            failure = watchdog.fail_lane("team:9", "key revoked")
            taken += [job.job_id for job in failure.jobs]
            if not failure.more:
                assert not any(r["lane"] == "team:9" and r["state"] != "settled" for r in jobs_by_id(engine).values())
                return taken

    results = _together(*[fail_all] * 4)
    reported = Counter(j for taken in results for j in taken)
    assert set(reported) == set(ids) and max(reported.values()) == 1
    rows = jobs_by_id(engine)
    assert {rows[j]["outcome"] for j in ids} == {"failed"}
    assert rows["elsewhere"]["state"] != "settled"


def test_concurrent_purges_and_claims_take_each_queued_job_once(engine: Engine) -> None:
    """Purges racing each other and a claimer: each queued job is deleted by
    exactly one purge or claimed, never both, and the counts add up."""
    count = 300
    enqueue_jobs(engine, [Job(f"p{i:03d}", "q") for i in range(count)])
    watchdog = Watchdog(engine)
    purged_a, purged_b, batch = _together(
        lambda: watchdog.purge("q"),
        lambda: watchdog.purge("q"),
        lambda: _tx(engine, store.claim, queues=["q"], limit=50, lease_ms=60_000),
    )
    rows = jobs_by_id(engine)
    claimed = {c.job.job_id for c in batch.claimed}
    assert set(rows) == claimed
    assert all(r["state"] == "running" for r in rows.values())
    assert purged_a + purged_b + len(claimed) == count
    assert watchdog.purge("q") == 0
