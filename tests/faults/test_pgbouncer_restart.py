"""PostgreSQL restarts behind PgBouncer: ``server_login_retry`` (issue 54, item 9).

A runner connects through a PgBouncer of the test's own (transaction mode,
prepared statements off) to a PostgreSQL of the test's own, which is stopped
for 3 seconds and started again while jobs keep arriving (enqueued straight
to the server: the producer is not what is measured). PgBouncer's failed
logins during the outage make it refuse new logins for
``server_login_retry`` seconds -- also after the server is back -- which is
what docs/howto/deployment.md ("PgBouncer after a PostgreSQL restart")
describes and measures:

* with PgBouncer's default (15 s) the first job enqueued after the restart
  runs seconds later, and the runner's log names ``server_login_retry``
  (SQLSTATE 08P01); with ``server_login_retry = 1`` it runs within a few
  seconds;
* either way the runner goes on by itself (no restart), and every job is
  settled ``completed`` exactly once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from sqlalchemy_watchdog import Job, Runner, RunningJob, Watchdog, metadata
from tests.conftest import IN_CI
from tests.faults.helpers import assert_settled_exactly_once, install_instrumentation, wait_until
from tests.faults.private_postgres import PrivatePostgres, find_bindir
from tests.servers import pgbouncer

pytestmark = pytest.mark.slow

OUTAGE_S = 3.0


class Bouncer(pgbouncer.PgBouncer):
    """The test PgBouncer with ``server_login_retry`` set (None: its default)."""

    def __init__(self, server: URL, login_retry: int | None) -> None:
        super().__init__(server)
        self.login_retry = login_retry

    def _config(self) -> str:
        extra = "" if self.login_retry is None else f"server_login_retry = {self.login_retry}\n"
        return super()._config() + extra


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    if not pgbouncer.available():
        if IN_CI:
            pytest.fail(pgbouncer.MISSING + " -- CI=true requires the pooler tests to run")
        pytest.skip(pgbouncer.MISSING)
    bindir = find_bindir()
    if bindir is None:
        if IN_CI:
            pytest.fail("no PostgreSQL server binaries (initdb, pg_ctl) -- CI=true requires this test to run")
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    server = PrivatePostgres(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


class Kept(logging.Handler):
    """Every record of the package's loggers, DEBUG included."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("login_retry", [None, 1], ids=["default_15s", "login_retry_1s"])
def test_a_runner_behind_pgbouncer_goes_on_by_itself_after_a_postgres_restart(
    private_pg: PrivatePostgres, login_retry: int | None
) -> None:
    name = f"bouncer_{uuid.uuid4().hex[:10]}"
    admin = create_engine(private_pg.url(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    direct = create_engine(private_pg.url(name), poolclass=NullPool)
    metadata.create_all(direct)
    install_instrumentation(direct)
    bouncer = Bouncer(private_pg.url(), login_retry)
    bouncer.start()
    pooled = create_engine(private_pg.url(name).set(port=bouncer.port), connect_args={"prepare_threshold": None})
    kept = Kept()
    package_log = logging.getLogger("sqlalchemy_watchdog")
    package_log.addHandler(kept)
    level = package_log.level
    package_log.setLevel(logging.DEBUG)
    ran: dict[str, float] = {}
    enqueued: dict[str, float] = {}
    stop = threading.Event()

    def handle(job: RunningJob) -> None:
        ran[job.job_id] = time.monotonic()

    def produce() -> None:
        watchdog, n = Watchdog(direct), 0
        while not stop.wait(0.1):
            job_id = f"j{n:04d}"
            try:
                watchdog.enqueue(Job(job_id, "q"))
            except Exception:
                continue  # the server is down: the next one
            enqueued[job_id] = time.monotonic()
            n += 1

    runner = Runner(pooled, {"q": handle}, wakeups="poll", poll_interval=timedelta(milliseconds=50), concurrency=2)
    serving = threading.Thread(target=runner.run_forever, daemon=True)
    producer = threading.Thread(target=produce, daemon=True)
    try:
        serving.start()
        producer.start()
        wait_until(lambda: len(ran) >= 10, timeout=60, what="the runner to work through PgBouncer")
        private_pg._run("pg_ctl", "-D", str(private_pg.data), "-m", "immediate", "-w", "-t", "60", "stop")
        time.sleep(OUTAGE_S)
        options = ["-o", private_pg.options, "-l", str(private_pg.logfile)]
        private_pg._run("pg_ctl", "-D", str(private_pg.data), *options, "-w", "-t", "60", "start")
        back = time.monotonic()

        def first_after_restart() -> float | None:
            times = [ran[job] for job, at in list(enqueued.items()) if at > back and job in ran]
            return min(times) if times else None

        first = wait_until(first_after_restart, timeout=90, what="a job enqueued after the restart to run")
        time.sleep(1)  # a few more jobs, through PgBouncer's new server connections
        stop.set()
        producer.join(10)
        wait_until(lambda: set(enqueued) <= set(ran), timeout=60, what="every job to run")
    finally:
        stop.set()
        runner.stop()
        serving.join(60)
        package_log.removeHandler(kept)
        package_log.setLevel(level)
        pooled.dispose()
        bouncer.stop()
    try:
        assert not serving.is_alive()
        delay = first - back
        if login_retry is None:
            # PgBouncer waited out its 15 s from the first failed login, during the outage.
            assert delay > 5, f"the first job after the restart ran {delay:.1f}s after it"
            assert any("server_login_retry" in message for message in kept.messages), kept.messages[-20:]
        else:
            assert delay < 6, f"the first job after the restart ran {delay:.1f}s after it"
        rows = assert_settled_exactly_once(direct, list(enqueued))
        assert {row["outcome"] for row in rows.values()} == {"completed"}
    finally:
        direct.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
