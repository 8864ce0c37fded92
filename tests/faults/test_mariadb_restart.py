"""Fault 5 on MariaDB: the database goes away under a running worker.

A MariaDB server of the test's own (see :mod:`tests.faults.private_mariadb`)
is SIGKILLed and started again on the same data mid-run (InnoDB crash
recovery), and, separately, every connection of the worker is killed with
``KILL CONNECTION``. The worker must log, reconnect and go on -- no crash
loop, a bounded number of connections in ``information_schema.PROCESSLIST``
throughout, and every job settled exactly once. The restart runs with a
``Runner`` worker and with an ``AsyncRunner`` worker (aiomysql; fewer jobs:
the async run proves the same recovery paths, not a longer soak); the
connection kills with a ``Runner`` only, to keep the file within its CI
budget.

The worker connects as a user of its own, so the test finds its
connections (and only its) by ``USER``.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from sqlalchemy_watchdog import Job, metadata
from sqlalchemy_watchdog.model import jobs_table
from tests.conftest import IN_CI
from tests.faults.helpers import (
    Worker,
    WorkerPool,
    assert_settled_exactly_once,
    audit_rows,
    enqueue_jobs,
    install_instrumentation,
    wait_until,
)
from tests.faults.private_mariadb import MISSING, PrivateMariaDB, find_binaries

pytestmark = pytest.mark.slow

JOBS = {"sync": 150, "async": 80}
CONCURRENCY = 2
# SQLAlchemy's default QueuePool (5 + 10 overflow); no LISTEN connection on
# MariaDB (runners poll).
MAX_CONNECTIONS = 5 + 10
# Once idle: the pool keeps up to 5 connections checked in; the runner's loop,
# settler and heartbeat each hold one checked out.
IDLE_CONNECTIONS = 5 + 3


@pytest.fixture(scope="module")
def private_mariadb() -> Iterator[PrivateMariaDB]:
    binaries = find_binaries()
    if binaries is None:
        if IN_CI:
            pytest.fail(MISSING + " -- CI=true requires this test to run")
        pytest.skip(MISSING)
    server = PrivateMariaDB(*binaries)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def database(private_mariadb: PrivateMariaDB) -> Iterator[tuple[PrivateMariaDB, str, str, Engine]]:
    """A fresh database on the private server, a user for the worker with
    every right on it, and a NullPool engine on it as root (the test's own
    reads must not depend on pooled connections that a restart kills)."""
    name = f"faults_{uuid.uuid4().hex[:10]}"
    user = f"w_{uuid.uuid4().hex[:10]}"
    admin = create_engine(private_mariadb.url(), poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}`"))
        conn.execute(text(f"CREATE USER '{user}'@'127.0.0.1'"))
        conn.execute(text(f"GRANT ALL ON `{name}`.* TO '{user}'@'127.0.0.1'"))
    engine = create_engine(private_mariadb.url(name), poolclass=NullPool)
    metadata.create_all(engine)
    install_instrumentation(engine)
    try:
        yield private_mariadb, name, user, engine
    finally:
        engine.dispose()
        try:
            with admin.connect() as conn:
                conn.execute(text(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'"))
                conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        finally:
            admin.dispose()


class ConnectionSampler:
    """Counts the worker's connections in PROCESSLIST every 100 ms."""

    def __init__(self, server: PrivateMariaDB, user: str) -> None:
        self.engine = create_engine(server.url(), poolclass=NullPool)
        self.user = user
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int | None:
        try:
            with self.engine.connect() as conn:
                return int(
                    conn.execute(
                        text("SELECT count(*) FROM information_schema.PROCESSLIST WHERE USER = :u"),
                        {"u": self.user},
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
    server: PrivateMariaDB, name: str, user: str, engine: Engine, workers: WorkerPool, runner_kind: str = "sync"
) -> tuple[Worker, list[str]]:
    ids = [f"job-{i:04d}" for i in range(JOBS[runner_kind])]
    enqueue_jobs(
        engine,
        [Job(j, "chaos", payload={"action": "sleep", "seconds": 0.02}, max_recoveries=5) for j in ids],
    )
    worker = workers.start(
        server.url(name, username=user),
        user,
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
    not_completed = {j: (r["outcome"], r["failure_reason"]) for j, r in rows.items() if r["outcome"] != "completed"}
    assert not not_completed, f"{not_completed}\n{worker.log_text()[-6000:]}"
    # None ran twice beyond the guarantee: a handler runs again only after a
    # recovery of its job (an audit start row per run, retried writes of one
    # run sharing its exec_id).
    runs = Counter(row["job_id"] for row in {r["exec_id"]: r for r in audit_rows(engine)}.values())
    rerun = {j: (runs[j], rows[j]["recovery_count"]) for j in ids if runs[j] > 1 + rows[j]["recovery_count"]}
    assert not rerun, f"(runs, recoveries) of jobs run more often than recovered: {rerun}"
    never = [j for j in ids if runs[j] == 0]
    assert not never, f"settled completed without a run: {never[:10]}"
    assert worker.alive, worker.log_text()[-3000:]

    # An unreachable server is an outage, waited out -- never a settle the
    # database refused (which settles the job failed, or leaves it to its lease).
    settled_log = worker.log_text()
    assert "refused its settlement" not in settled_log, settled_log[-6000:]

    # Quiet once the database is back: no crash loop.
    time.sleep(3)
    later = worker.log_text()[len(settled_log) :]
    assert not re.search(r" (ERROR|CRITICAL) ", later), later
    failures = len(re.findall(r"runner: .*retrying in", settled_log))
    assert failures <= 10, f"{failures} loop failures: a crash loop\n{settled_log[-3000:]}"

    assert sampler.samples, "no PROCESSLIST samples"
    assert max(sampler.samples) <= MAX_CONNECTIONS, f"connections peaked at {max(sampler.samples)}"
    idle = sampler.count()
    assert idle is not None and idle <= IDLE_CONNECTIONS, f"{idle} connections left open when idle"
    assert worker.alive


def test_a_worker_survives_its_server_sigkilled_and_restarted_twice_mid_run(
    database: tuple[PrivateMariaDB, str, str, Engine], workers: WorkerPool, runner_kind: str
) -> None:
    server, name, user, engine = database
    worker, ids = _start_run(server, name, user, engine, workers, runner_kind)
    with ConnectionSampler(server, user) as sampler:
        # Back at once, then after a second of refused connections.
        for threshold, down in ((len(ids) // 5, 0.0), (len(ids) * 8 // 15, 1.0)):
            wait_until(lambda: _settled(engine) >= threshold, timeout=120, what=f"{threshold} settled", interval=0.1)
            server.kill_and_restart(down)
        _finish_and_check(engine, worker, ids, sampler)


def _kill_connections_of(engine: Engine, user: str) -> int:
    """``KILL CONNECTION`` every connection of ``user``; how many there were."""
    killed = 0
    with engine.connect() as conn:
        ids = conn.execute(
            text("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = :u AND ID <> CONNECTION_ID()"),
            {"u": user},
        ).scalars()
        for thread_id in list(ids):
            try:
                conn.exec_driver_sql(f"KILL CONNECTION {int(thread_id)}")
                killed += 1
            except DBAPIError as error:
                if "Unknown thread id" not in str(error.orig):  # gone by itself meanwhile
                    raise
    return killed


def test_a_worker_survives_kill_connection_of_all_its_connections_mid_run(
    database: tuple[PrivateMariaDB, str, str, Engine], workers: WorkerPool
) -> None:
    server, name, user, engine = database
    worker, ids = _start_run(server, name, user, engine, workers)
    killed = []
    with ConnectionSampler(server, user) as sampler:
        for threshold in (len(ids) * 2 // 15, len(ids) * 6 // 15, len(ids) * 10 // 15):
            wait_until(lambda: _settled(engine) >= threshold, timeout=120, what=f"{threshold} settled", interval=0.1)
            killed.append(_kill_connections_of(engine, user))
        _finish_and_check(engine, worker, ids, sampler)
    assert all(n >= 1 for n in killed), killed
