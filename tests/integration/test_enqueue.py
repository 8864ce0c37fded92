"""Transactional enqueue: a job commits with the caller's own writes, or not at all."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from typing import cast as cast_type

import pytest
from sqlalchemy import Engine, Integer, String, Table, Text, cast, insert, literal, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_watchdog import (
    EnqueueConflict,
    EnqueueStatus,
    InvalidJob,
    Job,
    JobState,
    RetryPolicy,
    Watchdog,
    WatchdogError,
    enqueue,
    enqueue_select,
)
from sqlalchemy_watchdog.backends import backend_of
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.testing import assert_enqueued, assert_not_enqueued, enqueued_jobs

QUEUED = EnqueueStatus.QUEUED
DUPLICATE = EnqueueStatus.DUPLICATE


class AppBase(DeclarativeBase):
    pass


class Order(AppBase):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String(300), unique=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    payload: Mapped[str | None] = mapped_column(Text)


orders = cast_type(Table, Order.__table__)


@pytest.fixture
def db(engine: Engine) -> Engine:
    """``engine`` with the application's ``orders`` table beside ``watchdog_jobs``."""
    AppBase.metadata.create_all(engine)
    return engine


def order_refs(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(orders.c.reference).order_by(orders.c.id)).scalars())


def job_rows(engine: Engine) -> list[dict[str, Any]]:
    """Every stored job, every column, in admission order."""
    with engine.connect() as conn:
        rows = conn.execute(select(jobs_table).order_by(jobs_table.c.sequence)).mappings()
        return [dict(row) for row in rows]


def job_row(engine: Engine, job_id: str) -> dict[str, Any] | None:
    return next((row for row in job_rows(engine) if row["job_id"] == job_id), None)


ORIGINAL = Job("order-1", "emails", lane="team:1", priority=5, payload={"a": 1, "b": [1, 2]})

CONFLICTS = {
    "queue": Job("order-1", "sms", lane="team:1", priority=5, payload={"a": 1, "b": [1, 2]}),
    "lane": Job("order-1", "emails", lane="team:2", priority=5, payload={"a": 1, "b": [1, 2]}),
    "priority": Job("order-1", "emails", lane="team:1", priority=6, payload={"a": 1, "b": [1, 2]}),
    "payload": Job("order-1", "emails", lane="team:1", priority=5, payload={"a": 1, "b": [2, 1]}),
    "max_recoveries None vs 0": Job(
        "order-1", "emails", lane="team:1", priority=5, payload={"a": 1, "b": [1, 2]}, max_recoveries=0
    ),
}


def enqueue_original(engine: Engine) -> dict[str, Any]:
    with engine.begin() as conn:
        assert enqueue(conn, ORIGINAL).status is QUEUED
    row = job_row(engine, ORIGINAL.job_id)
    assert row is not None
    return row


# -- one commit, or nothing --------------------------------------------------------


def test_commit_makes_the_callers_rows_and_the_job_durable_together(db: Engine) -> None:
    with Session(db) as session:
        session.add_all([Order(reference="A-1"), Order(reference="A-2")])
        result = enqueue(session, Job("confirm-A-1", "emails", payload={"order": "A-1"}))
        assert result.status is QUEUED and result.status == "queued"
        assert result.job_id == "confirm-A-1"
        assert_enqueued(session, job_id="confirm-A-1")  # in the session's transaction
        assert_not_enqueued(db)  # nowhere else before the commit
        session.commit()
    assert order_refs(db) == ["A-1", "A-2"]
    [job] = assert_enqueued(db, job_id="confirm-A-1", state=JobState.QUEUED)
    assert job.payload == {"order": "A-1"}


def test_rollback_drops_the_callers_rows_and_the_job_together(db: Engine) -> None:
    with Session(db) as session:
        session.add_all([Order(reference="A-1")])
        session.flush()
        enqueue(session, Job("confirm-A-1", "emails"))
        session.rollback()
    assert order_refs(db) == []
    assert_not_enqueued(db)


def test_closing_the_session_without_commit_writes_nothing(db: Engine) -> None:
    with Session(db) as session:
        session.add(Order(reference="A-1"))
        enqueue(session, Job("confirm-A-1", "emails"))
    assert order_refs(db) == []
    assert_not_enqueued(db)


def test_connection_commit_makes_both_durable_and_rollback_drops_both(db: Engine) -> None:
    with db.connect() as conn:
        conn.execute(insert(orders).values(reference="kept"))
        enqueue(conn, Job("job-kept", "q"))
        conn.commit()
        conn.execute(insert(orders).values(reference="dropped"))
        enqueue(conn, Job("job-dropped", "q"))
        conn.rollback()
    assert order_refs(db) == ["kept"]
    assert [row["job_id"] for row in job_rows(db)] == ["job-kept"]


# -- replays -----------------------------------------------------------------------


def test_identical_replay_is_duplicate_and_changes_nothing(engine: Engine) -> None:
    before = enqueue_original(engine)
    with Session(engine) as session:
        replay = Job("order-1", "emails", lane="team:1", priority=5, payload={"a": 1, "b": [1, 2]})
        result = enqueue(session, replay)
        session.commit()
    assert result.status is DUPLICATE and result.status == "duplicate"
    assert job_rows(engine) == [before]


def test_identical_replay_is_duplicate_after_the_job_ran(engine: Engine) -> None:
    enqueue_original(engine)
    Watchdog(engine).fail_lane("team:1", "gave up")
    before = job_rows(engine)
    with engine.begin() as conn:
        assert enqueue(conn, ORIGINAL).status is DUPLICATE
    assert job_rows(engine) == before


def test_replay_with_payload_keys_in_another_order_is_identical(engine: Engine) -> None:
    before = enqueue_original(engine)
    reordered = Job("order-1", "emails", lane="team:1", priority=5, payload={"b": [1, 2], "a": 1})
    with engine.begin() as conn:
        assert enqueue(conn, reordered).status is DUPLICATE
    assert job_rows(engine) == [before]


def test_replay_with_the_default_lane_spelled_out_is_identical(engine: Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, Job("j", "emails"))
    with engine.begin() as conn:
        assert enqueue(conn, Job("j", "emails", lane="emails")).status is DUPLICATE


def test_each_kind_of_conflicting_replay_raises_enqueue_conflict_naming_the_job_id(engine: Engine) -> None:
    before = enqueue_original(engine)
    for kind, conflicting in CONFLICTS.items():
        with engine.connect() as conn:
            with pytest.raises(EnqueueConflict) as caught:
                enqueue(conn, conflicting)
        error = caught.value
        assert isinstance(error, WatchdogError) and error.code == "enqueue_conflict", kind
        assert error.job_id == "order-1", kind
        assert "order-1" in str(error), kind
        assert job_rows(engine) == [before], kind


@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "pending"])
def test_conflicting_replay_rolls_back_caller_writes(db: Engine, flushed: bool) -> None:
    before = enqueue_original(db)
    for kind, conflicting in CONFLICTS.items():
        with Session(db) as session:
            session.add(Order(reference=f"order for {kind}"))
            if flushed:
                session.flush()
            with pytest.raises(EnqueueConflict):
                enqueue(session, conflicting)
            session.commit()  # the caller ignores the error and commits anyway
        assert order_refs(db) == [], kind
        assert job_rows(db) == [before], kind


def test_conflicting_replay_rolls_back_caller_writes_on_a_connection(db: Engine) -> None:
    before = enqueue_original(db)
    for kind, conflicting in CONFLICTS.items():
        with db.connect() as conn:
            conn.execute(insert(orders).values(reference=f"order for {kind}"))
            with pytest.raises(EnqueueConflict):
                enqueue(conn, conflicting)
            conn.commit()
        assert order_refs(db) == [], kind
        assert job_rows(db) == [before], kind


def test_conflicting_replay_in_session_begin_block_propagates_and_writes_nothing(db: Engine) -> None:
    before = enqueue_original(db)
    with pytest.raises(EnqueueConflict):
        with Session(db) as session, session.begin():
            session.add(Order(reference="A-1"))
            session.flush()
            enqueue(session, CONFLICTS["queue"])
    assert order_refs(db) == []
    assert job_rows(db) == [before]


def test_conflicting_replay_in_engine_begin_block_propagates_and_writes_nothing(db: Engine) -> None:
    before = enqueue_original(db)
    with pytest.raises(EnqueueConflict):
        with db.begin() as conn:
            conn.execute(insert(orders).values(reference="A-1"))
            enqueue(conn, CONFLICTS["payload"])
    assert order_refs(db) == []
    assert job_rows(db) == [before]


def test_conflict_inside_a_session_savepoint_rolls_back_only_the_savepoint(db: Engine) -> None:
    before = enqueue_original(db)
    with Session(db) as session:
        session.add(Order(reference="outer-before"))
        with pytest.raises(EnqueueConflict):
            with session.begin_nested():
                session.add(Order(reference="inside-savepoint"))
                enqueue(session, Job("new-in-savepoint", "q"))
                enqueue(session, CONFLICTS["lane"])
        session.add(Order(reference="outer-after"))
        enqueue(session, Job("outer-job", "q"))
        session.commit()
    assert order_refs(db) == ["outer-before", "outer-after"]
    assert [row["job_id"] for row in job_rows(db)] == ["order-1", "outer-job"]
    assert job_rows(db)[0] == before


def test_conflict_inside_a_connection_savepoint_rolls_back_only_the_savepoint(db: Engine) -> None:
    before = enqueue_original(db)
    with db.connect() as conn:
        conn.execute(insert(orders).values(reference="outer-before"))
        with pytest.raises(EnqueueConflict):
            with conn.begin_nested():
                conn.execute(insert(orders).values(reference="inside-savepoint"))
                enqueue(conn, CONFLICTS["priority"])
        conn.execute(insert(orders).values(reference="outer-after"))
        conn.commit()
    assert order_refs(db) == ["outer-before", "outer-after"]
    assert job_rows(db) == [before]


def test_watchdog_enqueue_reports_conflict_and_keeps_the_original(engine: Engine) -> None:
    before = enqueue_original(engine)
    watchdog = Watchdog(engine)
    assert watchdog.enqueue(ORIGINAL).status is DUPLICATE
    with pytest.raises(EnqueueConflict):
        watchdog.enqueue(CONFLICTS["queue"])
    assert watchdog.enqueue(Job("other", "q")).status is QUEUED
    assert job_rows(engine)[0] == before


# -- batches -----------------------------------------------------------------------


def test_batch_returns_one_result_per_job_in_input_order(engine: Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, Job("b", "q"))
    batch = [Job("c", "q"), Job("b", "q"), Job("a", "q", priority=-3), Job("d", "q")]
    with engine.begin() as conn:
        results = enqueue(conn, batch)
    assert [(r.job_id, r.status) for r in results] == [
        ("c", QUEUED),
        ("b", DUPLICATE),
        ("a", QUEUED),
        ("d", QUEUED),
    ]
    # Admission order follows the input order.
    assert [row["job_id"] for row in job_rows(engine)] == ["b", "c", "a", "d"]


def test_a_batch_mixing_plain_jobs_and_jobs_with_every_option_stores_each_as_given(engine: Engine) -> None:
    # Plain jobs travel as shorter rows than the others (store.enqueue._enqueue): the
    # fields a row leaves out must read as NULL, never as a neighbour's values.
    run_at = datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    full = Job(
        "full", "q", lane="l", priority=-7, payload={"x": [1]}, max_recoveries=2, run_at=run_at,
        retry=RetryPolicy(max_attempts=3, backoff=timedelta(seconds=2)), timeout=timedelta(seconds=9),
        rerun_of="older",
    )  # fmt: skip
    batch = [Job("plain-1", "q"), full, Job("plain-2", "q", payload=7), Job("recoverable", "q", max_recoveries=0)]
    with engine.begin() as conn:
        assert [r.status for r in enqueue(conn, batch)] == [QUEUED] * 4
    rows = {row["job_id"]: row for row in job_rows(engine)}
    options = ("recovery_max", "run_at", "max_attempts", "retry_policy", "timeout_ms", "rerun_of", "trace_context")
    for job_id in ("plain-1", "plain-2"):
        assert {name: rows[job_id][name] for name in options} == dict.fromkeys(options), job_id
        assert rows[job_id]["state"] == "queued" and rows[job_id]["ready_at"] is None
    assert rows["plain-2"]["payload_json"] == "7"
    assert rows["recoverable"]["recovery_max"] == 0
    stored = rows["full"]
    assert (stored["lane"], stored["priority"], stored["payload_json"]) == ("l", -7, '{"x":[1]}')
    assert (stored["recovery_max"], stored["max_attempts"], stored["timeout_ms"]) == (2, 3, 9000)
    assert stored["run_at"] == stored["ready_at"] == full.run_at_ms and stored["state"] == "delayed"
    assert (stored["retry_policy"], stored["rerun_of"]) == (full.retry_json, "older")
    # And every one is an identical replay of itself.
    with engine.begin() as conn:
        assert [r.status for r in enqueue(conn, batch)] == [DUPLICATE] * 4


def test_batch_of_one_returns_a_list(engine: Engine) -> None:
    with engine.begin() as conn:
        results = enqueue(conn, [Job("a", "q")])
    assert isinstance(results, list) and [r.status for r in results] == [QUEUED]


def test_empty_batch_returns_no_results(engine: Engine) -> None:
    with engine.begin() as conn:
        assert enqueue(conn, []) == []
    assert job_rows(engine) == []


def test_identical_duplicates_within_a_batch_are_reported_duplicate(engine: Engine) -> None:
    batch = [Job("a", "q", payload={"x": 1}), Job("b", "q"), Job("a", "q", payload={"x": 1})]
    with engine.begin() as conn:
        results = enqueue(conn, batch)
    assert [(r.job_id, r.status) for r in results] == [("a", QUEUED), ("b", QUEUED), ("a", DUPLICATE)]
    assert [row["job_id"] for row in job_rows(engine)] == ["a", "b"]


def test_conflict_within_a_batch_raises_before_anything_is_written(db: Engine) -> None:
    with Session(db) as session:
        session.add(Order(reference="A-1"))
        with pytest.raises(EnqueueConflict) as caught:
            enqueue(session, [Job("x", "q"), Job("a", "q"), Job("a", "other")])
        session.commit()
    assert caught.value.job_id == "a"
    assert job_rows(db) == []
    assert order_refs(db) == []


def test_conflicting_replay_in_a_batch_rolls_back_the_whole_batch(db: Engine) -> None:
    before = enqueue_original(db)
    with db.connect() as conn:
        conn.execute(insert(orders).values(reference="A-1"))
        with pytest.raises(EnqueueConflict):
            enqueue(conn, [Job("new-1", "q"), CONFLICTS["priority"], Job("new-2", "q")])
        conn.commit()
    assert job_rows(db) == [before]
    assert order_refs(db) == []


def test_conflicting_replay_in_a_batch_names_the_conflicting_job_id(engine: Engine) -> None:
    enqueue_original(engine)
    with engine.connect() as conn:
        with pytest.raises(EnqueueConflict) as caught:
            enqueue(conn, [Job("new-1", "q"), CONFLICTS["priority"], Job("new-2", "q")])
    assert caught.value.job_id == "order-1"
    assert "order-1" in str(caught.value)


def test_a_batch_in_the_callers_transaction_is_one_statement_and_a_conflict_still_names_its_job(
    engine: Engine,
) -> None:
    """One round trip for a batch (no savepoint around it); after a conflict
    the offender is found all the same (on PostgreSQL, whose transaction is
    aborted, on a connection of its own) and the caller's writes roll back."""
    from sqlalchemy import event

    enqueue_original(engine)
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    with Session(engine) as session:
        session.connection()  # the transaction is open before the count starts
        event.listen(engine, "before_cursor_execute", count)
        try:
            enqueue(session, [Job(f"batch-{i}", "q", payload={"i": i}) for i in range(100)])
            # MariaDB has no INSERT ... ON CONFLICT ... RETURNING: a locking read of the ids, then the INSERT.
            assert len(statements) == (1 if backend_of(engine.dialect.name).writes_return_rows else 2), statements
            with pytest.raises(EnqueueConflict) as caught:
                enqueue(session, [Job("new-1", "q"), CONFLICTS["priority"], Job("new-2", "q")])
        finally:
            event.remove(engine, "before_cursor_execute", count)
        session.commit()
    assert caught.value.job_id == "order-1"
    assert not enqueued_jobs(engine, job_id="batch-0") and not enqueued_jobs(engine, job_id="new-1")


def test_more_than_a_thousand_jobs_in_one_call(engine: Engine) -> None:
    jobs = [Job(f"bulk-{i:05}", "bulk", priority=i % 7, payload={"i": i}) for i in range(1_050)]
    with engine.begin() as conn:
        results = enqueue(conn, jobs)
    assert [r.job_id for r in results] == [job.job_id for job in jobs]
    assert {r.status for r in results} == {QUEUED}
    rows = job_rows(engine)
    assert [row["job_id"] for row in rows] == [job.job_id for job in jobs]
    with engine.begin() as conn:
        replay = enqueue(conn, list(reversed(jobs)) + [Job("bulk-new", "bulk")])
    assert [r.status for r in replay] == [DUPLICATE] * len(jobs) + [QUEUED]
    assert job_rows(engine)[: len(jobs)] == rows


# -- enqueue_select --------------------------------------------------------------------


def payload_text() -> Any:
    return literal('{"order_id": ', Text) + cast(orders.c.id, Text) + literal("}", Text)


def confirmation_select() -> Any:
    return select(
        (literal("confirm-", Text) + orders.c.reference).label("job_id"),
        literal("emails", Text).label("queue"),
        (literal("team:", Text) + orders.c.reference).label("lane"),
        orders.c.priority.label("priority"),
        payload_text().label("payload"),
    ).order_by(orders.c.id)


def add_orders(engine: Engine, *references: str) -> None:
    with engine.begin() as conn:
        for i, reference in enumerate(references, start=1):
            conn.execute(insert(orders).values(id=i, reference=reference, priority=i))


def test_enqueue_select_admits_one_job_per_row(db: Engine) -> None:
    add_orders(db, "A", "B", "C")
    with Session(db) as session:
        results = enqueue_select(session, confirmation_select())
        session.commit()
    assert [(r.job_id, r.status) for r in results] == [
        ("confirm-A", QUEUED),
        ("confirm-B", QUEUED),
        ("confirm-C", QUEUED),
    ]
    job = Watchdog(db).read("confirm-B")
    assert job is not None
    assert (job.queue, job.lane, job.priority, job.payload) == ("emails", "team:B", 2, {"order_id": 2})
    assert job.max_recoveries is None


def test_enqueue_select_with_only_job_id_and_queue_uses_the_defaults(db: Engine) -> None:
    add_orders(db, "A")
    with db.begin() as conn:
        enqueue_select(conn, select(orders.c.reference.label("job_id"), literal("q", Text).label("queue")))
    job = Watchdog(db).read("A")
    assert job is not None
    assert (job.lane, job.priority, job.payload, job.max_recoveries) == ("q", 0, None, None)


def test_enqueue_select_replay_is_duplicate(db: Engine) -> None:
    add_orders(db, "A", "B")
    with db.begin() as conn:
        enqueue_select(conn, confirmation_select())
    before = job_rows(db)
    with db.begin() as conn:
        results = enqueue_select(conn, confirmation_select())
    assert [r.status for r in results] == [DUPLICATE, DUPLICATE]
    assert job_rows(db) == before


def test_enqueue_select_and_an_equal_job_are_the_same_job(db: Engine) -> None:
    add_orders(db, "A")
    with db.begin() as conn:
        enqueue_select(conn, confirmation_select())
    same = Job("confirm-A", "emails", lane="team:A", priority=1, payload={"order_id": 1})
    with db.begin() as conn:
        assert enqueue(conn, same).status is DUPLICATE
    with db.begin() as conn:
        assert enqueue(conn, Job("confirm-B", "emails", lane="team:B", payload={"order_id": 2})).status is QUEUED
    with db.begin() as conn:
        conn.execute(insert(orders).values(id=2, reference="B", priority=0))
        results = enqueue_select(conn, confirmation_select())
    assert [(r.job_id, r.status) for r in results] == [("confirm-A", DUPLICATE), ("confirm-B", DUPLICATE)]


def test_enqueue_select_conflict_rolls_back_caller_writes(db: Engine) -> None:
    add_orders(db, "A")
    with db.begin() as conn:
        enqueue(conn, Job("confirm-A", "emails", lane="team:A", priority=99, payload={"order_id": 1}))
    before = job_rows(db)
    with db.connect() as conn:
        conn.execute(insert(orders).values(id=2, reference="B"))
        with pytest.raises(EnqueueConflict):
            enqueue_select(conn, confirmation_select())
        conn.commit()
    assert order_refs(db) == ["A"]
    assert job_rows(db) == before


@pytest.mark.parametrize(
    ("bad_reference", "field"),
    [("", "job_id"), ("x" * 300, "job_id")],
    ids=["empty job_id", "over-long job_id"],
)
def test_enqueue_select_refuses_an_invalid_row_naming_field_and_row(db: Engine, bad_reference: str, field: str) -> None:
    add_orders(db, "A", bad_reference, "C")
    source = select(orders.c.reference.label("job_id"), literal("q", Text).label("queue")).order_by(orders.c.id)
    with db.connect() as conn:
        with pytest.raises(InvalidJob) as caught:
            enqueue_select(conn, source)
        conn.commit()
    assert caught.value.field == field
    assert "row 1" in str(caught.value)
    assert job_rows(db) == []


def test_enqueue_select_refuses_a_payload_that_is_not_strict_json(db: Engine) -> None:
    with db.begin() as conn:
        conn.execute(insert(orders).values(id=1, reference="A", payload='{"ok": true}'))
        conn.execute(insert(orders).values(id=2, reference="B"))
    source = select(
        orders.c.reference.label("job_id"), literal("q", Text).label("queue"), orders.c.payload.label("payload")
    ).order_by(orders.c.id)
    for payload in ["not json", "NaN", '{"a": Infinity}', "[1, 2", ""]:
        with db.begin() as conn:
            conn.execute(orders.update().where(orders.c.id == 2).values(payload=payload))
        with db.connect() as conn:
            with pytest.raises(InvalidJob) as caught:
                enqueue_select(conn, source)
        assert caught.value.field == "payload" and "row 1" in str(caught.value), payload
        assert job_rows(db) == []


def test_enqueue_select_refuses_unlabelled_columns(db: Engine) -> None:
    add_orders(db, "A")
    with db.connect() as conn:
        with pytest.raises(InvalidJob, match="unknown column"):
            enqueue_select(conn, select(orders.c.reference.label("job_id"), literal("q").label("queue"), orders.c.id))
        with pytest.raises(InvalidJob, match="queue"):
            enqueue_select(conn, select(orders.c.reference.label("job_id")))
    assert job_rows(db) == []


def test_enqueue_select_of_no_rows_admits_nothing(db: Engine) -> None:
    with db.begin() as conn:
        assert enqueue_select(conn, confirmation_select()) == []
    assert job_rows(db) == []


def test_enqueue_select_sees_orders_added_in_the_same_session(db: Engine) -> None:
    with Session(db) as session:
        session.add_all([Order(id=1, reference="A", priority=1), Order(id=2, reference="B", priority=2)])
        results = enqueue_select(session, confirmation_select())
        assert [job.job_id for job in enqueued_jobs(session)] == ["confirm-A", "confirm-B"]
        session.commit()
    assert [r.job_id for r in results] == ["confirm-A", "confirm-B"]
    assert [row["job_id"] for row in job_rows(db)] == ["confirm-A", "confirm-B"]


# -- invalid input -------------------------------------------------------------------


def test_a_non_job_in_the_batch_is_refused_and_nothing_is_written(engine: Engine) -> None:
    with engine.connect() as conn:
        with pytest.raises(TypeError, match="Job"):
            enqueue(conn, [Job("a", "q"), {"job_id": "b", "queue": "q"}])  # type: ignore[list-item]
        conn.commit()
    assert job_rows(engine) == []


@pytest.mark.parametrize("jobs", [None, 42, "a-job-id"], ids=repr)
def test_something_that_is_not_a_job_is_refused(engine: Engine, jobs: Any) -> None:
    with engine.connect() as conn:
        with pytest.raises(TypeError):
            enqueue(conn, jobs)
        conn.commit()
    assert job_rows(engine) == []


def test_an_engine_is_not_a_transaction_target(engine: Engine) -> None:
    with pytest.raises(TypeError, match="Session or a Connection"):
        enqueue(engine, Job("a", "q"))  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="Session or a Connection"):
        enqueue_select(engine, select(literal("a").label("job_id"), literal("q").label("queue")))  # type: ignore[arg-type]
    assert job_rows(engine) == []


# -- concurrent enqueues (PostgreSQL) ------------------------------------------------------


def blocked_on_a_lock(engine: Engine, timeout: float = 5.0) -> bool:
    """Wait until some other session of this database waits for a row lock."""
    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
            conn.rollback()
            if waiting:
                return True
            time.sleep(0.01)
    return False


def in_thread(engine: Engine, job: Job) -> tuple[threading.Thread, dict[str, Any]]:
    """Enqueue ``job`` and commit on a connection of its own, in a thread."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            with engine.connect() as conn:
                outcome["result"] = enqueue(conn, job)
                conn.commit()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=work)
    thread.start()
    return thread, outcome


def race_behind(engine: Engine, first: Job, second: Job, finish: Callable[[Any], None]) -> dict[str, Any]:
    """``first`` enqueued but uncommitted; ``second`` starts and waits; then ``finish(first)``."""
    with engine.connect() as conn:
        assert enqueue(conn, first).status is QUEUED
        thread, outcome = in_thread(engine, second)
        assert blocked_on_a_lock(engine), "the second enqueue should wait for the first"
        finish(conn)
        thread.join(10)
    assert not thread.is_alive()
    return outcome


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_concurrent_identical_enqueue_is_one_queued_one_duplicate(engine: Engine) -> None:
    outcome = race_behind(engine, Job("race", "q", payload=[1]), Job("race", "q", payload=[1]), lambda c: c.commit())
    assert "error" not in outcome, outcome
    assert outcome["result"].status is DUPLICATE
    assert [row["job_id"] for row in job_rows(engine)] == ["race"]


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_concurrent_conflicting_enqueue_gets_enqueue_conflict(engine: Engine) -> None:
    outcome = race_behind(engine, Job("race", "q", payload=[1]), Job("race", "q", payload=[2]), lambda c: c.commit())
    assert isinstance(outcome.get("error"), EnqueueConflict), outcome
    assert outcome["error"].job_id == "race"
    rows = job_rows(engine)
    assert [(row["job_id"], row["payload_json"]) for row in rows] == [("race", "[1]")]


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_concurrent_enqueue_after_the_first_rolls_back_is_queued(engine: Engine) -> None:
    outcome = race_behind(engine, Job("race", "q", payload=[1]), Job("race", "q", payload=[2]), lambda c: c.rollback())
    assert "error" not in outcome, outcome
    assert outcome["result"].status is QUEUED
    assert [row["payload_json"] for row in job_rows(engine)] == ["[2]"]


@pytest.mark.parametrize("identical", [True, False], ids=["identical", "conflicting"])
@pytest.mark.parametrize("dialect", ["postgresql"])
def test_many_concurrent_enqueues_of_one_job_id_end_with_one_row(engine: Engine, identical: bool) -> None:
    workers = 8
    barrier = threading.Barrier(workers)
    outcomes: list[Any] = [None] * workers

    def work(i: int) -> None:
        job = Job("race", "q", payload=0 if identical else i)
        try:
            with engine.connect() as conn:
                barrier.wait(5)
                outcomes[i] = enqueue(conn, job).status
                conn.commit()
        except BaseException as error:
            outcomes[i] = error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    others = [o for o in outcomes if o is not QUEUED]
    assert outcomes.count(QUEUED) == 1, outcomes
    if identical:
        assert others == [DUPLICATE] * (workers - 1)
    else:
        assert all(isinstance(o, EnqueueConflict) for o in others), others
    assert len(job_rows(engine)) == 1


# -- integrity errors that are not a conflicting replay ---------------------------


@pytest.fixture
def altered(empty_engine: Engine) -> Engine:
    """``watchdog_jobs`` with an extra NOT NULL column the library knows
    nothing about, ``parent_job_id`` (no default), as an application's own
    migration might add it. SQLite cannot ``ADD COLUMN ... NOT NULL`` without
    a default, so there the table is created with the column."""
    from sqlalchemy import Column, MetaData

    if empty_engine.dialect.name in ("postgresql", "mysql", "mariadb"):
        jobs_table.create(empty_engine)
        with empty_engine.begin() as conn:
            conn.execute(text("ALTER TABLE watchdog_jobs ADD COLUMN parent_job_id text NOT NULL"))
    else:
        copy = jobs_table.to_metadata(MetaData())
        copy.append_column(Column("parent_job_id", Text, nullable=False))
        copy.create(empty_engine)
    return empty_engine


@pytest.mark.parametrize("count", [1, 3])
def test_a_not_null_failure_of_another_column_is_the_databases_error_not_a_conflict(
    altered: Engine, count: int
) -> None:
    """A job whose payload mentions ``job_id`` and ``null``, refused because of
    an application's NOT NULL column named ``parent_job_id``: the database's
    IntegrityError reaches the caller, never an EnqueueConflict for a job
    that does not exist."""
    from sqlalchemy.exc import IntegrityError

    jobs = [Job(f"fresh-{i}", "q", payload={"note": "job_id is null", "job_id": None}) for i in range(count)]
    with pytest.raises(IntegrityError) as raised, altered.begin() as conn:
        enqueue(conn, jobs)
    assert not isinstance(raised.value, EnqueueConflict)
    assert "parent_job_id" in str(raised.value.orig)
    # The stand-alone client reports it as a store error, not a conflict.
    with pytest.raises(WatchdogError) as failed:
        Watchdog(altered).enqueue(jobs)
    assert not isinstance(failed.value, EnqueueConflict)
    assert "job_id is null" not in str(failed.value)  # no row contents in the message
    assert job_rows(altered) == []


def test_a_conflicting_replay_is_still_a_conflict_beside_an_application_column(empty_engine: Engine) -> None:
    """With an extra NOT NULL column that has a default, a conflicting replay
    is recognised by its own constraint and column, on either dialect."""
    jobs_table.create(empty_engine)
    with empty_engine.begin() as conn:
        conn.execute(text("ALTER TABLE watchdog_jobs ADD COLUMN tenant_job_id text NOT NULL DEFAULT 'null job_id'"))
    Watchdog(empty_engine).enqueue(ORIGINAL)
    other = Job("order-1", "emails", payload={"job_id": None})
    with pytest.raises(EnqueueConflict) as raised:
        Watchdog(empty_engine).enqueue(other)
    assert raised.value.job_id == "order-1"
    with pytest.raises(EnqueueConflict) as raised, empty_engine.begin() as conn:
        enqueue(conn, [Job("order-2", "emails"), other])
    assert raised.value.job_id == "order-1"
