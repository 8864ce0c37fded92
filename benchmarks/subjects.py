"""sqlalchemy_watchdog as a benchmark subject, on PostgreSQL and on SQLite.

Every subject (this one and ``peers/*.py``) offers the same operations, so
``run.py`` can put the same workload through each:

* ``install(target)`` / ``reset(target)``: create the schema with the
  queue's own API; empty it between measurements.
* ``enqueue_single(target, n, tag)`` -> seconds for ``n`` jobs, each in a
  transaction of its own, committed.
* ``enqueue_batch(target, batches, size, tag)`` -> seconds for ``batches``
  transactions of ``size`` jobs each, each batch one call (one statement).
* ``prefill(target, n, tag)``: ``n`` jobs in one transaction; returns
  ``time.perf_counter()`` right after its commit.
* ``probe(target)``: a database connection answering ``live()`` (any job not
  yet settled?) and ``completed()`` (how many jobs ended successfully).
* ``latency_client(target)``: ``.enqueue(key)`` one job in its own
  transaction, returns ``time.time()`` after the commit; ``.close()``.
* ``worker_main(target, concurrency, defaults, latency)``: the body of a worker
  subprocess. Prints ``READY`` once set up; with ``latency`` its handler
  prints ``START <key> <time.time()>``. Stops on SIGTERM.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from datetime import timedelta
from typing import Any

from harness import Target, truncate_public_tables

QUEUE = "bench"


def _engine(target: Target, pool_size: int = 5) -> Any:
    from sqlalchemy import create_engine

    if target.dialect == "sqlite":
        return create_engine(target.sqlalchemy_url, pool_size=pool_size, max_overflow=10)
    return create_engine(target.sqlalchemy_url, pool_size=pool_size, max_overflow=10)


class _Probe:
    def __init__(self, target: Target, live_sql: str, completed_sql: str) -> None:
        self.live_sql = live_sql
        self.completed_sql = completed_sql
        if target.dialect == "sqlite":
            self.conn: Any = sqlite3.connect(target.dsn, isolation_level=None, timeout=30)
        else:
            import psycopg

            self.conn = psycopg.connect(target.dsn, autocommit=True)

    def live(self) -> bool:
        return bool(self.conn.execute(self.live_sql).fetchone()[0])

    def completed(self) -> int:
        return int(self.conn.execute(self.completed_sql).fetchone()[0])

    def close(self) -> None:
        self.conn.close()


_Job: Any = None


class Watchdog:
    name = "watchdog"
    dialects = ("postgresql", "sqlite")

    # -- schema ---------------------------------------------------------------------

    def install(self, target: Target) -> None:
        from sqlalchemy_watchdog import metadata

        engine = _engine(target)
        metadata.create_all(engine)
        engine.dispose()

    def reset(self, target: Target) -> None:
        if target.dialect == "postgresql":
            truncate_public_tables(target)
            return
        conn = sqlite3.connect(target.dsn, isolation_level=None, timeout=30)
        try:
            conn.execute("DELETE FROM watchdog_jobs")
            conn.execute("DELETE FROM sqlite_sequence WHERE name = 'watchdog_jobs'")
        finally:
            conn.close()

    # -- enqueue --------------------------------------------------------------------

    @staticmethod
    def _job(job_id: str, i: int) -> Any:
        # Imported once (the first call), not per job: an import statement in a
        # function run 10,000 times costs the timed loop ~0.4 us a job -- the
        # benchmark's cost, not the library's.
        global _Job
        if _Job is None:
            from sqlalchemy_watchdog import Job as _Job
        return _Job(job_id, QUEUE, payload={"i": i})

    def enqueue_single(self, target: Target, n: int, tag: str) -> float:
        """One job per transaction of its own: ``Watchdog.enqueue``, the
        equivalent of the peers' stand-alone enqueue calls."""
        from sqlalchemy_watchdog import Watchdog as Client

        engine = _engine(target)
        try:
            client = Client(engine)
            client.enqueue(self._job(f"{tag}-warm", -1))
            started = time.perf_counter()
            for i in range(n):
                client.enqueue(self._job(f"{tag}-{i}", i))
            return time.perf_counter() - started
        finally:
            engine.dispose()

    def enqueue_single_in_session(self, target: Target, n: int, tag: str) -> float:
        """One job in the caller's own Session transaction, committed with it:
        what an application enqueueing beside its ORM writes pays."""
        from sqlalchemy.orm import Session

        from sqlalchemy_watchdog import enqueue

        engine = _engine(target)
        try:
            # Warm the pool (one connection), as a long-lived application would be.
            with Session(engine) as session:
                enqueue(session, self._job(f"{tag}-warm", -1))
                session.commit()
            started = time.perf_counter()
            for i in range(n):
                with Session(engine) as session:
                    enqueue(session, self._job(f"{tag}-{i}", i))
                    session.commit()
            return time.perf_counter() - started
        finally:
            engine.dispose()

    def enqueue_batch(self, target: Target, batches: int, size: int, tag: str) -> float:
        from sqlalchemy.orm import Session

        from sqlalchemy_watchdog import enqueue

        engine = _engine(target)
        try:
            with Session(engine) as session:
                enqueue(session, self._job(f"{tag}-warm", -1))
                session.commit()
            # Jobs are built (and validated) inside the timed part: that is the
            # cost a caller pays, as with the peers' APIs.
            started = time.perf_counter()
            for b in range(batches):
                with Session(engine) as session:
                    enqueue(session, [self._job(f"{tag}-{b}-{i}", i) for i in range(size)])
                    session.commit()
            return time.perf_counter() - started
        finally:
            engine.dispose()

    def prefill(self, target: Target, n: int, tag: str) -> float:
        from sqlalchemy.orm import Session

        from sqlalchemy_watchdog import enqueue

        engine = _engine(target)
        try:
            jobs = [self._job(f"{tag}-{i}", i) for i in range(n)]
            with Session(engine) as session:
                enqueue(session, jobs)
                session.commit()
                committed = time.perf_counter()
            return committed
        finally:
            engine.dispose()

    # -- observing ------------------------------------------------------------------

    def probe(self, target: Target) -> _Probe:
        return _Probe(
            target,
            "SELECT EXISTS (SELECT 1 FROM watchdog_jobs WHERE state IN ('queued', 'running'))",
            "SELECT count(*) FROM watchdog_jobs WHERE state = 'settled' AND outcome = 'completed'",
        )

    def latency_client(self, target: Target) -> Any:
        return _LatencyClient(target)

    # -- the worker process ---------------------------------------------------------

    def worker_main(
        self, target: Target, concurrency: int, defaults: bool, latency: bool, use_asyncio: bool = False
    ) -> None:
        import logging

        from sqlalchemy import text

        from sqlalchemy_watchdog import Runner

        logging.basicConfig(level=logging.WARNING)
        if os.environ.get("WATCHDOG_BENCH_COUNT_SQL"):
            _count_statements_at_exit()
        if use_asyncio:
            self._async_worker_main(target, concurrency)
            return

        if latency:

            def handler(job: Any) -> None:
                print(f"START {job.job_id} {time.time():.6f}", flush=True)

        else:

            def handler(job: Any) -> None:
                return None

        if defaults:
            # Runner(engine, handlers) and create_engine(url): nothing tuned.
            from sqlalchemy import create_engine

            engine = create_engine(target.sqlalchemy_url)
            runner = Runner(engine, {QUEUE: handler})
        else:
            # One pooled connection per handler thread, plus the loop's and the heartbeat's.
            engine = _engine(target, pool_size=concurrency + 3)
            runner = Runner(engine, {QUEUE: handler}, concurrency=concurrency)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        print("READY", flush=True)
        runner.run_forever()
        engine.dispose()

    @staticmethod
    def _async_worker_main(target: Target, concurrency: int) -> None:
        """``AsyncRunner`` with a no-op coroutine handler over an ``AsyncEngine``
        (``postgresql+psycopg`` in async mode), default pool."""
        import asyncio

        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine

        from sqlalchemy_watchdog.asyncio import AsyncRunner

        async def handler(job: Any) -> None:
            return None

        async def main() -> None:
            engine = create_async_engine(target.sqlalchemy_url)
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            print("READY", flush=True)
            try:
                await AsyncRunner(engine, {QUEUE: handler}, concurrency=concurrency).run_forever()
            finally:
                await engine.dispose()

        asyncio.run(main())


def _count_statements_at_exit() -> None:
    """Count every statement this process sends (by its first words) and print the
    counts to stderr at exit: round trips per job for benchmarks/profile_drain.py."""
    import atexit
    import collections
    import re

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    counts: collections.Counter[str] = collections.Counter()

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        words = re.sub(r"\s+", " ", statement.strip())[:60]
        counts[words] += 1

    event.listen(Engine, "before_cursor_execute", count)

    def report() -> None:
        for words, n in counts.most_common():
            print(f"SQLCOUNT {n} {words}", file=sys.stderr, flush=True)

    atexit.register(report)


class _LatencyClient:
    def __init__(self, target: Target) -> None:
        self.engine = _engine(target)

    def enqueue(self, key: str) -> float:
        from sqlalchemy.orm import Session

        from sqlalchemy_watchdog import Job, enqueue

        with Session(self.engine) as session:
            enqueue(session, Job(key, QUEUE, payload={"k": key}))
            session.commit()
        return time.time()

    def close(self) -> None:
        self.engine.dispose()


# -- claim cost against a long settled history (watchdog only) ------------------------


def insert_history(target: Target, rows: int) -> float:
    """``rows`` settled jobs in one statement, then ANALYZE; returns seconds taken."""
    started = time.perf_counter()
    columns = (
        "job_id, queue_name, lane, priority, payload_json, recovery_max, state, outcome, claim_token, recovery_count"
    )
    if target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.dsn, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO watchdog_jobs ({columns})"
                " SELECT 'history-' || g, %(queue)s, %(queue)s, 0, '{\"i\":' || g || '}', NULL,"
                " 'settled', 'completed', 'claim_history_' || g, 0"
                " FROM generate_series(1, %(rows)s) AS g",
                {"queue": QUEUE, "rows": rows},
            )
            # What autovacuum would have done to a table that grew this big over time.
            conn.execute("VACUUM (ANALYZE) watchdog_jobs")
    else:
        lite = sqlite3.connect(target.dsn, isolation_level=None, timeout=30)
        try:
            lite.execute("BEGIN")
            lite.execute(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?)"
                f" INSERT INTO watchdog_jobs ({columns})"
                " SELECT 'history-' || n, ?, ?, 0, '{\"i\":' || n || '}', NULL,"
                " 'settled', 'completed', 'claim_history_' || n, 0 FROM g",
                (rows, QUEUE, QUEUE),
            )
            lite.execute("COMMIT")
            lite.execute("ANALYZE")
        finally:
            lite.close()
    return time.perf_counter() - started


def claim_settle(target: Target, jobs: int, tag: str) -> float:
    """Enqueue ``jobs`` no-op jobs, then time ``Runner.run_until_idle()`` claiming
    and settling them one by one (one tick per job); returns seconds."""
    from sqlalchemy import text

    from sqlalchemy_watchdog import Runner

    engine = _engine(target)
    try:
        Watchdog().enqueue_batch(target, 1, jobs, tag)  # plus one warm-up job
        runner = Runner(engine, {QUEUE: lambda job: None}, poll_interval=timedelta(seconds=1))
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        started = time.perf_counter()
        settled = runner.run_until_idle()
        elapsed = time.perf_counter() - started
        if len(settled) != jobs + 1:
            from harness import ScenarioFailed

            raise ScenarioFailed(f"claim cost: settled {len(settled)} of {jobs + 1} jobs")
        return elapsed
    finally:
        engine.dispose()


SUBJECT = Watchdog()
