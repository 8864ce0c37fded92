"""The design notes' recipes name files that exist.

docs/design.md ("Store operations and backends") says which files adding a
store operation and adding a ``watchdog_jobs`` column touch. A list of files
is only useful while it is true: every repository path the two paragraphs
name must exist (a ``<feature>``-style placeholder must match at least one
file), and the names they send a reader to look for in a file must be in it.
A file renamed or a table moved without the recipe fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"

#: Where the recipes start and end in docs/design.md.
START = "**To add an operation**"
END = "Everything else derives from"

#: A backticked token that is a repository path: folders, if any, and a file name.
_PATH = re.compile(r"`((?:[A-Za-z0-9_.<>-]+/)*[A-Za-z0-9_<>-]+\.(?:py|md|html|toml))`")
_PLACEHOLDER = re.compile(r"<[A-Za-z]+>")

#: Names the recipes send a reader to find in a file (each named in the recipe
#: beside that file): the file must define or hold them.
NAMED_IN = {
    "sqlalchemy_watchdog/store/declaration.py": ("class StoreOperations", "SHAPES:"),
    "sqlalchemy_watchdog/store/__init__.py": ("__all__ = [",),
    "sqlalchemy_watchdog/core/ports.py": ("class Store(Protocol)",),
    "sqlalchemy_watchdog/client/operations.py": ("OPERATIONS: Mapping", "def look(", "def write("),
    "sqlalchemy_watchdog/client/sync.py": ("class Watchdog",),
    "sqlalchemy_watchdog/client/asyncio.py": ("class AsyncWatchdog",),
    "sqlalchemy_watchdog/backends/__init__.py": ("class Backend(Protocol)",),
    "tests/unit/test_surface.py": ("SAMPLES:",),
    "tests/backends/test_coverage_of_operations.py": ('mark.name == "operation"',),
    "tests/integration/test_plans.py": (
        "STATEMENT_MODULES:",
        "PLANS:",
        "NOT_ON_JOBS =",
        "def test_every_statement_builder_is_planned",
    ),
    "pyproject.toml": ('id = "store-statements-below-features"',),
    "sqlalchemy_watchdog/model.py": ("INTEGER_COLUMNS =", "NULLABLE_TEXT_COLUMNS ="),
    "tests/helpers.py": ("HEAD_REVISION =",),
    "tests/integration/test_model.py": ("CHECK_NAMES =",),
    "sqlalchemy_watchdog/columns.py": ("JOB_COLUMNS:", "NOT_READ", "class ReadAs"),
    "sqlalchemy_watchdog/jobs/types.py": ("class JobView", "class Job:"),
    "sqlalchemy_watchdog/cli/output.py": ("json",),
    "docs/reference/tables.md": ("watchdog_jobs",),
}


def recipes() -> str:
    text = DESIGN.read_text(encoding="utf-8")
    assert text.count(START) == 1, f"docs/design.md has no single {START!r} paragraph"
    start = text.index(START)
    end = text.index(END, start)
    assert "\n#" not in text[start:end], "the recipes run into the next heading: END moved"
    return text[start:end]


def named_paths() -> list[str]:
    return sorted(set(_PATH.findall(recipes())))


def test_the_recipes_name_the_files_they_touch() -> None:
    """Not vacuous: both recipes are there, with the files the issue asks them to name."""
    text = recipes()
    assert "**To add a column**" in text
    assert set(NAMED_IN) <= set(named_paths())
    for expected in (
        "sqlalchemy_watchdog/store/<feature>.py",
        "sqlalchemy_watchdog/store/<feature>_sql.py",
        "tests/backends/test_ops_<group>.py",
        "sqlalchemy_watchdog/migrations/versions/w<NNNN>_<name>.py",
        "sqlalchemy_watchdog/web/templates/job.html",
        "CHANGELOG.md",
    ):
        assert expected in named_paths(), expected


@pytest.mark.parametrize("path", named_paths())
def test_every_path_the_recipes_name_exists(path: str) -> None:
    if _PLACEHOLDER.search(path):
        pattern = _PLACEHOLDER.sub("*", path)
        assert sorted(ROOT.glob(pattern)), f"docs/design.md names {path}, and no file matches {pattern}"
    else:
        assert (ROOT / path).is_file(), f"docs/design.md names {path}, which does not exist"


@pytest.mark.parametrize("path", sorted(NAMED_IN))
def test_the_names_the_recipes_point_to_are_in_their_files(path: str) -> None:
    text = (ROOT / path).read_text(encoding="utf-8")
    missing = [name for name in NAMED_IN[path] if name not in text]
    assert not missing, f"{path} no longer holds {missing}, which docs/design.md's recipes name"


def test_a_path_that_does_not_exist_is_caught() -> None:
    """The path pattern reads a renamed file as a path, and the check fails on it."""
    sample = "`sqlalchemy_watchdog/store/renamed_away.py` and `tests/backends/test_ops_<nothing>.txt`"
    found = _PATH.findall(sample)
    assert found == ["sqlalchemy_watchdog/store/renamed_away.py"]
    assert not (ROOT / found[0]).is_file()
    assert not sorted(ROOT.glob(_PLACEHOLDER.sub("*", "tests/backends/test_nothing_<group>.py")))
