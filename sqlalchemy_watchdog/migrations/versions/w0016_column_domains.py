"""Column domains: on PostgreSQL, the one-column CHECKs of ``watchdog_jobs`` move to its columns' types.

Revision ID: w0016_column_domains
Revises: w0015_rate_per_key
Create Date: 2026-12-06

PostgreSQL prepares a table's CHECK constraints again for every statement
that writes the table: it reads each stored expression, plans it and builds
its evaluator before the first row (``ExecRelCheck``), prepared statement or
not. With the 23 CHECKs of ``watchdog_jobs`` that was about 75 us of server
time for a one-row ``UPDATE`` and 140 us for a one-row ``INSERT`` on the
2-core benchmark machine, most of what such a statement costs the server.
A domain's CHECK is planned once per server process and kept in its type
cache, and it is evaluated only when a value is written to a column of that
type, so a write that does not set the column does not pay for it.

So each of the 18 CHECKs that reads one column becomes the CHECK of a domain
over that column's type, with the constraint's own name: ``job_id`` becomes a
``watchdog_jobs_job_id`` (a ``text`` ``COLLATE "C"``) whose CHECK is
``ck_watchdog_jobs_job_id_length``, ``state`` a ``watchdog_jobs_state`` whose
CHECK is ``ck_watchdog_jobs_state_known``, and so on. A value that breaks
one is refused as before, with SQLSTATE 23514 and that constraint's name.
The five CHECKs that relate columns (the state grammar among them) stay
table CHECKs. SQLite has no domains: its table is unchanged.

Upgrading, in one transaction on PostgreSQL: the triggers on
``watchdog_jobs`` are dropped and made again as they were (PostgreSQL cannot
change the type of a column a trigger names); each column is moved to its
domain, created without a CHECK, which neither rewrites the table nor
rebuilds an index (same storage, same collation); each table CHECK is
dropped and added to its domain, which reads the table once to validate it.
Downgrading moves the columns back to their base types (no rewrite either),
adds the table CHECKs back (each validated against the rows) and drops the
domains.
"""

from __future__ import annotations

from alembic import op

from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0016_column_domains"
down_revision = "w0015_rate_per_key"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
_STATES = "('delayed', 'queued', 'running', 'settled', 'waiting')"
_OUTCOMES = "('completed', 'failed', 'cancelled', 'outcome_unknown', 'interrupted')"
#: w0015's one-column CHECKs: (column, base type, constraint name suffix,
#: condition on ``{c}``), frozen.
COLUMN_CHECKS = (
    ("job_id", 'text COLLATE "C"', "job_id_length", "length({c}) BETWEEN 1 AND 256"),
    ("queue_name", "text", "queue_name_length", "length({c}) BETWEEN 1 AND 256"),
    ("lane", "text", "lane_length", "length({c}) BETWEEN 1 AND 512"),
    ("cancellation_id", "text", "cancellation_id_length", "{c} IS NULL OR length({c}) BETWEEN 1 AND 256"),
    ("state", "text", "state_known", f"{{c}} IN {_STATES}"),
    ("outcome", "text", "outcome_known", f"{{c}} IS NULL OR {{c}} IN {_OUTCOMES}"),
    ("recovery_max", "integer", "recovery_max_nonnegative", "{c} IS NULL OR {c} >= 0"),
    ("recovery_count", "integer", "recovery_count_nonnegative", "{c} >= 0"),
    ("max_attempts", "integer", "max_attempts_range", "{c} IS NULL OR {c} BETWEEN 1 AND 1000"),
    ("snoozes", "integer", "snoozes_nonnegative", "{c} >= 0"),
    ("timeout_ms", "bigint", "timeout_positive", "{c} IS NULL OR {c} > 0"),
    ("rerun_of", "text", "rerun_of_length", "{c} IS NULL OR length({c}) BETWEEN 1 AND 256"),
    ("trace_context", "text", "trace_context_length", "{c} IS NULL OR length({c}) BETWEEN 2 AND 4096"),
    ("limit_key", 'text COLLATE "C"', "limit_key_length", "{c} IS NULL OR length({c}) BETWEEN 1 AND 256"),
    ("progress", "double precision", "progress_range", "{c} IS NULL OR ({c} >= 0 AND {c} <= 1)"),
    ("progress_note", "text", "progress_note_length", "{c} IS NULL OR length({c}) <= 500"),
    ("after_policy", "text", "after_policy_known", "{c} IS NULL OR {c} IN ('completed', 'any_outcome')"),
    ("watched", "integer", "watched_flag", "{c} IS NULL OR {c} = 1"),
)


def domain(column: str) -> str:
    return f"{TABLE}_{column}"


def _triggers() -> list[tuple[str, str]]:
    """The triggers on the table (name, definition), as PostgreSQL prints them."""
    rows = op.get_bind().exec_driver_sql(
        f"SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = '{TABLE}'::regclass"
        " AND NOT tgisinternal ORDER BY tgname"
    )
    return [(name, definition) for name, definition in rows]


def _retyped(types: list[tuple[str, str]]) -> None:
    """Move each (column, type) in one ALTER TABLE, the triggers dropped around it."""
    triggers = _triggers()
    for name, _ in triggers:
        op.execute(f"DROP TRIGGER {name} ON {TABLE}")
    op.execute(f"ALTER TABLE {TABLE} " + ", ".join(f"ALTER COLUMN {c} TYPE {t}" for c, t in types))
    for _, definition in triggers:
        op.execute(definition)


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name != "postgresql":
        return
    for column, base, _, _ in COLUMN_CHECKS:
        op.execute(f"CREATE DOMAIN {domain(column)} AS {base}")
    _retyped([(column, domain(column)) for column, *_ in COLUMN_CHECKS])
    for column, _, suffix, condition in COLUMN_CHECKS:
        name = f"ck_{TABLE}_{suffix}"
        op.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT {name}")
        op.execute(f"ALTER DOMAIN {domain(column)} ADD CONSTRAINT {name} CHECK ({condition.format(c='VALUE')})")


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    if op.get_bind().dialect.name != "postgresql":
        return
    _retyped([(column, base) for column, base, _, _ in COLUMN_CHECKS])
    for column, _, suffix, condition in COLUMN_CHECKS:
        name = f"ck_{TABLE}_{suffix}"
        op.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {name} CHECK ({condition.format(c=column)})")
        op.execute(f"DROP DOMAIN {domain(column)}")
