"""Every store operation's every result, on SQLite and on PostgreSQL.

The store functions run on a ``Connection`` inside a transaction the caller
owns; here each call gets a write transaction of its own
(:func:`store.write_transaction`), the way the runner and the client use them.
Lease checks take ``now=`` (the application clock in epoch milliseconds): a
``now`` far in the future makes every lease look expired without sleeping,
because the statements compare leases with ``max(now, database clock)``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, select

from sqlalchemy_watchdog import (
    CancelStatus,
    Decision,
    Job,
    JobState,
    Outcome,
    Watchdog,
    WatchdogError,
    enqueue,
    store,
)
from sqlalchemy_watchdog.errors import ErrorCode
from sqlalchemy_watchdog.jobs import SettleStatus
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.store import Claim, maintenance_sql, sql
from tests.helpers import present

T = TypeVar("T")

LEASE_MS = 60_000
TEN_MINUTES_MS = 10 * 60 * 1000
NO_POLICY = "Execution disappeared without a recovery policy"


# -- helpers -------------------------------------------------------------------


def run(engine: Engine, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(conn, ...)`` in a write transaction of its own, committed."""
    with store.write_transaction(engine) as conn:
        return fn(conn, *args, **kwargs)


def add(engine: Engine, *jobs: Job) -> None:
    with engine.begin() as conn:
        enqueue(conn, list(jobs))


def claim_one(engine: Engine, *, lease_ms: int = LEASE_MS, queues: Any = None) -> Claim:
    batch = run(engine, store.claim, queues=queues, limit=1, lease_ms=lease_ms)
    assert len(batch.claimed) == 1, batch
    return batch.claimed[0]


def row(engine: Engine, job_id: str) -> dict[str, Any] | None:
    """The stored row, every column (``lease_until`` and ``claim_token`` included)."""
    with engine.connect() as conn:
        found = conn.execute(select(jobs_table).where(jobs_table.c.job_id == job_id)).first()
    return None if found is None else dict(found._mapping)


def db_clock(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(sql.db_clock_ms())).scalar_one())


def far_future() -> int:
    """An application clock ten days ahead: every lease looks expired."""
    return store.now_ms() + 10 * 24 * 3600 * 1000


def wait_for_db_clock_past(engine: Engine, instant_ms: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while db_clock(engine) <= instant_ms:
        assert time.monotonic() < deadline, "database clock did not advance"
        time.sleep(0.02)


def settle(
    engine: Engine, claim: Claim, decision: Decision, *, token: str | None = None, now: int | None = None
) -> store.Settlement:
    return run(
        engine,
        store.settle,
        job_id=claim.job.job_id,
        claim_token=claim.token if token is None else token,
        decision=decision,
        now=now,
    )


def cancel(engine: Engine, job_id: str, cancellation_id: str, *, only_if_queued: bool = False) -> CancelStatus:
    return run(engine, store.cancel, job_id, cancellation_id, only_if_queued=only_if_queued).status


def expired(engine: Engine, *, limit: int = 16) -> list[Claim]:
    return run(engine, store.expired_claims, limit=limit)


def end_lease(engine: Engine, job_id: str) -> None:
    """End ``job_id``'s running lease now, as a vanished runner's would."""
    stored = row(engine, job_id)
    assert stored is not None and stored["state"] == "running", stored
    assert run(engine, store.release, [(job_id, stored["claim_token"])]) == {job_id}


def expire_and_reconcile(engine: Engine, job_id: str) -> store.Recovery:
    """Treat ``job_id``'s running claim as disappeared and recover it."""
    end_lease(engine, job_id)
    (found,) = [c for c in expired(engine) if c.job.job_id == job_id]
    return run(engine, store.reconcile, found)


# -- claim ---------------------------------------------------------------------


def test_claim_with_nothing_ready_returns_an_empty_batch(engine: Engine) -> None:
    assert run(engine, store.claim, queues=None, limit=5, lease_ms=LEASE_MS) == store.ClaimBatch((), ())
    add(engine, Job("running", "q"), Job("settled", "q"))
    claim_one(engine)
    settle(engine, claim_one(engine), Decision.completed())
    batch = run(engine, store.claim, queues=None, limit=5, lease_ms=LEASE_MS)
    assert batch.claimed == () and batch.cancelled == ()


def test_claim_runs_the_job_under_a_secret_token_and_a_lease_from_the_db_clock(engine: Engine) -> None:
    add(engine, Job("a", "q", payload={"n": 1}, max_recoveries=2))
    before = db_clock(engine)
    claim = claim_one(engine, lease_ms=LEASE_MS)
    after = db_clock(engine)
    assert claim.job.job_id == "a"
    assert claim.job.state is JobState.RUNNING
    assert claim.job.payload == {"n": 1}
    assert claim.job.max_recoveries == 2
    stored = row(engine, "a")
    assert stored is not None
    assert stored["state"] == "running"
    assert stored["claim_token"] == claim.token and claim.token
    assert before + LEASE_MS <= stored["lease_until"] <= after + LEASE_MS + 1000


def test_claim_tokens_differ_between_claims(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q"))
    assert claim_one(engine).token != claim_one(engine).token


def test_each_job_of_one_claim_batch_has_its_own_token_and_only_it_settles_or_renews_the_job(engine: Engine) -> None:
    """The claim token is a fencing token per job: within one claim batch
    the tokens differ, and job B's claim cannot be settled, renewed or
    released by naming job A's token."""
    add(engine, Job("a", "q", priority=1), Job("b", "q"))
    batch = run(engine, store.claim, queues=None, limit=2, lease_ms=LEASE_MS)
    claim_a, claim_b = batch.claimed
    assert (claim_a.job.job_id, claim_b.job.job_id) == ("a", "b")
    assert claim_a.token != claim_b.token
    before = row(engine, "b")
    wrong = run(engine, store.settle, job_id="b", claim_token=claim_a.token, decision=Decision.completed())
    assert wrong.status is SettleStatus.CONFLICT
    assert run(engine, store.renew, [("b", claim_a.token)], lease_ms=LEASE_MS) == set()
    assert run(engine, store.release, [("b", claim_a.token)]) == set()
    assert row(engine, "b") == before
    right = run(engine, store.settle, job_id="b", claim_token=claim_b.token, decision=Decision.completed())
    assert right.status is SettleStatus.SETTLED


def test_claim_settles_a_queued_job_with_a_recorded_cancellation_as_cancelled(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    assert cancel(engine, "a", "stop-a") is CancelStatus.RECORDED
    batch = run(engine, store.claim, queues=None, limit=1, lease_ms=LEASE_MS)
    assert batch.claimed == ()
    (job,) = batch.cancelled
    assert (job.job_id, job.state, job.outcome) == ("a", JobState.SETTLED, Outcome.CANCELLED)
    stored = row(engine, "a")
    assert stored is not None
    assert stored["claim_token"] is None and stored["lease_until"] is None
    assert stored["outcome"] == "cancelled"


def test_claim_batch_separates_cancelled_jobs_from_runnable_ones(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q"), Job("c", "q"))
    cancel(engine, "b", "stop-b")
    batch = run(engine, store.claim, queues=None, limit=3, lease_ms=LEASE_MS)
    assert [c.job.job_id for c in batch.claimed] == ["a", "c"]
    assert [j.job_id for j in batch.cancelled] == ["b"]
    assert row(engine, "b")["state"] == "settled"  # type: ignore[index]


def test_claim_limit_takes_exactly_that_many_jobs(engine: Engine) -> None:
    add(engine, *(Job(f"j{i}", "q") for i in range(5)))
    batch = run(engine, store.claim, queues=None, limit=3, lease_ms=LEASE_MS)
    assert [c.job.job_id for c in batch.claimed] == ["j0", "j1", "j2"]
    states = {f"j{i}": row(engine, f"j{i}")["state"] for i in range(5)}  # type: ignore[index]
    assert states == {"j0": "running", "j1": "running", "j2": "running", "j3": "queued", "j4": "queued"}


def test_claim_order_is_priority_descending_then_admission_order(engine: Engine) -> None:
    add(
        engine,
        Job("low", "q", priority=-1),
        Job("mid-1", "q", priority=0),
        Job("high-1", "q", priority=5),
        Job("mid-2", "q", priority=0),
        Job("high-2", "q", priority=5),
        Job("huge", "q", priority=2**62),
    )
    order = [claim_one(engine).job.job_id for _ in range(6)]
    assert order == ["huge", "high-1", "high-2", "mid-1", "mid-2", "low"]


def test_claim_batch_is_returned_in_priority_then_admission_order(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q", priority=1), Job("c", "q"), Job("d", "q", priority=1))
    batch = run(engine, store.claim, queues=None, limit=4, lease_ms=LEASE_MS)
    assert [c.job.job_id for c in batch.claimed] == ["b", "d", "a", "c"]


def test_claim_takes_only_jobs_of_the_given_queues(engine: Engine) -> None:
    add(engine, Job("other", "other", priority=9), Job("e1", "emails"), Job("s1", "sms"))
    batch = run(engine, store.claim, queues=["emails", "sms"], limit=10, lease_ms=LEASE_MS)
    assert sorted(c.job.job_id for c in batch.claimed) == ["e1", "s1"]
    assert row(engine, "other")["state"] == "queued"  # type: ignore[index]
    assert run(engine, store.claim, queues=["nothing-here"], limit=10, lease_ms=LEASE_MS).claimed == ()


def test_a_claim_of_several_queues_takes_the_best_jobs_of_all_of_them_in_claim_order(engine: Engine) -> None:
    # Each queue is read on its own (w0008: no index holds every queue's queued jobs),
    # so the claim must still rank across them, never take a fixed share per queue.
    add(
        engine,
        Job("e-low", "emails", priority=-1),
        Job("e-1", "emails", priority=3),
        Job("s-1", "sms", priority=7),
        Job("e-2", "emails", priority=3),
        Job("s-2", "sms"),
        Job("p-1", "push", priority=5),
        Job("other", "other", priority=99),
        Job("later", "emails", priority=3, run_at=datetime(2099, 1, 1, tzinfo=UTC)),
    )
    run(engine, store.pause, "push")
    queues = ["emails", "sms", "push"]
    first = run(engine, store.claim, queues=queues, limit=3, lease_ms=LEASE_MS)
    assert [c.job.job_id for c in first.claimed] == ["s-1", "e-1", "e-2"]
    rest = run(engine, store.claim, queues=queues, limit=10, lease_ms=LEASE_MS)
    assert [c.job.job_id for c in rest.claimed] == ["s-2", "e-low"]  # push is paused
    assert run(engine, store.claim, queues=queues, limit=10, lease_ms=LEASE_MS).claimed == ()
    assert {j: row(engine, j)["state"] for j in ("p-1", "other", "later")} == {  # type: ignore[index]
        "p-1": "queued", "other": "queued", "later": "delayed",
    }  # fmt: skip


def test_concurrent_claimers_of_several_queues_never_take_the_same_job_twice(engine: Engine) -> None:
    # A claim of several queues locks up to its limit in each and keeps the best of
    # them; the rows it did not keep are free again when it commits.
    job_ids = [f"{queue}{i:02d}" for queue in ("a", "b", "c") for i in range(15)]
    add(engine, *(Job(job_id, job_id[0], priority=int(job_id[1:]) % 3) for job_id in job_ids))
    taken: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4, timeout=10)

    def claimer(queues: list[str]) -> None:
        try:
            barrier.wait()
            idle = 0
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and idle < 3:
                batch = store.retrying(lambda: run(engine, store.claim, queues=queues, limit=4, lease_ms=LEASE_MS))
                with lock:
                    taken.extend(c.job.job_id for c in batch.claimed)
                idle = 0 if batch.claimed else idle + 1
        except BaseException as error:
            errors.append(error)

    threads = [
        threading.Thread(target=claimer, args=(q,)) for q in (["a", "b", "c"], ["c", "b", "a"], ["a", "c"], ["b"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(taken) == job_ids  # every job claimed, none twice


def test_concurrent_claimers_never_take_the_same_job_twice(engine: Engine) -> None:
    job_ids = [f"j{i:02d}" for i in range(40)]
    add(engine, *(Job(job_id, "q") for job_id in job_ids))
    taken: list[str] = []
    sizes: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4, timeout=10)

    def claimer() -> None:
        try:
            barrier.wait()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                batch = store.retrying(lambda: run(engine, store.claim, queues=["q"], limit=3, lease_ms=LEASE_MS))
                with lock:
                    taken.extend(c.job.job_id for c in batch.claimed)
                    sizes.append(len(batch.claimed))
                    if not batch.claimed and len(taken) >= len(job_ids):
                        return
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(taken) == job_ids  # every job claimed, none twice
    assert max(sizes) <= 3


# -- settle --------------------------------------------------------------------


@pytest.mark.parametrize(
    "decision",
    [Decision.completed(), Decision.failed("card declined"), Decision.outcome_unknown()],
    ids=lambda d: d.outcome.value,
)
def test_settle_exact_live_claim_is_settled_with_the_decision(engine: Engine, decision: Decision) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    result = settle(engine, claim, decision)
    assert result.status is SettleStatus.SETTLED
    assert result.job is not None
    assert (result.job.state, result.job.outcome) == (JobState.SETTLED, decision.outcome)
    assert result.job.failure_reason == decision.reason
    assert decision.outcome is not None
    stored = row(engine, "a")
    assert stored is not None
    assert (stored["state"], stored["outcome"], stored["failure_reason"]) == (
        "settled",
        decision.outcome.value,
        decision.reason,
    )
    assert stored["lease_until"] is None
    assert stored["claim_token"] == claim.token  # kept, so a replay is recognised


def test_settle_replayed_with_same_token_and_outcome_is_replayed(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    first = settle(engine, claim, Decision.failed("boom"))
    again = settle(engine, claim, Decision.failed("boom"))
    assert again.status is SettleStatus.REPLAYED
    assert again.job == first.job
    # even after the lease would have ended
    assert settle(engine, claim, Decision.failed("boom"), now=far_future()).status is SettleStatus.REPLAYED


def test_settle_replayed_with_another_outcome_is_a_conflict_and_changes_nothing(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    settle(engine, claim, Decision.completed())
    before = row(engine, "a")
    assert settle(engine, claim, Decision.failed("late")).status is SettleStatus.CONFLICT
    assert row(engine, "a") == before


def test_settle_with_a_wrong_token_is_a_conflict_and_the_row_is_unchanged(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    before = row(engine, "a")
    result = settle(engine, claim, Decision.completed(), token="claim_not-the-real-one")
    assert result.status is SettleStatus.CONFLICT
    assert result.job is not None and result.job.state is JobState.RUNNING
    assert row(engine, "a") == before
    # the real claim still settles
    assert settle(engine, claim, Decision.completed()).status is SettleStatus.SETTLED


def test_settle_after_the_lease_expired_is_a_conflict_and_the_row_is_unchanged(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    before = row(engine, "a")
    result = settle(engine, claim, Decision.completed(), now=far_future())
    assert result.status is SettleStatus.CONFLICT
    assert row(engine, "a") == before


def test_settle_after_a_real_lease_expiry_is_a_conflict_and_the_row_is_unchanged(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine, lease_ms=200)
    before = row(engine, "a")
    assert before is not None
    wait_for_db_clock_past(engine, before["lease_until"])
    assert settle(engine, claim, Decision.completed()).status is SettleStatus.CONFLICT
    assert row(engine, "a") == before


def test_settle_of_an_unknown_job_is_missing(engine: Engine) -> None:
    result = run(engine, store.settle, job_id="nope", claim_token="claim_x", decision=Decision.completed())
    assert result == store.Settlement(SettleStatus.MISSING, None)


def test_settle_of_a_queued_job_is_a_conflict(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    before = row(engine, "a")
    result = run(engine, store.settle, job_id="a", claim_token="claim_x", decision=Decision.completed())
    assert result.status is SettleStatus.CONFLICT
    assert row(engine, "a") == before


@pytest.mark.parametrize(
    "decision", [Decision.completed(), Decision.failed("x"), Decision.outcome_unknown()], ids=lambda d: d.outcome.value
)
def test_recorded_cancellation_turns_any_decision_into_cancelled(engine: Engine, decision: Decision) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    assert cancel(engine, "a", "stop-a") is CancelStatus.RECORDED
    result = settle(engine, claim, decision)
    assert result.status is SettleStatus.SETTLED
    assert result.job is not None
    assert result.job.outcome is Outcome.CANCELLED
    assert result.job.failure_reason is None
    assert row(engine, "a")["outcome"] == "cancelled"  # type: ignore[index]
    # the handler's same decision again is a replay of that settlement
    assert settle(engine, claim, decision).status is SettleStatus.REPLAYED


def test_settle_many_guards_every_claim_of_a_batch_on_its_own(engine: Engine) -> None:
    """One statement, one commit -- and each row its own verdict, in request order."""
    add(engine, *(Job(j, "q") for j in ["live", "lost", "cancelled", "done", "wrong-token"]))
    claims = {c.job.job_id: c for c in run(engine, store.claim, queues=None, limit=5, lease_ms=LEASE_MS).claimed}
    assert set(claims) == {"live", "lost", "cancelled", "done", "wrong-token"}
    settle(engine, claims["done"], Decision.completed())
    assert cancel(engine, "cancelled", "stop-it") is CancelStatus.RECORDED
    end_lease(engine, "lost")
    untouched = {j: row(engine, j) for j in ["lost", "wrong-token", "done"]}

    def request(job_id: str, decision: Decision, token: str | None = None) -> store.SettleRequest:
        return store.SettleRequest(job_id, token or claims[job_id].token, decision)

    results = run(
        engine,
        store.settle_many,
        [
            request("live", Decision.failed("card declined")),
            request("lost", Decision.completed()),
            request("cancelled", Decision.completed()),
            request("done", Decision.completed()),
            request("wrong-token", Decision.completed(), token="claim_not-the-real-one"),
            store.SettleRequest("nope", "claim_x", Decision.completed()),
        ],
    )
    assert [r.status for r in results] == [
        SettleStatus.SETTLED,
        SettleStatus.CONFLICT,
        SettleStatus.SETTLED,
        SettleStatus.REPLAYED,
        SettleStatus.CONFLICT,
        SettleStatus.MISSING,
    ]
    assert results[0].job is not None and (results[0].job.outcome, results[0].job.failure_reason) == (
        Outcome.FAILED,
        "card declined",
    )
    assert results[2].job is not None and results[2].job.outcome is Outcome.CANCELLED
    assert {j: row(engine, j) for j in untouched} == untouched


def test_settle_many_with_one_job_twice_settles_it_once_and_replays_the_same_decision(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    same = store.SettleRequest("a", claim.token, Decision.completed())
    other = store.SettleRequest("a", claim.token, Decision.failed("late"))
    results = run(engine, store.settle_many, [same, same, other])
    assert [r.status for r in results] == [SettleStatus.SETTLED, SettleStatus.REPLAYED, SettleStatus.CONFLICT]
    assert row(engine, "a")["outcome"] == "completed"  # type: ignore[index]


def test_settle_refuses_a_non_decision_before_writing(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    before = row(engine, "a")
    with pytest.raises(WatchdogError) as caught:
        run(engine, store.settle, job_id="a", claim_token=claim.token, decision="completed")
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert row(engine, "a") == before


# -- renew / release -----------------------------------------------------------


def test_renew_extends_an_exact_live_claim(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine, lease_ms=1_000)
    first = row(engine, "a")["lease_until"]  # type: ignore[index]
    before = db_clock(engine)
    held = run(engine, store.renew, [(claim.job.job_id, claim.token)], lease_ms=LEASE_MS)
    assert held == {"a"}
    lease_until = row(engine, "a")["lease_until"]  # type: ignore[index]
    assert lease_until > first
    assert lease_until >= before + LEASE_MS


def test_renew_reports_only_the_claims_still_held(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q"), Job("c", "q"))
    a, b, c = claim_one(engine), claim_one(engine), claim_one(engine)
    cancel(engine, "b", "stop-b")
    settle(engine, c, Decision.completed())
    pairs = [(x.job.job_id, x.token) for x in (a, b, c)] + [("a", "claim_wrong")]
    assert run(engine, store.renew, pairs, lease_ms=LEASE_MS) == {"a"}
    assert run(engine, store.renew, [], lease_ms=LEASE_MS) == set()


def test_renew_after_the_lease_expired_is_lost_and_changes_nothing(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    before = row(engine, "a")
    assert run(engine, store.renew, [("a", claim.token)], lease_ms=LEASE_MS, now=far_future()) == set()
    assert row(engine, "a") == before


def test_renew_after_a_cancellation_is_lost(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    cancel(engine, "a", "stop-a")
    before = row(engine, "a")
    assert run(engine, store.renew, [("a", claim.token)], lease_ms=LEASE_MS) == set()
    assert row(engine, "a") == before


def test_release_ends_the_lease_now_and_leaves_the_job_running(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine)
    assert expired(engine) == []
    assert run(engine, store.release, [("a", "claim_wrong")]) == set()
    assert run(engine, store.release, [("a", claim.token)]) == {"a"}
    stored = row(engine, "a")
    assert stored is not None
    assert stored["state"] == "running" and stored["claim_token"] == claim.token
    assert [c.job.job_id for c in expired(engine)] == ["a"]
    assert run(engine, store.renew, [("a", claim.token)], lease_ms=LEASE_MS) == set()
    assert settle(engine, claim, Decision.completed()).status is SettleStatus.CONFLICT


# -- cancel --------------------------------------------------------------------


def test_cancel_records_on_a_queued_and_on_a_running_job(engine: Engine) -> None:
    add(engine, Job("queued", "q"), Job("running", "r"))
    claim_one(engine, queues=["r"])
    assert cancel(engine, "queued", "c1") is CancelStatus.RECORDED
    assert cancel(engine, "running", "c2") is CancelStatus.RECORDED
    assert row(engine, "queued")["cancellation_id"] == "c1"  # type: ignore[index]
    running = row(engine, "running")
    assert running is not None
    assert running["cancellation_id"] == "c2" and running["state"] == "running"
    assert present(run(engine, store.read, "running")).cancellation_requested


def test_cancel_only_if_queued_records_on_a_queued_job(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    assert cancel(engine, "a", "c1", only_if_queued=True) is CancelStatus.RECORDED


def test_cancel_replayed_with_the_same_cancellation_id(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    cancel(engine, "a", "c1")
    assert cancel(engine, "a", "c1") is CancelStatus.REPLAYED
    # still a replay after the cancellation settled the job
    run(engine, store.claim, queues=None, limit=1, lease_ms=LEASE_MS)
    assert row(engine, "a")["outcome"] == "cancelled"  # type: ignore[index]
    assert cancel(engine, "a", "c1") is CancelStatus.REPLAYED


def test_cancel_with_another_cancellation_id_on_a_cancelled_job_is_a_conflict(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    cancel(engine, "a", "c1")
    assert cancel(engine, "a", "c2") is CancelStatus.CONFLICT
    assert row(engine, "a")["cancellation_id"] == "c1"  # type: ignore[index]


def test_cancel_with_a_cancellation_id_used_on_another_job_is_a_conflict(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q"))
    cancel(engine, "a", "c1")
    assert cancel(engine, "b", "c1") is CancelStatus.CONFLICT
    assert row(engine, "b")["cancellation_id"] is None  # type: ignore[index]
    assert cancel(engine, "missing", "c1") is CancelStatus.CONFLICT


def test_cancel_of_a_settled_job_is_a_conflict(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    settle(engine, claim_one(engine), Decision.completed())
    before = row(engine, "a")
    assert cancel(engine, "a", "c1") is CancelStatus.CONFLICT
    assert row(engine, "a") == before


def test_cancel_only_if_queued_on_a_running_job_is_a_conflict(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim_one(engine)
    assert cancel(engine, "a", "c1", only_if_queued=True) is CancelStatus.CONFLICT
    assert row(engine, "a")["cancellation_id"] is None  # type: ignore[index]


def test_cancel_of_an_unknown_job_is_missing(engine: Engine) -> None:
    assert cancel(engine, "nope", "c1") is CancelStatus.MISSING


def test_client_cancel_reports_the_same_statuses(engine: Engine) -> None:
    add(engine, Job("a", "q"), Job("b", "q"))
    watchdog = Watchdog(engine)
    assert watchdog.cancel("a", "c1").status is CancelStatus.RECORDED
    assert watchdog.cancel("a", "c1").status is CancelStatus.REPLAYED
    assert watchdog.cancel("b", "c1").status is CancelStatus.CONFLICT
    assert watchdog.cancel("nope", "c9").status is CancelStatus.MISSING


# -- fail_lane -----------------------------------------------------------------


def test_fail_lane_settles_running_jobs_first_in_batches_and_reports_more(engine: Engine) -> None:
    add(
        engine,
        Job("q1", "q", lane="L"),
        Job("q2", "q", lane="L"),
        Job("r1", "run", lane="L"),
        Job("other", "q", lane="M"),
    )
    running = claim_one(engine, queues=["run"])
    first = run(engine, store.fail_lane, "L", "provider down", batch=2)
    assert sorted(j.job_id for j in first.jobs) == ["q1", "r1"]  # the running one first, then admission order
    assert first.settled == 2 and first.more is True
    for job in first.jobs:
        assert (job.state, job.outcome, job.failure_reason) == (JobState.SETTLED, Outcome.FAILED, "provider down")
    second = run(engine, store.fail_lane, "L", "provider down", batch=2)
    assert [j.job_id for j in second.jobs] == ["q2"] and second.more is False
    third = run(engine, store.fail_lane, "L", "provider down", batch=2)
    assert third.jobs == () and third.settled == 0 and third.more is False
    assert row(engine, "other")["state"] == "queued"  # type: ignore[index]
    # the claim was dropped: the runner's settle and renew are refused
    stored = row(engine, "r1")
    assert stored is not None and stored["claim_token"] is None and stored["lease_until"] is None
    assert settle(engine, running, Decision.completed()).status is SettleStatus.CONFLICT
    assert run(engine, store.renew, [("r1", running.token)], lease_ms=LEASE_MS) == set()
    assert row(engine, "r1") == stored


def test_fail_lane_takes_every_running_job_before_any_queued_one(engine: Engine) -> None:
    add(engine, Job("q0", "q", lane="L"), Job("q1", "q", lane="L"), Job("r2", "r", lane="L"), Job("r3", "r", lane="L"))
    run(engine, store.claim, queues=["r"], limit=2, lease_ms=LEASE_MS)  # the last-admitted two run
    result = run(engine, store.fail_lane, "L", "down", batch=2)
    assert [j.job_id for j in result.jobs] == ["r2", "r3"]
    assert result.more is True
    assert [row(engine, j)["state"] for j in ("q0", "q1")] == ["queued", "queued"]  # type: ignore[index]


def test_fail_lane_leaves_settled_jobs_alone(engine: Engine) -> None:
    add(engine, Job("done", "q", lane="L"), Job("live", "q", lane="L"))
    settle(engine, claim_one(engine), Decision.completed())
    before = row(engine, "done")
    result = run(engine, store.fail_lane, "L", "down")
    assert [j.job_id for j in result.jobs] == ["live"]
    assert row(engine, "done") == before


def test_fail_lane_of_a_queues_name_takes_its_default_lane_jobs_and_jobs_given_that_lane(engine: Engine) -> None:
    # A default-lane job is found through its queue (ix_watchdog_jobs_live_queue), a job
    # given a lane of its own through ix_watchdog_jobs_live_lane: "mail" is both here.
    add(
        engine,
        Job("m1", "mail"),
        Job("m2", "mail", priority=5),
        Job("m3", "mail", run_at=datetime(2099, 1, 1, tzinfo=UTC)),
        Job("tenant", "mail", lane="tenant-7"),  # in the queue, not in the lane
        Job("bulk", "bulk", lane="mail"),  # in the lane, not in the queue
        Job("sms", "sms"),
    )
    assert claim_one(engine, queues=["mail"]).job.job_id == "m2"
    first = run(engine, store.fail_lane, "mail", "provider down", batch=2)
    assert "m2" in {j.job_id for j in first.jobs} and first.more is True  # the running job first
    failed = {j.job_id for j in first.jobs}
    while True:
        more = run(engine, store.fail_lane, "mail", "provider down", batch=2)
        failed |= {j.job_id for j in more.jobs}
        if not more.more:
            break
    assert failed == {"m1", "m2", "m3", "bulk"}
    assert {j: row(engine, j)["outcome"] for j in failed} == dict.fromkeys(failed, "failed")  # type: ignore[index]
    assert [row(engine, j)["state"] for j in ("tenant", "sms")] == ["queued", "queued"]  # type: ignore[index]
    assert not lane_has_live_jobs(engine, "mail") and lane_has_live_jobs(engine, "tenant-7")
    assert run(engine, store.fail_lane, "tenant-7", "down").settled == 1
    assert not lane_has_live_jobs(engine, "tenant-7") and lane_has_live_jobs(engine, "sms")


def lane_has_live_jobs(engine: Engine, lane: str) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(maintenance_sql.lane_has_live_jobs(), {"lane_name": lane}).scalar())


def test_client_fail_lane_reports_count_and_more(engine: Engine) -> None:
    add(engine, *(Job(f"j{i}", "q", lane="L") for i in range(3)))
    result = Watchdog(engine).fail_lane("L", "down")
    assert (result.settled, result.more) == (3, False)
    assert Watchdog(engine).fail_lane("L", "down").settled == 0


def test_fail_lane_refuses_an_empty_reason(engine: Engine) -> None:
    add(engine, Job("a", "q", lane="L"))
    with pytest.raises(WatchdogError):
        run(engine, store.fail_lane, "L", "")
    assert row(engine, "a")["state"] == "queued"  # type: ignore[index]


# -- purge ---------------------------------------------------------------------


def test_purge_deletes_only_queued_jobs_of_the_queue_and_returns_the_count(engine: Engine) -> None:
    add(
        engine,
        Job("running", "q"),
        Job("settled", "q"),
        Job("queued-1", "q"),
        Job("queued-2", "q"),
        Job("elsewhere", "other"),
    )
    claim_one(engine)
    settle(engine, claim_one(engine), Decision.completed())
    running, settled = row(engine, "running"), row(engine, "settled")
    assert run(engine, store.purge, "q") == 2
    assert row(engine, "queued-1") is None and row(engine, "queued-2") is None
    assert row(engine, "running") == running
    assert row(engine, "settled") == settled
    assert row(engine, "elsewhere")["state"] == "queued"  # type: ignore[index]
    assert run(engine, store.purge, "q") == 0
    assert Watchdog(engine).purge("other") == 1


# -- recovery ------------------------------------------------------------------


def test_expired_claims_lists_only_ended_leases_earliest_first(engine: Engine) -> None:
    add(engine, Job("long", "q"), Job("short", "q"), Job("live", "q"), Job("queued", "q"))
    long = claim_one(engine, lease_ms=600)
    claim_one(engine, lease_ms=300)
    claim_one(engine, lease_ms=LEASE_MS * 100)
    assert expired(engine) == []
    wait_for_db_clock_past(engine, row(engine, long.job.job_id)["lease_until"])  # type: ignore[index]
    found = expired(engine)
    assert [c.job.job_id for c in found] == ["short", "long"]
    assert [c.token for c in found] == [row(engine, j)["claim_token"] for j in ("short", "long")]  # type: ignore[index]
    assert [c.job.job_id for c in expired(engine, limit=1)] == ["short"]


def test_reconcile_requeues_within_the_budget_counting_the_recovery(engine: Engine) -> None:
    add(engine, Job("a", "q", max_recoveries=2))
    claim_one(engine)
    first = expire_and_reconcile(engine, "a")
    assert first.status == "requeued"
    assert first.job is not None
    assert (first.job.state, first.job.recovery_count, first.job.outcome) == (JobState.QUEUED, 1, None)
    stored = row(engine, "a")
    assert stored is not None
    assert stored["claim_token"] is None and stored["lease_until"] is None
    reclaimed = claim_one(engine)
    assert reclaimed.job.recovery_count == 1
    assert expire_and_reconcile(engine, "a").status == "requeued"
    assert row(engine, "a")["recovery_count"] == 2  # type: ignore[index]
    claim_one(engine)
    last = expire_and_reconcile(engine, "a")
    assert last.status == "settled"
    assert last.job is not None
    assert (last.job.outcome, last.job.failure_reason) == (
        Outcome.INTERRUPTED,
        "Restart recovery budget exhausted (2 recoveries)",
    )
    assert last.job.recovery_count == 2


def test_reconcile_with_a_zero_budget_interrupts_at_once(engine: Engine) -> None:
    add(engine, Job("a", "q", max_recoveries=0))
    claim_one(engine)
    result = expire_and_reconcile(engine, "a")
    assert result.status == "settled"
    assert result.job is not None
    assert result.job.outcome is Outcome.INTERRUPTED
    assert result.job.failure_reason == "Restart recovery budget exhausted (0 recoveries)"


def test_reconcile_without_a_policy_interrupts_with_the_exact_reason(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim_one(engine)
    result = expire_and_reconcile(engine, "a")
    assert result.status == "settled"
    stored = row(engine, "a")
    assert stored is not None
    assert (stored["state"], stored["outcome"], stored["failure_reason"]) == ("settled", "interrupted", NO_POLICY)
    assert stored["lease_until"] is None
    assert stored["recovery_count"] == 0


@pytest.mark.parametrize("max_recoveries", [None, 0, 3], ids=["no-policy", "exhausted", "within-budget"])
def test_reconcile_of_a_cancelled_claim_settles_it_cancelled(engine: Engine, max_recoveries: int | None) -> None:
    add(engine, Job("a", "q", max_recoveries=max_recoveries))
    claim_one(engine)
    cancel(engine, "a", "c1")
    result = expire_and_reconcile(engine, "a")
    assert result.status == "settled"
    assert result.job is not None
    assert (result.job.state, result.job.outcome, result.job.failure_reason) == (
        JobState.SETTLED,
        Outcome.CANCELLED,
        None,
    )
    assert result.job.recovery_count == 0


def test_reconcile_loses_the_race_when_the_token_changed(engine: Engine) -> None:
    add(engine, Job("a", "q", max_recoveries=5))
    claim = claim_one(engine)
    end_lease(engine, "a")
    (stale,) = expired(engine)
    assert run(engine, store.reconcile, stale).status == "requeued"
    claim_one(engine)  # a new claim of the same job, with a new token
    before = row(engine, "a")
    assert before is not None and before["claim_token"] != claim.token
    # the first observation's claim is gone; recovering it again must not touch the new claim
    end_lease(engine, "a")  # even once the new claim's lease ended too
    before = row(engine, "a")
    result = run(engine, store.reconcile, stale)
    assert (result.status, result.job) == ("lost_race", None)
    assert row(engine, "a") == before


def test_reconcile_loses_the_race_when_the_recovery_count_changed(engine: Engine) -> None:
    add(engine, Job("a", "q", max_recoveries=5))
    claim_one(engine)
    end_lease(engine, "a")
    (observed,) = expired(engine)
    moved = Claim(dataclasses.replace(observed.job, recovery_count=observed.job.recovery_count + 1), observed.token)
    before = row(engine, "a")
    assert run(engine, store.reconcile, moved).status == "lost_race"
    assert row(engine, "a") == before


def test_reconcile_loses_the_race_while_the_lease_is_still_live(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    observed = claim_one(engine)
    assert expired(engine) == []
    before = row(engine, "a")
    result = run(engine, store.reconcile, observed)  # its lease lives by the database clock
    assert result.status == "lost_race"
    assert row(engine, "a") == before


def test_reconcile_loses_the_race_after_the_claim_settled(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    observed = claim = claim_one(engine)
    settle(engine, claim, Decision.completed())
    before = row(engine, "a")
    assert run(engine, store.reconcile, observed).status == "lost_race"
    assert row(engine, "a") == before


@pytest.mark.parametrize("max_recoveries", [None, 3], ids=["interrupt", "requeue"])
def test_two_concurrent_reconciles_of_one_expired_claim_exactly_one_wins(
    engine: Engine, max_recoveries: int | None
) -> None:
    add(engine, Job("a", "q", max_recoveries=max_recoveries))
    claim_one(engine)
    end_lease(engine, "a")
    (observed,) = expired(engine)
    barrier = threading.Barrier(2, timeout=10)
    results: list[str] = []
    errors: list[BaseException] = []

    def recover() -> None:
        try:
            barrier.wait()
            results.append(store.retrying(lambda: run(engine, store.reconcile, observed)).status)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=recover) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    winner = "requeued" if max_recoveries else "settled"
    assert sorted(results) == sorted([winner, "lost_race"])
    assert row(engine, "a")["recovery_count"] == (1 if max_recoveries else 0)  # type: ignore[index]


# -- clocks --------------------------------------------------------------------


def test_app_clock_behind_cannot_keep_an_expired_lease_alive(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    claim = claim_one(engine, lease_ms=200)
    before = row(engine, "a")
    assert before is not None
    wait_for_db_clock_past(engine, before["lease_until"])
    behind = store.now_ms() - TEN_MINUTES_MS
    assert settle(engine, claim, Decision.completed(), now=behind).status is SettleStatus.CONFLICT
    assert run(engine, store.renew, [("a", claim.token)], lease_ms=LEASE_MS, now=behind) == set()
    assert row(engine, "a") == before
    # recovery goes by the database clock, whatever the recoverer's clock says
    assert [c.job.job_id for c in expired(engine)] == ["a"]


def test_app_clock_behind_cannot_shorten_a_lease(engine: Engine) -> None:
    add(engine, Job("a", "q"))
    behind = store.now_ms() - TEN_MINUTES_MS
    start = db_clock(engine)
    claim = claim_one(engine)
    assert row(engine, "a")["lease_until"] >= start + LEASE_MS  # type: ignore[index]
    assert expired(engine) == []
    start = db_clock(engine)
    assert run(engine, store.renew, [("a", claim.token)], lease_ms=LEASE_MS, now=behind) == {"a"}
    assert row(engine, "a")["lease_until"] >= start + LEASE_MS  # type: ignore[index]


def test_app_clock_ahead_cannot_extend_a_lease_beyond_db_time_plus_lease(engine: Engine) -> None:
    """A worker whose clock runs ahead must not hold a claim longer than the
    lease by the database clock: were it to crash, recovery would wait for
    its skew on top of the lease."""
    add(engine, Job("a", "q"))
    skew = 5 * 60 * 1000  # 5 minutes ahead, with a 60 s lease
    claim = claim_one(engine)
    assert row(engine, "a")["lease_until"] <= db_clock(engine) + LEASE_MS  # type: ignore[index]
    run(engine, store.renew, [("a", claim.token)], lease_ms=LEASE_MS, now=store.now_ms() + skew)
    assert row(engine, "a")["lease_until"] <= db_clock(engine) + LEASE_MS  # type: ignore[index]


# -- the hot statements reach the driver precompiled (store.execute_rows) ---------


def test_a_hot_statement_opens_the_transaction_its_caller_commits_or_rolls_back(engine: Engine) -> None:
    """The claim, settle and enqueue statements go to the DBAPI cursor as
    text; the SQLAlchemy transaction still begins with them, so the caller's
    ``commit()`` makes them durable and its ``rollback()`` drops them."""
    with engine.connect() as conn:
        store.enqueue(conn, [Job("dropped", "q")])
        assert conn.in_transaction()
        conn.rollback()
    with engine.connect() as conn:
        store.enqueue(conn, [Job("kept", "q")])
        conn.commit()
    assert row(engine, "dropped") is None and row(engine, "kept") is not None
    with engine.connect() as conn:
        [claim] = store.claim(conn, queues=["q"], limit=5, lease_ms=LEASE_MS).claimed
        conn.rollback()
    assert row(engine, "kept")["state"] == "queued"  # type: ignore[index]
    with engine.connect() as conn:
        [claim] = store.claim(conn, queues=["q"], limit=5, lease_ms=LEASE_MS).claimed
        conn.commit()
    assert row(engine, "kept")["claim_token"] == claim.token  # type: ignore[index]


def test_listeners_see_every_hot_statement_and_their_answers_are_the_same(engine: Engine) -> None:
    """With engine events listening (OpenTelemetry's SQLAlchemy
    instrumentation, a test counting statements), the hot statements go
    through SQLAlchemy's execution and every listener sees them."""
    from sqlalchemy import event

    seen: list[str] = []

    def listen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        seen.append(statement)

    add(engine, Job("quiet", "q", payload={"n": 1}))
    quiet = claim_one(engine, queues=["q"])
    event.listen(engine, "after_cursor_execute", listen)
    try:
        add(engine, Job("heard", "q", payload={"n": 1}))
        heard = claim_one(engine, queues=["q", "other"])
        # Claimed through the driver's tuples (quiet) or SQLAlchemy's rows
        # (heard), a job reads back as the same JobView as store.read gives.
        assert [quiet.job, heard.job] == [run(engine, store.read, "quiet"), run(engine, store.read, "heard")]
        settled = [settle(engine, c, Decision.completed()) for c in (quiet, heard)]
    finally:
        event.remove(engine, "after_cursor_execute", listen)
    assert any(s.startswith("INSERT INTO watchdog_jobs") for s in seen)
    assert any("started_at=CASE" in s for s in seen)  # the claim
    # Each settle's guarded write (MariaDB's locking read before it names the settles too).
    assert sum("settles" in s and not s.lstrip().startswith("SELECT") for s in seen) == 2
    assert [s.status for s in settled] == [SettleStatus.SETTLED, SettleStatus.SETTLED]
    assert [s.job.outcome for s in settled] == [Outcome.COMPLETED, Outcome.COMPLETED]  # type: ignore[union-attr]


@pytest.mark.parametrize("dialect", ["postgresql"])  # a server backend to terminate
def test_a_dropped_connection_under_a_hot_statement_is_invalidated_and_transient(engine: Engine) -> None:
    """A driver error in the precompiled path takes SQLAlchemy's own route:
    wrapped as ``DBAPIError``, the connection invalidated on a disconnect,
    so the runner's retry starts over on a fresh connection."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    add(engine, Job("a", "q"))
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.commit()
        with engine.connect() as killer:
            killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(DBAPIError) as raised:
            store.claim(conn, queues=["q"], limit=1, lease_ms=LEASE_MS)
        assert raised.value.connection_invalidated and store.is_transient(raised.value)
        assert conn.invalidated
    assert row(engine, "a")["state"] == "queued"  # type: ignore[index]
    assert claim_one(engine, queues=["q"]).job.job_id == "a"


@pytest.mark.parametrize("dialect", ["postgresql"])  # prepared statements: psycopg's
def test_a_connection_whose_server_lost_its_prepared_statements_is_replaced_and_the_next_call_works(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg's cache of prepared statements and its server session disagree
    (a ``DEALLOCATE`` psycopg did not see; a transaction-mode pooler). In
    autocommit, the store's mode on PostgreSQL, no rollback clears that cache:
    the pooled connection failed every claim for ever, and a runner retried
    it for ever. The call that meets it fails with PreparedStatementsRefused
    (its remedy named); the connection is replaced, and the next call works."""
    from sqlalchemy import create_engine

    from sqlalchemy_watchdog import PreparedStatementsRefused, follow_failover
    from sqlalchemy_watchdog.gateway import SyncGateway
    from sqlalchemy_watchdog.store import views

    # A claim slowed by a busy machine would be sent anew (views._replan_if_slow), and counted apart.
    monkeypatch.setattr(views, "REPLAN_AFTER_S", 60.0)
    add(engine, *(Job(f"j{n}", "q") for n in range(10)))
    own = create_engine(engine.url, pool_size=1, max_overflow=0)  # one connection: each call gets it again
    try:
        follow_failover(own)  # as every runner and Watchdog do
        gateway = SyncGateway(own)

        def claim() -> store.ClaimBatch:
            return gateway.run(store.claim, queues=["q"], limit=1, lease_ms=LEASE_MS)

        with gateway.holding():  # as a runner's loop does: one connection across its calls
            for _ in range(6):  # psycopg prepares the claim at its sixth execution
                assert len(claim().claimed) == 1
            raw = gateway._held.conn.connection.driver_connection
            names = [row[0] for row in raw.execute("SELECT name FROM pg_prepared_statements", prepare=False)]
            assert names, "the claim is prepared"
            for name in names:  # behind psycopg's back: it still counts them prepared
                raw.execute(f"DEALLOCATE {name}", prepare=False)
            with pytest.raises(PreparedStatementsRefused, match="prepare_threshold"):
                claim()
            assert [len(claim().claimed) for _ in range(3)] == [1, 1, 1]
    finally:
        own.dispose()
    assert sum(row(engine, f"j{n}")["state"] == "running" for n in range(10)) == 9  # type: ignore[index]


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_async_a_connection_whose_server_lost_its_prepared_statements_is_replaced(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through ``AsyncGateway`` (the ``AsyncRunner``'s calls), on
    psycopg's async connection: refused once, then the next call works."""
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine

    from sqlalchemy_watchdog import PreparedStatementsRefused, follow_failover
    from sqlalchemy_watchdog.gateway import AsyncGateway
    from sqlalchemy_watchdog.store import views
    from tests.conftest import async_url

    monkeypatch.setattr(views, "REPLAN_AFTER_S", 60.0)
    add(engine, *(Job(f"j{n}", "q") for n in range(10)))

    async def scenario() -> list[int]:
        own = create_async_engine(async_url(engine.url), pool_size=1, max_overflow=0)
        try:
            follow_failover(own)
            gateway = AsyncGateway(own)

            async def claim() -> int:
                return len((await gateway.run(store.claim, queues=["q"], limit=1, lease_ms=LEASE_MS)).claimed)

            async with gateway.holding():
                assert [await claim() for _ in range(6)] == [1] * 6  # prepared at the sixth
                held = gateway._held[asyncio.current_task()]  # type: ignore[index]
                assert held is not None
                raw: Any = (await held.get_raw_connection()).driver_connection
                names = [
                    row[0] for row in await (await raw.execute("SELECT name FROM pg_prepared_statements")).fetchall()
                ]
                assert names, "the claim is prepared"
                for name in names:
                    await raw.execute(f"DEALLOCATE {name}", prepare=False)
                with pytest.raises(PreparedStatementsRefused):
                    await claim()
                return [await claim() for _ in range(3)]
        finally:
            await own.dispose()

    assert asyncio.run(scenario()) == [1, 1, 1]


def test_shutdown_recovery_takes_the_current_claim_of_a_job_whose_older_execution_is_still_held(
    engine: Engine,
) -> None:
    """A runner may hold two executions of one job (a handler that overstayed
    its lease, and the job's next claim): shutdown hands both pairs over, and
    the current claim is recovered whatever their order."""
    add(engine, Job("a", "q", max_recoveries=1))
    claim = claim_one(engine)
    recoveries = run(engine, store.release_and_recover, [("a", claim.token), ("a", "claim_overstayed")])
    assert [(r.job_id, r.status) for r in recoveries] == [("a", store.RecoveryStatus.REQUEUED)]
    stored = row(engine, "a")
    assert stored is not None and (stored["state"], stored["recovery_count"]) == ("queued", 1)
