"""Workers and schedules you can see.

Revision ID: w0009_workers_and_schedules
Revises: w0008_fewer_index_entries
Create Date: 2026-12-04

Creates two tables, both written by the runners and read by
``Watchdog.workers()`` / ``Watchdog.schedules()``, the CLI and the dashboard;
``watchdog_jobs`` is untouched:

* ``watchdog_workers``: one row per serving runner -- its id, host, pid,
  queues (a JSON array), concurrency, wake-up mode, library version,
  heartbeat period, when it started and when it was last seen (epoch
  milliseconds by the database clock) and the jobs it was running then.
* ``watchdog_schedules``: one row per schedule name and definition
  (``fingerprint``): cron, time zone, queue, next slot, latest slot
  enqueued, the worker that recorded it last and when.

Both dialects create them the same way. Downgrading drops them (runners of
the previous version never read them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0009_workers_and_schedules"
down_revision = "w0008_fewer_index_entries"
branch_labels = None
depends_on = None

WORKERS = "watchdog_workers"
SCHEDULES = "watchdog_schedules"


def _check(table: str, name: str, condition: str) -> sa.CheckConstraint:
    return sa.CheckConstraint(condition, name=op.f(f"ck_{table}_{name}"))


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    op.create_table(
        WORKERS,
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", sa.Text(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("wakeups", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("heartbeat_ms", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("last_seen", sa.BigInteger(), nullable=False),
        sa.Column("running", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=op.f(f"pk_{WORKERS}")),
        _check(WORKERS, "worker_id_length", "length(worker_id) BETWEEN 1 AND 64"),
        _check(WORKERS, "host_length", "length(host) BETWEEN 1 AND 255"),
        _check(WORKERS, "pid_nonnegative", "pid >= 0"),
        _check(WORKERS, "queues_length", "length(queues) BETWEEN 2 AND 65536"),
        _check(WORKERS, "concurrency_positive", "concurrency >= 1"),
        _check(WORKERS, "wakeups_length", "length(wakeups) BETWEEN 1 AND 1000"),
        _check(WORKERS, "version_length", "length(version) BETWEEN 1 AND 64"),
        _check(WORKERS, "heartbeat_positive", "heartbeat_ms > 0"),
        _check(WORKERS, "seen_after_start", "last_seen >= started_at"),
        _check(WORKERS, "running_nonnegative", "running >= 0"),
    )
    op.create_table(
        SCHEDULES,
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("cron", sa.Text(), nullable=False),
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("queue_name", sa.Text(), nullable=False),
        sa.Column("next_slot", sa.BigInteger(), nullable=True),
        sa.Column("last_enqueued", sa.BigInteger(), nullable=True),
        sa.Column("recorded_by", sa.Text(), nullable=False),
        sa.Column("last_seen", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", "fingerprint", name=op.f(f"pk_{SCHEDULES}")),
        _check(SCHEDULES, "name_length", "length(name) BETWEEN 1 AND 200"),
        _check(SCHEDULES, "fingerprint_length", "length(fingerprint) BETWEEN 1 AND 64"),
        _check(SCHEDULES, "cron_length", "length(cron) BETWEEN 1 AND 500"),
        _check(SCHEDULES, "timezone_length", "length(timezone) BETWEEN 1 AND 255"),
        _check(SCHEDULES, "queue_name_length", "length(queue_name) BETWEEN 1 AND 256"),
        _check(SCHEDULES, "recorded_by_length", "length(recorded_by) BETWEEN 1 AND 64"),
    )


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    op.drop_table(SCHEDULES)
    op.drop_table(WORKERS)
