"""Durable steps under SIGKILL: a job killed between (or inside) its steps
resumes at the next one, and each finished step's effect is seen once; a
compensation killed between its undos finishes after recovery, each undo once;
a job killed mid-step with no recovery left is run once more by recovery to
undo its recorded steps (revision w0022), each once.

The chaos worker's ``steps`` action runs ``job.transaction_step`` steps a
moment apart, each inserting its effect row in the step's own transaction
with the step's record (tests/faults/chaos_worker.py). The worker is
SIGKILLed once some steps are done; a second worker recovers the job after
the lease (``max_recoveries=1``) and finishes it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, RetryPolicy
from tests.faults.helpers import WorkerPool, enqueue_jobs, jobs_by_id, wait_until

STEPS = 5
TIMING: dict[str, Any] = {"lease": 3.0, "heartbeat": 0.5, "poll": 0.2}


def _effects(engine: Engine) -> Counter[tuple[str, int]]:
    with engine.connect() as conn:
        return Counter(
            (row.job_id, row.step) for row in conn.execute(text("SELECT job_id, step FROM fault_step_effects"))
        )


def test_a_job_killed_between_its_steps_resumes_at_the_next_and_each_effect_is_seen_once(
    instrumented: Engine, db_url: URL, workers: WorkerPool
) -> None:
    engine = instrumented
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE fault_step_effects (job_id TEXT NOT NULL, step INTEGER NOT NULL, pid INTEGER)"))
    ids = ["saga-1", "saga-2"]
    payload = {"action": "steps", "steps": STEPS, "gap": 0.4}
    enqueue_jobs(engine, [Job(job_id, "chaos", payload=payload, max_recoveries=1) for job_id in ids])
    w1 = workers.start(db_url, "w1", concurrency=2, **TIMING)
    wait_until(lambda: sum(_effects(engine).values()) >= 4, timeout=60, what="a few steps to finish")
    w1.kill()
    done_before = _effects(engine)
    assert all(count == 1 for count in done_before.values()), done_before
    assert sum(done_before.values()) < STEPS * len(ids), "killed mid-way"
    workers.start(db_url, "w2", concurrency=2, **TIMING)
    wait_until(
        lambda: all(row["state"] == "settled" for row in jobs_by_id(engine).values()), timeout=60, what="recovery"
    )
    rows = jobs_by_id(engine)
    effects = _effects(engine)
    for job_id in ids:
        assert (rows[job_id]["outcome"], rows[job_id]["recovery_count"]) == ("completed", 1), rows[job_id]
        assert [effects[(job_id, step)] for step in range(STEPS)] == [1] * STEPS, "each step's effect once"
    with engine.connect() as conn:
        pids = {
            (row.job_id, row.step): row.pid
            for row in conn.execute(text("SELECT job_id, step, pid FROM fault_step_effects"))
        }
    for key in done_before:
        assert pids[key] == w1.pid, "a step done before the kill was never run again"


def _undos(engine: Engine) -> tuple[list[tuple[str, int, int]], int]:
    """The saga effects (job, step, pid) in the order they were made, and how many undos are recorded."""
    with engine.connect() as conn:
        effects = [
            (row.job_id, row.step, row.pid)
            for row in conn.execute(text("SELECT job_id, step, pid FROM fault_saga_effects ORDER BY at_ns"))
        ]
        recorded = conn.execute(text("SELECT count(*) FROM watchdog_job_steps WHERE kind = 'undo'")).scalar_one()
    return effects, int(recorded)


def test_a_compensation_killed_midway_finishes_after_recovery_each_undo_once_last_first(
    instrumented: Engine, db_url: URL, workers: WorkerPool
) -> None:
    """A job with no retry left fails and runs the undos of its steps; its
    runner is SIGKILLed between two undos. The recovered run passes its
    recorded steps, fails again, and finishes the compensation: the undos
    recorded before the kill do not run again."""
    engine = instrumented
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE fault_saga_effects (job_id TEXT NOT NULL, step INTEGER NOT NULL, pid INTEGER, at_ns BIGINT)"
            )
        )
    payload = {"action": "saga", "steps": STEPS, "gap": 1.0}
    once = RetryPolicy(max_attempts=1)
    enqueue_jobs(engine, [Job("saga", "chaos", payload=payload, max_recoveries=1, retry=once)])
    w1 = workers.start(db_url, "w1", concurrency=1, **TIMING)

    def two_undos_done() -> bool:
        effects, recorded = _undos(engine)
        return len(effects) >= 2 and recorded == len(effects)  # not inside one undo's effect and its record

    wait_until(two_undos_done, timeout=60, what="two undos to finish")
    w1.kill()
    before, _ = _undos(engine)
    assert len(before) < STEPS, "killed mid-way"
    workers.start(db_url, "w2", concurrency=1, **TIMING)
    wait_until(lambda: jobs_by_id(engine)["saga"]["state"] == "settled", timeout=60, what="recovery")
    row = jobs_by_id(engine)["saga"]
    assert (row["outcome"], row["recovery_count"]) == ("failed", 1), row
    assert "compensated" in row["failure_reason"], row["failure_reason"]
    effects, recorded = _undos(engine)
    assert [step for _, step, _ in effects] == list(reversed(range(STEPS))), "each undo once, last step first"
    assert recorded == STEPS
    assert effects[: len(before)] == before and all(pid == w1.pid for _, _, pid in before)
    assert all(pid != w1.pid for _, _, pid in effects[len(before) :]), "the rest ran after the recovery"


def test_a_job_killed_mid_step_without_a_recovery_left_undoes_its_recorded_steps_once_after_recovery(
    instrumented: Engine, db_url: URL, workers: WorkerPool
) -> None:
    """Its runner is SIGKILLed inside a step (never recorded) after three
    recorded ones, with ``max_recoveries=0``: recovery would settle it
    ``interrupted``; instead it requeues it once, and a second worker's run
    passes the recorded steps, stops at the unrecorded one (not run again)
    and runs the three undos, last first, each once."""
    engine = instrumented
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE fault_saga_effects (job_id TEXT NOT NULL, step INTEGER NOT NULL, pid INTEGER, at_ns BIGINT)"
            )
        )
    steps = 3
    payload = {"action": "saga", "steps": steps, "gap": 0.0, "hang": 60}
    enqueue_jobs(engine, [Job("saga", "chaos", payload=payload, max_recoveries=0)])
    w1 = workers.start(db_url, "w1", concurrency=1, **TIMING)

    def recorded() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM watchdog_job_steps WHERE kind = 'step'")).scalar_one())

    wait_until(lambda: recorded() == steps, timeout=60, what="the steps to be recorded")
    w1.kill()
    w2 = workers.start(db_url, "w2", concurrency=1, **TIMING)
    wait_until(lambda: jobs_by_id(engine)["saga"]["state"] == "settled", timeout=60, what="recovery")
    row = jobs_by_id(engine)["saga"]
    assert (row["outcome"], row["recovery_count"]) == ("failed", 0), row
    assert row["failure_reason"] == (
        "Restart recovery budget exhausted (0 recoveries); compensated: undid 'step-2', 'step-1', 'step-0'"
    )
    effects, undos = _undos(engine)
    assert [(step, pid) for _, step, pid in effects] == [(2, w2.pid), (1, w2.pid), (0, w2.pid)]
    assert undos == steps + 1, "each undo recorded, and the marker"
