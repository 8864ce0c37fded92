"""Events and compensation: the signals sent to jobs, waits and undos among the steps.

Revision ID: w0022_job_signals
Revises: w0021_job_steps
Create Date: 2026-12-07

Adds ``watchdog_job_signals``: one row per signal kept for a job
(``Watchdog.signal(job_id, name, payload)``; the first of each name), keyed
by ``(job_sequence, name)`` like the steps, with its payload as canonical
JSON and when it was kept (``sent_at``, epoch milliseconds on the database
clock). Every value is held by a CHECK.

``watchdog_job_steps`` takes two more kinds: ``wait`` (``job.wait_for``: its
timeout in ``wake_at``) and ``undo`` (a finished undo of a failed job's
compensation). Its CHECK ``kind_known`` takes them, ``sleep_has_wake_at``
becomes ``wake_at_timed`` (a sleep or a wait has ``wake_at``, nothing else)
and ``result_step_only`` is new (only a step keeps a result). PostgreSQL
changes the CHECKs in place; SQLite cannot, so its (small) table is copied
into one made afresh. Downgrading drops the signals and the wait and undo
rows (recorded by code that needs this revision) and puts the old CHECKs back.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0022_job_signals"
down_revision = "w0021_job_steps"
branch_labels = None
depends_on = None

SIGNALS = "watchdog_job_signals"
STEPS = "watchdog_job_steps"
#: As of this revision (jobs.JOB_ID_MAX_LENGTH, model.STEP_NAME_MAX_LENGTH).
SIGNAL_CHECKS = {
    "job_id_length": "length(job_id) BETWEEN 1 AND 256",
    "name_length": "length(name) BETWEEN 1 AND 256",
    "payload_present": "length(payload_json) >= 1",
    "sent_at_nonnegative": "sent_at >= 0",
}
#: The steps' CHECKs of w0021.
STEP_CHECKS_BEFORE = {
    "job_id_length": "length(job_id) BETWEEN 1 AND 256",
    "name_length": "length(name) BETWEEN 1 AND 256",
    "kind_known": "kind IN ('step', 'sleep')",
    "sleep_has_wake_at": "(kind = 'sleep') = (wake_at IS NOT NULL)",
    "attempt_positive": "attempt >= 1",
}
#: The steps' CHECKs of this revision (model.STEP_KINDS, STEP_WAKE, STEP_RESULT).
STEP_CHECKS = {
    "job_id_length": "length(job_id) BETWEEN 1 AND 256",
    "name_length": "length(name) BETWEEN 1 AND 256",
    "kind_known": "kind IN ('step', 'sleep', 'wait', 'undo')",
    "wake_at_timed": "(kind IN ('sleep', 'wait')) = (wake_at IS NOT NULL)",
    "result_step_only": "result_json IS NULL OR kind = 'step'",
    "attempt_positive": "attempt >= 1",
}
STEP_COLUMNS = "job_sequence, name, job_id, kind, result_json, wake_at, attempt, recorded_at"


def _collated() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def _steps_table(name: str, checks: dict[str, str]) -> None:
    """The steps table as w0021 made it, under ``name``, with ``checks``
    (named for ``watchdog_job_steps`` whatever ``name`` is)."""
    op.create_table(
        name,
        sa.Column("job_sequence", sa.BigInteger(), nullable=False),
        sa.Column("name", _collated(), nullable=False),
        sa.Column("job_id", _collated(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("result_json", sa.Text(), nullable=True),
        sa.Column("wake_at", sa.BigInteger(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.BigInteger(), nullable=False),
        *(sa.CheckConstraint(check, name=op.f(f"ck_{STEPS}_{key}")) for key, check in checks.items()),
        sa.PrimaryKeyConstraint("job_sequence", "name", name=op.f(f"pk_{STEPS}")),
    )


def _checks(old: dict[str, str], new: dict[str, str], keep_rows: str | None = None) -> None:
    """The steps table's CHECKs from ``old`` to ``new`` (rows not matching
    ``keep_rows`` deleted first, on the way down)."""
    if keep_rows is not None:
        op.execute(f"DELETE FROM {STEPS} WHERE NOT ({keep_rows})")
    bind = op.get_bind()
    if w0001.made_whole(bind):
        # MariaDB/MySQL: DROP CONSTRAINT names a CHECK there. All of them go and
        # come back in the model's order (the server keeps them in the order added).
        for key in old:
            op.execute(f"ALTER TABLE {STEPS} DROP CONSTRAINT ck_{STEPS}_{key}")
        for key, check in new.items():
            op.execute(f"ALTER TABLE {STEPS} ADD CONSTRAINT ck_{STEPS}_{key} CHECK ({_mysql(check)})")
        return
    if bind.dialect.name == "sqlite":
        # SQLite cannot change a CHECK: copy the rows into a table made afresh.
        op.execute(f"ALTER TABLE {STEPS} RENAME TO {STEPS}_w0022")
        _steps_table(STEPS, new)
        op.execute(f"INSERT INTO {STEPS} ({STEP_COLUMNS}) SELECT {STEP_COLUMNS} FROM {STEPS}_w0022")
        op.execute(f"DROP TABLE {STEPS}_w0022")
        return
    for key, check in old.items():
        if new.get(key) != check:
            op.drop_constraint(op.f(f"ck_{STEPS}_{key}"), STEPS, type_="check")
    for key, check in new.items():
        if old.get(key) != check:
            op.create_check_constraint(op.f(f"ck_{STEPS}_{key}"), STEPS, check)


def _mysql(check: str) -> str:
    """A CHECK as w0001 writes them on MariaDB and MySQL (``CHAR_LENGTH``: characters, not bytes)."""
    return check.replace("length(", "CHAR_LENGTH(")


def upgrade() -> None:
    bind = op.get_bind()
    if w0001.made_whole(bind):
        collation = w0001.MYSQL_COLLATIONS[bind.dialect.name]
        checks = ", ".join(f"CONSTRAINT ck_{SIGNALS}_{key} CHECK ({_mysql(c)})" for key, c in SIGNAL_CHECKS.items())
        op.execute(
            f"CREATE TABLE {SIGNALS} (job_sequence BIGINT NOT NULL, name VARCHAR(257) COLLATE {collation} NOT NULL,"
            f" job_id VARCHAR(257) COLLATE {collation} NOT NULL, payload_json TEXT NOT NULL, sent_at BIGINT NOT NULL,"
            f" CONSTRAINT pk_{SIGNALS} PRIMARY KEY (job_sequence, name), {checks})"
        )
        _checks(STEP_CHECKS_BEFORE, STEP_CHECKS)
        return
    op.create_table(
        SIGNALS,
        sa.Column("job_sequence", sa.BigInteger(), nullable=False),
        sa.Column("name", _collated(), nullable=False),
        sa.Column("job_id", _collated(), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("sent_at", sa.BigInteger(), nullable=False),
        *(sa.CheckConstraint(check, name=op.f(f"ck_{SIGNALS}_{key}")) for key, check in SIGNAL_CHECKS.items()),
        sa.PrimaryKeyConstraint("job_sequence", "name", name=op.f(f"pk_{SIGNALS}")),
    )
    _checks(STEP_CHECKS_BEFORE, STEP_CHECKS)


def downgrade() -> None:
    _checks(STEP_CHECKS, STEP_CHECKS_BEFORE, keep_rows="kind IN ('step', 'sleep')")
    op.drop_table(SIGNALS)
