"""Wake-ups when the waiting runner's process is killed or frozen (PostgreSQL).

An idle runner's listener session holds the waiting lock exclusively (the
sentinel, see :mod:`sqlalchemy_watchdog.wakeups`); other idle runners are
covered by it. These tests run two ``tests/faults/chaos_worker.py`` processes
on one queue and signal the sentinel's process:

* SIGKILL: its session dies with it, and the lock with the session, but no
  handover is sent. The covered runner must take the lock at its next try
  (within ``poll_interval``), and from then on enqueues notify again: each
  job starts at once, not at the next poll. A job enqueued meanwhile, by a
  transaction that found nobody waiting (so did not notify), is not lost:
  the covered runner's takeover waits for that transaction to end, then
  takes its last look and starts it -- again without waiting for a poll.
* SIGSTOP: its session stays, and so does the lock. Enqueues keep notifying,
  and the notification reaches the covered runner too, which starts the jobs
  at once.

Each worker connects with its own ``application_name``, so the session that
holds the lock (``pg_locks``) names the process to signal
(``pg_stat_activity``). Each case runs with ``Runner`` and with
``AsyncRunner`` workers (``runner_kind``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, enqueue, store
from sqlalchemy_watchdog.wakeups import EVENT_QUEUED, WAIT_SQL, WAITING_LOCK
from tests.faults.helpers import (
    Worker,
    WorkerPool,
    assert_settled_exactly_once,
    audit_rows,
    enqueue_jobs,
    jobs_by_id,
)
from tests.helpers import Notifications, wait_until

pytestmark = [
    pytest.mark.slow,  # real processes, ~5 s each: CI runs it
    pytest.mark.parametrize("dialect", ["postgresql"]),  # LISTEN/NOTIFY is PostgreSQL's
]

#: The workers' poll interval: a covered runner tries to take the lock this often.
POLL = 2.0
#: A job is "prompt" if its handler was called this soon after its enqueue
#: committed -- well under POLL, so a job found by polling is not prompt.
PROMPT = 0.75
#: Slack for the takeover beyond the covered runner's next try.
MARGIN = 1.5
#: Long enough that no quick job's lease ends during the test.
TIMING = {"lease": 30.0, "heartbeat": 1.0, "poll": POLL}
JOBS = 5

_HOLDER_SQL = text(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid = :classid AND l.objid = :objid"
    " AND l.mode = 'ExclusiveLock' AND l.granted"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
_TRIED_SQL = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND application_name = :name AND query = :wait_sql"
)
_SESSIONS_SQL = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = :name"
)


def lock_holders(engine: Engine) -> list[str]:
    """The ``application_name`` of every session holding the waiting lock exclusively."""
    with engine.connect() as conn:
        rows = conn.execute(_HOLDER_SQL, {"classid": WAITING_LOCK[0], "objid": WAITING_LOCK[1]}).scalars()
        return list(rows)


def tried_to_wait(engine: Engine, name: str) -> bool:
    """Whether a session of worker ``name`` last ran the try to wait (its listener)."""
    with engine.connect() as conn:
        return bool(conn.execute(_TRIED_SQL, {"name": name, "wait_sql": WAIT_SQL}).scalar_one())


def last_try_age(engine: Engine, name: str) -> float | None:
    """Seconds since the listener of worker ``name`` last started its try to
    wait (None: it has not tried)."""
    with engine.connect() as conn:
        age = conn.execute(
            text(
                "SELECT EXTRACT(EPOCH FROM clock_timestamp() - max(query_start)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = :name AND query = :wait_sql"
            ),
            {"name": name, "wait_sql": WAIT_SQL},
        ).scalar()
    return None if age is None else float(age)


def holds_shared_waiting_lock(conn: Connection) -> bool:
    """Whether ``conn``'s transaction holds the waiting lock shared: its
    enqueue found nobody waiting and did not notify."""
    return bool(
        conn.execute(
            text(
                "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
                " AND objsubid = 2 AND classid = :classid AND objid = :objid AND mode = 'ShareLock' AND granted"
            ),
            {"classid": WAITING_LOCK[0], "objid": WAITING_LOCK[1]},
        ).scalar_one()
    )


def sessions_of(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(_SESSIONS_SQL, {"name": name}).scalar_one())


@pytest.fixture
def notifications(instrumented: Engine) -> Iterator[Notifications]:
    listening = Notifications(instrumented)
    try:
        yield listening
    finally:
        listening.close()


def start_pair(db_url: URL, workers: WorkerPool, runner_kind: str) -> dict[str, Worker]:
    """Two workers on the ``chaos`` queue, each connecting as ``application_name`` = its name."""
    pair = {}
    for name in ("w1", "w2"):
        url = db_url.update_query_dict({"application_name": name})
        pair[name] = workers.start(url, name, concurrency=1, asyncio=runner_kind == "async", **TIMING)
    for worker in pair.values():
        worker.wait_ready()
    return pair


def sentinel_and_covered(engine: Engine, pair: dict[str, Worker], workers: WorkerPool) -> tuple[Worker, Worker]:
    """Wait until one worker's listener holds the waiting lock and the other
    tried to wait (and was covered); the two, sentinel first."""

    def settled_roles() -> tuple[Worker, Worker] | None:
        holders = lock_holders(engine)
        if len(holders) != 1 or holders[0] not in pair:
            return None
        (other,) = set(pair) - set(holders)
        return (pair[holders[0]], pair[other]) if tried_to_wait(engine, other) else None

    try:
        roles = wait_until(settled_roles, timeout=30, what="one worker to wait and the other to be covered")
    except AssertionError:
        raise AssertionError(f"holders {lock_holders(engine)}\n{workers.logs()}") from None
    assert lock_holders(engine) == [roles[0].name]
    return roles


def enqueue_and_time(engine: Engine, notifications: Notifications, job_id: str) -> tuple[float, list[str]]:
    """Enqueue ``job_id`` in a transaction of its own; how long after the
    commit its handler was called (seconds), and the notifications sent."""
    notifications.drain()
    enqueue_jobs(engine, [Job(job_id, "chaos")])
    committed_ms = store.now_ms()
    (run,) = wait_until(lambda: audit_rows(engine, job_id), timeout=POLL + 10, what=f"{job_id} to start")
    return (run["called_ms"] - committed_ms) / 1000, notifications.received(within=1.0)


def test_a_killed_waiting_worker_is_replaced_by_the_covered_one_and_no_job_is_lost_or_run_twice(
    instrumented: Engine, db_url: URL, workers: WorkerPool, notifications: Notifications, runner_kind: str
) -> None:
    """SIGKILL the sentinel's process: no handover is sent, but the covered
    worker takes the lock at its next try (no job is enqueued until then:
    a claim would make it busy and then idle, and so take the lock by
    another way), and from then on every enqueue notifies: each job starts
    at once on the survivor, and runs exactly once."""
    engine = instrumented
    pair = start_pair(db_url, workers, runner_kind)
    sentinel, covered = sentinel_and_covered(engine, pair, workers)

    sentinel.kill()
    killed = time.monotonic()
    assert sentinel.proc.returncode == -signal.SIGKILL
    wait_until(lambda: sessions_of(engine, sentinel.name) == 0, timeout=10, what="the dead worker's sessions to end")
    wait_until(
        lambda: lock_holders(engine) == [covered.name],
        timeout=POLL + MARGIN + 5,
        what=f"{covered.name} to take the waiting lock",
    )
    took_over = time.monotonic() - killed
    assert took_over < POLL + MARGIN, f"the covered worker took over {took_over:.1f}s after the kill (poll {POLL}s)"

    delays = {}
    for i in range(JOBS):
        # The survivor waits again (its previous job settled): the enqueue must notify it.
        wait_until(lambda: lock_holders(engine) == [covered.name], timeout=10, what=f"{covered.name} to wait again")
        delays[f"job-{i}"], sent = enqueue_and_time(engine, notifications, f"job-{i}")
        assert EVENT_QUEUED in sent, f"job-{i}: the enqueue did not notify ({sent})"
        wait_until(lambda: jobs_by_id(engine)[f"job-{i}"]["state"] == "settled", timeout=10, what=f"job-{i} to settle")
    slow = {j: round(d, 3) for j, d in delays.items() if d >= PROMPT}
    assert not slow, f"jobs not started at once after the takeover (poll {POLL}s): {slow}\n{workers.logs()}"

    job_ids = list(delays)
    assert_settled_exactly_once(engine, job_ids)
    runs = audit_rows(engine)
    assert sorted(r["job_id"] for r in runs) == sorted(job_ids), "a job ran twice, or not at all"
    assert {r["pid"] for r in runs} == {covered.pid}
    assert covered.alive, covered.log_text()[-3000:]
    assert "Traceback" not in covered.log_text()


def test_a_job_enqueued_after_the_waiting_worker_was_killed_without_a_notification_starts_at_the_takeover(
    instrumented: Engine, db_url: URL, workers: WorkerPool, notifications: Notifications, runner_kind: str
) -> None:
    """SIGKILL the sentinel's process, then enqueue in a transaction held
    open past the covered worker's next try: the enqueue finds nobody
    waiting (it takes the lock shared and does not notify), so the covered
    worker cannot take over while it is open and tries again every
    ``Waiting.RETRY_S``. Once it commits, the covered worker takes the lock
    and its last look starts the job at once -- not at the next poll."""
    engine = instrumented
    pair = start_pair(db_url, workers, runner_kind)
    sentinel, covered = sentinel_and_covered(engine, pair, workers)

    sentinel.kill()
    killed = time.monotonic()
    wait_until(lambda: sessions_of(engine, sentinel.name) == 0, timeout=10, what="the dead worker's sessions to end")
    with engine.connect() as producer:
        with producer.begin():
            enqueue(producer, Job("gap", "chaos"))
            assert holds_shared_waiting_lock(producer), "the covered worker took over before the enqueue"
            time.sleep(max(0.0, killed + POLL + MARGIN - time.monotonic()))
            # Past its next try, the covered worker is kept from waiting, and tries again and again.
            assert lock_holders(engine) == []
            age = last_try_age(engine, covered.name)
            assert age is not None and age < 0.5, f"the covered worker last tried to wait {age}s ago\n{workers.logs()}"
            notifications.drain()
        committed_ms = store.now_ms()
    (run,) = wait_until(lambda: audit_rows(engine, "gap"), timeout=POLL + 10, what="gap to start")
    delay = (run["called_ms"] - committed_ms) / 1000
    assert delay < PROMPT, f"gap started {delay:.2f}s after its commit (poll {POLL}s)\n{workers.logs()}"
    assert EVENT_QUEUED not in notifications.received(within=0.5), "the enqueue notified"
    wait_until(lambda: jobs_by_id(engine)["gap"]["state"] == "settled", timeout=10, what="gap to settle")

    wait_until(lambda: lock_holders(engine) == [covered.name], timeout=10, what=f"{covered.name} to wait again")
    delay, sent = enqueue_and_time(engine, notifications, "next")
    assert EVENT_QUEUED in sent, f"the enqueue after the takeover did not notify ({sent})"
    assert delay < PROMPT, f"next started {delay:.2f}s after its commit (poll {POLL}s)"
    wait_until(lambda: jobs_by_id(engine)["next"]["state"] == "settled", timeout=10, what="next to settle")
    assert_settled_exactly_once(engine, ["gap", "next"])
    runs = audit_rows(engine)
    assert sorted(r["job_id"] for r in runs) == ["gap", "next"], "a job ran twice, or not at all"
    assert {r["pid"] for r in runs} == {covered.pid}


def test_a_frozen_waiting_worker_keeps_the_lock_and_its_enqueues_still_wake_the_covered_one(
    instrumented: Engine, db_url: URL, workers: WorkerPool, notifications: Notifications, runner_kind: str
) -> None:
    """SIGSTOP the sentinel's process: its session and its lock stay, so
    enqueues keep notifying, and the notification reaches the covered worker
    too, which starts each job at once. After SIGCONT nothing runs twice."""
    engine = instrumented
    pair = start_pair(db_url, workers, runner_kind)
    sentinel, covered = sentinel_and_covered(engine, pair, workers)

    sentinel.send(signal.SIGSTOP)
    try:
        delays = {}
        for i in range(JOBS):
            delays[f"job-{i}"], sent = enqueue_and_time(engine, notifications, f"job-{i}")
            assert EVENT_QUEUED in sent, f"job-{i}: the enqueue did not notify ({sent})"
            wait_until(
                lambda: jobs_by_id(engine)[f"job-{i}"]["state"] == "settled", timeout=10, what=f"job-{i} to settle"
            )
            assert lock_holders(engine) == [sentinel.name], "the frozen worker's session lost the lock"
            time.sleep(0.3)  # the covered worker is idle again, its loop waiting for a wake-up
        # Its try every poll interval still finds the frozen sentinel: covered, it never took over.
        time.sleep(POLL + 0.2)
        assert lock_holders(engine) == [sentinel.name]
    finally:
        sentinel.send(signal.SIGCONT)
    slow = {j: round(d, 3) for j, d in delays.items() if d >= PROMPT}
    assert not slow, f"jobs not started at once while the sentinel was frozen (poll {POLL}s): {slow}\n{workers.logs()}"
    runs = audit_rows(engine)
    assert {r["pid"] for r in runs} == {covered.pid}, "the frozen worker ran a job"

    # Thawed, it reads the notifications it slept through and finds nothing left to run.
    delay, sent = enqueue_and_time(engine, notifications, "after")
    assert EVENT_QUEUED in sent
    assert delay < PROMPT, f"after SIGCONT the job started {delay:.2f}s after its enqueue"
    job_ids = [*delays, "after"]
    wait_until(lambda: jobs_by_id(engine)["after"]["state"] == "settled", timeout=10, what="after to settle")
    time.sleep(0.5)  # a late second run, if there were one, would show here
    assert_settled_exactly_once(engine, job_ids)
    assert sorted(r["job_id"] for r in audit_rows(engine)) == sorted(job_ids), "a job ran twice, or not at all"
    assert sentinel.alive and covered.alive
    for worker in (sentinel, covered):
        assert "Traceback" not in worker.log_text(), worker.log_text()[-3000:]
