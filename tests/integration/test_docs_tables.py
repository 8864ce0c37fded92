"""The docs' tables of fields and columns cannot drift from the code.

* docs/howto/jobs.md lists every field of :class:`Job`, in declaration order
  (``dataclasses.fields``);
* docs/reference/tables.md lists every table of the model and every column of
  each, in the model's order, each with its base type;
* that page's SQL examples run on the database they name.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from sqlalchemy import BigInteger, Engine, Float, Integer, Text, text
from sqlalchemy.types import TypeEngine

from sqlalchemy_watchdog import Job, metadata
from sqlalchemy_watchdog.model import ColumnDomain

DOCS = Path(__file__).resolve().parents[2] / "docs"
JOBS_PAGE = DOCS / "howto" / "jobs.md"
TABLES_PAGE = DOCS / "reference" / "tables.md"

_ROW = re.compile(r"^\|\s*`([a-z_]+)`\s*\|\s*([^|]*?)\s*\|")


def _first_table_after(lines: list[str], heading: str) -> list[tuple[str, str]]:
    """``(name, second cell)`` of each row of the first Markdown table after
    the line ``heading``, up to the next heading."""
    start = lines.index(heading)
    rows: list[tuple[str, str]] = []
    in_table = False
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            in_table = True
            match = _ROW.match(line)
            if match:
                rows.append((match.group(1), match.group(2)))
        elif in_table:
            break
    return rows


def test_the_jobs_page_lists_every_field_of_job_in_order() -> None:
    lines = JOBS_PAGE.read_text(encoding="utf-8").splitlines()
    documented = [name for name, _meaning in _first_table_after(lines, "## Jobs")]
    assert documented == [field.name for field in dataclasses.fields(Job)]


def _base_type(column_type: TypeEngine[object]) -> str:
    """The column's base type as the page names it."""
    if isinstance(column_type, ColumnDomain):
        column_type = column_type.base
    for kind, name in ((BigInteger, "bigint"), (Integer, "integer"), (Float, "real"), (Text, "text")):
        if isinstance(column_type, kind):
            return name
    raise AssertionError(f"no name for {column_type!r}")


def _documented_tables() -> dict[str, list[tuple[str, str]]]:
    lines = TABLES_PAGE.read_text(encoding="utf-8").splitlines()
    headings = [line for line in lines if re.fullmatch(r"## `watchdog_[a-z_]+`", line)]
    return {heading[4:-1]: _first_table_after(lines, heading) for heading in headings}


def test_the_tables_page_lists_every_table_and_column_of_the_model_with_its_type() -> None:
    documented = _documented_tables()
    assert sorted(documented) == sorted(metadata.tables)
    for name, table in metadata.tables.items():
        expected = [(column.name, _base_type(column.type)) for column in table.columns]
        assert documented[name] == expected, name


def test_the_page_check_sees_a_missing_column_and_a_wrong_type() -> None:
    """The comparison above can fail: a row dropped or mistyped is a difference."""
    documented = _documented_tables()
    jobs = documented["watchdog_jobs"]
    expected = [(column.name, _base_type(column.type)) for column in metadata.tables["watchdog_jobs"].columns]
    assert jobs[:-1] != expected
    assert [(n, "text" if n == "sequence" else t) for n, t in jobs] != expected


def _sql_examples() -> dict[str, str]:
    """The page's ```sql blocks, by the dialect named in the line before."""
    page = TABLES_PAGE.read_text(encoding="utf-8")
    found: dict[str, str] = {}
    for intro, block in re.findall(r"([^\n]*)\n\n```sql\n(.*?)```", page, flags=re.S):
        dialect = (
            "postgresql"
            if "(PostgreSQL)" in intro
            else "sqlite"
            if "(SQLite)" in intro
            else "mariadb"
            if "(MariaDB and MySQL" in intro
            else None
        )
        assert dialect is not None, f"an SQL example must say its database: {intro!r}"
        found[dialect] = block
    return found


def test_the_tables_page_has_an_example_for_each_database() -> None:
    assert sorted(_sql_examples()) == ["mariadb", "postgresql", "sqlite"]


@pytest.mark.dialect_specific
def test_the_tables_pages_sql_examples_run(engine: Engine, dialect: str) -> None:
    example = _sql_examples()[dialect]
    with engine.connect() as conn:
        assert conn.execute(text(example)).all() == []  # no job yet: the statement is what is tested
