"""Conformance of the enqueue operations: admission, replays, delays.

Every backend runs this file (SQLite on a real file, PostgreSQL); see
``tests/backends/ops.py`` for how the operations are run.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, literal, select, text, union_all

from sqlalchemy_watchdog import EnqueueConflict, InvalidJob, Job, JobState, enqueue_select, store
from sqlalchemy_watchdog.jobs import PAYLOAD_MAX_BYTES, EnqueueStatus, encode_payload
from tests.backends.ops import add, claim, claimed_ids, op, read

QUEUED, DUPLICATE = EnqueueStatus.QUEUED, EnqueueStatus.DUPLICATE

#: A payload of about 200 KB of JSON, multibyte characters among them: over
#: the 65,535 bytes of a MariaDB/MySQL TEXT column (issue 57, revision w0023).
LONG_PAYLOAD = {"text": "é" * 50_000 + "x" * 100_000, "list": list(range(5_000))}


def _count(db: Engine) -> int:
    return len(op(db, store.list_jobs, limit=1000))


@pytest.mark.operation("enqueue")
def test_enqueue_admits_every_new_job_queued_in_admission_order(db: Engine) -> None:
    results = add(db, Job("a", "q", payload={"n": 1}), Job("b", "q", priority=5), Job("c", "other"))
    assert [(r.job_id, r.status) for r in results] == [("a", QUEUED), ("b", QUEUED), ("c", QUEUED)]
    jobs = [read(db, job_id) for job_id in ("a", "b", "c")]
    assert [job.state for job in jobs] == [JobState.QUEUED] * 3
    assert jobs[0].sequence < jobs[1].sequence < jobs[2].sequence
    assert jobs[0].payload == {"n": 1} and jobs[1].priority == 5 and jobs[2].queue == "other"
    assert jobs[0].lane == "q"  # the lane defaults to the queue
    assert jobs[0].attempt == 1 and jobs[0].recovery_count == 0 and jobs[0].outcome is None


@pytest.mark.operation("enqueue")
def test_an_identical_replay_is_a_duplicate_and_writes_nothing(db: Engine) -> None:
    add(db, Job("a", "q", payload=[1, 2]))
    before = read(db, "a")
    assert [r.status for r in add(db, Job("a", "q", payload=[1, 2]), Job("b", "q"))] == [DUPLICATE, QUEUED]
    assert read(db, "a") == before
    assert _count(db) == 2


@pytest.mark.operation("enqueue")
def test_a_replay_of_a_job_that_already_ran_is_still_a_duplicate(db: Engine) -> None:
    add(db, Job("a", "q"))
    assert claimed_ids(claim(db)) == ["a"]
    assert [r.status for r in add(db, Job("a", "q"))] == [DUPLICATE]
    assert read(db, "a").state is JobState.RUNNING


@pytest.mark.operation("enqueue")
def test_a_conflicting_replay_raises_and_its_whole_batch_writes_nothing(db: Engine) -> None:
    add(db, Job("a", "q", payload=1))
    before = read(db, "a")
    with pytest.raises(EnqueueConflict) as caught:
        add(db, Job("new", "q"), Job("a", "q", payload=2))
    assert caught.value.job_id == "a"
    assert read(db, "a") == before
    assert read(db, "new") is None  # the transaction rolled back whole
    assert _count(db) == 1


@pytest.mark.operation("enqueue")
def test_a_replay_into_another_queue_is_a_conflict(db: Engine) -> None:
    add(db, Job("a", "q"))
    with pytest.raises(EnqueueConflict):
        add(db, Job("a", "elsewhere"))
    assert read(db, "a").queue == "q"


@pytest.mark.operation("enqueue")
def test_one_job_twice_in_a_batch_is_admitted_once_and_a_conflicting_twin_refuses_the_batch(db: Engine) -> None:
    results = add(db, Job("a", "q"), Job("a", "q"))
    assert [r.job_id for r in results][:1] == ["a"] and results[0].status is QUEUED
    assert _count(db) == 1
    with pytest.raises(EnqueueConflict):
        add(db, Job("b", "q", payload=1), Job("b", "q", payload=2))
    assert read(db, "b") is None


@pytest.mark.operation("enqueue")
def test_an_enqueue_delay_keeps_the_job_delayed_and_unclaimable_until_the_database_clock_reaches_it(
    db: Engine,
) -> None:
    add(db, Job("later", "q"), delay=timedelta(hours=1))
    job = read(db, "later")
    assert job.state is JobState.DELAYED
    assert job.ready_at is not None and job.enqueued_at is not None
    assert timedelta(minutes=59) <= job.ready_at - job.enqueued_at <= timedelta(minutes=61)
    assert claim(db).claimed == ()
    # The delay is not part of the job's identity: a replay without it is a duplicate.
    assert [r.status for r in add(db, Job("later", "q"))] == [DUPLICATE]


@pytest.mark.operation("enqueue_each")
def test_enqueue_each_skips_a_conflicting_replay_and_admits_the_others(db: Engine) -> None:
    add(db, Job("taken", "q", payload="old"))
    results = op(db, store.enqueue_each, [Job("x", "q"), Job("taken", "q", payload="new"), Job("y", "q")])
    assert [None if r is None else (r.job_id, r.status) for r in results] == [("x", QUEUED), None, ("y", QUEUED)]
    assert read(db, "taken").payload == "old"
    replayed = op(db, store.enqueue_each, [Job("x", "q")])
    assert [None if r is None else r.status for r in replayed] == [DUPLICATE]


@pytest.mark.operation("enqueue")
def test_enqueue_select_admits_one_job_per_row_in_the_callers_transaction(db: Engine) -> None:
    rows = union_all(
        select(literal("s1").label("job_id"), literal("q").label("queue"), literal(3).label("priority")),
        select(literal("s2").label("job_id"), literal("q").label("queue"), literal(0).label("priority")),
    )
    with db.begin() as conn:
        results = enqueue_select(conn, select(rows.subquery()))
    assert sorted((r.job_id, r.status) for r in results) == [("s1", QUEUED), ("s2", QUEUED)]
    assert claimed_ids(claim(db, limit=2)) == ["s1", "s2"]  # priority 3 first
    with db.begin() as conn:
        assert {r.status for r in enqueue_select(conn, select(rows.subquery()))} == {DUPLICATE}


def _stored_payload(db: Engine, job_id: str) -> str:
    with db.connect() as conn:
        stored: str = conn.execute(
            text("SELECT payload_json FROM watchdog_jobs WHERE job_id = :j"), {"j": job_id}
        ).scalar_one()
        return stored


@pytest.mark.operation("enqueue")
def test_a_payload_far_over_64_kib_is_stored_byte_for_byte_alone_and_in_a_batch(db: Engine) -> None:
    """Issue 57: MariaDB cut a batch's 70,000-byte payload to 4,464 bytes
    without an error (an INSERT ... SELECT into TEXT); LONGTEXT keeps it whole."""
    expected = encode_payload(LONG_PAYLOAD)
    assert len(expected.encode()) > 200_000
    add(db, Job("alone", "q", payload=LONG_PAYLOAD))
    add(db, Job("first", "q", payload=LONG_PAYLOAD), Job("short", "q"), Job("last", "q", payload=LONG_PAYLOAD))
    for job_id in ("alone", "first", "last"):
        assert _stored_payload(db, job_id) == expected, job_id
        assert read(db, job_id).payload == LONG_PAYLOAD
    # A replay of the long job compares the whole payload: a duplicate, not a conflict.
    assert [r.status for r in add(db, Job("first", "q", payload=LONG_PAYLOAD))] == [DUPLICATE]


@pytest.mark.operation("enqueue")
def test_enqueue_select_stores_a_payload_far_over_64_kib_byte_for_byte(db: Engine) -> None:
    expected = encode_payload(LONG_PAYLOAD)
    rows = union_all(
        select(literal("s1").label("job_id"), literal("q").label("queue"), literal(expected).label("payload")),
        select(literal("s2").label("job_id"), literal("q").label("queue"), literal(expected).label("payload")),
    )
    with db.begin() as conn:
        assert {r.status for r in enqueue_select(conn, select(rows.subquery()))} == {QUEUED}
    assert _stored_payload(db, "s1") == _stored_payload(db, "s2") == expected


@pytest.mark.operation("enqueue")
def test_payloads_of_exactly_the_limit_are_stored_whole_in_a_batch(db: Engine) -> None:
    heaviest = "x" * (PAYLOAD_MAX_BYTES - 2)  # its JSON, quotes and all, is the limit
    add(db, Job("a", "q", payload=heaviest), Job("b", "q", payload="é" * ((PAYLOAD_MAX_BYTES - 2) // 2)))
    assert len(_stored_payload(db, "a").encode()) == PAYLOAD_MAX_BYTES
    assert read(db, "a").payload == heaviest
    assert read(db, "b").payload == "é" * ((PAYLOAD_MAX_BYTES - 2) // 2)


@pytest.mark.operation("enqueue")
def test_a_payload_over_the_limit_is_refused_naming_the_field_and_its_batch_writes_nothing(db: Engine) -> None:
    with pytest.raises(InvalidJob) as caught:
        add(db, Job("fine", "q", payload=LONG_PAYLOAD), Job("huge", "q", payload="x" * PAYLOAD_MAX_BYTES))
    assert caught.value.field == "payload" and str(PAYLOAD_MAX_BYTES) in str(caught.value)
    assert _count(db) == 0


#: Jobs whose payloads (each just under the 1 MiB limit) add up to 18 MiB:
#: over MariaDB's default max_allowed_packet (16 MiB), which closed the
#: connection on a batch sent as one statement (error 2006).
HEAVY_JOBS = 18


@pytest.mark.operation("enqueue")
def test_a_batch_over_the_servers_packet_limit_is_admitted_whole_or_not_at_all(db: Engine) -> None:
    """A batch too large for one statement is sent as several, in one
    transaction: all admitted, byte for byte; and a conflict in its last
    statement writes nothing of the first ones."""
    heavy = "x" * (PAYLOAD_MAX_BYTES - 2)
    jobs = [Job(f"h{i:02d}", "q", payload=heavy) for i in range(HEAVY_JOBS)]
    add(db, Job("taken", "q", payload=1))
    with pytest.raises(EnqueueConflict) as caught:
        add(db, *jobs, Job("taken", "q", payload=2))
    assert caught.value.job_id == "taken"
    assert _count(db) == 1, "nothing of the earlier statements was kept"
    assert {r.status for r in add(db, *jobs)} == {QUEUED}
    assert _count(db) == 1 + HEAVY_JOBS
    assert read(db, "h00").payload == heavy and read(db, f"h{HEAVY_JOBS - 1}").payload == heavy
