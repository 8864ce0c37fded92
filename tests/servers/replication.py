"""A PostgreSQL primary and a streaming standby of the test's own, to fail over at will.

Both are made in one temporary directory: the primary with ``initdb``
(``wal_level=replica``, WAL senders, trust authentication for connections
and replication from the loopback, ``fsync=off`` for speed), the standby
with ``pg_basebackup -R`` from it (asynchronous streaming replication,
``hot_standby=on``), each on a free loopback port with its unix socket in
its own directory. Run as the ``postgres`` OS user when started as root
(PostgreSQL refuses to run as root), like
:class:`tests.faults.private_postgres.PrivatePostgres`. Every ``pg_ctl``
call names its data directory, so the machine's shared server is never
touched.

A failover is :meth:`ReplicatedPostgres.stop_primary_immediate` (``pg_ctl
-m immediate stop``: a crash, whatever the standby had not received is lost
with it) then :meth:`ReplicatedPostgres.promote_standby`. The old primary is
never started again, so there is never a second writable server.
:meth:`ReplicatedPostgres.multi_host_url` lists both servers with
``target_session_attrs=read-write``: libpq (psycopg) and asyncpg try them in
order and keep the one that accepts writes.

:meth:`ReplicatedPostgres.stop` stops both servers and deletes the directory;
it also runs at interpreter exit (a finalizer), so no server outlives the
test run.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from tests.faults.private_postgres import find_bindir, free_port

__all__ = ["Node", "ReplicatedPostgres", "find_bindir"]

_SETTINGS = """
# tests/servers/replication.py
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 5
wal_keep_size = 64MB
hot_standby = on
fsync = off
full_page_writes = off
synchronous_commit = local
max_connections = 60
shared_buffers = 16MB
max_wal_size = 64MB
wal_receiver_status_interval = 1s
wal_retrieve_retry_interval = 200ms
"""

_HBA = """
# tests/servers/replication.py: trust on the loopback and the socket, replication included
local   all             all                                     trust
local   replication     all                                     trust
host    all             all             127.0.0.1/32            trust
host    replication     all             127.0.0.1/32            trust
"""


class Node:
    """One server of the pair: its data directory, socket directory, port and log."""

    def __init__(self, owner: ReplicatedPostgres, name: str) -> None:
        self.owner = owner
        self.name = name
        self.data = owner.base / name
        self.socket_dir = owner.base / f"{name}-sock"
        self.logfile = owner.base / f"{name}.log"
        self.port = free_port()
        self.socket_dir.mkdir()
        owner.give_to_postgres(self.socket_dir)

    @property
    def options(self) -> str:
        return f"-p {self.port} -k {self.socket_dir}"

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def pg_ctl(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return self.owner.run("pg_ctl", "-D", str(self.data), *args, timeout=timeout)

    def start(self) -> None:
        self.pg_ctl("-o", self.options, "-l", str(self.logfile), "-w", "-t", "60", "start")

    def stop_immediate(self) -> None:
        self.pg_ctl("-m", "immediate", "-w", "-t", "60", "stop")

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except (FileNotFoundError, PermissionError):
            return ""

    def url(self, database: str = "postgres", drivername: str = "postgresql+psycopg", **query: str) -> URL:
        return URL.create(
            drivername, username="postgres", host="127.0.0.1", port=self.port, database=database, query=query
        )

    def scalar(self, sql: str, database: str = "postgres") -> object:
        """One value from this server, on a connection of its own (no pool)."""
        engine = create_engine(self.url(database, connect_timeout="5"), poolclass=NullPool)
        try:
            with engine.connect() as conn:
                return conn.execute(text(sql)).scalar()
        finally:
            engine.dispose()


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pids.clear()


def _stop_all(bindir: Path, as_postgres: bool, base: Path, data_dirs: list[Path], frozen: list[int]) -> None:
    """Stop every server still running (immediately) and delete the directory.

    The finalizer of :class:`ReplicatedPostgres`: it holds no reference to
    the object, so it runs when the object is collected or at interpreter exit.
    A frozen WAL sender would hold its postmaster's shutdown: it is killed first."""
    try:
        _kill(frozen)
        for data in data_dirs:
            if (data / "postmaster.pid").exists():
                cmd = [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "60", "stop"]
                if as_postgres:
                    cmd = ["runuser", "-u", "postgres", "--", *cmd]
                subprocess.run(cmd, capture_output=True, timeout=90, check=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)


class ReplicatedPostgres:
    """A primary and its streaming standby; see the module's docstring.

    ``bindir`` holds ``initdb``, ``pg_ctl`` and ``pg_basebackup``
    (default: :func:`find_bindir`, the newest ``/usr/lib/postgresql/*/bin``).
    """

    def __init__(self, bindir: Path | None = None) -> None:
        found = bindir if bindir is not None else find_bindir()
        if found is None or not (found / "pg_basebackup").exists():
            raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup)")
        self.bindir = found
        self.base = Path(tempfile.mkdtemp(prefix="watchdog-replication-"))
        self._as_postgres = os.geteuid() == 0
        self.give_to_postgres(self.base)
        os.chmod(self.base, 0o755)
        self.primary = Node(self, "primary")
        self.standby = Node(self, "standby")
        #: WAL senders frozen by :meth:`hold_replication` (SIGSTOPped).
        self._frozen: list[int] = []
        self._finalizer = weakref.finalize(
            self,
            _stop_all,
            self.bindir,
            self._as_postgres,
            self.base,
            [self.primary.data, self.standby.data],
            self._frozen,
        )

    # -- running the server binaries ---------------------------------------------------

    def give_to_postgres(self, path: Path) -> None:
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(path, user.pw_uid, user.pw_gid)

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                f"--- primary log ---\n{self.primary.log()[-2000:]}\n--- standby log ---\n{self.standby.log()[-2000:]}"
            )
        return result

    def _append(self, path: Path, content: str) -> None:
        # Written as postgres when run as root: the files belong to the server.
        if self._as_postgres:
            subprocess.run(
                ["runuser", "-u", "postgres", "--", "tee", "-a", str(path)],
                input=content,
                text=True,
                capture_output=True,
                check=True,
            )
        else:
            with open(path, "a") as handle:
                handle.write(content)

    # -- the pair ----------------------------------------------------------------------

    def start(self, *, databases: tuple[str, ...] = ()) -> None:
        """``initdb`` and start the primary, create ``databases`` on it, make
        the standby with ``pg_basebackup -R``, start it and wait until it streams."""
        primary, standby = self.primary, self.standby
        self.run("initdb", "-D", str(primary.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        self._append(primary.data / "postgresql.conf", _SETTINGS)
        self._append(primary.data / "pg_hba.conf", _HBA)
        primary.start()
        for database in databases:
            engine = create_engine(primary.url(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
            try:
                with engine.connect() as conn:
                    conn.execute(text(f'CREATE DATABASE "{database}"'))
            finally:
                engine.dispose()
        self.run(
            "pg_basebackup",
            "-D",
            str(standby.data),
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-R",
            "--no-sync",
            "-c",
            "fast",
        )
        standby.start()
        self.wait_streaming()

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until the primary's ``pg_stat_replication`` shows the standby streaming."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.primary.scalar("SELECT string_agg(state, ',') FROM pg_stat_replication")
            if state == "streaming":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the standby does not stream after {timeout:g}s (pg_stat_replication: {state!r}):\n"
                    f"{self.standby.log()[-3000:]}"
                )
            time.sleep(0.1)

    def wait_caught_up(self, timeout: float = 30) -> None:
        """Until the standby has replayed all the WAL the primary has written so far."""
        target = self.primary.scalar("SELECT pg_current_wal_lsn()::text")
        deadline = time.monotonic() + timeout
        while True:
            behind = self.standby.scalar(f"SELECT pg_wal_lsn_diff('{target}', pg_last_wal_replay_lsn())")
            if behind is not None and float(str(behind)) <= 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is {behind} bytes behind after {timeout:g}s")
            time.sleep(0.05)

    def hold_replication(self) -> None:
        """Freeze (SIGSTOP) the primary's WAL senders: from now on the primary
        goes on acknowledging commits (replication is asynchronous) that the
        standby never receives -- the replication lag of a loaded or partitioned
        network, made as long as the test wants. :meth:`stop_primary_immediate`
        then loses exactly what was committed since."""
        pids = self.primary.scalar("SELECT string_agg(pid::text, ',') FROM pg_stat_replication")
        if not pids:
            raise RuntimeError("no WAL sender on the primary: the standby does not stream")
        for pid in (int(p) for p in str(pids).split(",")):
            os.kill(pid, signal.SIGSTOP)
            self._frozen.append(pid)

    def stop_primary_immediate(self, timeout: float = 60) -> None:
        """``pg_ctl -m immediate stop`` on the primary: a crash. It is never started again.

        WAL senders frozen by :meth:`hold_replication` are SIGKILLed right
        after the stop is signalled (never resumed: they would ship what they
        held back), so what they held is lost with the primary."""
        if not self._frozen:
            self.primary.stop_immediate()
            return
        self.primary.pg_ctl("-m", "immediate", "-W", "stop")  # signal it, do not wait
        _kill(self._frozen)
        deadline = time.monotonic() + timeout
        while self.primary.running:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the primary did not stop within {timeout:g}s:\n{self.primary.log()[-3000:]}")
            time.sleep(0.02)

    def promote_standby(self, timeout: float = 60) -> None:
        """``pg_ctl promote`` the standby and wait until it accepts writes
        (``pg_is_in_recovery()`` is false)."""
        self.standby.pg_ctl("-w", "-t", str(int(timeout)), "promote")
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.standby.scalar("SELECT pg_is_in_recovery()") is False:
                    return
            except DBAPIError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is still in recovery {timeout:g}s after promote")
            time.sleep(0.05)

    def multi_host_url(
        self,
        database: str = "postgres",
        drivername: str = "postgresql+psycopg",
        target_session_attrs: str = "read-write",
        **query: str,
    ) -> URL:
        """A URL naming both servers, primary first, in SQLAlchemy's multi-host
        form (``?host=127.0.0.1:P1&host=127.0.0.1:P2``: every host with its
        port, as asyncpg requires) with ``target_session_attrs``: the driver
        tries the hosts in order and keeps the first one that qualifies."""
        hosts = tuple(f"127.0.0.1:{node.port}" for node in (self.primary, self.standby))
        return URL.create(
            drivername,
            username="postgres",
            database=database,
            query={"host": hosts, "target_session_attrs": target_session_attrs, **query},
        )

    def stop(self) -> None:
        """Stop whatever still runs (immediately) and delete the directory."""
        self._finalizer()

    def logs(self) -> str:
        return (
            f"--- primary ({self.primary.port}) ---\n{self.primary.log()[-3000:]}\n"
            f"--- standby ({self.standby.port}) ---\n{self.standby.log()[-3000:]}"
        )

    def __enter__(self) -> ReplicatedPostgres:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
