"""The database itself refuses impossible job rows, whoever writes them.

Every rejection is checked with raw SQL on both dialects, on the schema made by
``metadata.create_all``; one test replays them all on the schema made by the
Alembic migration (Alembic's comparison does not look at CHECK constraints, so
only this proves the migration's constraints match the model's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import (
    CheckConstraint,
    Connection,
    Engine,
    PrimaryKeyConstraint,
    String,
    UniqueConstraint,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sqlalchemy_watchdog
from sqlalchemy_watchdog import Job, JobState, WatchdogJob, enqueue
from sqlalchemy_watchdog.model import jobs_table
from tests.conftest import WITH_MARIADB
from tests.helpers import check_names, index_names

ALEMBIC_INI = Path(__file__).resolve().parents[2] / "alembic.ini"


@pytest.fixture(params=WITH_MARIADB)
def dialect(request: pytest.FixtureRequest) -> str:
    """The CHECK grammar on MariaDB too (WATCHDOG_TEST_MYSQL_URL, see
    tests/conftest.py): the same rejections, by the server's own CHECKs."""
    name: str = request.param
    return name


VALID: dict[str, Any] = {
    "job_id": "job-1",
    "queue_name": "emails",
    "lane": "emails",
    "priority": 0,
    "payload_json": "null",
    "recovery_max": None,
    "state": "queued",
    "outcome": None,
    "claim_token": None,
    "recovery_count": 0,
    "cancellation_id": None,
    "failure_reason": None,
    "lease_until": None,
}
RUNNING = {"state": "running", "claim_token": "claim_1", "lease_until": 1_700_000_000_000}
SETTLED = {"state": "settled", "outcome": "completed", "claim_token": "claim_1"}


@pytest.fixture
def migrated(empty_engine: Engine) -> Engine:
    """An engine on a fresh watchdog_jobs made by ``alembic upgrade head``."""
    config = Config(str(ALEMBIC_INI))
    config.attributes["configure_logger"] = False
    with empty_engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    return empty_engine


def insert(conn: Connection, **overrides: Any) -> None:
    row = {**VALID, **overrides}
    columns = ", ".join(row)
    params = ", ".join(f":{name}" for name in row)
    conn.execute(text(f"INSERT INTO watchdog_jobs ({columns}) VALUES ({params})"), row)


def rejected(engine: Engine, statement: Any, constraints: tuple[str, ...]) -> None:
    """Run ``statement(conn)``; it must fail on one of ``constraints``; nothing stays."""
    before = count(engine)
    with pytest.raises(IntegrityError) as caught:
        with engine.begin() as conn:
            statement(conn)
    message = str(caught.value.orig)
    assert any(name in message for name in constraints), message
    assert count(engine) == before


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        number: int = conn.execute(text("SELECT count(*) FROM watchdog_jobs")).scalar_one()
        return number


# -- INSERT ------------------------------------------------------------------------

IMPOSSIBLE_ROWS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "running without claim token": ({**RUNNING, "claim_token": None}, ("state_grammar",)),
    "running without lease": ({**RUNNING, "lease_until": None}, ("state_grammar",)),
    "running with an outcome": ({**RUNNING, "outcome": "completed"}, ("state_grammar",)),
    "settled without outcome": ({**SETTLED, "outcome": None}, ("state_grammar",)),
    "settled with a lease": ({**SETTLED, "lease_until": 1}, ("state_grammar",)),
    "queued with an outcome": ({"outcome": "completed"}, ("state_grammar",)),
    "queued with a claim token": ({"claim_token": "claim_1"}, ("state_grammar",)),
    "queued with a lease": ({"lease_until": 1}, ("state_grammar",)),
    "unknown state": ({"state": "paused"}, ("state_known", "state_grammar")),
    "unknown outcome": ({**SETTLED, "outcome": "exploded"}, ("outcome_known",)),
    "empty job_id": ({"job_id": ""}, ("job_id_length",)),
    "over-long job_id": ({"job_id": "j" * 257}, ("job_id_length",)),
    "empty queue": ({"queue_name": ""}, ("queue_name_length",)),
    "over-long queue": ({"queue_name": "q" * 257}, ("queue_name_length",)),
    "empty lane": ({"lane": ""}, ("lane_length",)),
    "over-long lane": ({"lane": "l" * 513}, ("lane_length",)),
    "over-long multi-byte job_id": ({"job_id": "😀" * 257}, ("job_id_length",)),
    "empty cancellation_id": ({"cancellation_id": ""}, ("cancellation_id_length",)),
    "negative recovery_max": ({"recovery_max": -1}, ("recovery_max_nonnegative",)),
    "negative recovery_count": ({"recovery_count": -1}, ("recovery_count_nonnegative",)),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE_ROWS))
def test_database_rejects_an_impossible_row_on_insert(engine: Engine, case: str) -> None:
    overrides, constraints = IMPOSSIBLE_ROWS[case]
    rejected(engine, lambda conn: insert(conn, **overrides), constraints)


def test_database_rejects_a_row_missing_a_required_column(engine: Engine) -> None:
    for column in ["job_id", "queue_name", "lane", "priority", "payload_json", "state"]:
        rejected(engine, lambda conn: insert(conn, **{column: None}), (column,))


def test_database_rejects_a_second_row_with_the_same_job_id(engine: Engine) -> None:
    with engine.begin() as conn:
        insert(conn)
    rejected(engine, lambda conn: insert(conn, queue_name="other"), ("job_id",))


POSSIBLE_ROWS: dict[str, dict[str, Any]] = {
    "queued": {},
    "queued with a recovery policy": {"recovery_max": 0},
    "running": RUNNING,
    "settled": SETTLED,
    "settled interrupted with a reason": {
        **SETTLED,
        "outcome": "interrupted",
        "failure_reason": "Execution disappeared without a recovery policy",
    },
    "cancelled while queued": {"cancellation_id": "cancel-1"},
    "ids of exactly the maximum length": {
        "job_id": "j" * 256,
        "queue_name": "q" * 256,
        "lane": "l" * 512,
        "cancellation_id": "c" * 256,
    },
    "multi-byte ids of exactly the maximum length": {
        "job_id": "😀" * 256,
        "queue_name": "é" * 256,
        "lane": "ß" * 512,
    },
}


def test_database_accepts_valid_rows(engine: Engine) -> None:
    for case, overrides in POSSIBLE_ROWS.items():
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM watchdog_jobs"))
            insert(conn, **overrides)
        with engine.connect() as conn:
            row = conn.execute(text("SELECT job_id, queue_name, lane, state FROM watchdog_jobs")).one()
        expected = {**VALID, **overrides}
        assert tuple(row) == tuple(expected[k] for k in ("job_id", "queue_name", "lane", "state")), case


# -- UPDATE ------------------------------------------------------------------------

IMPOSSIBLE_UPDATES = {
    "queued to running without claim or lease": ("state = 'running'", ("state_grammar",)),
    "queued to running without lease": ("state = 'running', claim_token = 'c'", ("state_grammar",)),
    "queued to running without claim token": ("state = 'running', lease_until = 1", ("state_grammar",)),
    "queued to settled without outcome": ("state = 'settled'", ("state_grammar",)),
    "outcome on a queued job": ("outcome = 'completed'", ("state_grammar",)),
    "unknown state": ("state = 'done'", ("state_known", "state_grammar")),
    "unknown outcome": ("state = 'settled', outcome = 'meh'", ("outcome_known",)),
    "empty job_id": ("job_id = ''", ("job_id_length",)),
    "negative recovery_max": ("recovery_max = -5", ("recovery_max_nonnegative",)),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE_UPDATES))
def test_database_rejects_an_update_into_an_impossible_state(engine: Engine, case: str) -> None:
    assignments, constraints = IMPOSSIBLE_UPDATES[case]
    with engine.begin() as conn:
        insert(conn)
    rejected(engine, lambda conn: conn.execute(text(f"UPDATE watchdog_jobs SET {assignments}")), constraints)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state, outcome FROM watchdog_jobs")).one() == ("queued", None)


def test_database_accepts_the_state_machine_transitions(engine: Engine) -> None:
    with engine.begin() as conn:
        insert(conn)
        conn.execute(text("UPDATE watchdog_jobs SET state = 'running', claim_token = 'c', lease_until = 5"))
        conn.execute(text("UPDATE watchdog_jobs SET state = 'queued', claim_token = NULL, lease_until = NULL"))
        conn.execute(text("UPDATE watchdog_jobs SET state = 'running', claim_token = 'd', lease_until = 6"))
        conn.execute(text("UPDATE watchdog_jobs SET state = 'settled', outcome = 'failed', lease_until = NULL"))
    with engine.connect() as conn:
        row = conn.execute(text("SELECT state, outcome, claim_token FROM watchdog_jobs")).one()
    assert tuple(row) == ("settled", "failed", "d")


def test_migrated_schema_rejects_and_accepts_the_same_rows_as_the_model(migrated: Engine) -> None:
    for overrides, constraints in IMPOSSIBLE_ROWS.values():
        rejected(migrated, lambda conn: insert(conn, **overrides), constraints)
    with migrated.begin() as conn:
        insert(conn)
    for assignments, constraints in IMPOSSIBLE_UPDATES.values():
        rejected(migrated, lambda conn: conn.execute(text(f"UPDATE watchdog_jobs SET {assignments}")), constraints)
    for case, overrides in POSSIBLE_ROWS.items():
        with migrated.begin() as conn:
            conn.execute(text("DELETE FROM watchdog_jobs"))
            insert(conn, **overrides)
        assert count(migrated) == 1, case


# -- beside the application's own models ---------------------------------------------


class AppBase(DeclarativeBase):
    pass


class Order(AppBase):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String(40), unique=True)
    confirmation_job: Mapped[str | None] = mapped_column(String(256))


def test_watchdog_job_and_an_application_model_share_one_session(engine: Engine) -> None:
    AppBase.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all(
            [
                Order(reference="A-1", confirmation_job="confirm-A-1"),
                WatchdogJob(
                    job_id="confirm-A-1",
                    queue_name="emails",
                    lane="emails",
                    priority=0,
                    payload_json='{"order":"A-1"}',
                    state="queued",
                ),
            ]
        )
        session.commit()
    with Session(engine) as session:
        order = session.scalars(select(Order)).one()
        job = session.scalars(select(WatchdogJob)).one()
        assert (order.reference, job.job_id, job.state) == ("A-1", "confirm-A-1", "queued")
        assert job.recovery_count == 0
        assert job.sequence >= 1


def test_enqueued_job_joins_with_the_application_row_in_an_orm_query(engine: Engine) -> None:
    AppBase.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all([Order(reference=ref, confirmation_job=f"confirm-{ref}") for ref in ("A", "B")])
        enqueue(session, [Job("confirm-A", "emails"), Job("confirm-B", "emails", priority=5)])
        session.commit()
    with Session(engine) as session:
        rows = session.execute(
            select(Order.reference, WatchdogJob.state, WatchdogJob.priority)
            .join(WatchdogJob, WatchdogJob.job_id == Order.confirmation_job)
            .order_by(Order.reference)
        ).all()
    assert [tuple(r) for r in rows] == [("A", JobState.QUEUED, 0), ("B", JobState.QUEUED, 5)]


def test_watchdog_metadata_holds_only_the_watchdog_tables() -> None:
    assert sqlalchemy_watchdog.metadata is WatchdogJob.metadata
    assert sorted(sqlalchemy_watchdog.metadata.tables) == [
        "watchdog_job_edges",  # revision w0012: dependencies
        "watchdog_job_signals",  # revision w0022: events
        "watchdog_job_steps",  # revision w0021: durable steps
        "watchdog_jobs",
        "watchdog_limit_claims",
        "watchdog_limits",
        "watchdog_queue_pauses",
        "watchdog_schedules",
        "watchdog_unique_keys",  # revision w0020: uniqueness windows
        "watchdog_workers",
    ]
    assert AppBase.metadata is not sqlalchemy_watchdog.metadata


# -- stable names ------------------------------------------------------------------

CHECK_NAMES = {
    "ck_watchdog_jobs_job_id_length",
    "ck_watchdog_jobs_queue_name_length",
    "ck_watchdog_jobs_lane_length",
    "ck_watchdog_jobs_cancellation_id_length",
    "ck_watchdog_jobs_state_known",
    "ck_watchdog_jobs_outcome_known",
    "ck_watchdog_jobs_recovery_max_nonnegative",
    "ck_watchdog_jobs_recovery_count_nonnegative",
    "ck_watchdog_jobs_state_grammar",
    "ck_watchdog_jobs_max_attempts_range",
    "ck_watchdog_jobs_attempt_bounds",
    "ck_watchdog_jobs_snoozes_nonnegative",
    "ck_watchdog_jobs_timeout_positive",
    "ck_watchdog_jobs_settled_at_settled",
    "ck_watchdog_jobs_rerun_of_length",
    "ck_watchdog_jobs_trace_context_length",
    "ck_watchdog_jobs_limit_key_length",
    # revision w0012: results, progress, dependencies
    "ck_watchdog_jobs_result_completed",
    "ck_watchdog_jobs_progress_range",
    "ck_watchdog_jobs_progress_note_length",
    "ck_watchdog_jobs_waiting_on_state",
    "ck_watchdog_jobs_after_policy_known",
    # revision w0013: settle watch
    "ck_watchdog_jobs_watched_flag",
    # revision w0019: jobs claimed ahead, their handler not started
    "ck_watchdog_jobs_unstarted_flag",
    "ck_watchdog_jobs_unstarted_running",
}
#: The CHECKs that relate columns: the table's own on PostgreSQL too (w0016).
RELATING_CHECKS = {
    "state_grammar",
    "attempt_bounds",
    "settled_at_settled",
    "result_completed",
    "waiting_on_state",
    "unstarted_running",
}
#: SQLite's stored-type CHECKs (revision w0010): every column but the rowid
#: ``sequence``; PostgreSQL's column types already hold.
STORED_TYPE_NAMES = {
    f"ck_watchdog_jobs_{column.name}_stored_type" for column in jobs_table.columns if column.name != "sequence"
}
UNIQUE_NAMES = {"uq_watchdog_jobs_job_id"}
INDEX_NAMES = {
    "ix_watchdog_jobs_delayed",
    "ix_watchdog_jobs_settled",
    "ix_watchdog_jobs_rerun_of",
    # A partial unique index since w0008: only jobs that have a cancellation id.
    "uq_watchdog_jobs_cancellation_id",
    "ix_watchdog_jobs_lease",
    "ix_watchdog_jobs_live_lane",
    "ix_watchdog_jobs_live_queue",
    # Every job by lane, settled history included (w0010): the listing's lane filter.
    "ix_watchdog_jobs_lane_history",
    # Only keyed jobs (w0011): a limited claim's walk over keys, and each key's running jobs.
    "ix_watchdog_jobs_keyed_queued",
    "ix_watchdog_jobs_keyed_running",
    # Jobs settled while waiting whose dependents are not told yet (w0012).
    "ix_watchdog_jobs_untold",
    # Jobs waiting for their parents, by lane and queue (w0014).
    "ix_watchdog_jobs_waiting",
}


def test_metadata_has_a_naming_convention_for_every_constraint_kind() -> None:
    convention = sqlalchemy_watchdog.metadata.naming_convention
    assert {"ix", "uq", "ck", "fk", "pk"} <= set(convention)


def test_constraint_names_in_the_model_are_stable() -> None:
    checks = {c.name for c in jobs_table.constraints if isinstance(c, CheckConstraint)}
    uniques = {c.name for c in jobs_table.constraints if isinstance(c, UniqueConstraint)}
    primary = {c.name for c in jobs_table.constraints if isinstance(c, PrimaryKeyConstraint)}
    assert checks == CHECK_NAMES | STORED_TYPE_NAMES
    assert uniques == UNIQUE_NAMES
    assert primary == {"pk_watchdog_jobs"}
    assert {i.name for i in jobs_table.indexes} == INDEX_NAMES


def test_comparing_a_column_with_a_value_its_check_refuses_finds_nothing(engine: Engine) -> None:
    """Binds keep the base type (w0016): on PostgreSQL a lookup by a state or a
    job_id the domain would refuse is an empty result, not a CheckViolation."""
    with engine.begin() as conn:
        insert(conn)
        for where in (jobs_table.c.state == "lost", jobs_table.c.job_id == "", jobs_table.c.progress == 2.0):
            assert conn.execute(select(jobs_table.c.job_id).where(where)).all() == []


def test_created_database_carries_the_stable_constraint_names(engine: Engine) -> None:
    inspector = inspect(engine)
    stored_types = STORED_TYPE_NAMES if engine.dialect.name == "sqlite" else set()
    assert check_names(engine) == CHECK_NAMES | stored_types
    if engine.dialect.name == "postgresql":  # the one-column CHECKs are the columns' domains' (w0016)
        own = {c["name"] for c in inspector.get_check_constraints("watchdog_jobs")}
        assert own == {f"ck_watchdog_jobs_{name}" for name in RELATING_CHECKS}
    # MariaDB has no partial indexes: the unique index of cancellation ids is
    # whole (several NULLs are still allowed), which its inspector reports
    # as a unique constraint.
    whole_unique = {"uq_watchdog_jobs_cancellation_id"} if engine.dialect.name in ("mysql", "mariadb") else set()
    assert {c["name"] for c in inspector.get_unique_constraints("watchdog_jobs")} == UNIQUE_NAMES | whole_unique
    assert index_names(engine) == INDEX_NAMES - whole_unique


@pytest.mark.parametrize(
    "column, value",
    [("priority", "'abc'"), ("attempt", "1.5"), ("run_at", "x'01'"), ("job_id", "x'6a'"), ("payload_json", "x'7b7d'")],
)
def test_database_rejects_a_value_of_another_type_than_its_column(engine: Engine, column: str, value: str) -> None:
    """SQLite keeps any type in any column unless a CHECK refuses it (w0010);
    PostgreSQL refuses by the column's type, or converts the value into one
    the library reads (a real rounded, a bytea in its text form)."""
    with engine.begin() as conn:
        insert(conn)
    if engine.dialect.name in ("mysql", "mariadb") and column in ("attempt", "job_id", "payload_json"):
        # MariaDB rounds a real into an integer column and stores a binary
        # string's bytes in a text column as the text they spell: readable.
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE watchdog_jobs SET {column} = {value}"))
            stored = conn.execute(text(f"SELECT {column} FROM watchdog_jobs")).scalar_one()
        assert stored == {"attempt": 2, "job_id": "j", "payload_json": "{}"}[column]
        return
    if engine.dialect.name == "postgresql":
        value = {"x'01'": "'\\x01'::bytea", "x'6a'": "'\\x6a'::bytea", "x'7b7d'": "'\\x7b7d'::bytea"}.get(value, value)
        if column == "attempt":  # PostgreSQL rounds a real into an integer column: a readable integer
            with engine.begin() as conn:
                conn.execute(text(f"UPDATE watchdog_jobs SET {column} = {value}"))
                assert conn.execute(text("SELECT attempt FROM watchdog_jobs")).scalar_one() == 2
            return
        if column in ("job_id", "payload_json"):  # bytea assigned to text: its text form, readable
            with engine.begin() as conn:
                conn.execute(text(f"UPDATE watchdog_jobs SET {column} = {value}"))
                stored = conn.execute(text(f"SELECT {column} FROM watchdog_jobs")).scalar_one()
                assert isinstance(stored, str) and stored.startswith("\\x")
            return
    with pytest.raises(DBAPIError, match=f"{column}_stored_type" if engine.dialect.name == "sqlite" else None):
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE watchdog_jobs SET {column} = {value}"))
