"""Bulk actions racing the rest of the queue, each race made to happen at
its worst moment (no sleeps, no luck), on PostgreSQL, where a bulk batch and
its racer run at once. On SQLite a batch holds the write lock for its whole
transaction, so nothing can interleave with it: the races cannot happen.

* A prune while a bulk rerun's batch is open (its copies enqueued, not yet
  committed) skips the originals being copied -- they are share-locked
  (``FOR KEY SHARE``) until the batch commits -- so no copy commits naming a
  job the prune deleted under it; the next prune takes them as usual.
* A runner settling a job between a bulk cancellation's pick and its
  cancel: the job keeps its outcome, the bulk reports it skipped, and its
  other jobs are cancelled.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Decision, Job, JobState, Outcome, Watchdog, metadata, store
from sqlalchemy_watchdog.store import SettleRequest


@pytest.fixture
def pg(postgres_url: URL) -> Iterator[Engine]:
    """The PostgreSQL test database with fresh tables."""
    engine = create_engine(postgres_url)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    yield engine
    engine.dispose()


def _settled(engine: Engine, *job_ids: str) -> None:
    Watchdog(engine).enqueue([Job(job_id, "mail") for job_id in job_ids])
    with store.write_transaction(engine) as conn:
        batch = store.claim(conn, queues=["mail"], limit=len(job_ids), lease_ms=60_000)
        store.settle_many(
            conn, [SettleRequest(c.job.job_id, c.token, Decision.failed("down", retry=False)) for c in batch.claimed]
        )


def test_a_prune_during_a_bulk_rerun_batch_skips_the_originals_being_copied(pg: Engine) -> None:
    _settled(pg, "a", "b", "c")
    watchdog = Watchdog(pg)
    action = store.BulkAction.of(store.BulkKind.RERUN, "r1", queue="mail")
    with pg.connect() as conn:
        with conn.begin():
            end = store.newest_sequence(conn)
            step = store.bulk_batch(conn, action, 0, end, 100)
            assert step.done == ("a~rerun~r1", "b~rerun~r1", "c~rerun~r1")
            # The batch is open: a prune of every settled job meanwhile.
            assert watchdog.prune(older_than=timedelta(0)) == 0
        # Committed: every copy names an original that is there.
    for copy in step.done:
        view = watchdog.read(copy)
        assert view is not None and view.state is JobState.QUEUED
        assert watchdog.read(view.rerun_of or "") is not None
    assert watchdog.prune(older_than=timedelta(0)) == 3  # and now they go, as usual


def test_a_job_settled_by_its_runner_during_a_bulk_cancel_keeps_its_outcome(pg: Engine) -> None:
    watchdog = Watchdog(pg)
    watchdog.enqueue([Job("run-1", "mail"), Job("wait-1", "mail"), Job("wait-2", "mail")])
    with store.write_transaction(pg) as conn:
        [claim] = store.claim(conn, queues=["mail"], limit=1, lease_ms=60_000).claimed
    assert claim.job.job_id == "run-1"
    settled: list[Any] = []

    def settle_after_the_pick(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM watchdog_jobs" in statement and "ORDER BY watchdog_jobs.sequence" in statement and not settled:
            with store.write_transaction(pg) as other:  # the runner, on a connection of its own
                settled.append(
                    store.settle_many(other, [SettleRequest(claim.job.job_id, claim.token, Decision.completed())])
                )

    own = create_engine(pg.url)
    event.listen(own, "after_cursor_execute", settle_after_the_pick)
    try:
        result = Watchdog(own).cancel_many(cancellation_id="stop", queue="mail")
    finally:
        own.dispose()
    assert settled, "the runner's settle ran between the pick and the cancel"
    assert result.matched == 3
    assert result.done == ("wait-1", "wait-2")
    assert [skip.job_id for skip in result.skipped] == ["run-1"]
    assert "settled meanwhile" in result.skipped[0].why
    job = watchdog.read("run-1")
    assert job is not None and (job.outcome, job.cancellation_id) == (Outcome.COMPLETED, None)
