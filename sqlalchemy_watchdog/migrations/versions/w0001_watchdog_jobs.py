"""Create watchdog_jobs.

Revision ID: w0001_watchdog_jobs
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

# The wake-up trigger as this revision created it (w0007 replaced its
# function); frozen here, as a revision's SQL must be.
NOTIFY_FUNCTION_SQL = """\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_queued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('watchdog_jobs', 'queued');
    RETURN NULL;
END
$$"""
NOTIFY_TRIGGER_SQL = (
    "CREATE TRIGGER watchdog_jobs_queued AFTER INSERT ON watchdog_jobs "
    "FOR EACH STATEMENT EXECUTE FUNCTION watchdog_jobs_notify_queued()"
)
DROP_NOTIFY_FUNCTION_SQL = "DROP FUNCTION IF EXISTS watchdog_jobs_notify_queued()"

revision = "w0001_watchdog_jobs"
down_revision = None
branch_labels = ("watchdog",)
depends_on = None

LIVE = "state IN ('queued', 'running')"


def _partial(where: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}


# Names are final (op.f): an environment whose target_metadata carries a
# naming convention must not prefix them again.


def upgrade() -> None:
    op.create_table(
        "watchdog_jobs",
        sa.Column(
            "sequence",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("queue_name", sa.Text(), nullable=False),
        sa.Column("lane", sa.Text(), nullable=False),
        sa.Column("priority", sa.BigInteger(), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("recovery_max", sa.Integer(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("claim_token", sa.Text(), nullable=True),
        sa.Column("recovery_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("cancellation_id", sa.Text(), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("lease_until", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("sequence", name=op.f("pk_watchdog_jobs")),
        sa.UniqueConstraint("job_id", name=op.f("uq_watchdog_jobs_job_id")),
        sa.UniqueConstraint("cancellation_id", name=op.f("uq_watchdog_jobs_cancellation_id")),
        sa.CheckConstraint("length(job_id) BETWEEN 1 AND 256", name=op.f("ck_watchdog_jobs_job_id_length")),
        sa.CheckConstraint("length(queue_name) BETWEEN 1 AND 256", name=op.f("ck_watchdog_jobs_queue_name_length")),
        sa.CheckConstraint("length(lane) BETWEEN 1 AND 512", name=op.f("ck_watchdog_jobs_lane_length")),
        sa.CheckConstraint(
            "cancellation_id IS NULL OR length(cancellation_id) BETWEEN 1 AND 256",
            name=op.f("ck_watchdog_jobs_cancellation_id_length"),
        ),
        sa.CheckConstraint("state IN ('queued', 'running', 'settled')", name=op.f("ck_watchdog_jobs_state_known")),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('completed', 'failed', 'cancelled', 'outcome_unknown', 'interrupted')",
            name=op.f("ck_watchdog_jobs_outcome_known"),
        ),
        sa.CheckConstraint(
            "recovery_max IS NULL OR recovery_max >= 0",
            name=op.f("ck_watchdog_jobs_recovery_max_nonnegative"),
        ),
        sa.CheckConstraint("recovery_count >= 0", name=op.f("ck_watchdog_jobs_recovery_count_nonnegative")),
        sa.CheckConstraint(
            "(state = 'queued' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL)"
            " OR (state = 'running' AND outcome IS NULL AND claim_token IS NOT NULL"
            " AND lease_until IS NOT NULL)"
            " OR (state = 'settled' AND outcome IS NOT NULL AND lease_until IS NULL)",
            name=op.f("ck_watchdog_jobs_state_grammar"),
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(
        op.f("ix_watchdog_jobs_ready"),
        "watchdog_jobs",
        [sa.column("priority").desc(), "sequence"],
        **_partial("state = 'queued'"),
    )
    op.create_index(
        op.f("ix_watchdog_jobs_lease"),
        "watchdog_jobs",
        ["lease_until", "sequence"],
        **_partial("state = 'running'"),
    )
    op.create_index(
        op.f("ix_watchdog_jobs_live_lane"),
        "watchdog_jobs",
        ["lane", sa.column("state").desc(), "sequence"],
        **_partial(LIVE),
    )
    op.create_index(
        op.f("ix_watchdog_jobs_live_queue"),
        "watchdog_jobs",
        ["queue_name", "state", sa.column("priority").desc(), "sequence"],
        **_partial(LIVE),
    )

    if op.get_bind().dialect.name == "postgresql":
        # Wake idle runners when an INSERT into the table commits.
        op.execute(NOTIFY_FUNCTION_SQL)
        op.execute(NOTIFY_TRIGGER_SQL)


def downgrade() -> None:
    op.drop_table("watchdog_jobs")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(DROP_NOTIFY_FUNCTION_SQL)
