"""Fewer index entries per job: a cheaper enqueue, claim and settle.

Revision ID: w0008_fewer_index_entries
Revises: w0007_notify_when_waiting
Create Date: 2026-12-04

Every index a row enters costs its enqueue, and its claim and settle too:
each of those changes ``state``, so PostgreSQL writes every index a new
entry for the row. A ready job entered seven indexes; it now enters three
(the primary key, ``job_id`` and ``ix_watchdog_jobs_live_queue``) unless it
has a lane of its own or a cancellation id:

* ``ix_watchdog_jobs_ready`` (the queued jobs of every queue in claim
  order) is dropped: a claim reads each of its queues in
  ``ix_watchdog_jobs_live_queue``, a claim of several queues each of them.

* ``uq_watchdog_jobs_cancellation_id`` becomes a partial unique index over
  the jobs that have a cancellation id (was: a UNIQUE constraint, one NULL
  entry per job). The same rule: no two jobs share a cancellation id.
* ``ix_watchdog_jobs_live_lane`` holds only the live jobs whose lane is not
  their queue's name (the default lane). ``fail_lane`` of a queue's name
  finds that queue's default-lane jobs in ``ix_watchdog_jobs_live_queue``.
* ``ix_watchdog_jobs_live_queue`` ends with ``ready_at`` and ``enqueued_at``
  (after the unique ``sequence`` they never change its order), so
  ``stats()`` reads each queue's oldest ready job in the same index-only
  read that counts its jobs, and ``ix_watchdog_jobs_queued_since``
  (PostgreSQL only since w0006) is dropped.

On PostgreSQL the indexes are swapped in place. **On SQLite the table is
rebuilt** (SQLite cannot drop a UNIQUE constraint of an existing table): a
new table is created from the stored definition without that constraint,
every row copied with its ``sequence``, the old table dropped and the new one
renamed; the AUTOINCREMENT counter is carried over and every index
recreated. Run it while no runner is working (it holds SQLite's write lock
for the copy). Downgrading restores the previous indexes (and on SQLite
rebuilds the table with the constraint).
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0008_fewer_index_entries"
down_revision = "w0007_notify_when_waiting"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
LIVE = "state IN ('delayed', 'queued', 'running')"
CANCELLATION = f"uq_{TABLE}_cancellation_id"
READY = f"ix_{TABLE}_ready"
#: The UNIQUE constraint as the table's stored SQL holds it (SQLite).
CANCELLATION_CONSTRAINT = f"CONSTRAINT {CANCELLATION} UNIQUE (cancellation_id)"
JOB_ID_CONSTRAINT = f"CONSTRAINT uq_{TABLE}_job_id UNIQUE (job_id),"


def _partial(where: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}


def _live_indexes(*, new: bool) -> None:
    """Create ix_watchdog_jobs_live_lane and ix_watchdog_jobs_live_queue as at
    this revision (``new``) or the one before."""
    lane_where = f"{LIVE} AND lane <> queue_name" if new else LIVE
    op.create_index(
        op.f(f"ix_{TABLE}_live_lane"), TABLE, ["lane", sa.column("state").desc(), "sequence"], **_partial(lane_where)
    )
    times = ["ready_at", "enqueued_at"] if new else []
    op.create_index(
        op.f(f"ix_{TABLE}_live_queue"),
        TABLE,
        ["queue_name", "state", sa.column("priority").desc(), "sequence", *times],
        **_partial(LIVE),
    )


def _drop_live_indexes() -> None:
    for index in ("live_lane", "live_queue"):
        op.drop_index(op.f(f"ix_{TABLE}_{index}"), table_name=TABLE)


def _rebuild_sqlite(*, unique_constraint: bool) -> None:
    """Copy the table into its stored definition with the cancellation_id
    UNIQUE constraint removed (or put back), keeping every row, its
    ``sequence``, the AUTOINCREMENT counter and the other indexes."""
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
    staging = f"_{TABLE}_w0008"
    # The stored text starts 'CREATE TABLE [IF NOT EXISTS] "watchdog_jobs" (' or without quotes.
    head = re.match(rf'CREATE TABLE (IF NOT EXISTS )?"?{TABLE}"?\s*\(', stored)
    if head is None:  # pragma: no cover - a table this package did not create
        raise RuntimeError(f"w0008: cannot read the definition of {TABLE}: {stored[:80]!r}")
    body = stored[head.end() :]
    if unique_constraint:
        # Back after job_id's, where w0001 put it (a table constraint, after every column).
        anchor = body.index(JOB_ID_CONSTRAINT) + len(JOB_ID_CONSTRAINT)
        body = f"{body[:anchor]} \n\t{CANCELLATION_CONSTRAINT},{body[anchor:]}"
    else:
        body, found = re.subn(rf"{re.escape(CANCELLATION_CONSTRAINT)},\s*", "", body)
        if found != 1:  # pragma: no cover - a table this package did not create
            raise RuntimeError(f"w0008: {TABLE} has no {CANCELLATION_CONSTRAINT}")
    op.execute(f"CREATE TABLE {staging} ({body}")
    op.execute(f"INSERT INTO {staging} SELECT * FROM {TABLE}")
    op.execute(f"DROP TABLE {TABLE}")
    op.execute(f"ALTER TABLE {staging} RENAME TO {TABLE}")
    if counter is not None:
        op.execute(
            sa.text("UPDATE sqlite_sequence SET seq = max(seq, :seq) WHERE name = :t").bindparams(seq=counter, t=TABLE)
        )
    for index in indexes:
        op.execute(index)


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    op.drop_index(op.f(READY), table_name=TABLE)
    _drop_live_indexes()
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(unique_constraint=False)
    else:
        op.drop_constraint(CANCELLATION, TABLE, type_="unique")
        op.drop_index(op.f(f"ix_{TABLE}_queued_since"), table_name=TABLE)
    op.create_index(CANCELLATION, TABLE, ["cancellation_id"], unique=True, **_partial("cancellation_id IS NOT NULL"))
    _live_indexes(new=True)


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    op.drop_index(CANCELLATION, table_name=TABLE)
    _drop_live_indexes()
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(unique_constraint=True)
    else:
        op.create_unique_constraint(CANCELLATION, TABLE, ["cancellation_id"])
        op.create_index(
            op.f(f"ix_{TABLE}_queued_since"),
            TABLE,
            ["queue_name", sa.text("coalesce(ready_at, enqueued_at)")],
            **_partial("state = 'queued'"),
        )
    _live_indexes(new=False)
    op.create_index(op.f(READY), TABLE, [sa.column("priority").desc(), "sequence"], **_partial("state = 'queued'"))
