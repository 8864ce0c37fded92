"""Shared plumbing of the benchmark: databases, child processes, polling, statistics.

Nothing here knows about a particular queue; the subjects (``subjects.py``,
``peers/*.py``) use it, and ``run.py`` drives them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

HERE = Path(__file__).resolve().parent

#: The PostgreSQL server the benchmark may create databases on (libpq URL of
#: any database there; used as the maintenance connection).
ADMIN_DSN = os.environ.get("WATCHDOG_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
#: Every database this benchmark creates starts with this prefix.
DB_PREFIX = "watchdog_bench_"


class ScenarioTimeout(RuntimeError):
    """A scenario did not finish within its time limit."""


class ScenarioFailed(RuntimeError):
    """A scenario finished but its result is wrong (e.g. jobs missing)."""


# -- targets (where a subject's data lives) --------------------------------------


@dataclass(frozen=True)
class Target:
    """One database a subject runs against: PostgreSQL (``dsn``) or a SQLite file."""

    dialect: str  # "postgresql" | "sqlite"
    dsn: str  # libpq URL for PostgreSQL, file path for SQLite
    name: str  # database name / file name, for messages

    @property
    def sqlalchemy_url(self) -> str:
        if self.dialect == "sqlite":
            return f"sqlite:///{self.dsn}"
        return "postgresql+psycopg://" + self.dsn.split("://", 1)[1]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Target:
        return cls(**json.loads(text))


def _dsn_with_db(dbname: str) -> str:
    base, _, rest = ADMIN_DSN.partition("://")
    hostpart, _, path = rest.partition("/")
    query = ""
    if "?" in path:
        _, query = path.split("?", 1)
        query = "?" + query
    return f"{base}://{hostpart}/{dbname}{query}"


_created: list[str] = []
_created_lock = threading.Lock()


def create_database(suffix: str) -> Target:
    """A new, empty PostgreSQL database ``watchdog_bench_<pid>_<suffix>``."""
    name = f"{DB_PREFIX}{os.getpid()}_{suffix}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with _created_lock:
        _created.append(name)
    return Target("postgresql", _dsn_with_db(name), name)


def drop_database(target: Target) -> None:
    if target.dialect != "postgresql":
        return
    assert target.name.startswith(DB_PREFIX), target.name  # never anyone else's database
    try:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(target.name)))
    except Exception as error:  # pragma: no cover - best effort
        print(f"warning: could not drop {target.name}: {error}", file=sys.stderr)
    with _created_lock:
        if target.name in _created:
            _created.remove(target.name)


def drop_all_created() -> None:
    with _created_lock:
        names = list(_created)
    for name in names:
        drop_database(Target("postgresql", _dsn_with_db(name), name))


def truncate_public_tables(target: Target) -> None:
    """Empty every table of the (benchmark-owned) database, resetting sequences."""
    assert target.name.startswith(DB_PREFIX), target.name
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        names = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        if names:
            conn.execute(
                sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                    sql.SQL(", ").join(sql.Identifier(n) for n in names)
                )
            )


def server_facts() -> dict[str, Any]:
    """The server's version and the settings that decide durability and speed."""

    def show(conn: psycopg.Connection[Any], setting: str) -> Any:
        row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone()
        return None if row is None else row[0]

    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        facts = {"version": show(conn, "server_version")}
        for setting in (
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "full_page_writes",
            "shared_buffers",
            "max_connections",
            "commit_delay",
        ):
            facts[setting] = show(conn, setting)
    return facts


# -- child processes ---------------------------------------------------------------


_children: list[Child] = []


class Child:
    """A worker subprocess in its own process group.

    Its stdout is read line by line on a thread: ``READY`` says it is set up,
    ``START <key> <epoch seconds>`` reports a handler start (latency runs).
    Everything else, and stderr, goes to a log file for post-mortems.
    """

    def __init__(self, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "w", buffering=1)
        self.ready = threading.Event()
        self.starts: queue.Queue[tuple[str, float]] = queue.Queue()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            cwd=str(HERE),
        )
        _children.append(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("START "):
                _, key, at = line.split()
                self.starts.put((key, float(at)))
            elif line.startswith("READY"):
                self.ready.set()
            else:
                self._log.write(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if not self.alive():
                raise ScenarioFailed(f"worker exited with {self.proc.returncode} before it was ready; {self.tail()}")
            if time.monotonic() > deadline:
                raise ScenarioTimeout(f"worker not ready after {timeout:.0f}s; {self.tail()}")

    def tail(self, lines: int = 15) -> str:
        try:
            self._log.flush()
            text = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            text = []
        return f"log {self.log_path}:\n    " + "\n    ".join(text) if text else f"(empty log {self.log_path})"

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (each queue's graceful shutdown), then SIGKILL the group."""
        if self.alive():
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"warning: worker {self.proc.pid} ignored SIGTERM; killing it", file=sys.stderr)
        self.kill()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        self._reader.join(timeout=2)
        self._log.close()
        if self in _children:
            _children.remove(self)


def _cleanup() -> None:
    for child in _children:
        child.kill()
    drop_all_created()


atexit.register(_cleanup)


def stop_all(children: Sequence[Child]) -> None:
    """Stop several workers at once (they shut down in parallel)."""
    for child in children:
        if child.alive():
            try:
                os.kill(child.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for child in children:
        child.stop()


# -- polling -------------------------------------------------------------------------


def poll_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    interval: float,
    what: str,
    children: Sequence[Child] = (),
) -> float:
    """Call ``check`` every ``interval`` until it is true; returns perf_counter() then."""
    deadline = time.perf_counter() + timeout
    while True:
        now = time.perf_counter()
        if check():
            return time.perf_counter()
        if now > deadline:
            raise ScenarioTimeout(f"{what}: not done after {timeout:.0f}s")
        for child in children:
            if not child.alive():
                raise ScenarioFailed(f"{what}: a worker died ({child.proc.returncode}); {child.tail()}")
        time.sleep(interval)


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`ScenarioTimeout` in the main thread after ``seconds``
    (SIGALRM), whatever the measurement is blocked on."""

    def expire(signum: int, frame: Any) -> None:
        raise ScenarioTimeout(f"{what}: gave up after {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def exit_with_parent() -> None:
    """In a worker: shut down (SIGTERM to itself) if the benchmark process dies."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(20.0)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


# -- statistics ---------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else None
