"""The deployment page's "Table growth, vacuum and bloat" queries run as pasted on PostgreSQL
and answer about the package's tables; its autovacuum example sets what it says."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Job, Watchdog

PAGE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "deployment.md"
SECTION = "## Table growth, vacuum and bloat"


def section_statements() -> list[str]:
    """Every statement of the section's ```sql blocks (indented ones too), in page order."""
    section = PAGE.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = [
        textwrap.dedent(block) for _indent, block in re.findall(r"^( *)```sql\n(.*?)^\1```", section, flags=re.M | re.S)
    ]
    return [s.strip() for block in blocks for s in block.split(";") if s.strip()]


def run(engine: Engine, statement: str) -> list[tuple[Any, ...]]:
    """``statement`` in autocommit through the driver (no parameters: ``%`` is a plain character)."""
    conn = engine.raw_connection()
    try:
        conn.driver_connection.autocommit = True  # type: ignore[union-attr]
        cursor = conn.cursor()
        cursor.execute(statement)
        return list(cursor.fetchall()) if cursor.description else []
    finally:
        conn.close()


def test_the_section_has_its_queries() -> None:
    statements = section_statements()
    for needle in ("pg_total_relation_size", "n_dead_tup", "pg_stat_activity", "pg_replication_slots",
                   "pg_stat_replication", "pg_prepared_xacts", "GROUP BY queue_name, state", "GROUP BY outcome",
                   "ALTER TABLE watchdog_jobs SET"):  # fmt: skip
        assert any(needle in s for s in statements), needle


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_the_monitoring_queries_run_and_answer_about_the_jobs_table(engine: Engine) -> None:
    Watchdog(engine).enqueue(Job("monitored-1", "reports"))
    answers = {statement: run(engine, statement) for statement in section_statements()}
    sizes = next(rows for s, rows in answers.items() if "pg_total_relation_size" in s)
    assert "watchdog_jobs" in {row[0] for row in sizes}
    indexes = next(rows for s, rows in answers.items() if "FROM pg_stat_user_indexes" in s)
    assert "ix_watchdog_jobs_live_queue" in {row[0] for row in indexes}
    live = next(rows for s, rows in answers.items() if "GROUP BY queue_name, state" in s)
    assert live == [("reports", "queued", 1)]
    options = run(engine, "SELECT reloptions FROM pg_class WHERE relname = 'watchdog_jobs'")[0][0]
    assert "autovacuum_vacuum_scale_factor=0.01" in options
