"""Wake-ups: the INSERT trigger notifies only while a runner waits (PostgreSQL).

Revision ID: w0007_notify_when_waiting
Revises: w0006_index_review
Create Date: 2026-12-03

PostgreSQL holds a database-wide lock from a notifying transaction's
pre-commit until its commit is flushed, so commits that notify are flushed
one at a time. The trigger's function now notifies only while a runner
waits for work -- one holds the *waiting lock* (an advisory lock) -- and
otherwise takes that lock shared until its transaction ends, which makes a
runner about to wait look for work after that commit. docs/design.md
("Wake-ups") gives the argument.

Runners of an older release never take the waiting lock, so once this
revision is applied they are no longer woken by enqueues: they find new
jobs at their ``poll_interval`` (2 s by default) until they are upgraded.
Upgrade the runners with the migration. SQLite has no trigger: nothing
changes there. Downgrading restores the function that always notifies.
"""

from __future__ import annotations

from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0007_notify_when_waiting"
down_revision = "w0006_index_review"
branch_labels = None
depends_on = None

# Both frozen here, as a revision's SQL must be.
NOTIFY_WHEN_WAITING_SQL = """\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_queued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Shared until this transaction ends: no runner can start waiting before
    -- then, so one that does looks for work after this commit. Taken only
    -- while no runner waits; while one does, notify it instead.
    IF NOT pg_try_advisory_xact_lock_shared(1463899203, 1313821769) THEN
        PERFORM pg_notify('watchdog_jobs', 'queued');
    END IF;
    RETURN NULL;
END
$$"""
NOTIFY_ALWAYS_SQL = """\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_queued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('watchdog_jobs', 'queued');
    RETURN NULL;
END
$$"""


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "postgresql":
        op.execute(NOTIFY_WHEN_WAITING_SQL)


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "postgresql":
        op.execute(NOTIFY_ALWAYS_SQL)
