"""The benchmark harness: subjects, databases, child processes, timing and tables. Scenario modules
import only this module and declare scenarios with :func:`scenario`; ``cli.py`` runs them through
one :class:`Bench`, whose figures go into named tables (median (min-max) over the repeats)."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import contextlib
import gc
import importlib
import inspect
import json
import logging
import math
import os
import queue
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import psycopg
from psycopg import sql as pgsql
from sqlalchemy import BigInteger, Integer, Text, create_engine, event, make_url, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_watchdog import Job, Retention, Runner, enqueue, metadata
from sqlalchemy_watchdog import Watchdog as Client

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ADMIN_DSN = os.environ.get("WATCHDOG_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
#: The MariaDB (or MySQL) server, a SQLAlchemy URL of any database on it: the run creates its own there.
MYSQL_SERVER = os.environ.get("WATCHDOG_BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
DB_PREFIX = "watchdog_bench_"
QUEUE = "bench"
#: The dialects of a scenario that does not say which it supports.
DIALECTS = ("postgresql", "sqlite")
#: The dialects of the enqueue, drain and latency rows (watchdog only on MariaDB, as on SQLite).
QUEUE_DIALECTS = ("postgresql", "sqlite", "mariadb")
LABEL = {"postgresql": "PostgreSQL", "sqlite": "SQLite", "mariadb": "MariaDB"}  # a dialect in a table's title
#: The database clock in epoch milliseconds, as the library reads it.
CLOCK_SQL = {
    "postgresql": "CAST(floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)",
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    "mariadb": "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)",
}
DAY_MS = 86_400_000


class ScenarioTimeout(RuntimeError):
    """A measurement did not finish within its time limit."""


class ScenarioFailed(RuntimeError):
    """A measurement finished but its result is wrong (e.g. jobs missing)."""


# -- databases ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One database: PostgreSQL (``dsn`` a libpq URL), a SQLite file (``dsn`` its path) or a MariaDB
    database (``dsn`` its SQLAlchemy URL, :data:`MYSQL_SERVER`'s driver)."""

    dialect: str
    dsn: str
    name: str

    @property
    def url(self) -> str:
        if self.dialect == "sqlite":
            return f"sqlite:///{self.dsn}"
        if self.dialect == "mariadb":
            return self.dsn
        return "postgresql+psycopg://" + self.dsn.split("://", 1)[1]

    @property
    def async_url(self) -> str:
        """The URL of an async engine: psycopg's async mode, aiomysql, aiosqlite."""
        if self.dialect == "mariadb":
            url = make_url(self.dsn)
            return url.set(drivername=f"{url.get_backend_name()}+aiomysql").render_as_string(hide_password=False)
        return f"sqlite+aiosqlite:///{self.dsn}" if self.dialect == "sqlite" else self.url


_created: list[Target] = []


def _admin(statement: str, name: str) -> None:
    """``statement`` (``{}``: the database ``name``) on the server, in autocommit."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(pgsql.SQL(statement).format(pgsql.Identifier(name)))


def mysql_connect(url: str = MYSQL_SERVER, database: str | None = None, **options: Any) -> Any:
    """A PyMySQL connection in autocommit to the database of ``url`` (``database``: that one instead;
    ``""``: none), whatever the URL's driver (``mysql+pymysql``, ``mariadb+pymysql``). PyMySQL is
    imported here: a run without MariaDB needs only the ``bench`` extra, MariaDB's the ``mysql`` one too."""
    import pymysql

    parsed = make_url(url)
    return pymysql.connect(
        host=parsed.host or "127.0.0.1", port=parsed.port or 3306, user=parsed.username or "root",
        password=parsed.password or "", database=(parsed.database if database is None else database) or None,
        autocommit=True, **options,
    )  # fmt: skip


def mysql_unreachable() -> str | None:
    """Why the MariaDB server (:data:`MYSQL_SERVER`) cannot be used, or None."""
    try:
        with contextlib.closing(mysql_connect(database="", connect_timeout=5)) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT 1")
    except ImportError as error:
        return f"{error} (pip install -e '.[bench,mysql]')"
    except Exception as error:
        return f"MariaDB at {make_url(MYSQL_SERVER).render_as_string()} is not reachable ({error}); set WATCHDOG_BENCH_MYSQL"
    return None


def _admin_mysql(name: str, create: bool) -> None:
    """Drop the MariaDB database ``name`` (ending the connections still on it first), then create it afresh."""
    with contextlib.closing(mysql_connect(database="")) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()", name)
        for (pid,) in cursor.fetchall():
            with contextlib.suppress(Exception):  # it ended meanwhile
                cursor.execute(f"KILL CONNECTION {int(pid)}")
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        if create:
            cursor.execute(f"CREATE DATABASE `{name}`")


def drop(*targets: Target) -> None:
    """Drop the run's databases (never anyone else's) and delete its SQLite files."""
    for target in targets:
        if target.dialect == "sqlite":
            Path(target.dsn).unlink(missing_ok=True)
            continue
        assert target.name.startswith(DB_PREFIX), target.name
        try:
            if target.dialect == "mariadb":
                _admin_mysql(target.name, create=False)
            else:
                _admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", target.name)
        except Exception as error:  # pragma: no cover - best effort
            print(f"warning: could not drop {target.name}: {error}", file=sys.stderr)
        if target in _created:
            _created.remove(target)


def run_sql(target: Target, statement: str, params: dict[str, Any] | None = None, *, analyse: bool = False) -> Any:
    """One statement (``:name`` parameters) in autocommit: the first column of its first row, if any.
    ``analyse``: then what autovacuum would do to a table grown this big (VACUUM (ANALYZE); SQLite ANALYZE;
    MariaDB ANALYZE TABLE). On MariaDB ``||`` concatenates (``PIPES_AS_CONCAT``), as on the others."""
    if target.dialect == "mariadb":
        with contextlib.closing(mysql_connect(target.dsn)) as maria, maria.cursor() as cursor:
            cursor.execute("SET SESSION sql_mode = CONCAT(@@sql_mode, ',PIPES_AS_CONCAT')")
            cursor.execute(re.sub(r"(?<!:):(\w+)", r"%(\1)s", statement), params or None)
            row = cursor.fetchone() if cursor.description else None
            if analyse:
                cursor.execute("ANALYZE TABLE watchdog_jobs")
            return row[0] if row else None
    if pg := target.dialect == "postgresql":
        conn: Any = psycopg.connect(target.dsn, autocommit=True)
    else:
        conn = sqlite3.connect(target.dsn, isolation_level=None, timeout=60)
    with contextlib.closing(conn):
        cursor = conn.execute(re.sub(r"(?<!:):(\w+)", r"%(\1)s", statement) if pg else statement, params or {})
        row = cursor.fetchone() if cursor.description else None
        if analyse:
            conn.execute("VACUUM (ANALYZE) watchdog_jobs" if pg else "ANALYZE")
        return row[0] if row else None


def insert_jobs(target: Target, rows: int, columns: dict[str, str], *, analyse: bool = True, **params: Any) -> float:
    """Seconds for ``rows`` jobs in one ``INSERT ... SELECT`` over ``n`` = 1..rows, each column an SQL
    expression of ``n`` (``:queue`` the benchmark's queue, ``{clock}`` the database clock, :data:`CLOCK_SQL`);
    ``analyse`` as :func:`run_sql`'s."""
    numbers = "generate_series(1, :rows) AS g(n)"
    if target.dialect == "sqlite":
        numbers = "(WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < :rows) SELECT n FROM g)"
    elif target.dialect == "mariadb":  # the SEQUENCE engine's table (a recursive CTE stops at 1,000 rows)
        numbers = f"(SELECT seq AS n FROM seq_1_to_{int(rows)}) AS g"
    sql = f"INSERT INTO watchdog_jobs ({', '.join(columns)}) SELECT {', '.join(columns.values())} FROM {numbers}"
    sql = sql.replace("{clock}", CLOCK_SQL[target.dialect])
    if target.dialect == "mariadb":  # no CAST(... AS TEXT) there
        sql = sql.replace(" AS TEXT)", " AS CHAR)")
    started = time.perf_counter()
    run_sql(target, sql, {"rows": rows, "queue": QUEUE, **params}, analyse=analyse)
    return time.perf_counter() - started


def job_rows(prefix: str, state: str = "settled", at: str | None = None, **columns: str) -> dict[str, str]:
    """:func:`insert_jobs` columns of jobs ``<prefix>-n``: settled ones completed (``at``: settled then,
    SQL epoch ms, started 1 s and enqueued 2 s before); ``columns`` add to or replace these."""
    # CAST: one parameter for two columns of different domains (PostgreSQL, w0016) must carry its type.
    queue = "CAST(:queue AS TEXT)"
    rows = {"job_id": f"'{prefix}-' || n", "queue_name": queue, "lane": queue, "priority": "0"}
    rows |= {"payload_json": "'{\"i\":' || n || '}'", "state": f"'{state}'"}
    if state == "settled":
        rows |= {"outcome": "'completed'", "claim_token": f"'claim_{prefix}_' || n"}
    if at:
        rows |= {"enqueued_at": f"{at} - 2000", "started_at": f"{at} - 1000", "settled_at": at}
    return rows | columns


#: Settled completed jobs of the benchmark's queue (no times): the claim's history.
SETTLED = job_rows("history")
#: The ``outcome`` column of a history with one job in 20 failed.
FAILED_1_IN_20 = "CASE WHEN mod(n, 20) = 0 THEN 'failed' ELSE 'completed' END"


def truncate(target: Target) -> None:
    """Empty every table of a benchmark-owned database (resetting sequences)."""
    if target.dialect == "sqlite":
        run_sql(target, "DELETE FROM watchdog_jobs")
        return
    assert target.name.startswith(DB_PREFIX), target.name
    if target.dialect == "mariadb":
        with contextlib.closing(mysql_connect(target.dsn)) as conn, conn.cursor() as cursor:
            cursor.execute("SHOW FULL TABLES WHERE Table_type = 'BASE TABLE'")
            names = [r[0] for r in cursor.fetchall()]
            cursor.execute("SET SESSION foreign_key_checks = 0")
            for name in names:
                cursor.execute(f"TRUNCATE TABLE `{name}`")
        return
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        if names := [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]:
            tables = pgsql.SQL(", ").join(pgsql.Identifier(n) for n in names)
            conn.execute(pgsql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(tables))


def engine(target: Target, pool_size: int = 5) -> Any:
    return create_engine(target.url, pool_size=pool_size, max_overflow=10)


@contextlib.contextmanager
def disposed(eng: Any) -> Iterator[Any]:
    """``with disposed(engine(target)) as eng``: an engine, disposed at the end of the block."""
    try:
        yield eng
    finally:
        eng.dispose()


def install_watchdog(target: Target, fresh: bool = False) -> None:
    with disposed(engine(target)) as eng:
        if fresh:
            metadata.drop_all(eng)
        metadata.create_all(eng)


# -- child processes ---------------------------------------------------------------------

_children: list[Child] = []


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def decode(text: str) -> dict[str, Any]:
    """A role's keywords from their JSON (see :class:`Child`), a :class:`Target` among them as one."""
    return json.loads(text, object_hook=lambda d: Target(**d["__target__"]) if "__target__" in d else d)  # type: ignore[no-any-return]


class Child:
    """A child process in its own process group running ``func(**kwargs)`` (the keywords as JSON). Its
    stdout is read on a thread: ``READY`` says it is set up, ``START <key> <epoch s>`` reports a handler
    start, ``RESULT <json>`` its result; everything else and stderr go to ``log``."""

    def __init__(self, log: Path, func: Callable[..., Any], **kwargs: Any) -> None:
        self.log_path, self._log = log, open(log, "w", buffering=1)
        self.ready, self.results = threading.Event(), list[Any]()
        self.wakeup: tuple[float, str] | None = None  # a worker's (poll_interval_s, its wake-ups), if it said
        self.starts: queue.Queue[tuple[str, float]] = queue.Queue()
        role = json.dumps(kwargs, default=lambda o: {"__target__": asdict(o)})
        argv = [sys.executable, "-m", "benchmarks", "--role", f"{func.__module__}:{func.__name__}", role]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
            text=True, bufsize=1, env=child_env(), start_new_session=True, cwd=str(ROOT),
        )  # fmt: skip
        _children.append(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout or ():
            if line.startswith("START "):
                _, key, at = line.split()
                self.starts.put((key, float(at)))
            elif line.startswith("READY"):
                self.ready.set()
            elif line.startswith("RESULT "):
                self.results.append(json.loads(line[7:]))
            elif line.startswith("WAKEUP "):
                poll, how = line[7:].rstrip("\n").split(" ", 1)
                self.wakeup = (float(poll), how)
            else:
                self._log.write(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if not self.alive():
                raise ScenarioFailed(f"child exited with {self.proc.returncode} before it was ready; {self.tail()}")
            if time.monotonic() > deadline:
                raise ScenarioTimeout(f"child not ready after {timeout:.0f}s; {self.tail()}")

    def result(self, timeout: float) -> Any:
        """Wait for the child to exit; its ``RESULT``."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ScenarioTimeout(f"child still running after {timeout:.0f}s; {self.tail()}") from None
        self._reader.join(5)
        if not self.results:
            raise ScenarioFailed(f"child exited with {self.proc.returncode} and no result; {self.tail()}")
        return self.results[-1]

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            self._log.flush()
            text = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
            return f"log {self.log_path}:\n    " + "\n    ".join(text)
        return f"(no log {self.log_path})"

    def terminate(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (each queue's graceful shutdown), then SIGKILL the group."""
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self._reader.join(timeout=2)
        self._log.close()
        if self in _children:
            _children.remove(self)


def stop_all(children: Sequence[Child]) -> None:
    """Stop several children at once (they shut down in parallel)."""
    for child in children:
        child.terminate()
    for child in children:
        child.stop()


@atexit.register
def _cleanup() -> None:
    for child in list(_children):
        child.stop(5)
    drop(*_created)


def exit_with_parent() -> None:
    """In a child: shut down (SIGTERM to itself) if the benchmark process dies."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(20.0)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def say(tag: str, value: Any = "") -> None:
    """In a child: one line to the parent (``READY``, ``START key time``, ``RESULT json``)."""
    print(f"{tag} {json.dumps(value) if tag == 'RESULT' else value}".rstrip(), flush=True)


def poll_until(
    check: Callable[[], bool], *, timeout: float, interval: float, what: str, children: Sequence[Child] = ()
) -> float:
    """Call ``check`` every ``interval`` until it is true; returns perf_counter() then."""
    deadline_at = time.perf_counter() + timeout
    while True:
        now = time.perf_counter()
        if check():
            return time.perf_counter()
        if now > deadline_at:
            raise ScenarioTimeout(f"{what}: not done after {timeout:.0f}s")
        if dead := [child for child in children if not child.alive()]:
            raise ScenarioFailed(f"{what}: a child died ({dead[0].proc.returncode}); {dead[0].tail()}")
        time.sleep(interval)


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`ScenarioTimeout` in the main thread after ``seconds`` (SIGALRM)."""

    def expire(signum: int, frame: Any) -> None:
        raise ScenarioTimeout(f"{what}: gave up after {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def serve_in_thread(runner: Any) -> Callable[[], None]:
    """Serve a ``Runner`` (an ``AsyncRunner`` on an event loop of its own) on a thread; returns its stop()."""
    if inspect.iscoroutinefunction(runner.run_forever):
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_until_complete, args=(runner.run_forever(),), daemon=True)
        stop = lambda: loop.call_soon_threadsafe(runner.stop)
    else:
        thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False}, daemon=True)
        stop = runner.stop
    thread.start()

    def stopped() -> None:
        stop()
        thread.join(60)

    return stopped


def drain_idle(subject: Any, target: Target, n: int, tag: str, warm: int, children: Sequence[Child] = ()) -> float:
    """jobs/s of idle workers (``children``, or a runner on a thread) after ``warm`` jobs drained so every
    worker has connected and is idle again; the timing: README.md, "What each figure means", the drain row."""
    with contextlib.closing(Probe(subject, target)) as probe:
        idle = lambda: not probe.live()
        time.sleep(0.3)  # a moment to reach the LISTEN
        subject.prefill(target, warm, f"{tag}-warm")
        poll_until(idle, timeout=60, interval=0.01, what="warm-up", children=children)
        before, started = probe.completed(), subject.prefill(target, n, tag)
        interval = 0.02 if target.dialect == "sqlite" else 0.005
        finished = poll_until(idle, timeout=60 + n / 20, interval=interval, what="drain", children=children)
        if (done := probe.completed() - before) != n:
            raise ScenarioFailed(f"drain: {done} of {n} jobs completed")
        return n / (finished - started)


def drain_here(target: Target, runner: Any, jobs: int, prefill: bool = True) -> float:
    """jobs/s of ``runner`` on a thread of this process draining ``jobs`` jobs of one transaction: enqueued
    before it starts (the clock from its start) or, ``prefill=False``, while it idles (:func:`drain_idle`)."""
    if not prefill:
        stop = serve_in_thread(runner)
        try:
            return drain_idle(Watchdog(), target, jobs, "drain", 2)
        finally:
            stop()
    Watchdog().prefill(target, jobs, "drain")
    started, stop, probe = time.perf_counter(), serve_in_thread(runner), Probe(Watchdog(), target)
    with contextlib.closing(probe):
        finished = poll_until(lambda: not probe.live(), timeout=60 + jobs / 20, interval=0.005, what="drain")
        stop()
        if (done := probe.completed()) != jobs:
            raise ScenarioFailed(f"drain: {done} jobs completed")
        return jobs / (finished - started)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


# -- statistics --------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(p / 100 * len(ordered)))) - 1]


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else None


def percentiles(values: Sequence[float], ps: Sequence[int] = (50, 95, 99), name: str = "p{} (ms)") -> dict[str, float]:
    """The nearest-rank percentiles of ``values`` keyed ``p50 (ms)`` and so on."""
    return {name.format(p): percentile(values, p) for p in ps}


def rotate(items: Sequence[Any], r: int) -> list[Any]:
    """``items`` rotated by ``r`` (per repeat or round, so that none always goes first)."""
    shift = r % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


def time_calls(call: Callable[[], Any], calls: int, warmup: int = 3) -> list[float]:
    """``call()`` timed ``calls`` times after ``warmup`` untimed calls (ms each)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000.0)
    return times


def fmt(value: float | None, like: float | None = None) -> str:
    """A figure with 3 significant digits or so (``like``: as many decimals as that figure)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if value in (math.inf, 0):
        return "inf" if value else "0"
    size = abs(value if like is None or like in (math.inf, 0) else like)
    return f"{value:,.{0 if size >= 100 else 1 if size >= 10 else 2 if size >= 1 else 3}f}"


# -- the subjects ------------------------------------------------------------------------
#
# Each offers the same operations, so a scenario can put one workload through every queue: install,
# reset, enqueue_single (n jobs, a transaction each), enqueue_batch (batches x size, a call each)
# -> seconds; prefill (n jobs, one transaction) -> perf_counter() after its commit; live_sql and
# completed_sql (for :class:`Probe`); client(target) (.enqueue(key) -> time.time() after the
# commit; .close()); worker_main (a worker process: READY once set up; with ``latency`` its
# handler prints START <key> <time>).


class _PlainBase(DeclarativeBase):
    pass


class _PlainRow(_PlainBase):
    """An application's own row: the baseline of an enqueue in the caller's Session."""

    __tablename__ = "bench_rows"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    data: Mapped[str] = mapped_column(Text)


class Watchdog:
    """sqlalchemy_watchdog, on PostgreSQL, SQLite and MariaDB, through its sync SQLAlchemy API."""

    dialects, table = QUEUE_DIALECTS, "watchdog_jobs"
    live_sql = "SELECT EXISTS (SELECT 1 FROM watchdog_jobs WHERE state IN ('queued', 'running'))"
    completed_sql = "SELECT count(*) FROM watchdog_jobs WHERE state = 'settled' AND outcome = 'completed'"
    #: MariaDB has no partial index of the live jobs: without the queue, the probe reads every job's
    #: entry of ix_watchdog_jobs_live_queue (3 ms at 5,000 settled jobs, every 5 ms of a drain);
    #: with it, one range of that index (0.3 ms).
    live_sql_of: ClassVar[dict[str, str]] = {
        "mariadb": live_sql.replace("WHERE state", f"WHERE queue_name = '{QUEUE}' AND state")
    }

    install, reset = staticmethod(install_watchdog), staticmethod(truncate)

    @staticmethod
    def jobs(tag: str, n: int) -> list[Any]:
        return [Job(f"{tag}-{i}", QUEUE, payload={"i": i}) for i in range(n)]

    def enqueue_single(self, target: Target, n: int, tag: str) -> float:
        """``Watchdog(engine).enqueue(job)``: the peers' stand-alone enqueue calls."""
        return self.enqueue_batch(target, n, 1, tag, standalone=True)

    def session_add_single(self, target: Target, n: int, tag: str) -> float:
        """The baseline of an enqueue in the caller's Session, no queue at all: ``n`` transactions that
        each ``session.add`` one row of an application's own table (``bench_rows``) and commit."""
        with disposed(engine(target)) as eng:
            _PlainBase.metadata.drop_all(eng)
            _PlainBase.metadata.create_all(eng)
            with Session(eng) as session:  # warm the pool and the ORM, as for the enqueue rows
                session.add(_PlainRow(name=f"{tag}-warm", data="{}"))
                session.commit()
            started = time.perf_counter()
            for i in range(n):
                with Session(eng) as session:
                    session.add(_PlainRow(name=f"{tag}-{i}", data=json.dumps({"i": i})))
                    session.commit()
            return time.perf_counter() - started

    def enqueue_batch(
        self, target: Target, batches: int, size: int, tag: str, through: Any = None, standalone: bool = False
    ) -> float:
        """Seconds for ``batches`` transactions of ``size`` jobs, each one ``enqueue(session, ...)`` call
        (``through``: the caller's engine, e.g. through a pooler; ``standalone``: ``Watchdog(engine).enqueue``)."""
        eng = through or engine(target)
        commit = Client(eng).enqueue if standalone else partial(self.commit_jobs, eng)
        try:
            commit(Job(f"{tag}-warm", QUEUE))  # warm the pool, as a long-lived application is
            started = time.perf_counter()  # building the jobs is timed, as with the peers' calls
            for b in range(batches):
                jobs = [Job(f"{tag}-{b}-{i}", QUEUE, payload={"i": i}) for i in range(size)]
                commit(jobs[0] if size == 1 else jobs)
            return time.perf_counter() - started
        finally:
            if through is None:
                eng.dispose()

    def prefill(self, target: Target, n: int, tag: str) -> float:
        with disposed(engine(target)) as eng:
            return self.commit_jobs(eng, self.jobs(tag, n))

    @staticmethod
    def commit_jobs(eng: Any, jobs: Any) -> float:
        """``enqueue(session, jobs)`` + commit; perf_counter() after the commit."""
        with Session(eng) as session:
            enqueue(session, jobs)
            session.commit()
            return time.perf_counter()

    def claim_settle(self, target: Target, jobs: int, tag: str) -> float:
        """ms per job of ``Runner.run_until_idle()`` claiming and settling ``jobs`` + 1 new jobs."""
        self.enqueue_batch(target, 1, jobs, tag)  # plus one warm-up job
        with disposed(engine(target)) as eng:
            runner = Runner(eng, {QUEUE: lambda job: None}, poll_interval=timedelta(seconds=1))
            started = time.perf_counter()
            settled = runner.run_until_idle()
            elapsed = time.perf_counter() - started
        if len(settled) != jobs + 1:
            raise ScenarioFailed(f"settled {len(settled)} of {jobs + 1} jobs")
        return elapsed / (jobs + 1) * 1000.0

    def client(self, target: Target) -> Any:
        eng = engine(target)

        def enqueue(key: str, run_at: Any = None) -> float:
            self.commit_jobs(eng, Job(key, QUEUE, payload={"k": key}, run_at=run_at))
            return time.time()

        return SimpleNamespace(enqueue=enqueue, close=eng.dispose)

    def worker_main(
        self, target: Target, concurrency: int = 1, defaults: bool = False, latency: bool = False,
        use_asyncio: bool = False, retention_days: int | None = None, count_sql: bool = False,
        work_ms: float = 0.0, claim_ahead: int | None = None,
    ) -> None:  # fmt: skip
        """``Runner`` (``defaults``: ``Runner(engine, handlers)`` on ``create_engine(url)``; else a pool of
        concurrency + 3), or ``AsyncRunner`` over an async engine. ``count_sql``: ``SQLCOUNT n words``
        to stderr at exit, the statements sent by their first words. ``work_ms``: each handler sleeps
        that long (I/O-like work that releases the GIL); ``claim_ahead``: the runner's option."""
        logging.basicConfig(level=logging.WARNING)
        if count_sql:
            counts: collections.Counter[str] = collections.Counter()
            count = lambda conn, cursor, sql, *rest: counts.update([re.sub(r"\s+", " ", sql.strip())[:60]])
            event.listen(Engine, "before_cursor_execute", count)
            atexit.register(
                lambda: [print(f"SQLCOUNT {n} {w}", file=sys.stderr, flush=True) for w, n in counts.most_common()]
            )
        if use_asyncio:
            from sqlalchemy.ext.asyncio import create_async_engine

            from sqlalchemy_watchdog.asyncio import AsyncRunner

            async def work(job: Any) -> None:
                await asyncio.sleep(work_ms / 1000.0)

            async def main() -> None:
                eng = create_async_engine(target.async_url)
                async with eng.connect() as conn:
                    await conn.execute(text("SELECT 1"))
                say("READY")
                extra: dict[str, Any] = {} if claim_ahead is None else {"claim_ahead": claim_ahead}
                try:
                    await AsyncRunner(
                        eng, {QUEUE: work if work_ms else anoop}, concurrency=concurrency, **extra
                    ).run_forever()
                finally:
                    await eng.dispose()

            return asyncio.run(main())

        def handler(job: Any) -> None:
            if latency:
                say("START", f"{job.job_id} {time.time():.6f}")
            if work_ms:
                time.sleep(work_ms / 1000.0)

        options: dict[str, Any] = {} if defaults else {"concurrency": concurrency}
        if claim_ahead is not None:
            options["claim_ahead"] = claim_ahead
        if retention_days is not None:
            options["retention"] = Retention(completed=timedelta(days=retention_days))
        eng = create_engine(target.url) if defaults else engine(target, pool_size=concurrency + 3)
        runner = Runner(eng, {QUEUE: handler}, **options)
        with eng.connect() as conn:
            conn.execute(text("SELECT 1"))
        if latency:
            threading.Thread(target=report_wakeups, args=(runner,), daemon=True).start()
        say("READY")
        runner.run_forever()
        eng.dispose()


def report_wakeups(runner: Any) -> None:
    """In a worker child: ``WAKEUP <poll_interval_s> <how>`` once ``run_forever`` has chosen its wake-ups
    (LISTEN/NOTIFY, or polling and why): :attr:`Child.wakeup`."""
    while (status := runner.wakeup_status).reason == "not started":
        time.sleep(0.01)
    say("WAKEUP", f"{status.poll_interval_s} {status}")


async def anoop(job: Any) -> None:
    """The no-op handler of an ``AsyncRunner``."""


class _AsyncPeer:
    """A peer through its asyncio API: ``_open(dsn)`` -> (handle, its async close), ``_one(handle, i or
    key)`` enqueues one job (its own transaction), ``_many(handle, n)`` n in one call."""

    dialects = ("postgresql",)
    reset = staticmethod(truncate)

    def _run(self, target: Target, work: Callable[[Any], Any]) -> Any:
        async def go() -> Any:
            handle, close = await self._open(target.dsn)  # type: ignore[attr-defined]
            try:
                return await work(handle)
            finally:
                await close()

        return asyncio.run(go())

    def enqueue_single(self, target: Target, n: int, tag: str) -> float:
        return self.enqueue_batch(target, n, 0, tag)

    def enqueue_batch(self, target: Target, batches: int, size: int, tag: str) -> float:
        """``batches`` calls of ``size`` jobs (size 0: one job per call), after a warm-up job."""

        async def work(handle: Any) -> float:
            await self._one(handle, -1)  # type: ignore[attr-defined]
            started = time.perf_counter()
            for i in range(batches):
                await (self._many(handle, size) if size else self._one(handle, i))  # type: ignore[attr-defined]
            return time.perf_counter() - started

        return float(self._run(target, work))

    def prefill(self, target: Target, n: int, tag: str) -> float:
        async def work(handle: Any) -> float:
            await self._many(handle, n)  # type: ignore[attr-defined]
            return time.perf_counter()

        return float(self._run(target, work))

    def client(self, target: Target) -> Any:
        loop = asyncio.new_event_loop()
        handle, close = loop.run_until_complete(self._open(target.dsn))  # type: ignore[attr-defined]

        def enqueue(key: str) -> float:
            loop.run_until_complete(self._one(handle, key))  # type: ignore[attr-defined]
            return time.time()

        return SimpleNamespace(enqueue=enqueue, close=lambda: [loop.run_until_complete(close()), loop.close()])


class Procrastinate(_AsyncPeer):
    """procrastinate as its documentation sets it up (``App(PsycopgConnector)``, an ``async def`` task,
    ``run_worker_async``: concurrency 1 by default). Jobs stay as ``succeeded`` rows."""

    table = "procrastinate_jobs"
    live_sql = "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
    completed_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"

    @staticmethod
    def app(dsn: str, latency: bool = False, **pool: Any) -> tuple[Any, Any]:
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, **pool))

        @app.task(queue=QUEUE, name="bench")
        async def bench(i: int | None = None, k: str | None = None) -> None:
            if latency and k is not None:
                say("START", f"{k} {time.time():.6f}")

        return app, bench

    async def _open(self, dsn: str) -> tuple[Any, Any]:
        app, task = self.app(dsn)
        await app.open_async()
        return (app, task), app.close_async

    async def _one(self, handle: Any, i: int | str) -> None:
        await handle[1].defer_async(**{"k" if isinstance(i, str) else "i": i})

    async def _many(self, handle: Any, n: int) -> None:
        await handle[1].batch_defer_async(*({"i": i} for i in range(n)))

    def install(self, target: Target) -> None:
        self._run(target, lambda handle: handle[0].schema_manager.apply_schema_async())

    def worker_main(self, target: Target, concurrency: int = 1, defaults: bool = False, latency: bool = False) -> None:
        pool = {} if defaults else {"min_size": min(4, concurrency + 2), "max_size": max(4, concurrency + 2)}
        app, _ = self.app(target.dsn, latency=latency, **pool)
        options = {"queues": [QUEUE], "install_signal_handlers": True} | (
            {} if defaults else {"concurrency": concurrency}
        )

        async def go() -> None:
            async with app.open_async():
                say("READY")
                await app.run_worker_async(**options)

        asyncio.run(go())


class PgQueuer(_AsyncPeer):
    """pgqueuer as its README sets it up (``Queries.install()`` = ``pgq install``, workers by
    ``pgqueuer.run(factory)`` = ``pgq run`` on uvloop). Completed jobs move to ``pgqueuer_log``."""

    table = "pgqueuer"
    live_sql = "SELECT EXISTS (SELECT 1 FROM pgqueuer)"
    # The log aggregation counts log rows into statistics and marks them aggregated:
    # count each completed job once, as a log row or in the statistics.
    completed_sql = (
        "SELECT (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful' AND NOT aggregated)"
        " + (SELECT coalesce(sum(count), 0) FROM pgqueuer_statistics WHERE status = 'successful')"
    )

    async def _open(self, dsn: str) -> tuple[Any, Any]:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(dsn)
        return Queries(AsyncpgDriver(conn)), conn.close

    async def _one(self, queries: Any, i: int | str) -> None:
        await queries.enqueue(QUEUE, i.encode() if isinstance(i, str) else b'{"i":%d}' % i)

    async def _many(self, queries: Any, n: int) -> None:
        await queries.enqueue([QUEUE] * n, [b'{"i":%d}' % i for i in range(n)], [0] * n)

    def install(self, target: Target) -> None:
        self._run(target, lambda queries: queries.install())

    def worker_main(self, target: Target, concurrency: int = 1, defaults: bool = False, latency: bool = False) -> None:
        import asyncpg
        import pgqueuer
        import uvloop
        from pgqueuer.db import AsyncpgDriver

        @contextlib.asynccontextmanager
        async def factory() -> AsyncIterator[Any]:
            conn = await asyncpg.connect(target.dsn)
            app = pgqueuer.PgQueuer(AsyncpgDriver(conn))

            @app.entrypoint(QUEUE)
            async def bench(job: Any) -> None:
                if latency:
                    say("START", f"{job.payload.decode()} {time.time():.6f}")

            say("READY")
            try:
                yield app
            finally:
                await conn.close()

        cap = max(2, concurrency)  # max_concurrent_tasks must be at least twice batch_size
        settings = {} if defaults else {"batch_size": max(1, min(10, cap // 2)), "max_concurrent_tasks": cap}
        uvloop.run(pgqueuer.run(factory, **settings))


SUBJECTS: dict[str, Callable[[], Any]] = {"watchdog": Watchdog, "procrastinate": Procrastinate, "pgqueuer": PgQueuer}


def worker_role(subject: str, target: Target, **options: Any) -> None:
    """The body of a worker child process."""
    SUBJECTS[subject]().worker_main(target, **options)


class Probe:
    """A connection answering ``live()`` (any job not yet finished?) and ``completed()``."""

    def __init__(self, subject: Any, target: Target) -> None:
        if target.dialect == "sqlite":
            self.conn: Any = sqlite3.connect(target.dsn, isolation_level=None, timeout=30)
        elif target.dialect == "mariadb":
            self.conn = _Cursoring(mysql_connect(target.dsn))
        else:
            self.conn = psycopg.connect(target.dsn, autocommit=True)
        live_sql = getattr(subject, "live_sql_of", {}).get(target.dialect, subject.live_sql)
        self.live: Callable[[], bool] = lambda: bool(self.conn.execute(live_sql).fetchone()[0])
        self.completed: Callable[[], int] = lambda: int(self.conn.execute(subject.completed_sql).fetchone()[0])
        self.close: Callable[[], None] = self.conn.close


class _Cursoring:
    """A PyMySQL connection with ``execute(sql)`` returning its cursor, as psycopg's and sqlite3's do."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, statement: str) -> Any:
        cursor = self._conn.cursor()
        cursor.execute(statement)
        return cursor

    def close(self) -> None:
        self._conn.close()


# -- scenarios and the run ---------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    run: Callable[..., None]
    help: str
    per_repeat: bool  # run(bench, r) once per repeat, interleaved with the others; else run(bench)
    suite: bool  # part of ``all``


SCENARIOS: dict[str, Scenario] = {}
#: Every scenario's options: flag -> (argparse type, or "store_true"; help). Each defaults to None:
#: the scenario that reads it picks its own default (:meth:`Bench.opt`).
OPTIONS: dict[str, tuple[Any, str]] = {
    "--apps": (int, "sqlite-load: app processes (default 2)"),
    "--backlog": (int, "in-process: jobs enqueued before the busy phase (default 2,000)"),
    "--batch": (str, "jobs per claim, pgbench and the library's runner alike (default 64)"),
    "--batch-sizes": (str, "hot-statements: jobs per claim statement (default 1,10,50)"),
    "--backlogs": (str, "growth: queued jobs of each cell, comma-separated (default 10000,1000000,5000000)"),
    "--batches": (int, "index-review: 1,000-job transactions per variant (default 40)"),
    "--clients": (str, "pgbench clients (comma-separated; default 2,4)"),
    "--concurrencies": (str, "drain concurrencies per worker (default 1,4,16,64; SQLite 1,4)"),
    "--concurrency": (int, "one runner's concurrency"),
    "--count-sql": ("store_true", "profile-drain: also count statements per job (SQLAlchemy's path)"),
    "--drain-rows": (str, "drain rows to run, by a word of their name: e.g. defaults,c16,p1"),
    "--drain-timeout": (float, "sqlite-load: seconds to wait for a drain (default 60)"),
    "--duration": (float, "sqlite-load: seconds of app load per run (default 20)"),
    "--handler-ms": (str, "claim-ahead: each handler's sleep in ms, comma-separated (default 0,1,2,5)"),
    "--histories": (str, "growth: settled jobs of each cell, comma-separated (default 0,1000000,10000000)"),
    "--hold-minutes": (float, "soak: minutes one transaction holds back xmin, mid-churn (default 0: none)"),
    "--jobs": (int, "jobs per measurement (for every queue)"),
    "--journals": (str, "sqlite-load: journal modes, of delete,wal,wal-full (default delete,wal)"),
    "--links": (int, "jobs in the chain"),
    "--minutes": (float, "soak: minutes of churn (default 30)"),
    "--parents": (int, "parents of the fan-in"),
    "--poll-interval": (float, "sqlite-load: the runners' poll_interval in seconds"),
    "--processes": (str, "scaleout: runner processes (default 1,2,4,8); claim-ahead: worker processes (default 1)"),
    "--prune-rows": (int, "growth: settled jobs pruned beside a draining runner (default 1,000,000; 0: none)"),
    "--quiet-jobs": (int, "sqlite-load: jobs of the quiet-file drain (default 2,000)"),
    "--rate": (float, "requests per second (profile-drain: py-spy samples per second; soak: jobs enqueued)"),
    "--retain-seconds": (float, "soak: how long the runner keeps completed jobs before pruning (default 300)"),
    "--raw": (str, "profile-drain: keep py-spy's collapsed stacks in this directory"),
    "--rows": (int, "rows of history beside the measured jobs"),
    "--runners": (int, "sqlite-load: runner processes (default 2)"),
    "--sample-every": (float, "soak: seconds between samples of the sizes (default 30)"),
    "--samples": (int, "samples or timed calls per run"),
    "--seconds": (float, "in-process: length of each phase (default 30)"),
    "--shapes": (
        str,
        "profile-drain: worker shapes (default sync-c1,sync-c16,async-c16); bytecodes: runner shapes (default sync-c16,async-c16)",
    ),
    "--threads": (int, "sqlite-load: request threads per app process (default 8)"),
    "--timeouts": (str, "sqlite-load: busy timeouts, 'default' (the driver's) or seconds (default default,30)"),
    "--url": (str, "in-process: an async-capable database URL (default: a database of the run's own)"),
    "--work-ms": (int, "in-process: each backlog job's work in ms (default 5)"),
}


def scenario(
    name: str, *, per_repeat: bool = False, suite: bool = False, options: str = "", help: str | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Declare a scenario; its help is ``help`` or its docstring's first line. ``options``: the
    :data:`OPTIONS` it reads, by name without the dashes (``"jobs rows"``)."""

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        assert all(f"--{flag}" in OPTIONS for flag in options.split()), options
        text = help or (fn.__doc__ or "").strip().splitlines()[0]
        SCENARIOS[name] = Scenario(name, fn, text, per_repeat, suite)
        return fn

    return register


@dataclass
class Table:
    title: str
    ratios: str | None = None  # a column to compare the others with ("watchdog": watchdog vs each peer)
    chart: str | None = None  # --plot: a bar chart of the medians, in this file
    cells: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)


class Bench:
    """What a scenario gets: its options, the subjects, targets, and where figures go."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.quick, self.workdir = args, bool(args.quick), workdir
        self.repeat: int = args.repeat or (1 if args.quick else 3)
        self.subjects: dict[str, Any] = {}
        for name in args.subjects.split(","):
            try:
                if name != "watchdog":
                    importlib.import_module(name)
                self.subjects[name] = SUBJECTS[name]()
            except ImportError as error:
                print(f"skipping {name}: {error} (pip install -e '.[bench]')", file=sys.stderr)
        self.tables: dict[str, Table] = {}
        self.checks: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.targets: dict[tuple[str, str], Target] = {}
        self.started = time.monotonic()

    def opt(self, name: str, full: Any, quick: Any = None) -> Any:
        """The option ``--name`` if given, else its quick or full default."""
        value = getattr(self.args, name.replace("-", "_"), None)
        return value if value is not None else quick if self.quick and quick is not None else full

    def ints(self, name: str, full: str) -> list[int]:
        return [int(x) for x in str(self.opt(name, full)).split(",") if x.strip()]

    def dialects(self, supported: Sequence[str] = DIALECTS) -> list[str]:
        return [d for d in self.args.dialects.split(",") if d in supported]

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True)

    def table(self, title: str, **kwargs: Any) -> Table:
        return self.tables.setdefault(title, Table(title, **kwargs))

    def record(self, table: str, row: str, column: str, value: float | None) -> None:
        self.table(table).cells.setdefault(row, {}).setdefault(column, []).append(value)

    def fail(self, what: str, error: BaseException) -> None:
        message = f"{what}: {type(error).__name__}: {error}"
        if not isinstance(error, (ScenarioTimeout, ScenarioFailed)):
            message += "\n" + traceback.format_exc(limit=6)
        self.errors.append(message)
        self.log(f"FAILED {message}")

    def measure(self, table: str, row: str, column: str, fn: Callable[[], Any], timeout: float = 300.0) -> Any:
        """Run ``fn`` under a deadline; record its figure (a number, or a dict row suffix -> number) or None."""
        gc.collect()  # earlier garbage stays out of the timing
        try:
            with deadline(timeout, f"{row} [{column}]"):
                value = fn()
        except Exception as error:
            self.fail(f"{table} / {row} [{column}]", error)
            value = None
        if isinstance(value, dict):
            for key, one in value.items():
                self.record(table, f"{row} {key}".strip(), column, one)
        else:
            self.record(table, row, column, value)
        shown = value if not isinstance(value, dict) else {k: fmt(v) for k, v in value.items()}
        self.log(f"{row:<48} {column:<13} {fmt(shown) if isinstance(shown, float) else shown}")
        return value

    def check(self, target: str, measured: str, met: bool) -> None:
        self.checks.append({"target": target, "measured": measured, "met": met})

    def check_median(
        self, target: str, table: str, row: str, column: str, ok: Callable[[float], bool], unit: str = "x",
        versus: str | None = None, versus_row: str | None = None,
    ) -> None:  # fmt: skip
        """A target line on the median of one cell (``versus``: its ratio to that column's, in
        ``versus_row`` if given, else in the same row), if both were measured."""
        value = self.medians(table, row).get(column)
        base = self.medians(table, versus_row or row).get(versus) if versus else 1.0
        if value is not None and base:
            self.check(target, f"{value / base:.2f}{unit}", ok(value / base))

    def medians(self, table: str, row: str) -> dict[str, float | None]:
        return {col: median(v) for col, v in self.tables.get(table, Table(table)).cells.get(row, {}).items()}

    def target(self, subject: str, dialect: str) -> Target:
        """The subject's database for this run (installed once)."""
        if (subject, dialect) not in self.targets:
            target = self.scratch(dialect, subject, drop=False)
            self.subjects[subject].install(target)
            self.targets[(subject, dialect)] = target
        return self.targets[(subject, dialect)]

    def scratch(self, dialect: str, name: str, drop: bool = True) -> Target:
        """An empty database of its own: ``watchdog_bench_<pid>_<name>`` or ``<name>.db``."""
        if dialect == "mariadb":
            db = f"{DB_PREFIX}{os.getpid()}_{name}"
            _admin_mysql(db, create=True)
            dsn = make_url(MYSQL_SERVER).set(database=db).render_as_string(hide_password=False)
            _created.append(target := Target("mariadb", dsn, db))
            return target
        if dialect == "postgresql":
            db = f"{DB_PREFIX}{os.getpid()}_{name}"
            _admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", db)
            _admin("CREATE DATABASE {}", db)
            dsn = make_url(ADMIN_DSN).set(database=db).render_as_string(hide_password=False)
            _created.append(target := Target("postgresql", dsn, db))
            return target
        path = self.workdir / f"{name}.db"
        if drop:
            path.unlink(missing_ok=True)
        return Target("sqlite", str(path), path.name)

    def in_order(self, r: int, dialect: str = "postgresql") -> list[str]:
        """Subjects for this dialect, rotated per repeat so none always goes first."""
        return rotate([n for n, s in self.subjects.items() if dialect in s.dialects], r)

    @contextlib.contextmanager
    def database(self, dialect: str, name: str, install: bool = True, fails: str | None = None) -> Iterator[Target]:
        """:meth:`scratch` with watchdog's tables (unless ``install=False``), dropped after the block;
        with ``fails``, a failure in the block is recorded under that name and the run goes on."""
        target = self.scratch(dialect, name)
        try:
            if install:
                install_watchdog(target)
            yield target
        except Exception as error:
            if fails is None:
                raise
            self.fail(fails, error)
        finally:
            drop(target)

    def workers(
        self, subject: str, target: Target, tag: str, procs: int = 1, **options: Any
    ) -> contextlib.AbstractContextManager[list[Child]]:
        """:meth:`spawn` ``procs`` worker processes of ``subject`` (see ``worker_main``)."""
        return self.spawn(f"{tag}-{subject}", procs, worker_role, subject=subject, target=target, **options)

    @contextlib.contextmanager
    def spawn(self, tag: str, n: int, func: Callable[..., Any], **kwargs: Any) -> Iterator[list[Child]]:
        """``n`` children running ``func(**kwargs)`` (logs ``<tag>-<i>.log``), each ready; stopped after the block."""
        children = [Child(self.workdir / f"{tag}-{i}.log", func, **kwargs) for i in range(n)]
        try:
            for child in children:
                child.wait_ready(60)
            yield children
        finally:
            stop_all(children)

    def subject(self, name: str) -> Any:
        """The run's adapter of ``name``, or a new one if ``--subjects`` left it out."""
        return self.subjects[name] if name in self.subjects else SUBJECTS[name]()

    def drain_once(self, subject: str, target: Target, n: int, tag: str, procs: int = 1, **options: Any) -> float:
        """:func:`drain_idle` of ``procs`` fresh worker processes (one warm-up job each) on an emptied queue."""
        sub = self.subject(subject)
        sub.reset(target)
        with self.workers(subject, target, tag, procs, **options) as children:
            return drain_idle(sub, target, n, tag, procs, children)

    @contextlib.contextmanager
    def idle_worker(self, subject: str, target: Target, tag: str, **options: Any) -> Iterator[tuple[Child, Any]]:
        """One ``subject`` worker with its defaults whose handler reports its starts, and a client of
        the subject; the block runs once the worker had half a second to reach its idle wait."""
        with self.workers(subject, target, tag, defaults=True, latency=True, **options) as (child,):
            client = self.subject(subject).client(target)
            try:
                time.sleep(0.5)
                yield child, client
            finally:
                client.close()

    def latencies(
        self, subject: str, target: Target, tag: str, warmup: int, samples: int, enqueue: Any = None, **kw: Any
    ) -> list[float]:
        """:meth:`idle_worker` on an emptied queue; :meth:`start_latencies` of its handler through
        the client (``enqueue(client, key)``: how a job goes in)."""
        self.subjects[subject].reset(target)
        with self.idle_worker(subject, target, tag) as (child, client):
            go = partial(enqueue, client) if enqueue else client.enqueue
            return self.start_latencies(child, go, tag, warmup, samples, **kw)

    @staticmethod
    def start_latencies(
        child: Child, enqueue: Callable[[str], float], tag: str, warmup: int, samples: int,
        pause: tuple[float, float] = (0.03, 0.06), never_early: bool = False,
    ) -> list[float]:  # fmt: skip
        """Enqueue ``warmup + samples`` jobs one at a time (``enqueue(key)`` returns the time its commit
        returned, or the time it is due), wait for ``child``'s handler to start each, pause ``pause`` s;
        start - that time (ms). ``never_early``: a start before that time fails (one clock; allow rounding)."""
        latencies: list[float] = []
        for i in range(warmup + samples):
            key = f"{tag}-{i}"
            reference = enqueue(key)
            # Warm-up jobs may wait for a worker still setting up its LISTEN (pgqueuer's
            # fallback poll is 30 s); measured ones must not.
            wait = 60 if i < warmup else 15 + max(0.0, reference - time.time())
            try:
                got, started = child.starts.get(timeout=wait)
            except queue.Empty:
                raise ScenarioTimeout(f"job {key} did not start within {wait:.0f}s; {child.tail()}") from None
            if got != key:
                raise ScenarioFailed(f"expected {key} to start, got {got}")
            if never_early and started < reference - 0.002:
                raise ScenarioFailed(f"{key} started {reference - started:.3f}s before its run_at")
            if i >= warmup:
                latencies.append((started - reference) * 1000.0)
            time.sleep(random.uniform(*pause))  # let it settle and the worker go idle, off any rhythm
        return latencies

    def close(self) -> None:
        """Drop every database the run created (the SQLite files go with the work directory)."""
        drop(*_created)
