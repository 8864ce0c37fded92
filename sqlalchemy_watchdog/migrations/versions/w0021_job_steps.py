"""Durable steps: the finished steps and durable sleeps of a job.

Revision ID: w0021_job_steps
Revises: w0020_unique_keys
Create Date: 2026-12-07

Adds ``watchdog_job_steps``: one row per finished step of a job
(``job.step(name, fn)``: ``kind = 'step'``, its result as canonical JSON in
``result_json``) or durable sleep (``job.sleep(...)``: ``kind = 'sleep'``,
its end in ``wake_at``, epoch milliseconds on the database clock), with the
attempt that recorded it and when (``recorded_at``). The primary key is
``(job_sequence, name)``: a name is recorded once per job, and a ``job_id``
pruned and enqueued again (a new job, a new ``sequence``) starts afresh. Every value is held by
a CHECK. A new table: nothing else changes; downgrading drops it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0021_job_steps"
down_revision = "w0020_unique_keys"
branch_labels = None
depends_on = None

TABLE = "watchdog_job_steps"
#: As of this revision (jobs.JOB_ID_MAX_LENGTH, model.STEP_NAME_MAX_LENGTH).
CHECKS = {
    "job_id_length": "length(job_id) BETWEEN 1 AND 256",
    "name_length": "length(name) BETWEEN 1 AND 256",
    "kind_known": "kind IN ('step', 'sleep')",
    "sleep_has_wake_at": "(kind = 'sleep') = (wake_at IS NOT NULL)",
    "attempt_positive": "attempt >= 1",
}


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    collated = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
    op.create_table(
        TABLE,
        sa.Column("job_sequence", sa.BigInteger(), nullable=False),
        sa.Column("name", collated, nullable=False),
        sa.Column("job_id", collated, nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("result_json", sa.Text(), nullable=True),
        sa.Column("wake_at", sa.BigInteger(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.BigInteger(), nullable=False),
        *(sa.CheckConstraint(check, name=op.f(f"ck_{TABLE}_{name}")) for name, check in CHECKS.items()),
        sa.PrimaryKeyConstraint("job_sequence", "name", name=op.f(f"pk_{TABLE}")),
    )


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    op.drop_table(TABLE)
