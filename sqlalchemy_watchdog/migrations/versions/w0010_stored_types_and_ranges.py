"""Stored values the library can read, and listings read as index ranges.

Revision ID: w0010_stored_types_and_ranges
Revises: w0009_workers_and_schedules
Create Date: 2026-12-04

**SQLite** keeps any value in any column (type affinity turns ``'12'`` into
12 in an INTEGER column, but keeps ``'abc'``, and a BLOB anywhere), so a row
a producer wrote itself could hold text where every statement sorts and
compares integers, or bytes where it reads text. Each column of
``watchdog_jobs`` gets a CHECK ``ck_watchdog_jobs_<column>_stored_type``:
``typeof(column) = 'integer'`` (or ``'text'``; ``IN (..., 'null')`` for a
nullable column). SQLite cannot add a CHECK to a table, so the table is
rebuilt as w0008 did: a table is created from the stored definition with
the new clauses, every row copied with its ``sequence``, the old table
dropped and the new one renamed, the AUTOINCREMENT counter carried over and
every index recreated. Run it while no runner works.

Rows already holding a value of the wrong type are made to fit first, so
the upgrade never fails on them:

* a BLOB in a text column becomes the same bytes as TEXT (``CAST``); text
  that is not UTF-8 reads as unknown afterwards (see docs/design.md);
* an integer column holding anything but an integer (text, a BLOB, a real)
  becomes ``NULL``, or its default where it cannot be ``NULL``
  (``priority`` 0, ``recovery_count`` 0, ``attempt`` 1, ``snoozes`` 0), and
  a live job holding one is settled ``failed`` with the reason ``stored value
  unreadable: <columns>`` (its job_id kept): nothing could have run it.

**PostgreSQL**: ``job_id`` becomes ``COLLATE "C"``. A deterministic
collation compares equal only when the bytes are, so uniqueness is the
same; only the order changes, to code point order, so the jobs starting
with a prefix are one range of ``uq_watchdog_jobs_job_id`` under any
database collation (the unique index is rebuilt; no row is rewritten).

**Both dialects** add ``ix_watchdog_jobs_lane_history (lane, sequence)``
over every job, settled history included, so that a listing filtered by
lane reads one range of it, oldest or newest first, however long the
history (on SQLite after the rebuild, into the new table). Building it reads
the whole table once; on PostgreSQL writes to the table wait meanwhile.

Downgrading drops that index and restores the previous table: SQLite
rebuilds it without the CHECKs (the repaired rows stay repaired);
PostgreSQL gives ``job_id`` the database's collation again.
"""

from __future__ import annotations

import re
import time

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0010_stored_types_and_ranges"
down_revision = "w0009_workers_and_schedules"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
LIVE_STATES = ("delayed", "queued", "running")
#: Integer columns that cannot be NULL, with the value a wrong one becomes.
INTEGER_DEFAULTS = {"priority": 0, "recovery_count": 0, "attempt": 1, "snoozes": 0}
NULLABLE_INTEGER = (
    "recovery_max", "lease_until", "run_at", "ready_at", "max_attempts", "timeout_ms",
    "enqueued_at", "started_at", "settled_at",
)  # fmt: skip
TEXT = ("job_id", "queue_name", "lane", "payload_json", "state")
NULLABLE_TEXT = (
    "outcome", "claim_token", "cancellation_id", "failure_reason", "failure_detail", "retry_policy",
    "failure_history", "rerun_of", "trace_context",
)  # fmt: skip


def _check(column: str) -> str:
    """The CHECK clause as model.py declares it (the model's own text, so
    that a migrated table and a created one are the same)."""
    kind = "integer" if column in INTEGER_DEFAULTS or column in NULLABLE_INTEGER else "text"
    nullable = column in NULLABLE_INTEGER or column in NULLABLE_TEXT
    condition = f"typeof({column}) IN ('{kind}', 'null')" if nullable else f"typeof({column}) = '{kind}'"
    return f"CONSTRAINT ck_{TABLE}_{column}_stored_type CHECK ({condition})"


COLUMNS = (*INTEGER_DEFAULTS, *NULLABLE_INTEGER, *TEXT, *NULLABLE_TEXT)
CLAUSES = "".join(f", \n\t{_check(column)}" for column in COLUMNS)


def _repair_sqlite() -> None:
    """Make every stored value fit the new CHECKs (see the module docstring)."""
    bind = op.get_bind()
    for column in (*TEXT, *NULLABLE_TEXT):
        op.execute(f"UPDATE {TABLE} SET {column} = CAST({column} AS TEXT) WHERE typeof({column}) = 'blob'")
    integers = (*INTEGER_DEFAULTS, *NULLABLE_INTEGER)
    wrong = " OR ".join(f"typeof({column}) NOT IN ('integer', 'null')" for column in integers)
    kinds = ", ".join(f"typeof({column})" for column in integers)
    rows = bind.execute(sa.text(f"SELECT sequence, state, {kinds} FROM {TABLE} WHERE {wrong}")).all()
    now = int(time.time() * 1000)
    for sequence, state, *types in rows:
        bad = [column for column, kind in zip(integers, types, strict=True) if kind not in ("integer", "null")]
        values: dict[str, object] = {column: INTEGER_DEFAULTS.get(column) for column in bad}
        if state in LIVE_STATES:
            values.update(
                state="settled",
                outcome="failed",
                failure_reason=f"stored value unreadable: {', '.join(bad)}",
                failure_detail=None,
                lease_until=None,
                settled_at=now,
            )
        assignments = ", ".join(f"{column} = :{column}" for column in values)
        bind.execute(sa.text(f"UPDATE {TABLE} SET {assignments} WHERE sequence = :key"), {**values, "key": sequence})


def _rebuild_sqlite(*, checks: bool) -> None:
    """Copy the table into its stored definition with the stored-type CHECKs
    added (or removed), keeping every row, its ``sequence``, the
    AUTOINCREMENT counter and the indexes."""
    bind = op.get_bind()
    stored = bind.execute(
        sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"), {"t": TABLE}
    ).scalar_one()
    indexes = list(
        bind.execute(
            sa.text("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :t AND sql IS NOT NULL"),
            {"t": TABLE},
        ).scalars()
    )
    counter = bind.execute(sa.text("SELECT seq FROM sqlite_sequence WHERE name = :t"), {"t": TABLE}).scalar()
    head = re.match(rf'CREATE TABLE (IF NOT EXISTS )?"?{TABLE}"?\s*\(', stored)
    if head is None:  # pragma: no cover - a table this package did not create
        raise RuntimeError(f"w0010: cannot read the definition of {TABLE}: {stored[:80]!r}")
    body = stored[head.end() :].rstrip()
    if not body.endswith(")"):  # pragma: no cover - a table this package did not create
        raise RuntimeError(f"w0010: cannot read the definition of {TABLE}: {stored[-80:]!r}")
    body = body[:-1].rstrip()
    if checks:
        body += CLAUSES
    else:
        if not body.endswith(CLAUSES):  # pragma: no cover - a table this package did not create
            raise RuntimeError(f"w0010: {TABLE} does not end with its stored-type CHECKs")
        body = body[: -len(CLAUSES)]
    staging = f"_{TABLE}_w0010"
    op.execute(f"CREATE TABLE {staging} ({body}\n)")
    op.execute(f"INSERT INTO {staging} SELECT * FROM {TABLE}")
    op.execute(f"DROP TABLE {TABLE}")
    op.execute(f"ALTER TABLE {staging} RENAME TO {TABLE}")
    if counter is not None:
        op.execute(
            sa.text("UPDATE sqlite_sequence SET seq = max(seq, :seq) WHERE name = :t").bindparams(seq=counter, t=TABLE)
        )
    for index in indexes:
        op.execute(index)


#: Every job by lane (model.py declares the same index).
LANE_HISTORY = f"ix_{TABLE}_lane_history"


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        _repair_sqlite()
        _rebuild_sqlite(checks=True)
    else:
        op.execute(f'ALTER TABLE {TABLE} ALTER COLUMN job_id TYPE TEXT COLLATE "C"')
    # After the rebuild: the index belongs to the new table.
    op.create_index(op.f(LANE_HISTORY), TABLE, ["lane", "sequence"])


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    # Before the rebuild, which recreates every index the table has.
    op.drop_index(op.f(LANE_HISTORY), table_name=TABLE)
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(checks=False)
    else:
        op.execute(f'ALTER TABLE {TABLE} ALTER COLUMN job_id TYPE TEXT COLLATE "default"')
