"""Keep a failed handler's traceback with its job: watchdog_jobs.failure_detail.

Revision ID: w0002_failure_detail
Revises: w0001_watchdog_jobs
Create Date: 2026-12-03

A nullable text column: rows that exist before the upgrade keep NULL (their
traceback was never recorded). The library bounds what it writes
(``FAILURE_DETAIL_MAX_LENGTH`` characters, the end of the traceback kept).
Both directions are one ``ALTER TABLE`` on PostgreSQL and on SQLite (whose
``DROP COLUMN`` needs SQLite 3.35 or later); no table is rebuilt.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0002_failure_detail"
down_revision = "w0001_watchdog_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    op.add_column("watchdog_jobs", sa.Column("failure_detail", sa.Text(), nullable=True))


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE watchdog_jobs DROP COLUMN failure_detail")
    else:
        op.drop_column("watchdog_jobs", "failure_detail")
