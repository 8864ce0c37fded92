"""Settle watch: only a watched job's settlement runs the settle triggers.

Revision ID: w0013_settle_watch
Revises: w0012_results_and_dependencies
Create Date: 2026-12-05

Revision w0012 gave every settlement two row triggers on PostgreSQL (one
counting the settled job's dependency edges, one notifying result waiters
while any waited) and SQLite the first: a trigger call and its statement
for every job settled, although almost no job has dependents or a waiter.
This revision adds ``watchdog_jobs.watched`` (1 or NULL, CHECK
``watched_flag``; on SQLite with its stored-type CHECK), set by an enqueue
that gives a live job its first dependent and by a result waiter on
PostgreSQL, and makes the triggers fire for watched rows only:

* ``watchdog_jobs_parent_settled`` and ``watchdog_jobs_parent_deleted``
  gain ``AND NEW.watched = 1`` / ``AND OLD.watched = 1``;
* ``watchdog_jobs_child_pruned`` fires only for a job that has parents
  (``OLD.after_policy IS NOT NULL``);
* ``watchdog_jobs_settled`` (PostgreSQL) fires for a watched row and
  notifies unconditionally (the result-waiters advisory lock is gone).

The upgrade marks the live jobs that have uncounted edges as parents, so
what waits today is told as before. Downgrading restores w0012's triggers
and drops the column.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.backends import backend_of
from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

# w0012's frozen definitions: what this revision changes and its downgrade restores.
from sqlalchemy_watchdog.migrations.versions import w0012_results_and_dependencies as w0012

revision = "w0013_settle_watch"
down_revision = "w0012_results_and_dependencies"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
FLAG = "watched IS NULL OR watched = 1"
STORED_TYPE = "typeof(watched) IN ('integer', 'null')"

_LIVE = "('delayed', 'queued', 'running')"
#: w0012's WHEN clauses and this revision's, trigger by trigger.
WHENS = (
    (
        f"NEW.state = 'settled' AND OLD.state IN {_LIVE}",
        f"NEW.state = 'settled' AND OLD.state IN {_LIVE} AND NEW.watched = 1",
    ),
    (f"OLD.state IN {_LIVE}", f"OLD.state IN {_LIVE} AND OLD.watched = 1"),
    ("OLD.state = 'settled'", "OLD.state = 'settled' AND OLD.after_policy IS NOT NULL"),
)

NOTIFY_FUNCTION_SQL = """\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_settled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('watchdog_results', NEW.job_id);
    RETURN NULL;
END
$$"""
NOTIFY_TRIGGER_SQL = (
    "CREATE TRIGGER watchdog_jobs_settled AFTER UPDATE OF state ON watchdog_jobs FOR EACH ROW "
    "WHEN (NEW.state = 'settled' AND OLD.state <> 'settled' AND NEW.watched = 1) "
    "EXECUTE FUNCTION watchdog_jobs_notify_settled()"
)


def _watched(statement: str) -> str:
    """A w0012 trigger statement with this revision's WHEN."""
    for old, new in WHENS:
        for opening, closing in (("WHEN (", ") EXECUTE"), ("WHEN ", " BEGIN")):
            if f"{opening}{old}{closing}" in statement:
                return statement.replace(f"{opening}{old}{closing}", f"{opening}{new}{closing}")
    return statement


def trigger_sql(dialect: str, clock: str) -> list[str]:
    """The dependency triggers as this revision makes them."""
    return [_watched(statement) for statement in w0012._trigger_sql(dialect, clock)]


def _replace_triggers(statements: list[str]) -> None:
    dialect = op.get_bind().dialect.name
    for statement in w0012._drop_sql(dialect):
        op.execute(statement)
    for statement in statements:
        op.execute(statement)


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute(
            f"ALTER TABLE {TABLE} ADD COLUMN watched INTEGER"
            f" CONSTRAINT {op.f(f'ck_{TABLE}_watched_flag')} CHECK ({FLAG})"
            f" CONSTRAINT {op.f(f'ck_{TABLE}_watched_stored_type')} CHECK ({STORED_TYPE})"
        )
    else:
        op.add_column(TABLE, sa.Column("watched", sa.Integer(), nullable=True))
        op.create_check_constraint(op.f(f"ck_{TABLE}_watched_flag"), TABLE, FLAG)
    # What waits today is told as before: the live parents of uncounted edges.
    op.execute(
        f"UPDATE {TABLE} SET watched = 1 WHERE state <> 'settled'"
        " AND job_id IN (SELECT parent FROM watchdog_job_edges WHERE outcome IS NULL)"
    )
    _replace_triggers(trigger_sql(dialect, backend_of(dialect).clock_ms_sql()))
    if dialect != "sqlite":
        op.execute(NOTIFY_FUNCTION_SQL)
        op.execute("DROP TRIGGER IF EXISTS watchdog_jobs_settled ON watchdog_jobs")
        op.execute(NOTIFY_TRIGGER_SQL)


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    dialect = op.get_bind().dialect.name
    _replace_triggers(w0012._trigger_sql(dialect, backend_of(dialect).clock_ms_sql()))
    if dialect == "sqlite":
        op.execute(f"ALTER TABLE {TABLE} DROP COLUMN watched")
        return
    op.execute("DROP TRIGGER IF EXISTS watchdog_jobs_settled ON watchdog_jobs")
    op.execute(w0012.NOTIFY_SETTLED_FUNCTION_SQL)
    op.execute(w0012.NOTIFY_SETTLED_TRIGGER_SQL)
    op.drop_constraint(op.f(f"ck_{TABLE}_watched_flag"), TABLE, type_="check")
    op.drop_column(TABLE, "watched")
