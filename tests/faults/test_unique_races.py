"""Uniqueness under concurrency: 8 processes enqueue the same keys at once.

Each process waits at one barrier, then enqueues ``ROUNDS`` jobs per key,
each in a transaction of its own (tests/faults/unique_enqueuer.py). The key's
row is the database's: exactly one job per key and window, whatever the
interleaving -- never check-then-insert. On SQLite (a real file) the write
lock serialises the processes; on PostgreSQL and MariaDB they run truly at
once (MariaDB with ``WATCHDOG_TEST_MYSQL_URL``). A day's run races them on
PostgreSQL and MariaDB only: the SQLite copies, whose processes the write lock
takes one at a time, run in CI and with ``WATCHDOG_SLOW_TESTS=1``, and so do
the debouncing and throttling races (eight processes each: a day's run races
the plain window only).
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, select

from sqlalchemy_watchdog import Job, store
from sqlalchemy_watchdog.model import jobs_table, unique_keys_table
from tests.conftest import RUN_SLOW, WITH_MARIADB
from tests.faults.helpers import url_string
from tests.faults.unique_enqueuer import enqueue_rounds

PROCESSES = 8
ROUNDS = 6
KEYS = ["k1", "k2", "k3"]
HOUR_MS = 3_600_000


@pytest.fixture(params=WITH_MARIADB)
def dialect(request: pytest.FixtureRequest) -> str:
    """SQLite, PostgreSQL and MariaDB: the key's decision is each one's own SQL."""
    name: str = request.param
    return name


def _race(engine: Engine, options: dict[str, Any], *, day: bool = False) -> list[tuple[str, str, str]]:
    """Every process's answers, once all of them are done. Only a ``day``
    race runs in a day's run, and not on SQLite (the module's docstring)."""
    if not RUN_SLOW and (engine.dialect.name == "sqlite" or not day):
        pytest.skip("slow test (eight processes): set WATCHDOG_SLOW_TESTS=1 (CI runs it)")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    out = ctx.Queue()
    url = url_string(engine.url)
    processes = [
        ctx.Process(target=enqueue_rounds, args=(url, worker, ROUNDS, KEYS, options, barrier, out))
        for worker in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    answers: list[tuple[str, str, str]] = []
    for _ in processes:
        reported = out.get(timeout=120)
        assert not isinstance(reported, str), reported
        answers.extend(reported)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0, f"an enqueuing process failed (exit {process.exitcode})"
    assert len(answers) == PROCESSES * ROUNDS * len(KEYS)
    return answers


def _jobs_by_key(engine: Engine) -> dict[str, list[str]]:
    with engine.connect() as conn:
        ids = conn.execute(select(jobs_table.c.job_id).order_by(jobs_table.c.sequence)).scalars().all()
    found: dict[str, list[str]] = {key: [] for key in KEYS}
    for job_id in ids:
        found[job_id.rsplit("-", 1)[1]].append(job_id)
    return found


def _key_rows(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {row.unique_key: row for row in conn.execute(select(unique_keys_table))}


def test_eight_processes_enqueueing_the_same_keys_store_exactly_one_job_per_key_and_period(engine: Engine) -> None:
    answers = _race(engine, {"unique_for_ms": HOUR_MS}, day=True)
    stored = _jobs_by_key(engine)
    rows = _key_rows(engine)
    for key in KEYS:
        assert len(stored[key]) == 1, f"{key}: {stored[key]}"
        (holder,) = stored[key]
        mine = [answer for answer in answers if answer[0].endswith(f"-{key}")]
        assert Counter(status for _, _, status in mine) == Counter({"queued": 1, "duplicate": PROCESSES * ROUNDS - 1})
        assert {answered for _, answered, _ in mine} == {holder}, "every enqueue names the one job"
        assert rows[key].job_id == holder and rows[key].duplicates == PROCESSES * ROUNDS - 1


def test_eight_processes_debouncing_one_key_leave_one_waiting_job_that_took_every_replacement(
    engine: Engine,
) -> None:
    answers = _race(engine, {"debounce_ms": HOUR_MS})
    stored = _jobs_by_key(engine)
    rows = _key_rows(engine)
    for key in KEYS:
        assert len(stored[key]) == 1, f"{key}: {stored[key]}"
        mine = [answer for answer in answers if answer[0].endswith(f"-{key}")]
        assert Counter(status for _, _, status in mine) == Counter({"queued": 1, "replaced": PROCESSES * ROUNDS - 1})
        assert rows[key].replacements == PROCESSES * ROUNDS - 1


@pytest.mark.parametrize("excess", ["drop", "delay"])
def test_eight_processes_throttling_one_key_store_one_job_per_period(engine: Engine, excess: str) -> None:
    answers = _race(engine, {"throttle_ms": HOUR_MS, "throttle_excess": excess})
    stored = _jobs_by_key(engine)
    expected = 1 if excess == "drop" else 2  # this period's, and with "delay" one in the next
    for key in KEYS:
        assert len(stored[key]) == expected, f"{key}: {stored[key]}"
        mine = [answer for answer in answers if answer[0].endswith(f"-{key}")]
        statuses = Counter(status for _, _, status in mine)
        assert statuses == Counter({"queued": expected, "duplicate": PROCESSES * ROUNDS - expected})


def test_a_debounced_holder_claimed_during_its_replacement_is_never_changed(engine: Engine) -> None:
    """The worst moment, forced: a runner claims the waiting holder after the
    enqueue read its state and before the replacement's UPDATE runs. The
    UPDATE is guarded by the state, so the running job keeps its payload and
    the key passes to the newcomer, a new job. (PostgreSQL and MariaDB: on
    SQLite the enqueue holds the write lock, so no claim can come in between.)"""
    if engine.dialect.name == "sqlite":
        pytest.skip("SQLite's write lock keeps every claim out of an enqueue's transaction")
    window = timedelta(milliseconds=1)  # the holder is due at once
    with engine.begin() as conn:
        store.enqueue(conn, [Job("first", "races", payload=1, unique_key="doc", debounce=window)])
    claimed: list[str] = []

    def claim_first(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if "SET payload_json" in statement and not claimed:
            with engine.connect() as other:
                store.transact(other, store.promote)  # its start has come: queued
                batch = store.transact(other, store.claim, queues=["races"], limit=1, lease_ms=60_000)
            claimed.extend(c.job.job_id for c in batch.claimed)

    time.sleep(0.01)
    event.listen(engine, "before_cursor_execute", claim_first)
    try:
        with engine.begin() as conn:
            (result,) = store.enqueue(conn, [Job("second", "races", payload=2, unique_key="doc", debounce=window)])
    finally:
        event.remove(engine, "before_cursor_execute", claim_first)
    assert claimed == ["first"]
    assert (result.job_id, result.status.value) == ("second", "queued"), "the key passed to a new job"
    with engine.connect() as conn:
        first = conn.execute(
            select(jobs_table.c.state, jobs_table.c.payload_json).where(jobs_table.c.job_id == "first")
        ).one()
    assert tuple(first) == ("running", "1"), "the running job was never changed"
