"""Jobs claimed ahead and never started go back to the queue uncounted
(revision w0019), on SQLite and on PostgreSQL.

A claim ahead of the runner's free slots marks its jobs ``unstarted``; the
runner clears the marks of the jobs it is about to start, in one statement
guarded by the exact claim and a live lease (``store.start``); recovery
requeues a job still marked without counting a recovery, whatever its
budget. Every other way out of ``running`` clears the mark (the CHECK
``unstarted_running`` refuses a mark on a job that is not running).
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from sqlalchemy_watchdog import Decision, Job, JobState, Outcome, store
from sqlalchemy_watchdog.jobs import SettleStatus
from sqlalchemy_watchdog.store import Claim

from .test_store_ops import LEASE_MS, add, cancel, end_lease, expired, far_future, row, run, settle

NO_POLICY = "Execution disappeared without a recovery policy"


def claim_ahead(engine: Engine, limit: int = 1) -> list[Claim]:
    batch = run(engine, store.claim, queues=None, limit=limit, lease_ms=LEASE_MS, ahead=True)
    return list(batch.claimed)


def reconcile(engine: Engine, job_id: str) -> store.Recovery:
    end_lease(engine, job_id)
    (found,) = [c for c in expired(engine) if c.job.job_id == job_id]
    return run(engine, store.reconcile, found)


def unstarted(engine: Engine, job_id: str) -> int | None:
    stored = row(engine, job_id)
    assert stored is not None
    value: int | None = stored["unstarted"]
    return value


def test_a_claim_ahead_marks_every_job_it_takes_and_a_plain_claim_none(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q"), Job("c", "q"))
    assert sorted(c.job.job_id for c in claim_ahead(engine, 2)) == ["a", "b"]
    run(engine, store.claim, queues=None, limit=1, lease_ms=LEASE_MS)
    assert [unstarted(engine, j) for j in "abc"] == [1, 1, None]


def test_a_start_clears_the_marks_of_exact_live_claims_in_one_statement_and_renews_them(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q"))
    a, b = claim_ahead(engine, 2)
    before = row(engine, a.job.job_id)["lease_until"]  # type: ignore[index]
    held = run(engine, store.start, [(a.job.job_id, a.token), (b.job.job_id, b.token)], lease_ms=LEASE_MS * 2)
    assert held == {"a", "b"}
    assert unstarted(engine, "a") is None and unstarted(engine, "b") is None
    assert row(engine, a.job.job_id)["lease_until"] > before  # type: ignore[index]
    assert run(engine, store.start, [], lease_ms=LEASE_MS) == set()


def test_a_stale_claim_cannot_record_a_start(engine: Engine) -> None:
    """A wrong token, an ended lease (by ``max(now, database clock)``) or a
    recorded cancellation: nothing changes, and the handler must not start."""
    add(engine, Job("a", "q"), Job("b", "q"), Job("c", "q"))
    _, b, c = claim_ahead(engine, 3)
    cancel(engine, "c", "stop-c")
    before = {j: row(engine, j) for j in "abc"}
    assert run(engine, store.start, [("a", "claim_wrong")], lease_ms=LEASE_MS) == set()
    assert run(engine, store.start, [("b", b.token)], lease_ms=LEASE_MS, now=far_future()) == set()
    assert run(engine, store.start, [("c", c.token)], lease_ms=LEASE_MS) == set()
    assert {j: row(engine, j) for j in "abc"} == before
    assert [unstarted(engine, j) for j in "abc"] == [1, 1, 1]


@pytest.mark.parametrize("max_recoveries", [None, 0, 2], ids=["no-policy", "zero-budget", "within-budget"])
def test_recovery_requeues_a_job_claimed_ahead_and_never_started_without_counting(
    engine: Engine, max_recoveries: int | None
) -> None:
    add(engine, Job("a", "q", max_recoveries=max_recoveries))
    claim_ahead(engine)
    recovery = reconcile(engine, "a")
    assert (recovery.status, recovery.unstarted) == (store.RecoveryStatus.REQUEUED, True)
    stored = row(engine, "a")
    assert stored is not None
    assert (stored["state"], stored["outcome"], stored["recovery_count"], stored["attempt"]) == ("queued", None, 0, 1)
    assert (stored["claim_token"], stored["lease_until"], stored["unstarted"]) == (None, None, None)
    # It runs later like any queued job.
    (again,) = claim_ahead(engine)
    assert again.job.job_id == "a" and again.job.recovery_count == 0


def test_a_job_whose_start_was_recorded_is_recovered_as_any_running_job(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q", max_recoveries=1))
    a, b = claim_ahead(engine, 2)
    assert run(engine, store.start, [("a", a.token), ("b", b.token)], lease_ms=LEASE_MS) == {"a", "b"}
    interrupted = reconcile(engine, "a")
    assert (interrupted.status, interrupted.unstarted) == (store.RecoveryStatus.SETTLED, False)
    assert interrupted.job is not None
    assert (interrupted.job.outcome, interrupted.job.failure_reason) == (Outcome.INTERRUPTED, NO_POLICY)
    requeued = reconcile(engine, "b")
    assert (requeued.status, requeued.unstarted) == (store.RecoveryStatus.REQUEUED, False)
    assert requeued.job is not None and requeued.job.recovery_count == 1


def test_a_retried_job_claimed_ahead_and_requeued_uncounted_keeps_its_last_failure(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    (first,) = claim_ahead(engine)
    run(engine, store.start, [("a", first.token)], lease_ms=LEASE_MS)
    retry = store.SettleRequest("a", first.token, Decision.failed("boom"), requeue_after_ms=0)
    assert run(engine, store.settle_many, [retry])[0].status is SettleStatus.REQUEUED
    claim_ahead(engine)
    reconcile(engine, "a")
    stored = row(engine, "a")
    assert stored is not None
    assert (stored["state"], stored["attempt"], stored["failure_reason"]) == ("queued", 2, "boom")


def test_a_cancelled_job_claimed_ahead_is_settled_cancelled_by_recovery(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim_ahead(engine)
    cancel(engine, "a", "stop-a")
    recovery = reconcile(engine, "a")
    assert recovery.job is not None
    assert (recovery.job.state, recovery.job.outcome, recovery.unstarted) == (
        JobState.SETTLED,
        Outcome.CANCELLED,
        False,
    )
    assert unstarted(engine, "a") is None


def test_a_settle_or_a_lane_failure_clears_the_mark(engine: Engine) -> None:
    """A job claimed ahead may settle without starting (given back, cancelled,
    stopped): the mark never outlives ``running``."""
    add(engine, Job("a", "q"), Job("b", "q", lane="l"))
    a, _ = claim_ahead(engine, 2)
    assert settle(engine, a, Decision.failed("stopped before it started")).status is SettleStatus.SETTLED
    run(engine, store.fail_lane, "l", "lane down")
    assert (unstarted(engine, "a"), unstarted(engine, "b")) == (None, None)
    assert row(engine, "b")["state"] == "settled"  # type: ignore[index]


def test_the_database_refuses_a_mark_outside_running_or_other_than_1(engine: Engine) -> None:
    add(engine, Job("queued", "q"), Job("running", "r"))
    run(engine, store.claim, queues=["r"], limit=1, lease_ms=LEASE_MS)
    with pytest.raises(IntegrityError, match="unstarted_running"), engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET unstarted = 1 WHERE job_id = 'queued'"))
    with pytest.raises(IntegrityError, match="unstarted_flag"), engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET unstarted = 2 WHERE job_id = 'running'"))
