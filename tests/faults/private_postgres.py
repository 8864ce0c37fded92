"""A throwaway PostgreSQL server of the test's own, to restart at will.

``initdb`` into a fresh temporary directory as the ``postgres`` OS user
(PostgreSQL refuses to run as root), on a free port, with its unix socket in
that directory. Every ``pg_ctl`` call names this data directory explicitly,
so the machine's shared server is never touched.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy.engine import URL

BIN_CANDIDATES = [Path(os.environ.get("WATCHDOG_PG_BIN", "/usr/lib/postgresql/15/bin"))] + sorted(
    Path("/usr/lib/postgresql").glob("*/bin"), reverse=True
)


def find_bindir() -> Path | None:
    for candidate in BIN_CANDIDATES:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.base = Path(tempfile.mkdtemp(prefix="watchdog-faults-pg-"))
        self.data = self.base / "data"
        self.socket_dir = self.base / "sock"
        self.logfile = self.base / "server.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chmod(self.base, 0o755)
            os.chown(self.base, user.pw_uid, user.pw_gid)
        self.socket_dir.mkdir()
        if self._as_postgres:
            os.chown(self.socket_dir, user.pw_uid, user.pw_gid)

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                f"{self.server_log()[-3000:]}"
            )
        return result

    def server_log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except (FileNotFoundError, PermissionError):
            return ""

    @property
    def options(self) -> str:
        # Small and fast: durability against an OS crash is not under test,
        # only a server crash (immediate shutdown), which fsync=off survives.
        return (
            f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c max_connections=60 "
            "-c shared_buffers=16MB -c max_wal_size=64MB"
        )

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", self.options, "-l", str(self.logfile), "-w", "-t", "60", "start"
        )

    def restart_immediate(self) -> None:
        """Crash-stop (no checkpoint, clients cut off) and start again."""
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            self.options,
            "-l",
            str(self.logfile),
            "-m",
            "immediate",
            "-w",
            "-t",
            "60",
            "restart",
        )

    def halt(self) -> None:
        """Crash-stop the server (clients cut off, connections refused) and
        keep its data, for :meth:`resume`."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")

    def resume(self) -> None:
        """Start the server :meth:`halt` stopped, on the same port and data."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", self.options, "-l", str(self.logfile), "-w", "-t", "60", "start"
        )

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def url(self, database: str = "postgres", application_name: str | None = None) -> URL:
        query = {"application_name": application_name} if application_name else {}
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            host="127.0.0.1",
            port=self.port,
            database=database,
            query=query,
        )
