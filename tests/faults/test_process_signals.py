"""Real worker processes killed, frozen and stopped by signals (faults 1-4).

Each test runs ``tests/faults/chaos_worker.py`` processes against a real
database (an SQLite file shared by the processes, and PostgreSQL), signals
them at a precise moment, and reads the outcome from the database: the
rows, the trigger-fed transition log and the handlers' audit trail. Each
case runs with ``Runner`` workers and with ``AsyncRunner`` workers
(``runner_kind``; ``chaos_worker.py --asyncio``).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, store
from sqlalchemy_watchdog.store import NO_POLICY_REASON, SHUTDOWN_REASON
from tests.faults.helpers import (
    WorkerPool,
    assert_settled_exactly_once,
    audit_rows,
    db_now_ms,
    enqueue_jobs,
    first_ended_audit_row,
    jobs_by_id,
    transition_rows,
    wait_until,
)

LEASE = 3.0
HEARTBEAT = 0.5
TIMING = {"lease": LEASE, "heartbeat": HEARTBEAT, "poll": 0.2}


def kind(runner_kind: str) -> dict[str, bool]:
    """The worker options of ``runner_kind``."""
    return {"asyncio": runner_kind == "async"}


def _first_recovery(engine: Engine, job_id: str, token: str) -> dict[str, Any]:
    """The transition that took the job away from the dead claim ``token``."""
    for t in transition_rows(engine, job_id):
        if t["old_state"] == "running" and t["old_token"] == token and t["new_state"] != "running":
            return t
    raise AssertionError(f"no recovery transition of {job_id} from {token}")


def test_sigkill_mid_handler_recovers_within_budget_else_interrupts(
    instrumented: Engine, db_url: URL, workers: WorkerPool, runner_kind: str
) -> None:
    """Fault 1. Three jobs die with their worker mid-handler. After the lease
    (never before it) another runner requeues and completes the one with a
    budget, and settles the others ``interrupted`` with the documented reason."""
    engine = instrumented
    block = {"action": "block", "only_first": 1}
    victims = {
        "with-budget": 1,  # requeued once, then completed
        "no-policy": None,  # interrupted: no recovery policy
        "zero-budget": 0,  # interrupted: budget of 0 recoveries exhausted
    }
    jobs = [Job(j, "chaos", payload=block, max_recoveries=m, priority=9) for j, m in victims.items()]
    jobs += [Job(f"bystander-{i}", "chaos", max_recoveries=1) for i in range(5)]
    enqueue_jobs(engine, jobs)

    w1 = workers.start(db_url, "w1", concurrency=3, **TIMING, **kind(runner_kind))
    wait_until(lambda: len(audit_rows(engine)) >= 3, timeout=60, what="three handlers to start")
    assert {a["job_id"] for a in audit_rows(engine)} == set(victims)
    w1.kill()
    assert w1.proc.returncode == -signal.SIGKILL
    # The dead claims: their last lease, now that nothing renews it.
    dead = {j: (row["claim_token"], row["lease_until"]) for j, row in jobs_by_id(engine).items() if j in victims}
    assert all(
        row_state == "running" for row_state in (r["state"] for j, r in jobs_by_id(engine).items() if j in victims)
    )

    w2 = workers.start(db_url, "w2", concurrency=2, **TIMING, **kind(runner_kind))
    wait_until(
        lambda: all(r["state"] == "settled" for r in jobs_by_id(engine).values()),
        timeout=60,
        what="every job to settle",
    )
    rows = assert_settled_exactly_once(engine, [j.job_id for j in jobs])

    for job_id, (token, lease_until) in dead.items():
        recovery = _first_recovery(engine, job_id, token)
        assert recovery["at_ms"] >= lease_until, f"{job_id} recovered before its lease ended"

    assert rows["with-budget"]["outcome"] == "completed"
    assert rows["with-budget"]["recovery_count"] == 1
    runs = audit_rows(engine, "with-budget")
    assert [r["pid"] for r in runs] == [w1.pid, w2.pid]
    assert runs[0]["ended_ms"] is None and runs[1]["ended_ms"] is not None

    assert rows["no-policy"]["outcome"] == "interrupted"
    assert rows["no-policy"]["failure_reason"] == NO_POLICY_REASON
    assert rows["zero-budget"]["outcome"] == "interrupted"
    assert rows["zero-budget"]["failure_reason"] == "Restart recovery budget exhausted (0 recoveries)"
    for job_id in ("no-policy", "zero-budget"):
        assert len(audit_rows(engine, job_id)) == 1, f"{job_id} ran again without a budget"
    assert all(rows[f"bystander-{i}"]["outcome"] == "completed" for i in range(5))
    assert w2.alive


@pytest.mark.parametrize("phase", ["before", pytest.param("after", marks=pytest.mark.slow)])
def test_sigkill_after_handler_returned_before_settle_commit(
    instrumented: Engine, db_url: URL, workers: WorkerPool, phase: str, runner_kind: str
) -> None:
    """Fault 2. The handler returned (its side effect committed) and the
    process dies before its settle statement ran (``before``) or after it ran
    but before it committed (``after``). The job runs again and ends with
    exactly one settlement."""
    engine = instrumented
    enqueue_jobs(engine, [Job("victim", "chaos", max_recoveries=2), Job("other", "chaos", max_recoveries=2)])
    w1 = workers.start(db_url, "w1", kill_in_settle="victim", kill_phase=phase, **TIMING, **kind(runner_kind))
    wait_until(lambda: not w1.alive, timeout=60, what="w1 to kill itself in the settle")
    assert w1.proc.returncode == -signal.SIGKILL, w1.log_text()
    assert "chaos: SIGKILL" in w1.log_text()

    (first,) = audit_rows(engine, "victim")
    assert first["ended_ms"] is not None, "the handler had returned"
    row = jobs_by_id(engine)["victim"]
    # On PostgreSQL the runner sends a settle as one autocommitted statement:
    # there is no window between the statement and its commit.
    self_committing = getattr(store, "self_committing", lambda dialect: False)(engine.dialect.name)
    committed = phase == "after" and self_committing
    if committed:
        assert row["state"] == "settled" and row["outcome"] == "completed"
    else:
        assert row["state"] == "running", "the uncommitted settle must not be visible"

    workers.start(db_url, "w2", **TIMING, **kind(runner_kind))
    wait_until(
        lambda: all(r["state"] == "settled" for r in jobs_by_id(engine).values()),
        timeout=60,
        what="every job to settle",
    )
    rows = assert_settled_exactly_once(engine, ["victim", "other"])
    assert rows["victim"]["outcome"] == "completed"
    runs = audit_rows(engine, "victim")
    assert all(r["ended_ms"] is not None for r in runs)
    if committed:
        assert rows["victim"]["recovery_count"] == 0 and len(runs) == 1
    else:
        assert rows["victim"]["recovery_count"] == 1 and len(runs) == 2
        assert runs[1]["started_ms"] >= row["lease_until"], "the rerun started under the dead claim's lease"


@pytest.mark.slow  # real processes, ~5 s each: CI runs it
def test_sigstop_past_lease_then_sigcont(
    instrumented: Engine, db_url: URL, workers: WorkerPool, runner_kind: str
) -> None:
    """Fault 3. A worker frozen past its lease loses the job to another; on
    SIGCONT its heartbeat and settle are refused (the row is not touched by
    it), its handler is told to stop (``lease_lost``), and only the new
    claim's settlement counts."""
    engine = instrumented
    enqueue_jobs(engine, [Job("victim", "chaos", payload={"action": "block", "only_first": 1}, max_recoveries=1)])
    w1 = workers.start(db_url, "w1", **TIMING, **kind(runner_kind))
    wait_until(lambda: audit_rows(engine, "victim"), timeout=60, what="the handler to start")
    w1.send(signal.SIGSTOP)
    old_token = jobs_by_id(engine)["victim"]["claim_token"]

    w2 = workers.start(db_url, "w2", **TIMING, **kind(runner_kind))
    wait_until(lambda: jobs_by_id(engine)["victim"]["state"] == "settled", timeout=60, what="w2 to settle")
    settled = jobs_by_id(engine)["victim"]
    assert settled["outcome"] == "completed" and settled["recovery_count"] == 1
    assert settled["claim_token"] != old_token
    log_before = transition_rows(engine, "victim")

    w1.send(signal.SIGCONT)
    first = wait_until(
        lambda: first_ended_audit_row(engine, "victim"),
        timeout=30,
        what="the old handler to be told to stop",
    )
    assert first["pid"] == w1.pid
    assert first["stop_reason"] == "lease_lost"
    # Its settle attempt comes right after the handler returns.
    wait_until(
        lambda: "settled elsewhere" in w1.log_text() or "settlement rejected" in w1.log_text(),
        timeout=30,
        what="the old claim's settle to be refused",
    )
    time.sleep(HEARTBEAT * 2)  # one more heartbeat round, if it were to write anything
    assert jobs_by_id(engine)["victim"] == settled
    assert transition_rows(engine, "victim") == log_before
    assert_settled_exactly_once(engine, ["victim"])
    assert w1.alive and w2.alive


@pytest.mark.slow
def test_sigterm_stops_claiming_and_hands_over_unfinished_work(
    instrumented: Engine, db_url: URL, workers: WorkerPool, runner_kind: str
) -> None:
    """Fault 4. SIGTERM: nothing is claimed after the signal; a job finishing
    within the grace period settles; one that honours ``stop_requested``
    stops (reason ``shutdown``); one that ignores it is handed to recovery
    at once (requeued within budget, else interrupted). None is left running
    under a live lease, and a later worker finishes everything."""
    engine = instrumented
    grace = 2.0
    jobs = [
        Job("finishes", "chaos", priority=9, payload={"action": "ignore_stop", "seconds": 1.0}),
        Job("honours", "chaos", priority=9, payload={"action": "block", "only_first": 1}),
        Job(
            "ignores",
            "chaos",
            priority=9,
            payload={"action": "ignore_stop", "seconds": 120, "only_first": 1},
            max_recoveries=1,
        ),
        Job("ignores-no-policy", "chaos", priority=9, payload={"action": "ignore_stop", "seconds": 120}),
    ]
    waiting = [Job(f"waiting-{i}", "chaos") for i in range(4)]
    enqueue_jobs(engine, jobs + waiting)
    w1 = workers.start(db_url, "w1", concurrency=4, grace=grace, **TIMING, **kind(runner_kind))
    wait_until(lambda: len(audit_rows(engine)) == 4, timeout=60, what="four handlers to start")

    signalled_ms = db_now_ms(engine)
    sent = time.monotonic()
    w1.send(signal.SIGTERM)
    wait_until(
        lambda: "runner stopped" in w1.log_text() or not w1.alive,
        timeout=grace + 2 + 15,
        what="run_forever to return after SIGTERM",
    )
    took = time.monotonic() - sent
    assert took < grace + 2 + 5, f"shutdown took {took:.1f}s with grace {grace}s"

    claims_after = [t for t in transition_rows(engine) if t["new_state"] == "running" and t["at_ms"] >= signalled_ms]
    assert not claims_after, f"claimed after SIGTERM: {claims_after}"
    rows = jobs_by_id(engine)
    now = db_now_ms(engine)
    live = [j for j, r in rows.items() if r["state"] == "running" and r["lease_until"] > now]
    assert not live, f"left running under a live lease: {live}"
    assert not [j for j, r in rows.items() if r["state"] == "running"]

    assert rows["finishes"]["outcome"] == "completed"
    honours = audit_rows(engine, "honours")[0]
    assert honours["stop_reason"] == "shutdown"
    assert rows["ignores"]["state"] == "queued" and rows["ignores"]["recovery_count"] == 1
    assert rows["ignores-no-policy"]["outcome"] == "interrupted"
    assert rows["ignores-no-policy"]["failure_reason"] == f"{SHUTDOWN_REASON}; no recovery policy"
    assert all(rows[j.job_id]["state"] == "queued" for j in waiting)
    # run_forever has returned: the process exits at once (a handler still
    # blocking in a thread must not hold it)
    code = w1.wait(timeout=5)
    assert code == 0, w1.log_text()

    workers.start(db_url, "w2", concurrency=2, **TIMING, **kind(runner_kind))
    workers.wait_until(
        lambda: all(r["state"] == "settled" for r in jobs_by_id(engine).values()),
        timeout=60,
        what="every job to settle",
        state=lambda: (
            f"database clock {db_now_ms(engine)}; job: (state, ready_at, lease_until) "
            f"{ {j: (r['state'], r['ready_at'], r['lease_until']) for j, r in jobs_by_id(engine).items()} }"
        ),
    )
    rows = assert_settled_exactly_once(engine, [j.job_id for j in jobs + waiting])
    assert rows["ignores"]["outcome"] == "completed"
