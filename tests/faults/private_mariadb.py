"""A throwaway MariaDB server of the test's own, to kill and restart at will.

``mariadb-install-db`` into a fresh temporary directory (root with no
password, over TCP from 127.0.0.1 only), then ``mariadbd`` on a free
loopback port with its unix socket and pid file in that directory. The
server is this object's child process: it is killed by its own pid, so the
machine's shared server is never touched.

Small and fast: InnoDB's redo log is written to the OS at each commit but
not flushed (``innodb_flush_log_at_trx_commit=2``): durability against an OS
crash is not under test, only a crash of the server process (SIGKILL), which
that setting survives -- a committed transaction is in the OS's page cache
and InnoDB's crash recovery replays it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

SEARCH_DIRS = [os.environ.get("WATCHDOG_MARIADB_BIN", ""), "/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"]
SERVER_NAMES = ("mariadbd", "mysqld")
INSTALL_NAMES = ("mariadb-install-db", "mysql_install_db")

MISSING = "no MariaDB server binaries (mariadbd, mariadb-install-db) on this machine"


def _find(names: tuple[str, ...]) -> Path | None:
    for name in names:
        for directory in filter(None, SEARCH_DIRS):
            candidate = Path(directory) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def find_binaries() -> tuple[Path, Path] | None:
    """The server and its install tool, or None when either is missing."""
    server, install = _find(SERVER_NAMES), _find(INSTALL_NAMES)
    return (server, install) if server and install else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateMariaDB:
    """``start()``, ``kill_and_restart()``, ``stop()``; ``url(database)``."""

    def __init__(self, server_bin: Path, install_bin: Path) -> None:
        self.server_bin = server_bin
        self.install_bin = install_bin
        self.base = Path(tempfile.mkdtemp(prefix="watchdog-faults-mariadb-"))
        self.data = self.base / "data"
        self.socket_path = self.base / "mariadb.sock"
        self.logfile = self.base / "server.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_root = os.geteuid() == 0

    @property
    def _user(self) -> list[str]:
        # mariadbd refuses to run as root unless told to.
        return ["--user=root"] if self._as_root else []

    @property
    def _innodb(self) -> list[str]:
        return [
            "--innodb-buffer-pool-size=16M",
            "--innodb-log-file-size=8M",
            "--innodb-flush-log-at-trx-commit=2",
            "--innodb-doublewrite=0",
        ]

    def server_log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self) -> None:
        """Create the data directory and start the server."""
        result = subprocess.run(
            [
                str(self.install_bin),
                "--no-defaults",
                f"--datadir={self.data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                *self._user,
                *self._innodb,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{self.install_bin} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        self._launch()

    def _launch(self) -> None:
        log = open(self.logfile, "ab")
        try:
            self.proc = subprocess.Popen(
                [
                    str(self.server_bin),
                    "--no-defaults",
                    f"--datadir={self.data}",
                    f"--socket={self.socket_path}",
                    f"--pid-file={self.base / 'mariadbd.pid'}",
                    f"--port={self.port}",
                    "--bind-address=127.0.0.1",
                    "--skip-name-resolve",
                    "--skip-log-bin",
                    "--max-connections=100",
                    *self._user,
                    *self._innodb,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()
        self._wait_ready(timeout=60)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        engine = create_engine(self.url(), poolclass=NullPool, connect_args={"connect_timeout": 2})
        try:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mariadbd exited ({self.proc.returncode}):\n{self.server_log()[-3000:]}")
                try:
                    with engine.connect() as conn:
                        conn.execute(text("SELECT 1"))
                    return
                except DBAPIError as error:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"mariadbd not ready after {timeout}s: {error}\n{self.server_log()[-3000:]}"
                        ) from error
                time.sleep(0.05)
        finally:
            engine.dispose()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def kill_and_restart(self, down: float = 0.0) -> None:
        """SIGKILL the server (clients cut off mid-statement, no clean
        shutdown) and start it again on the same port and data: InnoDB's
        crash recovery. ``down``: seconds to stay down in between (connections
        refused)."""
        self._kill()
        time.sleep(down)
        self._launch()

    def stop(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._kill()
            self.proc = None
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def url(self, database: str | None = None, username: str = "root") -> URL:
        return URL.create("mysql+pymysql", username=username, host="127.0.0.1", port=self.port, database=database)
