"""Long text on MariaDB and MySQL: payloads and results are kept whole up to 1 MiB.

Revision ID: w0023_long_text
Revises: w0022_job_signals
Create Date: 2026-12-07

A payload or result may be up to 1 MiB of JSON (``PAYLOAD_MAX_BYTES``,
``RESULT_MAX_BYTES``), but a ``TEXT`` column of MariaDB and MySQL holds
65,535 bytes: a longer value was refused (1406, "Data too long") by a
one-row write and, worse, cut short without an error by an
``INSERT ... SELECT`` -- a batch enqueue stored a 70,000-byte payload as its
first 4,464 bytes. On those servers this revision makes ``LONGTEXT`` of the
columns holding them: ``payload_json`` and ``result_json`` of
``watchdog_jobs``, ``result_json`` of ``watchdog_job_steps``,
``payload_json`` of ``watchdog_job_signals``, and the workers' ``queues``
and ``process_queues`` (JSON arrays of up to 65,536 characters, more bytes
than ``TEXT`` holds). Their NOT NULL, DEFAULT and CHECKs stay as they are.
The server copies each of the four tables once (``ALTER TABLE ... MODIFY``),
holding off writes to it meanwhile. PostgreSQL and SQLite keep ``TEXT``,
which holds any length: nothing changes there.

Downgrading makes them ``TEXT`` again, and refuses (before changing
anything) while any of them holds a value longer than ``TEXT`` does: the
downgrade never cuts a payload or result short.
"""

from __future__ import annotations

from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0023_long_text"
down_revision = "w0022_job_signals"
branch_labels = None
depends_on = None

#: The longest value of a ``TEXT`` column there, in bytes.
TEXT_MAX_BYTES = 65_535
#: Each table's long columns, with the rest of their definition as w0001 and
#: w0022 made them (MariaDB's ``MODIFY`` restates the whole column).
COLUMNS: dict[str, dict[str, str]] = {
    "watchdog_jobs": {"payload_json": "NOT NULL", "result_json": "NULL"},
    "watchdog_job_steps": {"result_json": "NULL"},
    "watchdog_job_signals": {"payload_json": "NOT NULL"},
    "watchdog_workers": {"queues": "NOT NULL", "process_queues": "NOT NULL DEFAULT '[]'"},
}


def _modify(type_: str) -> None:
    for table, columns in COLUMNS.items():
        clauses = ", ".join(f"MODIFY {column} {type_} {rest}" for column, rest in columns.items())
        op.execute(f"ALTER TABLE {table} {clauses}")


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):
        _modify("LONGTEXT")


def downgrade() -> None:
    bind = op.get_bind()
    if not w0001.made_whole(bind):
        return
    for table, columns in COLUMNS.items():
        for column in columns:
            longer = bind.exec_driver_sql(
                f"SELECT COUNT(*) FROM {table} WHERE LENGTH({column}) > {TEXT_MAX_BYTES}"
            ).scalar_one()
            if longer:
                raise RuntimeError(
                    f"cannot downgrade below w0023_long_text: {longer} row(s) of {table} hold a {column}"
                    f" longer than TEXT's {TEXT_MAX_BYTES} bytes, which the downgrade would cut short"
                )
    _modify("TEXT")
