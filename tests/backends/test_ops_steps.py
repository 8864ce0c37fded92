"""Conformance of durable steps' store operations (revision w0021): a step is
recorded once, only under its job's exact live claim, read back in order,
and never seen by a later job of the same job_id.

Every backend runs this file; see ``tests/backends/ops.py``.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text

from sqlalchemy_watchdog import Decision, Job, store
from sqlalchemy_watchdog.jobs import StepKind
from tests.backends.ops import LEASE_MS, add, claim_one, end_lease, op, settle


def _record(db: Engine, job_id: str, token: str, name: str, **options: object) -> object:
    fields: dict[str, object] = {"kind": StepKind.STEP, "result_json": '{"n":1}', "delay_ms": None, "attempt": 1}
    fields.update(options)
    return op(db, store.record_step, job_id, token, name, **fields)  # type: ignore[arg-type]


@pytest.mark.operation("record_step", "read_steps")
def test_a_step_is_recorded_once_under_its_claim_and_read_back_in_order(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db, ["q"])
    first = _record(db, "a", held.token, "reserve")
    assert first is not None
    assert _record(db, "a", held.token, "reserve", result_json='{"n":2}') is None, "a name is recorded once"
    slept = op(
        db, store.record_step, "a", held.token, "sleep#0", kind=StepKind.SLEEP, result_json=None, delay_ms=60_000,
        attempt=1,
    )  # fmt: skip
    assert slept is not None and slept.wake_at is not None
    steps = op(db, store.read_steps, "a")
    assert [(s.name, s.kind, s.result, s.attempt) for s in steps] == [
        ("reserve", StepKind.STEP, {"n": 1}, 1),
        ("sleep#0", StepKind.SLEEP, None, 1),
    ]
    recorded, wake = steps[1].recorded_at, steps[1].wake_at
    assert recorded is not None and wake is not None and wake > recorded


@pytest.mark.operation("record_step")
def test_a_step_of_a_claim_that_is_gone_records_nothing(db: Engine) -> None:
    add(db, Job("a", "q", max_recoveries=1))
    held = claim_one(db, ["q"])
    assert _record(db, "a", "not-the-token", "x") is None
    end_lease(db, held)
    assert _record(db, "a", held.token, "x") is None, "an ended lease records nothing"
    assert op(db, store.read_steps, "a") == []


@pytest.mark.operation("record_step")
def test_a_settled_job_records_no_step(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db, ["q"], lease_ms=LEASE_MS)
    settle(db, held, Decision.completed())
    assert _record(db, "a", held.token, "late") is None


@pytest.mark.operation("read_steps", "prune_retention")
def test_a_job_id_enqueued_again_after_a_prune_starts_with_no_steps(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db, ["q"])
    _record(db, "a", held.token, "reserve")
    settle(db, held, Decision.completed())
    with db.begin() as conn:  # as prune would: the job row goes
        conn.exec_driver_sql("DELETE FROM watchdog_jobs WHERE job_id = 'a'")
    add(db, Job("a", "q"))
    assert op(db, store.read_steps, "a") == [], "the new job is not the old one"
    op(db, store.prune_retention, {"completed": timedelta(days=1)}, 100)
    with db.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM watchdog_job_steps").scalar() == 0, "orphans pruned"


@pytest.mark.operation("record_step", "read_steps")
def test_a_step_result_far_over_64_kib_is_read_back_byte_for_byte(db: Engine) -> None:
    """Issue 57: a step's result over the 65,535 bytes of MariaDB's TEXT is kept whole (LONGTEXT, revision w0023)."""
    result_json = json.dumps({"text": "é" * 50_000 + "x" * 100_000}, ensure_ascii=False, separators=(",", ":"))
    assert len(result_json.encode()) > 200_000
    add(db, Job("a", "q"))
    held = claim_one(db, ["q"])
    assert _record(db, "a", held.token, "big", result_json=result_json) is not None
    [step] = op(db, store.read_steps, "a")
    assert step.result == json.loads(result_json)
    with db.connect() as conn:
        assert conn.execute(text("SELECT result_json FROM watchdog_job_steps")).scalar_one() == result_json


@pytest.mark.operation("reconcile", "record_step", "read_steps")
def test_recovery_requeues_a_job_with_recorded_steps_once_to_compensate_with_its_marker(db: Engine) -> None:
    """Revision w0022: no recovery left, a vanished claim of a job with a
    recorded step is requeued (its reason kept, no recovery counted) and its
    marker ``undo:`` recorded with it; the next vanished claim settles
    ``interrupted``. A job without steps settles ``interrupted`` at once."""
    add(db, Job("a", "q", max_recoveries=0), Job("none", "q"))
    for held in op(db, store.claim, queues=["q"], limit=2, lease_ms=LEASE_MS).claimed:
        if held.job.job_id == "a":
            assert _record(db, "a", held.token, "reserve") is not None
        op(db, store.release, [(held.job.job_id, held.token)])
    by_id = {c.job.job_id: c for c in op(db, store.expired_claims, limit=10)}
    requeued = op(db, store.reconcile, by_id["a"])
    assert (requeued.status, requeued.compensating) == (store.RecoveryStatus.REQUEUED, True)
    assert requeued.job is not None and requeued.job.recovery_count == 0, "within its budget still"
    assert requeued.job.failure_reason == "Restart recovery budget exhausted (0 recoveries)"
    assert [(s.name, s.kind) for s in op(db, store.read_steps, "a")] == [
        ("reserve", StepKind.STEP), ("undo:", StepKind.UNDO),
    ]  # fmt: skip
    assert op(db, store.reconcile, by_id["a"]).status is store.RecoveryStatus.LOST_RACE
    assert op(db, store.reconcile, by_id["none"]).job.outcome.value == "interrupted"  # type: ignore[union-attr]
    again = claim_one(db, ["q"])
    end_lease(db, again)
    (expired,) = op(db, store.expired_claims, limit=10)
    settled = op(db, store.reconcile, expired)
    assert (settled.status, settled.compensating) == (store.RecoveryStatus.SETTLED, False)
    assert len(op(db, store.read_steps, "a")) == 2, "the marker once"
