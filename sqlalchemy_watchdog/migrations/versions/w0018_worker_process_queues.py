"""Workers' process queues: which of a registered runner's queues run in child processes.

Revision ID: w0018_worker_process_queues
Revises: w0017_worker_claim_ahead
Create Date: 2026-12-07

``watchdog_workers`` gets ``process_queues`` (TEXT NOT NULL DEFAULT ``'[]'``,
CHECK ``process_queues_length``): the JSON array of the runner's queues
whose handlers run in child processes (a process executor, the runner's own
or one a handler names); its other queues run in the runner's process
(threads, or an async runner's tasks). One runner may serve both side by
side, so the workers view and the dashboard show which queue runs where.
Rows that exist read ``[]`` until their runner's next heartbeat, which
writes it.

Added in place on both dialects (SQLite: ``ALTER TABLE ... ADD COLUMN`` with
the column's CHECK). Downgrading drops the column and its CHECK.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0018_worker_process_queues"
down_revision = "w0017_worker_claim_ahead"
branch_labels = None
depends_on = None

WORKERS = "watchdog_workers"
CHECK_NAME = f"ck_{WORKERS}_process_queues_length"
#: The bound of the ``queues`` column (model.WORKER_QUEUES_MAX_LENGTH), as of this revision.
CONDITION = "length(process_queues) BETWEEN 2 AND 65536"


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            f"ALTER TABLE {WORKERS} ADD COLUMN process_queues TEXT DEFAULT '[]' NOT NULL"
            f" CONSTRAINT {CHECK_NAME} CHECK ({CONDITION})"
        )
        return
    op.add_column(WORKERS, sa.Column("process_queues", sa.Text(), nullable=False, server_default=sa.text("'[]'")))
    op.create_check_constraint(op.f(CHECK_NAME), WORKERS, CONDITION)


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        # SQLite drops a column whose own CHECKs name only it.
        op.execute(f"ALTER TABLE {WORKERS} DROP COLUMN process_queues")
        return
    op.drop_constraint(op.f(CHECK_NAME), WORKERS, type_="check")
    op.drop_column(WORKERS, "process_queues")
