"""Workers' claim ahead: how many jobs beyond its concurrency a registered runner may hold.

Revision ID: w0017_worker_claim_ahead
Revises: w0016_column_domains
Create Date: 2026-12-06

``watchdog_workers`` gets ``claim_ahead`` (INTEGER NOT NULL DEFAULT 0, CHECK
``claim_ahead_nonnegative``): the most jobs the runner claims beyond its
``concurrency`` -- the process executor's ``prefetch``, or for threads and
tasks the cap of ``claim_ahead`` -- so that a worker holding more jobs than
its concurrency (its ``running`` counts the jobs claimed ahead and waiting
for a slot too) says why. Rows that exist read 0 until their runner's next
heartbeat, which writes it.

Added in place on both dialects (SQLite: ``ALTER TABLE ... ADD COLUMN`` with
the column's CHECK). Downgrading drops the column and its CHECK.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0017_worker_claim_ahead"
down_revision = "w0016_column_domains"
branch_labels = None
depends_on = None

WORKERS = "watchdog_workers"
CHECK_NAME = f"ck_{WORKERS}_claim_ahead_nonnegative"
CONDITION = "claim_ahead >= 0"


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            f"ALTER TABLE {WORKERS} ADD COLUMN claim_ahead INTEGER DEFAULT 0 NOT NULL"
            f" CONSTRAINT {CHECK_NAME} CHECK ({CONDITION})"
        )
        return
    op.add_column(WORKERS, sa.Column("claim_ahead", sa.Integer(), nullable=False, server_default=sa.text("0")))
    op.create_check_constraint(op.f(CHECK_NAME), WORKERS, CONDITION)


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        # SQLite drops a column whose own CHECKs name only it.
        op.execute(f"ALTER TABLE {WORKERS} DROP COLUMN claim_ahead")
        return
    op.drop_constraint(op.f(CHECK_NAME), WORKERS, type_="check")
    op.drop_column(WORKERS, "claim_ahead")
