"""The fork server of the docs and Alembic tests runs each program as ``python`` would.

``tests/forkrun.py`` saves the docs blocks and the Alembic commands their
start-up by forking them from an interpreter that imported the package once.
These are the promises that make that the same as a fresh interpreter for
them: a process of its own per program, its own working directory,
environment, ``sys.argv`` and ``sys.path[0]``, the default signal handling,
and an interpreter's way of ending.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import forkrun

pytestmark = pytest.mark.skipif(not forkrun.available(), reason="os.fork is not there")


def _run(
    forks: forkrun.ForkServer, tmp_path: Path, code: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(code)
    return forks.run([sys.executable, str(script), "an-arg"], tmp_path, env or {"PATH": os.environ["PATH"]}, 60)


def test_a_forked_program_sees_its_own_directory_environment_argv_and_path(
    forks: forkrun.ForkServer, tmp_path: Path
) -> None:
    (tmp_path / "neighbour.py").write_text("VALUE = 'from the script directory'\n")
    result = _run(
        forks,
        tmp_path,
        "import os, sys, neighbour\n"
        "print(os.getcwd()); print(os.environ.get('ONLY_HERE')); print(sorted(os.environ) == ['ONLY_HERE', 'PATH'])\n"
        "print(sys.argv); print(sys.path[0]); print(neighbour.VALUE); print(__name__)\n",
        {"PATH": os.environ["PATH"], "ONLY_HERE": "yes"},
    )
    assert result.returncode == 0, result.stderr
    script = str(tmp_path / "prog.py")
    assert result.stdout.splitlines() == [
        str(tmp_path),
        "yes",
        "True",
        repr([script, "an-arg"]),
        str(tmp_path),
        "from the script directory",
        "__main__",
    ]


def test_nothing_one_forked_program_does_is_seen_by_the_next(forks: forkrun.ForkServer, tmp_path: Path) -> None:
    first = _run(
        forks, tmp_path, "import sqlalchemy_watchdog, sys\nsqlalchemy_watchdog.MARK = 1\nsys.modules['marked'] = sys\n"
    )
    assert first.returncode == 0, first.stderr
    second = _run(
        forks,
        tmp_path,
        "import sqlalchemy_watchdog, sys\nprint(hasattr(sqlalchemy_watchdog, 'MARK'), 'marked' in sys.modules)\n",
    )
    assert (second.returncode, second.stdout) == (0, "False False\n"), second.stderr
    pids = {_run(forks, tmp_path, "import os; print(os.getpid())").stdout for _ in range(2)}
    assert len(pids) == 2


def test_a_forked_program_ends_as_an_interpreter_does(forks: forkrun.ForkServer, tmp_path: Path) -> None:
    raised = _run(forks, tmp_path, "raise ValueError('boom')\n")
    assert raised.returncode == 1 and "ValueError: boom" in raised.stderr and "Traceback" in raised.stderr
    assert _run(forks, tmp_path, "import sys; sys.exit(3)\n").returncode == 3
    ended = _run(
        forks,
        tmp_path,
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread joined', flush=True))).start()\n",
    )
    assert (ended.returncode, ended.stdout) == (0, "thread joined\natexit ran\n"), ended.stderr


def test_a_forked_program_has_the_default_signal_handling_and_can_start_subprocesses(
    forks: forkrun.ForkServer, tmp_path: Path
) -> None:
    child = _run(
        forks, tmp_path, "import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', 'pass']).returncode)\n"
    )
    assert child.returncode == 0, child.stderr
    script = tmp_path / "wait.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    log = (tmp_path / "log").open("w+")
    process = forks.popen([sys.executable, str(script)], tmp_path, {"PATH": os.environ["PATH"]}, log, subprocess.STDOUT)
    assert isinstance(process, forkrun.Forked)
    deadline = time.monotonic() + 30
    while "up" not in (tmp_path / "log").read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    log.close()


def test_a_program_whose_start_up_differs_from_the_servers_is_a_subprocess(
    forks: forkrun.ForkServer, tmp_path: Path
) -> None:
    # PYTHONPATH is read when an interpreter starts: the server's sys.path is not that program's.
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path / "extra")}
    assert not forks.forks(env) and forks.forks({"PATH": os.environ["PATH"]})
    script = tmp_path / "path.py"
    script.write_text("import sys; print(sys.path[1])\n")
    result = forks.run([sys.executable, str(script)], tmp_path, env, 60)
    assert (result.returncode, result.stdout) == (0, f"{tmp_path / 'extra'}\n"), result.stderr


def test_a_forked_programs_signal_dispositions_are_those_of_a_fresh_interpreter(
    forks: forkrun.ForkServer, tmp_path: Path
) -> None:
    code = (
        "import signal\n"
        "print([str(signal.getsignal(s)) for s in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM)])\n"
    )
    script = tmp_path / "signals.py"
    script.write_text(code)
    env = {"PATH": os.environ["PATH"]}
    fresh = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    forked = forks.run([sys.executable, str(script)], tmp_path, env, 60)
    assert fresh.returncode == 0 and forked.returncode == 0, fresh.stderr + forked.stderr
    assert forked.stdout == fresh.stdout
