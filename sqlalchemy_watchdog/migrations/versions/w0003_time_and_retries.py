"""Time and failure policy: delayed jobs, retries, snoozes, timeouts.

Revision ID: w0003_time_and_retries
Revises: w0002_failure_detail
Create Date: 2026-12-03

Adds a ``delayed`` state (a job waiting for its time holds no claim token,
lease or outcome, and has a ready time), the columns of retries, snoozes and
timeouts with CHECK constraints keeping attempts within their bounds, and
the ``ix_watchdog_jobs_delayed`` index. The partial "live" indexes now cover
delayed jobs too.

Rows that exist before the upgrade keep their meaning: every job is on its
first attempt (``attempt = 1``), has no policy of its own, no snoozes and no
failure history.

On PostgreSQL the upgrade adds columns and swaps constraints and indexes in
place. **On SQLite the table is rebuilt** (SQLite cannot add a CHECK
constraint to an existing table): a new table is created, every row copied
with its ``sequence``, the old table dropped and the new one renamed; the
AUTOINCREMENT counter is carried over. Run it while no runner is working (it
holds SQLite's write lock for the copy).

Downgrading makes every delayed job ``queued`` (it runs at once) and drops
the attempt counts, policies and histories.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0003_time_and_retries"
down_revision = "w0002_failure_detail"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
OLD_LIVE = "state IN ('queued', 'running')"
NEW_LIVE = "state IN ('delayed', 'queued', 'running')"
OLD_STATES = "state IN ('queued', 'running', 'settled')"
NEW_STATES = "state IN ('delayed', 'queued', 'running', 'settled')"
OLD_GRAMMAR = (
    "(state = 'queued' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL)"
    " OR (state = 'running' AND outcome IS NULL AND claim_token IS NOT NULL"
    " AND lease_until IS NOT NULL)"
    " OR (state = 'settled' AND outcome IS NOT NULL AND lease_until IS NULL)"
)
NEW_GRAMMAR = (
    "(state = 'delayed' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL"
    " AND ready_at IS NOT NULL)"
    " OR (state = 'queued' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL)"
    " OR (state = 'running' AND outcome IS NULL AND claim_token IS NOT NULL"
    " AND lease_until IS NOT NULL)"
    " OR (state = 'settled' AND outcome IS NOT NULL AND lease_until IS NULL)"
)
NEW_CHECKS = {
    "max_attempts_range": "max_attempts IS NULL OR max_attempts BETWEEN 1 AND 1000",
    "attempt_bounds": "attempt >= 1 AND (max_attempts IS NULL OR attempt <= max_attempts)",
    "snoozes_nonnegative": "snoozes >= 0",
    "timeout_positive": "timeout_ms IS NULL OR timeout_ms > 0",
}
OLD_COLUMNS = [
    "sequence", "job_id", "queue_name", "lane", "priority", "payload_json", "recovery_max", "state",
    "outcome", "claim_token", "recovery_count", "cancellation_id", "failure_reason", "lease_until",
    "failure_detail",
]  # fmt: skip
NEW_COLUMNS = [
    "run_at", "ready_at", "attempt", "max_attempts", "retry_policy", "timeout_ms", "snoozes", "failure_history",
]  # fmt: skip


def _partial(where: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}


def _new_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("run_at", sa.BigInteger(), nullable=True),
        sa.Column("ready_at", sa.BigInteger(), nullable=True),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("retry_policy", sa.Text(), nullable=True),
        sa.Column("timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("snoozes", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("failure_history", sa.Text(), nullable=True),
    ]


def _ck(name: str) -> str:
    return op.f(f"ck_{TABLE}_{name}")


def _table(name: str, *, new: bool) -> sa.Table:
    """The whole table as it is at this revision (``new``) or the one before."""
    columns: list[Any] = [
        sa.Column("sequence", sa.Integer(), primary_key=True, autoincrement=True),
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
        sa.Column("failure_detail", sa.Text(), nullable=True),
    ]
    if new:
        columns += _new_columns()
    constraints: list[Any] = [
        sa.PrimaryKeyConstraint("sequence", name=op.f(f"pk_{TABLE}")),
        sa.UniqueConstraint("job_id", name=op.f(f"uq_{TABLE}_job_id")),
        sa.UniqueConstraint("cancellation_id", name=op.f(f"uq_{TABLE}_cancellation_id")),
        sa.CheckConstraint("length(job_id) BETWEEN 1 AND 256", name=_ck("job_id_length")),
        sa.CheckConstraint("length(queue_name) BETWEEN 1 AND 256", name=_ck("queue_name_length")),
        sa.CheckConstraint("length(lane) BETWEEN 1 AND 512", name=_ck("lane_length")),
        sa.CheckConstraint(
            "cancellation_id IS NULL OR length(cancellation_id) BETWEEN 1 AND 256", name=_ck("cancellation_id_length")
        ),
        sa.CheckConstraint(NEW_STATES if new else OLD_STATES, name=_ck("state_known")),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('completed', 'failed', 'cancelled', 'outcome_unknown', 'interrupted')",
            name=_ck("outcome_known"),
        ),
        sa.CheckConstraint("recovery_max IS NULL OR recovery_max >= 0", name=_ck("recovery_max_nonnegative")),
        sa.CheckConstraint("recovery_count >= 0", name=_ck("recovery_count_nonnegative")),
        sa.CheckConstraint(NEW_GRAMMAR if new else OLD_GRAMMAR, name=_ck("state_grammar")),
    ]
    if new:
        constraints += [sa.CheckConstraint(sql, name=_ck(check)) for check, sql in NEW_CHECKS.items()]
    return sa.Table(name, sa.MetaData(), *columns, *constraints, sqlite_autoincrement=True)


def _create_indexes(*, new: bool) -> None:
    live = NEW_LIVE if new else OLD_LIVE
    op.create_index(
        op.f(f"ix_{TABLE}_ready"), TABLE, [sa.column("priority").desc(), "sequence"], **_partial("state = 'queued'")
    )
    op.create_index(op.f(f"ix_{TABLE}_lease"), TABLE, ["lease_until", "sequence"], **_partial("state = 'running'"))
    op.create_index(
        op.f(f"ix_{TABLE}_live_lane"), TABLE, ["lane", sa.column("state").desc(), "sequence"], **_partial(live)
    )
    op.create_index(
        op.f(f"ix_{TABLE}_live_queue"),
        TABLE,
        ["queue_name", "state", sa.column("priority").desc(), "sequence"],
        **_partial(live),
    )
    if new:
        op.create_index(op.f(f"ix_{TABLE}_delayed"), TABLE, ["ready_at", "sequence"], **_partial("state = 'delayed'"))


def _rebuild_sqlite(*, new: bool) -> None:
    """Copy the table into its definition at this revision (``new``) or the
    one before, keeping every row, its ``sequence`` and the AUTOINCREMENT counter."""
    bind = op.get_bind()
    counter = bind.execute(sa.text("SELECT seq FROM sqlite_sequence WHERE name = :t"), {"t": TABLE}).scalar()
    staging = f"_{TABLE}_w0003"
    target = _table(staging, new=new)
    target.create(bind)
    if new:
        op.execute(f"INSERT INTO {staging} ({', '.join(OLD_COLUMNS)}) SELECT {', '.join(OLD_COLUMNS)} FROM {TABLE}")
    else:
        # Delayed jobs become queued: the old grammar has no state for them.
        selected = ", ".join("CASE WHEN state = 'delayed' THEN 'queued' ELSE state END" if c == "state" else c
                             for c in OLD_COLUMNS)  # fmt: skip
        op.execute(f"INSERT INTO {staging} ({', '.join(OLD_COLUMNS)}) SELECT {selected} FROM {TABLE}")
    op.execute(f"DROP TABLE {TABLE}")
    op.execute(f"ALTER TABLE {staging} RENAME TO {TABLE}")
    if counter is not None:
        op.execute(
            sa.text("UPDATE sqlite_sequence SET seq = max(seq, :seq) WHERE name = :t").bindparams(seq=counter, t=TABLE)
        )
    _create_indexes(new=new)


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(new=True)
        return
    for column in _new_columns():
        op.add_column(TABLE, column)
    op.drop_constraint(_ck("state_known"), TABLE, type_="check")
    op.drop_constraint(_ck("state_grammar"), TABLE, type_="check")
    op.create_check_constraint(_ck("state_known"), TABLE, NEW_STATES)
    op.create_check_constraint(_ck("state_grammar"), TABLE, NEW_GRAMMAR)
    for check, sql in NEW_CHECKS.items():
        op.create_check_constraint(_ck(check), TABLE, sql)
    for index in ("live_lane", "live_queue"):
        op.drop_index(op.f(f"ix_{TABLE}_{index}"), table_name=TABLE)
    op.create_index(
        op.f(f"ix_{TABLE}_live_lane"), TABLE, ["lane", sa.column("state").desc(), "sequence"], **_partial(NEW_LIVE)
    )
    op.create_index(
        op.f(f"ix_{TABLE}_live_queue"),
        TABLE,
        ["queue_name", "state", sa.column("priority").desc(), "sequence"],
        **_partial(NEW_LIVE),
    )
    op.create_index(op.f(f"ix_{TABLE}_delayed"), TABLE, ["ready_at", "sequence"], **_partial("state = 'delayed'"))


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(new=False)
        return
    op.execute(f"UPDATE {TABLE} SET state = 'queued' WHERE state = 'delayed'")
    op.drop_index(op.f(f"ix_{TABLE}_delayed"), table_name=TABLE)
    for index in ("live_lane", "live_queue"):
        op.drop_index(op.f(f"ix_{TABLE}_{index}"), table_name=TABLE)
    for check in NEW_CHECKS:
        op.drop_constraint(_ck(check), TABLE, type_="check")
    op.drop_constraint(_ck("state_known"), TABLE, type_="check")
    op.drop_constraint(_ck("state_grammar"), TABLE, type_="check")
    for column in reversed(NEW_COLUMNS):
        op.drop_column(TABLE, column)
    op.create_check_constraint(_ck("state_known"), TABLE, OLD_STATES)
    op.create_check_constraint(_ck("state_grammar"), TABLE, OLD_GRAMMAR)
    op.create_index(
        op.f(f"ix_{TABLE}_live_lane"), TABLE, ["lane", sa.column("state").desc(), "sequence"], **_partial(OLD_LIVE)
    )
    op.create_index(
        op.f(f"ix_{TABLE}_live_queue"),
        TABLE,
        ["queue_name", "state", sa.column("priority").desc(), "sequence"],
        **_partial(OLD_LIVE),
    )
