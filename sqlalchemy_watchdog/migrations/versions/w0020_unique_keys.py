"""Uniqueness windows, debounce and throttle: the keys jobs hold.

Revision ID: w0020_unique_keys
Revises: w0019_unstarted_claims
Create Date: 2026-12-07

Adds ``watchdog_unique_keys``: one row per ``Job.unique_key`` in use, the job
holding it (``job_id``), how (``kind``: ``unique_for``, ``debounce`` or
``throttle``; ``states``: ``waiting``, ``unsettled`` or ``any``), its window
(``since_ms`` to ``until_ms``, epoch milliseconds on the database clock; a
debounce's ``until_ms`` is its holder's planned start) and how many
enqueues it absorbed (``duplicates``, ``replacements``). Every value is held
by a CHECK; the primary key on ``unique_key`` serialises concurrent enqueues
of one key; ``ix_watchdog_unique_keys_job_id`` finds a job's keys and
``ix_watchdog_unique_keys_until_ms`` the ended windows retention deletes.

A new table: nothing else changes, and downgrading drops it (jobs already
enqueued stay as they are; later enqueues with a ``unique_key`` then fail,
as the table is missing).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0020_unique_keys"
down_revision = "w0019_unstarted_claims"
branch_labels = None
depends_on = None

TABLE = "watchdog_unique_keys"
#: As of this revision (model.UNIQUE_KEY_MAX_LENGTH, jobs.JOB_ID_MAX_LENGTH).
KEY_MAX_LENGTH = 256
JOB_ID_MAX_LENGTH = 256
CHECKS = {
    "unique_key_length": f"length(unique_key) BETWEEN 1 AND {KEY_MAX_LENGTH}",
    "job_id_length": f"length(job_id) BETWEEN 1 AND {JOB_ID_MAX_LENGTH}",
    "kind_known": "kind IN ('unique_for', 'debounce', 'throttle')",
    "states_known": "states IN ('waiting', 'unsettled', 'any')",
    "window_order": "until_ms > since_ms",
    "duplicates_nonnegative": "duplicates >= 0",
    "replacements_nonnegative": "replacements >= 0",
}


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    collated = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
    op.create_table(
        TABLE,
        sa.Column("unique_key", collated, nullable=False),
        sa.Column("job_id", collated, nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("states", sa.Text(), nullable=False),
        sa.Column("since_ms", sa.BigInteger(), nullable=False),
        sa.Column("until_ms", sa.BigInteger(), nullable=False),
        sa.Column("duplicates", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("replacements", sa.Integer(), nullable=False, server_default=sa.text("0")),
        *(sa.CheckConstraint(check, name=op.f(f"ck_{TABLE}_{name}")) for name, check in CHECKS.items()),
        sa.PrimaryKeyConstraint("unique_key", name=op.f(f"pk_{TABLE}")),
    )
    op.create_index(op.f(f"ix_{TABLE}_job_id"), TABLE, ["job_id"])
    op.create_index(op.f(f"ix_{TABLE}_until_ms"), TABLE, ["until_ms"])


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    op.drop_index(op.f(f"ix_{TABLE}_until_ms"), table_name=TABLE)
    op.drop_index(op.f(f"ix_{TABLE}_job_id"), table_name=TABLE)
    op.drop_table(TABLE)
