"""Conformance of dependencies: a job waits for its parents, runs once they
completed, reads their results, and is cancelled hop by hop when one did not.

Every backend runs this file (SQLite on a real file, PostgreSQL); see
``tests/backends/ops.py`` for how the operations are run.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Decision, Job, JobState, Outcome, store
from tests.backends.ops import add, claim, claim_one, claimed_ids, end_lease, op, read, settle


@pytest.mark.operation("relations", "parent_results")
def test_a_dependent_waits_for_its_parent_then_runs_and_reads_its_result(db: Engine) -> None:
    add(db, Job("parent", "q"), Job("child", "q", after=("parent",)))
    assert read(db, "child").state is JobState.WAITING
    assert op(db, store.relations, "child") == ((("parent", None),), ())
    assert op(db, store.relations, "parent") == ((), ("child",))
    assert [(p.job_id, p.state, p.outcome) for p in op(db, store.parent_results, "child")] == [
        ("parent", JobState.QUEUED, None)
    ]
    held = claim_one(db)
    assert held.job.job_id == "parent"  # the waiting child is not claimable
    settle(db, held, Decision.completed({"rows": 3}))
    assert read(db, "child").state is JobState.QUEUED  # released in the parent's settle
    assert op(db, store.relations, "child") == ((("parent", "completed"),), ())
    (parent,) = op(db, store.parent_results, "child")
    assert (parent.state, parent.outcome, parent.result) == (JobState.SETTLED, Outcome.COMPLETED, {"rows": 3})
    assert claimed_ids(claim(db)) == ["child"]


@pytest.mark.operation("propagate")
def test_a_cancellation_reaches_dependents_one_hop_per_propagation(db: Engine) -> None:
    add(
        db,
        Job("p", "q"),
        Job("child", "q", after=("p",)),
        Job("grandchild", "q", after=("child",)),
        Job("tolerant", "q", after=("p",), after_policy="any_outcome"),
    )
    assert op(db, store.propagate) == 0  # nothing to tell
    settle(db, claim_one(db), Decision.failed("broken", retry=False))
    child = read(db, "child")
    assert (child.outcome, child.failure_reason) == (Outcome.CANCELLED, "parent p ended failed")
    assert read(db, "tolerant").state is JobState.QUEUED
    assert read(db, "grandchild").state is JobState.WAITING
    assert op(db, store.propagate) == 1
    grandchild = read(db, "grandchild")
    assert (grandchild.outcome, grandchild.failure_reason) == (Outcome.CANCELLED, "parent child ended cancelled")
    assert op(db, store.propagate) == 1  # the grandchild's turn: it has no dependents to tell
    assert op(db, store.propagate) == 0


@pytest.mark.operation("waiting_for")
def test_waiting_for_lists_each_waiting_job_with_the_parents_it_still_waits_for(db: Engine) -> None:
    add(db, Job("p1", "a"), Job("p2", "b"), Job("w", "q", after=("p1", "p2")), Job("free", "q"))
    waiting = op(db, store.waiting_for, ["q"])
    assert list(waiting) == ["w"] and sorted(waiting["w"]) == [("p1", "a", "queued"), ("p2", "b", "queued")]
    settle(db, claim_one(db, ["a"]), Decision.completed())
    assert op(db, store.waiting_for, ["q"]) == {"w": [("p2", "b", "queued")]}
    assert op(db, store.waiting_for, ["a"]) == {} and op(db, store.waiting_for, []) == {}


@pytest.mark.operation("cancel", "claim", "fail_lane", "reconcile", "purge")
def test_every_statement_that_ends_a_live_parent_tells_its_dependents_in_its_own_transaction(db: Engine) -> None:
    """A claim finding a recorded cancellation, a lane failure, recovery
    settling ``interrupted`` and a purge end a parent as a settle does: its
    dependents are cancelled (the default policy) or released
    (``any_outcome``) when that operation commits, not by a later pass."""
    parents = {
        "cancelled": Job("cancelled", "c"),
        "lane": Job("lane", "l", lane="down"),
        "lost": Job("lost", "r"),
        "purged": Job("purged", "gone"),
    }
    add(db, *parents.values())
    add(db, *(Job(f"{name}-child", "kids", after=(name,)) for name in parents))
    add(db, *(Job(f"{name}-tolerant", "kids", after=(name,), after_policy="any_outcome") for name in parents))

    assert op(db, store.cancel, "cancelled", "stop-1").status.value == "recorded"
    assert claim(db, ["c"]).cancelled[0].job_id == "cancelled"  # the claim settles it cancelled
    op(db, store.fail_lane, "down", "the lane's host is down")
    end_lease(db, claim_one(db, ["r"]))
    (expired,) = op(db, store.expired_claims, limit=10)
    assert op(db, store.reconcile, expired).job.outcome is Outcome.INTERRUPTED  # type: ignore[union-attr]
    assert op(db, store.purge, "gone") == 1

    for name, outcome in (
        ("cancelled", "cancelled"),
        ("lane", "failed"),
        ("lost", "interrupted"),
        ("purged", "purged"),
    ):
        child = read(db, f"{name}-child")
        assert (child.state, child.outcome, child.failure_reason) == (
            JobState.SETTLED,
            Outcome.CANCELLED,
            f"parent {name} ended {outcome}",
        ), name
        assert read(db, f"{name}-tolerant").state is JobState.QUEUED, name
        assert op(db, store.relations, f"{name}-tolerant") == (((name, outcome),), ())


@pytest.mark.operation("cancel", "propagate")
def test_a_cancelled_waiting_job_is_settled_cancelled_at_once_and_its_dependents_are_told_by_the_next_pass(
    db: Engine,
) -> None:
    add(db, Job("p", "q"), Job("waits", "q", after=("p",)), Job("next", "q", after=("waits",)))
    assert op(db, store.cancel, "waits", "stop-waits").status.value == "recorded"
    waits = read(db, "waits")
    assert (waits.state, waits.outcome, waits.cancellation_id) == (JobState.SETTLED, Outcome.CANCELLED, "stop-waits")
    assert read(db, "next").state is JobState.WAITING  # one hop per transaction
    assert op(db, store.propagate) == 1
    assert read(db, "next").failure_reason == "parent waits ended cancelled"


@pytest.mark.operation("prune_batch")
def test_prune_keeps_a_parent_while_a_dependent_waits_and_deletes_it_once_that_dependent_settled(db: Engine) -> None:
    add(db, Job("p", "q"), Job("other", "q"), Job("child", "q", after=("p", "other")))
    settle(db, claim_one(db, ["q"]), Decision.completed())  # p: the child still waits for "other"
    assert op(db, store.prune_batch, older_than=timedelta(0)) == 0
    assert read(db, "p").outcome is Outcome.COMPLETED
    settle(db, claim_one(db, ["q"]), Decision.completed())  # other: the child is released
    settle(db, claim_one(db, ["q"]), Decision.completed())  # the child
    assert op(db, store.prune_batch, older_than=timedelta(0)) == 3
    assert op(db, store.relations, "p") == ((), ())  # the child's edges went with it
