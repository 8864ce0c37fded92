"""Flow control: limits in the database (``Watchdog.set_limits``), on both dialects.

What users rely on: at no moment more running jobs of a queue (or of one
key) than its limit, whatever races; no more claims in a window than its
rate, on the database clock; lowering a limit stops nothing that runs;
claims rotate across keys; a queue without limits claims as before.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Connection, Engine, bindparam, create_engine, event, select, text

from sqlalchemy_watchdog import (
    Decision,
    EnqueueConflict,
    HeldBy,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    QueueLimits,
    Rate,
    RunningJob,
    Watchdog,
    store,
    wakeups,
)
from sqlalchemy_watchdog.backends import backend_of
from sqlalchemy_watchdog.store import Claim, SettleRequest, limits_sql, sql
from tests.conftest import WITH_MARIADB
from tests.integration.test_operations import Ops
from tests.runner_kinds import RunnerDriver

LEASE_MS = 60_000


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest, engine: Engine) -> Iterator[Ops]:
    """``Watchdog`` or ``AsyncWatchdog`` on the test's database."""
    ops = Ops(request.param, engine)
    try:
        yield ops
    finally:
        ops.close()


def claim(engine: Engine, queues: list[str] | None, limit: int = 10) -> list[Claim]:
    """A claim as a runner makes it (in autocommit on PostgreSQL)."""
    with engine.connect() as conn:
        batch = store.transact_as(
            conn,
            store.TxMode(autocommit=store.self_committing(engine.dialect.name)),
            store.claim,
            queues=queues,
            limit=limit,
            lease_ms=LEASE_MS,
        )
    return list(batch.claimed)


def settle(engine: Engine, taken: Claim) -> None:
    with store.write_transaction(engine) as conn:
        store.settle_many(conn, [SettleRequest(taken.job.job_id, taken.token, Decision.completed())])


def running(engine: Engine, queue: str) -> Counter[str | None]:
    """Running jobs of ``queue`` per key."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(sql.c.limit_key).where(sql.c.queue_name == queue, sql.c.state == JobState.RUNNING.value)
        ).scalars()
        return Counter(rows)


def enqueue(engine: Engine, jobs: list[Job]) -> None:
    Watchdog(engine).enqueue(jobs)


# -- the API -------------------------------------------------------------------------


def test_set_limits_stores_reads_back_and_clears(engine: Engine, api: Ops) -> None:
    assert api.limits() == ()
    stored = api.set_limits("exports", concurrency=5, concurrency_per_key=1)
    assert isinstance(stored, QueueLimits)
    assert (stored.queue, stored.concurrency, stored.concurrency_per_key, stored.rate) == ("exports", 5, 1, None)
    again = api.set_limits("exports", concurrency=5, concurrency_per_key=1)
    assert again == stored  # idempotent: not even its time moves
    api.set_limits("api", rate=Rate(100, timedelta(minutes=1)))
    assert [limits.queue for limits in api.limits()] == ["api", "exports"]
    assert api.limits()[0].rate == Rate(100, timedelta(minutes=1))
    per_customer = api.set_limits(
        "api", rate=Rate(1000, timedelta(hours=1)), rate_per_key=Rate(100, timedelta(minutes=1))
    )
    assert per_customer.rate_per_key == Rate(100, timedelta(minutes=1))
    assert api.limits()[0] == per_customer
    assert api.set_limits("api", rate=Rate(1000, timedelta(hours=1))).rate_per_key is None  # replaced, not merged
    alone = api.set_limits("api", rate_per_key=Rate(5, timedelta(seconds=1)))  # a limit on its own
    assert (alone.rate, alone.rate_per_key) == (None, Rate(5, timedelta(seconds=1)))
    replaced = api.set_limits("exports", concurrency=2)
    assert (replaced.concurrency, replaced.concurrency_per_key) == (2, None)
    assert api.clear_limits("exports") is True
    assert api.clear_limits("exports") is False
    assert [limits.queue for limits in api.limits()] == ["api"]


def _altered(rate: Rate, **fields: object) -> Rate:
    """``rate`` with fields set past its own checks (as a pickled or hand-made
    one could be): set_limits checks a Rate again."""
    for name, value in fields.items():
        object.__setattr__(rate, name, value)
    return rate


@pytest.mark.dialect_neutral
def test_set_limits_refuses_bad_input_naming_the_field_and_writes_nothing(engine: Engine, api: Ops) -> None:
    minute = timedelta(minutes=1)
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: api.set_limits("q", concurrency=0), "concurrency"),
        (lambda: api.set_limits("q", concurrency=-1), "concurrency"),
        (lambda: api.set_limits("q", concurrency=1_000_001), "concurrency"),
        (lambda: api.set_limits("q", concurrency=True), "concurrency"),
        (lambda: api.set_limits("q", concurrency=2.0), "concurrency"),
        (lambda: api.set_limits("q", concurrency_per_key=0), "concurrency_per_key"),
        (lambda: api.set_limits("q", concurrency_per_key="1"), "concurrency_per_key"),
        (lambda: api.set_limits("q", rate=(1, minute)), "rate"),
        (lambda: api.set_limits("q", rate_per_key=(1, minute)), "rate_per_key"),
        (lambda: api.set_limits("q", rate_per_key="100/minute"), "rate_per_key"),
        (lambda: api.set_limits("q", rate_per_key=_altered(Rate(1, minute), count=0)), "rate_per_key"),
        (lambda: api.set_limits("q", rate_per_key=_altered(Rate(1, minute), count=-3)), "rate_per_key"),
        (lambda: api.set_limits("q", rate_per_key=_altered(Rate(1, minute), count=10**12)), "rate_per_key"),
        (lambda: api.set_limits("q", rate_per_key=_altered(Rate(1, minute), per=timedelta(0))), "rate_per_key"),
        (lambda: api.set_limits("q", rate_per_key=_altered(Rate(1, minute), per=60)), "rate_per_key"),
        (lambda: api.set_limits("q"), "concurrency"),
        (lambda: api.set_limits("", concurrency=1), "queue"),
        (lambda: api.set_limits("q" * 257, concurrency=1), "queue"),
        (lambda: api.clear_limits("q" * 257), "queue"),
    ]
    for call, field in calls:
        with pytest.raises(InvalidJob) as error:
            call()
        assert error.value.field == field, (field, error.value)
    assert api.limits() == ()


@pytest.mark.dialect_neutral
def test_rate_refuses_a_bad_count_or_period_and_parses_the_cli_form() -> None:
    for count, per in [(0, timedelta(seconds=1)), (-1, timedelta(seconds=1)), (True, timedelta(seconds=1))]:
        with pytest.raises(InvalidJob) as error:
            Rate(count, per)
        assert error.value.field == "rate"
    for per in [timedelta(0), timedelta(seconds=-1), timedelta(days=2), timedelta(microseconds=1500)]:
        with pytest.raises(InvalidJob):
            Rate(1, per)
    assert Rate.parse("100/minute") == Rate(100, timedelta(minutes=1))
    assert Rate.parse("10/s") == Rate(10, timedelta(seconds=1))
    assert Rate.parse("5/30s") == Rate(5, timedelta(seconds=30))
    assert Rate.parse("1000/2hours") == Rate(1000, timedelta(hours=2))
    assert Rate.parse(" 7/day ") == Rate(7, timedelta(days=1))
    assert str(Rate(100, timedelta(minutes=1))) == "100/m" and str(Rate(5, timedelta(seconds=30))) == "5/30s"
    for bad in [
        "",
        "100",
        "/s",
        "x/s",
        "10/0s",
        "10/fortnight",
        "0/s",
        "10/2d",
        "-1/s",
        "9999999999/s",
        "5 / s",
        "\u0663/s",
    ]:
        with pytest.raises(InvalidJob):
            Rate.parse(bad)


@pytest.mark.dialect_neutral
def test_a_key_is_bounded_text() -> None:
    assert Job("a", "q", key="tenant-42").key == "tenant-42"
    for bad in ["", "k" * 257, 42, "a\x00b"]:
        with pytest.raises(InvalidJob) as error:
            Job("a", "q", key=bad)  # type: ignore[arg-type]
        assert error.value.field == "key"


def test_a_key_is_part_of_the_jobs_identity(engine: Engine) -> None:
    watchdog = Watchdog(engine)
    watchdog.enqueue(Job("a", "q", key="t1"))
    assert watchdog.enqueue(Job("a", "q", key="t1")).status.value == "duplicate"
    with pytest.raises(EnqueueConflict):
        watchdog.enqueue(Job("a", "q", key="t2"))
    with pytest.raises(EnqueueConflict):
        watchdog.enqueue(Job("a", "q"))
    job = watchdog.read("a")
    assert job is not None and job.key == "t1"


def test_the_database_refuses_an_empty_or_long_key(engine: Engine) -> None:
    from sqlalchemy.exc import IntegrityError

    Watchdog(engine).enqueue(Job("a", "q", key="t"))
    for bad in ["", "k" * 257]:
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(text("UPDATE watchdog_jobs SET limit_key = :k"), {"k": bad})


# -- exact limits --------------------------------------------------------------------


def test_a_claim_takes_no_more_than_the_remaining_room(engine: Engine) -> None:
    enqueue(engine, [Job(f"j{i}", "q") for i in range(20)])
    Watchdog(engine).set_limits("q", concurrency=3)
    first = claim(engine, ["q"], limit=10)
    assert len(first) == 3 and claim(engine, ["q"], limit=10) == []
    settle(engine, first[0])
    assert len(claim(engine, ["q"], limit=10)) == 1
    assert claim(engine, None, limit=10) == []  # a claim of every queue obeys it too
    assert sum(running(engine, "q").values()) == 3


def test_one_job_per_key_at_a_time(engine: Engine) -> None:
    enqueue(engine, [Job(f"{key}-{i}", "q", key=key) for key in ("a", "b", "c") for i in range(5)])
    Watchdog(engine).set_limits("q", concurrency_per_key=1)
    taken = claim(engine, ["q"], limit=10)
    assert sorted(job.job.key or "" for job in taken) == ["a", "b", "c"]
    assert claim(engine, ["q"], limit=10) == []
    settle(engine, next(job for job in taken if job.job.key == "b"))
    again = claim(engine, ["q"], limit=10)
    assert [job.job.job_id for job in again] == ["b-1"]


def test_a_vanished_workers_jobs_count_until_recovery(engine: Engine) -> None:
    enqueue(engine, [Job(f"j{i}", "q", max_recoveries=5) for i in range(4)])
    Watchdog(engine).set_limits("q", concurrency=2)
    claim(engine, ["q"])
    with engine.begin() as conn:  # both leases end: their worker is gone
        conn.execute(text("UPDATE watchdog_jobs SET lease_until = 0 WHERE state = 'running'"))
    assert claim(engine, ["q"]) == []  # still counted: no burst
    with store.write_transaction(engine) as conn:
        for expired in store.expired_claims(conn, limit=10):
            store.reconcile(conn, expired)
    assert len(claim(engine, ["q"])) == 2


def test_lowering_a_limit_keeps_running_jobs_and_holds_back_new_claims(engine: Engine) -> None:
    enqueue(engine, [Job(f"j{i}", "q") for i in range(10)])
    watchdog = Watchdog(engine)
    watchdog.set_limits("q", concurrency=5)
    taken = claim(engine, ["q"])
    assert len(taken) == 5
    watchdog.set_limits("q", concurrency=2)
    assert sum(running(engine, "q").values()) == 5  # nothing stopped
    stats = watchdog.stats().queue("q")
    assert stats.limits is not None and stats.limits.concurrency == 2
    assert stats.held_back == 5 and stats.running == 5
    job = watchdog.read("j9")
    assert job is not None and job.held_by is HeldBy.CONCURRENCY
    for done in taken[:3]:
        settle(engine, done)
    assert claim(engine, ["q"]) == []  # 2 still run: at the new limit
    settle(engine, taken[3])
    assert len(claim(engine, ["q"])) == 1


def test_the_rate_counts_claims_in_the_window_on_the_database_clock(engine: Engine) -> None:
    enqueue(engine, [Job(f"j{i}", "q") for i in range(10)])
    watchdog = Watchdog(engine)
    watchdog.set_limits("q", rate=Rate(3, timedelta(milliseconds=700)))
    first = claim(engine, ["q"], limit=2)
    assert len(first) == 2
    assert len(claim(engine, ["q"], limit=10)) == 1
    for done in first:
        settle(engine, done)  # settling frees no rate
    assert claim(engine, ["q"], limit=10) == []
    assert watchdog.stats().queue("q").rate_used == 3
    held = watchdog.read("j9")
    assert held is not None and held.held_by is HeldBy.RATE
    time.sleep(0.8)
    assert len(claim(engine, ["q"], limit=10)) == 3
    with engine.connect() as conn:  # the claimers forget what left the window
        logged = conn.execute(text("SELECT count(*) FROM watchdog_limit_claims")).scalar_one()
    assert logged <= 2


def test_a_keys_rate_counts_its_claims_in_the_window_and_other_keys_go_on(engine: Engine) -> None:
    enqueue(engine, [Job(f"{key}-{i}", "q", key=key) for key in ("a", "b") for i in range(10)])
    enqueue(engine, [Job(f"plain-{i}", "q") for i in range(3)])
    watchdog = Watchdog(engine)
    watchdog.set_limits("q", rate_per_key=Rate(2, timedelta(milliseconds=900)))
    first = claim(engine, ["q"], limit=3)
    assert Counter(c.job.key for c in first) == {"a": 1, "b": 1, None: 1}
    second = claim(engine, ["q"], limit=10)
    # Each key its second start of the window; unkeyed jobs are not bound by it.
    assert Counter(c.job.key for c in second) == {"a": 1, "b": 1, None: 2}
    for done in first + second:
        settle(engine, done)  # settling frees no rate
    assert claim(engine, ["q"], limit=10) == []
    stats = watchdog.stats().queue("q")
    assert stats.held_back == 16 and stats.queued == 16
    assert (stats.rate_used, stats.rate_per_key_used) == (None, 2)  # the busiest key is at its rate
    held = watchdog.read("a-9")
    assert held is not None and held.held_by is HeldBy.RATE_PER_KEY
    time.sleep(1.0)
    assert Counter(c.job.key for c in claim(engine, ["q"], limit=10)) == {"a": 2, "b": 2}
    with engine.connect() as conn:  # one row per key a claim started jobs of
        logged = conn.execute(text("SELECT limit_key, jobs FROM watchdog_limit_claims ORDER BY id DESC LIMIT 2"))
        assert sorted(tuple(row) for row in logged) == [("a", 2), ("b", 2)]


def test_a_keys_rate_and_the_queues_rate_both_hold(engine: Engine) -> None:
    enqueue(engine, [Job(f"{key}-{i}", "q", key=key) for key in "abcd" for i in range(5)])
    watchdog = Watchdog(engine)
    watchdog.set_limits("q", rate=Rate(5, timedelta(minutes=1)), rate_per_key=Rate(1, timedelta(minutes=1)))
    assert Counter(c.job.key for c in claim(engine, ["q"], limit=10)) == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert claim(engine, ["q"], limit=10) == []  # each key used its one start
    watchdog.set_limits("q", rate=Rate(5, timedelta(minutes=1)), rate_per_key=Rate(3, timedelta(minutes=1)))
    assert len(claim(engine, ["q"], limit=10)) == 1  # the queue's rate: 5 in the window
    stats = watchdog.stats().queue("q")
    assert (stats.rate_used, stats.rate_per_key_used) == (5, 2)  # one key started twice in its window


def test_an_unlimited_queue_claims_as_before_beside_a_limited_one(engine: Engine) -> None:
    enqueue(engine, [Job(f"u{i}", "free", priority=i % 3) for i in range(6)])
    enqueue(engine, [Job(f"l{i}", "slow") for i in range(6)])
    Watchdog(engine).set_limits("slow", concurrency=1)
    taken = claim(engine, ["free", "slow"], limit=20)
    assert Counter(job.job.queue for job in taken) == {"free": 6, "slow": 1}
    free = [job.job.job_id for job in taken if job.job.queue == "free"]
    assert free == ["u2", "u5", "u1", "u4", "u0", "u3"]  # priority, then admission


def test_clearing_limits_lets_the_queue_claim_freely_again(engine: Engine) -> None:
    enqueue(engine, [Job(f"j{i}", "q") for i in range(6)])
    watchdog = Watchdog(engine)
    watchdog.set_limits("q", concurrency=1)
    assert len(claim(engine, ["q"])) == 1
    watchdog.clear_limits("q")
    assert len(claim(engine, ["q"])) == 5


# -- fairness ------------------------------------------------------------------------


def test_a_big_key_and_a_small_one_get_interleaved_starts(engine: Engine) -> None:
    big = [Job(f"big-{i:05}", "q", key="big") for i in range(10_000)]
    enqueue(engine, big)
    enqueue(engine, [Job(f"small-{i}", "q", key="small") for i in range(10)])
    Watchdog(engine).set_limits("q", concurrency=100)
    order: list[str | None] = []
    for _ in range(10):
        taken = claim(engine, ["q"], limit=2)
        order.extend(job.job.key for job in sorted(taken, key=lambda c: c.job.sequence))
        for done in taken:
            settle(engine, done)
    assert Counter(order) == {"big": 10, "small": 10}
    # Within a key, priority then admission.
    first = claim(engine, ["q"], limit=1)
    assert first[0].job.job_id == "big-00010"


def test_priorities_order_jobs_within_a_key_and_the_rotation_includes_unkeyed_jobs(engine: Engine) -> None:
    enqueue(engine, [Job("a-low", "q", key="a"), Job("a-high", "q", key="a", priority=5)])
    enqueue(engine, [Job("b-1", "q", key="b"), Job("plain", "q")])
    Watchdog(engine).set_limits("q", concurrency=10)
    taken = [c.job.job_id for c in claim(engine, ["q"], limit=3)]
    assert sorted(taken) == ["a-high", "b-1", "plain"]
    assert [c.job.job_id for c in claim(engine, ["q"], limit=3)] == ["a-low"]


def test_a_long_run_of_keys_at_their_limit_does_not_hide_a_free_key(engine: Engine) -> None:
    busy = [Job(f"k{i:03}-{n}", "q", key=f"k{i:03}") for i in range(300) for n in range(2)]
    enqueue(engine, busy)
    watchdog = Watchdog(engine)
    watchdog.set_limits("q", concurrency_per_key=1)
    first = claim(engine, ["q"], limit=300)
    assert len(first) == 300
    enqueue(engine, [Job("late", "q", key="k150x")])
    found: list[str] = []
    for _ in range(5):
        found.extend(c.job.job_id for c in claim(engine, ["q"], limit=1))
    assert found == ["late"]


@pytest.mark.parametrize("ahead", [limits_sql.UNKEYED_SCAN, limits_sql.UNKEYED_SCAN + 1])
def test_unkeyed_jobs_are_found_among_the_first_room_plus_256_queued(engine: Engine, ahead: int) -> None:
    """The documented bound of the unkeyed jobs' turn: it looks at the queue's
    first ``room + 256`` queued jobs in claim order. An unkeyed job behind
    256 queued jobs of a key at its limit is found (room 1: 257 looked at);
    behind 257 it waits until the key's backlog ahead of it shrinks."""
    enqueue(engine, [Job(f"a-{n:04}", "q", key="a") for n in range(ahead + 1)])
    enqueue(engine, [Job("plain", "q")])
    Watchdog(engine).set_limits("q", concurrency_per_key=1)
    assert [c.job.job_id for c in claim(engine, ["q"], limit=1)] == ["a-0000"]  # key a is at its limit now
    found = [c.job.job_id for c in claim(engine, ["q"], limit=1)]
    assert found == (["plain"] if ahead <= limits_sql.UNKEYED_SCAN else [])


# -- races ---------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", WITH_MARIADB)
def test_racing_claimers_never_exceed_the_queue_or_key_limits(engine: Engine) -> None:
    """Six claimers race over one limited queue; each claim and settle is
    run again on a transient failure, as a runner's is (a deadlock between
    claimers is one on MariaDB: InnoDB rolls the victim's transaction back)."""
    keys = [f"t{i}" for i in range(6)]
    enqueue(engine, [Job(f"{key}-{n}", "q", key=key) for key in keys for n in range(40)])
    Watchdog(engine).set_limits("q", concurrency=4, concurrency_per_key=1)
    violations: list[str] = []
    stop = threading.Event()
    engines = [create_engine(engine.url) for _ in range(6)]

    def work(mine: Engine) -> None:
        while not stop.is_set():
            try:
                taken = store.retrying(lambda: claim(mine, ["q"], limit=3), what="claim")
            except Exception as error:
                violations.append(repr(error))
                return
            now = running(mine, "q")
            if sum(now.values()) > 4 or any(count > 1 for count in now.values()):
                violations.append(f"running: {dict(now)}")
            for done in taken:
                store.retrying(functools.partial(settle, mine, done), what="settle")
            if not taken:
                time.sleep(0.001)

    threads = [threading.Thread(target=work, args=(mine,)) for mine in engines]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Watchdog(engine).has_pending_work():
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(30)
    for mine in engines:
        mine.dispose()
    assert violations == []
    assert not Watchdog(engine).has_pending_work()


def test_a_paused_limited_queue_is_not_claimed(engine: Engine) -> None:
    enqueue(engine, [Job(f"j{i}", "q", key="k") for i in range(3)])
    watchdog = Watchdog(engine)
    watchdog.set_limits("q", concurrency=2)
    watchdog.pause("q")
    assert claim(engine, ["q"]) == [] and claim(engine, None) == []
    watchdog.resume("q")
    assert len(claim(engine, ["q"])) == 2


def test_both_runners_keep_a_queue_within_its_limits_and_rotate_keys(engine: Engine, runners: RunnerDriver) -> None:
    """Runner and AsyncRunner (its claims run through the async gateway) serve a
    limited queue: never more running than the limits, every job done."""
    enqueue(engine, [Job(f"{key}-{n}", "q", key=key) for key in ("a", "b", "c") for n in range(4)])
    Watchdog(engine).set_limits("q", concurrency=2, concurrency_per_key=1)
    seen: list[tuple[int, Counter[str | None]]] = []

    def handler(job: object) -> None:
        now = running(engine, "q")
        seen.append((sum(now.values()), now))
        time.sleep(0.01)

    worker = runners.runner({"q": handler}, concurrency=6)
    settled = worker.run_until_idle()
    assert len(settled) == 12 and {job.outcome for job in settled} == {Outcome.COMPLETED}
    assert seen and all(total <= 2 and max(counts.values()) <= 1 for total, counts in seen), seen


def test_a_runner_held_back_by_a_limit_starts_as_soon_as_room_frees(engine: Engine, runners: RunnerDriver) -> None:
    """Another worker holds a queue's only slot; a runner that claims it is
    held back and waits, its next poll a minute away. When the other worker's
    job settles, the runner is woken (PostgreSQL: NOTIFY; SQLite: the settle in
    this process) and starts the next job long before that poll."""
    enqueue(engine, [Job("first", "q"), Job("second", "q")])
    Watchdog(engine).set_limits("q", concurrency=1)
    (other,) = claim(engine, ["q"], limit=1)
    started, _ = _serve_held_back(runners, lambda: settle(engine, other), within=20)
    assert started == ["second"]


def test_a_held_back_runner_is_woken_once_the_settle_committed_not_before(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The settle that frees room wakes this process's runners when its
    transaction commits: a runner woken while the settle's transaction is
    still open would claim, see the settling job still running (on MariaDB
    its read does not wait for the writer) and wait for its next poll, a
    minute away. The transaction here stays open a second after the settle."""
    enqueue(engine, [Job("first", "q"), Job("second", "q")])
    Watchdog(engine).set_limits("q", concurrency=1)
    (other,) = claim(engine, ["q"], limit=1)

    def settle_and_linger() -> None:
        with store.write_transaction(engine) as conn:
            store.settle_many(conn, [SettleRequest(other.job.job_id, other.token, Decision.completed())])
            time.sleep(1.0)  # a woken runner's claim would run now and find no room

    started, _ = _serve_held_back(runners, settle_and_linger, within=20)
    assert started == ["second"]


@pytest.mark.parametrize("dialect", ["sqlite", "mariadb"])  # the dialects woken in-process
def test_a_connection_kept_for_many_transactions_owes_one_wake_up_per_commit_and_gathers_no_listeners(
    engine: Engine,
) -> None:
    """A runner keeps its connections: the wake-up owed at commit is
    registered on a connection once, fires once per committed transaction
    that freed room and never for one rolled back."""
    woken: list[int] = []
    stop = wakeups.wake_locally(wakeups.local_key(engine), lambda: woken.append(1))
    try:
        with engine.connect() as conn:
            for round_ in range(50):
                conn.execute(text("SELECT 1"))
                wakeups.room_freed_at_commit(conn)
                assert len(woken) == round_ // 2 + round_ % 2  # not before the commit
                conn.commit() if round_ % 2 == 0 else conn.rollback()
            listeners = len(conn.dispatch.commit) + len(conn.dispatch.rollback)
    finally:
        stop()
    assert len(woken) == 25
    assert listeners <= 2


def _serve_held_back(runners: RunnerDriver, free: Callable[[], None], *, within: float) -> tuple[list[str], float]:
    """A runner of queue ``q`` polling once a minute, held back by its limit:
    once it has waited a second without starting anything, ``free`` makes room,
    and it must start a job within ``within`` seconds. The jobs it started, and
    the seconds from ``free`` to the first start."""
    started: list[str] = []
    ran = threading.Event()

    def handler(job: RunningJob) -> None:
        started.append(job.job_id)
        ran.set()

    worker = runners.runner({"q": handler}, poll_interval=timedelta(seconds=60))
    with worker.serving():
        time.sleep(1.0)  # it claimed, was held back, and waits
        assert not ran.is_set()
        began = time.monotonic()
        free()
        assert ran.wait(within), "the held-back runner was not woken when room freed"
        waited = time.monotonic() - began
    return started, waited


def _expire(engine: Engine, job_id: str) -> Claim:
    """End ``job_id``'s lease now (its worker vanished): the expired claim recovery sees."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET lease_until = 0 WHERE job_id = :j"), {"j": job_id})
    with store.write_transaction(engine) as conn:
        (expired,) = [c for c in store.expired_claims(conn, limit=10) if c.job.job_id == job_id]
    return expired


def _recover(engine: Engine, held: Claim) -> None:
    expired = _expire(engine, held.job.job_id)
    with store.write_transaction(engine) as conn:
        assert store.reconcile(conn, expired).status is store.RecoveryStatus.REQUEUED


def _recover_and_settle(engine: Engine, held: Claim) -> None:
    expired = _expire(engine, held.job.job_id)
    with store.write_transaction(engine) as conn:
        assert store.reconcile(conn, expired, max_recoveries=0).status is store.RecoveryStatus.SETTLED


def _fail_lane(engine: Engine, held: Claim) -> None:
    assert Watchdog(engine).fail_lane("doomed", "the partner is down").settled == 1


def _give_back(engine: Engine, held: Claim) -> None:
    with store.write_transaction(engine) as conn:
        (recovered,) = store.release_and_recover(conn, [(held.job.job_id, held.token)])
    assert recovered.status is store.RecoveryStatus.REQUEUED


@pytest.mark.parametrize(
    "free",
    [_recover, _recover_and_settle, _fail_lane, _give_back],
    ids=["recovery-requeues", "recovery-settles", "lane-failure", "claim-given-back"],
)
def test_a_held_back_runner_is_woken_when_room_frees_without_a_settle(
    engine: Engine, runners: RunnerDriver, free: Callable[[Engine, Claim], None]
) -> None:
    """Another worker's job holds the queue's only slot and leaves ``running``
    without a settle: recovery requeues it or settles it ``interrupted``, its
    lane is failed, or its claim is given back (released and recovered at a
    shutdown). The runner held back, its next poll a minute away, is woken
    (PostgreSQL: NOTIFY from any process; SQLite: the change made in this
    process) and starts a job within seconds."""
    enqueue(engine, [Job("held", "q", lane="doomed", max_recoveries=3), Job("next", "q")])
    Watchdog(engine).set_limits("q", concurrency=1)
    (held,) = claim(engine, ["q"], limit=1)
    assert held.job.job_id == "held"
    started, waited = _serve_held_back(runners, lambda: free(engine, held), within=15)
    assert waited < 15
    assert started and started[0] in {"held", "next"}


def test_settling_an_unlimited_queues_job_costs_no_wake_up(engine: Engine) -> None:
    """The wake-up for freed room is sent only for jobs of limited queues: a
    settle of an unlimited queue's job is its one statement, as before limits,
    even while another queue is limited; a limited queue's settle adds the
    wake-up (PostgreSQL: one statement, a NOTIFY only while a runner waits)."""
    enqueue(engine, [Job("free", "plain"), Job("held", "q")])
    Watchdog(engine).set_limits("q", concurrency=1)
    taken = {c.job.job_id: c for c in claim(engine, ["plain", "q"], limit=2)}
    sent: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        sent.append(statement)

    with engine.connect() as conn:
        store.limits.limited_queues(conn)  # the list a running runner has read already
    event.listen(engine, "before_cursor_execute", record)
    try:
        settle(engine, taken["free"])
        unlimited = list(sent)
        sent.clear()
        settle(engine, taken["held"])
    finally:
        event.remove(engine, "before_cursor_execute", record)
    if backend_of(engine.dialect.name).writes_return_rows:  # the settle is its one UPDATE
        assert [s for s in unlimited if "UPDATE watchdog_jobs" not in s and not s.startswith("BEGIN")] == []
    else:  # MariaDB: a locking read, the guarded UPDATE, a read back, the edges' outcomes -- nothing of limits
        assert unlimited and not [s for s in unlimited if "watchdog_limit" in s or "GET_LOCK" in s], unlimited
    if engine.dialect.name == "postgresql":
        assert len(sent) == len(unlimited) + 1 and "pg_notify" in sent[-1]
    else:
        assert len(sent) == len(unlimited)  # SQLite wakes this process's runners, no statement


# -- the one-statement claim (PostgreSQL) ---------------------------------------------


def _claim_statements(engine: Engine, queue: str, limit: int) -> tuple[list[Claim], list[str]]:
    """A runner's claim of ``queue``, and the SQL statements it sent."""
    sent: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        sent.append(statement)

    with engine.connect() as conn:  # the list of limited queues read before, as a running runner has it
        store.limits.forget_limited(conn)
        store.limits.limited_queues(conn)
    event.listen(engine, "before_cursor_execute", record)
    try:
        taken = claim(engine, [queue], limit=limit)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return taken, sent


@pytest.mark.parametrize("dialect", ["postgresql"])  # SQLite claims in its write transaction
def test_a_limited_claim_is_one_statement_on_postgresql(engine: Engine) -> None:
    """The limited claim -- lock, room, walk, pick, claim, cursor, rate log -- is
    one round trip, as the plain claim is, while its snapshot is not older than
    its lock (nobody else claimed the queue meanwhile)."""
    enqueue(engine, [Job(f"{key}-{n}", "q", key=key) for key in "abc" for n in range(3)] + [Job("plain", "q")])
    Watchdog(engine).set_limits("q", concurrency=5, concurrency_per_key=1, rate=Rate(100, timedelta(minutes=1)))
    taken, sent = _claim_statements(engine, "q", 10)
    assert sorted(c.job.job_id for c in taken) == ["a-0", "b-0", "c-0", "plain"]
    assert len(sent) == 1 and sent[0].lstrip().startswith("WITH RECURSIVE"), sent
    with engine.connect() as conn:
        assert conn.execute(text("SELECT sum(jobs) FROM watchdog_limit_claims")).scalar() == 4
        assert conn.execute(text("SELECT cursor_key FROM watchdog_limits")).scalar() is None  # unkeyed got the last
    held, sent = _claim_statements(engine, "q", 10)  # every key at its limit: one statement, nothing taken
    assert held == [] and len(sent) == 1


@pytest.mark.parametrize("dialect", ["postgresql"])  # the READ COMMITTED snapshot and lock of PostgreSQL
def test_a_claim_whose_snapshot_predates_its_lock_claims_by_the_transaction(engine: Engine) -> None:
    """A claim that waited for the limits row while another claim committed
    must not count with its older snapshot: the one statement sees that the
    row it locked is not the version its snapshot holds, changes nothing, and
    the transaction path claims with fresh counts -- never over the limit."""
    enqueue(engine, [Job(f"j{i}", "q") for i in range(10)])
    Watchdog(engine).set_limits("q", concurrency=3)
    first = create_engine(engine.url)
    try:
        with first.connect() as holder:
            holder.execute(text("SELECT 1 FROM watchdog_limits WHERE queue_name = 'q' FOR UPDATE"))
            # The holder claims two jobs (by hand, as a claim would) and moves the cursor.
            holder.execute(
                text(
                    "UPDATE watchdog_jobs SET state = 'running', claim_token = 'x.' || sequence,"
                    " lease_until = 9000000000000 WHERE job_id IN ('j0', 'j1')"
                )
            )
            holder.execute(text("UPDATE watchdog_limits SET cursor_key = NULL WHERE queue_name = 'q'"))
            results: list[tuple[object, list[str]]] = []

            def waiter() -> None:
                with engine.connect() as conn:
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                    at_once = store.limits.claim_at_once(conn, "q", limit=10, lease_ms=LEASE_MS, token="w")
                    results.append((at_once, []))

            thread = threading.Thread(target=waiter)
            thread.start()
            time.sleep(0.5)  # the waiter's statement has its snapshot and waits for the row
            holder.commit()
            thread.join(30)
        assert results and results[0][0] is store.limits.AGAIN  # changed nothing
        assert sum(running(engine, "q").values()) == 2
        # The transaction: the lock first, then the one statement (its snapshot now younger).
        sent: list[str] = []

        def record(conn: object, cursor: object, statement: str, *args: object) -> None:
            sent.append(statement)

        event.listen(engine, "before_cursor_execute", record)
        try:
            with engine.connect() as conn:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                taken = store.limits.claim_in_transaction(conn, "q", limit=10, lease_ms=LEASE_MS, token="t")
        finally:
            event.remove(engine, "before_cursor_execute", record)
        assert taken is not None and len(taken.rows) == 1 and taken.held
        assert sum(running(engine, "q").values()) == 3
        assert [statement.lstrip().split()[0] for statement in sent] == ["SELECT", "WITH"], sent
        assert "FOR UPDATE" in sent[0]
    finally:
        first.dispose()


def _random_state(engine: Engine, rng: random.Random) -> tuple[int, str | None]:
    """A limited queue in a random state: keys with queued and running jobs,
    unkeyed jobs, priorities, limits and a cursor; the claim's ask."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM watchdog_jobs"))
        conn.execute(text("DELETE FROM watchdog_limit_claims"))
        conn.execute(text("DELETE FROM watchdog_limits"))
    keys = [f"k{n:02}" for n in rng.sample(range(40), rng.randint(0, 14))]
    jobs = [
        Job(f"{key}-{n}", "q", key=key, priority=rng.choice([0, 0, 1, 5]))
        for key in keys
        for n in range(rng.randint(0, 4))
    ]
    jobs += [Job(f"u-{n}", "q", priority=rng.choice([0, 0, 2])) for n in range(rng.randint(0, 6))]
    rng.shuffle(jobs)
    if jobs:
        enqueue(engine, jobs)
    running_ids = [job.job_id for job in jobs if rng.random() < 0.2]
    concurrency = rng.choice([None, rng.randint(1, 12)])
    per_key = rng.choice([None, 1, 2])
    rate = rng.choice([None, Rate(rng.randint(1, 12), timedelta(minutes=1))])
    rate_per_key = rng.choice([None, None, Rate(rng.randint(1, 3), timedelta(seconds=30))])
    if concurrency is None and per_key is None and rate is None and rate_per_key is None:
        concurrency = 50
    Watchdog(engine).set_limits(
        "q", concurrency=concurrency, concurrency_per_key=per_key, rate=rate, rate_per_key=rate_per_key
    )
    cursor = rng.choice([None, *keys, "k15x"]) if keys else None
    with engine.begin() as conn:
        if running_ids:
            conn.execute(
                text(
                    "UPDATE watchdog_jobs SET state = 'running', claim_token = 'r.' || sequence,"
                    " lease_until = 9000000000000 WHERE job_id IN :ids"
                ).bindparams(bindparam("ids", expanding=True)),
                {"ids": running_ids},
            )
        conn.execute(text("UPDATE watchdog_limits SET cursor_key = :cursor"), {"cursor": cursor})
        if rate is not None and rng.random() < 0.5:
            conn.execute(
                text(
                    "INSERT INTO watchdog_limit_claims (queue_name, claimed_at, jobs)"
                    " VALUES ('q', CAST(floor(EXTRACT(EPOCH FROM now()) * 1000) AS BIGINT) - 1000, :jobs)"
                ),
                {"jobs": rng.randint(1, rate.count)},
            )
        if rate_per_key is not None:
            for key in keys:
                if rng.random() < 0.5:  # this key's earlier starts, in its window or just out of it
                    conn.execute(
                        text(
                            "INSERT INTO watchdog_limit_claims (queue_name, claimed_at, jobs, limit_key)"
                            " VALUES ('q', CAST(floor(EXTRACT(EPOCH FROM now()) * 1000) AS BIGINT) - :ago,"
                            " :jobs, :key)"
                        ),
                        {"jobs": rng.randint(1, rate_per_key.count), "key": key, "ago": rng.choice([1000, 31_000])},
                    )
    return rng.randint(1, 8), cursor


def _outcome(conn: Connection, taken: object) -> tuple[object, ...]:
    assert isinstance(taken, store.limits.Taken)
    claimed = sorted((row[1], row[7]) for row in taken.rows)
    cursor = conn.execute(text("SELECT cursor_key FROM watchdog_limits")).scalar()
    # The whole log (forgotten rows and one row per key included): both start from the same state.
    logged = sorted(
        (tuple(row) for row in conn.execute(text("SELECT limit_key, jobs FROM watchdog_limit_claims"))),
        key=repr,
    )
    return claimed, cursor, logged, taken.held


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_the_one_statement_claim_takes_what_the_transaction_takes(engine: Engine) -> None:
    """Differential: on random queues (keys, unkeyed jobs, priorities, running
    jobs, every kind of limit, any cursor), the one-statement claim takes the
    same jobs as the claim made of several statements, moves the cursor to
    the same key and logs the same count -- or declines (never a different
    answer). Each pair runs from the same state, rolled back between."""
    rng = random.Random(20261205)
    compared = declined = took = 0
    for _ in range(60):
        limit, _cursor = _random_state(engine, rng)
        with engine.connect() as conn:
            at_once = store.limits.claim_at_once(conn, "q", limit=limit, lease_ms=LEASE_MS, token="t")
            fast = None if at_once is store.limits.AGAIN else _outcome(conn, at_once)
            conn.rollback()
            segments = store.limits.claim_in_transaction(
                conn, "q", limit=limit, lease_ms=LEASE_MS, token="t", at_once=False
            )
            slow = _outcome(conn, segments)
            conn.rollback()
        if fast is None:
            declined += 1
            continue
        compared += 1
        assert fast[:3] == slow[:3]
        took += bool(fast[0])
    assert compared >= 50 and declined <= 10 and took >= 30
