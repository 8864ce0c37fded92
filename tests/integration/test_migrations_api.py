"""The migrations API (:mod:`sqlalchemy_watchdog.migrations`) that ``upgrade`` and the
pytest plugin use, and the command's two ``python -m`` entry points."""

from __future__ import annotations

import subprocess
import sys

from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from sqlalchemy_watchdog.migrations import VERSIONS_DIR, apply_revisions, current_revisions, has_jobs_table

FIRST = "w0001_watchdog_jobs"


def _heads() -> list[str]:
    """The newest revisions shipped, read from the versions directory (not hard-coded)."""
    script = ScriptDirectory(str(VERSIONS_DIR.parent), version_locations=[str(VERSIONS_DIR)])
    return sorted(script.get_heads())


def test_apply_revisions_step_by_step_and_where_the_database_stands(empty_engine: Engine) -> None:
    with empty_engine.connect() as conn:
        assert not has_jobs_table(conn)
        assert current_revisions(conn) == []
        apply_revisions(conn, FIRST)
        assert has_jobs_table(conn)
        assert current_revisions(conn) == [FIRST]
        apply_revisions(conn)  # default: heads
        assert not conn.in_transaction()  # committed by apply_revisions
        assert current_revisions(conn) == _heads() != [FIRST]
    # Seen from another connection (and through an Engine): committed.
    assert has_jobs_table(empty_engine)
    with empty_engine.connect() as conn:
        assert current_revisions(conn) == _heads()
        apply_revisions(conn)  # at head already: nothing to do
        assert current_revisions(conn) == _heads()


def test_python_dash_m_runs_the_same_command_from_the_package_and_from_cli() -> None:
    outputs = []
    for module in ("sqlalchemy_watchdog", "sqlalchemy_watchdog.cli"):
        for argv in (["--version"], ["--help"]):
            done = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            outputs.append(done.stdout)
    assert outputs[:2] == outputs[2:]
    assert outputs[0].startswith("sqlalchemy-watchdog ")
    assert "usage: sqlalchemy-watchdog" in outputs[1]
