"""``redacted``: a database error described without the data it carries."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, bindparam, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from sqlalchemy_watchdog import Job, Watchdog, WatchdogError, redacted, store
from sqlalchemy_watchdog.model import jobs_table

SECRET_PAYLOAD = "hunter2-payload-secret"
SECRET_REASON = "reason-secret-42"


def running_job(engine: Engine) -> store.Claim:
    Watchdog(engine).enqueue(Job("secret-job", "q", payload={"password": SECRET_PAYLOAD}))
    with engine.begin() as conn:
        (claim,) = store.claim(conn, queues=["q"], lease_ms=60_000).claimed
    return claim


def test_a_check_violation_is_described_without_the_row_its_token_or_parameters(engine: Engine) -> None:
    """A real CHECK violation on a running row: the driver's message carries
    the row (claim token and payload) on PostgreSQL and SQLAlchemy's adds
    the bound parameters; the redacted line keeps the SQLSTATE, the
    constraint and the primary message only."""
    claim = running_job(engine)
    # A running job with an outcome breaks the state grammar.
    stmt = (
        update(jobs_table)
        .where(jobs_table.c.job_id == bindparam("job"))
        .values(outcome="completed", failure_reason=bindparam("reason"))
    )
    with pytest.raises(IntegrityError) as raised, engine.begin() as conn:
        conn.execute(stmt, {"job": "secret-job", "reason": SECRET_REASON})
    raw = str(raised.value)
    assert SECRET_REASON in raw  # the unredacted error does carry the data
    if engine.dialect.name == "postgresql":
        assert claim.token in raw and SECRET_PAYLOAD in raw
    line = redacted(raised.value)
    assert "\n" not in line
    for secret in (claim.token, SECRET_PAYLOAD, SECRET_REASON, "secret-job", "DETAIL", "parameters"):
        assert secret not in line, line
    assert "state_grammar" in line
    if engine.dialect.name == "postgresql":
        assert line.startswith("CheckViolation (SQLSTATE 23514, constraint ck_watchdog_jobs_state_grammar): ")
        assert "violates check constraint" in line
    elif engine.dialect.name == "sqlite":
        assert line.startswith("IntegrityError (SQLITE_CONSTRAINT_CHECK): CHECK constraint failed")
    else:  # MariaDB: PyMySQL's class for error 4025, its number and the constraint
        assert line.startswith(
            "OperationalError (SQLSTATE 23000, error 4025, constraint ck_watchdog_jobs_state_grammar): "
        ), line


def test_a_duplicate_key_is_described_without_the_duplicated_value(engine: Engine) -> None:
    """A unique index refusing a row: PostgreSQL puts the value in its
    DETAIL, MariaDB in the message itself (``Duplicate entry '...'``); the
    redacted line names the key and keeps neither."""
    Watchdog(engine).enqueue(Job("secret-job", "q"))
    with engine.connect() as conn:
        stored = dict(conn.execute(select(jobs_table).where(jobs_table.c.job_id == "secret-job")).one()._mapping)
    row = {key: value for key, value in stored.items() if key != "sequence"}
    with pytest.raises(IntegrityError) as raised, engine.begin() as conn:
        conn.execute(jobs_table.insert().values(**row))
    assert "secret-job" in str(raised.value)  # the unredacted error carries the value
    line = redacted(raised.value)
    assert "secret-job" not in line and "\n" not in line, line
    if engine.dialect.name in ("mysql", "mariadb"):
        assert line.startswith("IntegrityError (SQLSTATE 23000, error 1062): Duplicate entry (value not shown)"), line
        assert "uq_watchdog_jobs_job_id" in line


def test_a_data_exception_does_not_echo_the_offending_value(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip(f"{engine.dialect.name} converts the text instead of refusing it")
    with pytest.raises(DBAPIError) as raised, engine.connect() as conn:
        conn.execute(select(text("CAST(:v AS bigint)")), {"v": SECRET_PAYLOAD})
    assert SECRET_PAYLOAD in str(raised.value.orig)
    line = redacted(raised.value)
    assert SECRET_PAYLOAD not in line
    assert line.startswith("InvalidTextRepresentation (SQLSTATE 22P02): invalid input syntax for type bigint")


def test_a_store_error_raised_by_the_client_carries_no_row_contents(engine: Engine) -> None:
    """A non-transient database error surfacing as WatchdogError(store_unavailable)
    is described by ``redacted``, and its traceback does not print the raw error."""
    import traceback

    claim = running_job(engine)
    with engine.begin() as conn:  # the row now holds a third secret
        conn.execute(text("UPDATE watchdog_jobs SET failure_reason = :r"), {"r": SECRET_REASON})
    watchdog = Watchdog(engine)

    @store.operation(store.Shape.WRITE)
    def break_the_grammar(conn):  # type: ignore[no-untyped-def]
        conn.execute(text("UPDATE watchdog_jobs SET outcome = 'failed' WHERE job_id = 'secret-job'"))

    with pytest.raises(WatchdogError) as raised:
        watchdog._gateway.run(break_the_grammar)
    message = str(raised.value)
    printed = "".join(traceback.format_exception(raised.value))
    assert "state_grammar" in message
    for secret in (claim.token, SECRET_PAYLOAD, SECRET_REASON):
        assert secret not in message and secret not in printed


def test_plain_exceptions_are_described_by_type_and_first_line() -> None:
    assert redacted(ValueError("bad\nsecond line")) == "ValueError: bad"
    assert redacted(RuntimeError()) == "RuntimeError"
