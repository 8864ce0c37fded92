"""Operations: timestamps, retention, reruns and paused queues.

Revision ID: w0004_operations
Revises: w0003_time_and_retries
Create Date: 2026-12-03

Adds to ``watchdog_jobs`` when each job was enqueued, started its current or
last attempt and settled (epoch milliseconds by the database clock), and
which job a rerun copies (``rerun_of``); adds the indexes that pruning, the
stats (recent outcomes, each queue's oldest ready job) and rerun links read; creates ``watchdog_queue_pauses``.

Rows that exist before the upgrade keep NULL in the three times: when they
were enqueued, started or settled was never recorded. Pruning by age leaves
such settled rows alone unless asked (``include_undated=True``).

Both dialects add the columns in place (SQLite's ``ADD COLUMN`` carries the
new columns' CHECK constraints); no table is rebuilt. Downgrading drops
them, the indexes and the pauses (paused queues run again).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0004_operations"
down_revision = "w0003_time_and_retries"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
PAUSES = "watchdog_queue_pauses"
CHECKS = {
    "settled_at": ("settled_at_settled", "settled_at IS NULL OR state = 'settled'"),
    "rerun_of": ("rerun_of_length", "rerun_of IS NULL OR length(rerun_of) BETWEEN 1 AND 256"),
}
COLUMNS = {"enqueued_at": "BIGINT", "started_at": "BIGINT", "settled_at": "BIGINT", "rerun_of": "TEXT"}


def _partial(where: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    sqlite = op.get_bind().dialect.name == "sqlite"
    for column, type_ in COLUMNS.items():
        check = CHECKS.get(column)
        if sqlite:
            constraint = "" if check is None else f" CONSTRAINT {op.f(f'ck_{TABLE}_{check[0]}')} CHECK ({check[1]})"
            op.execute(f"ALTER TABLE {TABLE} ADD COLUMN {column} {type_}{constraint}")
        else:
            op.add_column(TABLE, sa.Column(column, sa.BigInteger() if type_ == "BIGINT" else sa.Text(), nullable=True))
            if check is not None:
                op.create_check_constraint(op.f(f"ck_{TABLE}_{check[0]}"), TABLE, check[1])
    op.create_index(
        op.f(f"ix_{TABLE}_settled"), TABLE, ["outcome", "settled_at", "sequence"], **_partial("state = 'settled'")
    )
    op.create_index(op.f(f"ix_{TABLE}_rerun_of"), TABLE, ["rerun_of"], **_partial("rerun_of IS NOT NULL"))
    op.create_index(
        op.f(f"ix_{TABLE}_queued_since"),
        TABLE,
        ["queue_name", sa.text("coalesce(ready_at, enqueued_at)")],
        **_partial("state = 'queued'"),
    )
    op.create_table(
        PAUSES,
        sa.Column("queue_name", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("paused_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue_name", name=op.f(f"pk_{PAUSES}")),
        sa.CheckConstraint("length(queue_name) BETWEEN 1 AND 256", name=op.f(f"ck_{PAUSES}_queue_name_length")),
        sa.CheckConstraint("reason IS NULL OR length(reason) <= 2000", name=op.f(f"ck_{PAUSES}_reason_length")),
    )


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    sqlite = op.get_bind().dialect.name == "sqlite"
    op.drop_table(PAUSES)
    op.drop_index(op.f(f"ix_{TABLE}_queued_since"), table_name=TABLE)
    op.drop_index(op.f(f"ix_{TABLE}_rerun_of"), table_name=TABLE)
    op.drop_index(op.f(f"ix_{TABLE}_settled"), table_name=TABLE)
    for column in reversed(COLUMNS):
        if sqlite:
            op.execute(f"ALTER TABLE {TABLE} DROP COLUMN {column}")
        else:
            check = CHECKS.get(column)
            if check is not None:
                op.drop_constraint(op.f(f"ck_{TABLE}_{check[0]}"), TABLE, type_="check")
            op.drop_column(TABLE, column)
