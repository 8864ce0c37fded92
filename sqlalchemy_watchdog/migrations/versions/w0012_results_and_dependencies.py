"""Results and progress: what a completed job's handler returned, how far a running one is.

Revision ID: w0012_results_and_dependencies
Revises: w0010_stored_types_and_ranges
Create Date: 2026-12-04

Adds ``watchdog_jobs.result_json``: the result a completed job's handler
returned, as canonical JSON, written by the settle statement that completes
the job and by nothing else. The CHECK ``result_completed`` holds it to
that: a row has a result only when it is settled ``completed``.

It also adds ``progress`` (a fraction from 0 to 1, CHECK ``progress_range``)
and ``progress_note`` (at most 500 characters, CHECK
``progress_note_length``): a running job's progress as its handler last
reported it.

Both dialects add the columns in place; on SQLite ``ADD COLUMN`` carries its
CHECKs (``result_completed`` and the column's stored-type CHECK, as w0010
gave every column), on PostgreSQL they are added as table constraints.
Existing rows keep NULL (no result). On PostgreSQL a row trigger,
``watchdog_jobs_settled``, notifies result waiters on the channel
``watchdog_results`` when a row becomes settled, only while a waiter exists
(see ``sqlalchemy_watchdog.results``). Nothing here depends on another
revision's columns, so it applies after any revision that leaves
``watchdog_jobs`` as w0010 made it. Downgrading drops the column, and the
results with it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "w0012_results_and_dependencies"
down_revision = "w0010_stored_types_and_ranges"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
#: (column, SQL type, its CHECKs by name); model.py declares the same.
COLUMNS: tuple[tuple[str, str, dict[str, str]], ...] = (
    (
        "result_json",
        "TEXT",
        {"result_completed": "result_json IS NULL OR (state = 'settled' AND outcome = 'completed')"},
    ),
    ("progress", "FLOAT", {"progress_range": "progress IS NULL OR (progress >= 0 AND progress <= 1)"}),
    ("progress_note", "TEXT", {"progress_note_length": "progress_note IS NULL OR length(progress_note) <= 500"}),
)
#: SQLite's stored-type CHECK of each column (w0010's rule; a REAL for the fraction).
STORED_TYPES = {
    "result_json": "typeof(result_json) IN ('text', 'null')",
    "progress": "typeof(progress) IN ('real', 'null')",
    "progress_note": "typeof(progress_note) IN ('text', 'null')",
}
_TYPES: dict[str, sa.types.TypeEngine[Any]] = {"TEXT": sa.Text(), "FLOAT": sa.Float()}


#: The settle notification (PostgreSQL), as sqlalchemy_watchdog.results
#: defined it at this revision.
NOTIFY_SETTLED_FUNCTION_SQL = """\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_settled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Free (nobody waits for a result): let it go at once, no notification.
    IF pg_try_advisory_lock(1463899203, 1381190740) THEN
        PERFORM pg_advisory_unlock(1463899203, 1381190740);
    ELSE
        PERFORM pg_notify('watchdog_results', NEW.job_id);
    END IF;
    RETURN NULL;
END
$$"""
NOTIFY_SETTLED_TRIGGER_SQL = (
    "CREATE TRIGGER watchdog_jobs_settled AFTER UPDATE OF state ON watchdog_jobs FOR EACH ROW "
    "WHEN (NEW.state = 'settled' AND OLD.state <> 'settled') EXECUTE FUNCTION watchdog_jobs_notify_settled()"
)


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if not sqlite:
        op.execute(NOTIFY_SETTLED_FUNCTION_SQL)
        op.execute(NOTIFY_SETTLED_TRIGGER_SQL)
    for column, type_, checks in COLUMNS:
        if sqlite:
            named = {**checks, f"{column}_stored_type": STORED_TYPES[column]}
            clauses = " ".join(
                f"CONSTRAINT {op.f(f'ck_{TABLE}_{name}')} CHECK ({check})" for name, check in named.items()
            )
            op.execute(f"ALTER TABLE {TABLE} ADD COLUMN {column} {type_} {clauses}")
        else:
            op.add_column(TABLE, sa.Column(column, _TYPES[type_], nullable=True))
            for name, check in checks.items():
                op.create_check_constraint(op.f(f"ck_{TABLE}_{name}"), TABLE, check)


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if not sqlite:
        op.execute("DROP TRIGGER IF EXISTS watchdog_jobs_settled ON watchdog_jobs")
        op.execute("DROP FUNCTION IF EXISTS watchdog_jobs_notify_settled()")
    for column, _type, checks in reversed(COLUMNS):
        if sqlite:
            op.execute(f"ALTER TABLE {TABLE} DROP COLUMN {column}")
        else:
            for name in checks:
                op.drop_constraint(op.f(f"ck_{TABLE}_{name}"), TABLE, type_="check")
            op.drop_column(TABLE, column)
