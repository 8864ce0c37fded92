"""Starts of jobs claimed ahead: a running job whose handler has not started.

Revision ID: w0019_unstarted_claims
Revises: w0018_worker_process_queues
Create Date: 2026-12-07

``watchdog_jobs`` gets ``unstarted`` (INTEGER, 1 or NULL, CHECK
``unstarted_flag``; CHECK ``unstarted_running``: set only while the job is
``running``). A runner that claims jobs ahead of its free slots marks them
(the claim writes 1); before it calls a handler it clears the marks of the
jobs it is about to start (one statement for all of them, guarded by the
exact claim and a live lease). Recovery requeues a job still marked --
claimed ahead, never started -- without counting a recovery, whatever its
recovery budget.

On PostgreSQL the flag's CHECK is its column domain's (as revision w0016's
one-column CHECKs); the CHECK relating it to ``state`` is the table's. On
SQLite the column is added in place (``ALTER TABLE ... ADD COLUMN`` with its
CHECKs and its stored-type CHECK). Rows that exist read NULL: nothing was
claimed ahead under an earlier version. Downgrading drops the column (a job
still marked then counts a recovery if its runner dies, as before).
"""

from __future__ import annotations

from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0019_unstarted_claims"
down_revision = "w0018_worker_process_queues"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
DOMAIN = f"{TABLE}_unstarted"
FLAG_NAME = f"ck_{TABLE}_unstarted_flag"
FLAG = "{c} IS NULL OR {c} = 1"
RUNNING_NAME = f"ck_{TABLE}_unstarted_running"
RUNNING = "unstarted IS NULL OR state = 'running'"
STORED_TYPE_NAME = f"ck_{TABLE}_unstarted_stored_type"
STORED_TYPE = "typeof(unstarted) IN ('integer', 'null')"


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            f"ALTER TABLE {TABLE} ADD COLUMN unstarted INTEGER"
            f" CONSTRAINT {FLAG_NAME} CHECK ({FLAG.format(c='unstarted')})"
            f" CONSTRAINT {RUNNING_NAME} CHECK ({RUNNING})"
            f" CONSTRAINT {STORED_TYPE_NAME} CHECK ({STORED_TYPE})"
        )
        return
    op.execute(f"CREATE DOMAIN {DOMAIN} AS integer CONSTRAINT {FLAG_NAME} CHECK ({FLAG.format(c='VALUE')})")
    op.execute(f"ALTER TABLE {TABLE} ADD COLUMN unstarted {DOMAIN}")
    op.create_check_constraint(op.f(RUNNING_NAME), TABLE, RUNNING)


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        # SQLite drops a column whose own CHECKs name only it and the state.
        op.execute(f"ALTER TABLE {TABLE} DROP COLUMN unstarted")
        return
    op.drop_constraint(op.f(RUNNING_NAME), TABLE, type_="check")
    op.drop_column(TABLE, "unstarted")
    op.execute(f"DROP DOMAIN {DOMAIN}")
