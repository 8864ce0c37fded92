"""The operations API (revision w0004): timestamps, prune and retention,
list_jobs, stats, pause/resume and rerun, on SQLite and on PostgreSQL.

Every test taking ``api`` runs four ways: ``Watchdog`` and ``AsyncWatchdog``
(:class:`Ops` puts both behind one blocking interface), each on both
dialects. Tests taking ``runners`` drive ``Runner`` and ``AsyncRunner`` (see
tests/runner_kinds.py). Jobs reach their states through the store's own
transitions (claim, settle, cancel, recovery); raw SQL only moves a recorded
time back (an "old" job) or checks what the database itself refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, bindparam, create_engine, event, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sqlalchemy_watchdog import (
    CancelStatus,
    Decision,
    EnqueueConflict,
    EnqueueResult,
    EnqueueStatus,
    InvalidJob,
    Job,
    JobState,
    JobView,
    Outcome,
    PauseStatus,
    QueuePause,
    QueueStats,
    Retention,
    RetryPolicy,
    RunningJob,
    Stats,
    TickStatus,
    Watchdog,
    store,
)
from sqlalchemy_watchdog.asyncio import AsyncWatchdog
from sqlalchemy_watchdog.backends import backend_of
from sqlalchemy_watchdog.jobs import SettleStatus, epoch_ms
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.store import Claim, RecoveryStatus, Settlement, SettleRequest, sql
from tests.conftest import WITH_MARIADB, async_url, make_async_engine
from tests.helpers import add, settled, wait_until
from tests.runner_kinds import RunnerDriver

LEASE_MS = 60_000
#: Slack for comparing a recorded time with the database clock read around it
#: (SQLite's clock goes through a float; both are truncated to milliseconds).
SLACK_MS = 5
HOUR = timedelta(hours=1)
QUEUED, DUPLICATE = EnqueueStatus.QUEUED, EnqueueStatus.DUPLICATE
COMPLETED, FAILED, CANCELLED = Outcome.COMPLETED, Outcome.FAILED, Outcome.CANCELLED
INTERRUPTED, OUTCOME_UNKNOWN = Outcome.INTERRUPTED, Outcome.OUTCOME_UNKNOWN
DELAYED = JobState.DELAYED


# -- the sync and the async API behind one interface ---------------------------------


class Ops:
    """``Watchdog`` (``sync``) or ``AsyncWatchdog`` (``async``, on an event loop
    of its own in a thread) on the test's database, called the same blocking
    way: ``ops.prune(...)`` is ``Watchdog.prune`` or ``await AsyncWatchdog.prune``.

    The API gets an engine of its own, so :meth:`deletes` sees its statements only.
    """

    def __init__(self, kind: str, engine: Engine) -> None:
        self.kind = kind
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._engine: Engine | AsyncEngine
        if kind == "sync":
            self._engine = create_engine(engine.url)
            self.sync_engine = self._engine
            self.watchdog: Any = Watchdog(self._engine)
            return
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="ops-event-loop", daemon=True)
        self._thread.start()

        async def build() -> AsyncEngine:
            return create_async_engine(async_url(engine.url))

        aengine = self._engine = self._await(build())
        self.sync_engine = aengine.sync_engine
        self.watchdog = AsyncWatchdog(aengine)

    def _await(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(120)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.watchdog, name)
        if self._loop is None:
            return method
        return lambda *args, **kwargs: self._await(method(*args, **kwargs))

    @contextlib.contextmanager
    def deletes(self) -> Iterator[list[int]]:
        """The row counts of the DELETE statements on watchdog_jobs this API
        runs inside the block, in order."""
        counts: list[int] = []
        after = deletes_on(counts)
        event.listen(self.sync_engine, "after_cursor_execute", after)
        try:
            yield counts
        finally:
            event.remove(self.sync_engine, "after_cursor_execute", after)

    def close(self) -> None:
        if isinstance(self._engine, AsyncEngine):
            with contextlib.suppress(Exception):
                self._await(self._engine.dispose())
        else:
            self._engine.dispose()
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()


def deletes_on(counts: list[int]) -> Callable[..., None]:
    """An ``after_cursor_execute`` listener recording the row counts of the
    DELETE statements on watchdog_jobs (PostgreSQL's start with a CTE)."""

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "DELETE FROM WATCHDOG_JOBS" in " ".join(statement.upper().split()):
            counts.append(cursor.rowcount)

    return after


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest, engine: Engine) -> Iterator[Ops]:
    """The operations API of one kind (``Watchdog`` / ``AsyncWatchdog``) on ``engine``'s database."""
    ops = Ops(request.param, engine)
    try:
        yield ops
    finally:
        ops.close()


# -- helpers -------------------------------------------------------------------------


def clock(engine: Engine) -> int:
    """The database clock, epoch milliseconds (what the statements record)."""
    with engine.connect() as conn:
        return int(conn.execute(select(sql.db_clock_ms())).scalar_one())


def ms(value: datetime | None) -> int:
    assert value is not None
    return epoch_ms(value)


def within(value: datetime | None, before: int, after: int) -> int:
    """``value`` in epoch ms, asserted to lie between two database clock readings."""
    assert value is not None, "no time recorded"
    at = epoch_ms(value)
    assert before - SLACK_MS <= at <= after + SLACK_MS, (before, at, after)
    return at


def run(engine: Engine, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The store function ``fn(conn, ...)`` in a write transaction of its own."""
    with store.write_transaction(engine) as conn:
        return fn(conn, *args, **kwargs)


def claim(engine: Engine, queue: str, *, limit: int = 1, lease_ms: int = LEASE_MS) -> list[Claim]:
    return list(run(engine, store.claim, queues=[queue], limit=limit, lease_ms=lease_ms).claimed)


def settle(engine: Engine, taken: Claim, decision: Decision, **request: Any) -> Settlement:
    result: Settlement = run(
        engine, store.settle_many, [SettleRequest(taken.job.job_id, taken.token, decision, **request)]
    )[0]
    return result


def view(engine: Engine, job_id: str) -> JobView:
    job = Watchdog(engine).read(job_id)
    assert job is not None, job_id
    return job


def job_ids(engine: Engine) -> list[str]:
    """Every stored job_id, in admission order."""
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT job_id FROM watchdog_jobs ORDER BY sequence")).scalars())


def execute(engine: Engine, statement: str, **params: Any) -> None:
    """Raw SQL in a transaction of its own; ``:ids`` expands to a list."""
    stmt = text(statement)
    if "ids" in params:
        stmt = stmt.bindparams(bindparam("ids", expanding=True))
    with engine.begin() as conn:
        conn.execute(stmt, params)


def settled_ago(engine: Engine, ago: timedelta | None, *ids: str) -> None:
    """Move the jobs' ``settled_at`` to ``ago`` before the database clock
    (None: no recorded time, like a job settled before revision w0004)."""
    if ago is None:
        execute(engine, "UPDATE watchdog_jobs SET settled_at = NULL WHERE job_id IN :ids", ids=list(ids))
    else:
        at = clock(engine) - ago // timedelta(milliseconds=1)
        execute(engine, "UPDATE watchdog_jobs SET settled_at = :at WHERE job_id IN :ids", at=at, ids=list(ids))


Target = JobState | Outcome
DECISIONS = {
    COMPLETED: Decision.completed(),
    FAILED: Decision.failed("boom", retry=False),
    OUTCOME_UNKNOWN: Decision.outcome_unknown("no answer"),
}
FAR = datetime.now(UTC) + timedelta(days=3650)


def populate(engine: Engine, spec: Sequence[tuple[str, str, str | None, Target]]) -> None:
    """Enqueue ``(job_id, queue, lane, target)`` jobs in this order, then bring
    each to its target -- ``JobState.QUEUED`` / ``DELAYED`` / ``RUNNING`` or an
    ``Outcome`` -- through the store's own transitions: claims (cancelled
    ones settle at the claim), settles, and recovery of an ended lease
    (``interrupted``). Priorities steer the claims: jobs to stay queued get 0."""

    def priority(target: Target) -> int:
        return {JobState.QUEUED: 0, JobState.DELAYED: 0, INTERRUPTED: 2}.get(target, 1)

    add(
        engine,
        *(
            Job(
                job_id, queue, lane=lane or job_id, priority=priority(target), run_at=FAR if target is DELAYED else None
            )
            for job_id, queue, lane, target in spec
        ),
    )
    for job_id, _, _, target in spec:
        if target is CANCELLED:
            assert run(engine, store.cancel, job_id, f"cancel:{job_id}").status.value == "recorded"
    for queue in dict.fromkeys(q for _, q, _, _ in spec):
        mine = {job_id: target for job_id, q, _, target in spec if q == queue}
        doomed = [j for j, t in mine.items() if t is INTERRUPTED]
        if doomed:
            taken = claim(engine, queue, limit=len(doomed), lease_ms=1)
            assert sorted(c.job.job_id for c in taken) == sorted(doomed)
            time.sleep(0.02)
            for c in taken:
                assert run(engine, store.reconcile, c).status is RecoveryStatus.SETTLED
        rest = [j for j, t in mine.items() if t not in (JobState.QUEUED, JobState.DELAYED, INTERRUPTED)]
        if not rest:
            continue
        batch = run(engine, store.claim, queues=[queue], limit=len(rest), lease_ms=LEASE_MS)
        assert sorted([c.job.job_id for c in batch.claimed] + [j.job_id for j in batch.cancelled]) == sorted(rest)
        requests = [
            SettleRequest(c.job.job_id, c.token, DECISIONS[target])
            for c in batch.claimed
            if isinstance(target := mine[c.job.job_id], Outcome)
        ]
        if requests:
            results = run(engine, store.settle_many, requests)
            assert {r.status for r in results} == {SettleStatus.SETTLED}
    for job_id, _, _, target in spec:
        job = view(engine, job_id)
        assert (job.state if isinstance(target, JobState) else job.outcome) is target, (job_id, job)


def settle_as(engine: Engine, outcome: Outcome, *ids: str, queue: str | None = None) -> None:
    """Enqueue jobs ``ids`` and settle them with ``outcome`` (see :func:`populate`)."""
    populate(engine, [(job_id, queue or f"settle-{outcome.value}", None, outcome) for job_id in ids])


# -- timestamps ------------------------------------------------------------------------


def test_enqueue_claim_and_settle_record_the_database_clock(engine: Engine, api: Ops) -> None:
    before = clock(engine)
    assert api.enqueue(Job("a", "q")) == EnqueueResult("a", QUEUED)
    enqueued = within(api.read("a").enqueued_at, before, clock(engine))
    assert (api.read("a").started_at, api.read("a").settled_at) == (None, None)

    time.sleep(0.01)
    before = clock(engine)
    [taken] = claim(engine, "q")
    started = within(taken.job.started_at, before, clock(engine))
    job = api.read("a")
    assert (ms(job.enqueued_at), ms(job.started_at), job.settled_at) == (enqueued, started, None)
    assert started > enqueued

    time.sleep(0.01)
    before = clock(engine)
    assert settle(engine, taken, Decision.completed()).status is SettleStatus.SETTLED
    job = api.read("a")
    finished = within(job.settled_at, before, clock(engine))
    assert (ms(job.enqueued_at), ms(job.started_at)) == (enqueued, started)
    assert finished > started
    assert job.settled_at is not None and job.settled_at.tzinfo is not None
    assert job.settled_at.utcoffset() == timedelta(0)


def test_each_attempt_moves_started_at_and_a_requeue_leaves_settled_at_null(engine: Engine, api: Ops) -> None:
    add(engine, Job("a", "q"))
    [first] = claim(engine, "q")
    time.sleep(0.01)
    # A retry: back to queued, its attempt's start kept, not settled.
    assert settle(engine, first, Decision.failed("flaky"), requeue_after_ms=0).status is SettleStatus.REQUEUED
    job = api.read("a")
    assert (job.state, job.attempt, job.settled_at) == (JobState.QUEUED, 2, None)
    assert job.started_at == first.job.started_at

    time.sleep(0.01)
    before = clock(engine)
    [second] = claim(engine, "q")
    assert within(second.job.started_at, before, clock(engine)) > ms(first.job.started_at)
    # A snooze: delayed, not settled either.
    assert settle(engine, second, Decision.snooze(timedelta(milliseconds=1))).status is SettleStatus.REQUEUED
    job = api.read("a")
    assert (job.state, job.settled_at, job.started_at) == (JobState.DELAYED, None, second.job.started_at)

    time.sleep(0.02)
    assert run(engine, store.promote).promoted == 1
    before = clock(engine)
    [third] = claim(engine, "q")
    assert within(third.job.started_at, before, clock(engine)) > ms(second.job.started_at)
    before = clock(engine)
    settle(engine, third, Decision.failed("for good"))
    job = api.read("a")
    assert (job.state, job.outcome, job.attempt) == (JobState.SETTLED, FAILED, 2)
    within(job.settled_at, before, clock(engine))
    assert job.started_at == third.job.started_at


def test_a_job_found_cancelled_at_its_claim_gets_settled_at_and_no_started_at(engine: Engine, api: Ops) -> None:
    api.enqueue(Job("a", "q"))
    assert api.cancel("a", "stop-a").status.value == "recorded"
    before = clock(engine)
    batch = run(engine, store.claim, queues=["q"], limit=1, lease_ms=LEASE_MS)
    after = clock(engine)
    assert batch.claimed == () and [j.job_id for j in batch.cancelled] == ["a"]
    job = api.read("a")
    assert (job.state, job.outcome, job.started_at) == (JobState.SETTLED, CANCELLED, None)
    within(job.settled_at, before, after)


def test_fail_lane_records_settled_at_of_every_job_it_settles(engine: Engine, api: Ops) -> None:
    populate(
        engine,
        [
            ("waiting", "q", "lane-1", JobState.QUEUED),
            ("later", "q", "lane-1", JobState.DELAYED),
            ("busy", "q", "lane-1", JobState.RUNNING),
            ("elsewhere", "q", "lane-2", JobState.QUEUED),
        ],
    )
    started = view(engine, "busy").started_at
    before = clock(engine)
    failure = api.fail_lane("lane-1", "lane broken")
    after = clock(engine)
    assert sorted(j.job_id for j in failure.jobs) == ["busy", "later", "waiting"]
    for job_id in ("waiting", "later", "busy"):
        job = api.read(job_id)
        assert (job.state, job.outcome) == (JobState.SETTLED, FAILED)
        within(job.settled_at, before, after)
    assert api.read("busy").started_at == started
    assert (api.read("waiting").started_at, api.read("elsewhere").settled_at) == (None, None)


def test_recovery_records_settled_at_when_it_settles_and_not_when_it_requeues(engine: Engine, api: Ops) -> None:
    add(engine, Job("a", "q", max_recoveries=1), Job("c", "other"))
    [first] = claim(engine, "q", lease_ms=1)
    time.sleep(0.02)
    recovery = run(engine, store.reconcile, first)
    assert recovery.status is RecoveryStatus.REQUEUED
    job = api.read("a")
    assert (job.state, job.recovery_count, job.settled_at, job.started_at) == (
        JobState.QUEUED,
        1,
        None,
        first.job.started_at,
    )

    [second] = claim(engine, "q", lease_ms=1)
    assert ms(second.job.started_at) > ms(first.job.started_at)
    time.sleep(0.02)
    before = clock(engine)
    assert run(engine, store.reconcile, second).status is RecoveryStatus.SETTLED
    job = api.read("a")
    assert (job.state, job.outcome) == (JobState.SETTLED, INTERRUPTED)
    within(job.settled_at, before, clock(engine))

    # A cancelled running job whose lease ended settles cancelled, with its time.
    [doomed] = claim(engine, "other", lease_ms=1)
    assert api.cancel("c", "stop-c").status.value == "recorded"
    time.sleep(0.02)
    before = clock(engine)
    assert run(engine, store.reconcile, doomed).status is RecoveryStatus.SETTLED
    job = api.read("c")
    assert (job.state, job.outcome) == (JobState.SETTLED, CANCELLED)
    within(job.settled_at, before, clock(engine))


@pytest.mark.parametrize("state", [JobState.DELAYED, JobState.QUEUED, JobState.RUNNING])
def test_the_database_refuses_settled_at_on_a_live_job(engine: Engine, state: JobState) -> None:
    populate(engine, [("live", "q", None, state), ("done", "q", None, COMPLETED)])
    before = view(engine, "live")
    with pytest.raises(IntegrityError, match="settled_at"):
        execute(engine, "UPDATE watchdog_jobs SET settled_at = 1 WHERE job_id = 'live'")
    assert view(engine, "live") == before
    # The same statement on a settled job is fine: the CHECK is about live rows.
    execute(engine, "UPDATE watchdog_jobs SET settled_at = 1 WHERE job_id = 'done'")
    assert ms(view(engine, "done").settled_at) == 1


# -- prune -------------------------------------------------------------------------------


def test_prune_deletes_only_settled_jobs_older_than_the_age(engine: Engine, api: Ops) -> None:
    settle_as(engine, COMPLETED, "old-1", "old-2", "old-3", "recent", "fresh")
    settled_ago(engine, 2 * HOUR, "old-1", "old-2", "old-3")
    settled_ago(engine, timedelta(minutes=59), "recent")
    assert api.prune(older_than=HOUR) == 3
    assert job_ids(engine) == ["recent", "fresh"]
    assert api.prune(older_than=HOUR) == 0
    assert api.prune(older_than=timedelta(minutes=30)) == 1
    assert job_ids(engine) == ["fresh"]
    time.sleep(0.01)
    assert api.prune(older_than=timedelta(0)) == 1
    assert job_ids(engine) == []


def test_prune_takes_only_the_outcomes_asked_for(engine: Engine, api: Ops) -> None:
    for outcome in Outcome:
        settle_as(engine, outcome, f"{outcome.value}-1", f"{outcome.value}-2")
    every = job_ids(engine)
    settled_ago(engine, 2 * HOUR, *every)

    def left(*outcomes: Outcome) -> list[str]:
        return [j for j in every if j.rsplit("-", 1)[0] in {o.value for o in outcomes}]

    assert api.prune(older_than=HOUR, outcomes=[FAILED, "cancelled"]) == 4
    assert job_ids(engine) == left(COMPLETED, INTERRUPTED, OUTCOME_UNKNOWN)
    assert api.prune(older_than=HOUR, outcomes=("interrupted",)) == 2
    assert api.prune(older_than=HOUR, outcomes=[COMPLETED, COMPLETED]) == 2
    assert job_ids(engine) == left(OUTCOME_UNKNOWN)
    assert api.prune(older_than=HOUR) == 2
    assert job_ids(engine) == []


def rows_per_delete(deletes: list[int]) -> list[int]:
    """The rows of each DELETE that deleted any: prune goes outcome by
    outcome, so a batch may take several statements (each within it)."""
    return [n for n in deletes if n]


def test_prune_deletes_the_oldest_first_in_batches_up_to_the_limit(engine: Engine, api: Ops) -> None:
    ids = [f"job-{i:02d}" for i in range(25)]
    settle_as(engine, COMPLETED, *ids)
    for i, job_id in enumerate(ids):  # job-24 settled longest ago: age order is not admission order
        settled_ago(engine, 2 * HOUR + timedelta(minutes=i), job_id)

    with api.deletes() as deletes:
        assert api.prune(older_than=HOUR, batch=10, limit=15) == 15
    assert rows_per_delete(deletes) == [10, 5]
    assert job_ids(engine) == ids[:10]

    with api.deletes() as deletes:
        assert api.prune(older_than=HOUR, batch=4, limit=1) == 1
    assert rows_per_delete(deletes) == [1]
    assert job_ids(engine) == ids[:9]

    with api.deletes() as deletes:
        assert api.prune(older_than=HOUR, batch=4) == 9
    assert rows_per_delete(deletes) == [4, 4, 1]
    assert job_ids(engine) == []


def test_prune_stops_after_a_batch_that_was_not_full(engine: Engine, api: Ops) -> None:
    ids = [f"job-{i}" for i in range(6)]
    settle_as(engine, COMPLETED, *ids)
    settled_ago(engine, 2 * HOUR, *ids)
    with api.deletes() as deletes:
        assert api.prune(older_than=HOUR, batch=3) == 6
    assert rows_per_delete(deletes) == [3, 3]
    with api.deletes() as deletes:
        assert api.prune(older_than=HOUR, batch=3, limit=6) == 0
    assert rows_per_delete(deletes) == []


def test_prune_leaves_jobs_without_a_recorded_time_unless_asked(engine: Engine, api: Ops) -> None:
    settle_as(engine, COMPLETED, "undated-1", "undated-2", "dated-old", "dated-fresh")
    settle_as(engine, FAILED, "undated-failed")
    settled_ago(engine, None, "undated-1", "undated-2", "undated-failed")
    settled_ago(engine, 2 * HOUR, "dated-old")
    assert api.prune(older_than=HOUR) == 1
    assert job_ids(engine) == ["undated-1", "undated-2", "dated-fresh", "undated-failed"]
    assert api.prune(older_than=HOUR, include_undated=True, outcomes=["completed"]) == 2
    assert job_ids(engine) == ["dated-fresh", "undated-failed"]
    assert api.prune(older_than=HOUR, include_undated=True) == 1
    assert job_ids(engine) == ["dated-fresh"]


def test_prune_never_deletes_a_delayed_queued_or_running_job(engine: Engine, api: Ops) -> None:
    populate(
        engine,
        [
            ("later", "q", None, JobState.DELAYED),
            ("waiting", "q", None, JobState.QUEUED),
            ("busy", "q", None, JobState.RUNNING),
            ("done", "q", None, COMPLETED),
        ],
    )
    add(engine, Job("lost", "r"), Job("retried", "s"))
    assert [c.job.job_id for c in claim(engine, "r", lease_ms=1)] == ["lost"]  # its lease ends at once
    [taken] = claim(engine, "s")
    assert settle(engine, taken, Decision.failed("flaky"), requeue_after_ms=0).status is SettleStatus.REQUEUED
    # Everything about the live jobs looks ancient; only their state protects them.
    execute(engine, "UPDATE watchdog_jobs SET enqueued_at = 1, ready_at = 1 WHERE state = 'queued'")
    execute(engine, "UPDATE watchdog_jobs SET enqueued_at = 1, started_at = 1 WHERE state IN ('running', 'queued')")
    execute(engine, "UPDATE watchdog_jobs SET enqueued_at = 1 WHERE state = 'delayed'")
    settled_ago(engine, 2 * HOUR, "done")
    time.sleep(0.02)
    before = {job_id: view(engine, job_id) for job_id in job_ids(engine) if job_id != "done"}
    assert api.prune(older_than=timedelta(0), include_undated=True) == 1
    assert api.prune(older_than=timedelta(0), include_undated=True, outcomes=list(Outcome)) == 0
    assert {job_id: view(engine, job_id) for job_id in job_ids(engine)} == before
    assert {job_id: job.state for job_id, job in before.items()} == {
        "later": JobState.DELAYED,
        "waiting": JobState.QUEUED,
        "busy": JobState.RUNNING,
        "lost": JobState.RUNNING,
        "retried": JobState.QUEUED,
    }


def test_a_pruned_job_id_can_be_enqueued_again_as_a_new_job(engine: Engine, api: Ops) -> None:
    api.enqueue(Job("a", "q", payload={"v": 1}))
    [taken] = claim(engine, "q")
    settle(engine, taken, Decision.completed())
    first = api.read("a")
    settled_ago(engine, 2 * HOUR, "a")
    assert api.prune(older_than=HOUR) == 1
    assert api.read("a") is None
    # Different contents: not a conflict with the pruned job, a new job.
    assert api.enqueue(Job("a", "q", payload={"v": 2})) == EnqueueResult("a", QUEUED)
    again = api.read("a")
    assert again.sequence > first.sequence
    assert (again.state, again.outcome, again.payload, again.settled_at, again.started_at) == (
        JobState.QUEUED,
        None,
        {"v": 2},
        None,
        None,
    )


@pytest.mark.dialect_neutral
def test_prune_refuses_bad_input_naming_the_field_and_deletes_nothing(engine: Engine, api: Ops) -> None:
    settle_as(engine, COMPLETED, "a", "b")
    settled_ago(engine, 2 * HOUR, "a", "b")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"older_than": timedelta(seconds=-1)}, "older_than"),
        ({"older_than": 3600}, "older_than"),
        ({"outcomes": ["nope"]}, "outcomes"),
        ({"outcomes": [COMPLETED, "nope"]}, "outcomes"),
        ({"outcomes": []}, "outcomes"),
        ({"outcomes": 5}, "outcomes"),
        ({"batch": 0}, "batch"),
        ({"batch": 10_001}, "batch"),
        ({"batch": True}, "batch"),
        ({"limit": 0}, "limit"),
        ({"limit": -1}, "limit"),
        ({"limit": 1.5}, "limit"),
        ({"include_undated": "yes"}, "include_undated"),
        ({"include_undated": 1}, "include_undated"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidJob) as error:
            api.prune(**{"older_than": HOUR, **kwargs})
        assert error.value.field == field, kwargs
        assert job_ids(engine) == ["a", "b"], kwargs
    assert api.prune(older_than=HOUR, batch=10_000, outcomes=COMPLETED) == 2


# -- retention in a runner ----------------------------------------------------------------


def done(job: RunningJob) -> None:
    return None


def make_runner(runners: RunnerDriver, handlers: dict[str, Callable[[RunningJob], Any]], **settings: Any) -> Any:
    settings.setdefault("lease", timedelta(seconds=5))
    settings.setdefault("heartbeat", timedelta(seconds=1))
    settings.setdefault("poll_interval", timedelta(milliseconds=100))
    return runners.runner(handlers, **settings)


def test_a_runner_prunes_what_its_retention_says_and_nothing_else(engine: Engine, runners: RunnerDriver) -> None:
    settle_as(engine, COMPLETED, "completed-old-1", "completed-old-2", "completed-recent", "completed-undated")
    settle_as(engine, CANCELLED, "cancelled-old", "cancelled-fresh")
    settle_as(engine, FAILED, "failed-old")
    settle_as(engine, INTERRUPTED, "interrupted-old")
    settle_as(engine, OUTCOME_UNKNOWN, "unknown-old")
    populate(engine, [("other-waiting", "other", None, JobState.QUEUED), ("other-later", "other", None, DELAYED)])
    execute(engine, "UPDATE watchdog_jobs SET enqueued_at = 1 WHERE queue_name = 'other'")
    settled_ago(engine, 3 * HOUR, "completed-old-1", "completed-old-2", "failed-old", "interrupted-old", "unknown-old")
    settled_ago(engine, timedelta(minutes=40), "completed-recent", "cancelled-old")
    settled_ago(engine, None, "completed-undated")
    doomed = {"completed-old-1", "completed-old-2", "cancelled-old"}
    kept = [j for j in job_ids(engine) if j not in doomed]

    counts: list[int] = []
    worker = make_runner(
        runners,
        {"q": done},
        retention=Retention(completed=HOUR, cancelled=timedelta(minutes=30), every=timedelta(seconds=1)),
        listen={"after_cursor_execute": deletes_on(counts)},
    )
    add(engine, Job("new", "q"))
    with worker.serving():
        settled(engine, "new")
        wait_until(lambda: not doomed & set(job_ids(engine)), 20, "the old completed and cancelled jobs to be pruned")
    assert job_ids(engine) == [*kept, "new"]
    assert sum(counts) == 3


def test_a_runner_prunes_batch_after_batch_while_batches_come_back_full(engine: Engine, runners: RunnerDriver) -> None:
    ids = [f"old-{i}" for i in range(5)]
    settle_as(engine, COMPLETED, *ids)
    settled_ago(engine, 2 * HOUR, *ids)
    counts: list[int] = []
    # every=1h: only the quick follow-up of a full batch can take the rest.
    worker = make_runner(
        runners,
        {"q": done},
        retention=Retention(completed=HOUR, batch=2, every=HOUR),
        listen={"after_cursor_execute": deletes_on(counts)},
    )
    with worker.serving():
        wait_until(lambda: job_ids(engine) == [], 10, "every old job to be pruned")
        time.sleep(0.5)
    assert counts == [2, 2, 1]


def test_a_runner_without_retention_keeps_every_settled_job(engine: Engine, runners: RunnerDriver) -> None:
    settle_as(engine, COMPLETED, "old")
    settled_ago(engine, 24 * HOUR, "old")
    counts: list[int] = []
    worker = make_runner(runners, {"q": done}, listen={"after_cursor_execute": deletes_on(counts)})
    add(engine, Job("new", "q"))
    with worker.serving():
        settled(engine, "new")  # its first pass, where a retention would prune, is over
    assert job_ids(engine) == ["old", "new"]
    assert counts == []


@pytest.mark.dialect_neutral
def test_retention_refuses_bad_settings_naming_the_field(engine: Engine, runners: RunnerDriver) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"completed": timedelta(0)}, "completed"),
        ({"failed": timedelta(seconds=-1)}, "failed"),
        ({"interrupted": 60}, "interrupted"),
        ({"every": timedelta(milliseconds=999)}, "every"),
        ({"batch": 0}, "batch"),
        ({"batch": 10_001}, "batch"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidJob) as error:
            Retention(**kwargs)
        assert error.value.field == field
    with pytest.raises(InvalidJob) as error:
        make_runner(runners, {"q": done}, retention={"completed": HOUR})
    assert error.value.field == "retention"


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_runners_prune_nothing_while_another_holds_the_prune_lock(engine: Engine, runners: RunnerDriver) -> None:
    ids = [f"old-{i}" for i in range(4)]
    settle_as(engine, COMPLETED, *ids)
    settled_ago(engine, 2 * HOUR, *ids)
    attempts: list[str] = []

    def tries(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "pg_try_advisory_xact_lock" in statement:
            attempts.append(statement)

    retention = Retention(completed=HOUR, every=timedelta(seconds=1))
    workers = [
        make_runner(runners, {"q": done}, retention=retention, listen={"before_cursor_execute": tries})
        for _ in range(2)
    ]
    with engine.connect() as holder:
        assert holder.execute(select(func.pg_try_advisory_lock(store.PRUNE_LOCK_KEY))).scalar() is True
        holder.commit()
        with workers[0].serving(), workers[1].serving():
            # Both runners tried (each at start, then every second) and skipped.
            wait_until(lambda: len(attempts) >= 4, 20, "both runners to try pruning twice")
            assert job_ids(engine) == ids
            add(engine, Job("new", "q"))
            settled(engine, "new")  # the runners work on meanwhile
            assert job_ids(engine) == [*ids, "new"]
            assert holder.execute(select(func.pg_advisory_unlock(store.PRUNE_LOCK_KEY))).scalar() is True
            holder.commit()
            wait_until(lambda: job_ids(engine) == ["new"], 10, "a runner to prune once the lock is free")


# -- list_jobs -------------------------------------------------------------------------------

LISTED: list[tuple[str, str, str | None, Target]] = [
    ("a-1", "alpha", "L1", JobState.QUEUED),
    ("b-1", "beta", "L1", COMPLETED),
    ("a-2", "alpha", "L2", JobState.RUNNING),
    ("b-2", "beta", "L2", JobState.DELAYED),
    ("a-3", "alpha", "L1", COMPLETED),
    ("b-3", "beta", "L1", FAILED),
    ("a-4", "alpha", "L2", CANCELLED),
]


def listed(api: Ops, **filters: Any) -> list[str]:
    return [job.job_id for job in api.list_jobs(**filters)]


def test_list_jobs_filters_each_alone_and_combined(engine: Engine, api: Ops) -> None:
    populate(engine, LISTED)
    order = ["a-1", "b-1", "a-2", "b-2", "a-3", "b-3", "a-4"]
    assert job_ids(engine) == order
    assert listed(api) == order
    assert listed(api, queue="alpha") == ["a-1", "a-2", "a-3", "a-4"]
    assert listed(api, queue="nope") == []
    assert listed(api, state="settled") == ["b-1", "a-3", "b-3", "a-4"]
    assert listed(api, state=JobState.QUEUED) == ["a-1"]
    assert listed(api, state="delayed") == ["b-2"]
    assert listed(api, state=JobState.RUNNING) == ["a-2"]
    assert listed(api, outcome=COMPLETED) == ["b-1", "a-3"]
    assert listed(api, outcome="failed") == ["b-3"]
    assert listed(api, outcome="cancelled") == ["a-4"]
    assert listed(api, outcome="interrupted") == []
    assert listed(api, lane="L2") == ["a-2", "b-2", "a-4"]
    assert listed(api, job_id_prefix="b-") == ["b-1", "b-2", "b-3"]
    assert listed(api, queue="alpha", state="settled") == ["a-3", "a-4"]
    assert listed(api, queue="beta", lane="L1", outcome=COMPLETED) == ["b-1"]
    assert listed(api, lane="L1", state=JobState.SETTLED, job_id_prefix="a") == ["a-3"]
    assert listed(api, queue="alpha", outcome="failed") == []
    assert listed(api, state="queued", outcome="completed") == []
    # A listed job is the whole view (its reruns are read()'s alone).
    for job in api.list_jobs():
        assert job == api.read(job.job_id)


@pytest.mark.dialect_neutral
def test_list_jobs_refuses_unknown_states_outcomes_and_bad_filters(engine: Engine, api: Ops) -> None:
    populate(engine, LISTED[:2])
    cases: list[tuple[dict[str, Any], str]] = [
        ({"state": "done"}, "state"),
        ({"state": "Settled"}, "state"),
        ({"state": COMPLETED}, "state"),
        ({"outcome": "succeeded"}, "outcome"),
        ({"outcome": JobState.SETTLED}, "outcome"),
        ({"queue": ""}, "queue"),
        ({"lane": 7}, "lane"),
        ({"job_id_prefix": ""}, "job_id_prefix"),
        ({"after_sequence": -1}, "after_sequence"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidJob) as error:
            api.list_jobs(**kwargs)
        assert error.value.field == field, kwargs


def test_keyset_paging_lists_every_job_exactly_once(engine: Engine, api: Ops) -> None:
    ids = [f"job-{i:02d}" for i in range(23)]
    add(engine, *(Job(job_id, "even" if i % 2 == 0 else "odd") for i, job_id in enumerate(ids)))

    def pages(**filters: Any) -> list[list[str]]:
        found, after = [], 0
        while True:
            page = api.list_jobs(limit=5, after_sequence=after, **filters)
            found.append([job.job_id for job in page])
            if not page:
                return found
            assert [job.sequence for job in page] == sorted(job.sequence for job in page)
            after = page[-1].sequence

    assert pages() == [ids[0:5], ids[5:10], ids[10:15], ids[15:20], ids[20:23], []]
    assert [job_id for page in pages(queue="odd") for job_id in page] == ids[1::2]

    # Jobs changing state, and new jobs, while a reader pages: each seen exactly once.
    first = api.list_jobs(limit=5)
    [taken] = claim(engine, "even")  # job-00, already read
    settle(engine, taken, Decision.completed())
    add(engine, Job("job-23", "odd"))
    rest: list[str] = []
    after = first[-1].sequence
    while page := api.list_jobs(limit=5, after_sequence=after):
        rest += [job.job_id for job in page]
        after = page[-1].sequence
    assert [job.job_id for job in first] + rest == [*ids, "job-23"]


def test_newest_first_pages_down_by_before_sequence_and_back_up_by_after(engine: Engine, api: Ops) -> None:
    ids = [f"job-{i:02d}" for i in range(23)]
    add(engine, *(Job(job_id, "even" if i % 2 == 0 else "odd") for i, job_id in enumerate(ids)))
    newest = api.list_jobs(limit=5, newest_first=True)
    assert [job.job_id for job in newest] == ids[22:17:-1]
    found, before = [], None
    while page := api.list_jobs(limit=5, newest_first=True, before_sequence=before):
        found += [job.job_id for job in page]
        before = page[-1].sequence
    assert found == ids[::-1]  # every job exactly once, newest first
    odd = [job.job_id for job in api.list_jobs(queue="odd", newest_first=True, limit=1000)]
    assert odd == ids[1::2][::-1]
    # Both bounds: the jobs strictly between them.
    middle = api.list_jobs(after_sequence=newest[-1].sequence - 10, before_sequence=newest[-1].sequence)
    assert [job.job_id for job in middle] == ids[9:18]
    # Back up: the page above the oldest listed is read in admission order.
    assert [job.job_id for job in api.list_jobs(limit=3, after_sequence=newest[-1].sequence)] == ids[19:22]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"before_sequence": 0}, "before_sequence"),
        ({"before_sequence": "9"}, "before_sequence"),
        ({"newest_first": 1}, "newest_first"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidJob) as error:
            api.list_jobs(**kwargs)
        assert error.value.field == field, kwargs


@pytest.mark.parametrize("dialect", WITH_MARIADB)
def test_job_id_prefix_is_literal_not_a_like_pattern(engine: Engine, api: Ops) -> None:
    """Also on MariaDB, where ``LENGTH`` counts bytes: a prefix of non-ASCII
    characters found nothing there (its length in bytes cut the job ids)."""
    ids = ["a%b", "a_c", "axb", "abc", "a%", "A%b", "a\\d", "ab%", "é%1", "éx"]
    add(engine, *(Job(job_id, "q") for job_id in ids))
    assert listed(api, job_id_prefix="a%") == ["a%b", "a%"]
    assert listed(api, job_id_prefix="a_") == ["a_c"]
    assert listed(api, job_id_prefix="%") == []
    assert listed(api, job_id_prefix="_") == []
    assert listed(api, job_id_prefix="a\\") == ["a\\d"]
    assert listed(api, job_id_prefix="ab%") == ["ab%"]
    assert listed(api, job_id_prefix="a") == ["a%b", "a_c", "axb", "abc", "a%", "a\\d", "ab%"]
    assert listed(api, job_id_prefix="A") == ["A%b"]
    assert listed(api, job_id_prefix="é%") == ["é%1"]
    assert listed(api, job_id_prefix="é") == ["é%1", "éx"]
    assert listed(api, job_id_prefix="a%b") == ["a%b"]
    assert listed(api, job_id_prefix="a%bc") == []


@pytest.mark.dialect_neutral
def test_list_jobs_limit_is_one_to_a_thousand(engine: Engine, api: Ops) -> None:
    ids = [f"job-{i:04d}" for i in range(1001)]
    add(engine, *(Job(job_id, "q") for job_id in ids))
    assert listed(api, limit=1) == ids[:1]
    page = api.list_jobs(limit=1000)
    assert [job.job_id for job in page] == ids[:1000]
    assert listed(api, limit=1000, after_sequence=page[-1].sequence) == ids[1000:]
    assert len(api.list_jobs()) == 100
    for limit in (0, -1, 1001, True, "10", None):
        with pytest.raises(InvalidJob) as error:
            api.list_jobs(limit=limit)
        assert error.value.field == "limit"


# -- stats --------------------------------------------------------------------------------------


def test_stats_count_live_jobs_per_queue_and_state(engine: Engine, api: Ops) -> None:
    populate(
        engine,
        [
            ("s-later-1", "s", None, JobState.DELAYED),
            ("s-later-2", "s", None, JobState.DELAYED),
            ("s-waiting-1", "s", None, JobState.QUEUED),
            ("s-waiting-2", "s", None, JobState.QUEUED),
            ("s-waiting-3", "s", None, JobState.QUEUED),
            ("s-busy", "s", None, JobState.RUNNING),
            ("s-done", "s", None, COMPLETED),
            ("t-waiting", "t", None, JobState.QUEUED),
            ("gone-done", "gone", None, COMPLETED),
        ],
    )
    settled_ago(engine, 2 * HOUR, "gone-done")
    before = clock(engine)
    stats = api.stats()
    within(stats.at, before, clock(engine))
    assert isinstance(stats, Stats)
    assert [q.queue for q in stats.queues] == ["s", "t"]  # "gone" settled only long ago
    s = stats.queue("s")
    assert (s.delayed, s.queued, s.running, s.expired_leases) == (2, 3, 1, 0)
    assert (s.settled_last_minute, s.settled_last_hour) == ({COMPLETED: 1}, {COMPLETED: 1})
    assert (s.pause, s.paused) == (None, False)
    assert s.oldest_ready_age is not None and timedelta(0) <= s.oldest_ready_age < timedelta(minutes=1)
    t = stats.queue("t")
    assert (t.delayed, t.queued, t.running, t.settled_last_hour) == (0, 1, 0, {})
    assert stats.queue("nope") == QueueStats("nope")
    assert stats.queue("gone") == QueueStats("gone")


def test_stats_count_running_jobs_whose_lease_has_ended(engine: Engine, api: Ops) -> None:
    add(engine, Job("lost", "q"), Job("alive", "q"))
    claim(engine, "q", lease_ms=1)
    claim(engine, "q")
    time.sleep(0.02)
    q = api.stats().queue("q")
    assert (q.running, q.expired_leases, q.queued, q.oldest_ready_age) == (2, 1, 0, None)


def test_stats_oldest_ready_age_counts_from_ready_at_else_enqueued_at(engine: Engine, api: Ops) -> None:
    api.enqueue(Job("now", "plain"))
    execute(engine, "UPDATE watchdog_jobs SET enqueued_at = enqueued_at - 600000 WHERE job_id = 'now'")
    age = api.stats().queue("plain").oldest_ready_age
    assert age is not None and timedelta(minutes=10) <= age < timedelta(minutes=10, seconds=30)

    api.enqueue(Job("soon", "promoted"), delay=timedelta(milliseconds=50))
    waiting = api.stats().queue("promoted")
    assert (waiting.delayed, waiting.queued, waiting.oldest_ready_age) == (1, 0, None)
    time.sleep(0.1)
    assert run(engine, store.promote).promoted == 1
    # Enqueued an hour ago, ready five minutes ago: it has waited five minutes.
    execute(
        engine,
        "UPDATE watchdog_jobs SET enqueued_at = enqueued_at - 3600000, ready_at = ready_at - 300000"
        " WHERE job_id = 'soon'",
    )
    age = api.stats().queue("promoted").oldest_ready_age
    assert age is not None and timedelta(minutes=5) <= age < timedelta(minutes=5, seconds=30)

    # The oldest of several, and none once nothing is queued.
    api.enqueue(Job("newer", "plain"))
    age = api.stats().queue("plain").oldest_ready_age
    assert age is not None and age >= timedelta(minutes=10)
    claim(engine, "plain", limit=2)
    assert api.stats().queue("plain").oldest_ready_age is None


def test_stats_count_settled_jobs_of_the_last_minute_and_hour_by_outcome(engine: Engine, api: Ops) -> None:
    settle_as(engine, COMPLETED, "c-now", "c-61s", "c-10m", "c-2h", queue="r")
    settle_as(engine, FAILED, "f-now", "f-30m", queue="r")
    settle_as(engine, CANCELLED, "x-59m", queue="r")
    settle_as(engine, INTERRUPTED, "i-now", queue="r")
    settle_as(engine, OUTCOME_UNKNOWN, "u-61m", queue="r")
    settled_ago(engine, timedelta(seconds=61), "c-61s")
    settled_ago(engine, timedelta(minutes=10), "c-10m")
    settled_ago(engine, 2 * HOUR, "c-2h")
    settled_ago(engine, timedelta(minutes=30), "f-30m")
    settled_ago(engine, timedelta(minutes=59), "x-59m")
    settled_ago(engine, timedelta(minutes=61), "u-61m")
    r = api.stats().queue("r")
    assert r.settled_last_minute == {COMPLETED: 1, FAILED: 1, INTERRUPTED: 1}
    assert r.settled_last_hour == {COMPLETED: 3, FAILED: 2, CANCELLED: 1, INTERRUPTED: 1}
    assert (r.delayed, r.queued, r.running) == (0, 0, 0)


def test_stats_show_paused_queues(engine: Engine, api: Ops) -> None:
    before = clock(engine)
    assert api.pause("p", reason="deploy in progress") is PauseStatus.PAUSED
    after = clock(engine)
    api.pause("quiet")
    stats = api.stats()
    assert [q.queue for q in stats.queues] == ["p", "quiet"]  # paused, though they hold no job
    p = stats.queue("p")
    assert p.paused and p.pause is not None
    assert (p.pause.queue, p.pause.reason) == ("p", "deploy in progress")
    within(p.pause.paused_at, before, after)
    quiet = stats.queue("quiet").pause
    assert isinstance(quiet, QueuePause) and (quiet.queue, quiet.reason) == ("quiet", None)
    api.resume("p")
    stats = api.stats()
    assert [q.queue for q in stats.queues] == ["quiet"]
    assert not stats.queue("p").paused


async def test_async_stats_equal_sync_stats(engine: Engine) -> None:
    populate(
        engine,
        [
            ("later", "a", None, JobState.DELAYED),
            ("waiting", "a", None, JobState.QUEUED),
            ("busy", "b", None, JobState.RUNNING),
            ("done", "b", None, COMPLETED),
            ("broken", "c", None, FAILED),
            ("older", "c", None, COMPLETED),
        ],
    )
    settled_ago(engine, timedelta(minutes=5), "older")
    Watchdog(engine).pause("c", reason="why not")
    Watchdog(engine).pause("d")
    expected = Watchdog(engine).stats()
    aengine = make_async_engine(engine)
    try:
        got = await AsyncWatchdog(aengine).stats()
    finally:
        await aengine.dispose()
    assert isinstance(got, Stats)
    assert timedelta(0) <= got.at - expected.at < timedelta(seconds=30)

    def without_age(stats: Stats) -> list[QueueStats]:
        return [dataclasses.replace(q, oldest_ready_age=None) for q in stats.queues]

    assert without_age(got) == without_age(expected)
    assert [q.queue for q in got.queues] == ["a", "b", "c", "d"]
    old, new = expected.queue("a").oldest_ready_age, got.queue("a").oldest_ready_age
    assert old is not None and new is not None and timedelta(0) <= new - old <= got.at - expected.at


# -- pause / resume -----------------------------------------------------------------------------


def test_pause_and_resume_say_what_they_did(engine: Engine, api: Ops) -> None:
    assert api.pause("q", reason="first") is PauseStatus.PAUSED
    assert api.pause("q", reason="second") is PauseStatus.ALREADY_PAUSED
    pause = api.stats().queue("q").pause
    assert pause is not None and pause.reason == "first"  # the pause that counts is the first
    assert api.resume("q") is PauseStatus.RESUMED
    assert api.resume("q") is PauseStatus.NOT_PAUSED
    assert api.resume("never-paused") is PauseStatus.NOT_PAUSED
    assert api.pause("q") is PauseStatus.PAUSED
    pause = api.stats().queue("q").pause
    assert pause is not None and pause.reason is None


@pytest.mark.dialect_neutral
def test_pause_and_resume_refuse_bad_input_naming_the_field(engine: Engine, api: Ops) -> None:
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: api.pause(""), "queue"),
        (lambda: api.pause("x" * 257), "queue"),
        (lambda: api.pause(None), "queue"),
        (lambda: api.pause("q", reason="x" * 2001), "reason"),
        (lambda: api.pause("q", reason=5), "reason"),
        (lambda: api.pause("q", reason=""), "reason"),
        (lambda: api.resume(""), "queue"),
        (lambda: api.resume(7), "queue"),
    ]
    for call, field in calls:
        with pytest.raises(InvalidJob) as error:
            call()
        assert error.value.field == field
    assert api.stats().queues == ()
    assert api.pause("q", reason="x" * 2000) is PauseStatus.PAUSED


def test_enqueue_works_while_a_queue_is_paused(engine: Engine, api: Ops) -> None:
    api.pause("q")
    assert api.enqueue(Job("a", "q")) == EnqueueResult("a", QUEUED)
    assert api.enqueue(Job("a", "q")) == EnqueueResult("a", DUPLICATE)
    assert api.enqueue(Job("b", "q"), delay=HOUR) == EnqueueResult("b", QUEUED)
    assert (api.read("a").state, api.read("b").state) == (JobState.QUEUED, JobState.DELAYED)
    q = api.stats().queue("q")
    assert (q.queued, q.delayed, q.paused) == (1, 1, True)


def test_a_paused_queues_jobs_are_never_claimed(engine: Engine, runners: RunnerDriver) -> None:
    watchdog = Watchdog(engine)
    add(engine, Job("p-1", "paused"), Job("o-1", "open"), Job("p-2", "paused", priority=9), Job("o-2", "open"))
    watchdog.enqueue(Job("p-later", "paused"), delay=timedelta(milliseconds=50))
    assert watchdog.pause("paused", reason="maintenance") is PauseStatus.PAUSED
    worker = make_runner(runners, {"paused": done, "open": done})
    ran = worker.run_until_idle()
    assert sorted(job.job_id for job in ran) == ["o-1", "o-2"]
    assert run(engine, store.claim, queues=None, limit=10, lease_ms=LEASE_MS) == store.ClaimBatch((), ())
    assert claim(engine, "paused", limit=10) == []
    # A delayed job of a paused queue still becomes ready, and waits.
    time.sleep(0.1)
    wait_until(lambda: worker.tick().status is TickStatus.IDLE and view(engine, "p-later").state is JobState.QUEUED)
    assert worker.run_until_idle() == []
    assert {view(engine, j).state for j in ("p-1", "p-2", "p-later")} == {JobState.QUEUED}

    assert watchdog.resume("paused") is PauseStatus.RESUMED
    assert [job.job_id for job in worker.run_until_idle()] == ["p-2", "p-1", "p-later"]
    assert {view(engine, j).outcome for j in ("p-1", "p-2", "p-later")} == {COMPLETED}


def test_a_running_job_of_a_queue_paused_meanwhile_settles_normally(engine: Engine, runners: RunnerDriver) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(job: RunningJob) -> None:
        started.set()
        release.wait(30)

    add(engine, Job("first", "q"), Job("second", "q"))
    worker = make_runner(runners, {"q": slow})
    future = worker.tick_in_background()
    assert started.wait(30)
    assert Watchdog(engine).pause("q") is PauseStatus.PAUSED
    release.set()
    result = future.result(30)
    assert result.status is TickStatus.SETTLED and result.job is not None
    assert (result.job.job_id, result.job.outcome) == ("first", COMPLETED)
    assert view(engine, "first").settled_at is not None
    assert worker.tick().status is TickStatus.IDLE
    assert view(engine, "second").state is JobState.QUEUED


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_resume_wakes_an_idle_runner_at_once(engine: Engine, runners: RunnerDriver) -> None:
    watchdog = Watchdog(engine)
    watchdog.pause("p")
    worker = make_runner(runners, {"p": done}, poll_interval=timedelta(seconds=30))
    with worker.serving():
        time.sleep(0.5)  # idle, listening
        add(engine, Job("a", "p"))  # its NOTIFY wakes the runner, whose claim skips the paused queue
        time.sleep(2)
        assert view(engine, "a").state is JobState.QUEUED
        resumed = time.monotonic()
        assert watchdog.resume("p") is PauseStatus.RESUMED
        settled(engine, "a", timeout=20)
        assert time.monotonic() - resumed < 5, "the resume did not wake the runner: it waited for its poll"


# -- rerun --------------------------------------------------------------------------------------


def test_rerun_takes_only_a_settled_job(engine: Engine, api: Ops) -> None:
    populate(
        engine,
        [
            ("waiting", "q", None, JobState.QUEUED),
            ("later", "q", None, JobState.DELAYED),
            ("busy", "q", None, JobState.RUNNING),
        ],
    )
    for job_id in ("waiting", "later", "busy", "missing"):
        with pytest.raises(InvalidJob) as error:
            api.rerun(job_id, rerun_id="again")
        assert error.value.field == "job_id"
    assert job_ids(engine) == ["waiting", "later", "busy"]


def test_rerun_enqueues_a_copy_linked_to_the_original(engine: Engine, api: Ops) -> None:
    retry = RetryPolicy(max_attempts=4, backoff=timedelta(seconds=2), jitter=0.0)
    api.enqueue(
        Job(
            "orig",
            "mail",
            lane="lane-1",
            priority=7,
            payload={"to": ["a@example.com"], "n": 1},
            max_recoveries=3,
            retry=retry,
            timeout=timedelta(seconds=30),
            run_at=datetime.now(UTC) - timedelta(minutes=1),
        )
    )
    [taken] = claim(engine, "mail")
    settle(engine, taken, Decision.failed("boom"))
    original = api.read("orig")
    assert (original.state, original.outcome, original.reruns) == (JobState.SETTLED, FAILED, ())

    before = clock(engine)
    assert api.rerun("orig", rerun_id="r1") == EnqueueResult("orig~rerun~r1", QUEUED)
    copy = api.read("orig~rerun~r1")
    within(copy.enqueued_at, before, clock(engine))
    kept = ("queue", "lane", "priority", "payload", "max_recoveries", "retry", "timeout", "max_attempts")
    assert {f: getattr(copy, f) for f in kept} == {f: getattr(original, f) for f in kept}
    assert copy.retry == retry and copy.timeout == timedelta(seconds=30)
    assert (copy.run_at, copy.state, copy.outcome, copy.attempt, copy.failure_reason, copy.failure_history) == (
        None,
        JobState.QUEUED,
        None,
        1,
        None,
        (),
    )
    assert (copy.started_at, copy.settled_at, copy.recovery_count, copy.cancellation_id) == (None, None, 0, None)
    assert (copy.rerun_of, copy.reruns) == ("orig", ())
    assert copy.sequence > original.sequence
    # The original is final, and lists its reruns in admission order.
    assert api.read("orig") == dataclasses.replace(original, reruns=("orig~rerun~r1",))
    assert api.rerun("orig", rerun_id="r2") == EnqueueResult("orig~rerun~r2", QUEUED)
    assert api.read("orig").reruns == ("orig~rerun~r1", "orig~rerun~r2")
    [listed_copy] = api.list_jobs(job_id_prefix="orig~rerun~r1")
    assert (listed_copy.rerun_of, listed_copy.reruns) == ("orig", ())


def test_the_same_rerun_again_is_a_duplicate(engine: Engine, api: Ops) -> None:
    settle_as(engine, COMPLETED, "orig")
    assert api.rerun("orig", rerun_id="r1") == EnqueueResult("orig~rerun~r1", QUEUED)
    assert api.rerun("orig", rerun_id="r1") == EnqueueResult("orig~rerun~r1", DUPLICATE)
    # Still a duplicate once the copy has run.
    [taken] = claim(engine, "settle-completed")
    assert taken.job.job_id == "orig~rerun~r1"
    settle(engine, taken, Decision.completed())
    assert api.rerun("orig", rerun_id="r1") == EnqueueResult("orig~rerun~r1", DUPLICATE)
    assert job_ids(engine) == ["orig", "orig~rerun~r1"]
    # A rerun of the rerun chains on.
    assert api.rerun("orig~rerun~r1", rerun_id="r2") == EnqueueResult("orig~rerun~r1~rerun~r2", QUEUED)
    assert api.read("orig~rerun~r1~rerun~r2").rerun_of == "orig~rerun~r1"
    assert api.read("orig").reruns == ("orig~rerun~r1",)


def test_rerun_of_is_part_of_the_jobs_identity(engine: Engine, api: Ops) -> None:
    api.enqueue(Job("orig", "q", lane="l", payload=[1]))
    [taken] = claim(engine, "q")
    settle(engine, taken, Decision.completed())
    api.rerun("orig", rerun_id="r1")
    # The copy is exactly this job; without its link, or with another, it is not.
    assert api.enqueue(Job("orig~rerun~r1", "q", lane="l", payload=[1], rerun_of="orig")).status is DUPLICATE
    with pytest.raises(EnqueueConflict):
        api.enqueue(Job("orig~rerun~r1", "q", lane="l", payload=[1]))
    with pytest.raises(EnqueueConflict):
        api.enqueue(Job("orig~rerun~r1", "q", lane="l", payload=[1], rerun_of="other"))
    assert job_ids(engine) == ["orig", "orig~rerun~r1"]


def test_rerun_of_a_long_job_id_gets_a_deterministic_hashed_id(engine: Engine, api: Ops) -> None:
    fits, too_long = "f" * 247, "x" * 248  # + "~rerun~ab": 256 and 257 characters
    settle_as(engine, COMPLETED, fits, too_long)
    assert api.rerun(fits, rerun_id="ab") == EnqueueResult(f"{fits}~rerun~ab", QUEUED)
    hashed = "rerun~" + hashlib.sha256(f"{too_long}\x00ab".encode()).hexdigest()
    assert api.rerun(too_long, rerun_id="ab") == EnqueueResult(hashed, QUEUED)
    assert api.rerun(too_long, rerun_id="ab") == EnqueueResult(hashed, DUPLICATE)
    assert api.read(hashed).rerun_of == too_long
    assert api.read(too_long).reruns == (hashed,)
    other = api.rerun(too_long, rerun_id="ac").job_id
    assert other != hashed and other == "rerun~" + hashlib.sha256(f"{too_long}\x00ac".encode()).hexdigest()


@pytest.mark.dialect_neutral
def test_rerun_refuses_bad_ids_naming_the_field_and_writes_nothing(engine: Engine, api: Ops) -> None:
    settle_as(engine, COMPLETED, "orig")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"job_id": "orig", "rerun_id": ""}, "rerun_id"),
        ({"job_id": "orig", "rerun_id": "r" * 129}, "rerun_id"),
        ({"job_id": "orig", "rerun_id": 5}, "rerun_id"),
        ({"job_id": "", "rerun_id": "r"}, "job_id"),
        ({"job_id": "o" * 257, "rerun_id": "r"}, "job_id"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidJob) as error:
            api.rerun(kwargs["job_id"], rerun_id=kwargs["rerun_id"])
        assert error.value.field == field
    assert job_ids(engine) == ["orig"]
    assert api.rerun("orig", rerun_id="r" * 128).status is QUEUED


# -- bulk actions: rerun_many, cancel_many ------------------------------------------------


BULK: list[tuple[str, str, str | None, Target]] = [
    ("i-1", "mail", "L1", INTERRUPTED),
    ("f-1", "mail", "L2", FAILED),
    ("c-1", "mail", "L1", COMPLETED),
    ("i-2", "sms", "L1", INTERRUPTED),
    ("f-2", "mail", "L1", FAILED),
    ("q-1", "mail", "L1", JobState.QUEUED),
]


def test_rerun_many_copies_each_matching_settled_job_once_and_again_is_repeated(engine: Engine, api: Ops) -> None:
    populate(engine, BULK)
    dry = api.rerun_many(rerun_id="fix", queue="mail", outcome=["interrupted", "failed"], dry_run=True)
    assert (dry.matched, dry.done, dry.repeated, dry.dry_run) == (3, (), (), True)
    assert job_ids(engine) == [job_id for job_id, *_ in BULK]  # a dry run writes nothing

    result = api.rerun_many(rerun_id="fix", queue="mail", outcome=["interrupted", "failed"], batch=2)
    assert result.done == ("i-1~rerun~fix", "f-1~rerun~fix", "f-2~rerun~fix")
    assert (result.matched, result.repeated, result.skipped, result.batches) == (3, (), (), 2)
    copy = api.read("f-1~rerun~fix")
    assert (copy.rerun_of, copy.state, copy.lane) == ("f-1", JobState.QUEUED, "L2")

    # Again, after the copies ran and failed too: no second copy, and the
    # copies themselves are never copied by the same rerun_id.
    copies = run(engine, store.claim, queues=["mail"], limit=3, lease_ms=LEASE_MS).claimed  # q-1 has priority 0
    assert sorted(taken.job.job_id for taken in copies) == sorted(result.done)
    for taken in copies:
        settle(engine, taken, Decision.failed("again", retry=False))
    again = api.rerun_many(rerun_id="fix", queue="mail", outcome=["interrupted", "failed"])
    assert (again.matched, again.done, again.repeated) == (3, (), result.done)
    # Another rerun_id is another copy: of the originals and of the copies.
    other = api.rerun_many(rerun_id="fix2", lane="L2", outcome="failed")
    assert other.done == ("f-1~rerun~fix2", "f-1~rerun~fix~rerun~fix2")


def test_rerun_many_selects_by_lane_and_time_ranges(engine: Engine, api: Ops) -> None:
    populate(engine, BULK)
    settled_ago(engine, timedelta(hours=3), "i-1", "f-1")
    now = datetime.now(UTC)
    old = api.rerun_many(rerun_id="old", settled_before=now - timedelta(hours=1), dry_run=True)
    assert old.matched == 2
    recent = api.rerun_many(rerun_id="new", settled_after=now - timedelta(hours=1), lane="L1")
    assert recent.done == ("c-1~rerun~new", "i-2~rerun~new", "f-2~rerun~new")
    assert api.rerun_many(rerun_id="x", enqueued_after=now + timedelta(hours=1), dry_run=True).matched == 0
    assert api.rerun_many(rerun_id="x", enqueued_before=now + timedelta(hours=1), dry_run=True).matched == 5
    assert api.rerun_many(rerun_id="x", queue="mail", limit=2, batch=1, dry_run=True).matched == 2


def _taken_before_the_update(engine: Engine, hooked: Engine, job_id: str, cancellation_id: str) -> Callable[[], None]:
    """Make ``hooked``'s next cancel lose a race: just before its ``UPDATE``
    (after its read found ``cancellation_id`` free), another connection of
    ``engine`` records that id for job ``job_id`` and commits. Returns the
    function that removes the hook."""
    fired: list[bool] = []

    def take(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not fired and statement.lstrip().startswith("UPDATE watchdog_jobs"):
            fired.append(True)
            with engine.begin() as other:
                other.execute(
                    jobs_table.update().where(jobs_table.c.job_id == job_id).values(cancellation_id=cancellation_id)
                )

    event.listen(hooked, "before_cursor_execute", take)
    return lambda: event.remove(hooked, "before_cursor_execute", take)


@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"])  # SQLite's writers take turns: no such race
def test_a_cancellation_id_taken_between_the_read_and_the_update_answers_conflict(engine: Engine) -> None:
    """The unique index refuses the update (the id was free when read): the
    answer is ``conflict``, read afresh, and the job stays uncancelled."""
    add(engine, Job("a", "q"), Job("b", "q"))
    unhook = _taken_before_the_update(engine, engine, "b", "shared")
    try:
        result = Watchdog(engine).cancel("a", "shared")
    finally:
        unhook()
    assert result.status is CancelStatus.CONFLICT
    assert {j.job_id: j.cancellation_id for j in Watchdog(engine).list_jobs()} == {"a": None, "b": "shared"}
    assert Watchdog(engine).cancel("b", "shared").status is CancelStatus.REPLAYED


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_a_cancellation_id_race_lost_through_asyncpg_without_its_statement_cache_answers_conflict(
    engine: Engine,
) -> None:
    """asyncpg with its statement cache off (the setting behind a pooler in
    transaction mode) runs the store's operations in a transaction, which the
    refused update aborts on PostgreSQL: the update runs in a savepoint, so
    the status is read in the same transaction (a rollback of the whole one
    failed with "Can't operate on closed transaction")."""
    add(engine, Job("a", "q"), Job("b", "q"))
    pooled = {"statement_cache_size": 0, "prepared_statement_cache_size": 0}

    async def race() -> CancelStatus:
        aengine = create_async_engine(engine.url.set(drivername="postgresql+asyncpg"), connect_args=pooled)
        unhook = _taken_before_the_update(engine, aengine.sync_engine, "b", "shared")
        try:
            return (await AsyncWatchdog(aengine).cancel("a", "shared")).status
        finally:
            unhook()
            await aengine.dispose()

    assert asyncio.run(race()) is CancelStatus.CONFLICT
    assert {j.job_id: j.cancellation_id for j in Watchdog(engine).list_jobs()} == {"a": None, "b": "shared"}


def test_cancel_many_cancels_matching_live_jobs_and_again_replays(engine: Engine, api: Ops) -> None:
    populate(
        engine,
        [
            ("w-1", "mail", "L1", JobState.QUEUED),
            ("w-2", "mail", "L2", JobState.DELAYED),
            ("w-3", "mail", "L1", JobState.RUNNING),
            ("w-4", "sms", "L1", JobState.QUEUED),
            ("done", "mail", "L1", COMPLETED),
        ],
    )
    assert api.cancel_many(cancellation_id="stop", queue="mail", dry_run=True).matched == 3
    assert api.read("w-1").cancellation_id is None
    queued_only = api.cancel_many(cancellation_id="stop", queue="mail", only_if_queued=True)
    assert queued_only.done == ("w-1", "w-2")
    assert [skip.job_id for skip in queued_only.skipped] == ["w-3"]
    assert api.read("w-1").cancellation_id == "stop~w-1"
    everything = api.cancel_many(cancellation_id="stop", queue="mail")
    assert (everything.done, everything.repeated, everything.skipped) == (("w-3",), ("w-1", "w-2"), ())
    # Another bulk cancellation of the same jobs conflicts with the recorded ones: skipped, nothing changed.
    other = api.cancel_many(cancellation_id="halt", lane="L1")
    assert other.done == ("w-4",) and [skip.job_id for skip in other.skipped] == ["w-1", "w-3"]
    assert api.read("w-1").cancellation_id == "stop~w-1"


@pytest.mark.dialect_neutral
@pytest.mark.parametrize(
    ("method", "kwargs", "field"),
    [
        ("rerun_many", {"rerun_id": "r"}, "filter"),
        ("rerun_many", {"rerun_id": "", "queue": "mail"}, "rerun_id"),
        ("rerun_many", {"rerun_id": "r", "queue": ""}, "queue"),
        ("rerun_many", {"rerun_id": "r", "lane": 5}, "lane"),
        ("rerun_many", {"rerun_id": "r", "outcome": "lost"}, "outcomes"),
        ("rerun_many", {"rerun_id": "r", "outcome": []}, "outcomes"),
        ("rerun_many", {"rerun_id": "r", "settled_after": datetime(2024, 1, 1)}, "settled_after"),
        ("rerun_many", {"rerun_id": "r", "enqueued_before": "yesterday"}, "enqueued_before"),
        (
            "rerun_many",
            {
                "rerun_id": "r",
                "settled_after": datetime(2024, 2, 1, tzinfo=UTC),
                "settled_before": datetime(2024, 1, 1, tzinfo=UTC),
            },
            "settled_before",
        ),
        ("rerun_many", {"rerun_id": "r", "queue": "mail", "batch": 0}, "batch"),
        ("rerun_many", {"rerun_id": "r", "queue": "mail", "batch": 1001}, "batch"),
        ("rerun_many", {"rerun_id": "r", "queue": "mail", "limit": 0}, "limit"),
        ("rerun_many", {"rerun_id": "r", "queue": "mail", "dry_run": "yes"}, "dry_run"),
        ("cancel_many", {"cancellation_id": "c"}, "filter"),
        ("cancel_many", {"cancellation_id": "c" * 257, "queue": "mail"}, "cancellation_id"),
        ("cancel_many", {"cancellation_id": "c", "queue": "mail", "only_if_queued": 1}, "only_if_queued"),
    ],
)
def test_a_bad_bulk_filter_is_refused_naming_the_field_and_changes_nothing(
    engine: Engine, api: Ops, method: str, kwargs: dict[str, Any], field: str
) -> None:
    populate(engine, BULK)
    before = [(job.job_id, job.state, job.cancellation_id) for job in api.list_jobs()]
    with pytest.raises(InvalidJob) as error:
        getattr(api, method)(**kwargs)
    assert error.value.field == field
    assert [(job.job_id, job.state, job.cancellation_id) for job in api.list_jobs()] == before


@pytest.mark.dialect_neutral
def test_cancel_many_takes_no_outcome_nor_settled_time(api: Ops) -> None:
    for kwargs in ({"outcome": "failed"}, {"settled_after": datetime.now(UTC)}, {"settled_before": datetime.now(UTC)}):
        with pytest.raises(TypeError):
            api.cancel_many(cancellation_id="c", queue="q", **kwargs)


# -- what applies: explain ---------------------------------------------------------------

#: A job view to word reasons about (only its recovery budget matters).
JOB_VIEW = store.view((1, "j", "q", "q", 0, "null", None, "settled", "interrupted") + (None,) * 25)


def test_explain_says_each_settings_level_and_what_it_cannot_know(engine: Engine, api: Ops) -> None:
    from sqlalchemy_watchdog import PolicyLevel, handler
    from sqlalchemy_watchdog.core.handlers import _registry

    own = RetryPolicy(max_attempts=4, backoff=timedelta(seconds=1), jitter=0.0)
    api.enqueue(
        [
            Job("own", "emails", retry=own, timeout=timedelta(seconds=30)),
            Job("handled", "handled-q"),
            Job("runners", "emails"),
        ]
    )
    api.pause("emails", reason="maintenance")

    @handler("handled-q", retry=None, timeout=timedelta(seconds=5))
    def handled(job: RunningJob) -> None:
        return None

    try:
        explained = api.explain("own")
        assert (explained.timeout.value, explained.timeout.level) == (timedelta(seconds=30), PolicyLevel.JOB)
        assert (explained.retry.value, explained.retry.level, explained.max_attempts) == (own, PolicyLevel.JOB, 4)
        assert explained.attempt_text == "1 of 4"
        assert explained.pause is not None and explained.pause.reason == "maintenance"
        # @handler(retry=None) says "no retries": one attempt, known here.
        handled_job = api.explain("handled")
        assert (handled_job.retry.value, handled_job.retry.level, handled_job.retry.known) == (
            None,
            PolicyLevel.HANDLER,
            True,
        )
        assert handled_job.max_attempts == 1 and handled_job.retry_text == (
            "no retries (one attempt) (its handler's, @handler in this process)"
        )
        assert handled_job.timeout.value == timedelta(seconds=5) and handled_job.pause is None
        # Neither its own nor a @handler here: the runner's, which this process cannot know.
        runners = api.explain("runners")
        assert (runners.timeout.known, runners.retry.known, runners.max_attempts) == (False, False, None)
        assert runners.timeout.level is PolicyLevel.RUNNER and runners.timeout.value is None
        assert api.explain("nope") is None
    finally:
        _registry.pop("handled-q", None)


@pytest.mark.parametrize(
    ("stored", "plain"),
    [
        (store.NO_POLICY_REASON, "worker died or lost its lease (no recovery budget: max_recoveries is not set)"),
        (
            store.recovery_reason(dataclasses.replace(JOB_VIEW, max_recoveries=3)),
            "worker died or lost its lease, again (its recovery budget of 3 is used up)",
        ),
        (
            store.recovery_reason(JOB_VIEW, cause=store.RecoveryCause.SHUTDOWN),
            "its runner shut down while it ran and the handler outlived the grace period (no recovery budget)",
        ),
        (
            store.recovery_reason(JOB_VIEW, 2, store.RecoveryCause.SHUTDOWN),
            "its runner shut down while it ran and the handler outlived the grace period"
            " (its recovery budget of 2 is used up)",
        ),
        ("smtp said 550", "smtp said 550"),  # a handler's own words stay its own
        (None, None),
    ],
)
def test_the_librarys_own_reasons_read_in_plain_words(stored: str | None, plain: str | None) -> None:
    from sqlalchemy_watchdog.applies import plain_reason

    assert plain_reason(stored) == plain


@pytest.mark.parametrize(
    ("prefix", "bound"),
    [
        ("order-", "order."),
        ("é", "ê"),
        ("a\U0010ffff", None),  # nothing follows the last code point: no range, the walk
        ("x\ud7ff", "x\ue000"),  # the surrogates are no characters: skipped
        ("~", "\x7f"),
    ],
)
def test_a_prefixs_upper_bound_is_the_next_code_point(prefix: str, bound: str | None) -> None:
    assert store.prefix_upper_bound(prefix) == bound


def test_a_job_id_prefix_reads_as_a_range_only_where_job_id_sorts_by_code_point(engine: Engine, api: Ops) -> None:
    ids = ["a-b", "ab", "a.", "a-", "A-z", "a-\U0010ffff", "b"]
    add(engine, *(Job(job_id, "q") for job_id in ids))
    with engine.connect() as conn:
        assert store.sorts_by_code_point(conn)  # SQLite; the test server's C.UTF-8
    assert listed(api, job_id_prefix="a-") == ["a-b", "a-", "a-\U0010ffff"]
    assert listed(api, job_id_prefix="a-", newest_first=True) == ["a-\U0010ffff", "a-", "a-b"]
    assert listed(api, job_id_prefix="a-\U0010ffff") == ["a-\U0010ffff"]  # no range: the walk


def test_under_a_linguistic_collation_a_prefix_is_never_read_as_a_range(postgres_server: Any) -> None:
    """An ICU database: job_id sorts by code point since w0010 (its own
    collation, "C"); a table from before keeps the database's, where the
    prefix is only the walk's filter -- either way every job it names is listed."""
    name = f"watchdog_icu_{hashlib.sha256(str(time.time()).encode()).hexdigest()[:10]}"
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            text(f"CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en' LOCALE 'C.UTF-8'")
        )
    engine = create_engine(postgres_server.set(database=name))
    try:
        from sqlalchemy_watchdog import metadata

        metadata.create_all(engine)
        ids = ["a-b", "ab", "A-b", "a.", "a-", "b"]
        Watchdog(engine).enqueue([Job(job_id, "q") for job_id in ids])
        with engine.connect() as conn:  # w0010: job_id is COLLATE "C", a prefix is a range
            assert store.sorts_by_code_point(conn)
        assert [job.job_id for job in Watchdog(engine).list_jobs(job_id_prefix="a-")] == ["a-b", "a-"]
        # A table from before w0010 has the database's collation: there the prefix is no range.
        with engine.begin() as conn:
            conn.execute(text('ALTER TABLE watchdog_jobs ALTER COLUMN job_id TYPE TEXT COLLATE "default"'))
        backend_of("postgresql").forget()
        with engine.connect() as conn:
            assert not store.sorts_by_code_point(conn)
        assert [job.job_id for job in Watchdog(engine).list_jobs(job_id_prefix="a-")] == ["a-b", "a-"]
    finally:
        backend_of("postgresql").forget()
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
