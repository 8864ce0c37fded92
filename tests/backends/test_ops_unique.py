"""Conformance of uniqueness windows, debounce, throttle and replacement (revision w0020).

Every backend runs this file (SQLite on a real file, PostgreSQL); see
``tests/backends/ops.py`` for how the operations are run. Time passes by
moving a key's window back in its row (what the database clock would do
to it an hour later), never by sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import (
    Decision,
    EnqueueConflict,
    InvalidJob,
    Job,
    JobState,
    ReplaceStatus,
    enqueue,
    store,
)
from sqlalchemy_watchdog.jobs import EnqueueStatus, encode_payload
from sqlalchemy_watchdog.model import jobs_table, unique_keys_table
from tests.backends.ops import add, claim_one, op, read, settle

QUEUED, DUPLICATE, REPLACED = EnqueueStatus.QUEUED, EnqueueStatus.DUPLICATE, EnqueueStatus.REPLACED
HOUR = timedelta(hours=1)


def digest(job_id: str, **options: object) -> Job:
    """A job holding ``digest:42`` for an hour unless ``options`` say otherwise."""
    options.setdefault("unique_key", "digest:42")
    if not {"debounce", "throttle"} & set(options):
        options.setdefault("unique_for", HOUR)
    return Job(job_id, "digests", payload={"id": job_id}, **options)  # type: ignore[arg-type]


def job_ids(db: Engine) -> list[str]:
    with db.connect() as conn:
        return list(conn.execute(select(jobs_table.c.job_id).order_by(jobs_table.c.sequence)).scalars())


def key_row(db: Engine, key: str = "digest:42") -> dict[str, object]:
    with db.connect() as conn:
        row = conn.execute(select(unique_keys_table).where(unique_keys_table.c.unique_key == key)).one()
    return dict(row._mapping)


def time_passes(db: Engine, ms: int, key: str = "digest:42") -> None:
    """The key's window, moved ``ms`` into the past."""
    c = unique_keys_table.c
    with db.begin() as conn:
        conn.execute(
            update(unique_keys_table)
            .where(c.unique_key == key)
            .values(since_ms=c.since_ms - ms, until_ms=c.until_ms - ms)
        )


# -- unique_for ---------------------------------------------------------------------


@pytest.mark.operation("enqueue")
def test_a_second_enqueue_within_the_period_is_a_duplicate_of_the_first_and_writes_no_job(db: Engine) -> None:
    (first,) = add(db, digest("d1"))
    (second,) = add(db, digest("d2"))
    assert (first.job_id, first.status, first.unique_key) == ("d1", QUEUED, "digest:42")
    assert (second.job_id, second.status, second.unique_key) == ("d1", DUPLICATE, "digest:42")
    assert job_ids(db) == ["d1"]
    assert key_row(db)["duplicates"] == 1


@pytest.mark.operation("enqueue")
def test_once_the_period_ended_the_next_enqueue_holds_the_key(db: Engine) -> None:
    add(db, digest("d1"))
    time_passes(db, HOUR // timedelta(milliseconds=1))
    (later,) = add(db, digest("d2"))
    assert (later.job_id, later.status) == ("d2", QUEUED)
    assert job_ids(db) == ["d1", "d2"]
    row = key_row(db)
    assert (row["job_id"], row["duplicates"]) == ("d2", 0)


@pytest.mark.operation("enqueue")
@pytest.mark.parametrize(
    ("states", "while_running", "once_settled"),
    [("any", DUPLICATE, DUPLICATE), ("unsettled", DUPLICATE, QUEUED), ("waiting", QUEUED, QUEUED)],
)
def test_unique_states_say_while_the_holder_is_in_which_states_it_holds_the_key(
    db: Engine, states: str, while_running: EnqueueStatus, once_settled: EnqueueStatus
) -> None:
    add(db, digest("d1", unique_states=states))
    held = claim_one(db, ["digests"])
    assert add(db, digest("d2", unique_states=states))[0].status is while_running
    if while_running is QUEUED:
        return
    settle(db, held, Decision.completed())
    assert add(db, digest("d3", unique_states=states))[0].status is once_settled


@pytest.mark.operation("enqueue")
def test_a_replay_of_the_holder_is_judged_by_its_job_id_as_always(db: Engine) -> None:
    add(db, digest("d1"))
    assert add(db, digest("d1"))[0].status is DUPLICATE
    with pytest.raises(EnqueueConflict):
        add(db, Job("d1", "digests", payload="other", unique_key="digest:42", unique_for=HOUR))
    assert job_ids(db) == ["d1"]


@pytest.mark.operation("enqueue")
def test_a_stored_job_enqueued_again_under_a_key_another_job_holds_is_a_replay_of_itself(db: Engine) -> None:
    add(db, digest("d1"))
    time_passes(db, HOUR // timedelta(milliseconds=1))
    add(db, digest("d2"))
    (again,) = add(db, digest("d1"))
    assert (again.job_id, again.status) == ("d1", DUPLICATE)
    assert key_row(db)["job_id"] == "d2"


@pytest.mark.operation("enqueue")
def test_two_jobs_of_one_key_in_one_call_the_second_is_a_duplicate_of_the_first(db: Engine) -> None:
    results = add(db, digest("d1"), Job("plain", "q"), digest("d2"))
    assert [(r.job_id, r.status) for r in results] == [("d1", QUEUED), ("plain", QUEUED), ("d1", DUPLICATE)]


@pytest.mark.operation("enqueue")
def test_a_rolled_back_enqueue_leaves_its_key_free(db: Engine) -> None:
    with Session(db) as session:
        enqueue(session, digest("d1"))
        session.rollback()
    assert add(db, digest("d2"))[0].status is QUEUED
    assert job_ids(db) == ["d2"]


@pytest.mark.operation("enqueue")
def test_bad_combinations_are_refused_before_anything_is_written(db: Engine) -> None:
    with pytest.raises(InvalidJob) as caught:
        add(db, Job("p", "q"), digest("d", debounce=timedelta(seconds=5), unique_for=None), delay=HOUR)
    assert caught.value.field == "delay"
    with pytest.raises(InvalidJob) as caught:
        add(db, digest("d1"), Job("child", "q", after=["d1"]))
    assert caught.value.field == "after"
    assert job_ids(db) == []


# -- debounce -----------------------------------------------------------------------


@pytest.mark.operation("enqueue")
def test_debounce_replaces_the_waiting_jobs_payload_and_moves_its_start(db: Engine) -> None:
    window = timedelta(seconds=30)
    (first,) = add(db, digest("d1", debounce=window))
    before = read(db, "d1")
    assert (first.status, before.state) == (QUEUED, JobState.DELAYED)
    (second,) = add(db, Job("d2", "digests", payload={"v": 2}, unique_key="digest:42", debounce=window))
    after = read(db, "d1")
    assert (second.job_id, second.status) == ("d1", REPLACED)
    assert after.payload == {"v": 2} and after.state is JobState.DELAYED
    assert after.ready_at >= before.ready_at
    assert job_ids(db) == ["d1"]
    assert key_row(db)["replacements"] == 1


@pytest.mark.operation("enqueue")
def test_debounce_max_wait_bounds_the_start_however_often_it_is_replaced(db: Engine) -> None:
    add(db, digest("d1", debounce=timedelta(minutes=10), max_wait=timedelta(minutes=15)))
    first = read(db, "d1")
    time_passes(db, 12 * 60_000)  # the first enqueue was 12 minutes ago
    add(db, digest("d2", debounce=timedelta(minutes=10), max_wait=timedelta(minutes=15)))
    row = key_row(db)
    assert row["until_ms"] == int(str(row["since_ms"])) + 15 * 60_000  # capped, not now + 10 minutes
    assert read(db, "d1").ready_at < first.ready_at + timedelta(minutes=10)


@pytest.mark.operation("enqueue")
def test_once_the_debounced_job_was_claimed_the_next_enqueue_is_a_new_job(db: Engine) -> None:
    add(db, digest("d1", debounce=timedelta(milliseconds=1)))
    with db.begin() as conn:  # its start has come
        conn.execute(text("UPDATE watchdog_jobs SET state = 'queued', ready_at = NULL WHERE job_id = 'd1'"))
    claim_one(db, ["digests"])
    (next_one,) = add(db, digest("d2", debounce=timedelta(seconds=30)))
    assert (next_one.job_id, next_one.status) == ("d2", QUEUED)
    assert read(db, "d1").payload == {"id": "d1"}  # the running job is never changed


# -- throttle -----------------------------------------------------------------------


@pytest.mark.operation("enqueue")
def test_throttle_drops_an_extra_enqueue_within_the_period(db: Engine) -> None:
    add(db, digest("t1", throttle=HOUR))
    assert [(r.job_id, r.status) for r in add(db, digest("t2", throttle=HOUR))] == [("t1", DUPLICATE)]
    time_passes(db, HOUR // timedelta(milliseconds=1))
    assert add(db, digest("t3", throttle=HOUR))[0].status is QUEUED


@pytest.mark.operation("enqueue")
def test_throttle_delay_puts_one_extra_job_in_the_next_period_and_drops_the_rest(db: Engine) -> None:
    add(db, digest("t1", throttle=HOUR, throttle_excess="delay"))
    (second,) = add(db, digest("t2", throttle=HOUR, throttle_excess="delay"))
    (third,) = add(db, digest("t3", throttle=HOUR, throttle_excess="delay"))
    assert (second.job_id, second.status) == ("t2", QUEUED)
    assert (third.job_id, third.status) == ("t2", DUPLICATE)
    first, delayed = read(db, "t1"), read(db, "t2")
    assert delayed.state is JobState.DELAYED
    assert delayed.ready_at >= first.enqueued_at + HOUR - timedelta(seconds=1)


# -- replace --------------------------------------------------------------------


@pytest.mark.operation("replace")
def test_replace_changes_a_waiting_jobs_payload_and_start_and_is_idempotent(db: Engine) -> None:
    add(db, Job("a", "q", payload=1))
    later = datetime.now(UTC) + HOUR
    for _ in range(2):
        result = op(db, store.replace, "a", payload="2", start=later, set_start=True)
        assert (result.job_id, result.status) == ("a", ReplaceStatus.REPLACED)
    job = read(db, "a")
    assert (job.payload, job.state) == (2, JobState.DELAYED)
    assert abs(job.run_at - later) < timedelta(milliseconds=2)
    op(db, store.replace, "a", payload=None, start=None, set_start=True)
    assert (read(db, "a").payload, read(db, "a").state) == (2, JobState.QUEUED)


@pytest.mark.operation("replace", "enqueue")
def test_a_replacement_payload_far_over_64_kib_is_stored_byte_for_byte(db: Engine) -> None:
    """Issue 57: replace and debounce write a payload over the 65,535 bytes
    of MariaDB's TEXT whole (LONGTEXT, revision w0023)."""
    long_payload = {"text": "é" * 50_000 + "x" * 100_000}
    longer_payload = {"text": "é" * 60_000 + "y" * 100_000}
    add(db, Job("a", "q", payload=1))
    replaced = op(db, store.replace, "a", payload=encode_payload(long_payload), start=None, set_start=False)
    assert replaced.status is ReplaceStatus.REPLACED and read(db, "a").payload == long_payload
    window = timedelta(seconds=30)
    add(db, Job("d1", "digests", payload=long_payload, unique_key="digest:42", debounce=window))
    (second,) = add(db, Job("d2", "digests", payload=longer_payload, unique_key="digest:42", debounce=window))
    assert (second.job_id, second.status) == ("d1", REPLACED)
    assert read(db, "d1").payload == longer_payload
    with db.connect() as conn:
        stored = conn.execute(select(jobs_table.c.payload_json).where(jobs_table.c.job_id == "d1")).scalar_one()
    assert stored == encode_payload(longer_payload)


@pytest.mark.operation("replace")
def test_replace_refuses_a_claimed_job_and_says_when_there_is_none(db: Engine) -> None:
    add(db, Job("a", "q", payload=1))
    claim_one(db, ["q"])
    assert op(db, store.replace, "a", payload="2", start=None, set_start=False).status is ReplaceStatus.NOT_WAITING
    assert read(db, "a").payload == 1
    assert op(db, store.replace, "nope", payload="2", start=None, set_start=False).status is ReplaceStatus.MISSING


@pytest.mark.operation("replace")
def test_replace_keeps_a_job_waiting_for_its_parents_waiting(db: Engine) -> None:
    add(db, Job("parent", "q"), Job("child", "q", after=["parent"], payload=1))
    assert op(db, store.replace, "child", payload="2", start=None, set_start=False).status is ReplaceStatus.REPLACED
    assert (read(db, "child").state, read(db, "child").payload) == (JobState.WAITING, 2)


# -- what show explains ------------------------------------------------------------


@pytest.mark.operation("keys_held_by")
def test_the_keys_a_job_holds_say_how_and_what_they_absorbed(db: Engine) -> None:
    add(db, digest("d1"))
    add(db, digest("d2"), digest("d3"))
    (hold,) = op(db, store.keys_held_by, "d1")
    assert (hold.unique_key, hold.kind.value, hold.states.value, hold.duplicates) == (
        "digest:42",
        "unique_for",
        "any",
        2,
    )
    assert hold.until - hold.since == HOUR
    assert op(db, store.keys_held_by, "d2") == []


@pytest.mark.operation("prune_retention")
def test_retention_deletes_key_rows_a_day_past_their_window_only(db: Engine) -> None:
    add(db, digest("old"), Job("fresh", "q", unique_key="other", unique_for=HOUR))
    time_passes(db, 2 * 86_400_000)
    op(db, store.prune_retention, {"completed": timedelta(days=1)}, 100)
    with db.connect() as conn:
        left = conn.execute(select(unique_keys_table.c.unique_key)).scalars().all()
        assert conn.execute(select(func.count()).select_from(jobs_table)).scalar() == 2
    assert left == ["other"]
