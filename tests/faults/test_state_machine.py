"""Fault 9: a Hypothesis state machine against an in-memory model of docs/design.md.

Hypothesis drives random sequences of enqueue, claim, settle, renew,
cancel, fail_lane, purge, recover (expired_claims + reconcile, including
replays of stale recoveries), reads and the passing of time through the
store functions, on SQLite and PostgreSQL, and compares the database with a
plain-Python model of the design after every step.

Time: the database clock is the model's (see
:func:`tests.faults.helpers.controlled_db_clock`: the statements read it
from a one-row table the machine sets), so leases end exactly when the model
says. The application clock passed as ``now=`` is the database clock plus a
drawn skew (none, +-40 ms, +-10 minutes): the model follows docs/design.md#time as
fixed for skewed clocks -- a holder's settle and renew need ``lease_until >
max(app now, db clock)``, leases are extended from the database clock, and
recovery takes a claim only when ``lease_until <= db clock``.

Invariants after every step: the CHECK grammar holds on every row; a
settled row never changes again; ``recovery_count <= recovery_max``; at most
one live claim per job (probed with a rolled-back renew of every claim ever
issued); and the database equals the model, column by column, with rows in
admission order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, delete

from sqlalchemy_watchdog import Decision, EnqueueConflict, Job, Outcome, store
from sqlalchemy_watchdog.jobs import CancelStatus, SettleStatus, bound_reason
from sqlalchemy_watchdog.model import jobs_table
from tests.faults.helpers import controlled_db_clock, dump_jobs

JOB_IDS = ["a", "b", "c", "d", "e", "f"]
QUEUES = ["q1", "q2"]
LANES = ["l1", "l2"]
CANCEL_IDS = ["x1", "x2", "x3", "x4"]
LEASES = [100, 1_000, 5_000]
SKEWS = [0, 0, 0, 40, -40, 600_000, -600_000]
BASE = 1_700_000_000_000

DECISIONS = [
    Decision.completed(),
    Decision.failed("boom"),
    Decision.outcome_unknown(),
    Decision.outcome_unknown("maybe"),
    Decision(Outcome.COMPLETED, "with a note"),
]

jobs_strategy = st.builds(
    Job,
    job_id=st.sampled_from(JOB_IDS),
    queue=st.sampled_from(QUEUES),
    lane=st.sampled_from(LANES),
    priority=st.sampled_from([-1, 0, 1]),
    payload=st.sampled_from([None, 1, {"k": "v"}, ["x", 2]]),
    max_recoveries=st.sampled_from([None, 0, 1, 2]),
)

LIVE = ("queued", "running")


@dataclass
class Row:
    """One job as docs/design.md#the-table says it is stored."""

    order: int
    job_id: str
    queue_name: str
    lane: str
    priority: int
    payload_json: str
    recovery_max: int | None
    state: str = "queued"
    outcome: str | None = None
    claim_token: str | None = None
    recovery_count: int = 0
    cancellation_id: str | None = None
    failure_reason: str | None = None
    #: A handler's traceback: the settles modelled here carry none.
    failure_detail: str | None = None
    lease_until: int | None = None
    # Revision w0003: the jobs here have no time or retry policy of their own.
    run_at: int | None = None
    ready_at: int | None = None
    attempt: int = 1
    max_attempts: int | None = None
    retry_policy: str | None = None
    timeout_ms: int | None = None
    snoozes: int = 0
    failure_history: str | None = None

    def columns(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "order"}


@dataclass
class Model:
    rows: dict[str, Row] = field(default_factory=dict)
    admitted: int = 0

    def same(self, row: Row, job: Job) -> bool:
        return (row.queue_name, row.lane, row.priority, row.payload_json, row.recovery_max) == (
            job.queue,
            job.lane,
            job.priority,
            job.payload_json,
            job.max_recoveries,
        )

    def admit(self, job: Job) -> None:
        self.admitted += 1
        self.rows[job.job_id] = Row(
            self.admitted, job.job_id, job.queue, job.lane, job.priority, job.payload_json, job.max_recoveries
        )

    def live_claim(self, job_id: str, token: str, now: int) -> bool:
        """Would the holder of ``token`` pass a lease check at ``now``
        (``max(app now, db clock)``)?"""
        row = self.rows.get(job_id)
        return (
            row is not None
            and row.state == "running"
            and row.claim_token == token
            and row.lease_until is not None
            and row.lease_until > now
        )


#: Columns of revision w0004 (operations), modelled with pause, prune and
#: rerun by the operations rules.
OPERATIONS_COLUMNS = {"enqueued_at", "started_at", "settled_at", "rerun_of"}
COLUMNS = [c.name for c in jobs_table.columns if c.name != "sequence" and c.name not in OPERATIONS_COLUMNS]


class WatchdogMachine(RuleBasedStateMachine):
    engine: Engine

    def __init__(self, engine: Engine, set_clock: Any) -> None:
        super().__init__()
        self.engine = engine
        self.set_clock = set_clock

    # -- plumbing ---------------------------------------------------------------

    def tx(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with store.write_transaction(self.engine) as conn:
            return fn(conn, *args, **kwargs)

    @property
    def db(self) -> int:
        """The database clock."""
        return BASE + self.t

    @initialize(jobs=st.lists(jobs_strategy, min_size=2, max_size=8))
    def start(self, jobs: list[Job]) -> None:
        with store.write_transaction(self.engine) as conn:
            conn.execute(delete(jobs_table))
        self.t = 0
        self.set_clock(self.db)
        self.model = Model()
        self.claims: list[tuple[str, str]] = []  # every (job_id, token) ever issued
        self.expired_seen: list[store.Claim] = []
        self.settled_rows: dict[str, dict[str, Any]] = {}
        for job in jobs:  # start with some work (conflicting replays are refused as usual)
            self.enqueue([job])

    # -- rules ------------------------------------------------------------------

    @rule(jobs=st.lists(jobs_strategy, min_size=1, max_size=3))
    def enqueue(self, jobs: list[Job]) -> None:
        first: dict[str, Job] = {}
        conflict = False
        for job in jobs:
            seen = first.setdefault(job.job_id, job)
            row = self.model.rows.get(job.job_id)
            if (seen is not job and not _same_job(seen, job)) or (row is not None and not self.model.same(row, job)):
                conflict = True
        if conflict:
            with pytest.raises(EnqueueConflict):
                self.tx(store.enqueue, jobs)
            return
        results = self.tx(store.enqueue, jobs)
        expected = []
        for job in jobs:
            if job.job_id in self.model.rows:
                expected.append("duplicate")
            else:
                self.model.admit(job)
                expected.append("queued")
        assert [r.status.value for r in results] == expected

    @rule(
        queues=st.one_of(st.none(), st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2, unique=True)),
        limit=st.integers(1, 3),
        lease=st.sampled_from(LEASES),
        skew=st.sampled_from(SKEWS),
    )
    def claim(self, queues: list[str] | None, limit: int, lease: int, skew: int) -> None:
        db = self.db
        candidates = sorted(
            (r for r in self.model.rows.values() if r.state == "queued" and (queues is None or r.queue_name in queues)),
            key=lambda r: (-r.priority, r.order),
        )[:limit]
        batch = self.tx(store.claim, queues=queues, limit=limit, lease_ms=lease)
        runnable = [r.job_id for r in candidates if r.cancellation_id is None]
        cancelled = [r.job_id for r in candidates if r.cancellation_id is not None]
        assert [c.job.job_id for c in batch.claimed] == runnable
        assert sorted(j.job_id for j in batch.cancelled) == sorted(cancelled)
        tokens = {c.job.job_id: c.token for c in batch.claimed}
        assert len(set(tokens.values())) == len(tokens), "each claimed job its own token"
        for row in candidates:
            if row.cancellation_id is None:
                row.state, row.claim_token, row.lease_until = "running", tokens[row.job_id], db + lease
                self.claims.append((row.job_id, row.claim_token))
            else:
                row.state, row.outcome = "settled", "cancelled"

    @rule(data=st.data(), decision=st.sampled_from(DECISIONS), skew=st.sampled_from(SKEWS))
    def settle(self, data: st.DataObject, decision: Decision, skew: int) -> None:
        if self.claims and data.draw(st.integers(0, 4), "known claim?") > 0:
            job_id, token = data.draw(st.sampled_from(self.claims), "claim")
        else:
            job_id, token = data.draw(st.sampled_from(JOB_IDS), "job"), "claim_bogus"
        app = self.db + skew
        row = self.model.rows.get(job_id)
        result = self.tx(store.settle, job_id=job_id, claim_token=token, decision=decision, now=app)
        if self.model.live_claim(job_id, token, max(app, self.db)):
            assert result.status is SettleStatus.SETTLED
            assert row is not None
            row.state, row.lease_until = "settled", None
            if row.cancellation_id is None:
                row.outcome, row.failure_reason = decision.outcome.value, decision.reason
            else:
                row.outcome, row.failure_reason = "cancelled", None
        elif row is None:
            assert result.status is SettleStatus.MISSING
        else:
            expected = decision.outcome.value if row.cancellation_id is None else "cancelled"
            replay = row.state == "settled" and row.claim_token == token and row.outcome == expected
            assert result.status is (SettleStatus.REPLAYED if replay else SettleStatus.CONFLICT)

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data(), lease=st.sampled_from(LEASES), skew=st.sampled_from(SKEWS))
    def renew(self, data: st.DataObject, lease: int, skew: int) -> None:
        pairs = data.draw(st.lists(st.sampled_from(self.claims), min_size=1, max_size=3), "claims")
        db, app = self.db, self.db + skew
        held = {
            j
            for j, tok in pairs
            if self.model.live_claim(j, tok, max(app, db)) and self.model.rows[j].cancellation_id is None
        }
        assert self.tx(store.renew, pairs, lease_ms=lease, now=app) == held
        for job_id in held:
            self.model.rows[job_id].lease_until = db + lease

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """A stopping runner ends the leases of claims it could not finish."""
        pairs = data.draw(st.lists(st.sampled_from(self.claims), min_size=1, max_size=3), "claims")
        ended = {
            j for j, tok in pairs if (r := self.model.rows.get(j)) and r.state == "running" and r.claim_token == tok
        }
        assert self.tx(store.release, pairs) == ended
        for job_id in ended:
            self.model.rows[job_id].lease_until = self.db - 1

    @rule(
        job_id=st.sampled_from(JOB_IDS),
        cancellation_id=st.sampled_from(CANCEL_IDS),
        only_if_queued=st.booleans(),
    )
    def cancel(self, job_id: str, cancellation_id: str, only_if_queued: bool) -> None:
        holder = next((r.job_id for r in self.model.rows.values() if r.cancellation_id == cancellation_id), None)
        row = self.model.rows.get(job_id)
        if holder is not None:
            expected = CancelStatus.REPLAYED if holder == job_id else CancelStatus.CONFLICT
        elif row is None:
            expected = CancelStatus.MISSING
        elif row.cancellation_id is None and row.state in (("queued",) if only_if_queued else LIVE):
            expected = CancelStatus.RECORDED
            row.cancellation_id = cancellation_id
        else:
            expected = CancelStatus.CONFLICT
        result = self.tx(store.cancel, job_id, cancellation_id, only_if_queued=only_if_queued)
        assert result.status is expected

    @rule(
        lane=st.sampled_from(LANES),
        batch=st.integers(1, 4),
        reason=st.sampled_from(["lane down", "r" * 2100, "nul\x00inside"]),
    )
    def fail_lane(self, lane: str, batch: int, reason: str) -> None:
        live = sorted(
            (r for r in self.model.rows.values() if r.lane == lane and r.state in LIVE),
            key=lambda r: (0 if r.state == "running" else 1, r.order),
        )
        taken, rest = live[:batch], live[batch:]
        result = self.tx(store.fail_lane, lane, reason, batch=batch)
        assert [j.job_id for j in result.jobs] == [r.job_id for r in sorted(taken, key=lambda r: r.order)]
        assert result.more == bool(rest)
        for row in taken:
            row.state, row.outcome, row.failure_reason = "settled", "failed", bound_reason(reason)
            row.lease_until = row.claim_token = None

    @rule(queue=st.sampled_from(QUEUES))
    def purge(self, queue: str) -> None:
        doomed = [j for j, r in self.model.rows.items() if r.queue_name == queue and r.state == "queued"]
        assert self.tx(store.purge, queue) == len(doomed)
        for job_id in doomed:
            del self.model.rows[job_id]

    def _reconcile_expected(self, claim: store.Claim) -> tuple[str, Row | None]:
        now = self.db
        row = self.model.rows.get(claim.job.job_id)
        if (
            row is None
            or row.state != "running"
            or row.claim_token != claim.token
            or row.recovery_count != claim.job.recovery_count
            or row.lease_until is None
            or row.lease_until > now
        ):
            return "lost_race", None
        view = claim.job
        requeue = view.max_recoveries is not None and view.recovery_count < view.max_recoveries
        row.lease_until = None
        if row.cancellation_id is not None:
            row.state, row.outcome, row.failure_reason = "settled", "cancelled", None
            return "settled", row
        if requeue:
            row.state, row.claim_token, row.failure_reason = "queued", None, None
            row.recovery_count += 1
            return "requeued", row
        row.state, row.outcome, row.failure_reason = "settled", "interrupted", store.recovery_reason(view)
        return "settled", row

    @rule(limit=st.integers(1, 3))
    def recover(self, limit: int) -> None:
        now = self.db
        expected = sorted(
            (r for r in self.model.rows.values() if r.state == "running" and r.lease_until <= now),
            key=lambda r: (r.lease_until, r.order),
        )[:limit]
        expired = self.tx(store.expired_claims, limit=limit)
        assert [(c.job.job_id, c.token) for c in expired] == [(r.job_id, r.claim_token) for r in expected]
        self.expired_seen.extend(expired)
        for claim in expired:
            status, _ = self._reconcile_expected(claim)
            assert self.tx(store.reconcile, claim).status == status

    @precondition(lambda self: bool(self.expired_seen))
    @rule(data=st.data())
    def recover_stale(self, data: st.DataObject) -> None:
        """A recoverer acting on a claim it listed earlier: it only wins if
        nothing happened to the job since."""
        claim = data.draw(st.sampled_from(self.expired_seen), "stale claim")
        status, _ = self._reconcile_expected(claim)
        assert self.tx(store.reconcile, claim).status == status

    @rule(ms=st.sampled_from([1, 99, 100, 500, 1_000, 6_000]))
    def advance_time(self, ms: int) -> None:
        self.t += ms
        self.set_clock(self.db)

    @rule(job_id=st.sampled_from(JOB_IDS), queue=st.sampled_from(QUEUES), limit=st.integers(1, 4))
    def reads(self, job_id: str, queue: str, limit: int) -> None:
        rows = self.model.rows
        with self.engine.connect() as conn:
            job = store.read(conn, job_id)
            head = store.read_queue_head(conn, queue)
            settled = store.read_settled(conn, limit)
            pending = store.has_pending_work(conn)
        assert (job is None) == (job_id not in rows)
        if job is not None:
            assert (job.state.value, job.cancellation_requested) == (
                rows[job_id].state,
                rows[job_id].cancellation_id is not None,
            )
        live = sorted(
            (r for r in rows.values() if r.queue_name == queue and r.state in LIVE),
            key=lambda r: (0 if r.state == "running" else 1, -r.priority, r.order),
        )
        assert (head.job_id if head else None) == (live[0].job_id if live else None)
        in_order = sorted((r for r in rows.values() if r.state == "settled"), key=lambda r: r.order)
        assert [j.job_id for j in settled] == [r.job_id for r in in_order[:limit]]
        assert pending == any(r.state in LIVE for r in rows.values())

    # -- invariants ---------------------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        if not hasattr(self, "model"):
            return
        dumped = dump_jobs(self.engine)
        for row in dumped:
            state = row["state"]
            # the CHECK grammar
            if state == "queued":
                assert row["outcome"] is None and row["claim_token"] is None and row["lease_until"] is None, row
            elif state == "running":
                assert row["outcome"] is None and row["claim_token"] and row["lease_until"] is not None, row
            else:
                assert state == "settled" and row["outcome"] is not None and row["lease_until"] is None, row
            # recovery budget
            budget = row["recovery_max"]
            assert row["recovery_count"] <= (0 if budget is None else budget), row
            # settled rows never change
            if state == "settled":
                before = self.settled_rows.setdefault(row["job_id"], row)
                assert row == before, f"a settled job changed: {before} -> {row}"
        # settled rows are never deleted either
        assert set(self.settled_rows) <= {r["job_id"] for r in dumped}
        # the database equals the model, in admission order
        model_rows = sorted(self.model.rows.values(), key=lambda r: r.order)
        assert [r["job_id"] for r in dumped] == [r.job_id for r in model_rows]
        for got, want in zip(dumped, model_rows):
            assert {c: got[c] for c in COLUMNS} == want.columns()

    @invariant()
    def at_most_one_live_claim_per_job(self) -> None:
        if not hasattr(self, "model") or not self.claims:
            return
        now = self.db
        live = [(j, tok) for j, tok in self.claims if self.model.live_claim(j, tok, now)]
        assert len({j for j, _ in live}) == len(live), f"two live claims of one job: {live}"
        # Ask the database too: renew every claim ever issued, then roll back.
        with self.engine.connect() as conn, conn.begin() as transaction:
            held = store.renew(conn, self.claims, lease_ms=1, now=now)
            transaction.rollback()
        uncancelled = {j for j, _ in live if self.model.rows[j].cancellation_id is None}
        assert held == uncancelled


def _same_job(a: Job, b: Job) -> bool:
    return (a.queue, a.lane, a.priority, a.payload_json, a.max_recoveries) == (
        b.queue,
        b.lane,
        b.priority,
        b.payload_json,
        b.max_recoveries,
    )


FAST = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
THOROUGH = settings(FAST, max_examples=300, stateful_step_count=60)


def _run(engine: Engine, config: settings) -> None:
    with controlled_db_clock(engine.url, BASE) as (clocked, set_clock):
        run_state_machine_as_test(lambda: WatchdogMachine(clocked, set_clock), settings=config)


def test_queue_matches_model(engine: Engine) -> None:
    _run(engine, FAST)


@pytest.mark.slow
def test_queue_matches_model_thoroughly(engine: Engine) -> None:
    _run(engine, THOROUGH)
