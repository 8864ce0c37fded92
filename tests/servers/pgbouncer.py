"""A PgBouncer of the test run's own, in transaction mode, on a loopback port.

Debian's ``pgbouncer`` (``/usr/sbin/pgbouncer``; ``python3 dev.py test
--install-system-packages`` installs it, CI does so by itself), started
with a configuration written into a temporary directory and pointed at the
test PostgreSQL: every database name passes through to the same name there
(``* = host=... port=...``), so the run's throwaway databases are reachable
through it. It never runs as a service: started here, stopped at the end.

Run as the ``postgres`` OS user when started as root (PgBouncer refuses to
run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import URL

BINARY = Path(os.environ.get("WATCHDOG_PGBOUNCER", "/usr/sbin/pgbouncer"))

#: What a test that needs PgBouncer says when it is missing.
MISSING = (
    f"no PgBouncer at {BINARY}: install Debian's pgbouncer "
    "(python3 dev.py test --install-system-packages, or apt-get install pgbouncer)"
)


def available() -> bool:
    return BINARY.exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    """One PgBouncer process in front of ``server`` (a URL of the test
    PostgreSQL), in ``pool_mode``; :meth:`url` names a database through it."""

    def __init__(self, server: URL, *, pool_mode: str = "transaction", pool_size: int = 20) -> None:
        self.server = server
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="watchdog-pgbouncer-"))
        self.logfile = self.base / "pgbouncer.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._as_postgres = os.geteuid() == 0

    def _config(self) -> str:
        host = self.server.host or "127.0.0.1"
        port = self.server.port or 5432
        return f"""\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.base / "userlist.txt"}
admin_users = postgres
pool_mode = {self.pool_mode}
max_client_conn = 500
default_pool_size = {self.pool_size}
max_db_connections = {self.pool_size * 2}
logfile = {self.logfile}
pidfile = {self.base / "pgbouncer.pid"}
ignore_startup_parameters = extra_float_digits,options
server_check_delay = 0
"""

    def start(self) -> None:
        user = self.server.username or "postgres"
        (self.base / "userlist.txt").write_text(f'"{user}" ""\n')
        (self.base / "pgbouncer.ini").write_text(self._config())
        cmd = [str(BINARY), str(self.base / "pgbouncer.ini")]
        if self._as_postgres:
            account = pwd.getpwnam("postgres")
            for path in [self.base, *self.base.iterdir()]:
                os.chown(path, account.pw_uid, account.pw_gid)
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        self._process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self._process.returncode}:\n{self.log()[-3000:]}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on port {self.port} within 15 s:\n{self.log()[-3000:]}")

    def halt(self) -> None:
        """Kill the PgBouncer process (its clients' connections cut, new ones
        refused) and keep its directory, for :meth:`start` to start it again
        on the same port."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        # At once, as a crash (SIGTERM may wait for the clients to leave), and
        # the PgBouncer itself: under runuser, the process started is runuser.
        try:
            os.kill(int((self.base / "pgbouncer.pid").read_text().split()[0]), signal.SIGKILL)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            process.kill()
        process.wait(10)
        (self.base / "pgbouncer.pid").unlink(missing_ok=True)

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except (FileNotFoundError, PermissionError):
            return ""

    def stop(self) -> None:
        process, self._process = self._process, None
        try:
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def url(self, database: str, drivername: str = "postgresql+psycopg") -> URL:
        return self.server.set(drivername=drivername, host="127.0.0.1", port=self.port, database=database)

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
