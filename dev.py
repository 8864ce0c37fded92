#!/usr/bin/env python3
"""Set up and run sqlalchemy_watchdog from a fresh clone, with only Python 3.11+.

    python3 dev.py example   # the orders example on SQLite (watchdog.db)
    python3 dev.py docs      # build the docs site into docs/_build/html
    python3 dev.py test      # ruff check, ruff format --check, lint-imports
                             # (the layer contracts), mypy --strict
                             # (the package, tests/ and examples/),
                             # the docs build, then pytest on two workers
                             # per CPU (pytest-xdist; extra arguments go
                             # to pytest, -n 0 runs it in one process)
    python3 dev.py test --faults
                             # the same, then the timed fault tests in one
                             # process of their own (always under CI=true;
                             # CI=true also ends with the release check below)
    python3 dev.py test --install-system-packages
                             # the same, after installing the Debian packages
                             # that optional test groups need (apt-get, as root
                             # or through `sudo -n`; prints what it installs)
    python3 dev.py release-check
                             # what users install: the sdist and the wheel built
                             # from a clean copy of the checkout, `twine check`, the
                             # wheel with its extras in a fresh environment
                             # outside the checkout and the smoke suite
                             # (tests/release) against that installed copy, a
                             # plain `pip install CHECKOUT[...]`, and the docs
                             # built as Read the Docs builds them (CI=true:
                             # `dev.py test` runs it after the tests)

release-check works in a temporary directory outside the checkout, with
virtual environments of its own there (deleted afterwards unless it
failed), and leaves the checkout as it was.

Each command creates ./.venv on first use and (re)installs the package
(editable) with its test extras into it from the package index whenever
pyproject.toml changes. Nothing is installed outside .venv, except the
Debian packages of SYSTEM_PACKAGES: with --install-system-packages, or
when CI=true. Without them `dev.py test` says which test groups will skip
and how to enable them.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".installed"
DOCS = ROOT / "docs"
DOCS_HTML = DOCS / "_build" / "html"
#: What `ruff check` and `ruff format --check` look at.
LINTED = ["sqlalchemy_watchdog", "tests", "benchmarks", "examples", "docs", "dev.py"]
#: What `mypy --strict` checks: the package, its tests and the examples.
TYPED = ["sqlalchemy_watchdog", "tests", "examples"]
INSTALL_FLAG = "--install-system-packages"
#: Adds the timed fault tests to a run outside CI (see :func:`pytest_runs`).
FAULTS_FLAG = "--faults"


@dataclass(frozen=True)
class SystemPackages:
    """Debian packages an optional group of tests needs; the tests skip
    (and fail under CI=true) when one of ``paths`` is missing."""

    tests: str
    packages: tuple[str, ...]
    paths: tuple[Path, ...]

    def missing(self) -> bool:
        return not all(path.exists() for path in self.paths)


SYSTEM_PACKAGES = (
    SystemPackages(
        "browser tests (tests/integration/test_web_browser.py, tests/integration/test_docs_site.py)",
        ("chromium", "chromium-driver"),
        (Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")),
    ),
    SystemPackages(
        "connection-pooler tests (PgBouncer)",
        ("pgbouncer",),
        (Path("/usr/sbin/pgbouncer"),),
    ),
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


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


#: Run as root by install_system_packages: `apt-get update`, then the
#: packages without their recommendations, while a temporary policy-rc.d
#: (unless one exists) keeps the install from starting any service.
APT_SCRIPT = """\
set -eu
export DEBIAN_FRONTEND=noninteractive
made_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  made_policy=1
fi
trap 'if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
apt-get -q -o Dpkg::Use-Pty=0 update
apt-get -q -o Dpkg::Use-Pty=0 install -y --no-install-recommends "$@"
"""


def root_prefix() -> tuple[list[str] | None, str]:
    """How to run a command as root here: ``([], "")`` as root, ``(["sudo",
    "-n"], "")`` when sudo needs no password, else ``(None, why not)``."""
    if shutil.which("apt-get") is None:
        return None, "this machine has no apt-get"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return [], ""
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n"], ""
    return None, "not root, and `sudo -n` is not allowed"


def install_system_packages(groups: list[SystemPackages]) -> bool:
    """Install the Debian packages of ``groups`` with apt-get, saying exactly
    what it runs; True when every path of every group is there afterwards."""
    packages = [package for group in groups for package in group.packages]
    prefix, why = root_prefix()
    if prefix is None:
        print(f"cannot install {' '.join(packages)}: {why}", file=sys.stderr, flush=True)
        return False
    command = [*prefix, "sh", "-c", APT_SCRIPT, "apt-get-install", *packages]
    shown = " ".join([*prefix, "apt-get update &&", *prefix, "apt-get install -y --no-install-recommends", *packages])
    print(f"installing Debian packages for the tests: {shown}", flush=True)
    print("  (no service is started: a temporary /usr/sbin/policy-rc.d refuses it)", flush=True)
    result = subprocess.run(command)
    if result.returncode != 0:
        print(f"apt-get exited {result.returncode}", file=sys.stderr, flush=True)
    return not any(group.missing() for group in groups)


def system_packages(install: bool) -> None:
    """Install what optional test groups miss when asked to (or under CI),
    else say once which groups skip and the command that enables them."""
    missing = [group for group in SYSTEM_PACKAGES if group.missing()]
    if not missing:
        return
    if install or in_ci():
        if install_system_packages(missing):
            return
        missing = [group for group in SYSTEM_PACKAGES if group.missing()]
        print("still missing after apt-get:", file=sys.stderr)
    else:
        print("Some system packages are not installed; these tests will skip:", file=sys.stderr)
    for group in missing:
        print(f"  - {group.tests}: needs {', '.join(group.packages)}", file=sys.stderr)
    if not (install or in_ci()):
        print(
            f"To install them (Debian, apt-get as root or through `sudo -n`): python3 dev.py test {INSTALL_FLAG}",
            file=sys.stderr,
        )
    else:
        print("Under CI=true these tests fail instead of skipping.", file=sys.stderr)
    sys.stderr.flush()


#: Sphinx: warnings are errors (-W), every one is reported (--keep-going),
#: and every cross-reference must resolve (-n).
SPHINX_OPTIONS = ["-b", "html", "-W", "--keep-going", "-n", "-q"]
#: A build from a fresh environment: every page read and checked again.
FRESH = "-E"
#: Writes every page: an incremental build after a page changed reads again
#: only the changed pages, but writes (and so resolves the links of) every
#: page, so a change that breaks a link on an unchanged page fails it too --
#: about 5 s more than writing only the pages read.
WRITE_ALL = "-a"


def docs_command(out: Path = DOCS_HTML, *extra: str, fresh: bool = True) -> list[str]:
    """The docs build (:data:`SPHINX_OPTIONS`), after printing it: from a
    fresh environment (every page checked), or -- ``fresh=False`` -- reading
    again only the pages changed since the last build that passed (their
    sources, or the modules their API pages document) and, when a page
    changed, writing every page (:data:`WRITE_ALL`)."""
    if fresh:
        options = [*SPHINX_OPTIONS, FRESH]
    else:
        options = [*SPHINX_OPTIONS, WRITE_ALL] if docs_outdated(out, pages=True) else SPHINX_OPTIONS
    print("$ sphinx", *options, "docs", os.path.relpath(out, ROOT), flush=True)
    return [str(PYTHON), "-m", "sphinx", *options, str(DOCS), str(out), *extra]


def newest_docs_source(*, pages: bool = False) -> float:
    """The latest modification time of what the site is built from: the
    pages and the files they include, and (unless ``pages``) the package
    its API pages document."""
    sources = [
        *(path for path in DOCS.rglob("*") if "_build" not in path.relative_to(DOCS).parts),
        *ROOT.glob("*.md"),
        ROOT / "benchmarks" / "README.md",
        *([] if pages else (ROOT / "sqlalchemy_watchdog").rglob("*.py")),
    ]
    return max(path.stat().st_mtime for path in sources if path.is_file())


def docs_outdated(out: Path = DOCS_HTML, *, pages: bool = False) -> bool:
    """Whether a source (with ``pages``: a page or a file it includes)
    changed since the build in ``out`` last passed, or none did."""
    passed = out / PASSED_STAMP
    return not passed.is_file() or passed.stat().st_mtime < newest_docs_source(pages=pages)


#: Written into the site when a build passed: its time is what the site is
#: as new as.
PASSED_STAMP = ".passed"


def forget_docs_build(out: Path = DOCS_HTML) -> None:
    """After a docs build that failed: drop its saved environment, so the
    next build reads every page again (a page whose warning failed it would
    otherwise count as read, and its warning would not come back)."""
    shutil.rmtree(out / ".doctrees", ignore_errors=True)
    (out / PASSED_STAMP).unlink(missing_ok=True)


def docs_passed(out: Path = DOCS_HTML) -> None:
    """Stamp ``out`` as a site that passed, built from the sources as they are now."""
    (out / PASSED_STAMP).touch()


def build_docs(out: Path = DOCS_HTML, *extra: str) -> int:
    returncode = subprocess.run(docs_command(out, *extra), cwd=ROOT).returncode
    if returncode != 0:
        forget_docs_build(out)
    else:
        docs_passed(out)
    return returncode


def side_by_side(commands: list[list[str]]) -> list[int]:
    """Run ``commands`` at once (each is one process on one CPU), then print
    their output in the order given; their exit statuses."""
    running = [
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for command in commands
    ]
    codes = []
    for process in running:
        output, _ = process.communicate()
        print(output, end="", flush=True)
        codes.append(process.returncode)
    return codes


def workers() -> int:
    """How many pytest-xdist workers: two per CPU (at most 8). The suite
    mostly waits -- on leases, polls, subprocesses and the database -- so a
    worker per CPU left the CPUs half idle; more would open more PostgreSQL
    connections than its default limit of 100 allows."""
    return min(8, 2 * (os.cpu_count() or 1))


def parallel(rest: list[str]) -> list[str]:
    """pytest-xdist's options for a run of the suite: :func:`workers` workers,
    each test handed to whichever worker is free, but a file with a module-
    or class-scoped fixture kept on one worker (``--dist loadgroup``, which
    tests/conftest.py's ``pytest_xdist_make_scheduler`` implements), so the
    docs build or the plan database is made once and one slow file does not
    keep one worker busy while the others idle -- unless the arguments choose
    (``-n 0`` runs in this process, ``-p no:xdist`` without the plugin)."""
    chosen = any(arg == "no:xdist" or arg.startswith(("-n", "--numprocesses")) for arg in rest)
    return [] if chosen else ["-n", str(workers()), "--dist", "loadgroup"]


#: The fault tests: real processes, signals and timing on the database clock.
FAULTS = "tests/faults"
#: Fault tests that time nothing, so they run with the rest of the suite in
#: parallel, not in the serial run: the bad-input table (a refusal naming
#: the field, nothing written, poisoned rows read and skipped), the
#: Hypothesis state machine (its database clock is a table it sets: leases
#: end when the model says, however slow the machine; its pinned cases only
#: wait for a 1 ms lease or backoff to be over), the bulk races (each race
#: forced at its worst moment by an event hook, no sleeps) and the unique-key
#: races (processes released by one barrier; an hour's windows never end).
UNTIMED_FAULTS = (
    "tests/faults/test_bad_input.py",
    "tests/faults/test_bulk_races.py",
    "tests/faults/test_state_machine.py",
    "tests/faults/test_unique_races.py",
)


def timed_faults() -> list[str]:
    """The fault test files that run apart from the rest of the suite (:func:`pytest_runs`)."""
    files = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / FAULTS).glob("test_*.py"))
    return [file for file in files if file not in UNTIMED_FAULTS]


def as_given(rest: list[str]) -> bool:
    """Whether the pytest arguments name test paths or choose the workers: one run as given."""
    names_paths = any((ROOT / arg.split("::")[0]).exists() for arg in rest if not arg.startswith("-"))
    return names_paths or parallel(rest) == []


def with_faults(rest: list[str]) -> bool:
    """Whether ``dev.py test`` runs the timed fault tests: under CI=true, with
    ``--faults``, or with ``WATCHDOG_SLOW_TESTS=1`` (which asks for the slow ones)."""
    return in_ci() or FAULTS_FLAG in rest or os.environ.get("WATCHDOG_SLOW_TESTS") == "1"


#: Each whole run ends with its slowest tests, so a run that nears its time
#: budget (the default suite under 5 minutes, CI under 30) says where the time went.
DURATIONS = ["--durations=15", "--durations-min=3"]


#: The timed fault tests run in two workers, each taking whole files
#: (``--dist loadfile``): they mostly wait -- on leases, restarts, kills --
#: so two streams of them share the two CPUs without starving each other,
#: where eight workers of the whole suite made them flaky. One stream took
#: about 16 of CI's 30 minutes once MariaDB's fault tests joined them.
TIMED_WORKERS = ["-n", "2", "--dist", "loadfile"]


def pytest_runs(rest: list[str], faults: bool = True) -> list[list[str]]:
    """The pytest runs of ``dev.py test``: the suite spread over the CPUs
    (:func:`parallel`), then -- with ``faults`` -- the timed fault tests
    (:func:`timed_faults`) in two workers of their own (:data:`TIMED_WORKERS`),
    so their leases, heartbeats and kills never share the CPUs with the
    suite's eight workers (on 2 cores that made them flaky, not wrong). Without ``faults`` (a day's run
    outside CI) they are left out: they wait out real leases and take about
    two minutes, which a run within its time cannot hold. Arguments naming
    test paths, or choosing the workers, make it one run as given."""
    if as_given(rest):
        return [[*parallel(rest), *rest]]
    timed = timed_faults()
    ignored = [option for file in timed for option in ("--ignore", file)]
    runs = [[*parallel(rest), *ignored, *DURATIONS, *rest]]
    if faults:
        runs.append([*TIMED_WORKERS, *timed, *DURATIONS, *rest])
    return runs


def exit_status(returncode: int) -> int:
    """A child's status as ours: killed by signal N is 128 + N, as a shell says."""
    return 128 - returncode if returncode < 0 else returncode


def keep_bytecode() -> None:
    """Let the run's processes keep compiled bytecode (``__pycache__``, which
    git ignores), whatever ``PYTHONDONTWRITEBYTECODE`` the shell set: with it,
    each of the suite's workers rewrote every test module's asserts afresh
    (collection 15 s of CPU each instead of 4) and every process a test starts
    -- executor children, the CLI, the docs' blocks -- compiled the package from
    its sources. Python checks each cached file against its source's time and size."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def test(rest: list[str]) -> int:
    install = INSTALL_FLAG in rest
    faults = with_faults(rest)
    rest = [arg for arg in rest if arg not in (INSTALL_FLAG, FAULTS_FLAG)]
    keep_bytecode()
    # Static checks and the docs first: any failure stops the run before a test.
    checks = [
        [str(PYTHON), "-m", "ruff", "check", *LINTED],
        [str(PYTHON), "-m", "ruff", "format", "--check", *LINTED],
        # The layer contracts of pyproject.toml's [tool.importlinter] (under 3 s).
        [str(BIN / "lint-imports"), "--no-cache"],
    ]
    for check in checks:
        shown = check[2:] if check[0] == str(PYTHON) else [Path(check[0]).name, *check[1:]]
        print("$", shlex.join(shown), flush=True)
        returncode = subprocess.run(check, cwd=ROOT).returncode
        if returncode != 0:
            print(f"{shlex.join(shown[:2])} failed (exit {returncode}); not running the tests", file=sys.stderr)
            return exit_status(returncode)
    # mypy (about 10 s without its cache, as in a fresh clone) and Sphinx
    # (10-15 s from a fresh environment, 1-2 s for a few changed pages) share
    # nothing: one CPU each, side by side. Outside CI the docs build reads
    # only what changed since the last build that passed; CI (a fresh clone)
    # and `dev.py docs` read every page.
    mypy = [str(PYTHON), "-m", "mypy", "--strict", *TYPED]
    print("$", shlex.join(mypy[2:]), flush=True)
    mypy_status, docs_status = side_by_side([mypy, docs_command(fresh=in_ci())])
    if docs_status != 0:
        forget_docs_build()
    else:
        docs_passed()
    if mypy_status != 0:
        print(f"mypy --strict failed (exit {mypy_status}); not running the tests", file=sys.stderr)
        return exit_status(mypy_status)
    if docs_status != 0:
        print(f"the docs build failed (exit {docs_status}); not running the tests", file=sys.stderr)
        return exit_status(docs_status)
    system_packages(install)
    # tests/integration/test_docs_site.py reads this build instead of making its own (not under CI).
    env = {**os.environ, "WATCHDOG_TEST_DOCS_HTML": str(DOCS_HTML)}
    runs = pytest_runs(rest, faults)
    # The release check runs beside the timed fault tests, which mostly wait
    # (leases, heartbeats, restarts) and use little of the CPUs: about three
    # minutes of CI's thirty saved. Its output is shown once it ended.
    beside = len(runs) > 1 and with_release_check(rest)
    codes: list[int] = []
    background: BackgroundRelease | None = None
    for index, run in enumerate(runs):
        if beside and index == len(runs) - 1:
            background = BackgroundRelease.start()
        codes.append(subprocess.run([str(PYTHON), "-m", "pytest", *run], cwd=ROOT, env=env).returncode)
    if not faults and not as_given(rest):
        print(
            f"left out: the timed fault tests ({len(timed_faults())} files in {FAULTS}, about two minutes);"
            f" `python3 dev.py test {FAULTS_FLAG}` runs them, and CI always does",
            flush=True,
        )
    if all(code == 5 for code in codes):
        print("pytest collected no tests (exit 5): that is a failure", file=sys.stderr)
        return 5
    status = exit_status(next((code for code in codes if code not in (0, 5)), 0))
    if background is not None:
        release = background.finish()
        status = status or release
    elif with_release_check(rest):
        # What users install, after the suite of the checkout: the built wheel
        # in a fresh environment outside it (about 3 minutes on 2 cores).
        release = release_check([])
        status = status or release
    elif not as_given(rest):
        print("left out: the release check (the built wheel, installed outside the checkout);"
              " `python3 dev.py release-check` runs it, and CI always does", flush=True)  # fmt: skip
    return status


@dataclass
class BackgroundRelease:
    """``dev.py release-check`` in a process of its own, its output kept in
    a file until :meth:`finish` shows it (so it does not interleave with the
    pytest run beside it)."""

    process: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, command: list[str] | None = None) -> BackgroundRelease:
        """Start ``command`` (by default ``dev.py release-check``)."""
        command = command or [sys.executable, str(ROOT / "dev.py"), "release-check"]
        log = Path(tempfile.mkstemp(prefix="watchdog-release-", suffix=".log")[1])
        print(f"release-check: started beside the timed fault tests (its output follows them; {log})", flush=True)
        with log.open("wb") as out:
            process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        return cls(process, log)

    def finish(self) -> int:
        """Wait for the release check; show its output; its exit status."""
        returncode = self.process.wait()
        sys.stdout.write(self.log.read_text(errors="replace"))
        sys.stdout.flush()
        self.log.unlink(missing_ok=True)
        return returncode


def with_release_check(rest: list[str]) -> bool:
    """Whether ``dev.py test`` ends with :func:`release_check`: under CI=true,
    unless the arguments name test paths or choose the workers (a run as given)."""
    return in_ci() and not as_given(rest)


#: The extras a user installs, per the README's Install section.
USER_EXTRAS = "web,otel,cron"
#: The smoke suite, run against the installed wheel (tests/release/).
RELEASE_TESTS = "tests/release"
#: Tests of the main suite that also run against the installed wheel: the
#: README's quickstart (its blocks only) and the docs' Alembic recipe.
RELEASE_ALSO = ("tests/integration/test_readme.py", "tests/integration/test_alembic_recipe.py")
#: What the smoke run copies from the clean clone beside its tests -- never the
#: package itself, so only the installed copy can be imported.
SMOKE_COPIES = ("tests", "docs", "examples", "README.md", "pyproject.toml", "RELIABILITY.md", "benchmarks/README.md")


class ReleaseCheckFailed(Exception):
    """A step of :func:`release_check` failed; the message says which."""


def _run_step(what: str, command: list[str], **kwargs: object) -> None:
    """Run one step of the release check, printing it; raise naming it on failure."""
    print(f"release-check: {what}", flush=True)
    print("  $", shlex.join(str(part) for part in command), flush=True)
    result = subprocess.run(command, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise ReleaseCheckFailed(f"{what} (exit {exit_status(result.returncode)})")


def _fresh_env(path: Path) -> Path:
    """A new virtual environment at ``path``; its python."""
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")


def clean_copy(destination: Path) -> int:
    """Copy the checkout as git sees it -- tracked files with their changes,
    and new files git does not ignore -- into ``destination``: what a clean
    clone would hold once the changes are committed, without ``.venv``,
    build artefacts or caches. In CI's fresh clone that is the clone. The
    number of files copied."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    count = 0
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the work tree is not copied
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
            count += 1
    return count


def release_check(rest: list[str]) -> int:
    """Build, check, install and smoke-test the package as users get it.

    Works in a temporary directory outside the checkout: a clean copy of
    the checkout (:func:`clean_copy`), the sdist and the wheel built from
    it (``python -m build``: the wheel is built from the sdist, so the sdist
    is complete too), ``twine check --strict``, then a fresh virtual environment holding the wheel
    with its extras (and the test extra), where the smoke suite
    (:data:`RELEASE_TESTS` and :data:`RELEASE_ALSO`) runs from a copy of the
    copy's tests without the package, so every import is of the installed
    copy (tests/release/conftest.py refuses any other); then a second
    environment with a plain ``pip install CHECKOUT[...]`` as the README says,
    which imports every module and builds the docs as Read the Docs does
    (.readthedocs.yaml). Arguments go to the smoke suite's pytest. Says which
    step failed."""
    work = Path(tempfile.mkdtemp(prefix="watchdog-release-"))
    keep = False
    try:
        clone = work / "source"
        print(
            f"release-check: a clean copy of the checkout ({clean_copy(clone)} files git sees) in {clone}", flush=True
        )
        dist = work / "dist"
        _run_step("build the sdist and the wheel", [str(PYTHON), "-m", "build", "--outdir", str(dist), str(clone)])
        artifacts = sorted(dist.iterdir())
        _run_step("twine check", [str(PYTHON), "-m", "twine", "check", "--strict", *map(str, artifacts)])
        [wheel] = [path for path in artifacts if path.suffix == ".whl"]

        wheel_python = _fresh_env(work / "wheel-env")
        pip = ["-m", "pip", "--disable-pip-version-check", "-q", "install"]
        _run_step(
            f"install {wheel.name}[{USER_EXTRAS},test] into a fresh environment",
            [str(wheel_python), *pip, f"{wheel}[{USER_EXTRAS},test]"],
        )
        smoke = work / "smoke"
        smoke.mkdir()
        for name in SMOKE_COPIES:
            source = clone / name
            if source.is_dir():
                shutil.copytree(source, smoke / name)
            else:
                (smoke / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, smoke / name)
        env = {
            **os.environ,
            "WATCHDOG_RELEASE_CHECK": "1",
            "WATCHDOG_RELEASE_WHEEL": str(wheel),
            "WATCHDOG_RELEASE_SOURCE": str(clone),
            "WATCHDOG_RELEASE_CHECKOUT": str(ROOT),
        }
        env.pop("PYTHONPATH", None)
        tests = [RELEASE_TESTS, RELEASE_ALSO[1], RELEASE_ALSO[0], "-k", "release or alembic_recipe or README.md"]
        _run_step(
            "the smoke suite against the installed wheel",
            [str(wheel_python), "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-q", *tests, *rest],
            cwd=smoke,
            env=env,
        )

        checkout_python = _fresh_env(work / "checkout-env")
        _run_step(
            f"pip install CHECKOUT[{USER_EXTRAS},docs] (not editable)",
            [str(checkout_python), *pip, f"{clone}[{USER_EXTRAS},docs]"],
        )
        _run_step(
            "every module imports from the checkout's plain install",
            [str(checkout_python), str(clone / RELEASE_TESTS / "import_all.py"), str(clone)],
            cwd=work,
            env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
        )
        _run_step(
            "the docs as Read the Docs builds them (.readthedocs.yaml: -W)",
            [str(checkout_python), "-m", "sphinx", *SPHINX_OPTIONS, str(clone / "docs"), str(work / "html")],
            cwd=clone,
        )
    except ReleaseCheckFailed as failed:
        keep = True
        print(f"release-check FAILED at: {failed}; its files are kept in {work}", file=sys.stderr, flush=True)
        return 1
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    print(
        "release-check: the built wheel installs, imports and passes its smoke suite outside the checkout", flush=True
    )
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("example", "docs", "test", "release-check"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    ensure_env()
    if command == "example":
        cmd = [str(PYTHON), str(ROOT / "examples" / "orders.py"), *rest]
        return exit_status(subprocess.run(cmd, cwd=ROOT).returncode)
    if command == "release-check":
        return release_check(rest)
    if command == "docs":
        returncode = exit_status(build_docs(DOCS_HTML, *rest))
        if returncode == 0:
            print(f"built {DOCS_HTML / 'index.html'}")
        return returncode
    return test(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
