"""Every snippet of the README and of the docs site runs as pasted.

The README and the pages under ``docs/`` promise that their Python snippets
run as pasted into a fresh interpreter. This module extracts them and runs
them, one test per block (``README.md:LINE``, ``docs/howto/jobs.md:LINE``),
with these conventions -- authors, follow them; a new block, or a new page,
is picked up by itself:

* The sources are README.md, every ``.md`` file under ``docs/`` (but
  ``docs/_build``), and the files a docs page brings in with a MyST
  ``{include}`` directive (RELIABILITY.md, benchmarks/README.md): each file
  once, however many pages include it. A fence whose language is a MyST
  directive (```` ```{toctree} ````, ```` ```{eval-rst} ````) is not code.

* Every ```` ```python ```` block is a complete program. It runs in a fresh
  process of this Python in a fresh temporary working directory, so nothing
  carries over from one block to the next. (The process is forked from an
  interpreter that imported the package once, ``tests/forkrun.py``: it runs
  the block as ``python snippet.py`` would, with its own working directory,
  environment and ``sys.path``, without a second of start-up per block.) Before it
  runs, the shell blocks its file marks ``<!-- readme-test: run -->`` (the
  Quickstart's ``sqlalchemy-watchdog upgrade``; a file without one gets the
  README's) run there, as the reader runs them first: the ``watchdog_jobs``
  table exists in ``sqlite:///watchdog.db``. The block must exit with status 0.
  (On SQLite the set-up runs once per test session and each block's directory
  starts as a copy of what it left; on PostgreSQL it runs before each block.)
* ``mailer`` stands for the reader's own code (the README says so): the
  working directory holds :data:`MAILER`, a ``mailer.py`` whose
  ``send(order_id)`` notes the call in ``mailer.log`` and returns True.
  It also holds ``orders.py``, a copy of ``examples/orders.py``, for the
  tests of the example that the README says to save next to it, and
  ``reports.py``, a copy of ``examples/reports.py``: the importable module of
  handlers that docs/howto/executors.md runs in child processes.
* A block that calls ``run_forever()`` serves until SIGTERM. Before it starts,
  the test enqueues :data:`PROBE`, a job of the queue ``emails`` with payload
  ``{"order_id": 42}``; once that job is settled the test sends SIGTERM. The
  job must be ``completed``, ``mailer.send(42)`` must have been called and
  the process must exit with status 0.
* A block defining ``def test_...`` is a pytest module: it is saved as
  ``test_snippet.py`` and run with ``python -m pytest``, which must pass.
* A block naming ``postgresql+psycopg://app@localhost/app`` (the README's
  example PostgreSQL URL) runs on PostgreSQL: that URL is replaced by a fresh
  throwaway database (``WATCHDOG_TEST_POSTGRES_URL``, see ``conftest.py``),
  and the marked shell blocks run with ``WATCHDOG_DATABASE_URL`` set to it.
  Without a PostgreSQL server such a block is skipped.
* ``<!-- readme-test: skip: REASON -->`` on the line before a block: not run
  here; the reason says where it is tested (e.g. the Alembic ``env.py`` lines,
  run by ``tests/integration/test_alembic_recipe.py``).
* Blocks that are deliberately not runnable use other fences: ``sh``,
  ``bash``, ``ini``, ``sql``, ``text``, ``python-untested`` (code of an API
  that is not there yet, or files of the reader's own application), or none.
  Only shell blocks marked ``run`` are run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, JobState, Outcome, Watchdog
from tests import forkrun

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: The example, importable as ``orders`` by the README's tests of it.
EXAMPLE = README.parent / "examples" / "orders.py"
#: The process executor's example handlers, importable as ``reports``.
REPORTS = README.parent / "examples" / "reports.py"
BIN = Path(sys.executable).parent
#: The README's example PostgreSQL URL, replaced by a throwaway database.
EXAMPLE_POSTGRES_URL = "postgresql+psycopg://app@localhost/app"
#: The stand-in for the reader's own ``mailer`` module.
MAILER = '''\
"""Stand-in for the reader's own mail code (README: "mailer stands for your own code")."""


def send(order_id: int) -> bool:
    with open("mailer.log", "a") as log:
        log.write(f"{order_id}\\n")
    return True
'''
#: The job a serving block must complete.
PROBE = Job("readme-probe", "emails", payload={"order_id": 42})
#: Fence languages a README block may have; only ``python`` (and marked ``sh``) run.
KNOWN_LANGUAGES = {"python", "python-untested", "sh", "bash", "ini", "sql", "text", ""}
TIMEOUT = 120.0

FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[^\s`]*)(?P<argument>[^`]*?)\s*$")
#: A MyST directive fence: ```{include} ../../RELIABILITY.md
DIRECTIVE = re.compile(r"^\{(?P<name>[\w:-]+)\}$")
MARKER = re.compile(r"^\s*<!--\s*readme-test:\s*(?P<what>[^>]*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None  # the readme-test marker on the line before, if any
    source: str = "README.md"  # the file, relative to the repository root

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"


def blocks(markdown: str, source: str = "README.md") -> list[Block]:
    """The fenced code blocks of ``markdown``, dedented, in order; MyST
    directives (``lang`` ``{name}``, the argument after it as ``code``) too."""
    found: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent = opening["indent"]
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != f"{indent}```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{source}:{i + 1}: unclosed code fence")
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        if DIRECTIVE.match(opening["lang"]):
            code = opening["argument"].strip()
        elif opening["argument"].strip():
            raise AssertionError(f"{source}:{i + 1}: text after the fence's language: {lines[i]!r}")
        else:
            code = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        found.append(Block(i + 1, opening["lang"], code, marker["what"] if marker else None, source))
        i = end + 1
    return found


def sources() -> list[Path]:
    """README.md, every page under docs/, and the files pages ``{include}``:
    each file once (docs/design.md is a page's include and a file of docs/)."""
    pages = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)
    found = [README, *pages]
    for page in pages:
        for block in blocks(page.read_text(encoding="utf-8"), page.relative_to(ROOT).as_posix()):
            if block.lang == "{include}":
                included = (page.parent / block.code).resolve()
                assert included.is_file(), f"{block.id}: includes a missing file {block.code}"
                found.append(included)
    unique: dict[Path, None] = dict.fromkeys(path.resolve() for path in found)
    return list(unique)


def _all_blocks() -> list[Block]:
    found: list[Block] = []
    for path in sources():
        found += blocks(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    return found


ALL_BLOCKS = _all_blocks()
PYTHON = [b for b in ALL_BLOCKS if b.lang == "python"]


def setup_blocks(block: Block) -> list[Block]:
    """The shell blocks run before ``block``: those its file marks ``run``,
    else the README's."""
    own = [b for b in ALL_BLOCKS if b.source == block.source and b.lang == "sh" and b.marker == "run"]
    return own or [b for b in ALL_BLOCKS if b.source == "README.md" and b.lang == "sh" and b.marker == "run"]


def _env(database_url: str | None) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("WATCHDOG_DATABASE_URL", None)
    env.pop("PYTHONPATH", None)  # as pasted: the package as installed, the directory's modules
    if database_url is not None:
        env["WATCHDOG_DATABASE_URL"] = database_url
    return env


def _fail(what: str, result: subprocess.CompletedProcess[str] | None, out: str = "") -> NoReturn:
    detail = out if result is None else f"{result.stdout}\n{result.stderr}"
    pytest.fail(f"{what}\n--- output ---\n{detail[-6000:]}", pytrace=False)


def _set_up(setups: list[Block], workdir: Path, env: dict[str, str]) -> None:
    """Make ``workdir`` the reader's directory (``mailer.py``, ``orders.py``, ``reports.py``)
    and run the set-up shell blocks there, in order."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "mailer.py").write_text(MAILER)
    (workdir / "orders.py").write_text(EXAMPLE.read_text(encoding="utf-8"))
    (workdir / "reports.py").write_text(REPORTS.read_text(encoding="utf-8"))
    for setup in setups:
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", setup.code],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if result.returncode != 0:
            _fail(f"{setup.id} (set-up shell block) exited {result.returncode}", result)


def _set_up_once(setups: list[Block], cache: Path, env: dict[str, str]) -> Path:
    """A directory where ``setups`` ran on SQLite, made once per ``cache``.

    The set-up (``sqlalchemy-watchdog upgrade``: a CLI start-up and every
    migration) took as long as many a block; on SQLite all it leaves is files
    of the working directory (``watchdog.db``), so each block of a page gets a
    copy of them instead of a run of its own. A failed set-up is not kept: the
    next block runs it again and fails the same way."""
    done = cache / "-".join(re.sub(r"\W", "_", setup.id) for setup in setups)
    if not done.is_dir():
        building = cache / f"{done.name}.building"
        shutil.rmtree(building, ignore_errors=True)
        _set_up(setups, building, env)
        building.rename(done)
    return done


def _python(
    forks: forkrun.ForkServer | None, argv: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``argv`` (this Python) run to its end, its output captured: forked by ``forks``, else a subprocess."""
    if forks is not None:
        return forks.run(argv, cwd, env, TIMEOUT)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def run_block(
    block: Block,
    workdir: Path,
    database_url: URL | None,
    setup_cache: Path | None = None,
    forks: forkrun.ForkServer | None = None,
) -> None:
    """Run ``block`` as the conventions above say; fail the test if it does not hold.

    With ``setup_cache`` (a directory of this test session), a SQLite block
    starts from a copy of what its set-up blocks left there (:func:`_set_up_once`).
    With ``forks``, the block's processes of this Python are forked from it
    (:mod:`tests.forkrun`), else started as subprocesses."""
    rendered = None if database_url is None else database_url.render_as_string(hide_password=False)
    env = _env(rendered)
    if database_url is None and setup_cache is not None:
        shutil.copytree(_set_up_once(setup_blocks(block), setup_cache, env), workdir, dirs_exist_ok=True)
    else:
        _set_up(setup_blocks(block), workdir, env)
    code = block.code if rendered is None else block.code.replace(EXAMPLE_POSTGRES_URL, rendered)
    if re.search(r"^def test_", code, re.M):
        (workdir / "test_snippet.py").write_text(code)
        result = _python(
            forks, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_snippet.py"], workdir, env
        )
        if result.returncode != 0:
            _fail(f"{block.id}: its tests failed (exit {result.returncode})", result)
        return
    script = workdir / "snippet.py"
    script.write_text(code)
    if "run_forever()" not in code:
        result = _python(forks, [sys.executable, str(script)], workdir, env)
        if result.returncode != 0:
            _fail(f"{block.id} exited {result.returncode}", result)
        return
    serve(block, script, workdir, env, rendered or f"sqlite:///{workdir / 'watchdog.db'}", forks)


def serve(
    block: Block, script: Path, workdir: Path, env: dict[str, str], url: str, forks: forkrun.ForkServer | None = None
) -> None:
    """Run a serving block until it settled :data:`PROBE`, then SIGTERM it."""
    engine = create_engine(url)
    try:
        watchdog = Watchdog(engine)
        watchdog.enqueue(PROBE)
        log = (workdir / "serve.log").open("w+")
        argv = [sys.executable, str(script)]
        process: subprocess.Popen[str] | subprocess.Popen[bytes] | forkrun.Forked
        if forks is not None:
            process = forks.popen(argv, workdir, env, log, subprocess.STDOUT)
        else:
            process = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + TIMEOUT
            job = watchdog.read(PROBE.job_id)
            while job is not None and job.state is not JobState.SETTLED:
                if process.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
                job = watchdog.read(PROBE.job_id)
            still_running = process.poll() is None
            if still_running:
                process.send_signal(signal.SIGTERM)
            try:
                status = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                status = None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        log.seek(0)
        output = log.read()
        log.close()
        if not still_running:
            _fail(f"{block.id} exited ({process.returncode}) before it served {PROBE.job_id}", None, output)
        if job is None or job.state is not JobState.SETTLED:
            _fail(f"{block.id} did not settle {PROBE.job_id} within {TIMEOUT:.0f}s: {job}", None, output)
        if job.outcome is not Outcome.COMPLETED:
            _fail(f"{block.id} settled {PROBE.job_id} {job.outcome}: {job.failure_reason}", None, output)
        mailed = (workdir / "mailer.log").read_text().split() if (workdir / "mailer.log").exists() else []
        if "42" not in mailed:
            _fail(f"{block.id} completed {PROBE.job_id} without calling mailer.send(42)", None, output)
        if status != 0:
            _fail(f"{block.id} exited {status} after SIGTERM (expected 0)", None, output)
    finally:
        engine.dispose()


def _reset_postgres(url: URL) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(scope="session")
def readme_setup_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where :func:`_set_up_once` keeps the set-ups it ran (one per xdist worker)."""
    return tmp_path_factory.mktemp("readme-setup")


@pytest.mark.parametrize("block", [b for b in PYTHON], ids=lambda b: b.id)
def test_readme_python_block_runs_as_pasted(
    block: Block,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    readme_setup_cache: Path,
    forks: forkrun.ForkServer | None,
) -> None:
    if block.marker is not None:
        if block.marker.startswith("skip:"):
            pytest.skip(f"{block.id}: {block.marker}")
        pytest.fail(f"{block.id}: unknown marker <!-- readme-test: {block.marker} -->")
    database_url: URL | None = None
    if EXAMPLE_POSTGRES_URL in block.code:
        database_url = request.getfixturevalue("postgres_url")
        _reset_postgres(database_url)
    run_block(block, tmp_path / "work", database_url, readme_setup_cache, forks)


def test_readme_blocks_use_known_fences_and_markers() -> None:
    # A typo (```pyhton) or a stray marker would silently take a block out of the test.
    for block in ALL_BLOCKS:
        assert block.lang in KNOWN_LANGUAGES or DIRECTIVE.match(block.lang), (
            f"{block.id}: unknown fence language {block.lang!r}"
        )
        if block.marker is not None:
            assert (block.marker == "run" and block.lang == "sh") or (
                block.marker.startswith("skip: ") and block.lang == "python"
            ), f"{block.id}: marker {block.marker!r} on a {block.lang!r} block"
    readme = [b for b in ALL_BLOCKS if b.source == "README.md"]
    assert [b for b in readme if b.lang == "sh" and b.marker == "run"], (
        "the README's set-up command is marked <!-- readme-test: run -->"
    )
    assert len([b for b in readme if b.lang == "python"]) >= 2, "the README's Python snippets were not found"
    assert len(PYTHON) >= 30, "the docs' Python snippets were not found"
    serving = [b for b in PYTHON if "run_forever()" in b.code and b.marker is None]
    assert len(serving) >= 3, "the worker snippets (sync and asyncio) are run"


def test_every_docs_page_and_included_file_is_read_once() -> None:
    read = [path.relative_to(ROOT).as_posix() for path in sources()]
    assert len(read) == len(set(read))
    for expected in ("README.md", "docs/tutorial.md", "docs/howto/testing.md", "docs/design.md", "RELIABILITY.md"):
        assert expected in read, expected
    assert "benchmarks/README.md" in read
    assert not [path for path in read if "_build" in path]


def test_the_runner_fails_a_worker_snippet_whose_jobs_fail(
    tmp_path: Path, readme_setup_cache: Path, forks: forkrun.ForkServer | None
) -> None:
    # The harness must be able to fail: a worker snippet that forgets to define
    # `mailer` runs, but settles every job `failed` (NameError) -- what a reader
    # pasting the old README got.
    [worker] = [b for b in PYTHON if b.source == "README.md" and "Runner(engine).run_forever()" in b.code]
    broken = Block(worker.line, worker.lang, worker.code.replace("import mailer", ""), None, worker.source)
    assert broken.code != worker.code
    with pytest.raises(pytest.fail.Exception, match="settled readme-probe Outcome.FAILED: NameError"):
        run_block(broken, tmp_path / "work", None, readme_setup_cache, forks)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_resolve() -> None:
    # The README is also the package index's project page, where a relative
    # link or image breaks: every link is absolute (tests/unit/test_packaging.py
    # maps each to the page or file it shows), and its in-page anchors exist.
    markdown = README.read_text(encoding="utf-8")
    outside_code = re.sub(r"^\s*```.*?^\s*```", "", markdown, flags=re.M | re.S)
    anchors = {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", outside_code, re.M)}
    assert set(re.findall(r"\]\(#([^)]+)\)", outside_code)) <= anchors
    relative = re.findall(r"\]\((?!https?:|#)([^)\s]+)", outside_code)
    assert relative == [], f"relative links break on the package index: {relative}"
    assert re.search(r"\]\(https://[^)]*/tutorial\.html\)", outside_code), "the README links into the docs"


def test_readme_is_a_landing_page() -> None:
    # The bounds: a newcomer reads it in ten minutes; the rest is in docs/.
    markdown = README.read_text(encoding="utf-8")
    assert len(markdown.splitlines()) <= 250
    assert not re.search(r"\bissues? \d+", markdown, re.I), "no issue numbers"
    assert not re.search(r"`[0-9a-f]{7,40}`|\bat [0-9a-f]{7,40}\b", markdown), "no commit hashes"
    for section in ("## Why", "## How it compares", "## Install", "## Quickstart", "## Documentation"):
        assert section in markdown, section
    assert "pip install 'path/to/checkout[web,otel,cron]'" in markdown
