"""Waiting jobs: a deleted job takes its edges with it, a purged waiting job
tells its dependents, and an index of waiting jobs.

Revision ID: w0014_waiting_jobs
Revises: w0012_results_and_dependencies
Create Date: 2026-12-05

Changes the ``WHEN`` of two triggers of ``sqlalchemy_watchdog.dependencies``
on ``watchdog_jobs``, on both dialects (their bodies, and on PostgreSQL their
functions, are unchanged):

* ``watchdog_jobs_child_pruned`` deleted a job's edges as a child only when
  the job was ``settled`` (a prune). A purged ``queued`` or ``delayed`` job
  left its edges behind, naming a child that no longer exists. It now fires
  for a deleted row of any state.
* ``watchdog_jobs_parent_deleted`` told the dependents of a deleted
  ``delayed``, ``queued`` or ``running`` job that it ended ``purged``. It now
  fires for a ``waiting`` job too, which ``purge`` deletes from this
  revision on, and for a job settled while waiting whose dependents are not
  told yet (``waiting_on = 0``): SQLite's ``DELETE`` also removes a row its
  own statement's trigger settled meanwhile.

It adds ``ix_watchdog_jobs_waiting (lane, queue_name, sequence) WHERE state
= 'waiting'``, which only waiting jobs enter: ``fail_lane`` settles a lane's
waiting jobs, ``purge`` deletes a queue's, ``cancel_many`` selects them and
``stats`` counts them, each without reading the settled history.

Upgrading also deletes the orphan edges earlier purges left (rows whose
child does not exist). Downgrading drops the index, restores the two ``WHEN``
clauses of w0012 and leaves the edges as they are. No table is rebuilt, no row of
``watchdog_jobs`` is touched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.backends import backend_of
from sqlalchemy_watchdog.dependencies import drop_trigger_sql, trigger_sql

revision = "w0014_waiting_jobs"
down_revision = "w0012_results_and_dependencies"
branch_labels = None
depends_on = None

CHANGED = ("watchdog_jobs_parent_deleted", "watchdog_jobs_child_pruned")
WAITING_INDEX = "ix_watchdog_jobs_waiting"


def _replace(revision_of_triggers: str) -> None:
    dialect = op.get_bind().dialect.name
    for statement in drop_trigger_sql(dialect, CHANGED):
        op.execute(statement)
    clock = backend_of(dialect).clock_ms_sql()
    for statement in trigger_sql(dialect, clock, revision=revision_of_triggers, only=CHANGED):
        op.execute(statement)


def upgrade() -> None:
    _replace("w0014")
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
    op.drop_index(WAITING_INDEX, table_name="watchdog_jobs")
    _replace("w0012")
