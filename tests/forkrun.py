"""A pre-imported interpreter that forks a fresh process per program.

Run as a script (``python tests/forkrun.py SOCKET``) it imports
sqlalchemy_watchdog (and alembic) once, then serves on the Unix socket
``SOCKET``: for each request -- an argv of this interpreter (``python
SCRIPT ARGS...`` or ``python -m MODULE ARGS...``), a working directory, an
environment and the three standard streams as file descriptors -- it forks
a process of its own, which runs that program as the interpreter would
have: ``__main__`` is the script (``runpy``), ``sys.argv`` and
``sys.path[0]`` are as ``python`` sets them, ``os.environ`` is the given
environment, the working directory is the given one, signal dispositions
are those of an interpreter ``subprocess`` starts, and the process ends
the way an interpreter does (an uncaught exception prints its traceback
and exits 1, ``sys.exit`` exits with its status, non-daemon threads are
joined, ``atexit`` runs). What it
saves is the start-up: the import of the package, about a second per
program on a loaded 2-core machine, which was most of a docs block's run.

Each program is still a process of its own: nothing one program does is
seen by the next (each fork starts from the server's state, which never
runs a program itself). :class:`ForkServer` is the test side, and
:class:`Forked` mirrors the parts of ``subprocess.Popen`` that tests use.

Only for POSIX (``os.fork``); a test falls back to ``subprocess`` where
:func:`available` is False.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

#: What the server imports before it forks (the programs' common start-up).
PRELOAD = ("sqlalchemy_watchdog", "sqlalchemy_watchdog.cli", "alembic.config", "alembic.command")


def available() -> bool:
    return hasattr(os, "fork") and hasattr(socket, "send_fds")


# -- the server (runs in its own interpreter) ---------------------------------------------


def _receive(conn: socket.socket) -> tuple[dict[str, object], list[int]]:
    data, fds, _flags, _address = socket.recv_fds(conn, 1 << 16, 3)
    while chunk := conn.recv(1 << 16):  # the rest, up to the test side's shutdown
        data += chunk
    request: dict[str, object] = json.loads(data.decode())
    return request, fds


def _program(request: Mapping[str, object]) -> Callable[[], None]:
    """What the forked process runs: the request's program, set up as ``python`` sets it up."""
    import runpy

    argv = [str(arg) for arg in request["argv"]]  # type: ignore[attr-defined]
    cwd = str(request["cwd"])
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})  # type: ignore[attr-defined]
    if argv[:1] == ["-m"]:
        module, args = argv[1], argv[2:]
        sys.argv = ["-m", *args]
        sys.path[0] = os.getcwd()

        def run_module() -> None:
            runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]

        return run_module
    script = argv[0]
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(script))

    def run_script() -> None:
        runpy.run_path(script, run_name="__main__")

    return run_script


def serve(path: str) -> Callable[[], None]:
    """Serve requests on ``path`` until the test side closes; returns (only
    in a forked process) the program that process is to run."""
    for name in PRELOAD:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    # The server never waits for its helpers; the kernel reaps them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    parent = os.getppid()
    listener.settimeout(1.0)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test process is gone without closing
                sys.exit(0)
            continue
        conn.settimeout(None)
        request, fds = _receive(conn)
        if request.get("stop"):
            conn.close()
            listener.close()
            sys.exit(0)
        if os.fork() != 0:  # the server: on to the next request
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        # A helper of this one request: it forks the program and reports its
        # pid, then its exit status, on ``conn``.
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        pid = os.fork()
        if pid == 0:
            # Every signal disposition is the server's, which is a fresh
            # interpreter's as ``subprocess`` starts it (SIGPIPE ignored, SIGINT
            # raising KeyboardInterrupt, the rest as inherited), but SIGCHLD,
            # which the helper set back to the default above.
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            return _program(request)
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        try:
            conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
        finally:
            os._exit(0)


# -- the test side -------------------------------------------------------------------------


class Forked:
    """A program the server forked: ``pid``, ``poll()``, ``wait()``,
    ``send_signal()``, ``kill()`` and ``returncode`` as ``subprocess.Popen``'s."""

    def __init__(self, conn: socket.socket, argv: Sequence[str]) -> None:
        self._conn = conn
        self._buffer = b""
        self.args = list(argv)
        self.returncode: int | None = None
        self.pid = int(self._message(None)["pid"])

    def _message(self, timeout: float | None) -> dict[str, int]:
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError("the fork server's helper ended without reporting the program's status")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, int] = json.loads(line)
        return message

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self._message(0.0)["returncode"]
            except (BlockingIOError, TimeoutError):
                return None
            self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = self._message(timeout)["returncode"]
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
            self._conn.close()
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


#: Variables the interpreter reads at its start, before any program: a program
#: whose environment sets them otherwise than the server's is started as a subprocess.
START_UP = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONHASHSEED")


def server_env() -> dict[str, str]:
    """This process's environment as the programs get it: no PYTHONPATH (a
    program runs the package as installed) and no WATCHDOG_DATABASE_URL."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("WATCHDOG_DATABASE_URL", None)
    return env


class ForkServer:
    """The test side of a server started with ``python``: :meth:`popen` and :meth:`run`."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self._dir = tempfile.TemporaryDirectory(prefix="forkrun-")
        self.path = str(Path(self._dir.name) / "socket")
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.path],
            cwd=self._dir.name,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline()
        if ready.strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"the fork server did not start (exit {self.process.wait()})")

    def forks(self, env: Mapping[str, str]) -> bool:
        """Whether a program with ``env`` starts as it would from the server's state."""
        return all(env.get(name) == self.env.get(name) for name in START_UP)

    def popen(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], stdout: IO[Any] | int, stderr: IO[Any] | int
    ) -> Forked | subprocess.Popen[bytes]:
        """Start ``argv`` (``sys.executable`` first, as for ``subprocess``) in
        ``cwd`` with ``env``; stdin is ``/dev/null``. A subprocess where
        :meth:`forks` says the server's start-up is not the program's."""
        assert argv[0] == sys.executable, argv
        if not self.forks(env):
            return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
        out = stdout if isinstance(stdout, int) else stdout.fileno()
        err = out if stderr == subprocess.STDOUT else (stderr if isinstance(stderr, int) else stderr.fileno())
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        request = {"argv": list(argv[1:]), "cwd": str(cwd), "env": dict(env)}
        with open(os.devnull, "rb") as devnull:
            socket.send_fds(conn, [json.dumps(request).encode()], [devnull.fileno(), out, err])
        conn.shutdown(socket.SHUT_WR)
        return Forked(conn, argv)

    def run(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """``subprocess.run(argv, cwd=, env=, capture_output=True, text=True, timeout=)``."""
        if not self.forks(env):
            return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            process = self.popen(argv, cwd, env, out, err)
            try:
                code = process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(list(argv), code, out.read(), err.read())

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.connect(self.path)
                socket.send_fds(conn, [json.dumps({"stop": True}).encode()], [])
                conn.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._dir.cleanup()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.close()


if __name__ == "__main__":
    program = serve(sys.argv[1])
    del serve  # the program's process keeps nothing of the server's but its imports
    program()
