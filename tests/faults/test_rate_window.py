"""A rate's window, audited on the jobs' own starts (issue 54, item 8).

The documented guarantee (docs/howto/limits.md, "The window"): a queue with
``rate=Rate(N, per)`` starts at most N jobs in any window ``[t, t + per)`` of
the database clock -- a sliding window, each start being the job's
``started_at``, written by the claim statement that made it ``running``.

These tests audit exactly that, from the database: a trigger records the
``started_at`` of every transition into ``running``, and every half-open
window of the period is counted. Not the rate log the claims count (the
fault tests in ``test_limit_faults.py`` audit that one): the starts a user
sees in the table.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, Rate, Watchdog, store
from tests.faults.helpers import WorkerPool, assert_settled_exactly_once, controlled_db_clock, enqueue_jobs, wait_until

RATE_COUNT = 6
PERIOD_MS = 1000

_PG_STARTS = [
    "CREATE TABLE IF NOT EXISTS start_audit (id serial PRIMARY KEY, job_id text, started_at bigint)",
    """CREATE OR REPLACE FUNCTION start_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO start_audit (job_id, started_at) VALUES (NEW.job_id, NEW.started_at);
    RETURN NULL;
END $$""",
    "DROP TRIGGER IF EXISTS start_audit ON watchdog_jobs",
    "CREATE TRIGGER start_audit AFTER UPDATE OF state ON watchdog_jobs FOR EACH ROW"
    " WHEN (NEW.state = 'running' AND OLD.state IS DISTINCT FROM 'running') EXECUTE FUNCTION start_audit_row()",
]
_SQLITE_STARTS = [
    "CREATE TABLE IF NOT EXISTS start_audit (id INTEGER PRIMARY KEY, job_id text, started_at integer)",
    "CREATE TRIGGER IF NOT EXISTS start_audit AFTER UPDATE OF state ON watchdog_jobs"
    " WHEN NEW.state = 'running' AND OLD.state <> 'running' BEGIN"
    " INSERT INTO start_audit (job_id, started_at) VALUES (NEW.job_id, NEW.started_at); END",
]

#: MariaDB: no ``WHEN`` nor ``UPDATE OF``, an ``IF`` in the body.
_MYSQL_STARTS = [
    "CREATE TABLE IF NOT EXISTS start_audit (id INTEGER AUTO_INCREMENT PRIMARY KEY, job_id TEXT, started_at BIGINT)",
    "DROP TRIGGER IF EXISTS start_audit",
    "CREATE TRIGGER start_audit AFTER UPDATE ON watchdog_jobs FOR EACH ROW"
    " BEGIN IF NEW.state = 'running' AND OLD.state <> 'running' THEN"
    " INSERT INTO start_audit (job_id, started_at) VALUES (NEW.job_id, NEW.started_at); END IF; END",
]


def install_start_audit(engine: Engine) -> None:
    """Record every job's start (a transition into ``running``) with its ``started_at``."""
    statements = {"postgresql": _PG_STARTS, "mysql": _MYSQL_STARTS, "mariadb": _MYSQL_STARTS}
    with engine.begin() as conn:
        for ddl in statements.get(engine.dialect.name, _SQLITE_STARTS):
            conn.exec_driver_sql(ddl)


def audited_starts(engine: Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id, started_at FROM start_audit ORDER BY started_at, id")).all()
    return [(job_id, int(at)) for job_id, at in rows]


def busiest_window(starts: list[int], period_ms: int) -> tuple[int, int]:
    """The most starts in one half-open window ``[t, t + period_ms)`` and the
    ``t`` of the first such window: a window holding the most starts can be
    moved to begin at one of them, so each start is tried as ``t``."""
    ordered = sorted(starts)
    best, at, end = 0, 0, 0
    for begin, first in enumerate(ordered):
        end = max(end, begin)
        while end < len(ordered) and ordered[end] < first + period_ms:
            end += 1
        if end - begin > best:
            best, at = end - begin, first
    return best, at


def test_the_window_count_is_half_open_and_slides() -> None:
    """The audit's own arithmetic: a start exactly a period after another is
    in the next window; any window, not only those at multiples of the period."""
    assert busiest_window([0, 1000], 1000) == (1, 0)
    assert busiest_window([0, 999], 1000) == (2, 0)
    assert busiest_window([10, 500, 900, 1400, 1499], 1000) == (4, 500)
    assert busiest_window([], 1000) == (0, 0)


# -- a claim delayed between reading its room and starting its jobs ----------------


@pytest.fixture
def clocked(db_url: URL, engine: Engine) -> Iterator[tuple[Engine, Callable[[int], None]]]:
    """An engine whose statements read a database clock the test sets."""
    with controlled_db_clock(db_url, 1_000_000) as pair:
        yield pair


@pytest.mark.parametrize("per_key", [False, True], ids=["rate", "rate_per_key"])
def test_a_claim_delayed_before_its_start_still_counts_in_the_next_window(
    clocked: tuple[Engine, Callable[[int], None]], per_key: bool
) -> None:
    """A claim made of several statements (SQLite's always; PostgreSQL's when
    the one statement declines) reads the clock for its room, then starts its
    jobs a statement later. Here 300 ms pass in between (a process
    descheduled on a busy host): its six jobs start at 1,000,300. A claim at
    1,001,000 -- one period after the room was read, 700 ms after the starts --
    must find no room, nor one at 1,001,299, and one at 1,001,300 the full
    rate again (the window is half-open). Logged at the
    clock of the room instead of the starts, the second claim started six more
    and the window [1,000,300, 1,001,300) held twelve."""
    engine, set_clock = clocked
    install_start_audit(engine)
    watchdog = Watchdog(engine)
    rate = Rate(RATE_COUNT, timedelta(milliseconds=PERIOD_MS))
    if per_key:
        watchdog.set_limits("paced", rate_per_key=rate)
    else:
        watchdog.set_limits("paced", rate=rate)
    key = "customer" if per_key else None
    watchdog.enqueue([Job(f"j{n:02d}", "paced", key=key) for n in range(3 * RATE_COUNT)])
    delay = {"ms": 0}

    def descheduled(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if delay["ms"] and statement.lstrip().startswith("UPDATE watchdog_jobs"):
            # The claim's UPDATE: its clock, read from fault_clock, moves on first
            # (through a cursor of its own: PyMySQL's connection has no execute()).
            other = cursor.connection.cursor()
            other.execute(f"UPDATE fault_clock SET ms = ms + {delay['ms']} WHERE id = 1")
            other.close()
            delay["ms"] = 0

    def claim() -> int:
        with engine.begin() as conn:
            taken = store.limits.claim_in_transaction(
                conn, "paced", limit=RATE_COUNT, lease_ms=60_000, token="t", at_once=False
            )
        assert taken is not None
        return len(taken.rows)

    event.listen(engine, "before_cursor_execute", descheduled)
    try:
        delay["ms"] = 300
        assert claim() == RATE_COUNT
        assert delay["ms"] == 0, "the claim's UPDATE was not seen"
        set_clock(1_001_000)
        assert claim() == 0  # its window still holds the six started at 1,000,300
        set_clock(1_001_299)
        assert claim() == 0  # the last millisecond of [1,000,300, 1,001,300)
        set_clock(1_001_300)
        assert claim() == RATE_COUNT
    finally:
        event.remove(engine, "before_cursor_execute", descheduled)
    starts = audited_starts(engine)
    assert [at for _job, at in starts] == [1_000_300] * RATE_COUNT + [1_001_300] * RATE_COUNT
    assert busiest_window([at for _job, at in starts], PERIOD_MS) == (RATE_COUNT, 1_000_300)


# -- three runner processes pressing on one rate ------------------------------------


@pytest.mark.slow
def test_no_window_of_the_period_starts_more_than_the_rate_under_three_processes(
    instrumented: Engine, db_url: URL, workers: WorkerPool, dialect: str
) -> None:
    """Three runner processes (two sync, one asyncio), each with more slots
    than the rate, drain 60 short jobs of a queue limited to 6 starts a
    second: no window ``[t, t + 1 s)`` of the database clock holds more than
    6 of the jobs' recorded starts, and the runners pressed against the rate
    (some window holds exactly 6)."""
    engine = instrumented  # the workers' handlers write the fault audit
    install_start_audit(engine)
    Watchdog(engine).set_limits("paced", rate=Rate(RATE_COUNT, timedelta(milliseconds=PERIOD_MS)))
    total = 60
    ids = [f"paced-{n:03d}" for n in range(total)]
    enqueue_jobs(engine, [Job(job_id, "paced", payload={"action": "sleep", "seconds": 0.01}) for job_id in ids])
    # A lease far longer than any job: on a loaded host a SQLite writer can
    # wait seconds for the lock, and this test is about starts, not recoveries.
    timing: dict[str, object] = {"queue": "paced", "concurrency": 4, "poll": 0.02, "lease": 60, "heartbeat": 2}
    timing["log_level"] = "WARNING"
    pool = [
        workers.start(db_url, "w0", **timing),
        workers.start(db_url, "w1", **timing),
        workers.start(db_url, "w2", asyncio=True, **timing),
    ]

    def settled() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE state = 'settled'")).scalar_one())

    wait_until(lambda: settled() == total, timeout=240, what="every job to settle", interval=0.2)
    for worker in pool:
        worker.send(signal.SIGTERM)
    for worker in pool:
        assert worker.wait(60) == 0, worker.log_text()[-3000:]
    starts = audited_starts(engine)
    assert sorted(job for job, _at in starts) == ids  # each started once
    peak, at = busiest_window([at for _job, at in starts], PERIOD_MS)
    assert peak == RATE_COUNT, f"{peak} starts in the {PERIOD_MS} ms from {at}: {starts}"
    # The rate is what bounded the drain: 60 starts at 6 a second take 9 s and more.
    assert starts[-1][1] - starts[0][1] >= (total // RATE_COUNT - 1) * PERIOD_MS
    rows = assert_settled_exactly_once(engine, ids)
    assert {row["outcome"] for row in rows.values()} == {"completed"}
