"""Conformance of signals' store operations (revision w0022): the first
signal of a name is kept (a repeat changes nothing), nothing is kept for a
settled or unknown job, a job delayed while it waits for the signal is made
due, and a snooze of a waiting job that a signal beat is made due too --
including when the signal committed while the snooze waited for the job's
row (PostgreSQL and MariaDB, forced interleaving).

Every backend runs this file; see ``tests/backends/ops.py``.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text

from sqlalchemy_watchdog import Decision, Job, JobState, SignalResult, SignalStatus, store
from sqlalchemy_watchdog.jobs import StepKind
from sqlalchemy_watchdog.store import Settlement, SettleRequest
from tests.backends.ops import add, claim_one, op, settle

WAIT_MS = 3_600_000


def _state(db: Engine, job_id: str) -> tuple[str, int]:
    """The job's state, and its ready time's distance from the database clock (ms, rounded to minutes)."""
    job = op(db, store.read, job_id)
    assert job is not None
    with db.connect() as conn:
        clock = conn.execute(text("SELECT ready_at FROM watchdog_jobs WHERE job_id = :j"), {"j": job_id}).scalar_one()
    now = store.now_ms()
    return job.state.value, round((clock - now) / 60_000)


def _waiting(db: Engine, job_id: str = "a", name: str = "approved") -> store.Claim:
    """Job ``job_id`` claimed, its wait for ``name`` recorded (an hour's timeout)."""
    add(db, Job(job_id, job_id))  # a queue of its own: the claim takes this job
    held = claim_one(db, [job_id])
    recorded = op(
        db, store.record_step, job_id, held.token, name, kind=StepKind.WAIT, result_json=None, delay_ms=WAIT_MS,
        attempt=1,
    )  # fmt: skip
    assert recorded is not None and recorded.wake_at is not None
    return held


def _snooze(db: Engine, held: store.Claim, waits_for: str | None) -> Settlement:
    request = SettleRequest(
        held.job.job_id, held.token, Decision.snooze(timedelta(milliseconds=WAIT_MS)), waits_for=waits_for
    )
    (result,) = op(db, store.settle_many, [request])
    return result


@pytest.mark.operation("send_signal", "read_signal", "read_signals")
def test_the_first_signal_of_a_name_is_kept_and_a_repeat_changes_nothing(db: Engine) -> None:
    add(db, Job("a", "q"))
    sent = op(db, store.send_signal, "a", "approved", '{"by":"ann"}')
    assert (sent.status, sent.payload_json) == (SignalStatus.DELIVERED, '{"by":"ann"}')
    again = op(db, store.send_signal, "a", "approved", '{"by":"ann"}')
    assert (again.status, again.payload_json) == (SignalStatus.DUPLICATE, '{"by":"ann"}')
    other = op(db, store.send_signal, "a", "approved", '{"by":"bob"}')
    assert (other.status, other.payload_json) == (SignalStatus.CONFLICT, '{"by":"ann"}'), "the first one stays"
    op(db, store.send_signal, "a", "shipped", "null")
    kept = op(db, store.read_signals, "a")
    assert [(s.name, s.payload) for s in kept] == [("approved", {"by": "ann"}), ("shipped", None)]
    found, clock = op(db, store.read_signal, "a", "approved")
    assert found is not None and found.payload == {"by": "ann"} and clock > 0
    missing, _ = op(db, store.read_signal, "a", "rejected")
    assert missing is None


@pytest.mark.operation("send_signal")
def test_nothing_is_kept_for_a_settled_or_unknown_job(db: Engine) -> None:
    add(db, Job("a", "q"))
    held = claim_one(db, ["q"])
    op(db, store.send_signal, "a", "early", "1")
    settle(db, held, Decision.completed())
    assert op(db, store.send_signal, "a", "late", "1").status is SignalStatus.JOB_SETTLED
    assert op(db, store.send_signal, "a", "early", "1").status is SignalStatus.DUPLICATE, "a repeat stays a repeat"
    assert op(db, store.send_signal, "a", "early", "2").status is SignalStatus.JOB_SETTLED
    assert op(db, store.send_signal, "nobody", "x", "1").status is SignalStatus.NO_SUCH_JOB
    assert [s.name for s in op(db, store.read_signals, "a")] == ["early"]


@pytest.mark.operation("send_signal", "settle_many")
def test_a_signal_wakes_a_job_delayed_while_it_waits_for_it(db: Engine) -> None:
    held = _waiting(db)
    assert _snooze(db, held, "approved").status.value == "requeued"
    assert _state(db, "a") == ("delayed", 60), "snoozed until the wait's timeout"
    op(db, store.send_signal, "a", "other", "1")
    assert _state(db, "a") == ("delayed", 60), "another name wakes nothing"
    assert op(db, store.send_signal, "a", "approved", "1").status is SignalStatus.DELIVERED
    assert _state(db, "a") == ("queued", 0), "due now"


@pytest.mark.operation("settle_many")
def test_a_snooze_that_a_signal_beat_is_made_due_in_its_own_transaction(db: Engine) -> None:
    # The handler read "no signal"; the signal commits (the job still
    # running: nothing to wake); then the snooze: its later statement wakes it.
    held = _waiting(db)
    op(db, store.send_signal, "a", "approved", "1")
    assert op(db, store.read, "a").state is JobState.RUNNING  # type: ignore[union-attr]
    _snooze(db, held, "approved")
    assert _state(db, "a") == ("queued", 0)


@pytest.mark.operation("settle_many", "send_signal")
def test_a_signal_committed_while_the_snooze_waited_for_the_row_is_not_lost(db: Engine) -> None:
    """The race: the signal's transaction holds the job's row (its ``FOR
    UPDATE``) when the snooze's ``UPDATE`` arrives and waits for it; the
    signal commits (the job still running then: nothing woken); the
    ``UPDATE`` goes on. Under READ COMMITTED a subquery of that ``UPDATE``
    would not see the signal (its snapshot is older); the settle's next
    statement does, and the job is due now, not in an hour. Without that
    statement (``waits_for=None``) the same interleaving leaves it asleep."""
    if db.dialect.name == "sqlite":
        pytest.skip("rows lock on PostgreSQL and MariaDB; SQLite's one writer runs the two one after the other")
    outcomes = {}
    for job_id, waits_for in (("woken", "approved"), ("lost", None)):
        held = _waiting(db, job_id)
        with db.connect() as signal_conn:
            transaction = signal_conn.begin()
            sent = store.send_signal(signal_conn, job_id, "approved", "1")
            assert sent.status is SignalStatus.DELIVERED
            snoozed: list[Settlement] = []
            snooze = threading.Thread(target=lambda: snoozed.append(_snooze(db, held, waits_for)))
            snooze.start()
            _until_blocked(db, job_id)
            transaction.commit()
            snooze.join(timeout=60)
        assert snoozed and snoozed[0].status.value == "requeued", snoozed
        outcomes[job_id] = _state(db, job_id)
    assert outcomes == {"woken": ("queued", 0), "lost": ("delayed", 60)}


@pytest.mark.operation("send_signal")
def test_two_transactions_signalling_the_same_name_at_once_keep_one_and_the_second_says_which(db: Engine) -> None:
    """The race, forced: the first signal's transaction holds the job's row
    when the second, whose own transaction has read already (its snapshot,
    at MariaDB's default REPEATABLE READ, older than the first signal),
    arrives and waits for it; the first commits. The second still finds the
    first signal -- a conflict naming the first payload, nothing written.
    (On MariaDB its INSERT fails on the duplicate key and a locking read
    finds the first signal, where a plain read in its older snapshot would
    find none and the duplicate key would reach the caller.)"""
    if db.dialect.name == "sqlite":
        pytest.skip("rows lock on PostgreSQL and MariaDB; SQLite's one writer runs the two one after the other")
    add(db, Job("a", "q"))
    with db.connect() as first, db.connect() as second:
        first_transaction = first.begin()
        assert store.send_signal(first, "a", "approved", '"ann"').status is SignalStatus.DELIVERED
        second_transaction = second.begin()
        assert second.execute(text("SELECT count(*) FROM watchdog_job_signals")).scalar_one() == 0
        answers: list[object] = []

        def send_second() -> None:
            try:
                answers.append(store.send_signal(second, "a", "approved", '"bob"'))
            except Exception as error:  # shown by the assertion below
                answers.append(error)

        sender = threading.Thread(target=send_second)
        sender.start()
        _until_blocked(db, "a")
        first_transaction.commit()
        sender.join(timeout=60)
        second_transaction.commit()
    (answer,) = answers
    assert isinstance(answer, SignalResult), answer
    assert (answer.status, answer.payload_json) == (SignalStatus.CONFLICT, '"ann"'), "the first one stays"
    assert [(s.name, s.payload) for s in op(db, store.read_signals, "a")] == [("approved", "ann")]


@pytest.mark.operation("send_signal")
def test_a_callers_open_signal_does_not_hold_up_a_signal_of_another_job(db: Engine) -> None:
    """Two callers' own transactions at MariaDB's default REPEATABLE READ
    (``signal_job(session, ...)``), each signalling its job, the first still
    open: the second keeps its signal at once. A locking read of the missing
    name before the insert would take a gap lock there, and the second's
    insert into that gap would wait for the first to end."""
    if db.dialect.name == "sqlite":
        pytest.skip("SQLite's one writer: the second transaction waits for the first whatever it does")
    add(db, Job("a", "q"), Job("b", "q"))
    with db.connect() as first, db.connect() as second:
        with first.begin():
            assert store.send_signal(first, "a", "approved", "1").status is SignalStatus.DELIVERED
            with second.begin():
                if db.dialect.name == "postgresql":
                    second.exec_driver_sql("SET LOCAL lock_timeout = '1s'")
                else:
                    second.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
                assert store.send_signal(second, "b", "approved", "1").status is SignalStatus.DELIVERED
    assert [s.name for s in op(db, store.read_signals, "b")] == ["approved"]


#: SQL counting the other sessions of this database that wait for a lock:
#: PostgreSQL's, and InnoDB's (a ``mysql://`` or ``mariadb://`` URL).
_LOCK_WAITS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
    "innodb": "SELECT count(*) FROM information_schema.innodb_trx t"
    " JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id"
    " WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE() AND p.id <> CONNECTION_ID()",
}


def _until_blocked(db: Engine, job_id: str) -> None:
    """Until another session waits for a lock (the snooze or a second
    signal, for the job's row). InnoDB refreshes
    ``information_schema.innodb_trx`` only when it was not read for 0.1 s:
    read more often, it would show the first answer forever."""
    query = text(_LOCK_WAITS.get(db.dialect.name) or _LOCK_WAITS["innodb"])
    pause = 0.02 if db.dialect.name == "postgresql" else 0.15
    deadline = time.monotonic() + 60
    with db.connect() as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(query).scalar_one()
            conn.rollback()
            if waiting:
                return
            time.sleep(pause)
    raise AssertionError(f"no transaction ever waited for the row lock of {job_id}")


@pytest.mark.operation("read_signals", "prune_retention")
def test_a_pruned_jobs_signals_are_forgotten_and_a_new_job_of_its_id_has_none(db: Engine) -> None:
    add(db, Job("a", "q"))
    op(db, store.send_signal, "a", "approved", "1")
    with db.begin() as conn:  # as prune would: the job row goes
        conn.exec_driver_sql("DELETE FROM watchdog_jobs WHERE job_id = 'a'")
    add(db, Job("a", "q"))
    assert op(db, store.read_signals, "a") == [], "the new job is not the old one"
    op(db, store.prune_retention, {"completed": timedelta(days=1)}, 100)
    with db.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM watchdog_job_signals").scalar() == 0, "orphans pruned"


@pytest.mark.operation("send_signal", "read_signal", "read_signals")
def test_a_signal_payload_far_over_64_kib_is_kept_byte_for_byte(db: Engine) -> None:
    """Issue 57: a signal's payload over the 65,535 bytes of MariaDB's TEXT is kept whole (LONGTEXT, revision w0023)."""
    payload_json = json.dumps({"text": "é" * 50_000 + "x" * 100_000}, ensure_ascii=False, separators=(",", ":"))
    assert len(payload_json.encode()) > 200_000
    add(db, Job("a", "q"))
    assert op(db, store.send_signal, "a", "big", payload_json).status is SignalStatus.DELIVERED
    assert op(db, store.send_signal, "a", "big", payload_json).status is SignalStatus.DUPLICATE, "compared whole"
    found, _ = op(db, store.read_signal, "a", "big")
    assert found is not None and found.payload_json == payload_json
    assert [s.payload_json for s in op(db, store.read_signals, "a")] == [payload_json]
