"""Conformance of the reads: one job, a queue's head, settled jobs, the
paged and filtered listing, the statistics and the throughput chart.

Every backend runs this file (SQLite on a real file, PostgreSQL); see
``tests/backends/ops.py`` for how the operations are run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Decision, InvalidJob, Job, JobState, JobView, Outcome, store
from tests.backends.ops import add, claim, claim_one, end_lease, op, read, settle


@pytest.mark.operation("read", "read_claim")
def test_read_returns_the_job_as_stored_and_read_claim_adds_its_current_token(db: Engine) -> None:
    assert read(db, "ghost") is None and op(db, store.read_claim, "ghost") is None
    add(db, Job("a", "q", lane="l", priority=2, payload={"k": [1, "é"]}, max_recoveries=3, key="tenant"))
    job = read(db, "a")
    assert (job.job_id, job.queue, job.lane, job.priority, job.payload) == ("a", "q", "l", 2, {"k": [1, "é"]})
    assert (job.max_recoveries, job.key, job.state) == (3, "tenant", JobState.QUEUED)
    assert op(db, store.read_claim, "a") == (job, None)
    held = claim_one(db)
    assert op(db, store.read_claim, "a") == (read(db, "a"), held.token)
    with pytest.raises(InvalidJob):
        read(db, "")


@pytest.mark.operation("read_queue_head")
def test_the_queue_head_is_its_running_job_else_the_next_one_a_claim_would_take(db: Engine) -> None:
    assert op(db, store.read_queue_head, "q") is None
    add(db, Job("low", "q"), Job("high", "q", priority=9), Job("elsewhere", "o", priority=99))
    assert op(db, store.read_queue_head, "q").job_id == "high"  # type: ignore[union-attr]
    held = claim_one(db, ["q"])
    assert op(db, store.read_queue_head, "q").job_id == "high"  # type: ignore[union-attr]
    settle(db, held, Decision.completed())
    assert op(db, store.read_queue_head, "q").job_id == "low"  # type: ignore[union-attr]


@pytest.mark.operation("read_settled")
def test_read_settled_pages_settled_jobs_in_admission_order(db: Engine) -> None:
    add(db, *(Job(f"j{n}", "q") for n in range(4)))
    for held in claim(db, limit=3).claimed:
        settle(db, held, Decision.completed())
    first = op(db, store.read_settled, 2)
    assert [job.job_id for job in first] == ["j0", "j1"]
    rest = op(db, store.read_settled, 2, first[-1].sequence)
    assert [job.job_id for job in rest] == ["j2"]  # j3 has not settled
    assert op(db, store.read_settled, 2, rest[-1].sequence) == []


@pytest.mark.operation("read_with_reruns", "read_with_pause")
def test_a_detailed_read_lists_reruns_relations_and_the_queues_pause(db: Engine) -> None:
    add(db, Job("p", "q"), Job("child", "q", after=("p",)))
    settle(db, claim_one(db), Decision.failed("x", retry=False))
    op(db, store.rerun, "p", "r1")
    detailed = op(db, store.read_with_reruns, "p")
    assert detailed is not None and len(detailed.reruns) == 1 and detailed.dependents == ("child",)
    assert op(db, store.read_with_reruns, "ghost") is None
    assert op(db, store.read_with_pause, "p") == (detailed, None)
    op(db, store.pause, "q", "maintenance")
    found = op(db, store.read_with_pause, "p")
    assert found is not None and found[1] is not None and found[1].reason == "maintenance"
    assert op(db, store.read_with_pause, "ghost") is None


def ids(jobs: Sequence[JobView]) -> list[str]:
    return [job.job_id for job in jobs]


@pytest.mark.operation("list_jobs")
def test_list_jobs_pages_by_sequence_both_ways_and_filters(db: Engine) -> None:
    add(db, *(Job(f"a{n}", "qa", lane="x") for n in range(3)), Job("b0", "qb"), Job("b1", "qb"))
    page = op(db, store.list_jobs, limit=2)
    assert ids(page) == ["a0", "a1"]
    assert ids(op(db, store.list_jobs, limit=2, after_sequence=page[-1].sequence)) == ["a2", "b0"]
    newest = op(db, store.list_jobs, limit=2, newest_first=True)
    assert ids(newest) == ["b1", "b0"]
    assert ids(op(db, store.list_jobs, newest_first=True, before_sequence=newest[-1].sequence, limit=1)) == ["a2"]
    assert ids(op(db, store.list_jobs, queue="qb")) == ["b0", "b1"]
    assert ids(op(db, store.list_jobs, lane="x")) == ["a0", "a1", "a2"]
    assert ids(op(db, store.list_jobs, job_id_prefix="b")) == ["b0", "b1"]
    settle(db, claim_one(db), Decision.failed("x", retry=False))
    assert ids(op(db, store.list_jobs, state="settled")) == ["a0"]
    assert ids(op(db, store.list_jobs, outcome=Outcome.FAILED)) == ["a0"]
    assert ids(op(db, store.list_jobs, state=JobState.QUEUED, queue="qa")) == ["a1", "a2"]
    assert [job.payload for job in op(db, store.list_jobs, with_payload=False)] == [None] * 5
    with pytest.raises(InvalidJob):
        op(db, store.list_jobs, limit=0)


@pytest.mark.operation("stats")
def test_stats_count_each_queues_jobs_by_state_recent_outcomes_and_expired_leases(db: Engine) -> None:
    assert op(db, store.stats).queues == ()
    add(db, Job("done", "q"), Job("lost", "q"), Job("running", "q"), Job("ready", "q"), Job("o", "other"))
    add(db, Job("later", "q"), delay=timedelta(hours=1))
    done, lost, _running = claim(db, ["q"], limit=3).claimed
    settle(db, done, Decision.completed())
    end_lease(db, lost)
    op(db, store.pause, "other")
    stats = op(db, store.stats)
    q = stats.queue("q")
    assert (q.queued, q.delayed, q.running, q.expired_leases) == (1, 1, 2, 1)
    assert q.settled_last_minute.get(Outcome.COMPLETED) == 1 and q.settled_last_hour.get(Outcome.COMPLETED) == 1
    assert q.oldest_ready_age is not None and q.pause is None
    other = stats.queue("other")
    assert other.queued == 1 and other.pause is not None


@pytest.mark.operation("throughput")
def test_throughput_counts_the_last_hours_settlements_per_queue_and_outcome(db: Engine) -> None:
    assert op(db, store.throughput).queues == {}
    add(db, Job("a", "q"), Job("b", "q"), Job("c", "q"))
    a, b, _c = claim(db, limit=3).claimed
    settle(db, a, Decision.completed())
    settle(db, b, Decision.failed("x", retry=False))
    chart = op(db, store.throughput)
    per_minute = chart.queues["q"]
    assert sum(per_minute[Outcome.COMPLETED]) == 1 and sum(per_minute[Outcome.FAILED]) == 1
    assert per_minute[Outcome.COMPLETED][-1] == 1  # the last minute, ending at the database clock
