"""Where one enqueued job's time goes (README.md, "The one-job enqueue: where its time goes"):
the round trips alone, a plain row, the library's own ``INSERT`` sent by raw psycopg, and the
library's calls, each in microseconds a job; and the server's execution of the ``INSERT`` beside a
plain row's, read from ``EXPLAIN ANALYZE``."""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
from sqlalchemy import Integer, String, event
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from benchmarks import harness as h
from sqlalchemy_watchdog import Job, Watchdog, enqueue


class _Base(DeclarativeBase):
    pass


class _Row(_Base):  # an application's own narrow row, no queue
    __tablename__ = "bench_profile_rows"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    data: Mapped[str] = mapped_column(String(200))


PLAIN_INSERT = "INSERT INTO bench_profile_rows (name, data) VALUES (%s, %s)"


def _library_insert(eng: Any) -> tuple[str, Callable[[str], dict[str, Any]]]:
    """The ``INSERT`` ``Watchdog.enqueue`` sends for one job, and its parameters for a job id."""
    seen: dict[str, Any] = {}

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if statement.startswith("INSERT INTO watchdog_jobs"):
            seen["sql"], seen["parameters"] = statement, parameters

    event.listen(eng, "before_cursor_execute", capture)
    try:
        Watchdog(eng).enqueue(Job(f"profile-{uuid.uuid4()}", h.QUEUE, payload={"k": 1}))
    finally:
        event.remove(eng, "before_cursor_execute", capture)
    parameters: dict[str, Any] = seen["parameters"]

    def bound(job_id: str) -> dict[str, Any]:
        return {**parameters, "job_job_id": job_id}  # the one-job form: a parameter per field

    return seen["sql"], bound


def _per_job(target: h.Target, n: int, case: str) -> float:
    """Microseconds a job of ``n`` one-job transactions of ``case``, on emptied tables, warmed."""
    h.truncate(target)
    tag = uuid.uuid4().hex[:8]
    with h.disposed(h.engine(target)) as eng:
        _Base.metadata.create_all(eng)
        sql, bound = _library_insert(eng)
        client = Watchdog(eng)
        with psycopg.connect(target.dsn, autocommit=case != "raw BEGIN + plain INSERT + COMMIT") as conn:

            def one(i: int) -> None:
                key = f"{tag}-{i}"
                if case == "SELECT 1 (one round trip)":
                    conn.execute("SELECT 1", prepare=True)
                elif case == "raw plain INSERT, autocommit":
                    conn.execute(PLAIN_INSERT, (key, "{}"), prepare=True)
                elif case == "raw BEGIN + plain INSERT + COMMIT":
                    conn.execute(PLAIN_INSERT, (key, "{}"), prepare=True)
                    conn.commit()
                elif case == "raw library INSERT, autocommit":
                    conn.execute(sql, bound(key), prepare=True)
                elif case == "session.add(row) + commit":
                    with Session(eng) as session:
                        session.add(_Row(name=key, data="{}"))
                        session.commit()
                elif case == "enqueue(session, job) + commit":
                    with Session(eng) as session:
                        enqueue(session, Job(key, h.QUEUE, payload={"k": i}))
                        session.commit()
                else:
                    client.enqueue(Job(key, h.QUEUE, payload={"k": i}))

            for i in range(10):  # warm the pool, the statement caches and the prepared statements
                one(-1 - i)
            started = time.perf_counter()
            for i in range(n):
                one(i)
            return (time.perf_counter() - started) / n * 1e6


def _execution(target: h.Target, samples: int) -> dict[str, float]:
    """Median server execution time (us) of the library's one-job ``INSERT`` and of a plain row's,
    each ``EXPLAIN (ANALYZE)``'d in a transaction of its own and rolled back (no commit counted)."""
    h.truncate(target)
    with h.disposed(h.engine(target)) as eng:
        _Base.metadata.create_all(eng)
        sql, bound = _library_insert(eng)
    times: dict[str, list[float]] = {"library INSERT": [], "plain INSERT": []}
    with psycopg.connect(target.dsn) as conn:
        for i in range(samples):
            for name in times:
                query, parameters = (sql, bound(f"x-{i}")) if name == "library INSERT" else (PLAIN_INSERT, ("e", "{}"))
                plan = conn.execute("EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) " + query, parameters).fetchall()
                conn.rollback()
                line = next(row[0] for row in plan if row[0].startswith("Execution Time"))
                times[name].append(float(line.split()[2]) * 1000)
    return {f"{name}: server execution p50 (us)": statistics.median(values) for name, values in times.items()}


CASES = (
    "SELECT 1 (one round trip)",
    "raw plain INSERT, autocommit",
    "raw BEGIN + plain INSERT + COMMIT",
    "raw library INSERT, autocommit",
    "session.add(row) + commit",
    "enqueue(session, job) + commit",
    "Watchdog(engine).enqueue(job)",
)


@h.scenario("enqueue-profile", per_repeat=True, options="jobs samples")
def enqueue_profile(bench: h.Bench, r: int) -> None:
    """Microseconds of one enqueued job by layer: round trips, raw psycopg, the library's INSERT, a Session."""
    target = bench.target("watchdog", "postgresql")
    n, samples = bench.opt("jobs", 2000, 30), bench.opt("samples", 50, 5)
    table = "one job enqueued, PostgreSQL (us a job, lower is better)"
    bench.table(table)
    for case in h.rotate(CASES, r):
        bench.measure(table, case, "watchdog", partial(_per_job, target, n, case))
    bench.measure(table, "EXPLAIN ANALYZE", "watchdog", partial(_execution, target, samples))
