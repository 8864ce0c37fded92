#!/usr/bin/env python3
"""Set up and run sqlalchemy_watchdog from a fresh clone, with only Python 3.11+.

    python3 dev.py example   # the orders example on SQLite (watchdog.db)
    python3 dev.py test      # ruff + mypy --strict, then the test suite
                             # (extra arguments go to pytest); installs Debian's
                             # chromium + chromium-driver for the browser tests
                             # when they are missing (as root or with sudo -n)

Creates ./.venv on first use and (re)installs the package with its test
extras whenever pyproject.toml changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".installed"


def ensure_env() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 -- dev.py itself may be run by an older python3
        sys.exit(f"Python 3.11+ is needed, this is {sys.version.split()[0]}")
    if not PYTHON.exists():
        print("creating .venv ...", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    print("installing sqlalchemy-watchdog[test] into .venv ...", flush=True)
    pip = [str(PYTHON), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "-e", f"{ROOT}[test]"], check=True)
    STAMP.write_text(wanted)


#: Debian's browser and its WebDriver, which the dashboard's browser tests
#: (tests/test_web_browser.py) drive; nothing else is downloaded for them.
BROWSER = Path("/usr/bin/chromium")
BROWSER_DRIVER = Path("/usr/bin/chromedriver")


def ensure_browser() -> None:
    """Install Debian's chromium and chromium-driver with apt-get when missing
    (as root, else through `sudo -n`); else warn: the browser tests then skip,
    and fail under CI=true."""
    if BROWSER.exists() and BROWSER_DRIVER.exists():
        return
    why = None
    if shutil.which("apt-get") is None:
        why = "no apt-get on this machine"
    elif hasattr(os, "geteuid") and os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        prefix = ["sudo", "-n"]
    else:
        why = "not root and `sudo -n` is not allowed"
    if why is None:
        print("installing Debian's chromium and chromium-driver for the browser tests ...", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        apt = [*prefix, "apt-get", "-q", "-o", "Dpkg::Use-Pty=0"]
        subprocess.run([*apt, "update"], env=env, stdout=subprocess.DEVNULL)
        packages = ["chromium", "chromium-driver"]
        install = subprocess.run([*apt, "install", "-y", *packages], env=env, stdout=subprocess.DEVNULL)
        if install.returncode == 0 and BROWSER.exists() and BROWSER_DRIVER.exists():
            return
        why = f"apt-get install chromium chromium-driver exited {install.returncode} without them"
    print(
        f"WARNING: {BROWSER} / {BROWSER_DRIVER} missing ({why}): the dashboard's browser tests "
        "will be skipped (and fail under CI=true). Install Debian's chromium and chromium-driver.",
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("example", "test"):
        print(__doc__)
        return 2
    ensure_env()
    command, rest = argv[0], argv[1:]
    if command == "example":
        cmd = [str(PYTHON), str(ROOT / "examples" / "orders.py"), *rest]
        return subprocess.run(cmd, cwd=ROOT).returncode
    # Static checks first: a lint or type error fails the run before any test.
    checks = [
        [str(PYTHON), "-m", "ruff", "check", "sqlalchemy_watchdog", "tests", "benchmarks"],
        [str(PYTHON), "-m", "mypy", "--strict", "sqlalchemy_watchdog"],
    ]
    for check in checks:
        print("$", " ".join(check[2:]), flush=True)
        returncode = subprocess.run(check, cwd=ROOT).returncode
        if returncode != 0:
            print(f"{check[2]} failed (exit {returncode}); not running the tests", file=sys.stderr)
            return returncode
    ensure_browser()
    cmd = [str(PYTHON), "-m", "pytest", *rest]
    return subprocess.run(cmd, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
