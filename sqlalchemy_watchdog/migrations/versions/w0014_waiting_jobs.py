"""Waiting jobs: a deleted job takes its edges with it, a purged waiting job
tells its dependents, and an index of waiting jobs.

Revision ID: w0014_waiting_jobs
Revises: w0013_settle_watch
Create Date: 2026-12-05

Changes the ``WHEN`` of two triggers of ``sqlalchemy_watchdog.dependencies``
on ``watchdog_jobs``, on both dialects (their bodies, and on PostgreSQL their
functions, are unchanged):

* ``watchdog_jobs_child_pruned`` deleted a job's edges as a child only when
  the job was ``settled`` (a prune). A purged ``queued`` or ``delayed`` job
  left its edges behind, naming a child that no longer exists. It now fires
  for a deleted job with parents in any state (``OLD.after_policy IS NOT
  NULL``).
* ``watchdog_jobs_parent_deleted`` told the dependents of a deleted watched
  ``delayed``, ``queued`` or ``running`` job that it ended ``purged``. It now
  fires for a ``waiting`` one too, which ``purge`` deletes from this revision
  on, and for a job settled while waiting whose dependents are not told yet
  (``waiting_on = 0``): SQLite's ``DELETE`` also removes a row its own
  statement's trigger settled meanwhile.

It adds ``ix_watchdog_jobs_waiting (lane, queue_name, sequence) WHERE state
= 'waiting'``, which only waiting jobs enter: ``fail_lane`` settles a lane's
waiting jobs, ``purge`` deletes a queue's, ``cancel_many`` selects them and
``stats`` counts them, each without reading the settled history.

Upgrading also deletes the orphan edges earlier purges left (rows whose
child does not exist). Downgrading drops the index, restores w0013's
triggers and leaves the edges as they are. No table is rebuilt, no row of
``watchdog_jobs`` is touched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.backends import backend_of
from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

# w0013's frozen definitions: what this revision changes and its downgrade restores.
from sqlalchemy_watchdog.migrations.versions import w0012_results_and_dependencies as w0012
from sqlalchemy_watchdog.migrations.versions import w0013_settle_watch as w0013

revision = "w0014_waiting_jobs"
down_revision = "w0013_settle_watch"
branch_labels = None
depends_on = None

WAITING_INDEX = "ix_watchdog_jobs_waiting"
_LIVE = "('delayed', 'queued', 'running')"
_UNSETTLED = "('delayed', 'queued', 'running', 'waiting')"
#: w0013's WHEN clauses and this revision's, trigger by trigger.
WHENS = (
    (
        f"OLD.state IN {_LIVE} AND OLD.watched = 1",
        f"OLD.watched = 1 AND (OLD.state IN {_UNSETTLED} OR OLD.waiting_on = 0)",
    ),
    ("OLD.state = 'settled' AND OLD.after_policy IS NOT NULL", "OLD.after_policy IS NOT NULL"),
)


def _changed(statement: str) -> str:
    """A w0013 trigger statement with this revision's WHEN."""
    for old, new in WHENS:
        for opening, closing in (("WHEN (", ") EXECUTE"), ("WHEN ", " BEGIN")):
            if f"{opening}{old}{closing}" in statement:
                return statement.replace(f"{opening}{old}{closing}", f"{opening}{new}{closing}")
    return statement


def trigger_sql(dialect: str, clock: str) -> list[str]:
    """The dependency triggers as this revision makes them."""
    return [_changed(statement) for statement in w0013.trigger_sql(dialect, clock)]


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
    _replace_triggers(trigger_sql(dialect, backend_of(dialect).clock_ms_sql()))
    op.create_index(
        WAITING_INDEX,
        "watchdog_jobs",
        ["lane", "queue_name", "sequence"],
        postgresql_where=sa.text("state = 'waiting'"),
        sqlite_where=sa.text("state = 'waiting'"),
    )
    op.execute(
        "DELETE FROM watchdog_job_edges WHERE NOT EXISTS"
        " (SELECT 1 FROM watchdog_jobs WHERE watchdog_jobs.job_id = watchdog_job_edges.child)"
    )


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    dialect = op.get_bind().dialect.name
    op.drop_index(WAITING_INDEX, table_name="watchdog_jobs")
    _replace_triggers(w0013.trigger_sql(dialect, backend_of(dialect).clock_ms_sql()))
