"""Results, progress and dependencies between jobs.

Revision ID: w0012_results_and_dependencies
Revises: w0011_flow_control
Create Date: 2026-12-04

Adds ``watchdog_jobs.result_json``: the result a completed job's handler
returned, as canonical JSON, written by the settle statement that completes
the job and by nothing else. The CHECK ``result_completed`` holds it to
that: a row has a result only when it is settled ``completed``.

It also adds ``progress`` (a fraction from 0 to 1, CHECK ``progress_range``)
and ``progress_note`` (at most 500 characters, CHECK
``progress_note_length``): a running job's progress as its handler last
reported it.

**Dependencies** (``Job(after=...)``): the state ``waiting`` joins
``state_known`` and ``state_grammar`` (a waiting row has no outcome, claim
or lease, and ``waiting_on > 0``); columns ``waiting_on`` (CHECK
``waiting_on_state``) and ``after_policy`` (CHECK ``after_policy_known``);
the table ``watchdog_job_edges`` (child, parent, outcome) with its index
by parent; the partial index ``ix_watchdog_jobs_untold``; and the triggers
of ``sqlalchemy_watchdog.dependencies`` on both dialects. Changing the two
CHECKs **rebuilds the table on SQLite** (as w0010 did: a table made from the
stored definition with the two clauses replaced, every row copied with its
``sequence``, the AUTOINCREMENT counter and every index kept); run it while
no runner works. PostgreSQL replaces the two constraints in place.
Downgrading settles every ``waiting`` job ``cancelled`` (the state does not
exist below this revision), then undoes all of it.

Both dialects add the columns in place; on SQLite ``ADD COLUMN`` carries its
CHECKs (``result_completed`` and the column's stored-type CHECK, as w0010
gave every column), on PostgreSQL they are added as table constraints.
Existing rows keep NULL (no result). On PostgreSQL a row trigger,
``watchdog_jobs_settled``, notifies result waiters on the channel
``watchdog_results`` when a row becomes settled, only while a waiter exists
(see ``sqlalchemy_watchdog.results``). Nothing here depends on another
revision's columns, so it applies after any revision that leaves
``watchdog_jobs`` as w0010 made it. Downgrading drops the column, and the
results with it.
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from alembic import op

from sqlalchemy_watchdog.backends import backend_of
from sqlalchemy_watchdog.migrations.versions import w0001_watchdog_jobs as w0001

revision = "w0012_results_and_dependencies"
down_revision = "w0011_flow_control"
branch_labels = None
depends_on = None

TABLE = "watchdog_jobs"
#: (column, SQL type, its CHECKs by name); model.py declares the same.
COLUMNS: tuple[tuple[str, str, dict[str, str]], ...] = (
    (
        "result_json",
        "TEXT",
        {"result_completed": "result_json IS NULL OR (state = 'settled' AND outcome = 'completed')"},
    ),
    ("progress", "FLOAT", {"progress_range": "progress IS NULL OR (progress >= 0 AND progress <= 1)"}),
    ("progress_note", "TEXT", {"progress_note_length": "progress_note IS NULL OR length(progress_note) <= 500"}),
    (
        "waiting_on",
        "INTEGER",
        {
            "waiting_on_state": "waiting_on IS NULL OR (waiting_on > 0 AND state = 'waiting')"
            " OR (waiting_on = 0 AND state = 'settled')"
        },
    ),
    (
        "after_policy",
        "TEXT",
        {"after_policy_known": "after_policy IS NULL OR after_policy IN ('completed', 'any_outcome')"},
    ),
)
#: SQLite's stored-type CHECK of each column (w0010's rule; a REAL for the fraction).
STORED_TYPES = {
    "result_json": "typeof(result_json) IN ('text', 'null')",
    "progress": "typeof(progress) IN ('real', 'null')",
    "progress_note": "typeof(progress_note) IN ('text', 'null')",
    "waiting_on": "typeof(waiting_on) IN ('integer', 'null')",
    "after_policy": "typeof(after_policy) IN ('text', 'null')",
}
_TYPES: dict[str, sa.types.TypeEngine[Any]] = {"TEXT": sa.Text(), "FLOAT": sa.Float(), "INTEGER": sa.Integer()}

#: The two CHECKs the state ``waiting`` changes, before and after.
OLD_STATES = "state IN ('delayed', 'queued', 'running', 'settled')"
NEW_STATES = "state IN ('delayed', 'queued', 'running', 'settled', 'waiting')"
OLD_GRAMMAR = (
    "(state = 'delayed' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL"
    " AND ready_at IS NOT NULL)"
    " OR (state = 'queued' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL)"
    " OR (state = 'running' AND outcome IS NULL AND claim_token IS NOT NULL"
    " AND lease_until IS NOT NULL)"
    " OR (state = 'settled' AND outcome IS NOT NULL AND lease_until IS NULL)"
)
NEW_GRAMMAR = (
    OLD_GRAMMAR + " OR (state = 'waiting' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL"
    " AND waiting_on > 0)"
)
EDGES = "watchdog_job_edges"
UNTOLD = f"ix_{TABLE}_untold"


def _rebuild_sqlite(replace: tuple[tuple[str, str], ...]) -> None:
    """Copy the table into its stored definition with ``replace``d CHECK
    texts, keeping every row, its ``sequence``, the AUTOINCREMENT counter
    and the indexes (w0010's rebuild)."""
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
        raise RuntimeError(f"w0012: cannot read the definition of {TABLE}: {stored[:80]!r}")
    body = stored[head.end() :].rstrip()
    if not body.endswith(")"):  # pragma: no cover - a table this package did not create
        raise RuntimeError(f"w0012: cannot read the definition of {TABLE}: {stored[-80:]!r}")
    body = body[:-1].rstrip()
    for old, new in replace:
        if body.count(f"CHECK ({old})") != 1:  # pragma: no cover - a table this package did not create
            raise RuntimeError(f"w0012: {TABLE} has no CHECK ({old[:60]}...) to replace")
        body = body.replace(f"CHECK ({old})", f"CHECK ({new})")
    staging = f"_{TABLE}_w0012"
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


# -- the dependency triggers as this revision made them (frozen: the
# library's own sqlalchemy_watchdog.dependencies moves on with later revisions)

_LIVE = "('delayed', 'queued', 'running')"

#: The statements of the release, by name; ``{clock}`` is the dialect's clock.
_COUNT_EDGE = """\
UPDATE watchdog_jobs SET
    state = CASE
        WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed' THEN 'settled'
        WHEN waiting_on > 1 THEN 'waiting'
        WHEN ready_at > {clock} THEN 'delayed'
        ELSE 'queued' END,
    outcome = CASE WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed' THEN 'cancelled' END,
    failure_reason = CASE WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed'
        THEN 'parent ' || {parent} || ' ended ' || {parent_outcome} ELSE failure_reason END,
    settled_at = CASE WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed' THEN {clock} END,
    waiting_on = CASE
        WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed' THEN 0
        WHEN waiting_on > 1 THEN waiting_on - 1 END
WHERE job_id = {child} AND state = 'waiting'"""
_SETTLE_EDGES = "UPDATE watchdog_job_edges SET outcome = {outcome} WHERE parent = {job_id} AND outcome IS NULL"
_FORGET_CHILD = "DELETE FROM watchdog_job_edges WHERE child = {job_id}"

TRIGGER_NAMES = (
    "watchdog_jobs_parent_settled",
    "watchdog_jobs_parent_deleted",
    "watchdog_jobs_child_pruned",
    "watchdog_job_edges_counted",
)


def _trigger_sql(dialect: str, clock: str) -> list[str]:
    """The DDL creating the triggers (and on PostgreSQL their functions) as
    this revision made them."""
    count = _COUNT_EDGE.format(parent_outcome="NEW.outcome", parent="NEW.parent", child="NEW.child", clock=clock)
    settled = _SETTLE_EDGES.format(outcome="NEW.outcome", job_id="NEW.job_id")
    purged = _SETTLE_EDGES.format(outcome="'purged'", job_id="OLD.job_id")
    pruned = _FORGET_CHILD.format(job_id="OLD.job_id")
    parts = (
        ("watchdog_jobs_parent_settled", "AFTER UPDATE OF state ON watchdog_jobs",
         f"NEW.state = 'settled' AND OLD.state IN {_LIVE}", settled),
        ("watchdog_jobs_parent_deleted", "AFTER DELETE ON watchdog_jobs", f"OLD.state IN {_LIVE}", purged),
        ("watchdog_jobs_child_pruned", "AFTER DELETE ON watchdog_jobs", "OLD.state = 'settled'", pruned),
        ("watchdog_job_edges_counted", "AFTER UPDATE OF outcome ON watchdog_job_edges",
         "OLD.outcome IS NULL AND NEW.outcome IS NOT NULL", count),
    )  # fmt: skip
    statements: list[str] = []
    for name, event, when, body in parts:
        if dialect == "postgresql":
            statements.append(
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
                f"BEGIN\n    {body};\n    RETURN NULL;\nEND\n$$"
            )
            statements.append(f"CREATE TRIGGER {name} {event} FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION {name}()")
        else:
            statements.append(f"CREATE TRIGGER {name} {event} FOR EACH ROW WHEN {when} BEGIN {body}; END")
    return statements


def _drop_sql(dialect: str) -> list[str]:
    """The DDL dropping them (the table's own drop takes the triggers)."""
    if dialect == "postgresql":
        return [f"DROP FUNCTION IF EXISTS {name}() CASCADE" for name in TRIGGER_NAMES]
    return [f"DROP TRIGGER IF EXISTS {name}" for name in TRIGGER_NAMES]


def _checks(sqlite: bool, old_states: str, new_states: str, old_grammar: str, new_grammar: str) -> None:
    if sqlite:
        _rebuild_sqlite(((old_states, new_states), (old_grammar, new_grammar)))
        return
    for name, check in (("state_known", new_states), ("state_grammar", new_grammar)):
        op.drop_constraint(op.f(f"ck_{TABLE}_{name}"), TABLE, type_="check")
        op.create_check_constraint(op.f(f"ck_{TABLE}_{name}"), TABLE, check)


#: The settle notification (PostgreSQL), as sqlalchemy_watchdog.results
#: defined it at this revision.
NOTIFY_SETTLED_FUNCTION_SQL = """\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_settled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Free (nobody waits for a result): let it go at once, no notification.
    IF pg_try_advisory_lock(1463899203, 1381190740) THEN
        PERFORM pg_advisory_unlock(1463899203, 1381190740);
    ELSE
        PERFORM pg_notify('watchdog_results', NEW.job_id);
    END IF;
    RETURN NULL;
END
$$"""
NOTIFY_SETTLED_TRIGGER_SQL = (
    "CREATE TRIGGER watchdog_jobs_settled AFTER UPDATE OF state ON watchdog_jobs FOR EACH ROW "
    "WHEN (NEW.state = 'settled' AND OLD.state <> 'settled') EXECUTE FUNCTION watchdog_jobs_notify_settled()"
)


def upgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    sqlite = op.get_bind().dialect.name == "sqlite"
    if not sqlite:
        op.execute(NOTIFY_SETTLED_FUNCTION_SQL)
        op.execute(NOTIFY_SETTLED_TRIGGER_SQL)
    for column, type_, checks in COLUMNS:
        if sqlite:
            named = {**checks, f"{column}_stored_type": STORED_TYPES[column]}
            clauses = " ".join(
                f"CONSTRAINT {op.f(f'ck_{TABLE}_{name}')} CHECK ({check})" for name, check in named.items()
            )
            op.execute(f"ALTER TABLE {TABLE} ADD COLUMN {column} {type_} {clauses}")
        else:
            op.add_column(TABLE, sa.Column(column, _TYPES[type_], nullable=True))
            for name, check in checks.items():
                op.create_check_constraint(op.f(f"ck_{TABLE}_{name}"), TABLE, check)
    _checks(sqlite, OLD_STATES, NEW_STATES, OLD_GRAMMAR, NEW_GRAMMAR)
    op.create_index(op.f(UNTOLD), TABLE, ["sequence"], postgresql_where=sa.text("waiting_on = 0"),
                    sqlite_where=sa.text("waiting_on = 0"))  # fmt: skip
    collated = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
    op.create_table(
        EDGES,
        sa.Column("child", collated, nullable=False),
        sa.Column("parent", collated, nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.CheckConstraint("length(child) BETWEEN 1 AND 256", name=op.f(f"ck_{EDGES}_child_length")),
        sa.CheckConstraint("length(parent) BETWEEN 1 AND 256", name=op.f(f"ck_{EDGES}_parent_length")),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('completed', 'failed', 'cancelled', 'outcome_unknown', 'interrupted',"
            " 'purged')",
            name=op.f(f"ck_{EDGES}_outcome_known"),
        ),
        sa.CheckConstraint("child <> parent", name=op.f(f"ck_{EDGES}_not_itself")),
        sa.PrimaryKeyConstraint("child", "parent", name=op.f(f"pk_{EDGES}")),
    )
    op.create_index(op.f(f"ix_{EDGES}_parent"), EDGES, ["parent", "child"])
    dialect = op.get_bind().dialect.name
    for statement in _trigger_sql(dialect, backend_of(dialect).clock_ms_sql()):
        op.execute(statement)


def downgrade() -> None:
    if w0001.made_whole(op.get_bind()):  # MariaDB/MySQL: w0001 made the schema of w0021
        return
    sqlite = op.get_bind().dialect.name == "sqlite"
    dialect = op.get_bind().dialect.name
    for statement in _drop_sql(dialect):
        op.execute(statement)
    op.drop_index(op.f(f"ix_{EDGES}_parent"), table_name=EDGES)
    op.drop_table(EDGES)
    op.drop_index(op.f(UNTOLD), table_name=TABLE)
    # The state does not exist below this revision: a job still waiting is cancelled.
    op.execute(
        f"UPDATE {TABLE} SET state = 'settled', outcome = 'cancelled', waiting_on = NULL,"
        " failure_reason = 'cancelled: downgraded below w0012 while waiting for its parents',"
        f" settled_at = {backend_of(dialect).clock_ms_sql()} WHERE state = 'waiting'"
    )
    _checks(sqlite, NEW_STATES, OLD_STATES, NEW_GRAMMAR, OLD_GRAMMAR)
    if not sqlite:
        op.execute("DROP TRIGGER IF EXISTS watchdog_jobs_settled ON watchdog_jobs")
        op.execute("DROP FUNCTION IF EXISTS watchdog_jobs_notify_settled()")
    for column, _type, checks in reversed(COLUMNS):
        if sqlite:
            op.execute(f"ALTER TABLE {TABLE} DROP COLUMN {column}")
        else:
            for name in checks:
                op.drop_constraint(op.f(f"ck_{TABLE}_{name}"), TABLE, type_="check")
            op.drop_column(TABLE, column)
