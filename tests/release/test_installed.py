"""What a user who installs the wheel gets: the smoke suite of the release check.

Runs only under ``python3 dev.py release-check`` (see conftest.py), with the
wheel and its extras installed in a fresh environment outside the checkout.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, inspect
from sqlalchemy.engine import URL

import sqlalchemy_watchdog
from tests.release.import_all import import_every_module, installed_package_root

BIN = Path(sys.executable).parent
CLI = BIN / "sqlalchemy-watchdog"
DIST = "sqlalchemy-watchdog"


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environment.update(env)
    environment["PATH"] = f"{BIN}{os.pathsep}{environment.get('PATH', '')}"
    result = subprocess.run(argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


def _tracked_package_files(source: Path) -> set[str]:
    """The package's files in the clean copy the wheel was built from (which
    holds only what git tracks or would add: no caches, no build output)."""
    package = source / "sqlalchemy_watchdog"
    return {path.relative_to(source).as_posix() for path in package.rglob("*") if path.is_file()}


def test_the_package_is_imported_from_this_environment_not_a_source_tree(source: Path) -> None:
    root = installed_package_root()
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert root == site / "sqlalchemy_watchdog"
    assert not root.is_relative_to(source.resolve())
    assert not (Path.cwd() / "sqlalchemy_watchdog").exists(), "the smoke copy must not hold the package"


def test_every_module_of_the_installed_package_imports() -> None:
    names = import_every_module()
    # The subpackages an earlier wheel left out, named so their absence is plain.
    for package in ("core", "core.rules", "store", "backends", "executors", "cli", "migrations", "web"):
        assert f"sqlalchemy_watchdog.{package}" in names
    assert len(names) > 60


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(wheel: Path, source: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        entries = set(archive.namelist())
    dist_info = {entry for entry in entries if ".dist-info/" in entry}
    package = entries - dist_info
    expected = _tracked_package_files(source)
    assert package == expected, (
        f"missing from the wheel: {sorted(expected - package)}; not of the package: {sorted(package - expected)}"
    )
    # The data files a list of packages would not bring.
    for data in ("sqlalchemy_watchdog/py.typed", "sqlalchemy_watchdog/web/templates/base.html"):
        assert data in package
    assert any(entry.startswith("sqlalchemy_watchdog/web/static/") for entry in package)
    assert any(re.match(r"sqlalchemy_watchdog/migrations/versions/w\d{4}_\w+\.py$", entry) for entry in package)
    names = {entry.split(".dist-info/", 1)[1] for entry in dist_info}
    assert names == {"METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt", "licenses/LICENSE"}


def test_the_installed_copy_has_the_data_files(source: Path) -> None:
    root = installed_package_root()
    for relative in _tracked_package_files(source):
        assert (root.parent / relative).is_file(), relative


def test_the_metadata_is_a_project_page() -> None:
    metadata = importlib.metadata.metadata(DIST)
    urls = dict(value.split(", ", 1) for value in metadata.get_all("Project-URL") or [])
    assert set(urls) >= {"Documentation", "Source", "Changelog", "Issues"}
    assert all(url.startswith("https://") for url in urls.values())
    assert metadata["License-Expression"] == "MIT"
    classifiers = metadata.get_all("Classifier") or []
    for version in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Typing :: Typed" in classifiers
    assert metadata["Requires-Python"] == ">=3.11"
    assert set(metadata.get_all("Provides-Extra") or []) >= {"web", "otel", "cron", "docs"}
    description = str(metadata.json["description"])
    assert "## Quickstart" in description
    assert not re.findall(r"\]\((?!https?:|#)[^)\s]+\)", description), "relative links break on the index"
    assert metadata["Description-Content-Type"] == "text/markdown"


def test_one_version_everywhere(tmp_path: Path, source: Path) -> None:
    installed = importlib.metadata.version(DIST)
    assert sqlalchemy_watchdog.__version__ == installed
    shown = _run([str(CLI), "--version"], tmp_path).stdout.strip()
    assert shown == f"sqlalchemy-watchdog {installed}"
    changelog = (source / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.findall(r"^## \[(\d+\.\d+\.\d+[^\]]*)\]", changelog, re.M)
    assert released and released[0] == installed, "the newest release in CHANGELOG.md is the package's version"
    assert "## [Unreleased]" in changelog


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_upgrade_creates_the_tables_from_the_installed_revisions(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from alembic.script import ScriptDirectory

    from sqlalchemy_watchdog.migrations import VERSIONS_DIR, current_revisions

    if dialect == "sqlite":
        url: URL = URL.create("sqlite", database=str(tmp_path / "watchdog.db"))
    else:
        url = request.getfixturevalue("postgres_url")
    _run([str(CLI), "upgrade", "--url", url.render_as_string(hide_password=False)], tmp_path)
    assert Path(VERSIONS_DIR).resolve().is_relative_to(installed_package_root())
    heads = ScriptDirectory(str(Path(VERSIONS_DIR).parent), version_locations=[str(VERSIONS_DIR)]).get_heads()
    engine = create_engine(url)
    try:
        assert {"watchdog_jobs", "watchdog_workers"} <= set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            assert current_revisions(conn) == sorted(heads)
    finally:
        engine.dispose()


HANDLERS = """\
import os

import sqlalchemy_watchdog
from sqlalchemy_watchdog import RunningJob, handler


@handler("smoke")
def where(job: RunningJob) -> dict[str, object]:
    return {"file": sqlalchemy_watchdog.__file__, "pid": os.getpid(), "n": job.payload["n"]}
"""

RUN = """\
import json
import os
import sys

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import Job, ProcessExecutor, Runner, Watchdog, enqueue

import smoke_handlers

engine = create_engine(sys.argv[1])
with Session(engine) as session:
    for n in range(3):
        enqueue(session, Job(f"smoke-{n}", "smoke", payload={"n": n}))
    session.commit()
runner = Runner(engine, executor=ProcessExecutor(processes=1))
runner.run_until_idle()
watchdog = Watchdog(engine)
print(json.dumps({"runner": os.getpid(), "results": [watchdog.result(f"smoke-{n}").value for n in range(3)]}))
"""


def test_a_runner_with_the_process_executor_runs_jobs_in_children_importing_the_installed_package(
    tmp_path: Path,
) -> None:
    import json

    (tmp_path / "smoke_handlers.py").write_text(HANDLERS)
    (tmp_path / "run_smoke.py").write_text(RUN)
    url = f"sqlite:///{tmp_path / 'watchdog.db'}"
    _run([str(CLI), "upgrade", "--url", url], tmp_path)
    shown = json.loads(_run([sys.executable, "run_smoke.py", url], tmp_path).stdout.strip().splitlines()[-1])
    root = installed_package_root()
    assert len(shown["results"]) == 3
    for n, result in enumerate(shown["results"]):
        assert result["n"] == n
        assert result["pid"] != shown["runner"], "the handler ran in a child process"
        assert Path(result["file"]).resolve().is_relative_to(root)


def test_the_dashboard_renders_pages_from_the_installed_templates(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from sqlalchemy_watchdog import Job, Watchdog
    from sqlalchemy_watchdog.migrations import apply_revisions
    from sqlalchemy_watchdog.web import create_app

    engine: Engine = create_engine(f"sqlite:///{tmp_path / 'watchdog.db'}")
    try:
        with engine.connect() as conn:
            apply_revisions(conn)
        Watchdog(engine).enqueue(Job("smoke-page", "emails", payload={"order_id": 42}))
        with TestClient(create_app(engine)) as client:
            overview = client.get("/")
            assert overview.status_code == 200
            assert "emails" in overview.text
            job = client.get("/job", params={"job_id": "smoke-page"})
            assert job.status_code == 200
            assert "smoke-page" in job.text
            stylesheets = re.findall(r'href="([^"]+\.css)"', overview.text)
            assert stylesheets
            assert client.get(stylesheets[0]).status_code == 200
    finally:
        engine.dispose()


PLUGIN_TEST = """\
from sqlalchemy import Engine, inspect


def test_the_fixture_gives_a_migrated_database(watchdog_engine: Engine) -> None:
    assert "watchdog_jobs" in inspect(watchdog_engine).get_table_names()
"""


def test_the_pytest_plugin_loads_from_its_entry_point(tmp_path: Path) -> None:
    [entry] = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "sqlalchemy_watchdog"]
    assert entry.value == "sqlalchemy_watchdog.pytest_plugin"
    assert entry.dist is not None and entry.dist.metadata["Name"] == DIST
    (tmp_path / "test_app.py").write_text(textwrap.dedent(PLUGIN_TEST))
    result = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_app.py"], tmp_path)
    assert "1 passed" in result.stdout
    listed = _run([sys.executable, "-m", "pytest", "--trace-config", "-q", "--co", "test_app.py"], tmp_path).stdout
    assert str(installed_package_root() / "pytest_plugin.py") in listed
