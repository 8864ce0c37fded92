"""Flow control: a job's key, the queues' limits and the rate log.

Revision ID: w0011_flow_control
Revises: w0010_stored_types_and_ranges
Create Date: 2026-12-04

``watchdog_jobs`` gets the column ``limit_key`` (TEXT, NULL: an unkeyed job;
CHECK ``limit_key_length`` 1-256 characters; on SQLite also its stored-type
CHECK; ``COLLATE "C"`` on PostgreSQL) and two partial indexes that only keyed
jobs enter: ``ix_watchdog_jobs_keyed_queued (queue_name, limit_key, priority
DESC, sequence) WHERE state = 'queued' AND limit_key IS NOT NULL`` and
``ix_watchdog_jobs_keyed_running (queue_name, limit_key) WHERE state =
'running' AND limit_key IS NOT NULL``. Rows that exist keep ``NULL``: no key.

**Both dialects add the column in place**: SQLite takes a column with its
CHECK constraints in ``ALTER TABLE ... ADD COLUMN`` (as w0004 did), so no
table is rebuilt and no row is copied -- the new column is NULL in every row,
which every CHECK allows.

Two tables: ``watchdog_limits`` (one row per limited queue: concurrency,
concurrency per key, rate count and period, the round-robin cursor, when it
was set) and ``watchdog_limit_claims`` (a limited claim of a rate-limited
queue: when and how many jobs; index ``(queue_name, claimed_at)``).

Downgrading drops both tables (every queue runs unlimited again), the two
indexes and the column (the keys are lost).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0011_flow_control"
down_revision = "w0010_stored_types_and_ranges"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
LIMITS = "watchdog_limits"
CLAIMS = "watchdog_limit_claims"
KEY_MAX_LENGTH = 256
LIMIT_MAX = 1_000_000
RATE_PERIOD_MAX_MS = 86_400_000

KEY_LENGTH = f"limit_key IS NULL OR length(limit_key) BETWEEN 1 AND {KEY_MAX_LENGTH}"
KEY_STORED_TYPE = "typeof(limit_key) IN ('text', 'null')"
KEYED_QUEUED = "state = 'queued' AND limit_key IS NOT NULL"
KEYED_RUNNING = "state = 'running' AND limit_key IS NOT NULL"


def _partial(where: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}


def _check(table: str, name: str, condition: str) -> sa.CheckConstraint:
    return sa.CheckConstraint(condition, name=op.f(f"ck_{table}_{name}"))


def _limit_range(column: str) -> sa.CheckConstraint:
    return _check(LIMITS, f"{column}_range", f"{column} IS NULL OR {column} BETWEEN 1 AND {LIMIT_MAX}")


def _key_type(dialect: str) -> sa.types.TypeEngine[Any]:
    return sa.Text(collation="C") if dialect == "postgresql" else sa.Text()


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute(
            f"ALTER TABLE {TABLE} ADD COLUMN limit_key TEXT"
            f" CONSTRAINT ck_{TABLE}_limit_key_length CHECK ({KEY_LENGTH})"
            f" CONSTRAINT ck_{TABLE}_limit_key_stored_type CHECK ({KEY_STORED_TYPE})"
        )
    else:
        op.add_column(TABLE, sa.Column("limit_key", _key_type(dialect), nullable=True))
        op.create_check_constraint(op.f(f"ck_{TABLE}_limit_key_length"), TABLE, KEY_LENGTH)
    op.create_index(
        op.f(f"ix_{TABLE}_keyed_queued"),
        TABLE,
        ["queue_name", "limit_key", sa.text("priority DESC"), "sequence"],
        **_partial(KEYED_QUEUED),
    )
    op.create_index(op.f(f"ix_{TABLE}_keyed_running"), TABLE, ["queue_name", "limit_key"], **_partial(KEYED_RUNNING))
    op.create_table(
        LIMITS,
        sa.Column("queue_name", sa.Text(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("concurrency_per_key", sa.Integer(), nullable=True),
        sa.Column("rate_count", sa.Integer(), nullable=True),
        sa.Column("rate_period_ms", sa.BigInteger(), nullable=True),
        sa.Column("cursor_key", _key_type(dialect), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue_name", name=op.f(f"pk_{LIMITS}")),
        _check(LIMITS, "queue_name_length", "length(queue_name) BETWEEN 1 AND 256"),
        _limit_range("concurrency"),
        _limit_range("concurrency_per_key"),
        _limit_range("rate_count"),
        _check(
            LIMITS,
            "rate_period_range",
            f"rate_period_ms IS NULL OR rate_period_ms BETWEEN 1 AND {RATE_PERIOD_MAX_MS}",
        ),
        _check(LIMITS, "rate_complete", "(rate_count IS NULL) = (rate_period_ms IS NULL)"),
        _check(
            LIMITS, "some_limit", "concurrency IS NOT NULL OR concurrency_per_key IS NOT NULL OR rate_count IS NOT NULL"
        ),
        _check(LIMITS, "cursor_key_length", f"cursor_key IS NULL OR length(cursor_key) BETWEEN 1 AND {KEY_MAX_LENGTH}"),
    )
    op.create_table(
        CLAIMS,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("queue_name", sa.Text(), nullable=False),
        sa.Column("claimed_at", sa.BigInteger(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{CLAIMS}")),
        _check(CLAIMS, "queue_name_length", "length(queue_name) BETWEEN 1 AND 256"),
        _check(CLAIMS, "jobs_positive", "jobs >= 1"),
    )
    op.create_index(op.f(f"ix_{CLAIMS}_queue_name_claimed_at"), CLAIMS, ["queue_name", "claimed_at"])


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    dialect = op.get_bind().dialect.name
    op.drop_index(op.f(f"ix_{CLAIMS}_queue_name_claimed_at"), table_name=CLAIMS)
    op.drop_table(CLAIMS)
    op.drop_table(LIMITS)
    op.drop_index(op.f(f"ix_{TABLE}_keyed_running"), table_name=TABLE)
    op.drop_index(op.f(f"ix_{TABLE}_keyed_queued"), table_name=TABLE)
    if dialect == "sqlite":
        # SQLite drops a column whose own CHECKs name only it.
        op.execute(f"ALTER TABLE {TABLE} DROP COLUMN limit_key")
    else:
        op.drop_constraint(op.f(f"ck_{TABLE}_limit_key_length"), TABLE, type_="check")
        op.drop_column(TABLE, "limit_key")
