"""Conformance of settling: only the exact claim token under a live lease
settles; retries and snoozes requeue; a settled job stays final; a replay
is recognised; cancellations.

Every backend runs this file (SQLite on a real file, PostgreSQL); see
``tests/backends/ops.py`` for how the operations are run.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, text

from sqlalchemy_watchdog import Decision, Job, JobState, Outcome, Watchdog, store
from sqlalchemy_watchdog.jobs import CancelStatus, SettleStatus, encode_result
from sqlalchemy_watchdog.store import SettleRequest
from tests.backends.ops import add, claim, claim_one, claimed_ids, end_lease, far_future, op, read, requeue, settle

SETTLED, REQUEUED = SettleStatus.SETTLED, SettleStatus.REQUEUED
CONFLICT, REPLAYED, MISSING = SettleStatus.CONFLICT, SettleStatus.REPLAYED, SettleStatus.MISSING


@pytest.mark.operation("settle")
@pytest.mark.parametrize(
    ("decision", "outcome"),
    [
        (Decision.completed({"ok": True}), Outcome.COMPLETED),
        (Decision.failed("boom", retry=False), Outcome.FAILED),
        (Decision.outcome_unknown("lost the reply"), Outcome.OUTCOME_UNKNOWN),
    ],
)
def test_settle_by_the_exact_token_under_a_live_lease_settles_with_the_decision(
    db: Engine, decision: Decision, outcome: Outcome
) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db)
    result = settle(db, held, decision)
    assert result.status is SETTLED and result.outcome is outcome
    job = read(db, "a")
    assert job == result.job
    assert (job.state, job.outcome, job.failure_reason) == (JobState.SETTLED, outcome, decision.reason)
    assert job.settled_at is not None
    assert job.result == ({"ok": True} if outcome is Outcome.COMPLETED else None)


@pytest.mark.operation("settle")
def test_settle_with_a_stale_claim_token_is_refused_and_writes_nothing(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db)
    before = read(db, "a")
    result = settle(db, held, Decision.completed(), token="not-the-token")
    assert result.status is CONFLICT and result.job == before
    assert read(db, "a") == before
    assert settle(db, held, Decision.completed()).status is SETTLED  # the holder still can


@pytest.mark.operation("settle")
def test_settle_after_the_lease_ended_is_refused_and_writes_nothing(db: Engine) -> None:
    add(db, Job("a", "q"), Job("b", "q"))
    by_clock, released = claim_one(db), claim_one(db)
    before = read(db, "a")
    assert settle(db, by_clock, Decision.completed(), now=far_future()).status is CONFLICT
    assert read(db, "a") == before
    end_lease(db, released)
    before = read(db, "b")
    assert settle(db, released, Decision.completed()).status is CONFLICT
    assert read(db, "b") == before


@pytest.mark.operation("settle")
def test_settle_of_a_job_that_does_not_exist_is_missing(db: Engine) -> None:
    result = op(db, store.settle, job_id="ghost", claim_token="t", decision=Decision.completed())
    assert result.status is MISSING and result.job is None


@pytest.mark.operation("settle")
def test_a_replayed_settle_is_recognised_and_a_settled_job_stays_final(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db)
    assert settle(db, held, Decision.completed()).status is SETTLED
    final = read(db, "a")
    assert settle(db, held, Decision.completed()).status is REPLAYED  # idempotent
    assert settle(db, held, Decision.failed("changed my mind")).status is CONFLICT
    assert op(db, store.cancel, "a", "too-late").status is CancelStatus.CONFLICT
    assert read(db, "a") == final
    assert claim(db).claimed == ()


@pytest.mark.operation("settle_many")
def test_a_retry_requeues_the_job_for_another_attempt_and_drops_the_old_token(db: Engine) -> None:
    add(db, Job("now", "q"), Job("later", "q"))
    first = claim_one(db)
    assert requeue(db, first, 0).status is REQUEUED
    job = read(db, "now")
    assert (job.state, job.outcome, job.attempt) == (JobState.QUEUED, None, 2)
    assert settle(db, first, Decision.completed()).status is CONFLICT  # the old claim is gone
    assert claimed_ids(claim(db, limit=2)) == ["now", "later"]  # claimable again at once, in admission order
    later = op(db, store.read_claim, "later")
    assert later is not None
    retried = requeue(db, store.Claim(later[0], later[1] or ""), 3_600_000)
    assert retried.status is REQUEUED and read(db, "later").state is JobState.DELAYED


@pytest.mark.operation("settle")
def test_a_snooze_delays_the_job_without_counting_an_attempt(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db)
    assert settle(db, held, Decision.snooze(timedelta(hours=1))).status is REQUEUED
    job = read(db, "a")
    assert (job.state, job.snoozes, job.attempt, job.outcome) == (JobState.DELAYED, 1, 1, None)
    assert claim(db).claimed == ()


@pytest.mark.operation("settle_many")
def test_settle_many_guards_each_claim_of_the_batch_on_its_own(db: Engine) -> None:
    add(db, Job("good", "q"), Job("stale", "q"), Job("twice", "q"))
    good, stale, twice = claim(db, limit=3).claimed
    requests = [
        SettleRequest("good", good.token, Decision.completed(1)),
        SettleRequest("stale", "wrong-token", Decision.completed()),
        SettleRequest("ghost", "t", Decision.completed()),
        SettleRequest("twice", twice.token, Decision.failed("x", retry=False)),
        SettleRequest("twice", twice.token, Decision.failed("x", retry=False)),
    ]
    results = op(db, store.settle_many, requests)
    assert [r.status for r in results] == [SETTLED, CONFLICT, MISSING, SETTLED, REPLAYED]
    assert read(db, "good").result == 1
    assert read(db, "stale").state is JobState.RUNNING
    assert read(db, "twice").outcome is Outcome.FAILED
    assert stale.job.job_id == "stale"


@pytest.mark.operation("cancel", "settle")
def test_a_cancellation_of_a_running_job_turns_its_settle_into_cancelled(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db)
    assert op(db, store.cancel, "a", "stop", only_if_queued=True).status is CancelStatus.CONFLICT
    assert op(db, store.cancel, "a", "stop").status is CancelStatus.RECORDED
    assert op(db, store.cancel, "a", "stop").status is CancelStatus.REPLAYED
    assert op(db, store.cancel, "a", "another").status is CancelStatus.CONFLICT
    result = settle(db, held, Decision.completed())
    assert result.status is SETTLED and result.outcome is Outcome.CANCELLED
    assert read(db, "a").cancellation_id == "stop"


@pytest.mark.operation("cancel")
def test_a_cancellation_id_names_one_job_only_and_an_unknown_job_is_missing(db: Engine) -> None:
    add(db, Job("a", "q"), Job("b", "q"))
    assert op(db, store.cancel, "a", "c-1").status is CancelStatus.RECORDED
    assert op(db, store.cancel, "b", "c-1").status is CancelStatus.CONFLICT
    assert read(db, "b").cancellation_id is None
    assert op(db, store.cancel, "ghost", "c-2").status is CancelStatus.MISSING


@pytest.mark.operation("cancel_in")
def test_the_clients_cancel_reports_the_same_statuses_as_the_store(db: Engine) -> None:
    watchdog = Watchdog(db)
    add(db, Job("a", "q"), Job("b", "q"))
    assert watchdog.cancel("a", "c-1").status is CancelStatus.RECORDED
    assert watchdog.cancel("a", "c-1").status is CancelStatus.REPLAYED
    assert watchdog.cancel("b", "c-1").status is CancelStatus.CONFLICT
    assert watchdog.cancel("ghost", "c-2").status is CancelStatus.MISSING
    batch = claim(db, limit=5)
    assert claimed_ids(batch) == ["b"] and [job.job_id for job in batch.cancelled] == ["a"]
    assert watchdog.cancel("b", "c-3", only_if_queued=True).status is CancelStatus.CONFLICT  # running
    assert read(db, "b").cancellation_id is None


#: A result of about 200 KB of JSON, multibyte characters among them: over
#: the 65,535 bytes of a MariaDB/MySQL TEXT column (issue 57, revision w0023).
LONG_RESULT = {"text": "é" * 50_000 + "x" * 100_000, "list": list(range(5_000))}


def _stored_result(db: Engine, job_id: str) -> str:
    with db.connect() as conn:
        stored: str = conn.execute(
            text("SELECT result_json FROM watchdog_jobs WHERE job_id = :j"), {"j": job_id}
        ).scalar_one()
        return stored


@pytest.mark.operation("settle", "settle_many")
def test_a_result_far_over_64_kib_is_stored_byte_for_byte_alone_and_in_a_batch(db: Engine) -> None:
    """Issue 57: a result over the 65,535 bytes of MariaDB's TEXT is kept
    whole by a settle and by a batch of settles (a JSON row source, which
    MariaDB cut short into TEXT without an error); LONGTEXT, revision w0023."""
    expected = encode_result(LONG_RESULT)
    assert expected is not None and len(expected.encode()) > 200_000
    add(db, Job("alone", "q"), Job("first", "q"), Job("last", "q"))
    alone, first, last = claim(db, limit=3).claimed
    assert settle(db, alone, Decision.completed(LONG_RESULT)).status is SETTLED
    requests = [
        SettleRequest("first", first.token, Decision.completed(LONG_RESULT)),
        SettleRequest("last", last.token, Decision.completed(LONG_RESULT)),
    ]
    assert [r.status for r in op(db, store.settle_many, requests)] == [SETTLED, SETTLED]
    for job_id in ("alone", "first", "last"):
        assert _stored_result(db, job_id) == expected, job_id
        assert read(db, job_id).result == LONG_RESULT


@pytest.mark.operation("settle_many")
def test_a_batch_of_settles_over_the_servers_packet_limit_settles_every_job(db: Engine) -> None:
    """Eighteen results of almost 1 MiB each (18 MiB: over MariaDB's default
    max_allowed_packet, which closed the connection on one statement and so
    lost every settle of the batch) settle, each kept byte for byte."""
    from sqlalchemy_watchdog.jobs import RESULT_MAX_BYTES

    heavy = "y" * (RESULT_MAX_BYTES - 2)
    add(db, *[Job(f"r{i:02d}", "q") for i in range(18)])
    held = claim(db, limit=18).claimed
    requests = [SettleRequest(c.job.job_id, c.token, Decision.completed(heavy)) for c in held]
    assert [r.status for r in op(db, store.settle_many, requests)] == [SETTLED] * 18
    assert {read(db, c.job.job_id).result for c in held} == {heavy}
