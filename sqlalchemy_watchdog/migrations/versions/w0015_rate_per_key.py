"""Per-key rate limits: a rate for each key of a limited queue, and the key in the rate log.

Revision ID: w0015_rate_per_key
Revises: w0014_waiting_jobs
Create Date: 2026-12-05

``watchdog_limits`` gets ``rate_per_key_count`` (INTEGER, 1-1,000,000) and
``rate_per_key_period_ms`` (BIGINT, 1 ms - 1 day), both NULL or neither (CHECK
``rate_per_key_complete``), and CHECK ``some_limit`` counts the per-key rate
as a limit. ``watchdog_limit_claims`` gets ``limit_key`` (TEXT, NULL: not
logged per key; CHECK ``limit_key_length``; ``COLLATE "C"`` on PostgreSQL)
and the partial index ``ix_watchdog_limit_claims_keyed (queue_name,
limit_key, claimed_at) WHERE limit_key IS NOT NULL``: a key's claims in a
window are one range of it.

On PostgreSQL the columns and constraints are added in place. SQLite cannot
change a table's CHECK constraints, so ``watchdog_limits`` (one row per
limited queue) is rebuilt and its rows copied; the rate log gets its column
by ``ALTER TABLE ... ADD COLUMN`` with the column's CHECK. Rows that exist
keep NULL: no per-key rate.

Downgrading deletes the limits of the queues whose only limit is a per-key
rate (they run unlimited again: w0014's CHECK cannot hold them), drops the
columns, the index and the constraints, and restores w0014's ``some_limit``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0015_rate_per_key"
down_revision = "w0014_waiting_jobs"
branch_labels = None
depends_on = None

LIMITS = "watchdog_limits"
CLAIMS = "watchdog_limit_claims"
KEY_MAX_LENGTH = 256
LIMIT_MAX = 1_000_000
RATE_PERIOD_MAX_MS = 86_400_000
KEYED_INDEX = "ix_watchdog_limit_claims_keyed"

SOME_LIMIT_BEFORE = "concurrency IS NOT NULL OR concurrency_per_key IS NOT NULL OR rate_count IS NOT NULL"
SOME_LIMIT = f"{SOME_LIMIT_BEFORE} OR rate_per_key_count IS NOT NULL"
COUNT_RANGE = f"rate_per_key_count IS NULL OR rate_per_key_count BETWEEN 1 AND {LIMIT_MAX}"
PERIOD_RANGE = f"rate_per_key_period_ms IS NULL OR rate_per_key_period_ms BETWEEN 1 AND {RATE_PERIOD_MAX_MS}"
COMPLETE = "(rate_per_key_count IS NULL) = (rate_per_key_period_ms IS NULL)"
KEY_LENGTH = f"limit_key IS NULL OR length(limit_key) BETWEEN 1 AND {KEY_MAX_LENGTH}"
#: The per-key CHECKs (name suffix, condition).
PER_KEY_CHECKS = (
    ("rate_per_key_count_range", COUNT_RANGE),
    ("rate_per_key_period_range", PERIOD_RANGE),
    ("rate_per_key_complete", COMPLETE),
)


def _name(table: str, suffix: str) -> Any:
    return op.f(f"ck_{table}_{suffix}")


def _check(table: str, suffix: str, condition: str) -> sa.CheckConstraint:
    return sa.CheckConstraint(condition, name=_name(table, suffix))


def _key_type(dialect: str) -> sa.types.TypeEngine[Any]:
    return sa.Text(collation="C") if dialect == "postgresql" else sa.Text()


def _limit_range(column: str) -> sa.CheckConstraint:
    return _check(LIMITS, f"{column}_range", f"{column} IS NULL OR {column} BETWEEN 1 AND {LIMIT_MAX}")


def _rebuild_limits(per_key: bool) -> None:
    """SQLite: ``watchdog_limits`` rebuilt as w0015 (``per_key``) or w0014
    defines it, its rows copied (the columns both have)."""
    dialect = "sqlite"
    columns: list[sa.Column[Any]] = [
        sa.Column("queue_name", sa.Text(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("concurrency_per_key", sa.Integer(), nullable=True),
        sa.Column("rate_count", sa.Integer(), nullable=True),
        sa.Column("rate_period_ms", sa.BigInteger(), nullable=True),
    ]
    if per_key:
        columns += [
            sa.Column("rate_per_key_count", sa.Integer(), nullable=True),
            sa.Column("rate_per_key_period_ms", sa.BigInteger(), nullable=True),
        ]
    columns += [
        sa.Column("cursor_key", _key_type(dialect), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
    ]
    copied = ", ".join(column.name for column in columns if not column.name.startswith("rate_per_key"))
    checks = [
        _check(LIMITS, "queue_name_length", "length(queue_name) BETWEEN 1 AND 256"),
        _limit_range("concurrency"),
        _limit_range("concurrency_per_key"),
        _limit_range("rate_count"),
        _check(
            LIMITS, "rate_period_range", f"rate_period_ms IS NULL OR rate_period_ms BETWEEN 1 AND {RATE_PERIOD_MAX_MS}"
        ),
        _check(LIMITS, "rate_complete", "(rate_count IS NULL) = (rate_period_ms IS NULL)"),
        _check(LIMITS, "some_limit", SOME_LIMIT if per_key else SOME_LIMIT_BEFORE),
        _check(LIMITS, "cursor_key_length", f"cursor_key IS NULL OR length(cursor_key) BETWEEN 1 AND {KEY_MAX_LENGTH}"),
    ]
    if per_key:
        checks += [_check(LIMITS, suffix, condition) for suffix, condition in PER_KEY_CHECKS]
    new = f"{LIMITS}_w0015"
    op.create_table(new, *columns, sa.PrimaryKeyConstraint("queue_name", name=op.f(f"pk_{LIMITS}")), *checks)
    op.execute(f"INSERT INTO {new} ({copied}) SELECT {copied} FROM {LIMITS}")
    op.drop_table(LIMITS)
    op.rename_table(new, LIMITS)


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        _rebuild_limits(per_key=True)
        op.execute(
            f"ALTER TABLE {CLAIMS} ADD COLUMN limit_key TEXT"
            f" CONSTRAINT ck_{CLAIMS}_limit_key_length CHECK ({KEY_LENGTH})"
        )
    else:
        op.add_column(LIMITS, sa.Column("rate_per_key_count", sa.Integer(), nullable=True))
        op.add_column(LIMITS, sa.Column("rate_per_key_period_ms", sa.BigInteger(), nullable=True))
        for suffix, condition in PER_KEY_CHECKS:
            op.create_check_constraint(_name(LIMITS, suffix), LIMITS, condition)
        op.drop_constraint(_name(LIMITS, "some_limit"), LIMITS, type_="check")
        op.create_check_constraint(_name(LIMITS, "some_limit"), LIMITS, SOME_LIMIT)
        op.add_column(CLAIMS, sa.Column("limit_key", _key_type(dialect), nullable=True))
        op.create_check_constraint(_name(CLAIMS, "limit_key_length"), CLAIMS, KEY_LENGTH)
    where = sa.text("limit_key IS NOT NULL")
    op.create_index(
        op.f(KEYED_INDEX),
        CLAIMS,
        ["queue_name", "limit_key", "claimed_at"],
        postgresql_where=where,
        sqlite_where=where,
    )


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    dialect = op.get_bind().dialect.name
    op.execute(f"DELETE FROM {LIMITS} WHERE NOT ({SOME_LIMIT_BEFORE})")
    op.drop_index(op.f(KEYED_INDEX), table_name=CLAIMS)
    if dialect == "sqlite":
        _rebuild_limits(per_key=False)
        # SQLite drops a column whose own CHECKs name only it.
        op.execute(f"ALTER TABLE {CLAIMS} DROP COLUMN limit_key")
    else:
        op.drop_constraint(_name(CLAIMS, "limit_key_length"), CLAIMS, type_="check")
        op.drop_column(CLAIMS, "limit_key")
        op.drop_constraint(_name(LIMITS, "some_limit"), LIMITS, type_="check")
        op.create_check_constraint(_name(LIMITS, "some_limit"), LIMITS, SOME_LIMIT_BEFORE)
        for suffix, _condition in PER_KEY_CHECKS:
            op.drop_constraint(_name(LIMITS, suffix), LIMITS, type_="check")
        op.drop_column(LIMITS, "rate_per_key_period_ms")
        op.drop_column(LIMITS, "rate_per_key_count")
