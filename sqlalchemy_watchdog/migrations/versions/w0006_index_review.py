"""Index review: SQLite loses ``ix_watchdog_jobs_queued_since``.

Revision ID: w0006_index_review
Revises: w0005_trace_context
Create Date: 2026-12-03

SQLite's planner chose ``ix_watchdog_jobs_queued_since`` (queued jobs by
queue and ready time, built for ``stats()``) for claims, which then sorted a
queue's whole backlog instead of reading ``ix_watchdog_jobs_live_queue`` in
claim order; every enqueue also paid for it. On SQLite ``stats()`` now reads
a queue's queued jobs in ``ix_watchdog_jobs_live_queue``. PostgreSQL keeps
the index (its planner reads it only for ``stats()``): nothing changes there.

Downgrading recreates the index on SQLite.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0006_index_review"
down_revision = "w0005_trace_context"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
INDEX = "ix_watchdog_jobs_queued_since"


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        op.drop_index(op.f(INDEX), table_name=TABLE)


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        op.create_index(
            op.f(INDEX),
            TABLE,
            ["queue_name", sa.text("coalesce(ready_at, enqueued_at)")],
            sqlite_where=sa.text("state = 'queued'"),
        )
