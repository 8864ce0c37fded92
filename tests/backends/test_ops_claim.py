"""Conformance of the claim: order, queues, lanes, pauses, delayed jobs,
concurrent claimers, and cancellations settled by the claim.

Every backend runs this file (SQLite on a real file, PostgreSQL); see
``tests/backends/ops.py`` for how the operations are run.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Job, JobState, Outcome, Watchdog, store
from sqlalchemy_watchdog.jobs import CancelStatus, PauseStatus
from tests.backends.ops import LEASE_MS, add, claim, claim_one, claimed_ids, op, read, token_of


@pytest.mark.operation("claim")
def test_a_claim_runs_the_job_under_a_fresh_secret_token_and_a_lease_from_the_database_clock(db: Engine) -> None:
    add(db, Job("a", "q"), Job("b", "q"))
    first, second = claim_one(db), claim_one(db)
    assert first.job.job_id == "a" and first.job.state is JobState.RUNNING
    assert first.token and second.token and first.token != second.token
    assert token_of(db, "a") == first.token
    assert first.job.started_at is not None
    expiry = op(db, store.seconds_until_next_expiry)
    assert expiry is not None and LEASE_MS / 1000 - 30 <= expiry <= LEASE_MS / 1000


@pytest.mark.operation("claim")
def test_claim_order_is_priority_first_then_admission_order(db: Engine) -> None:
    add(db, Job("low", "q", priority=-1), Job("first", "q"), Job("high", "q", priority=7), Job("second", "q"))
    assert claimed_ids(claim(db, limit=4)) == ["high", "first", "second", "low"]


@pytest.mark.operation("claim")
def test_a_claim_takes_at_most_its_limit_and_nothing_when_nothing_is_ready(db: Engine) -> None:
    assert claim(db, limit=5) == store.ClaimBatch((), ())
    add(db, *(Job(f"j{n}", "q") for n in range(5)))
    assert claimed_ids(claim(db, limit=2)) == ["j0", "j1"]
    assert claimed_ids(claim(db, limit=10)) == ["j2", "j3", "j4"]
    assert claim(db, limit=10).claimed == ()  # running jobs are not claimed again


@pytest.mark.operation("claim")
def test_a_claim_takes_only_jobs_of_the_queues_it_names_best_first_across_them(db: Engine) -> None:
    add(db, Job("a1", "a"), Job("b1", "b", priority=1), Job("c1", "c", priority=9), Job("a2", "a"))
    assert claimed_ids(claim(db, ["a", "b"], limit=3)) == ["b1", "a1", "a2"]
    assert claim(db, []).claimed == ()
    assert claimed_ids(claim(db, ["c", "c"])) == ["c1"]


@pytest.mark.operation("claim", "pause", "resume")
def test_a_paused_queue_is_not_claimed_until_it_is_resumed(db: Engine) -> None:
    add(db, Job("p", "paused"), Job("o", "open"))
    assert op(db, store.pause, "paused", "deploy") is PauseStatus.PAUSED
    assert claimed_ids(claim(db, limit=5)) == ["o"]
    assert claim(db, ["paused"]).claimed == ()
    assert op(db, store.resume, "paused") is PauseStatus.RESUMED
    assert claimed_ids(claim(db, ["paused"])) == ["p"]


@pytest.mark.operation("claim", "cancel")
def test_a_job_cancelled_while_queued_is_settled_cancelled_by_the_claim_and_not_run(db: Engine) -> None:
    add(db, Job("doomed", "q", priority=1), Job("fine", "q"))
    assert op(db, store.cancel, "doomed", "stop-1").status is CancelStatus.RECORDED
    batch = claim(db, limit=5)
    assert claimed_ids(batch) == ["fine"]
    assert [(job.job_id, job.state, job.outcome) for job in batch.cancelled] == [
        ("doomed", JobState.SETTLED, Outcome.CANCELLED)
    ]
    assert read(db, "doomed").outcome is Outcome.CANCELLED
    assert claim(db, limit=5) == store.ClaimBatch((), ())


@pytest.mark.operation("claim", "promote", "next_ready_in", "make_due")
def test_a_delayed_job_is_claimed_only_after_promotion_once_due(db: Engine) -> None:
    assert op(db, store.next_ready_in) is None
    add(db, Job("later", "q"), delay=timedelta(hours=1))
    due_in = op(db, store.next_ready_in)
    assert due_in is not None and 3500 <= due_in <= 3600
    early = op(db, store.promote)  # nothing due: nothing promoted, and when the next one is
    assert early.promoted == 0 and early.next_in is not None and 3500 <= early.next_in <= 3600
    assert claim(db).claimed == ()
    assert op(db, store.make_due, ["q"]) == 1
    assert op(db, store.next_ready_in) == 0
    assert op(db, store.promote).promoted == 1
    assert read(db, "later").state is JobState.QUEUED
    assert claimed_ids(claim(db)) == ["later"]


@pytest.mark.operation("count_ready", "has_pending_work")
def test_ready_counts_see_queued_jobs_of_the_named_queues_up_to_the_cap(db: Engine) -> None:
    assert op(db, store.has_pending_work) is False
    add(db, *(Job(f"a{n}", "a") for n in range(4)), Job("b", "b"))
    assert op(db, store.has_pending_work) is True
    assert op(db, store.count_ready, ["a"], 10) == 4
    assert op(db, store.count_ready, ["a", "b"], 3) == 3
    assert op(db, store.count_ready, ["none"], 10) == 0
    claim(db, ["a"], limit=4)
    assert op(db, store.count_ready, ["a"], 10) == 0


@pytest.mark.operation("claim")
def test_concurrent_claimers_never_take_the_same_job_and_together_take_every_job(db: Engine) -> None:
    add(db, *(Job(f"j{n}", "q") for n in range(12)))
    start = threading.Barrier(3)
    taken: list[list[str]] = []
    lock = threading.Lock()

    def claimer() -> None:
        start.wait(5)
        for _ in range(3):
            ids = claimed_ids(claim(db, limit=2))
            with lock:
                taken.append(ids)

    threads = [threading.Thread(target=claimer) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    ids = [job_id for batch in taken for job_id in batch]
    assert len(ids) == len(set(ids))  # never one job twice
    ids += claimed_ids(claim(db, limit=12))  # what skipped locks left behind
    assert sorted(ids) == sorted(f"j{n}" for n in range(12))


@pytest.mark.operation("claim")
def test_a_claim_beside_an_uncommitted_claim_takes_the_next_job_and_never_the_held_one(db: Engine) -> None:
    """Row locks skip the held job (PostgreSQL: SKIP LOCKED, no wait); a
    backend with one writer at a time makes the second claim wait for the
    first's commit instead. Either way no job is claimed twice."""
    one_writer = db.dialect.name == "sqlite"
    add(db, Job("a", "q"), Job("b", "q"))
    other: list[list[str]] = []
    with db.connect() as holder:
        transaction = holder.begin()
        store.begin_write(holder)
        assert claimed_ids(store.claim(holder, queues=None, lease_ms=LEASE_MS)) == ["a"]
        second = threading.Thread(target=lambda: other.append(claimed_ids(claim(db))))
        second.start()
        second.join(0.2 if one_writer else 10)
        assert second.is_alive() is one_writer  # waits for the writer, or skips its locked row
        transaction.commit()
    second.join(10)
    assert other == [["b"]]
    assert claim(db).claimed == ()


@pytest.mark.operation("fail_lane")
def test_fail_lane_settles_the_lanes_live_jobs_failed_and_leaves_other_lanes_claimable(db: Engine) -> None:
    add(db, Job("r", "q", lane="bad"), Job("w", "q", lane="bad"), Job("ok", "q", lane="good"))
    running = claim_one(db)
    assert running.job.job_id == "r"
    failure = op(db, store.fail_lane, "bad", "the lane's host is down")
    assert sorted(job.job_id for job in failure.jobs) == ["r", "w"] and not failure.more
    for job_id in ("r", "w"):
        job = read(db, job_id)
        assert (job.state, job.outcome, job.failure_reason) == (
            JobState.SETTLED,
            Outcome.FAILED,
            "the lane's host is down",
        )
    assert claimed_ids(claim(db, limit=5)) == ["ok"]
    assert op(db, store.fail_lane, "bad", "again").jobs == ()


@pytest.mark.operation("fail_lane_in")
def test_the_clients_fail_lane_settles_the_lane_in_batches_until_none_is_live(db: Engine) -> None:
    add(db, Job("a", "q", lane="bad"), Job("b", "q", lane="bad"), Job("ok", "q"))
    failure = Watchdog(db).fail_lane("bad", "down")
    assert sorted(job.job_id for job in failure.jobs) == ["a", "b"] and failure.settled == 2 and not failure.more
    assert Watchdog(db).fail_lane("bad", "down").settled == 0
    assert claimed_ids(claim(db, limit=5)) == ["ok"]
