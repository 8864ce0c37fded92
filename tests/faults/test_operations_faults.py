"""Fault tests of issue 10's operations: pruning racing the whole job life
cycle, and pauses racing claims, with real threads on real databases.

* A pruner looping ``Watchdog.prune(older_than=0)`` beside workers claiming
  and settling, a "dying" worker whose claims expire and a recoverer
  reconciling them never deletes a live job: every job enqueued is settled
  exactly once (the transition trigger's log) and is either still in the
  table or was deleted only after that settlement.
* A pause committed before a claim is never crossed: with the queue paused,
  hard-polling claimers take none of its jobs until the resume; on
  PostgreSQL, a pause raced against claims in a loop leaves no job whose
  claim statement started after the pause committed (both database clock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, select

from sqlalchemy_watchdog import Decision, Job, Watchdog, store
from sqlalchemy_watchdog.model import jobs_table
from tests.faults.helpers import db_now_ms, enqueue_jobs, jobs_by_id, transition_rows

T = TypeVar("T")

pytestmark = pytest.mark.slow


def _tx(engine: Engine, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` in a write transaction of its own, retried like the runner does."""

    def work() -> T:
        with engine.connect() as conn:
            return store.transact(conn, fn, *args, **kwargs)

    return store.retrying(work, what=getattr(fn, "__name__", "op"), attempts=30)


def _loop(stop: threading.Event, errors: list[BaseException], step: Callable[[], Any]) -> threading.Thread:
    def run() -> None:
        try:
            while not stop.is_set():
                step()
        except BaseException as error:  # reported by the test
            errors.append(error)
            stop.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_prune_racing_claims_settles_and_recoveries_never_deletes_a_live_job(instrumented: Engine) -> None:
    engine = instrumented
    ids = [f"job-{i}" for i in range(240)]
    # A few jobs only the dying claimer takes, without a recovery budget: each is
    # settled ``interrupted`` by a recovery, whatever the race between the threads
    # on "q" (where a job dies twice only by chance).
    doomed = [f"doomed-{i}" for i in range(4)]
    enqueue_jobs(engine, [Job(j, "doomed", lane="l0", max_recoveries=0) for j in doomed])
    enqueue_jobs(engine, [Job(j, "q", lane=f"l{i % 4}", max_recoveries=1) for i, j in enumerate(ids)])
    ids = doomed + ids
    stop = threading.Event()
    errors: list[BaseException] = []
    pruned: list[int] = []

    def work() -> None:
        batch = _tx(engine, store.claim, queues=["q"], limit=3, lease_ms=60_000)
        for claim in batch.claimed:
            decision = Decision.completed() if int(claim.job.job_id[4:]) % 3 else Decision.failed("no", retry=False)
            _tx(engine, store.settle, job_id=claim.job.job_id, claim_token=claim.token, decision=decision)
        if not batch.claimed:
            time.sleep(0.005)

    def die() -> None:  # claims and walks away: its leases end at once
        _tx(engine, store.claim, queues=["doomed", "q"], limit=1, lease_ms=1)
        time.sleep(0.01)

    def recover() -> None:
        for claim in _tx(engine, store.expired_claims, limit=10):
            _tx(engine, store.reconcile, claim)
        time.sleep(0.005)

    def prune() -> None:
        pruned.append(Watchdog(engine).prune(older_than=timedelta(0), batch=7))

    threads = [_loop(stop, errors, f) for f in (work, work, die, recover, prune)]
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        with engine.connect() as conn:
            left = conn.execute(select(jobs_table.c.job_id).where(jobs_table.c.state != "settled").limit(1)).first()
        if left is None:
            break
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    rows = jobs_by_id(engine)
    assert not [j for j, r in rows.items() if r["state"] != "settled"], "live jobs left after the drain"
    log = transition_rows(engine)
    into: dict[str, int] = {}
    for t in log:
        if t["new_state"] == "settled" and t["old_state"] != "settled":
            into[t["job_id"]] = into.get(t["job_id"], 0) + 1
    assert {j: into.get(j, 0) for j in ids if into.get(j, 0) != 1} == {}, "not settled exactly once"
    # Whatever is gone was pruned after its settlement: a job missing from the
    # table with no settlement logged would have vanished while live.
    gone = set(ids) - set(rows)
    assert sum(pruned) == len(gone) > 0, (sum(pruned), len(gone))
    assert not [t for t in log if t["old_state"] == "settled"], "a settled row changed"
    outcomes = {t["new_outcome"] for t in log if t["new_state"] == "settled"}
    assert {"completed", "failed", "interrupted"} <= outcomes, outcomes


def test_a_committed_pause_is_never_crossed_by_hard_polling_claimers(engine: Engine) -> None:
    wd = Watchdog(engine)
    assert wd.pause("p", reason="hold").value == "paused"
    enqueue_jobs(engine, [Job(f"p-{i}", "p") for i in range(30)] + [Job(f"o-{i}", "o") for i in range(30)])
    stop = threading.Event()
    errors: list[BaseException] = []
    taken: list[str] = []

    def poll() -> None:
        batch = _tx(engine, store.claim, queues=None, limit=4, lease_ms=60_000)
        for claim in batch.claimed:
            taken.append(claim.job.job_id)
            _tx(engine, store.settle, job_id=claim.job.job_id, claim_token=claim.token, decision=Decision.completed())

    threads = [_loop(stop, errors, poll) for _ in range(3)]
    time.sleep(1.5)
    paused_phase = list(taken)
    rows = jobs_by_id(engine)
    assert not [j for j in paused_phase if j.startswith("p-")], "a paused queue's job was claimed"
    assert all(rows[f"p-{i}"]["state"] == "queued" and rows[f"p-{i}"]["started_at"] is None for i in range(30))
    assert all(rows[f"o-{i}"]["state"] == "settled" for i in range(30)), "the other queue was not drained"
    assert wd.stats().queue("p").queued == 30
    assert wd.resume("p").value == "resumed"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(taken) < 60:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert sorted(taken) == sorted([f"p-{i}" for i in range(30)] + [f"o-{i}" for i in range(30)])


def test_pause_raced_against_claims_is_never_crossed_after_its_commit(engine: Engine) -> None:
    """PostgreSQL and MariaDB: claims race a pause; no claim statement that
    started after the pause committed (``started_at`` > the clock read after
    the commit) took a job of the paused queue."""
    if engine.dialect.name == "sqlite":
        pytest.skip("SQLite runs one writer at a time: a pause cannot race a claim")
    wd = Watchdog(engine)
    for round_ in range(12):
        ids = [f"r{round_}-{i}" for i in range(40)]
        enqueue_jobs(engine, [Job(j, "race") for j in ids])
        stop = threading.Event()
        errors: list[BaseException] = []

        def poll() -> None:
            if not _tx(engine, store.claim, queues=["race"], limit=1, lease_ms=60_000).claimed:
                time.sleep(0.001)

        threads = [_loop(stop, errors, poll) for _ in range(3)]
        time.sleep(0.01 * (round_ % 4))
        assert wd.pause("race").value == "paused"
        committed = db_now_ms(engine)
        time.sleep(0.2)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not errors, errors
        rows = jobs_by_id(engine)
        crossed = [j for j in ids if (s := rows[j]["started_at"]) is not None and s > committed]
        assert crossed == [], (round_, committed, [(j, rows[j]["started_at"]) for j in crossed])
        pause = wd.stats().queue("race").pause
        assert pause is not None and pause.paused_at.timestamp() * 1000 <= committed
        assert wd.resume("race").value == "resumed"
        with engine.begin() as conn:  # the next round starts with an empty queue
            conn.execute(jobs_table.delete().where(jobs_table.c.queue_name == "race"))
