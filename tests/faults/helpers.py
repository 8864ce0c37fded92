"""Shared machinery of the fault tests: instrumentation tables, dumps, worker
processes and polling.

Instrumentation lives beside ``watchdog_jobs`` and never changes it:

* ``fault_audit``: one row per handler execution, written by the handler in
  transactions of its own (start and end in the database clock, the lease
  seen at start, the stop reason it was given).
* ``fault_transitions``: filled by a trigger on ``watchdog_jobs`` for every
  change of state, outcome, claim token or recovery count, with the lease
  the row had just before, stamped with the real database clock. "Settled exactly once" is read from it: one transition into
  ``settled`` per job and none out of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    Table,
    Text,
    create_engine,
    select,
    text,
)
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, enqueue
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.store import sql
from tests.helpers import wait_until as wait_until

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
WORKER_SCRIPT = Path(__file__).with_name("chaos_worker.py")

fault_metadata = MetaData()

audit = Table(
    "fault_audit",
    fault_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Text, nullable=False),
    Column("exec_id", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("recovery_count", Integer, nullable=False),
    # When the runner called the handler (the worker's clock; same host as the
    # database): the audit write below may wait on the database.
    Column("called_ms", BigInteger, nullable=False),
    # When the start row was written (database clock).
    Column("started_ms", BigInteger, nullable=False),
    Column("lease_seen", BigInteger),
    Column("ended_ms", BigInteger),
    Column("stop_reason", Text),
    Column("note", Text),
)

transitions = Table(
    "fault_transitions",
    fault_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Text),
    Column("old_state", Text),
    Column("new_state", Text),
    Column("old_outcome", Text),
    Column("new_outcome", Text),
    Column("old_token", Text),
    Column("new_token", Text),
    Column("old_count", Integer),
    Column("new_count", Integer),
    Column("old_lease", BigInteger),
    Column("at_ms", BigInteger),
)

_COLS = (
    "job_id, old_state, new_state, old_outcome, new_outcome, old_token, new_token, "
    "old_count, new_count, old_lease, at_ms"
)
_VALS = (
    "OLD.job_id, OLD.state, NEW.state, OLD.outcome, NEW.outcome, OLD.claim_token, "
    "NEW.claim_token, OLD.recovery_count, NEW.recovery_count, OLD.lease_until, {clock}"
)

_PG_TRIGGER = [
    f"""
    CREATE OR REPLACE FUNCTION fault_log_transition() RETURNS trigger AS $$
    BEGIN
        INSERT INTO fault_transitions ({_COLS}) VALUES ({
        _VALS.format(clock="CAST(floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)")
    });
        RETURN NEW;
    END $$ LANGUAGE plpgsql
    """,
    "DROP TRIGGER IF EXISTS fault_log_transition ON watchdog_jobs",
    """
    CREATE TRIGGER fault_log_transition AFTER UPDATE ON watchdog_jobs FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.outcome IS DISTINCT FROM NEW.outcome
          OR OLD.claim_token IS DISTINCT FROM NEW.claim_token
          OR OLD.recovery_count IS DISTINCT FROM NEW.recovery_count
          OR OLD.failure_reason IS DISTINCT FROM NEW.failure_reason
          OR OLD.payload_json IS DISTINCT FROM NEW.payload_json)
    EXECUTE FUNCTION fault_log_transition()
    """,
]

_SQLITE_TRIGGER = [
    "DROP TRIGGER IF EXISTS fault_log_transition",
    f"""
    CREATE TRIGGER fault_log_transition AFTER UPDATE ON watchdog_jobs FOR EACH ROW
    WHEN OLD.state IS NOT NEW.state OR OLD.outcome IS NOT NEW.outcome
         OR OLD.claim_token IS NOT NEW.claim_token
         OR OLD.recovery_count IS NOT NEW.recovery_count
         OR OLD.failure_reason IS NOT NEW.failure_reason
         OR OLD.payload_json IS NOT NEW.payload_json
    BEGIN
        INSERT INTO fault_transitions ({_COLS}) VALUES ({
        _VALS.format(clock="CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)")
    });
    END
    """,
]


_MYSQL_TRIGGER = [
    "DROP TRIGGER IF EXISTS fault_log_transition",
    f"""
    CREATE TRIGGER fault_log_transition AFTER UPDATE ON watchdog_jobs FOR EACH ROW
    BEGIN
        IF NOT (OLD.state <=> NEW.state) OR NOT (OLD.outcome <=> NEW.outcome)
           OR NOT (OLD.claim_token <=> NEW.claim_token)
           OR NOT (OLD.recovery_count <=> NEW.recovery_count)
           OR NOT (OLD.failure_reason <=> NEW.failure_reason)
           OR NOT (OLD.payload_json <=> NEW.payload_json) THEN
            INSERT INTO fault_transitions ({_COLS}) VALUES ({
        _VALS.format(clock="TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000")
    });
        END IF;
    END
    """,
]


def install_instrumentation(engine: Engine) -> None:
    """Create the audit and transition tables and the transition trigger."""
    fault_metadata.create_all(engine)
    statements_ = {"postgresql": _PG_TRIGGER, "mysql": _MYSQL_TRIGGER, "mariadb": _MYSQL_TRIGGER}.get(
        engine.dialect.name, _SQLITE_TRIGGER
    )
    with engine.begin() as conn:
        for ddl in statements_:
            conn.exec_driver_sql(ddl)


# -- reading the database ----------------------------------------------------


def dump_jobs(engine: Engine) -> list[dict[str, Any]]:
    """Every column of every row of ``watchdog_jobs``, in sequence order."""
    with engine.connect() as conn:
        rows = conn.execute(select(jobs_table).order_by(jobs_table.c.sequence)).mappings().all()
    return [dict(row) for row in rows]


def jobs_by_id(engine: Engine) -> dict[str, dict[str, Any]]:
    return {row["job_id"]: row for row in dump_jobs(engine)}


def audit_rows(engine: Engine, job_id: str | None = None) -> list[dict[str, Any]]:
    query = select(audit).order_by(audit.c.id)
    if job_id is not None:
        query = query.where(audit.c.job_id == job_id)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


def transition_rows(engine: Engine, job_id: str | None = None) -> list[dict[str, Any]]:
    query = select(transitions).order_by(transitions.c.id)
    if job_id is not None:
        query = query.where(transitions.c.job_id == job_id)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


def db_now_ms(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(sql.db_clock_ms())).scalar_one())


#: Other sessions of this database still running a statement: a SIGKILLed
#: worker's last statement runs on in the server (in autocommit it commits)
#: until the server notices the client gone. SQLite has no server.
_BUSY_SESSIONS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND state <> 'idle'",
    "mysql": "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
    " AND ID <> CONNECTION_ID() AND COMMAND <> 'Sleep'",
}


def wait_for_the_servers_statements(engine: Engine, timeout: float = 10.0) -> None:
    """Wait until no other session of ``engine``'s database runs a statement:
    once a worker is SIGKILLed, what its last statements did is then all
    committed or rolled back, and a read of the rows sees the end of it."""
    query = _BUSY_SESSIONS.get("mysql" if engine.dialect.name == "mariadb" else engine.dialect.name)
    if query is None:
        return

    def idle() -> bool:
        with engine.connect() as conn:
            return int(conn.execute(text(query)).scalar_one()) == 0

    wait_until(idle, timeout=timeout, what="the killed worker's statements to end in the server")


def assert_settled_exactly_once(engine: Engine, job_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Every job exists and is settled; the trigger saw exactly one transition
    into ``settled`` per job and no change at all after it."""
    wanted = set(job_ids)
    rows = jobs_by_id(engine)
    missing = wanted - set(rows)
    assert not missing, f"{len(missing)} job(s) lost: {sorted(missing)[:10]}"
    unsettled = {j: rows[j]["state"] for j in wanted if rows[j]["state"] != "settled"}
    assert not unsettled, f"{len(unsettled)} job(s) not settled: {dict(list(unsettled.items())[:10])}"
    log = transition_rows(engine)
    into = Counter(t["job_id"] for t in log if t["new_state"] == "settled" and t["old_state"] != "settled")
    twice = {j: n for j, n in into.items() if j in wanted and n != 1}
    assert not twice, f"settled more than once: {dict(list(twice.items())[:10])}"
    never = [j for j in wanted if into[j] != 1]
    assert not never, f"no settlement transition logged for {never[:10]}"
    after = [t for t in log if t["old_state"] == "settled"]
    assert not after, f"settled rows changed afterwards: {after[:5]}"
    return rows


def enqueue_jobs(engine: Engine, jobs: Sequence[Job], chunk: int = 1000) -> None:
    for start in range(0, len(jobs), chunk):
        with engine.begin() as conn:
            enqueue(conn, list(jobs[start : start + chunk]))


# -- polling -----------------------------------------------------------------


# -- worker processes --------------------------------------------------------


def url_string(url: URL | str) -> str:
    return url if isinstance(url, str) else url.render_as_string(hide_password=False)


class Worker:
    """A ``chaos_worker.py`` process running ``Runner.run_forever``."""

    def __init__(self, url: URL | str, log_dir: Path, name: str, **options: Any) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        args = [sys.executable, str(WORKER_SCRIPT), "--url", url_string(url), "--name", name]
        for key, value in options.items():
            if value is None or value is False:
                continue
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    args += [flag, str(item)]
            else:
                args += [flag, str(value)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.pid = self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int) -> None:
        if self.alive:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait(self, timeout: float) -> int:
        """Its exit code once it exits within ``timeout``; else a failure
        with every thread's stack (SIGUSR1: ``faulthandler``) and its log."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.send(signal.SIGUSR1)
            time.sleep(1.0)
            raise AssertionError(
                f"worker {self.name} (pid {self.pid}) still running {timeout}s later; its threads and log:\n"
                + self.log_text()[-12000:]
            ) from None

    def log_text(self) -> str:
        self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout: float = 60) -> None:
        wait_until(
            lambda: "chaos-worker ready" in self.log_text() or not self.alive,
            timeout=timeout,
            what=f"worker {self.name} to start",
        )
        assert self.alive, f"worker {self.name} died at start:\n{self.log_text()[-3000:]}"

    def close(self) -> None:
        if self.alive:
            # SIGCONT first: a stopped process cannot die of SIGKILL until resumed on some kernels.
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=30)
        finally:
            self._log.close()


class WorkerPool:
    """Starts workers for one test and reaps every one of them at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.workers: list[Worker] = []

    def start(self, url: URL | str, name: str, **options: Any) -> Worker:
        worker = Worker(url, self.log_dir, name, **options)
        self.workers.append(worker)
        return worker

    def logs(self) -> str:
        return "\n".join(f"--- {w.name} (pid {w.pid}) ---\n{w.log_text()[-4000:]}" for w in self.workers)

    def wait_until(
        self, predicate: Callable[[], T | None], *, timeout: float, what: str, state: Callable[[], object] | None = None
    ) -> T:
        """:func:`wait_until`; on a timeout the failure also says what every
        live worker was doing -- its threads' stacks (SIGUSR1: faulthandler)
        and the tail of its log -- and ``state()`` if given (the rows): a
        worker stuck, or failing and retrying, says so in the report itself
        (pytest's temporary directories, where the logs are, do not outlive
        a few more runs)."""
        try:
            return wait_until(predicate, timeout=timeout, what=what)
        except AssertionError as error:
            for worker in self.workers:
                worker.send(signal.SIGUSR1)
            time.sleep(1.0)
            seen = f"\n{state()}" if state is not None else ""
            raise AssertionError(f"{error}{seen}\n{self.logs()}") from None

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


def iter_chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- a database clock the test controls ---------------------------------------

fault_clock = Table(
    "fault_clock",
    fault_metadata,
    Column("id", Integer, primary_key=True),
    Column("ms", BigInteger, nullable=False),
)


def _clock_from_table(element: Any, compiler: Any, **kw: Any) -> str:
    return "(SELECT ms FROM fault_clock WHERE id = 1)"


@contextlib.contextmanager
def controlled_db_clock(url: URL | str, start_ms: int) -> Iterator[tuple[Engine, Callable[[int], None]]]:
    """An engine on ``url`` whose statements read the database clock from the
    one-row table ``fault_clock`` instead of the real clock, and a function
    setting that clock.

    It swaps the SQL that :class:`sql.db_clock_ms` compiles to for the
    duration (restoring it after) and uses a fresh engine, so no statement
    compiled with the real clock is reused from a cache. The library code is
    unchanged: every lease comparison still happens inside its statements.
    """
    dispatcher = sql.db_clock_ms.__dict__["_compiler_dispatcher"]
    saved = dict(dispatcher.specs)
    for dialect in ("postgresql", "sqlite", "mysql", "mariadb"):
        dispatcher.specs[dialect] = _clock_from_table
    engine = create_engine(url)
    try:
        fault_clock.create(engine, checkfirst=True)
        with engine.begin() as conn:
            conn.execute(fault_clock.delete())
            conn.execute(fault_clock.insert().values(id=1, ms=start_ms))

        def set_clock(ms: int) -> None:
            with engine.begin() as conn:
                conn.execute(fault_clock.update().where(fault_clock.c.id == 1).values(ms=ms))

        yield engine, set_clock
    finally:
        dispatcher.specs.clear()
        dispatcher.specs.update(saved)
        engine.dispose()


def first_ended_audit_row(engine: Engine, job_id: str) -> dict[str, Any] | None:
    """The first audit row of ``job_id`` once its handler has returned, else None."""
    rows = audit_rows(engine, job_id)
    return rows[0] if rows and rows[0]["ended_ms"] is not None else None
