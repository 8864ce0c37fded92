"""What ships: the metadata, the README as the package index's project page,
the changelog, the docs' hosting file, and the release check's guards.

The wheel itself -- built, installed outside the checkout, smoke-tested -- is
``python3 dev.py release-check`` (tests/release), which CI runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import dev
import sqlalchemy_watchdog

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
URLS: dict[str, str] = PYPROJECT["project"]["urls"]
#: The docs site's base (project.urls' Documentation) and the repository's.
DOCS = URLS["Documentation"]
REPO = URLS["Source"]
RAW = REPO.replace("https://github.com/", "https://raw.githubusercontent.com/") + "/main/"
#: Files the site shows through an {include} page rather than as a page of docs/.
INCLUDED = {
    "explanation/reliability.html": "RELIABILITY.md",
    "explanation/benchmarks.html": "benchmarks/README.md",
}


def _readme_links() -> list[str]:
    markdown = (ROOT / "README.md").read_text(encoding="utf-8")
    outside_code = re.sub(r"^\s*```.*?^\s*```", "", markdown, flags=re.M | re.S)
    return re.findall(r"\]\(([^)\s]+)\)", outside_code)


def _shown_file(url: str) -> Path | None:
    """The file of this checkout that a README link shows, or None if it
    points at neither the docs site, the repository nor its raw files."""
    target = url.split("#", 1)[0]
    if target.startswith(DOCS):
        page = target[len(DOCS) :] or "index.html"
        if page in INCLUDED:
            return ROOT / INCLUDED[page]
        return ROOT / "docs" / (page.removesuffix(".html") + ".md")
    if target.startswith(RAW):
        return ROOT / target[len(RAW) :]
    for kind in ("/blob/main/", "/tree/main/"):
        if target.startswith(REPO + kind):
            return ROOT / target[len(REPO + kind) :]
    return None


def test_packages_are_found_not_listed() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert isinstance(setuptools["packages"], dict), "a listed set of packages drifts: a new subpackage is left out"
    assert setuptools["packages"]["find"]["include"] == ["sqlalchemy_watchdog", "sqlalchemy_watchdog.*"]
    data = setuptools["package-data"]
    assert "py.typed" in data["sqlalchemy_watchdog"]
    assert (ROOT / "sqlalchemy_watchdog" / "py.typed").is_file()
    # The dashboard's data folders are found as namespace packages (so setuptools
    # lists them, not warns they are absent) and every file of them matches a
    # package-data pattern of its folder.
    assert setuptools["packages"]["find"]["namespaces"] is True
    web = ROOT / "sqlalchemy_watchdog" / "web"
    for folder in ("templates", "static"):
        patterns = data[f"sqlalchemy_watchdog.web.{folder}"]
        for path in (web / folder).iterdir():
            assert any(path.match(pattern) for pattern in patterns), path.relative_to(web)


def test_the_version_has_one_source() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sqlalchemy_watchdog._version.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", sqlalchemy_watchdog.__version__)


def test_the_changelog_names_the_version_and_keeps_an_unreleased_section() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert headings[0] == "Unreleased"
    assert headings[1] == sqlalchemy_watchdog.__version__, "the newest release is the package's version"
    for heading in headings:
        assert re.search(rf"^\[{re.escape(heading)}\]: https://", changelog, re.M), f"no link for [{heading}]"


def test_the_project_urls_and_classifiers_are_there() -> None:
    project = PYPROJECT["project"]
    assert set(URLS) >= {"Documentation", "Source", "Changelog", "Issues"}
    assert all(url.startswith("https://") for url in URLS.values())
    assert URLS["Changelog"].endswith("/CHANGELOG.md")
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    classifiers = project["classifiers"]
    minimum = project["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {minimum}" in classifiers
    assert "Typing :: Typed" in classifiers


def test_every_readme_link_is_absolute_and_shows_a_file_of_this_checkout() -> None:
    # The README is the package index's project page too, where a relative link
    # or image breaks; a link to the site or the repository must show something.
    links = _readme_links()
    assert links
    for url in links:
        assert url.startswith(("https://", "#")), f"relative link: {url}"
        shown = _shown_file(url)
        if shown is not None:
            assert shown.is_file(), f"{url} shows {shown.relative_to(ROOT)}, which does not exist"
    assert any(_shown_file(url) == ROOT / "docs" / "tutorial.md" for url in links)
    assert any(url.startswith(RAW) for url in links), "the dashboard picture is a raw URL"


def test_read_the_docs_builds_the_same_site_with_warnings_as_errors() -> None:
    config = (ROOT / ".readthedocs.yaml").read_text(encoding="utf-8")
    assert re.search(r"^\s+configuration: docs/conf\.py$", config, re.M)
    assert re.search(r"^\s+fail_on_warning: true$", config, re.M)
    extras = re.findall(r"^\s+- (\w+)$", config, re.M)
    assert "docs" in extras
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"])


def test_the_smoke_suite_refuses_to_run_against_the_source_tree(tmp_path: Path) -> None:
    # Run from the checkout, the package imports from the source tree (an
    # editable install): the smoke suite must stop rather than pass.
    env = {
        **os.environ,
        "WATCHDOG_RELEASE_CHECK": "1",
        "WATCHDOG_RELEASE_WHEEL": str(tmp_path / "none.whl"),
        "WATCHDOG_RELEASE_SOURCE": str(ROOT),
        "WATCHDOG_RELEASE_CHECKOUT": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "tests/release"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert (
        "not from this environment's" in result.stdout + result.stderr or "source tree" in result.stdout + result.stderr
    )


def test_the_checkout_suite_leaves_the_smoke_suite_out() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--co", "tests/release"],
        cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "WATCHDOG_RELEASE_CHECK"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "test_installed" not in result.stdout


@pytest.mark.parametrize(("ci", "argv", "runs"), [("true", [], True), ("", [], False), ("true", ["tests/unit"], False)])
def test_ci_ends_the_test_command_with_the_release_check(
    monkeypatch: pytest.MonkeyPatch, ci: str, argv: list[str], runs: bool
) -> None:
    monkeypatch.setenv("CI", ci)
    assert dev.with_release_check(argv) is runs


def test_the_clean_copy_holds_what_git_sees_and_no_build_output(tmp_path: Path) -> None:
    count = dev.clean_copy(tmp_path)
    assert count > 100
    assert (tmp_path / "pyproject.toml").is_file() and (tmp_path / "sqlalchemy_watchdog" / "py.typed").is_file()
    assert not (tmp_path / ".venv").exists()
    assert not list(tmp_path.rglob("__pycache__"))
