"""Limits under faults: a trigger in the database records every moment a
queue's (or a key's) running jobs exceed its limit, while worker processes
race, are SIGKILLed, frozen with SIGSTOP past their leases and have their
connections cut (PostgreSQL: ``pg_terminate_backend``; MariaDB: ``KILL
CONNECTION``).

PostgreSQL: a deferred constraint trigger checks, when each transaction that
made a job ``running`` commits, the queue's and the key's running jobs
against ``watchdog_limits`` (the claimers of a queue take turns on its limits
row, so the check at each commit sees every claim committed before it);
SQLite: a row trigger checks after each row a claim makes running (one writer
at a time); MariaDB: a row trigger too (MariaDB has no deferred triggers): the
claimers of a queue take turns on its limits row there as well, so each row
a claim makes running is counted with every claim committed before it and
the rows its own statement made running so far. A sampling thread also
counts, from a connection of its own, the running jobs per queue and key
every few milliseconds. The test fails if either found a moment over a
limit, and every job must end ``completed``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Connection, Engine, String, cast, create_engine, literal, text, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from sqlalchemy_watchdog import Job, Rate, Watchdog
from sqlalchemy_watchdog.model import jobs_table
from tests.faults.helpers import WorkerPool, assert_settled_exactly_once, enqueue_jobs, wait_until

pytestmark = pytest.mark.slow

CONCURRENCY = 5
PER_KEY = 1
KEYS = 8

_PG_AUDIT = [
    "CREATE TABLE IF NOT EXISTS limit_audit (id serial PRIMARY KEY, at timestamptz DEFAULT clock_timestamp(),"
    " queue_name text, limit_key text, kind text, running int, lim int)",
    """CREATE OR REPLACE FUNCTION limit_audit_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    lim record;
    n int;
BEGIN
    SELECT * INTO lim FROM watchdog_limits WHERE queue_name = NEW.queue_name;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF lim.concurrency IS NOT NULL THEN
        SELECT count(*) INTO n FROM watchdog_jobs WHERE queue_name = NEW.queue_name AND state = 'running';
        IF n > lim.concurrency THEN
            INSERT INTO limit_audit (queue_name, kind, running, lim)
            VALUES (NEW.queue_name, 'concurrency', n, lim.concurrency);
        END IF;
    END IF;
    IF lim.concurrency_per_key IS NOT NULL AND NEW.limit_key IS NOT NULL THEN
        SELECT count(*) INTO n FROM watchdog_jobs
        WHERE queue_name = NEW.queue_name AND limit_key = NEW.limit_key AND state = 'running';
        IF n > lim.concurrency_per_key THEN
            INSERT INTO limit_audit (queue_name, limit_key, kind, running, lim)
            VALUES (NEW.queue_name, NEW.limit_key, 'concurrency_per_key', n, lim.concurrency_per_key);
        END IF;
    END IF;
    RETURN NULL;
END $$""",
    "DROP TRIGGER IF EXISTS limit_audit ON watchdog_jobs",
    "CREATE CONSTRAINT TRIGGER limit_audit AFTER UPDATE OF state ON watchdog_jobs"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
    " WHEN (NEW.state = 'running' AND OLD.state IS DISTINCT FROM 'running')"
    " EXECUTE FUNCTION limit_audit_check()",
]

_RUNNING = "SELECT count(*) FROM watchdog_jobs WHERE queue_name = NEW.queue_name AND state = 'running'"
_KEY_RUNNING = _RUNNING + " AND limit_key = NEW.limit_key"
_SQLITE_AUDIT = [
    "CREATE TABLE IF NOT EXISTS limit_audit (id INTEGER PRIMARY KEY, queue_name text, limit_key text,"
    " kind text, running int, lim int)",
    f"""CREATE TRIGGER IF NOT EXISTS limit_audit AFTER UPDATE OF state ON watchdog_jobs
WHEN NEW.state = 'running' AND OLD.state <> 'running'
BEGIN
    INSERT INTO limit_audit (queue_name, kind, running, lim)
    SELECT NEW.queue_name, 'concurrency', ({_RUNNING}), l.concurrency FROM watchdog_limits l
    WHERE l.queue_name = NEW.queue_name AND l.concurrency IS NOT NULL AND ({_RUNNING}) > l.concurrency;
    INSERT INTO limit_audit (queue_name, limit_key, kind, running, lim)
    SELECT NEW.queue_name, NEW.limit_key, 'concurrency_per_key', ({_KEY_RUNNING}), l.concurrency_per_key
    FROM watchdog_limits l
    WHERE l.queue_name = NEW.queue_name AND NEW.limit_key IS NOT NULL AND l.concurrency_per_key IS NOT NULL
    AND ({_KEY_RUNNING}) > l.concurrency_per_key;
END""",
]


#: The database clock in epoch ms, as the library computes it on MariaDB.
_MYSQL_CLOCK = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000"

#: MariaDB: a row trigger (no ``WHEN``, no ``UPDATE OF``: an ``IF`` in the
#: body), the counts as on SQLite. It reads ``watchdog_jobs`` and writes
#: another table only (a trigger writing the table that fired it is error 1442).
_MYSQL_AUDIT = [
    "CREATE TABLE IF NOT EXISTS limit_audit (id INTEGER AUTO_INCREMENT PRIMARY KEY, at BIGINT,"
    " queue_name TEXT, limit_key TEXT, kind TEXT, running INT, lim INT)",
    "DROP TRIGGER IF EXISTS limit_audit",
    f"""CREATE TRIGGER limit_audit AFTER UPDATE ON watchdog_jobs FOR EACH ROW
BEGIN
    IF NEW.state = 'running' AND OLD.state <> 'running' THEN
        INSERT INTO limit_audit (at, queue_name, kind, running, lim)
        SELECT {_MYSQL_CLOCK}, NEW.queue_name, 'concurrency', ({_RUNNING}), l.concurrency FROM watchdog_limits l
        WHERE l.queue_name = NEW.queue_name AND l.concurrency IS NOT NULL AND ({_RUNNING}) > l.concurrency;
        INSERT INTO limit_audit (at, queue_name, limit_key, kind, running, lim)
        SELECT {_MYSQL_CLOCK}, NEW.queue_name, NEW.limit_key, 'concurrency_per_key', ({_KEY_RUNNING}),
            l.concurrency_per_key
        FROM watchdog_limits l
        WHERE l.queue_name = NEW.queue_name AND NEW.limit_key IS NOT NULL AND l.concurrency_per_key IS NOT NULL
        AND ({_KEY_RUNNING}) > l.concurrency_per_key;
    END IF;
END""",
]


def _of_dialect(engine: Engine, postgresql: list[str], sqlite: list[str], mariadb: list[str]) -> list[str]:
    """The statements of ``engine``'s dialect (MySQL's are MariaDB's)."""
    return {"postgresql": postgresql, "mysql": mariadb, "mariadb": mariadb}.get(engine.dialect.name, sqlite)


def install_audit(engine: Engine) -> None:
    with engine.begin() as conn:
        for ddl in _of_dialect(engine, _PG_AUDIT, _SQLITE_AUDIT, _MYSQL_AUDIT):
            conn.exec_driver_sql(ddl)


def _make_running(conn: Connection, *job_ids: str, queue: str | None = None) -> None:
    """Make jobs ``running`` by hand, ignoring every limit: the given ones,
    or every job of ``queue``. Each gets claim token ``x<sequence>`` (built
    by SQLAlchemy: ``||`` concatenates on PostgreSQL and SQLite, not on MariaDB)."""
    token = literal("x") + cast(jobs_table.c.sequence, String)
    where = jobs_table.c.queue_name == queue if queue is not None else jobs_table.c.job_id.in_(job_ids)
    conn.execute(update(jobs_table).where(where).values(state="running", claim_token=token, lease_until=9999999999999))


def audit_findings(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(text("SELECT queue_name, limit_key, kind, running, lim FROM limit_audit"))
        ]


def test_the_audit_trigger_sees_an_excess(engine: Engine) -> None:
    """The audit can fail: a claim that ignores the limit (written by hand) is recorded."""
    install_audit(engine)
    watchdog = Watchdog(engine)
    watchdog.enqueue([Job(f"j{i}", "q", key="k") for i in range(3)])
    watchdog.set_limits("q", concurrency=1, concurrency_per_key=1)
    with engine.begin() as conn:
        _make_running(conn, queue="q")
    kinds = {row[2] for row in audit_findings(engine)}
    assert kinds == {"concurrency", "concurrency_per_key"}


class Sampler:
    """Counts the running jobs per queue and key from a connection of its own, every few ms."""

    def __init__(self, url: URL, queue: str) -> None:
        self.engine = create_engine(url)
        self.queue = queue
        self.found: list[str] = []
        self.samples = 0
        #: The most running jobs seen at once (the limit must have been reached).
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = text(
            "SELECT limit_key, count(*) FROM watchdog_jobs WHERE queue_name = :q AND state = 'running' GROUP BY limit_key"
        )
        while not self._stop.is_set():
            try:
                with self.engine.connect() as conn:
                    counts: dict[str | None, int] = {key: n for key, n in conn.execute(query, {"q": self.queue})}
            except Exception:
                time.sleep(0.01)
                continue
            self.samples += 1
            self.peak = max(self.peak, sum(counts.values()))
            if sum(counts.values()) > CONCURRENCY or any(n > PER_KEY for key, n in counts.items() if key):
                self.found.append(repr(counts))
            time.sleep(0.003)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.engine.dispose()


#: The dialects whose connections the tests cut (SQLite has none to cut).
CUT_OFF = ("postgresql", "mariadb")


def _terminate_backends(engine: Engine) -> int:
    """Cut every other connection to this database: PostgreSQL's
    ``pg_terminate_backend``, MariaDB's ``KILL CONNECTION``; how many."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).all()
            )
        killed = 0
        ids = conn.execute(
            text("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()")
        ).scalars()
        for thread_id in list(ids):
            try:
                conn.exec_driver_sql(f"KILL CONNECTION {int(thread_id)}")
                killed += 1
            except DBAPIError as error:
                if "Unknown thread id" not in str(error.orig):  # gone by itself meanwhile
                    raise
        return killed


@pytest.fixture
def limited(instrumented: Engine) -> Iterator[Engine]:
    """The instrumented engine (the fault tests' transition log), the limit
    audit installed and queue ``chaos`` limited."""
    engine = instrumented
    install_audit(engine)
    Watchdog(engine).set_limits("chaos", concurrency=CONCURRENCY, concurrency_per_key=PER_KEY)
    yield engine


def test_limits_hold_across_processes_killed_frozen_and_cut_off(
    limited: Engine, db_url: URL, workers: WorkerPool, dialect: str
) -> None:
    engine = limited
    pg = dialect == "postgresql"
    cut = dialect in CUT_OFF
    processes, threads, total = (5, 4, 400) if pg else (3, 3, 150)
    ids = [f"limited-{i:04d}" for i in range(total)]
    enqueue_jobs(
        engine,
        [
            Job(j, "chaos", key=f"key-{i % KEYS}", max_recoveries=5, payload={"action": "sleep", "seconds": 0.03})
            for i, j in enumerate(ids)
        ],
    )
    lease = 3
    timing: dict[str, object] = {
        "queue": "chaos",
        "concurrency": threads,
        "lease": lease,
        "heartbeat": 0.5,
        "poll": 0.1,
    }
    timing["log_level"] = "WARNING"

    def settled() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE state = 'settled'")).scalar_one())

    with Sampler(engine.url, "chaos") as sampler:
        pool = [workers.start(db_url, f"w{i}", **timing) for i in range(processes)]
        wait_until(lambda: settled() >= total // 4, timeout=300, what="a quarter of the jobs", interval=0.1)
        pool[0].send(signal.SIGKILL)  # its running jobs count until recovery
        pool[0].wait(30)
        pool.append(workers.start(db_url, "replacement", **timing))
        wait_until(lambda: settled() >= total // 2, timeout=300, what="half of the jobs", interval=0.1)
        pool[1].send(signal.SIGSTOP)  # frozen past its lease: recovered while its handlers "run"
        if cut:
            assert _terminate_backends(engine) > 0  # every connection of every worker cut at once
        time.sleep(lease + 1.5)
        pool[1].send(signal.SIGCONT)
        if cut:
            _terminate_backends(engine)
        wait_until(lambda: settled() == total, timeout=480, what="every job to settle", interval=0.2)

    for worker in pool[1:]:
        worker.send(signal.SIGTERM)
    for worker in pool[1:]:
        assert worker.wait(60) == 0, worker.log_text()[-3000:]
    assert audit_findings(engine) == []
    assert sampler.found == [] and sampler.samples > 50
    assert sampler.peak == CONCURRENCY  # the workers' 16+ slots pressed against the limit
    rows = assert_settled_exactly_once(engine, ids)
    assert {row["outcome"] for row in rows.values()} == {"completed"}


# -- rates ---------------------------------------------------------------------------

RATE_COUNT = 6
RATE_PERIOD_MS = 1000

#: PostgreSQL: every start (a job made ``running``) and every rate-log row,
#: each with the transaction that wrote it -- rolled back with it, kept when
#: the claimers delete the log rows out of the window.
_PG_RATE_AUDIT = [
    "CREATE TABLE IF NOT EXISTS rate_starts (txid bigint, queue_name text, limit_key text)",
    "CREATE TABLE IF NOT EXISTS rate_logs (txid bigint, queue_name text, claimed_at bigint, jobs int, limit_key text)",
    """CREATE OR REPLACE FUNCTION rate_start_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rate_starts VALUES (txid_current(), NEW.queue_name, NEW.limit_key);
    RETURN NULL;
END $$""",
    """CREATE OR REPLACE FUNCTION rate_log_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rate_logs VALUES (txid_current(), NEW.queue_name, NEW.claimed_at, NEW.jobs, NEW.limit_key);
    RETURN NULL;
END $$""",
    "DROP TRIGGER IF EXISTS rate_start_audit ON watchdog_jobs",
    "CREATE TRIGGER rate_start_audit AFTER UPDATE OF state ON watchdog_jobs FOR EACH ROW"
    " WHEN (NEW.state = 'running' AND OLD.state IS DISTINCT FROM 'running') EXECUTE FUNCTION rate_start_audit()",
    "DROP TRIGGER IF EXISTS rate_log_audit ON watchdog_limit_claims",
    "CREATE TRIGGER rate_log_audit AFTER INSERT ON watchdog_limit_claims FOR EACH ROW EXECUTE FUNCTION rate_log_audit()",
]


#: SQLite: every start and every rate-log row in one table, in write order.
#: Writers take turns on SQLite's lock and a limited claim starts its jobs
#: before it logs them, so each claim's events are one run of starts followed
#: by its log rows (a rolled-back claim's events go with it).
_SQLITE_RATE_AUDIT = [
    "CREATE TABLE IF NOT EXISTS rate_events (id INTEGER PRIMARY KEY, kind text, queue_name text,"
    " limit_key text, claimed_at integer, jobs integer)",
    "CREATE TRIGGER IF NOT EXISTS rate_start_audit AFTER UPDATE OF state ON watchdog_jobs"
    " WHEN NEW.state = 'running' AND OLD.state <> 'running' BEGIN"
    " INSERT INTO rate_events (kind, queue_name, limit_key) VALUES ('start', NEW.queue_name, NEW.limit_key); END",
    "CREATE TRIGGER IF NOT EXISTS rate_log_audit AFTER INSERT ON watchdog_limit_claims BEGIN"
    " INSERT INTO rate_events (kind, queue_name, limit_key, claimed_at, jobs)"
    " VALUES ('log', NEW.queue_name, NEW.limit_key, NEW.claimed_at, NEW.jobs); END",
]


#: MariaDB: as on SQLite, one table in write order, each event with the
#: connection that wrote it. MariaDB has no transaction id a trigger could
#: read reliably (``information_schema.INNODB_TRX`` is a cache refreshed at
#: most every 0.1 s), but a queue's limited claims take turns on its limits
#: row, held until each commits: a claim's events are one run of starts
#: followed by its log rows, of one connection (the ids of ``AUTO_INCREMENT``
#: are taken in write order; a rolled-back claim's events go with it).
_MYSQL_RATE_AUDIT = [
    "CREATE TABLE IF NOT EXISTS rate_events (id INTEGER AUTO_INCREMENT PRIMARY KEY, conn BIGINT, kind TEXT,"
    " queue_name TEXT, limit_key TEXT, claimed_at BIGINT, jobs INT)",
    "DROP TRIGGER IF EXISTS rate_start_audit",
    "CREATE TRIGGER rate_start_audit AFTER UPDATE ON watchdog_jobs FOR EACH ROW"
    " BEGIN IF NEW.state = 'running' AND OLD.state <> 'running' THEN"
    " INSERT INTO rate_events (conn, kind, queue_name, limit_key)"
    " VALUES (CONNECTION_ID(), 'start', NEW.queue_name, NEW.limit_key); END IF; END",
    "DROP TRIGGER IF EXISTS rate_log_audit",
    "CREATE TRIGGER rate_log_audit AFTER INSERT ON watchdog_limit_claims FOR EACH ROW"
    " INSERT INTO rate_events (conn, kind, queue_name, limit_key, claimed_at, jobs)"
    " VALUES (CONNECTION_ID(), 'log', NEW.queue_name, NEW.limit_key, NEW.claimed_at, NEW.jobs)",
]


def install_rate_audit(engine: Engine) -> None:
    with engine.begin() as conn:
        for ddl in _of_dialect(engine, _PG_RATE_AUDIT, _SQLITE_RATE_AUDIT, _MYSQL_RATE_AUDIT):
            conn.exec_driver_sql(ddl)


def _ordered_rate_events(
    engine: Engine, queue: str
) -> tuple[list[tuple[object, str | None, int]], list[tuple[object, int, int, str | None]]]:
    """The audited starts and log rows of ``queue`` on SQLite or MariaDB,
    each named by its claim: a start after a log row, or an event of another
    connection (MariaDB), begins the next claim."""
    mariadb = engine.dialect.name != "sqlite"
    with engine.connect() as conn:
        events = conn.execute(
            text(
                f"SELECT {'conn' if mariadb else '0'}, kind, limit_key, claimed_at, jobs FROM rate_events"
                " WHERE queue_name = :q ORDER BY id"
            ),
            {"q": queue},
        ).all()
    starts: list[tuple[object, str | None, int]] = []
    logs: list[tuple[object, int, int, str | None]] = []
    claim, previous, previous_conn = 0, "log", None
    for connection, kind, key, at, jobs in events:
        if connection != previous_conn or (kind == "start" and previous == "log"):
            claim += 1
        if kind == "start":
            starts.append((claim, key, 1))
        else:
            logs.append((claim, int(at), int(jobs), key))
        previous, previous_conn = kind, connection
    return starts, sorted(logs, key=lambda log: log[1])


def rate_findings(
    engine: Engine, queue: str, count: int, period_ms: int, *, per_key: bool = False
) -> tuple[list[str], int]:
    """What breaks the rate in the audit, and the most starts seen in one window:
    every transaction that started jobs of ``queue`` logged exactly that many
    (so the log the claims count is complete), and no window of ``period_ms``
    on the database clock holds more than ``count`` logged starts -- of the
    queue, or with ``per_key`` of any one key (each transaction's starts then
    logged per key)."""
    if engine.dialect.name != "postgresql":
        ordered_starts, ordered_logs = _ordered_rate_events(engine, queue)
        return window_findings(ordered_starts, ordered_logs, count, period_ms, per_key=per_key)
    with engine.connect() as conn:
        starts = conn.execute(
            text("SELECT txid, limit_key, count(*) FROM rate_starts WHERE queue_name = :q GROUP BY txid, limit_key"),
            {"q": queue},
        ).all()
        logs = conn.execute(
            text("SELECT txid, claimed_at, jobs, limit_key FROM rate_logs WHERE queue_name = :q ORDER BY claimed_at"),
            {"q": queue},
        ).all()
    return window_findings(
        [(txid, key, int(n)) for txid, key, n in starts],
        [(txid, at, jobs, key) for txid, at, jobs, key in logs],
        count,
        period_ms,
        per_key=per_key,
    )


def window_findings(
    starts: list[tuple[object, str | None, int]],
    logs: list[tuple[object, int, int, str | None]],
    count: int,
    period_ms: int,
    *,
    per_key: bool = False,
) -> tuple[list[str], int]:
    """:func:`rate_findings` over audited ``starts`` ``(claim, key, jobs)`` and
    log rows ``(claim, claimed_at, jobs, key)``, each claim named by whatever
    identifies its transaction."""
    found: list[str] = []
    started: dict[tuple[object, str | None], int] = {}
    for claim, key, jobs in starts:
        group = (claim, key if per_key else None)
        started[group] = started.get(group, 0) + jobs
    logged: dict[tuple[object, str | None], int] = {}
    for claim, _at, jobs, key in logs:
        group = (claim, key)
        logged[group] = logged.get(group, 0) + jobs
    if logged != started:
        found.append(
            f"starts not logged in their transaction: {sorted(set(started.items()) ^ set(logged.items()), key=repr)}"
        )
    peak = 0
    for _claim, at, _jobs, key in logs:  # the window (at - period, at], ending at each logged claim
        if per_key and key is None:
            continue  # unkeyed jobs: no per-key rate binds them
        inside = sum(
            jobs
            for _c, other, jobs, other_key in logs
            if at - period_ms < other <= at and (not per_key or other_key == key)
        )
        peak = max(peak, inside)
        if inside > count:
            found.append(f"{inside} starts{f' of {key}' if per_key else ''} in the {period_ms} ms up to {at}")
    return found, peak


def test_the_rate_audit_sees_an_excess_and_an_unlogged_start(engine: Engine) -> None:
    """The rate audit can fail: starts over the rate, and a start without its log row."""
    install_rate_audit(engine)
    watchdog = Watchdog(engine)
    watchdog.enqueue([Job(f"j{i}", "q") for i in range(3)])
    watchdog.set_limits("q", rate=Rate(1, timedelta(seconds=1)))
    with engine.begin() as conn:
        _make_running(conn, "j0", "j1")
        conn.execute(text("INSERT INTO watchdog_limit_claims (queue_name, claimed_at, jobs) VALUES ('q', 5000, 2)"))
    assert rate_findings(engine, "q", 1, 1000) == (["2 starts in the 1000 ms up to 5000"], 2)
    with engine.begin() as conn:
        _make_running(conn, "j2")
    found, _peak = rate_findings(engine, "q", 1, 1000)
    assert any(finding.startswith("starts not logged") for finding in found)


def test_the_per_key_rate_audit_sees_a_keys_excess_and_a_start_logged_under_another_key(engine: Engine) -> None:
    install_rate_audit(engine)
    watchdog = Watchdog(engine)
    watchdog.enqueue([Job(f"{key}{i}", "q", key=key) for key in "ab" for i in range(2)])
    watchdog.set_limits("q", rate_per_key=Rate(1, timedelta(seconds=1)))
    with engine.begin() as conn:  # one start of each key, logged per key: within the rate
        _make_running(conn, "a0", "b0")
        conn.execute(
            text(
                "INSERT INTO watchdog_limit_claims (queue_name, claimed_at, jobs, limit_key)"
                " VALUES ('q', 5000, 1, 'a'), ('q', 5000, 1, 'b')"
            )
        )
    assert rate_findings(engine, "q", 1, 1000, per_key=True) == ([], 1)
    with engine.begin() as conn:  # a second start of a, logged as b's
        _make_running(conn, "a1")
        conn.execute(
            text(
                "INSERT INTO watchdog_limit_claims (queue_name, claimed_at, jobs, limit_key) VALUES ('q', 5500, 1, 'b')"
            )
        )
    found, peak = rate_findings(engine, "q", 1, 1000, per_key=True)
    assert any(finding.startswith("starts not logged") for finding in found)
    assert "2 starts of b in the 1000 ms up to 5500" in found and peak == 2


@pytest.mark.parametrize("per_key", [False, True], ids=["rate", "rate_per_key"])
def test_a_rate_holds_across_processes_killed_frozen_and_cut_off(
    instrumented: Engine, db_url: URL, workers: WorkerPool, per_key: bool, dialect: str
) -> None:
    """A rate-limited queue (6 starts a second) drained by racing worker
    processes while one is SIGKILLed, one frozen past its lease (its jobs
    recovered and started again) and every connection cut: every start is
    logged by the claim that made it, and no window of the period on the
    database clock holds more than the rate -- though the workers' slots
    press on it (some window holds exactly 6). ``rate_per_key``: the same
    rate for each of 3 keys (and their jobs mixed with unkeyed ones, which
    it does not bind): no key's window holds more than 6 starts. SQLite:
    three racing processes on one file, one SIGKILLed and one frozen (no
    connection to cut)."""
    engine = instrumented
    pg = dialect == "postgresql"
    cut = dialect in CUT_OFF
    install_rate_audit(engine)
    rate = Rate(RATE_COUNT, timedelta(milliseconds=RATE_PERIOD_MS))
    total = 90
    ids = [f"paced-{i:04d}" for i in range(total)]
    keys: list[str | None] = [None]
    if per_key:
        Watchdog(engine).set_limits("paced", rate_per_key=rate)
        total = 150
        ids = [f"paced-{i:04d}" for i in range(total)]
        keys = ["k0", "k1", "k2", None, "k0", "k1", "k2"]  # unkeyed ones are not bound by it
    else:
        Watchdog(engine).set_limits("paced", rate=rate)
    enqueue_jobs(
        engine,
        [
            Job(j, "paced", key=keys[i % len(keys)], max_recoveries=5, payload={"action": "sleep", "seconds": 0.01})
            for i, j in enumerate(ids)
        ],
    )
    lease = 3
    timing: dict[str, object] = {"queue": "paced", "concurrency": 3, "lease": lease, "heartbeat": 0.5, "poll": 0.05}
    timing["log_level"] = "WARNING"

    def settled() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE state = 'settled'")).scalar_one())

    pool = [workers.start(db_url, f"w{i}", **timing) for i in range(4 if pg else 3)]
    wait_until(lambda: settled() >= total // 4, timeout=300, what="a quarter of the jobs", interval=0.1)
    pool[0].send(signal.SIGKILL)
    pool[0].wait(30)
    pool.append(workers.start(db_url, "replacement", **timing))
    wait_until(lambda: settled() >= total // 2, timeout=300, what="half of the jobs", interval=0.1)
    pool[1].send(signal.SIGSTOP)
    if cut:
        assert _terminate_backends(engine) > 0
    time.sleep(lease + 1.5)
    pool[1].send(signal.SIGCONT)
    if cut:
        _terminate_backends(engine)
    wait_until(lambda: settled() == total, timeout=480, what="every job to settle", interval=0.2)
    for worker in pool[1:]:
        worker.send(signal.SIGTERM)
    for worker in pool[1:]:
        assert worker.wait(60) == 0, worker.log_text()[-3000:]
    found, peak = rate_findings(engine, "paced", RATE_COUNT, RATE_PERIOD_MS, per_key=per_key)
    assert found == []
    assert peak == RATE_COUNT  # the workers pressed against the rate
    rows = assert_settled_exactly_once(engine, ids)
    assert {row["outcome"] for row in rows.values()} == {"completed"}
