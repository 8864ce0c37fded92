"""Conformance of maintenance: pruning, pauses, reruns, purges, bulk
actions, workers and schedules, and the testing helpers' operations.

Every backend runs this file (SQLite on a real file, PostgreSQL); see
``tests/backends/ops.py`` for how the operations are run.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Decision, InvalidJob, Job, JobState, store
from sqlalchemy_watchdog.jobs import EnqueueStatus, PauseStatus, rerun_job_id
from sqlalchemy_watchdog.store import BulkAction, BulkKind, ScheduleRecord, WorkerRegistration
from tests.backends.ops import add, claim, claim_one, claimed_ids, op, read, settle


def _settle_all(db: Engine, decision: Decision, queues: list[str] | None = None) -> None:
    for held in claim(db, queues, limit=50).claimed:
        settle(db, held, decision)


def _settled_a_moment_ago(db: Engine) -> None:
    time.sleep(0.02)  # the database clock moves past the settle


@pytest.mark.operation("prune_batch")
def test_prune_deletes_only_settled_jobs_old_enough_of_the_named_outcomes(db: Engine) -> None:
    add(db, Job("done", "q"), Job("failed", "q"), Job("running", "q"), Job("queued", "other"))
    done, failed, _running = claim(db, ["q"], limit=3).claimed
    settle(db, done, Decision.completed())
    settle(db, failed, Decision.failed("x", retry=False))
    _settled_a_moment_ago(db)
    assert op(db, store.prune_batch, older_than=timedelta(hours=1)) == 0  # too young
    assert op(db, store.prune_batch, older_than=timedelta(0), outcomes=["failed"]) == 1
    assert read(db, "failed") is None and read(db, "done") is not None
    assert op(db, store.prune_batch, older_than=timedelta(0), limit=10) == 1
    assert read(db, "done") is None
    assert {read(db, "running").state, read(db, "queued").state} == {JobState.RUNNING, JobState.QUEUED}
    assert [r.status for r in add(db, Job("done", "q"))] == [EnqueueStatus.QUEUED]  # a pruned job_id is free


@pytest.mark.operation("Pruning.run_batch")
def test_a_checked_pruning_deletes_at_most_one_batch_per_run(db: Engine) -> None:
    add(db, *(Job(f"j{n}", "q") for n in range(3)))
    _settle_all(db, Decision.completed())
    _settled_a_moment_ago(db)
    pruning = store.Pruning.of(timedelta(0), None, None, 2, False)
    assert op(db, pruning.run_batch, 2) == 2
    assert op(db, pruning.run_batch, 2) == 1
    assert op(db, store.list_jobs) == []


@pytest.mark.operation("prune_retention")
def test_retention_prunes_each_outcome_by_its_own_age(db: Engine) -> None:
    add(db, Job("ok", "q"), Job("bad", "q"))
    ok, bad = claim(db, limit=2).claimed
    settle(db, ok, Decision.completed())
    settle(db, bad, Decision.failed("x", retry=False))
    _settled_a_moment_ago(db)
    ages = {"completed": timedelta(0), "failed": timedelta(days=30)}
    assert op(db, store.prune_retention, ages, 10) == 1
    assert read(db, "ok") is None and read(db, "bad") is not None


@pytest.mark.operation("pause", "resume")
def test_pause_and_resume_report_what_they_changed_and_are_idempotent(db: Engine) -> None:
    assert op(db, store.resume, "q") is PauseStatus.NOT_PAUSED
    assert op(db, store.pause, "q", "deploy") is PauseStatus.PAUSED
    assert op(db, store.pause, "q") is PauseStatus.ALREADY_PAUSED
    add(db, Job("a", "q"))
    assert claim(db).claimed == ()
    assert op(db, store.resume, "q") is PauseStatus.RESUMED
    assert op(db, store.resume, "q") is PauseStatus.NOT_PAUSED
    assert claimed_ids(claim(db)) == ["a"]


@pytest.mark.operation("rerun")
def test_a_rerun_enqueues_a_copy_of_a_settled_job_once(db: Engine) -> None:
    add(db, Job("a", "q", priority=4, payload={"x": 1}, key="k"), Job("live", "q"))
    settle(db, claim_one(db), Decision.failed("x", retry=False))
    result = op(db, store.rerun, "a", "again")
    copy_id = rerun_job_id("a", "again")
    assert (result.job_id, result.status) == (copy_id, EnqueueStatus.QUEUED)
    copy = read(db, copy_id)
    assert (copy.state, copy.rerun_of, copy.priority, copy.payload, copy.key) == (
        JobState.QUEUED,
        "a",
        4,
        {"x": 1},
        "k",
    )
    assert op(db, store.rerun, "a", "again").status is EnqueueStatus.DUPLICATE
    with pytest.raises(InvalidJob):
        op(db, store.rerun, "live", "again")  # only a settled job
    with pytest.raises(InvalidJob):
        op(db, store.rerun, "ghost", "again")


@pytest.mark.operation("purge")
def test_purge_deletes_the_queues_jobs_that_have_not_started_and_nothing_else(db: Engine) -> None:
    add(db, Job("run", "q"), Job("wait1", "q"), Job("other", "o"))
    add(db, Job("later", "q"), delay=timedelta(hours=1))
    held = claim_one(db, ["q"])
    assert op(db, store.purge, "q") == 2
    assert [read(db, job_id) for job_id in ("wait1", "later")] == [None, None]
    assert read(db, "run").state is JobState.RUNNING and read(db, "other").state is JobState.QUEUED
    assert held.job.job_id == "run" and op(db, store.purge, "q") == 0


@pytest.mark.operation("bulk_batch", "newest_sequence")
def test_a_bulk_cancel_acts_in_batches_on_the_selected_live_jobs_below_its_end(db: Engine) -> None:
    assert op(db, store.newest_sequence) == 0
    add(db, *(Job(f"c{n}", "q") for n in range(3)), Job("spared", "other"))
    end = op(db, store.newest_sequence)
    assert end == read(db, "spared").sequence
    add(db, Job("after-end", "q"))
    action = BulkAction.of(BulkKind.CANCEL, "bulk-1", queue="q")
    first = op(db, store.bulk_batch, action, 0, end, 2)
    assert (first.picked, first.done) == (2, ("c0", "c1"))
    assert first.last_sequence is not None
    second = op(db, store.bulk_batch, action, first.last_sequence, end, 2)
    assert (second.picked, second.done) == (1, ("c2",))
    assert read(db, "after-end").cancellation_id is None and read(db, "spared").cancellation_id is None
    again = op(db, store.bulk_batch, action, 0, end, 10)
    assert again.done == () and len(again.repeated) + len(again.skipped) == again.picked


@pytest.mark.operation("bulk_batch")
def test_a_bulk_rerun_copies_the_selected_settled_jobs_and_a_dry_run_writes_nothing(db: Engine) -> None:
    add(db, Job("f1", "q"), Job("ok", "q"), Job("f2", "q"))
    for held in claim(db, limit=3).claimed:
        settle(db, held, Decision.completed() if held.job.job_id == "ok" else Decision.failed("x", retry=False))
    end = op(db, store.newest_sequence)
    dry = BulkAction.of(BulkKind.RERUN, "r1", outcome="failed", dry_run=True)
    assert op(db, store.bulk_batch, dry, 0, end, 10).matched == 2
    assert op(db, store.newest_sequence) == end
    step = op(db, store.bulk_batch, BulkAction.of(BulkKind.RERUN, "r1", outcome="failed"), 0, end, 10)
    assert step.done == (rerun_job_id("f1", "r1"), rerun_job_id("f2", "r1"))
    assert read(db, rerun_job_id("f1", "r1")).rerun_of == "f1"


def _registration(worker_id: str, queues: tuple[str, ...]) -> WorkerRegistration:
    return WorkerRegistration(worker_id, "host-1", 4242, queues, 4, "poll", "1.0", 1000)


@pytest.mark.operation("register_worker", "workers", "live_workers_per_queue", "deregister_worker", "prune_workers")
def test_workers_register_refresh_show_and_leave(db: Engine) -> None:
    op(db, store.register_worker, _registration("w1", ("a", "b")))
    op(db, store.register_worker, _registration("w2", ("b",)), 3)
    op(db, store.register_worker, _registration("w1", ("a", "b")), 2)  # a heartbeat: refreshed, not doubled
    shown = {w.worker_id: w for w in op(db, store.workers)}
    assert sorted(shown) == ["w1", "w2"]
    assert (shown["w1"].queues, shown["w1"].running, shown["w1"].concurrency) == (("a", "b"), 2, 4)
    assert (shown["w2"].running, shown["w2"].host, shown["w2"].pid) == (3, "host-1", 4242)
    assert op(db, store.live_workers_per_queue) == {"a": 1, "b": 2}
    assert op(db, store.prune_workers) == 0  # live workers are kept
    op(db, store.deregister_worker, "w1")
    assert [w.worker_id for w in op(db, store.workers)] == ["w2"]
    assert op(db, store.live_workers_per_queue) == {"b": 1}


@pytest.mark.operation("record_schedules", "schedules")
def test_recorded_schedules_are_listed_current_and_a_second_definition_is_disputed(db: Engine) -> None:
    record = ScheduleRecord("nightly", "fp1", "0 3 * * *", "UTC", "reports", 1_900_000_000_000, None)
    op(db, store.record_schedules, [record], "w1")
    op(db, store.record_schedules, [], "w1")
    (shown,) = op(db, store.schedules)
    assert (shown.name, shown.cron, shown.queue, shown.recorded_by) == ("nightly", "0 3 * * *", "reports", "w1")
    assert shown.current and not shown.disputed and shown.next_slot is not None
    op(db, store.record_schedules, [ScheduleRecord("nightly", "fp2", "0 4 * * *", "UTC", "reports", None, None)], "w2")
    listed = op(db, store.schedules)
    assert sorted(s.fingerprint for s in listed) == ["fp1", "fp2"] and all(s.disputed for s in listed)


@pytest.mark.operation("make_due", "waiting_jobs")
def test_make_due_readies_only_the_named_queues_delayed_jobs(db: Engine) -> None:
    add(db, Job("d1", "a"), Job("d2", "b"), delay=timedelta(hours=1))
    add(db, Job("ready", "a"))
    assert sorted(op(db, store.waiting_jobs, ["a"])) == [("d1", "delayed"), ("ready", "queued")]
    assert op(db, store.make_due, ["a"]) == 1
    assert op(db, store.make_due, []) == 0
    op(db, store.promote)
    assert sorted(claimed_ids(claim(db, limit=5))) == ["d1", "ready"]
    assert read(db, "d2").state is JobState.DELAYED
    assert op(db, store.waiting_jobs, ["a"]) == [] and op(db, store.waiting_jobs, []) == []
    assert op(db, store.make_due) == 1 and read(db, "d2").outcome is None


@pytest.mark.operation("register_worker", "workers")
def test_a_worker_serving_queue_lists_over_64_kib_is_registered_with_every_queue(db: Engine) -> None:
    """The queue lists hold up to 65,536 characters: as UTF-8 more bytes than
    MariaDB's TEXT holds, so they are LONGTEXT there (revision w0023)."""
    names = tuple(f"{n:03}" + "é" * 200 for n in range(300))
    assert len(json.dumps(names, ensure_ascii=False).encode()) > 100_000
    registration = _registration("w1", names)
    op(db, store.register_worker, replace(registration, process_queues=names[:150]))
    (shown,) = op(db, store.workers)
    assert shown.queues == names and shown.process_queues == names[:150]
