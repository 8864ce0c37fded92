"""Issue 54, items 1 and 7: a database blip shorter than the lease loses nothing.

A PostgreSQL of the test's own (:mod:`tests.faults.private_postgres`) is
stopped for a few seconds while four one-second handlers run in a worker
process, then started again. The handlers' settles fall into the outage;
the runner must keep them and retry while their leases may be alive, so
every job ends ``completed`` by its first claim -- none ``interrupted``
(a job without a recovery policy), none run twice (``max_recoveries=1``)
-- and the healed blip logs no ERROR: one WARNING for the episode, one
INFO when it heals. An outage longer than the lease loses the decisions,
as documented: the jobs go to recovery and each still settles once.
Each case runs with a ``Runner`` and with an ``AsyncRunner`` worker.
"""

from __future__ import annotations

import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from sqlalchemy_watchdog import Job, metadata
from tests.conftest import IN_CI
from tests.faults.helpers import (
    Worker,
    WorkerPool,
    assert_settled_exactly_once,
    audit_rows,
    enqueue_jobs,
    install_instrumentation,
    jobs_by_id,
    transition_rows,
    wait_until,
)
from tests.faults.private_postgres import PrivatePostgres, find_bindir

pytestmark = pytest.mark.slow


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
def bouncer(private_pg: PrivatePostgres) -> Iterator[Any]:
    """A PgBouncer in transaction mode in front of the private server;
    skipped where Debian's pgbouncer is not installed (failed under CI)."""
    from tests.servers import pgbouncer

    if not pgbouncer.available():
        if IN_CI:
            pytest.fail(pgbouncer.MISSING + " -- CI=true requires the pooler tests to run")
        pytest.skip(pgbouncer.MISSING)
    with pgbouncer.PgBouncer(private_pg.url()) as running:
        yield running


@pytest.fixture
def database(private_pg: PrivatePostgres) -> Iterator[tuple[PrivatePostgres, str, Engine]]:
    """A fresh database on the private server, and a NullPool engine on it."""
    name = f"blip_{uuid.uuid4().hex[:10]}"
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


#: The handlers' run time: long enough that the outage starts while every
#: one of them still runs, so each returns -- and settles -- into it.
HANDLER_S = 1.5


def _jobs(prefix: str, n: int) -> list[Job]:
    """``n`` jobs of HANDLER_S whose handlers write nothing after they start
    (their start row is their effect): half without a recovery policy (a
    lost settle would end them ``interrupted``), half with
    ``max_recoveries=1`` (a lost settle would run them twice)."""
    return [
        Job(
            f"{prefix}-{i}",
            "chaos",
            payload={"action": "sleep", "seconds": HANDLER_S, "no_end": True},
            max_recoveries=1 if i % 2 else None,
        )
        for i in range(n)
    ]


def _start(
    url: URL, workers: WorkerPool, runner_kind: str, *, lease: float, heartbeat: float, pooled: bool = False
) -> Worker:
    app = f"blip-{runner_kind}"
    worker = workers.start(
        url,
        app,
        concurrency=4,
        lease=lease,
        heartbeat=heartbeat,
        poll=0.2,
        grace=5,
        asyncio=runner_kind == "async",
        pooled=pooled,
    )
    worker.wait_ready()
    return worker


def _settled(engine: Engine, ids: list[str]) -> bool:
    try:
        rows = jobs_by_id(engine)
    except DBAPIError:
        return False
    return all(rows.get(j, {}).get("state") == "settled" for j in ids)


def _outage(
    halt: Callable[[], None], resume: Callable[[], None], engine: Engine, ids: list[str], seconds: float
) -> tuple[int, int]:
    """Once every handler has started, ``halt`` (the server, or the pooler in
    front of it) for ``seconds`` and ``resume``; the outage's start and end
    in epoch milliseconds (the machine's clock, which is the database's:
    same host)."""
    wait_until(lambda: len(audit_rows(engine)) == len(ids), timeout=60, what="every handler to start", interval=0.05)
    down = time.time()
    halt()
    time.sleep(max(0.0, seconds - (time.time() - down)))
    resume()
    return int(down * 1000), int(time.time() * 1000)


def test_a_settle_outlives_a_blip_shorter_than_its_lease(
    database: tuple[PrivatePostgres, str, Engine], workers: WorkerPool, runner_kind: str
) -> None:
    server, name, engine = database
    jobs = _jobs("blip", 4)
    ids = [job.job_id for job in jobs]
    enqueue_jobs(engine, jobs)
    worker = _start(server.url(name, application_name="blip"), workers, runner_kind, lease=10, heartbeat=2)
    down_ms, up_ms = _outage(server.halt, server.resume, engine, ids, 4.0)
    _check_nothing_lost(engine, worker, ids, down_ms, up_ms)


def test_a_settle_outlives_a_pooler_restart_shorter_than_its_lease(
    database: tuple[PrivatePostgres, str, Engine], bouncer: Any, workers: WorkerPool, runner_kind: str
) -> None:
    """The same through a PgBouncer in transaction mode, which is killed for
    4 s and started again on its port (the issue's PgBouncer restart)."""
    _, name, engine = database
    jobs = _jobs("pooled", 4)
    ids = [job.job_id for job in jobs]
    enqueue_jobs(engine, jobs)
    worker = _start(bouncer.url(name), workers, runner_kind, lease=10, heartbeat=2, pooled=True)
    down_ms, up_ms = _outage(bouncer.halt, bouncer.start, engine, ids, 4.0)
    _check_nothing_lost(engine, worker, ids, down_ms, up_ms)


def _check_nothing_lost(engine: Engine, worker: Worker, ids: list[str], down_ms: int, up_ms: int) -> None:
    """Every job completed by its first claim, once, after the outage; no
    ERROR logged, one WARNING for the episode and one INFO when it healed."""
    wait_until(lambda: _settled(engine, ids), timeout=60, what="every job to settle", interval=0.2)
    rows = assert_settled_exactly_once(engine, ids)
    log = worker.log_text()
    assert {j: rows[j]["outcome"] for j in ids} == dict.fromkeys(ids, "completed"), log[-4000:]
    ran = [row["job_id"] for row in audit_rows(engine)]
    assert sorted(ran) == sorted(ids), f"a handler ran twice (or never): {ran}\n{log[-4000:]}"
    # The settles fell into the outage and went through after it: the
    # retries, not luck, kept the decisions.
    settled_at = {t["job_id"]: t["at_ms"] for t in transition_rows(engine) if t["new_state"] == "settled"}
    early = {j: at for j, at in settled_at.items() if at < down_ms}
    assert not early, f"settled before the outage (the handlers were too quick for the test): {early}"
    assert all(at >= up_ms - 1000 for at in settled_at.values()), (settled_at, up_ms)

    # Item 7: nothing was lost, so nothing is logged as an error; the
    # episode is one WARNING, and its healing one INFO.
    time.sleep(1.0)
    log = worker.log_text()
    errors = re.findall(r".* (?:ERROR|CRITICAL) .*", log)
    assert not errors, "\n".join(errors) + "\n" + log[-4000:]
    assert len(re.findall(r"WARNING .*database unreachable", log)) == 1, log[-4000:]
    assert re.search(r"INFO .*database reachable again", log), log[-4000:]
    assert worker.alive


def test_an_outage_longer_than_the_lease_hands_the_jobs_to_recovery(
    database: tuple[PrivatePostgres, str, Engine], workers: WorkerPool, runner_kind: str
) -> None:
    server, name, engine = database
    jobs = _jobs("long", 2)
    ids = [job.job_id for job in jobs]
    enqueue_jobs(engine, jobs)
    worker = _start(server.url(name, application_name="long"), workers, runner_kind, lease=3, heartbeat=1)
    _outage(server.halt, server.resume, engine, ids, 3 + 1 + 4.0)  # lease + the bound's margin + more

    wait_until(lambda: _settled(engine, ids), timeout=60, what="every job to settle", interval=0.2)
    rows = assert_settled_exactly_once(engine, ids)
    log = worker.log_text()
    without_policy, with_one_recovery = ids
    # The first claim's decision was lost: recovery took each job -- the one
    # without a policy is interrupted, the other ran again and completed.
    assert rows[without_policy]["outcome"] == "interrupted", log[-4000:]
    assert rows[with_one_recovery]["outcome"] == "completed", log[-4000:]
    assert rows[with_one_recovery]["recovery_count"] == 1
    runs = [row["job_id"] for row in audit_rows(engine)]
    assert runs.count(without_policy) == 1 and runs.count(with_one_recovery) == 2, runs
    # A decision lost is an ERROR, once per batch given up.
    assert re.search(r"ERROR .*given up: the database stayed unreachable until their leases ended", log), log[-4000:]
    assert worker.alive


def test_a_shutdown_during_a_blip_waits_for_the_settles_within_its_grace(
    database: tuple[PrivatePostgres, str, Engine], workers: WorkerPool, runner_kind: str
) -> None:
    """SIGTERM while the server is down and every handler has returned: the
    shutdown keeps the settles being retried (its grace is 5 s), the server
    comes back within it, and every job still ends ``completed`` by its
    first claim; the worker then exits cleanly, having logged no ERROR."""
    server, name, engine = database
    jobs = _jobs("term", 4)
    ids = [job.job_id for job in jobs]
    enqueue_jobs(engine, jobs)
    worker = _start(server.url(name, application_name="term"), workers, runner_kind, lease=10, heartbeat=2)

    def halt_then_stop() -> None:
        server.halt()
        time.sleep(HANDLER_S + 0.5)  # every handler has returned into the outage
        worker.send(signal.SIGTERM)

    _outage(halt_then_stop, server.resume, engine, ids, 4.0)
    assert worker.wait(timeout=30) == 0
    rows = assert_settled_exactly_once(engine, ids)
    log = worker.log_text()
    assert {j: rows[j]["outcome"] for j in ids} == dict.fromkeys(ids, "completed"), log[-4000:]
    assert sorted(row["job_id"] for row in audit_rows(engine)) == sorted(ids), log[-4000:]
    errors = re.findall(r".* (?:ERROR|CRITICAL) .*", log)
    assert not errors, "\n".join(errors) + "\n" + log[-4000:]
