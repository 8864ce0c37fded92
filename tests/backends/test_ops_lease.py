"""Conformance of leases: renew, release, progress, expired claims and their
recovery (only one of two recoverers wins).

Every backend runs this file (SQLite on a real file, PostgreSQL); see
``tests/backends/ops.py`` for how the operations are run.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Decision, Job, JobState, Outcome, store
from sqlalchemy_watchdog.store import RecoveryCause, RecoveryStatus
from tests.backends.ops import LEASE_MS, add, claim, claim_one, end_lease, far_future, op, read, settle, token_of

NO_POLICY = "Execution disappeared without a recovery policy"


def _expiry(db: Engine) -> float:
    seconds = op(db, store.seconds_until_next_expiry)
    assert seconds is not None
    return seconds


@pytest.mark.operation("renew", "seconds_until_next_expiry")
def test_renew_extends_exactly_the_live_claims_it_names_and_reports_the_ones_still_held(db: Engine) -> None:
    assert op(db, store.seconds_until_next_expiry) is None  # nothing running
    add(db, Job("a", "q"), Job("b", "q"))
    a, b = claim(db, limit=2).claimed
    assert _expiry(db) <= LEASE_MS / 1000
    held = op(db, store.renew, [(a.job.job_id, a.token), (b.job.job_id, "stale")], lease_ms=10 * LEASE_MS)
    assert held == {"a"}
    assert _expiry(db) <= LEASE_MS / 1000  # b's lease was not extended: it ends first
    assert settle(db, b, Decision.completed()).status.value == "settled"
    assert _expiry(db) > 9 * LEASE_MS / 1000  # a's was
    assert op(db, store.renew, [], lease_ms=LEASE_MS) == set()


@pytest.mark.operation("renew")
def test_renew_after_the_lease_ended_is_lost_and_the_job_stays_recoverable(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db)
    assert op(db, store.renew, [("a", held.token)], lease_ms=LEASE_MS, now=far_future()) == set()
    end_lease(db, held)
    assert op(db, store.renew, [("a", held.token)], lease_ms=LEASE_MS) == set()
    assert [c.job.job_id for c in op(db, store.expired_claims, limit=10)] == ["a"]


@pytest.mark.operation("release", "expired_claims")
def test_release_ends_the_lease_now_and_leaves_the_job_running_for_recovery(db: Engine) -> None:
    add(db, Job("a", "q"), Job("b", "q"))
    a, b = claim(db, limit=2).claimed
    assert op(db, store.expired_claims, limit=10) == []
    assert op(db, store.release, [("a", a.token), ("b", "stale")]) == {"a"}
    assert op(db, store.release, []) == set()
    assert read(db, "a").state is JobState.RUNNING
    expired = op(db, store.expired_claims, limit=10)
    assert [(c.job.job_id, c.token) for c in expired] == [("a", a.token)]
    assert settle(db, a, Decision.completed()).status.value == "conflict"  # its lease is over
    assert b.job.job_id == "b" and read(db, "b").state is JobState.RUNNING


@pytest.mark.operation("expired_claims")
def test_expired_claims_lists_only_ended_leases_earliest_ending_first_up_to_the_limit(db: Engine) -> None:
    add(db, *(Job(f"j{n}", "q") for n in range(4)))
    claims = {c.job.job_id: c for c in claim(db, limit=4).claimed}
    end_lease(db, claims["j2"])
    end_lease(db, claims["j0"])
    assert [c.job.job_id for c in op(db, store.expired_claims, limit=10)] in (["j2", "j0"], ["j0", "j2"])
    assert len(op(db, store.expired_claims, limit=1)) == 1
    assert {c.job.job_id for c in op(db, store.expired_claims, limit=10)} == {"j0", "j2"}


@pytest.mark.operation("report_progress")
def test_progress_is_recorded_only_under_the_exact_live_claim(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db)
    assert op(db, store.report_progress, "a", held.token, 0.25, "a quarter") is True
    job = read(db, "a")
    assert (job.progress, job.progress_note) == (0.25, "a quarter")
    assert op(db, store.report_progress, "a", "stale", 0.5, None) is False
    assert op(db, store.report_progress, "a", held.token, 0.5, None, now=far_future()) is False
    assert (read(db, "a").progress, read(db, "a").progress_note) == (0.25, "a quarter")


@pytest.mark.operation("reconcile")
def test_reconcile_requeues_within_the_budget_then_settles_interrupted(db: Engine) -> None:
    add(db, Job("a", "q", max_recoveries=1), Job("none", "q"))
    for held in claim(db, limit=2).claimed:
        end_lease(db, held)
    by_id = {c.job.job_id: c for c in op(db, store.expired_claims, limit=10)}
    requeued = op(db, store.reconcile, by_id["a"])
    assert requeued.status is RecoveryStatus.REQUEUED and requeued.job is not None
    assert (requeued.job.state, requeued.job.recovery_count) == (JobState.QUEUED, 1)
    interrupted = op(db, store.reconcile, by_id["none"])
    assert interrupted.status is RecoveryStatus.SETTLED and interrupted.job is not None
    assert (interrupted.job.outcome, interrupted.job.failure_reason) == (Outcome.INTERRUPTED, NO_POLICY)
    again = claim_one(db)  # the requeued job runs again; its next loss exhausts the budget
    end_lease(db, again)
    (expired,) = op(db, store.expired_claims, limit=10)
    assert op(db, store.reconcile, expired).job.outcome is Outcome.INTERRUPTED  # type: ignore[union-attr]


@pytest.mark.operation("reconcile")
def test_a_stale_recovery_of_a_job_claimed_again_loses_the_race_and_changes_nothing(db: Engine) -> None:
    add(db, Job("a", "q", max_recoveries=3))
    end_lease(db, claim_one(db))
    (expired,) = op(db, store.expired_claims, limit=10)
    assert op(db, store.reconcile, expired).status is RecoveryStatus.REQUEUED
    again = claim_one(db)  # the job's next claim: a new token, a live lease
    before = read(db, "a")
    assert op(db, store.reconcile, expired).status is RecoveryStatus.LOST_RACE
    assert read(db, "a") == before
    assert settle(db, again, Decision.completed()).status.value == "settled"
    assert op(db, store.reconcile, expired).status is RecoveryStatus.LOST_RACE  # settled stays settled
    assert read(db, "a").outcome is Outcome.COMPLETED


@pytest.mark.operation("reconcile")
def test_of_two_recoverers_of_one_expired_claim_exactly_one_wins(db: Engine) -> None:
    add(db, Job("a", "q", max_recoveries=5))
    end_lease(db, claim_one(db))
    (expired,) = op(db, store.expired_claims, limit=10)
    (same,) = op(db, store.expired_claims, limit=10)
    start = threading.Barrier(2)
    results: list[RecoveryStatus] = []

    def recover(found: store.Claim) -> None:
        start.wait(5)
        results.append(op(db, store.reconcile, found).status)

    threads = [threading.Thread(target=recover, args=(found,)) for found in (expired, same)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == [RecoveryStatus.LOST_RACE, RecoveryStatus.REQUEUED]
    job = read(db, "a")
    assert (job.state, job.recovery_count) == (JobState.QUEUED, 1)  # recovered once, not twice


@pytest.mark.operation("release_and_recover")
def test_shutdown_recovery_ends_the_named_claims_and_recovers_them_within_their_budgets(db: Engine) -> None:
    add(db, Job("kept", "q", max_recoveries=2), Job("spent", "q"), Job("other", "q"))
    claims = {c.job.job_id: c for c in claim(db, limit=3).claimed}
    named = [(job_id, claims[job_id].token) for job_id in ("kept", "spent")]
    results = {r.job_id: r for r in op(db, store.release_and_recover, named, cause=RecoveryCause.SHUTDOWN)}
    assert results["kept"].status is RecoveryStatus.REQUEUED
    assert results["spent"].status is RecoveryStatus.SETTLED
    spent = read(db, "spent")
    assert spent.outcome is Outcome.INTERRUPTED and spent.failure_reason.startswith(store.SHUTDOWN_REASON)
    assert read(db, "other").state is JobState.RUNNING  # not named: untouched
    assert token_of(db, "other") == claims["other"].token


@pytest.mark.operation("start", "claim", "reconcile")
def test_a_job_claimed_ahead_is_marked_until_its_start_is_recorded_and_recovered_uncounted_if_never(
    db: Engine,
) -> None:
    """Revision w0019: a claim ahead marks its jobs; ``start`` clears the marks
    of exact, live, uncancelled claims (a stale one changes nothing); a job
    still marked when its lease ends is requeued with no recovery counted,
    whatever its budget, and one whose start was recorded is recovered as
    any running job."""
    add(db, Job("never", "q"), Job("started", "q"), Job("stale", "q"))
    never, started, stale = op(db, store.claim, queues=None, limit=3, lease_ms=LEASE_MS, ahead=True).claimed
    pairs = [(started.job.job_id, started.token), (stale.job.job_id, "stale-token")]
    assert op(db, store.start, pairs, lease_ms=LEASE_MS) == {"started"}
    assert op(db, store.start, [], lease_ms=LEASE_MS) == set()
    end_lease(db, never)
    end_lease(db, started)
    recovered = {}
    for expired in op(db, store.expired_claims, limit=10):
        recovered[expired.job.job_id] = op(db, store.reconcile, expired)
    assert (recovered["never"].status, recovered["never"].unstarted) == (RecoveryStatus.REQUEUED, True)
    assert read(db, "never").state is JobState.QUEUED and read(db, "never").recovery_count == 0
    assert (recovered["started"].status, recovered["started"].unstarted) == (RecoveryStatus.SETTLED, False)
    assert read(db, "started").outcome is Outcome.INTERRUPTED
