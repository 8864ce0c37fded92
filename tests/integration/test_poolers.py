"""Behind a connection pooler in transaction mode (a real PgBouncer).

Debian's pgbouncer in ``pool_mode = transaction`` in front of the test
PostgreSQL (tests/servers/pgbouncer.py), with psycopg 3 and asyncpg
configured as the deployment guide says. Each test proves a guarantee a
team running behind PgBouncer, Supavisor or RDS Proxy relies on: every job
runs once, enqueue stays in the caller's transaction, nothing session-scoped
is left on a pooled server session, wake-ups say what they could do, and a
prepared-statement misconfiguration is a clear error naming its setting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, create_engine, func, select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from sqlalchemy_watchdog import (
    EnqueueConflict,
    Job,
    PreparedStatementsRefused,
    Retention,
    Runner,
    RunningJob,
    WakeupMode,
    WakeupsUnavailable,
    Watchdog,
    enqueue,
    metadata,
)
from sqlalchemy_watchdog.asyncio import AsyncRunner
from sqlalchemy_watchdog.cli import main
from sqlalchemy_watchdog.web import create_app
from tests.helpers import listening_sessions, wait_until, waiting_lock_holders
from tests.servers.pgbouncer import PgBouncer

#: What the deployment guide says to give each driver behind a transaction-mode pooler.
PSYCOPG_POOLED: dict[str, Any] = {"prepare_threshold": None}
ASYNCPG_POOLED: dict[str, Any] = {
    "statement_cache_size": 0,
    "prepared_statement_cache_size": 0,
    "prepared_statement_name_func": lambda: f"__asyncpg_{uuid.uuid4()}__",
}

DRIVERS = ["psycopg", "asyncpg"]


@pytest.fixture
def direct(postgres_url: URL) -> Iterator[Engine]:
    """A direct engine on the run's database, with a fresh ``watchdog_jobs``."""
    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def pooled(pgbouncer: PgBouncer, postgres_url: URL, direct: Engine) -> Iterator[Engine]:
    """A psycopg engine on the same database through PgBouncer."""
    engine = create_engine(pgbouncer.url(str(postgres_url.database)), connect_args=PSYCOPG_POOLED)
    yield engine
    engine.dispose()


def _ids(n: int, prefix: str = "job") -> list[str]:
    return [f"{prefix}-{i:04}" for i in range(n)]


def _outcomes(engine: Engine) -> dict[str, str | None]:
    with engine.connect() as conn:
        return {job_id: outcome for job_id, outcome in conn.execute(text("SELECT job_id, outcome FROM watchdog_jobs"))}


class Runs:
    """Handler executions, counted per job (thread-safe)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def handler(self, job: RunningJob) -> None:
        with self._lock:
            self.counts[job.job_id] += 1


def _serve(runner: Runner | AsyncRunner, until: Callable[[], bool], what: str) -> None:
    """Serve ``runner`` (either kind) in the background until ``until()``."""
    if isinstance(runner, Runner):
        thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False})
        thread.start()
        try:
            wait_until(until, 60, what)
        finally:
            runner.stop()
            thread.join(30)
        assert not thread.is_alive()
        return

    async def serve() -> None:
        task = asyncio.create_task(runner.run_forever(install_signal_handlers=False))
        try:
            while not until():
                if task.done():
                    task.result()
                await asyncio.sleep(0.05)
        finally:
            runner.stop()
            await asyncio.wait_for(task, 30)
        await runner.engine.dispose()
        if runner.listen_engine is not runner.engine:
            await runner.listen_engine.dispose()

    asyncio.run(asyncio.wait_for(serve(), 90))


def _runner(
    driver: str, pgbouncer: PgBouncer, database: str, handlers: dict[str, Any], **options: Any
) -> Runner | AsyncRunner:
    if driver == "psycopg":
        return Runner(create_engine(pgbouncer.url(database), connect_args=PSYCOPG_POOLED), handlers, **options)
    engine: AsyncEngine = create_async_engine(
        pgbouncer.url(database, "postgresql+asyncpg"), connect_args=ASYNCPG_POOLED
    )
    return AsyncRunner(engine, handlers, **options)


@pytest.mark.parametrize("driver", DRIVERS)
def test_every_job_runs_once_through_the_pooler_and_the_runner_says_it_polls(
    driver: str,
    pgbouncer: PgBouncer,
    postgres_url: URL,
    direct: Engine,
    pooled: Engine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = _ids(300)
    with Session(pooled) as session, session.begin():
        enqueue(session, [Job(job_id, "q") for job_id in ids])
    runs = Runs()
    runner = _runner(
        driver, pgbouncer, str(postgres_url.database), {"q": runs.handler}, concurrency=8, max_recoveries=2
    )
    caplog.set_level(logging.WARNING, logger="sqlalchemy_watchdog")
    _serve(runner, lambda: sum(runs.counts.values()) >= len(ids) and _settled(direct) == len(ids), "every job")
    assert runs.counts == Counter({job_id: 1 for job_id in ids})
    assert set(_outcomes(direct).values()) == {"completed"}
    # It could not prove a session: it polled at the fast interval and said so, once.
    status = runner.wakeup_status
    assert not status.listening and "pooler" in status.reason and status.poll_interval_s == 0.25
    warnings = [r.getMessage() for r in caplog.records if "wake-ups are off" in r.getMessage()]
    assert len(warnings) == 1 and "listen_engine" in warnings[0], warnings
    assert "poll every 0.25s" in repr(runner)


def _settled(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE outcome IS NOT NULL")).scalar_one())


@pytest.mark.parametrize("driver", DRIVERS)
def test_with_a_direct_listen_engine_the_runner_listens_on_a_proven_session(
    driver: str, pgbouncer: PgBouncer, postgres_url: URL, direct: Engine, pooled: Engine
) -> None:
    ids = _ids(40)
    runs = Runs()
    database = str(postgres_url.database)
    listen_engine: Any = (
        create_engine(postgres_url)
        if driver == "psycopg"
        else create_async_engine(postgres_url.set(drivername="postgresql+asyncpg"))
    )
    runner = _runner(driver, pgbouncer, database, {"q": runs.handler}, listen_engine=listen_engine)
    seen: list[int] = []

    def enqueued_and_done() -> bool:
        if not seen:
            # Enqueued once the runner is listening: the wake-ups reach it.
            if runner.wakeup_status.listening and listening_sessions(direct) >= 1:
                Watchdog(pooled).enqueue([Job(job_id, "q") for job_id in ids])
                seen.append(1)
            return False
        return _settled(direct) == len(ids)

    _serve(runner, enqueued_and_done, "the runner to listen and finish every job")
    assert runs.counts == Counter({job_id: 1 for job_id in ids})
    assert runner.wakeup_status.listening and runner.wakeup_status.requested is WakeupMode.AUTO
    if isinstance(listen_engine, Engine):
        listen_engine.dispose()


@pytest.mark.parametrize("driver", DRIVERS)
def test_listen_mode_refuses_to_start_behind_the_pooler(
    driver: str, pgbouncer: PgBouncer, postgres_url: URL, direct: Engine
) -> None:
    runner = _runner(driver, pgbouncer, str(postgres_url.database), {"q": lambda job: None}, wakeups="listen")
    with pytest.raises(WakeupsUnavailable, match="listen_engine") as error:
        if isinstance(runner, Runner):
            runner.run_forever(install_signal_handlers=False)
        else:

            async def start() -> None:
                try:
                    await runner.run_forever(install_signal_handlers=False)
                finally:
                    await runner.engine.dispose()

            asyncio.run(start())
    assert "NOTIFY" in error.value.reason


def test_poll_mode_never_listens_nor_takes_the_waiting_lock(direct: Engine) -> None:
    runs = Runs()
    runner = Runner(create_engine(direct.url), {"q": runs.handler}, wakeups="poll")
    observed: list[tuple[int, int]] = []

    def idle_a_while() -> bool:
        observed.append((listening_sessions(direct), len(waiting_lock_holders(direct))))
        return len(observed) >= 20

    _serve(runner, idle_a_while, "twenty looks at the idle runner")
    assert set(observed) == {(0, 0)}
    assert runner.wakeup_status.reason == 'wakeups="poll"'
    runner.engine.dispose()


def test_another_clients_session_lock_survives_a_runner_through_the_pooler(
    pgbouncer: PgBouncer, postgres_url: URL, direct: Engine, pooled: Engine
) -> None:
    """A pooled server session holds another client's session advisory lock;
    the runner claims, settles, waits and prunes through the same pooler and
    must never release it (no pg_advisory_unlock_all, no session lock of its own)."""
    bouncer = PgBouncer(direct.url, pool_size=2)  # two server sessions: the runner shares the locked one
    with bouncer:
        database = str(postgres_url.database)
        other = create_engine(bouncer.url(database), connect_args=PSYCOPG_POOLED, poolclass=None)
        with other.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            holder_pid = conn.execute(
                text("SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(4242)) AS x")
            ).scalar()
        ids = _ids(200)
        Watchdog(pooled).enqueue([Job(job_id, "q") for job_id in ids])
        with direct.begin() as conn:  # old settled jobs for the pruner
            conn.execute(
                text(
                    "UPDATE watchdog_jobs SET state = 'settled', outcome = 'completed', settled_at = 0 "
                    "WHERE job_id IN ('job-0000', 'job-0001')"
                )
            )
        runs = Runs()
        engine = create_engine(bouncer.url(database), connect_args=PSYCOPG_POOLED)
        runner = Runner(engine, {"q": runs.handler}, concurrency=4, retention=Retention(completed=timedelta(hours=1)))
        _serve(
            runner, lambda: _settled(direct) == len(ids) - 2 and "job-0000" not in _outcomes(direct), "work and prune"
        )
        with direct.connect() as conn:
            held = (
                conn.execute(
                    text(
                        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND granted "
                        "AND mode = 'ExclusiveLock'"
                    )
                )
                .scalars()
                .all()
            )
        assert held == [holder_pid]
        engine.dispose()
        other.dispose()


@pytest.mark.parametrize("driver", DRIVERS)
def test_enqueue_stays_in_the_callers_transaction_through_the_pooler(
    driver: str, pgbouncer: PgBouncer, postgres_url: URL, direct: Engine
) -> None:
    orders = Table("orders", MetaData(), Column("id", Integer, primary_key=True))
    orders.create(direct)
    database = str(postgres_url.database)

    def count(table: str) -> int:
        with direct.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())

    if driver == "psycopg":
        engine = create_engine(pgbouncer.url(database), connect_args=PSYCOPG_POOLED)
        with Session(engine) as session, session.begin():
            session.execute(orders.insert().values(id=1))
            enqueue(session, Job("order-1", "q", payload={"order": 1}))
        with Session(engine) as session:
            session.execute(orders.insert().values(id=2))
            enqueue(session, Job("order-2", "q"))
            session.rollback()
        with Session(engine) as session:
            session.execute(orders.insert().values(id=3))
            with pytest.raises(EnqueueConflict):
                enqueue(session, Job("order-1", "q", payload={"order": "other"}))
        engine.dispose()
    else:
        from sqlalchemy.ext.asyncio import AsyncSession

        from sqlalchemy_watchdog.asyncio import enqueue as enqueue_async

        async def run() -> None:
            engine = create_async_engine(pgbouncer.url(database, "postgresql+asyncpg"), connect_args=ASYNCPG_POOLED)
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(orders.insert().values(id=1))
                await enqueue_async(session, Job("order-1", "q", payload={"order": 1}))
            async with AsyncSession(engine) as session:
                await session.execute(orders.insert().values(id=2))
                await enqueue_async(session, Job("order-2", "q"))
                await session.rollback()
            async with AsyncSession(engine) as session:
                await session.execute(orders.insert().values(id=3))
                with pytest.raises(EnqueueConflict):
                    await enqueue_async(session, Job("order-1", "q", payload={"order": "other"}))
            await engine.dispose()

        asyncio.run(run())
    assert count("orders") == 1 and count("watchdog_jobs") == 1
    assert list(_outcomes(direct)) == ["order-1"]


def test_prepared_statements_lost_by_the_pooler_raise_an_error_naming_the_setting(
    postgres_url: URL, direct: Engine, pgbouncer: PgBouncer
) -> None:
    """With psycopg's default (prepare after five executions) and one pooled
    server session shared by two clients, their statements collide: enqueue
    and the runner fail with PreparedStatementsRefused, never a raw driver error."""
    with PgBouncer(direct.url, pool_size=1) as bouncer:
        database = str(postgres_url.database)
        first, second = (create_engine(bouncer.url(database), poolclass=None) for _ in range(2))
        errors: list[BaseException] = []
        for engine in (first, second):
            for n in range(8):
                try:
                    with Session(engine) as session, session.begin():
                        enqueue(session, Job(f"{id(engine)}-{n}", "q"))
                except Exception as error:
                    errors.append(error)
        assert errors, "the second client's prepared statements should have collided with the first's"
        assert all(isinstance(error, PreparedStatementsRefused) for error in errors), errors
        assert 'prepare_threshold": None' in str(errors[0]) and "max_prepared_statements" in str(errors[0])
        # The operations every runner and Watchdog call go through (their retry loop) say it too.
        refused: list[BaseException] = []
        for engine in (first, second, first, second):
            for _ in range(8):
                try:
                    Watchdog(engine).stats()
                except Exception as error:
                    refused.append(error)
        assert refused and all(isinstance(error, PreparedStatementsRefused) for error in refused), refused
        first.dispose()
        second.dispose()


def test_asyncpg_default_settings_behind_the_pooler_raise_an_error_naming_the_setting(
    postgres_url: URL, direct: Engine, pgbouncer: PgBouncer
) -> None:
    """asyncpg prepares every statement on its connection's server session; behind a
    transaction-mode pooler a client's next transaction may get another session, where
    its statements do not exist: enqueue fails with PreparedStatementsRefused, never a raw
    driver error.

    Made to happen, not left to timing (four clients racing over two sessions never met
    on a busy CI machine, where their transactions did not overlap and the pooler served
    them all from one session): two clients each hold a transaction, so each has a
    session of its own, and enqueue; A commits, then B, so B's session is the one the
    pooler hands out next (PgBouncer reuses the last freed); A's next transaction gets
    it, and A's statements are not there. A pooler that hands sessions out otherwise
    would still swap them in some of the rounds."""
    from sqlalchemy.ext.asyncio import AsyncSession

    from sqlalchemy_watchdog.asyncio import enqueue as enqueue_async

    async def run(bouncer: PgBouncer) -> list[BaseException]:
        engine = create_async_engine(bouncer.url(str(postgres_url.database), "postgresql+asyncpg"))
        failures: list[BaseException] = []
        try:
            async with engine.connect() as conn_a, engine.connect() as conn_b:
                session_a, session_b = AsyncSession(bind=conn_a), AsyncSession(bind=conn_b)

                async def enqueue_in(session: AsyncSession, job: Job) -> None:
                    try:
                        await enqueue_async(session, job)  # begins the session's transaction
                    except Exception as error:
                        failures.append(error)
                        await session.rollback()

                for n in range(6):
                    await enqueue_in(session_a, Job(f"a-{n}", "q"))
                    await enqueue_in(session_b, Job(f"b-{n}", "q"))
                    await session_a.commit()
                    await session_b.commit()
        finally:
            await engine.dispose()
        return failures

    with PgBouncer(direct.url, pool_size=2) as bouncer:
        failures = asyncio.run(run(bouncer))
    # Rounds 2 to 6 each swap the sessions (PgBouncer hands out the last freed).
    assert failures and all(isinstance(error, PreparedStatementsRefused) for error in failures), failures
    assert "statement_cache_size" in str(failures[0])


def test_the_cli_and_the_dashboard_read_through_the_pooler(
    pgbouncer: PgBouncer, postgres_url: URL, direct: Engine, pooled: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    Watchdog(pooled).enqueue([Job(job_id, "emails") for job_id in _ids(12, "mail")])
    url = pgbouncer.url(str(postgres_url.database)).update_query_dict({"prepare_threshold": "none"})
    rendered = url.render_as_string(hide_password=False)
    for _ in range(8):  # more than psycopg's prepare threshold: no statement is prepared
        assert main(["--url", rendered, "ls", "--queue", "emails"]) == 0
        assert main(["--url", rendered, "stats"]) == 0
    out = capsys.readouterr().out
    assert "mail-0011" in out and "emails" in out
    with TestClient(create_app(pooled)) as client:
        for _ in range(8):
            assert client.get("/").status_code == 200
            page = client.get("/jobs", params={"queue": "emails"})
            assert page.status_code == 200 and "mail-0000" in page.text
    with pooled.connect() as conn:
        assert conn.execute(select(func.count()).select_from(text("watchdog_jobs"))).scalar_one() == 12


# -- results (revision w0012) ---------------------------------------------------------


def test_wait_for_a_result_through_pgbouncer_polls_and_returns_it(pooled: Engine, direct: Engine) -> None:
    """A transaction-mode pooler is not one session: wait() cannot LISTEN
    there (the session proof fails), so it reads every poll_interval and
    still returns the result once the job settles."""
    from sqlalchemy_watchdog import ResultStatus

    Watchdog(direct).enqueue(Job("pooled-result", "q"))

    def settle_soon() -> None:
        time.sleep(0.3)
        Runner(direct, {"q": lambda job: {"via": "pgbouncer"}}).run_until_idle()

    thread = threading.Thread(target=settle_soon)
    thread.start()
    try:
        result = Watchdog(pooled).wait(
            "pooled-result", timeout=timedelta(seconds=30), poll_interval=timedelta(milliseconds=100)
        )
    finally:
        thread.join(30)
    assert result.status is ResultStatus.COMPLETED and result.value == {"via": "pgbouncer"}
