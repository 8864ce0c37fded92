"""Fault 5: the database goes away under a running worker.

A PostgreSQL of the test's own (see :mod:`tests.faults.private_postgres`) is
crash-restarted with ``pg_ctl restart -m immediate`` mid-run, and, separately,
the worker's backends are killed with ``pg_terminate_backend``. The worker
must log, reconnect and go on -- no crash loop, a bounded number of
connections in ``pg_stat_activity`` throughout, and every job settled
exactly once. Each case runs with a ``Runner`` worker and with an
``AsyncRunner`` worker (fewer jobs: the async run proves the same
recovery paths, not a longer soak).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from sqlalchemy_watchdog import Job, metadata
from sqlalchemy_watchdog.model import jobs_table
from tests.faults.helpers import (
    Worker,
    WorkerPool,
    assert_settled_exactly_once,
    enqueue_jobs,
    install_instrumentation,
    wait_until,
)
from tests.faults.private_postgres import PrivatePostgres, find_bindir

pytestmark = pytest.mark.slow

JOBS = {"sync": 150, "async": 80}
CONCURRENCY = 2
# SQLAlchemy's default QueuePool (5 + 10 overflow) plus the LISTEN connection
# (detached from the pool).
MAX_CONNECTIONS = 5 + 10 + 1
# Once idle: the pool keeps up to 5 connections checked in; the runner's loop,
# settler and heartbeat each hold one checked out; plus LISTEN. (It was 5 + 1,
# which failed about one run in six: after a restart the retries check out
# more connections at once than the handlers alone, and the pool keeps up to
# 5 of them beside the 3 held ones -- seen as 3 held + 3 pooled + LISTEN.)
IDLE_CONNECTIONS = 5 + 3 + 1


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    server = PrivatePostgres(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def database(private_pg: PrivatePostgres) -> Iterator[tuple[PrivatePostgres, str, Engine]]:
    """A fresh database on the private server, and a NullPool engine on it
    (the test's own reads must not depend on pooled connections that a
    restart kills)."""
    name = f"faults_{uuid.uuid4().hex[:10]}"
    admin = create_engine(private_pg.url(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(private_pg.url(name), poolclass=NullPool)
    metadata.create_all(engine)
    install_instrumentation(engine)
    try:
        yield private_pg, name, engine
    finally:
        engine.dispose()
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        finally:
            admin.dispose()


class ConnectionSampler:
    """Counts the worker's backends in pg_stat_activity every 100 ms."""

    def __init__(self, server: PrivatePostgres, application_name: str) -> None:
        self.engine = create_engine(server.url(), poolclass=NullPool)
        self.application_name = application_name
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int | None:
        try:
            with self.engine.connect() as conn:
                return int(
                    conn.execute(
                        text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"),
                        {"a": self.application_name},
                    ).scalar_one()
                )
        except DBAPIError:
            return None  # the server is restarting

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            n = self.count()
            if n is not None:
                self.samples.append(n)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.dispose()


def _settled(engine: Engine) -> int:
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(jobs_table).where(jobs_table.c.state == "settled")
                ).scalar_one()
            )
    except DBAPIError:
        return -1


def _start_run(
    server: PrivatePostgres, name: str, engine: Engine, workers: WorkerPool, app: str, runner_kind: str
) -> tuple[Worker, list[str]]:
    ids = [f"job-{i:04d}" for i in range(JOBS[runner_kind])]
    enqueue_jobs(
        engine,
        [Job(j, "chaos", payload={"action": "sleep", "seconds": 0.02}, max_recoveries=5) for j in ids],
    )
    worker = workers.start(
        server.url(name, application_name=app),
        app,
        concurrency=CONCURRENCY,
        lease=3,
        heartbeat=0.5,
        poll=0.2,
        asyncio=runner_kind == "async",
    )
    return worker, ids


def _finish_and_check(engine: Engine, worker: Worker, ids: list[str], sampler: ConnectionSampler) -> None:
    wait_until(lambda: _settled(engine) == len(ids), timeout=180, what="every job to settle", interval=0.2)
    rows = assert_settled_exactly_once(engine, ids)
    outcomes = {r["outcome"] for r in rows.values()}
    assert outcomes == {"completed"}, outcomes
    assert worker.alive, worker.log_text()[-3000:]

    # Quiet once the database is back: no crash loop.
    settled_log = worker.log_text()
    time.sleep(3)
    later = worker.log_text()[len(settled_log) :]
    assert not re.search(r" (ERROR|CRITICAL) ", later), later
    failures = len(re.findall(r"runner: .*retrying in", settled_log))
    assert failures <= 10, f"{failures} loop failures: a crash loop\n{settled_log[-3000:]}"

    assert sampler.samples, "no pg_stat_activity samples"
    assert max(sampler.samples) <= MAX_CONNECTIONS, f"connections peaked at {max(sampler.samples)}"
    idle = sampler.count()
    assert idle is not None and idle <= IDLE_CONNECTIONS, f"{idle} connections left open when idle"
    assert worker.alive


def test_pg_ctl_restart_immediate_mid_run(
    database: tuple[PrivatePostgres, str, Engine], workers: WorkerPool, runner_kind: str
) -> None:
    server, name, engine = database
    app = "chaos-restart"
    worker, ids = _start_run(server, name, engine, workers, app, runner_kind)
    with ConnectionSampler(server, app) as sampler:
        for threshold in (len(ids) // 5, len(ids) * 8 // 15):
            wait_until(lambda: _settled(engine) >= threshold, timeout=120, what=f"{threshold} settled", interval=0.1)
            server.restart_immediate()
        _finish_and_check(engine, worker, ids, sampler)
    log = worker.log_text()
    assert "listener: connection lost" in log or "listener: cannot connect" in log, log[-3000:]


def test_pg_terminate_backend_mid_run(
    database: tuple[PrivatePostgres, str, Engine], workers: WorkerPool, runner_kind: str
) -> None:
    server, name, engine = database
    app = "chaos-terminate"
    worker, ids = _start_run(server, name, engine, workers, app, runner_kind)
    killed = []
    with ConnectionSampler(server, app) as sampler:
        for threshold in (len(ids) * 2 // 15, len(ids) * 6 // 15, len(ids) * 10 // 15):
            wait_until(lambda: _settled(engine) >= threshold, timeout=120, what=f"{threshold} settled", interval=0.1)
            with engine.connect() as conn:
                killed.append(
                    len(
                        conn.execute(
                            text(
                                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE application_name = :a AND pid <> pg_backend_pid()"
                            ),
                            {"a": app},
                        ).all()
                    )
                )
        _finish_and_check(engine, worker, ids, sampler)
    assert all(n >= 1 for n in killed), killed
    assert "listener: connection lost" in worker.log_text()
