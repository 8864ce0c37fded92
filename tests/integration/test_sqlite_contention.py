"""SQLite under another process's writes: the runner is a fair contender.

On SQLite one connection writes at a time. An application's web processes
hold the write lock for a moment on every request; the runner must then wait
for the lock like they do (``BEGIN IMMEDIATE`` under the driver's busy
timeout) and get it right after it is released -- not fail, back off and
fall behind. In WAL mode it must not queue for the lock when it only looks (an
idle poll, the recovery pass's reads).

The other writer is a real process holding ``BEGIN IMMEDIATE`` with an
uncommitted row, in both journal modes: the rollback journal (SQLite's
default) and WAL.
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine

from sqlalchemy_watchdog import Job, JobState, Outcome, Runner, Watchdog, metadata, store
from sqlalchemy_watchdog.records import TickStatus

QUEUE = "orders"

HOLDER = r"""
import sqlite3, sys, time
path, hold = sys.argv[1], float(sys.argv[2])
conn = sqlite3.connect(path, isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO app_orders (note) VALUES ('held')")
print("LOCKED", flush=True)
time.sleep(hold)
conn.execute("COMMIT")
print("RELEASED", time.time(), flush=True)
"""


def _sqlite_file(tmp_path: Path, journal_mode: str) -> Engine:
    """A SQLite file in ``journal_mode``, with ``watchdog_jobs`` and an
    application table; the engine as a user builds it (driver defaults)."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA journal_mode={journal_mode}")
    conn.execute("CREATE TABLE app_orders (id INTEGER PRIMARY KEY, note TEXT)")
    conn.close()
    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine)
    return engine


@pytest.fixture(params=["delete", "wal"])
def sqlite_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """Both journal modes: the rollback journal (SQLite's default) and WAL."""
    engine = _sqlite_file(tmp_path, request.param)
    yield engine
    engine.dispose()


@pytest.fixture
def wal_engine(tmp_path: Path) -> Iterator[Engine]:
    """WAL, where readers never wait for the writer. (With a rollback journal
    a reader's shared lock would stall a committing writer instead, so there
    the store's reads serialise with the writers on purpose.)"""
    engine = _sqlite_file(tmp_path, "wal")
    yield engine
    engine.dispose()


class LockHolder:
    """Another process holding the write lock for ``hold`` seconds."""

    def __init__(self, engine: Engine, hold: float) -> None:
        database = engine.url.database
        assert database is not None
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, database, str(hold)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "LOCKED", line
        self.locked_at = time.monotonic()

    def released_at(self) -> float:
        """Wall-clock time the holder committed (waits for it)."""
        assert self.proc.stdout is not None
        words = self.proc.stdout.readline().split()
        self.proc.wait(30)
        assert words and words[0] == "RELEASED", words
        return float(words[1])


def held_lock(engine: Engine, hold: float) -> LockHolder:
    return LockHolder(engine, hold)


def test_a_300ms_write_lock_delays_the_runner_only_until_it_is_released(
    sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    Watchdog(sqlite_engine).enqueue(Job("order-1", QUEUE))
    started: list[float] = []
    runner = Runner(sqlite_engine, {QUEUE: lambda job: started.append(time.time())})
    caplog.set_level(logging.DEBUG, logger="sqlalchemy_watchdog.store")

    holder = held_lock(sqlite_engine, 0.3)
    result = runner.tick()
    finished = time.monotonic()
    released = holder.released_at()

    assert result.status is TickStatus.SETTLED
    assert result.job is not None and result.job.outcome is Outcome.COMPLETED
    # It waited for the lock (the claim cannot precede the release) ...
    assert started and started[0] >= released
    # ... and got it right after: SQLite's busy handler retries every <= 100 ms,
    # far from a back-off of seconds (generous bound for a shared machine).
    assert started[0] - released < 0.5
    assert finished - holder.locked_at < 1.5
    # No attempt failed with "database is locked" and was retried.
    assert not [r for r in caplog.records if "transient failure" in r.getMessage()]


def test_an_idle_runner_in_wal_mode_does_not_wait_for_another_process_write_lock(wal_engine: Engine) -> None:
    runner = Runner(wal_engine, {QUEUE: lambda job: None})
    holder = held_lock(wal_engine, 1.0)
    began = time.monotonic()
    result = runner.tick()  # the recovery pass's reads, then a claim of an empty queue
    took = time.monotonic() - began
    holder.released_at()

    assert result.status is TickStatus.IDLE
    assert took < 0.5, f"an idle tick waited {took:.2f}s for a write lock it does not need"


@pytest.mark.parametrize(
    "fn, args, kwargs",
    [
        (store.expired_claims, (), {"limit": 16}),
        (store.seconds_until_next_expiry, (), {}),
        (store.read, ("order-1",), {}),
        (store.read_queue_head, (QUEUE,), {}),
        (store.has_pending_work, (), {}),
        (store.claim, (), {"queues": ["elsewhere"], "lease_ms": 60_000}),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_store_reads_in_a_write_transaction_do_not_queue_for_the_lock_in_wal_mode(
    wal_engine: Engine, fn: object, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    """The runners call every store function in a write transaction; the pure
    reads (and a claim with nothing to take) must still not take the lock."""
    Watchdog(wal_engine).enqueue(Job("order-1", QUEUE))
    holder = held_lock(wal_engine, 1.0)
    began = time.monotonic()
    with wal_engine.connect() as conn:
        store.transact(conn, fn, *args, **kwargs)  # type: ignore[arg-type]
    took = time.monotonic() - began
    holder.released_at()
    assert took < 0.5, f"{getattr(fn, '__name__', fn)} waited {took:.2f}s for the write lock"


def test_a_claim_with_work_still_takes_the_lock_and_claims_exactly_once(sqlite_engine: Engine) -> None:
    """The look without the lock never claims by itself: two claimers racing
    for one job behind a held lock get it once between them."""
    Watchdog(sqlite_engine).enqueue(Job("order-1", QUEUE))
    batches: list[store.ClaimBatch] = []

    def claim() -> None:
        with sqlite_engine.connect() as conn:
            batches.append(store.transact(conn, store.claim, queues=[QUEUE], lease_ms=60_000))

    holder = held_lock(sqlite_engine, 0.3)
    threads = [threading.Thread(target=claim) for _ in range(2)]
    for thread in threads:
        thread.start()  # both look, see the job, and wait for the lock
    for thread in threads:
        thread.join(10)
    holder.released_at()
    assert len(batches) == 2
    claimed = [c.job.job_id for batch in batches for c in batch.claimed]
    assert claimed == ["order-1"]
    job = Watchdog(sqlite_engine).read("order-1")
    assert job is not None and job.state is JobState.RUNNING
