"""Small helpers shared by the test modules: put jobs in, read them back, wait."""

from __future__ import annotations

import re
import select as io_select
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from sqlalchemy import Engine, inspect, select, text

from sqlalchemy_watchdog import Job, JobState, JobView, Watchdog, enqueue
from sqlalchemy_watchdog.model import jobs_table

T = TypeVar("T")


def add(engine: Engine, *jobs: Job) -> None:
    """Enqueue ``jobs`` in one committed transaction."""
    with engine.begin() as conn:
        enqueue(conn, list(jobs))


def read(engine: Engine, job_id: str) -> JobView:
    """The job, which must exist."""
    job = Watchdog(engine).read(job_id)
    assert job is not None, job_id
    return job


def raw(engine: Engine, job_id: str) -> dict[str, Any]:
    """The job's row, every column (claim token and lease included)."""
    with engine.connect() as conn:
        return dict(conn.execute(select(jobs_table).where(jobs_table.c.job_id == job_id)).one()._mapping)


def wait_until(
    predicate: Callable[[], T | Literal[False] | None],
    timeout: float = 20.0,
    what: str = "condition",
    interval: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds.

    Its type is that of the truthy value: a predicate ``x is not None and x``
    or one returning ``X | None`` gives an ``X``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def settled(engine: Engine, job_id: str, timeout: float = 20.0) -> JobView:
    """Wait until the job is settled; return it."""
    return wait_until(
        lambda: (job := read(engine, job_id)).state is JobState.SETTLED and job, timeout, f"{job_id} to settle"
    )


def check_names(engine: Engine, table: str = "watchdog_jobs") -> set[str]:
    """The names of the CHECKs ``table``'s rows must meet: its own, and on
    PostgreSQL those of its columns' domains (revision w0016)."""
    names = {c["name"] for c in inspect(engine).get_check_constraints(table)}
    if engine.dialect.name == "postgresql":
        query = (
            "SELECT c.conname FROM pg_attribute a JOIN pg_constraint c ON c.contypid = a.atttypid"
            " WHERE a.attrelid = CAST(:t AS regclass) AND a.attnum > 0 AND NOT a.attisdropped AND c.contype = 'c'"
        )
        with engine.connect() as conn:
            names |= set(conn.execute(text(query), {"t": table}).scalars())
    return {str(name) for name in names}


def index_names(engine: Engine, table: str = "watchdog_jobs") -> set[str]:
    """The names of ``table``'s indexes as the database's catalog lists them
    (the inspector skips expression indexes on SQLite), those backing a
    primary key or unique constraint left out."""
    if engine.dialect.name == "sqlite":
        query = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = :t AND sql IS NOT NULL"
    elif engine.dialect.name in ("mysql", "mariadb"):
        # A unique index is the unique constraint itself there.
        query = (
            "SELECT DISTINCT index_name FROM information_schema.statistics"
            " WHERE table_schema = DATABASE() AND table_name = :t AND non_unique = 1"
        )
    else:
        query = (
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " JOIN pg_class t ON t.oid = x.indrelid WHERE t.relname = :t"
            " AND t.relnamespace = current_schema()::regnamespace"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)"
        )
    with engine.connect() as conn:
        return set(conn.execute(text(query), {"t": table}).scalars())


def waiting_lock_holders(engine: Engine) -> list[int]:
    """PostgreSQL: the backend pids holding the waiting lock exclusively --
    the one runner's listener that waits for NOTIFY (the sentinel), or none."""
    from sqlalchemy_watchdog.wakeups import WAITING_LOCK

    with engine.connect() as conn:
        return [
            int(pid)
            for pid in conn.execute(
                text(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
                    " AND classid = :classid AND objid = :objid AND mode = 'ExclusiveLock' AND granted"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ),
                {"classid": WAITING_LOCK[0], "objid": WAITING_LOCK[1]},
            ).scalars()
        ]


def waiting_sessions(engine: Engine) -> int:
    """PostgreSQL: how many sessions hold the waiting lock exclusively -- 1
    while a runner waits for NOTIFY (the sentinel), else 0."""
    return len(waiting_lock_holders(engine))


def listening_sessions(engine: Engine) -> int:
    """PostgreSQL: how many runners' listeners are connected -- sessions whose
    last statement was their LISTEN or one of the waiting lock's statements."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND (query ILIKE 'LISTEN %' OR query LIKE '%pg_try_advisory_lock(%'"
                    " OR query LIKE '%pg_advisory_unlock_all()%') AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


class Notifications:
    """A session LISTENing on the runners' channel, as a runner's listener does
    (PostgreSQL): what the trigger and the runners send, as a test sees it."""

    def __init__(self, engine: Engine) -> None:
        from sqlalchemy_watchdog.wakeups import CHANNEL

        self._raw = engine.raw_connection()
        driver = self._raw.driver_connection
        assert driver is not None
        self.conn: Any = driver
        self.conn.autocommit = True
        self.conn.execute(f"LISTEN {CHANNEL}")

    def drain(self) -> list[str]:
        """The payloads that arrived so far."""
        return [n.payload for n in self.conn.notifies(timeout=0)]

    def received(self, within: float) -> list[str]:
        """The payloads that arrived, waiting up to ``within`` seconds for the
        first (PostgreSQL delivers one per transaction and payload)."""
        payloads = self.drain()
        deadline = time.monotonic() + within
        while not payloads and (left := deadline - time.monotonic()) > 0:
            io_select.select([self.conn.fileno()], [], [], left)
            payloads += self.drain()
        return payloads

    def close(self) -> None:
        self._raw.close()


def present(value: T | None) -> T:
    """``value``, which must not be None (a read of a job, a queue's pause, ...)."""
    assert value is not None
    return value


def stable_repr(value: object) -> str:
    """``repr(value)`` without a memory address (``<X object at 0x...>``), so a
    test id is the same in every process (pytest-xdist's workers compare them)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


#: The package's newest revision: what `upgrade` reaches (one place for the
#: tests that name it; the migrations' own test checks the chain).
HEAD_REVISION = "w0023_long_text"
