"""Trace context: the W3C trace context a job was enqueued under.

Revision ID: w0005_trace_context
Revises: w0004_operations
Create Date: 2026-12-03

Adds ``watchdog_jobs.trace_context``: the propagation fields (``traceparent``,
``tracestate``, ...) of the span that enqueued the job, as a JSON object, so
the runner that executes the job -- in another process, later -- continues
that trace (``sqlalchemy_watchdog.otel``). NULL when the enqueueing process
had no instrumentation; it is not part of a job's identity.

Both dialects add the column in place (SQLite's ``ADD COLUMN`` carries its
CHECK constraint); existing rows keep NULL. Downgrading drops it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0005_trace_context"
down_revision = "w0004_operations"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
CHECK_NAME = "trace_context_length"
CHECK = "trace_context IS NULL OR length(trace_context) BETWEEN 2 AND 4096"


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        name = op.f(f"ck_{TABLE}_{CHECK_NAME}")
        op.execute(f"ALTER TABLE {TABLE} ADD COLUMN trace_context TEXT CONSTRAINT {name} CHECK ({CHECK})")
    else:
        op.add_column(TABLE, sa.Column("trace_context", sa.Text(), nullable=True))
        op.create_check_constraint(op.f(f"ck_{TABLE}_{CHECK_NAME}"), TABLE, CHECK)


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"ALTER TABLE {TABLE} DROP COLUMN trace_context")
    else:
        op.drop_constraint(op.f(f"ck_{TABLE}_{CHECK_NAME}"), TABLE, type_="check")
        op.drop_column(TABLE, "trace_context")
