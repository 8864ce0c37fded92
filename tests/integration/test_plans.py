"""Query plans: every statement of the store reads the index it was built for.

One table, :data:`PLANS`, names for each statement builder (and each of its
variants) the index the database must use on ``watchdog_jobs``. Each case is
explained against a table seeded server-side with the shapes a long-lived
queue has -- a large settled history (some of it cancelled, some reruns,
some from before w0004 without ``settled_at``), jobs delayed far into the
future, a backlog of queued jobs over many queues and lanes, running jobs
with live and expired leases, a paused queue -- and then ``ANALYZE``d, so
the planner's choice is the one it makes in production, not one forced by
an empty table.

* PostgreSQL: ``EXPLAIN (FORMAT JSON)`` of the exact SQL and parameters the
  store sends (caught on their way to the driver): the plan of a statement's
  first executions. And the plan of its sixth execution as a server-side
  prepared statement -- psycopg prepares a statement after its fifth
  execution on a connection, and PostgreSQL's plan cache then switches to
  the generic plan if that one looks no dearer than the custom ones had: the
  statement is ``PREPARE``d and executed five times (in a transaction rolled
  back afterwards) before ``EXPLAIN EXECUTE``. And its generic plan
  (``plan_cache_mode = force_generic_plan``), which the plan cache may switch
  to at any later execution. All three must use the index, and none may
  ``Seq Scan`` the jobs table.
* SQLite: ``EXPLAIN QUERY PLAN`` of the same, which must name the index
  (``USING INDEX`` / ``USING COVERING INDEX`` / ``USING INTEGER PRIMARY
  KEY``) and never ``SCAN`` the jobs table without one.

A statement that stops using its index (a predicate no longer implying a
partial index's, a dropped or reordered index, a literal turned into a bound
parameter) fails here by name. ``INSERT ... ON CONFLICT`` is checked by the
arbiter index PostgreSQL reports for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from psycopg import sql as psycopg_sql
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Decision, Watchdog, metadata, store
from sqlalchemy_watchdog.backends import backend_of
from sqlalchemy_watchdog.store import (
    chart_sql,
    claims_sql,
    dependencies_sql,
    enqueue_sql,
    job_signals_sql,
    job_steps_sql,
    limits_sql,
    maintenance_sql,
    sql,
    unique_sql,
    views,
)
from tests.conftest import prepared_claims

TABLE = "watchdog_jobs"
#: The integer primary key (SQLite's rowid; PostgreSQL's pk index).
PK = "pk"
#: A write that reaches rows by their address (PostgreSQL's TID scan), not through an index.
TID = "tid"
NOW = int(time.time() * 1000)

# -- the seed ----------------------------------------------------------------------

#: Rows per shape, per dialect: large enough that a scan of the history costs
#: the planner far more than any index (SQLite's planner reads sqlite_stat1).
SIZES = {
    "postgresql": {
        "settled": 200_000, "delayed": 20_000, "queued": 5_000, "backlog": 20_000, "running": 200, "keys": 2_000,
        "waiting": 2_000,
    },
    "sqlite": {
        "settled": 20_000, "delayed": 2_000, "queued": 500, "backlog": 2_000, "running": 40, "keys": 500,
        "waiting": 200,
    },
}  # fmt: skip
QUEUES = 50
LANES = 2_000
PAUSED_QUEUE = "q1"
#: Revision w0014: the jobs waiting for their parents.
WAITING = "ix_watchdog_jobs_waiting"
#: One queue with a backlog much larger than the others' (a runner's claim reads one queue).
BACKLOG_QUEUE = "big"
#: A limited queue whose jobs have keys (revision w0011).
KEYED_QUEUE = "keyed"


def _numbers(dialect: str, rows: int) -> tuple[str, str]:
    """A WITH prefix and a FROM clause yielding ``n`` = 1..rows."""
    if dialect == "postgresql":
        return "", f"generate_series(1, {rows}) AS g(n)"
    return f"WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows}) ", "g"


def seed_statements(dialect: str) -> list[str]:
    """The INSERTs that fill the table: settled history, delayed, queued, running, a pause."""
    size = SIZES[dialect]
    s, d, q, r = size["settled"], size["delayed"], size["queued"], size["running"]
    step = 30 * 86_400_000 // s
    out = []
    with_, source = _numbers(dialect, s)
    # Settled over the last 30 days, oldest first: one in 20 failed, one in 20
    # cancelled (with a cancellation_id), one in 100 a rerun, one in 200 from
    # before w0004 (no settled_at).
    out.append(
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, outcome,"
        " claim_token, cancellation_id, rerun_of, enqueued_at, started_at, settled_at)"
        " SELECT 's-' || n, 'q' || (n % {QUEUES}), 'l' || (n % {LANES}), 0, '{{\"i\": 1}}', 'settled',"
        " CASE WHEN n % 20 = 0 THEN 'failed' WHEN n % 20 = 1 THEN 'cancelled' ELSE 'completed' END,"
        " 't-' || n, CASE WHEN n % 20 = 1 THEN 'c-' || n END, CASE WHEN n % 100 = 7 THEN 's-' || (n - 1) END,"
        f" {NOW} - ({s} - n) * CAST({step} AS BIGINT) - 2000, {NOW} - ({s} - n) * CAST({step} AS BIGINT) - 1000,"
        f" CASE WHEN n % 200 = 3 THEN NULL ELSE {NOW} - ({s} - n) * CAST({step} AS BIGINT) END"
        f" FROM {source}".format(QUEUES=QUEUES, LANES=LANES)
    )
    with_, source = _numbers(dialect, d)
    out.append(
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, run_at, ready_at,"
        " enqueued_at)"
        f" SELECT 'd-' || n, 'q' || (n % {QUEUES}), 'l' || (n % {LANES}), 0, '{{}}', 'delayed',"
        f" {NOW} + 86400000 + n * 1000, {NOW} + 86400000 + n * 1000, {NOW} FROM {source}"
    )
    with_, source = _numbers(dialect, q)
    out.append(
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"
        f" SELECT 'qd-' || n, 'q' || (n % {QUEUES}), 'l' || (n % {LANES}), n % 3, '{{}}', 'queued',"
        f" {NOW} - ({q} - n) * 10 FROM {source}"
    )
    with_, source = _numbers(dialect, size["backlog"])
    out.append(
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"
        f" SELECT 'b-' || n, '{BACKLOG_QUEUE}', '{BACKLOG_QUEUE}', 0, '{{}}', 'queued', {NOW} FROM {source}"
    )
    with_, source = _numbers(dialect, r)
    # Running: even ones hold a live lease, odd ones an expired one.
    out.append(
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, claim_token,"
        " lease_until, enqueued_at, started_at)"
        f" SELECT 'r-' || n, 'q' || (n % {QUEUES}), 'l' || (n % {LANES}), 0, '{{}}', 'running', 'rt-' || n,"
        f" CASE WHEN n % 2 = 0 THEN {NOW} + 600000 ELSE {NOW} - 600000 END, {NOW}, {NOW} FROM {source}"
    )
    out.append(
        f"INSERT INTO watchdog_queue_pauses (queue_name, reason, paused_at) VALUES ('{PAUSED_QUEUE}', NULL, {NOW})"
    )
    # A limited queue of keyed jobs (revision w0011): three queued jobs per key, one running in one key in ten.
    with_, source = _numbers(dialect, size["keys"] * 3)
    out.append(
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, enqueued_at, limit_key)"
        f" SELECT 'kq-' || n, '{KEYED_QUEUE}', '{KEYED_QUEUE}', n % 2, '{{}}', 'queued', {NOW},"
        f" 'k' || (n % {size['keys']}) FROM {source}"
    )
    with_, source = _numbers(dialect, size["keys"] // 10)
    out.append(
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, claim_token,"
        " lease_until, enqueued_at, started_at, limit_key)"
        f" SELECT 'kr-' || n, '{KEYED_QUEUE}', '{KEYED_QUEUE}', 0, '{{}}', 'running', 'krt-' || n, {NOW} + 600000,"
        f" {NOW}, {NOW}, 'k' || (n * 10) FROM {source}"
    )
    out.append(
        "INSERT INTO watchdog_limits (queue_name, concurrency, concurrency_per_key, updated_at)"
        f" VALUES ('{KEYED_QUEUE}', 1000, 1, {NOW})"
    )
    # Jobs waiting for a parent (revision w0012; their own index since w0014).
    with_, source = _numbers(dialect, size["waiting"])
    out.append(
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, enqueued_at,"
        " waiting_on, after_policy)"
        f" SELECT 'w-' || n, 'q' || (n % {QUEUES}), 'l' || (n % {LANES}), 0, '{{}}', 'waiting', {NOW}, 1,"
        f" 'completed' FROM {source}"
    )
    return out


#: Where the statement builders live: the shared module and each store feature's own.
STATEMENT_MODULES: tuple[ModuleType, ...] = (
    sql,
    enqueue_sql,
    claims_sql,
    limits_sql,
    maintenance_sql,
    dependencies_sql,
    chart_sql,
    unique_sql,
    job_steps_sql,
    job_signals_sql,
)


def builder_named(name: str) -> Any:
    """The statement builder ``name``, from whichever statement module defines it."""
    found = [vars(module)[name] for module in STATEMENT_MODULES if name in vars(module)]
    assert found, f"no statement builder {name!r}"
    return found[0]


@dataclass
class Planned:
    dialect: str
    engine: Engine


def _seed(engine: Engine, dialect: str) -> None:
    metadata.create_all(engine)
    with engine.begin() as conn:
        for statement in seed_statements(dialect):
            # No parameters: psycopg still reads "%" as a placeholder's start.
            conn.exec_driver_sql(statement.replace("%", "%%") if dialect == "postgresql" else statement)
    if dialect == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"VACUUM (ANALYZE) {TABLE}")
            conn.exec_driver_sql("VACUUM (ANALYZE) watchdog_queue_pauses")
    else:
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def planned(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planned]:
    """A seeded, analysed table on one dialect, shared by every case of the module."""
    dialect: str = request.param
    if dialect == "sqlite":
        path = tmp_path_factory.mktemp("plans") / "plans.db"
        engine = create_engine(f"sqlite:///{path}")
        _seed(engine, dialect)
        yield Planned(dialect, engine)
        engine.dispose()
        return
    with own_database(request.getfixturevalue("postgres_server")) as engine:
        _seed(engine, dialect)
        yield Planned(dialect, engine)


@contextlib.contextmanager
def own_database(server: URL) -> Iterator[Engine]:
    """An engine on a PostgreSQL database of its own on ``server``, dropped afterwards."""
    name = f"watchdog_plans_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine = create_engine(server.set(database=name))
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


# -- catching the statement on its way to the driver -------------------------------------


class _Caught(Exception):
    def __init__(self, statement: str, parameters: Any) -> None:
        super().__init__(statement)
        self.statement = statement
        self.parameters = parameters


def sent(engine: Engine, statement: Any, params: dict[str, Any]) -> tuple[str, Any]:
    """The SQL and driver parameters ``conn.execute(statement, params)`` sends, not executed."""

    def catch(conn: Any, cursor: Any, sql_text: str, parameters: Any, context: Any, many: bool) -> None:
        raise _Caught(sql_text, parameters)

    event.listen(engine, "before_cursor_execute", catch)
    try:
        with engine.connect() as conn:
            try:
                conn.execute(statement, params)
            except _Caught as caught:
                return caught.statement, caught.parameters
            raise AssertionError("the statement never reached the driver")
    finally:
        event.remove(engine, "before_cursor_execute", catch)


# -- reading plans -----------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a plan does to the jobs table: the indexes it reads, whether it scans
    the table whole, and whether it sorts rows it read from it."""

    indexes: frozenset[str]
    full_scan: bool
    sorts: bool
    text: str


_PK_NAMES = {"pk_watchdog_jobs": PK}


def _pg_plan(document: Any) -> Plan:
    indexes: set[str] = set()
    full_scan = False
    sorts = False

    def reads_jobs(node: dict[str, Any]) -> bool:
        """Whether ``node`` reads the jobs table other than through a LIMIT:
        sorting the few rows that limited reads return is not sorting the table."""
        if node["Node Type"] == "Limit":
            return False
        return node.get("Relation Name") == TABLE or any(reads_jobs(child) for child in node.get("Plans", []))

    def walk(node: dict[str, Any]) -> None:
        nonlocal full_scan, sorts
        if "Index Name" in node:
            indexes.add(_PK_NAMES.get(node["Index Name"], node["Index Name"]))
        elif node.get("Relation Name") == TABLE and node["Node Type"] == "Tid Scan":
            indexes.add(TID)
        elif node.get("Relation Name") == TABLE and node["Node Type"] == "Seq Scan":
            full_scan = True
        if node["Node Type"] in ("Sort", "Incremental Sort") and reads_jobs(node):
            sorts = True
        for arbiter in node.get("Conflict Arbiter Indexes", []):
            indexes.add(f"arbiter:{arbiter}")
        for child in node.get("Plans", []):
            walk(child)

    walk(document[0]["Plan"])
    return Plan(frozenset(indexes), full_scan, sorts, json.dumps(document, indent=1))


def pg_first_plan(engine: Engine, statement: str, parameters: Any) -> Plan:
    """The plan of the statement's first executions (a custom plan for these parameters)."""
    with engine.connect() as conn:
        document = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters).scalar_one()
        conn.rollback()
    return _pg_plan(document)


_PYFORMAT = re.compile(r"%\((\w+)\)s|%%")
#: Executions of a prepared statement before PostgreSQL's plan cache weighs the generic plan.
CUSTOM_PLANS = 5


def pg_cached_plan(engine: Engine, statement: str, parameters: dict[str, Any], *, generic: bool = False) -> Plan:
    """The plan the sixth execution of ``statement``, prepared server-side, runs
    (``generic``: the generic plan, which the plan cache may switch to at any
    later execution once it judges it no dearer than the custom ones)."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%%"
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    prepared = _PYFORMAT.sub(number, statement)
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        # EXECUTE's arguments take no type from the prepared statement's: send literals.
        arguments = ", ".join(psycopg_sql.Literal(parameters[name]).as_string(raw) for name in numbers)
        execute = "EXECUTE watchdog_plan" + (f"({arguments})" if numbers else "")
        if generic:
            conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql("PREPARE watchdog_plan AS " + prepared)
        for _ in range(CUSTOM_PLANS):
            conn.exec_driver_sql(execute.replace("%", "%%"))
        document = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + execute.replace("%", "%%")).scalar_one()
        conn.rollback()
        conn.exec_driver_sql("DEALLOCATE watchdog_plan")
    return _pg_plan(document)


_SQLITE_INDEX = re.compile(r"USING (?:COVERING )?INDEX (\w+)")


def sqlite_plan(engine: Engine, statement: str, parameters: Any, table: str = TABLE) -> Plan:
    """What the plan of ``statement`` does to ``table`` (the jobs table unless said)."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
        conn.rollback()
    indexes: set[str] = set()
    full_scan = False
    # A sort counts when the query it sorts for reads the jobs table itself (its
    # rows share a parent), not when it sorts the few rows of limited subqueries.
    sorting: set[int] = set()
    reading: set[int] = set()
    for row in rows:
        detail = row[-1]
        if "USE TEMP B-TREE FOR" in detail and "ORDER BY" in detail:
            sorting.add(row[1])
        words = detail.split()
        # SQLite names the jobs table by its alias where a statement gives one (the settle's ``j``).
        names = {table, "j"} if table == TABLE else {table}
        if words[:1] not in (["SCAN"], ["SEARCH"]) or len(words) < 2 or words[1] not in names:
            continue
        reading.add(row[1])
        found = _SQLITE_INDEX.search(detail)
        if found:
            indexes.add(found.group(1))
        elif "USING INTEGER PRIMARY KEY" in detail:
            indexes.add(PK)
        elif detail.startswith("SCAN"):
            full_scan = True
    return Plan(frozenset(indexes), full_scan, bool(sorting & reading), "\n".join(str(tuple(row)) for row in rows))


# -- the table of expected plans -------------------------------------------------------------

Params = Callable[[str], dict[str, Any]]


def _none(dialect: str) -> dict[str, Any]:
    return {}


def _enqueue(dialect: str) -> dict[str, Any]:
    rows = [("new-1", "q3", "l3", 0, "{}", None, None, None, None, None, None, None)]
    return sql.rows_params(backend_of(dialect), "jobs", sql.ENQUEUE_FIELDS, rows)


def _enqueue_one(dialect: str) -> dict[str, Any]:
    return sql.row_params("job", sql.ENQUEUE_FIELDS, ("new-1", "q3", "l3", 0, "{}"))


def _settle(count: int) -> Params:
    def params(dialect: str) -> dict[str, Any]:
        rows = [(f"r-{n}", f"rt-{n}", "completed", None, None, None, 0, 0, None) for n in range(2, 2 + 2 * count, 2)]
        return {"now": NOW, **sql.rows_params(backend_of(dialect), "settles", sql.SETTLE_FIELDS, rows)}

    return params


def _claims(dialect: str) -> dict[str, Any]:
    return {"claims": [("r-2", "rt-2"), ("r-4", "rt-4")], "now": NOW, "lease_ms": 60_000}


def _claim(queues: list[str] | None, limit: int = 1) -> Params:
    def params(dialect: str) -> dict[str, Any]:
        values: dict[str, Any] = {"token": "tok", "lease_ms": 60_000, "limit": limit}
        if queues is not None:
            values.update(sql.queue_params(queues))
        return values

    return params


def _walk(dialect: str) -> dict[str, Any]:
    return {"queue": KEYED_QUEUE, "after": "k250", "walk": 40}


def _picks(dialect: str) -> dict[str, Any]:
    keys = {f"key_{i}": f"k{300 + i}" for i in range(4)}
    return {"queue": KEYED_QUEUE, "unkeyed_n": 5, "unkeyed_scan": 261, **keys, **{f"n_{i}": 5 for i in range(4)}}


def _claim_limited(dialect: str) -> dict[str, Any]:
    return {"token": "tok", "lease_ms": 60_000, "s_0": 5, "s_1": 6, "s_2": 7, "s_3": None}


def _list(**values: Any) -> Params:
    return lambda dialect: {"after_sequence": 0, "before_sequence": 2**63 - 1, "limit": 100, **values}


def _bulk(**values: Any) -> Params:
    return lambda dialect: {"after_sequence": 0, "before_sequence": 2**63 - 1, "limit": 100, **values}


PG, LITE = "postgresql", "sqlite"
JOB_ID = {PG: "uq_watchdog_jobs_job_id", LITE: "sqlite_autoindex_watchdog_jobs_1"}
CANCELLATION_ID = "uq_watchdog_jobs_cancellation_id"
DELAYED = "ix_watchdog_jobs_delayed"
SETTLED = "ix_watchdog_jobs_settled"
RERUN_OF = "ix_watchdog_jobs_rerun_of"
LEASE = "ix_watchdog_jobs_lease"
LIVE_LANE = "ix_watchdog_jobs_live_lane"
LIVE_QUEUE = "ix_watchdog_jobs_live_queue"
LANE_HISTORY = "ix_watchdog_jobs_lane_history"
KEYED_QUEUED = "ix_watchdog_jobs_keyed_queued"
KEYED_RUNNING = "ix_watchdog_jobs_keyed_running"
#: Reads the jobs table by no index, by design (see the case).
NONE = ""

# Misses this table found and that were fixed (revision w0006 and the statements):
# the one-queue claim read and sorted its queue's whole backlog (a NOT EXISTS pause
# check planned as an anti-join; on SQLite, ix_watchdog_jobs_queued_since chosen);
# has_pending_work scanned the settled history; the undated prune walked the primary
# key. A new miss goes in a case's ``xfail`` (strict) until it is fixed.


@dataclass(frozen=True)
class Case:
    """One statement, its parameters, and on each dialect the index its plan must read."""

    name: str
    #: The statement builder (its name: the coverage test checks every builder has a case).
    builder: str
    #: The builder's arguments; the string "dialect" is replaced by the dialect's backend.
    args: tuple[Any, ...]
    params: Params
    #: dialect -> the acceptable indexes on watchdog_jobs (one of them must be read);
    #: NONE: no index serves it (no full-scan check). A dialect left out: not run there.
    index: dict[str, tuple[str, ...]]
    #: The index must deliver the statement's ORDER BY (no sort of rows read from the table).
    ordered: bool = False
    #: dialect -> reason: a known miss, a strict xfail.
    xfail: tuple[tuple[str, str], ...] = ()
    #: Every index of ``index`` must be read (a statement of several parts), not one of them.
    both: bool = False

    def build(self, dialect: str) -> Any:
        args = [backend_of(dialect) if arg == "dialect" else arg for arg in self.args]
        return builder_named(self.builder)(*args)


def on(index: str | dict[str, str], *more: str | dict[str, str]) -> dict[str, tuple[str, ...]]:
    """Acceptable indexes on both dialects (a dict gives each dialect's own name)."""
    choices = [index, *more]
    return {
        dialect: tuple(choice[dialect] if isinstance(choice, dict) else choice for choice in choices)
        for dialect in (PG, LITE)
    }


D = "dialect"
PLANS: list[Case] = [
    # -- enqueue: the ON CONFLICT arbiter (SQLite's plan of an upsert does not name it)
    Case("enqueue_rows", "enqueue_rows", (D,), _enqueue, {PG: ("arbiter:uq_watchdog_jobs_job_id",)}),
    Case("enqueue_one", "enqueue_rows", (D, True), _enqueue_one, {PG: ("arbiter:uq_watchdog_jobs_job_id",)}),
    Case("stored_contents", "stored_contents", (), lambda d: {"job_ids": ["s-5", "qd-5"]}, on(JOB_ID)),
    # -- reads
    Case("read_job", "read_job", (), lambda d: {"job": "qd-5"}, on(JOB_ID)),
    Case("read_queue_head", "read_queue_head", (), lambda d: {"queue": BACKLOG_QUEUE}, on(LIVE_QUEUE)),
    Case("read_settled", "read_settled", (), lambda d: {"after_sequence": 10_000, "limit": 100}, on(PK), ordered=True),
    # Any index holding exactly the live jobs answers it at its first entry.
    Case("has_pending_work", "has_pending_work", (), _none, on(LIVE_QUEUE, LIVE_LANE)),
    # -- the claim life cycle
    # Run only on SQLite in WAL mode (a claim's read-only pre-check).
    Case("any_queued(all)", "any_queued", (False,), _none, {LITE: (LIVE_QUEUE,)}),
    Case(
        "any_queued(queues)",
        "any_queued",
        (True,),
        lambda d: {"queues": ["q3", BACKLOG_QUEUE]},
        {LITE: (LIVE_QUEUE,)},
    ),
    Case("next_ready", "next_ready", (), _none, on(DELAYED), ordered=True),
    Case("promote", "promote", (D,), lambda d: {"limit": 100}, on(DELAYED), ordered=True),
    # Every queue: no index holds every queue's queued jobs in claim order (w0008),
    # so they are read and sorted -- runners always name their queues.
    Case("claim(all queues)", "claim", (D, None), _claim(None), on(NONE)),
    # What every runner sends: the queues it has handlers for.
    Case(
        "claim(one queue)",
        "claim",
        (D, 1),
        _claim([BACKLOG_QUEUE]),
        on(LIVE_QUEUE),
        ordered=True,
    ),
    # Several queues: each read in claim order in live_queue (the backlog queue too:
    # never all its jobs), then the best of those few sorted.
    Case(
        "claim(three queues)",
        "claim",
        (D, 3),
        _claim(["q3", "q4", BACKLOG_QUEUE]),
        on(LIVE_QUEUE),
        ordered=True,
    ),
    # A batch of up to LITERAL_LIMIT_MAX jobs (every batch at the default concurrency):
    # the limit written into the text, and the update joined to the pick by address
    # -- the pick read in claim order, one TID scan per picked row.
    Case(
        "claim(one queue, a constant limit)",
        "claim",
        (D, 1, True),
        _claim([BACKLOG_QUEUE], limit=8),
        on(LIVE_QUEUE, {PG: TID, LITE: PK}),
        ordered=True,
        both=True,
    ),
    Case(
        "claim(three queues, a constant limit)",
        "claim",
        (D, 3, True),
        _claim(["q3", "q4", BACKLOG_QUEUE], limit=8),
        on(LIVE_QUEUE, {PG: TID, LITE: PK}),
        ordered=True,
        both=True,
    ),
    # By job_id, one lookup per row: never the lease index, which also holds the entries
    # of jobs settled since the last vacuum (limits_sql.settle).
    # A claimed job whose stored text is not UTF-8 (SQLite), failed by its key.
    Case("settle_unreadable", "settle_unreadable", (), lambda d: {"key": 5, "token": "t-5", "why": "x"}, on(PK)),
    Case("settle(1)", "settle", (D,), _settle(1), on(JOB_ID)),
    Case("settle(50)", "settle", (D,), _settle(50), on(JOB_ID)),
    # A batch of up to LITERAL_LIMIT_MAX rows (every batch at the default
    # concurrency): the count written into the text.
    Case("settle(1, a constant count)", "settle", (D, True), _settle(1), on(JOB_ID), both=True),
    Case("settle(8, a constant count)", "settle", (D, True), _settle(8), on(JOB_ID), both=True),
    Case("renew", "renew", (), _claims, on(JOB_ID, LEASE)),
    # The starts of jobs claimed ahead (revision w0019), found as a renewal finds its claims.
    Case("start", "start", (), _claims, on(JOB_ID, LEASE)),
    # A handler's progress, by job_id like a settle (revision w0012).
    Case(
        "progress",
        "progress",
        (),
        lambda d: {"job": "r-2", "token": "rt-2", "fraction": 0.5, "note": None, "now": NOW},
        on(JOB_ID),
    ),
    Case("release", "release", (), _claims, on(JOB_ID, LEASE)),
    Case("cancel(live)", "cancel", (False,), lambda d: {"job": "qd-5", "cancellation": "x"}, on(JOB_ID)),
    Case("cancel(not started)", "cancel", (True,), lambda d: {"job": "qd-5", "cancellation": "x"}, on(JOB_ID)),
    Case("cancellation_holder", "cancellation_holder", (), lambda d: {"cancellation": "c-21"}, on(CANCELLATION_ID)),
    # Uniqueness windows (w0020): the holder's state, a debounced or replaced waiting job.
    Case("job_state", "job_state", (), lambda d: {"job_id": "qd-5"}, on(JOB_ID)),
    Case(
        "replace_waiting",
        "replace_waiting",
        (),
        lambda d: {"holder": "qd-5", "payload": "1", "ready_at": 5},
        on(JOB_ID),
    ),
    Case(
        "replace_job",
        "replace_job",
        (),
        lambda d: {"target": "qd-5", "payload": "1", "start": None, "set_start": 0},
        on(JOB_ID),
    ),
    # Events (w0022): a signal locks its job by job_id and wakes it by sequence; a
    # waiting job's snooze wakes it by job_id; the wait's read joins by job_id.
    Case("lock_job", "lock_job", ("dialect",), lambda d: {"job": "qd-5"}, on(JOB_ID)),
    Case("wake_waiting", "wake_waiting", (), lambda d: {"seq": 5, "signal": "approved", "sent": 5}, on(PK)),
    Case("wake_snoozed", "wake_snoozed", (), lambda d: {"job": "qd-5", "signal": "approved"}, on(JOB_ID)),
    Case("read_signal", "read_signal", (), lambda d: {"job": "qd-5", "signal": "approved"}, on(JOB_ID)),
    # A lane's jobs in two parts: those given it as their lane (live_lane holds only
    # lanes other than the job's queue), and a queue's default-lane jobs (live_queue).
    # Both parts are planned whatever the lane: each must read its own index.
    Case(
        "fail_lane(own lane)",
        "fail_lane",
        (D,),
        lambda d: {"lane_name": "l3", "batch": 1000, "reason": "x"},
        {d: (LIVE_LANE, LIVE_QUEUE) for d in (PG, LITE)},
        both=True,
    ),
    Case(
        "fail_lane(a queue's default lane)",
        "fail_lane",
        (D,),
        lambda d: {"lane_name": BACKLOG_QUEUE, "batch": 100, "reason": "x"},
        {d: (LIVE_LANE, LIVE_QUEUE) for d in (PG, LITE)},
        both=True,
    ),
    Case(
        "lane_has_live_jobs(own lane)",
        "lane_has_live_jobs",
        (),
        lambda d: {"lane_name": "l3"},
        {d: (LIVE_LANE, LIVE_QUEUE) for d in (PG, LITE)},
        both=True,
    ),
    Case(
        "lane_has_live_jobs(a queue's default lane)",
        "lane_has_live_jobs",
        (),
        lambda d: {"lane_name": BACKLOG_QUEUE},
        {d: (LIVE_LANE, LIVE_QUEUE) for d in (PG, LITE)},
        both=True,
    ),
    Case("purge", "purge", (), lambda d: {"queue": "q3"}, on(LIVE_QUEUE)),
    # -- recovery
    Case("expired_claims", "expired_claims", (), lambda d: {"limit": 100}, on(LEASE), ordered=True),
    Case("next_lease_expiry", "next_lease_expiry", (), _none, on(LEASE), ordered=True),
    Case(
        "reconcile(requeue)",
        "reconcile",
        (True,),
        lambda d: {"job": "r-3", "token": "rt-3", "count": 0},
        on(JOB_ID, LEASE),
    ),
    Case(
        "reconcile(interrupt)",
        "reconcile",
        (False,),
        lambda d: {"job": "r-3", "token": "rt-3", "count": 0, "reason": "x"},
        on(JOB_ID, LEASE),
    ),
    Case(
        "reconcile_steps",
        "reconcile_steps",
        (),
        lambda d: {"job": "r-3", "token": "rt-3", "mark": "undo:"},
        on(JOB_ID),
    ),
    Case(
        "reconcile(interrupt, compensate)",
        "reconcile",
        (False, True),
        lambda d: {"job": "r-3", "token": "rt-3", "count": 0, "reason": "x", "mark": "undo:"},
        on(JOB_ID, LEASE),
    ),
    # -- operations
    Case(
        "prune(dated)",
        "prune",
        (D, False),
        lambda d: {"outcome": "completed", "age_ms": 86_400_000, "limit": 1000},
        on(SETTLED),
        ordered=True,
    ),
    Case(
        "prune(undated)",
        "prune",
        (D, True),
        lambda d: {"outcome": "completed", "limit": 1000},
        on(SETTLED),
    ),
    # list_jobs pages in admission order: the primary key, filtered (the cost its docstring states).
    Case("list_jobs()", "list_jobs", ((),), _list(), on(PK), ordered=True),
    Case("list_jobs(queue)", "list_jobs", (("queue",),), _list(queue="q3"), on(PK)),
    Case("list_jobs(state=queued)", "list_jobs", (("state=queued",),), _list(), on(PK, LIVE_QUEUE)),
    Case(
        "list_jobs(state=settled, outcome)",
        "list_jobs",
        (("state=settled", "outcome"),),
        _list(outcome="failed"),
        on(PK, SETTLED),
    ),
    # A lane, settled history included, is one range of lane_history (w0010), both ways,
    # with or without keyset bounds: never a walk of the history between its jobs. Alone,
    # read in order. With a queue, PostgreSQL takes the two for independent (here every
    # job of lane l3 is in q3), expects a handful of rows and may read the lane's range
    # as a bitmap and sort what matched: the lane's jobs, still not the history.
    *(
        Case(
            f"list_jobs({', '.join(filters)}{', newest first' if newest else ''}{', between' if bounds else ''}"
            f"{'' if ordered else ', maybe sorted'})",
            "list_jobs",
            (filters, False, newest),
            _list(lane="l3", **({"queue": "q3"} if "queue" in filters else {}), **bounds),
            {dialect: (LANE_HISTORY,) for dialect in dialects},
            ordered=ordered,
        )
        for filters, dialects, ordered in (
            (("lane",), (PG, LITE), True),
            (("queue", "lane"), (LITE,), True),
            (("queue", "lane"), (PG,), False),
        )
        for newest in (False, True)
        for bounds in ({}, {"after_sequence": 5_000, "before_sequence": 15_000})
    ),
    Case("list_jobs(job_id_prefix)", "list_jobs", (("job_id_prefix",),), _list(job_id_prefix="qd-1"), on(PK)),
    # Where job_id sorts by code point (SQLite; PostgreSQL under C / C.UTF-8, as here),
    # the store adds the prefix as a range of uq_watchdog_jobs_job_id: a prefix that
    # matches nothing, or few old jobs, reads those, not the history (newest first too).
    # PostgreSQL weighs the range by its statistics (a broad prefix walks the primary
    # key, stopping at the page); SQLite is told to read the range first.
    *(
        Case(
            f"list_jobs(job_id_prefix as a range{', newest first' if newest else ''}, {variant})",
            "list_jobs",
            (("job_id_prefix", variant), False, newest),
            _list(job_id_prefix="s-1999", job_id_low="s-1999", job_id_high="s-199:"),
            {PG: (JOB_ID[PG],)} if variant == "job_id_range" else {LITE: (JOB_ID[LITE],)},
        )
        for variant in ("job_id_range", "job_id_range_first")
        for newest in (False, True)
    ),
    Case(
        "list_jobs(job_id_prefix matching nothing, as a range)",
        "list_jobs",
        (("job_id_prefix", "job_id_range"),),
        _list(job_id_prefix="nothing-", job_id_low="nothing-", job_id_high="nothing."),
        {PG: (JOB_ID[PG],)},
    ),
    # Newest first: the primary key read backwards from the bound, in order.
    Case("list_jobs(newest first)", "list_jobs", ((), False, True), _list(), on(PK), ordered=True),
    Case(
        "list_jobs(newest first, before)",
        "list_jobs",
        ((), False, True),
        _list(before_sequence=100_000),
        on(PK),
        ordered=True,
    ),
    Case("list_jobs(newest first, queue)", "list_jobs", (("queue",), False, True), _list(queue="q3"), on(PK)),
    # Bulk actions: a batch of the selected jobs in admission order, from the
    # snapshot's newest sequence down; rerun's settled jobs by outcome and time
    # (settled) or by the primary key; cancel's live jobs by their live indexes.
    Case(
        "bulk_pick(rerun: outcomes, settled range)",
        "bulk_pick",
        (D, "rerun", ("outcomes", "settled_after", "settled_before")),
        _bulk(outcomes=["failed", "cancelled"], settled_after=NOW - 86_400_000, settled_before=NOW),
        on(SETTLED, PK),
    ),
    Case("bulk_pick(rerun: queue)", "bulk_pick", (D, "rerun", ("queue",)), _bulk(queue="q3"), on(PK)),
    Case("bulk_pick(cancel: queue)", "bulk_pick", (D, "cancel", ("queue",)), _bulk(queue="q3"), on(LIVE_QUEUE, PK)),
    Case(
        "bulk_pick(cancel: lane)",
        "bulk_pick",
        (D, "cancel", ("lane",)),
        _bulk(lane="l3"),
        on(LIVE_LANE, LIVE_QUEUE, PK),
    ),
    # SQLite answers max(rowid) from the table b-tree's last entry ("SEARCH
    # watchdog_jobs", no index to name); PostgreSQL reads the pk backwards.
    Case("newest_sequence", "newest_sequence", (), _none, {PG: (PK,)}),
    Case("live_counts", "live_counts", (), _none, on(LIVE_QUEUE)),
    Case("expired_counts", "expired_counts", (), _none, on(LEASE)),
    Case("recent_outcomes", "recent_outcomes", (), _none, on(SETTLED)),
    # The dashboard's chart: the last hour, one range per outcome.
    Case("settled_per_minute", "settled_per_minute", (), lambda d: {"since": NOW - 3_600_000}, on(SETTLED)),
    Case("reruns_of", "reruns_of", (), lambda d: {"job": "s-6"}, on(RERUN_OF)),
    Case("make_due(all)", "make_due", (False,), _none, on(DELAYED)),
    Case("make_due(queues)", "make_due", (True,), lambda d: {"queues": ["q3"]}, on(DELAYED, LIVE_QUEUE)),
    Case("waiting_jobs", "waiting_jobs", (), lambda d: {"queues": ["q3"], "limit": 10}, on(LIVE_QUEUE)),
    # A drain's account of the waiting jobs it cannot release (tests only): their parents by job_id.
    Case("waiting_for", "waiting_for", (), lambda d: {"queues": ["q3"], "limit": 10}, on(WAITING)),
    # A runner's INFO summary: its backlog, counted up to a cap through the live queue index.
    Case("count_ready", "count_ready", (), lambda d: {"queues": ["q3"], "cap": 10_000}, on(LIVE_QUEUE)),
    # -- flow control (w0011): the limited claim, and the stats of a limited queue
    Case(
        "limit_usage", "limit_usage", (D,), lambda d: {"queue": KEYED_QUEUE, "period_ms": 60_000}, on(LIVE_QUEUE, LEASE)
    ),
    # The limits row locked, and whether the queue has a queued job (its first entry in live_queue).
    Case("lock_limits", "lock_limits", (D,), lambda d: {"queue": KEYED_QUEUE}, on(LIVE_QUEUE)),
    Case("walk_keys", "walk_keys", (), _walk, on(KEYED_QUEUED)),
    Case("walk_keys(counted)", "walk_keys", (True,), _walk, on(KEYED_RUNNING)),
    Case(
        "keys_running", "keys_running", (), lambda d: {"queue": KEYED_QUEUE, "keys": ["k10", "k11"]}, on(KEYED_RUNNING)
    ),
    Case("key_picks", "key_picks", (D, 4), _picks, on(KEYED_QUEUED, LIVE_QUEUE), both=True, ordered=True),
    Case("claim_limited", "claim_limited", (4,), _claim_limited, on(PK)),
    # The whole limited claim in one statement (PostgreSQL): the walk and each key's jobs in
    # keyed_queued, the unkeyed head in live_queue; the update goes to its rows by address.
    Case(
        "claim_limited_at_once",
        "claim_limited_at_once",
        (),
        lambda d: {"queue": KEYED_QUEUE, "limit": 5, "token": "tok", "lease_ms": 60_000},
        {PG: (KEYED_QUEUED, LIVE_QUEUE)},
        both=True,
        ordered=True,
    ),
    Case("keyed_counts", "keyed_counts", (D,), lambda d: {"queue": KEYED_QUEUE}, on(LIVE_QUEUE)),
    # -- dependencies (revision w0012)
    Case("read_parents", "read_parents", (), lambda d: {"job_ids": ["r-2", "s-6"]}, on(JOB_ID)),
    # Waiting jobs (w0014): only they enter ix_watchdog_jobs_waiting, read by lane or whole.
    Case("waiting_counts", "waiting_counts", (), _none, on(WAITING)),
    Case("purge_waiting", "purge_waiting", (), lambda d: {"queue": "q3"}, on(WAITING)),
    Case(
        "fail_lane_waiting",
        "fail_lane_waiting",
        (D,),
        lambda d: {"lane_name": "l3", "batch": 100, "reason": "x"},
        on(WAITING),
    ),
    Case("lane_has_waiting_jobs", "lane_has_waiting_jobs", (), lambda d: {"lane_name": "l3"}, on(WAITING)),
    Case("bulk_pick_waiting(queue)", "bulk_pick_waiting", (("queue",),), _bulk(queue="q3"), on(WAITING)),
    Case("bulk_pick_waiting(lane)", "bulk_pick_waiting", (("lane",),), _bulk(lane="l3"), on(WAITING)),
    # The parents an enqueue gives dependents (w0013), and the late count of those settled meanwhile.
    Case("watch_parents", "watch_parents", (), lambda d: {"job_ids": ["r-2", "s-6"]}, on(JOB_ID)),
    Case("count_settled_parents", "count_settled_parents", (), lambda d: {"children": ["r-2"]}, on(JOB_ID)),
    # Jobs settled while waiting: only they enter the partial index, so a pass that finds none reads nothing.
    Case("untold", "untold", (D,), lambda d: {"limit": 100}, on("ix_watchdog_jobs_untold"), ordered=True),
    Case("told", "told", (), lambda d: {"job_ids": ["r-2", "s-6"]}, on(JOB_ID, "ix_watchdog_jobs_untold")),
    # A callback's parents: edges by the child (their primary key), each parent by job_id.
    Case("parent_results", "parent_results", (), lambda d: {"job": "r-2"}, on(JOB_ID)),
]

#: Statements that do not read the jobs table: the coverage test knows them; nothing to plan.
NOT_ON_JOBS = {
    "notify",
    "notify_room",
    "stats_clock",
    "paused_queues",
    "pause",
    "resume",
    "try_advisory_xact_lock",
    # watchdog_workers and watchdog_schedules: one row per worker, one per
    # schedule definition -- small tables, read whole or by primary key.
    "register_worker",
    "deregister_worker",
    "list_workers",
    "live_worker_queues",
    "prune_workers",
    "record_schedule",
    "list_schedules",
    "prune_schedules",
    "job_id_collation",
    # watchdog_limits and watchdog_limit_claims: one row per limited queue, about one
    # rate period of claims per queue, read by primary key or (queue, claimed_at).
    "read_limits",
    "move_cursor",
    "log_claim",
    "forget_claims",
    "forget_queue_claims",
    "set_limits",
    "clear_limits",
    "delete_limits",
    # A key's claims in its per-key window: ix_watchdog_limit_claims_keyed (w0015),
    # asserted by test_the_limited_claim_stays_flat_at_a_million_jobs_and_ten_thousand_keys.
    "keys_rate_used",
    # watchdog_job_edges (w0012): read and written by its primary key (child,
    # parent) or its index by parent, never through the jobs table.
    "insert_edges",
    "tell_dependents",
    "parents_of",
    "parents_of_children",
    "dependents_of",
    # watchdog_unique_keys (w0020): one row per key in use, read and written by its
    # primary key, by job_id (ix_watchdog_unique_keys_job_id) or pruned by until_ms
    # (ix_watchdog_unique_keys_until_ms).
    "take_fresh",
    "lock_key",
    "pass_key",
    "count_duplicate",
    "count_replacement",
    "held_by",
    "prune_ended",
    # watchdog_job_steps (w0021): read by its primary key (job_sequence, name) after the
    # job's by job_id; orphans found by the jobs' primary key (sequence).
    "read_steps",
    "forget_orphans",
    # The compensation marker recovery records (w0022): the job's row by job_id, the
    # marker looked for by the primary key.
    "mark_compensation",
    # watchdog_job_signals (w0022): read by its primary key (job_sequence, name) after the
    # job's by job_id (read_signals), or by that key alone (kept).
    "read_signals",
    "kept",
    # kept as MariaDB's locking read (LOCK IN SHARE MODE): the same primary-key lookup.
    "kept_locked",
}


#: The statements only a backend whose writes return no rows runs (MariaDB/MySQL:
#: ``Backend.writes_return_rows``): the locking reads, writes by key and reads back
#: that stand for one PostgreSQL statement (``claim_pick`` is planned inside ``claim``).
#: These plans are PostgreSQL's; MariaDB's own are not checked yet (issue 57).
BY_KEY_ONLY = {
    "insert_rows",
    "locked_contents",
    "claim_pick",
    "claim_by_key",
    "read_by_key",
    "queued_queues",
    "promote_pick",
    "promote_by_key",
    "insert_pause",
    "locked_pause",
    "delete_pause",
    "insert_key",
    "read_step",
    "tell_parents",
    "settled_parents",
    "purge_pick",
    "purge_by_key",
    "prune_pick",
    "delete_settled",
}


def test_every_statement_builder_is_planned() -> None:
    """A new statement builder in a store statement module needs a row in PLANS (or in NOT_ON_JOBS)."""
    builders = {
        name
        for module in STATEMENT_MODULES
        for name, value in vars(module).items()
        if getattr(value, "__module__", None) == module.__name__ and hasattr(value, "cache_info")
    }
    assert builders == {case.builder for case in PLANS} | NOT_ON_JOBS | BY_KEY_ONLY


#: The builders whose statements the store sends itself (``store.views.execute_rows``):
#: precompiled once, their constants written into the text.
HOT_BUILDERS = frozenset(
    {"claim", "claim_limited_at_once", "settle", "enqueue_rows", "walk_keys", "key_picks", "claim_limited"}
)


def sent_as_the_store_does(engine: Engine, case: Case) -> tuple[str, Any]:
    """The SQL and parameters the store sends for ``case``: the precompiled text of a hot
    statement on psycopg (its constants inlined), else what ``conn.execute`` sends."""
    statement, params = case.build(engine.dialect.name), case.params(engine.dialect.name)
    pre = views._precompiled(engine.dialect, statement) if case.builder in HOT_BUILDERS else None
    if pre is None or pre.native is None:
        return sent(engine, statement, params)
    values = {**pre.defaults, **params}
    if pre.sized:  # its batch size written into the text, as the store writes it
        pre = views._with_sizes(pre, values)
    return pre.text, values


def _plans(planned: Planned, case: Case) -> list[tuple[str, Plan]]:
    """The plans of ``case`` on ``planned``'s dialect, labelled."""
    dialect = planned.dialect
    statement, parameters = sent_as_the_store_does(planned.engine, case)
    if dialect == LITE:
        return [("plan", sqlite_plan(planned.engine, statement, parameters))]
    return [
        ("first executions", pg_first_plan(planned.engine, statement, parameters)),
        ("prepared, 6th execution", pg_cached_plan(planned.engine, statement, parameters)),
        ("generic plan", pg_cached_plan(planned.engine, statement, parameters, generic=True)),
    ]


def _case(name: str) -> Case:
    """The case of :data:`PLANS` named ``name``."""
    return next(case for case in PLANS if case.name == name)


def _case_param(case: Case) -> Any:
    return pytest.param(case, id=case.name)


@pytest.mark.parametrize("case", [_case_param(case) for case in PLANS])
def test_statement_uses_its_index(planned: Planned, case: Case, request: pytest.FixtureRequest) -> None:
    if planned.dialect not in case.index:
        pytest.skip(f"{case.name}: its plan names no index on {planned.dialect}")
    for dialect, reason in case.xfail:
        if dialect == planned.dialect:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    expected = case.index[planned.dialect]
    for label, plan in _plans(planned, case):
        if expected == (NONE,):
            continue
        if case.both:
            assert plan.indexes >= set(expected), (
                f"{case.name} ({label}) must read all of {expected}; it reads {sorted(plan.indexes)}:\n{plan.text}"
            )
        assert plan.indexes & set(expected), (
            f"{case.name} ({label}) reads none of {expected}; it reads {sorted(plan.indexes)}:\n{plan.text}"
        )
        assert not plan.full_scan, f"{case.name} ({label}) scans {TABLE} whole:\n{plan.text}"
        if case.ordered:
            assert not plan.sorts, f"{case.name} ({label}) sorts what it read instead of reading in order:\n{plan.text}"


@contextlib.contextmanager
def seeded_database(server: URL, *statements: str) -> Iterator[Engine]:
    """A database of its own with the model's tables, ``statements`` run in it, analysed."""
    with own_database(server) as engine:
        metadata.create_all(engine)
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
            conn.exec_driver_sql("ANALYZE watchdog_jobs")
        yield engine


def test_the_claims_generic_plan_goes_by_address_when_one_queue_holds_the_table(postgres_server: URL) -> None:
    """A queue that holds most of the table (one busy queue, a fresh history):
    the generic plan of the one-queue claim must still reach the picked rows
    by their address. With ``IN (SELECT ...)`` it hash-joined a scan of the
    whole table (7 ms a claim at 20,000 jobs), ready for the plan cache to choose."""
    seed = (
        "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"
        " SELECT 'one-' || n, 'busy', 'one-' || n, 0, '{}', 'queued', 0 FROM generate_series(1, 20000) n"
    )
    with seeded_database(postgres_server, seed) as engine:
        statement, parameters = sent_as_the_store_does(engine, _case("claim(one queue)"))
        plan = pg_cached_plan(engine, statement, parameters, generic=True)
        assert not plan.full_scan, f"the generic claim plan scans {TABLE} whole:\n{plan.text}"
        assert TID in plan.indexes, plan.text


@pytest.mark.parametrize("queues", [1, 3])
def test_a_claim_planned_on_a_young_table_never_scans_it_once_it_grew(postgres_server: URL, queues: int) -> None:
    """The claim's generic plan made while the table was young and never
    analysed (a fresh deployment's first minute: autovacuum has not run) is
    kept by the runner's prepared statement while the table grows. Reaching
    the picked rows by ``sequence``, that plan scanned the whole table for
    every claim (1 ms a claim at 9,000 rows, and growing); by their address
    (``ctid``, locked by the pick) it is a TID scan, whatever the planner knows."""
    with own_database(postgres_server) as engine:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE watchdog_jobs SET (autovacuum_enabled = false)")
            conn.exec_driver_sql(
                "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"
                " SELECT 'y-' || n, 'q' || mod(n, 3), 'default', 0, '{}', 'queued', 0"
                " FROM generate_series(1, 3000) n"
            )
        assert engine.dialect.name == PG
        statement, parameters = sent_as_the_store_does(
            engine, _case(f"claim({'one queue' if queues == 1 else 'three queues'})")
        )
        parameters = {**parameters, **sql.queue_params([f"q{n}" for n in range(queues)])}
        plan = pg_cached_plan(engine, statement, parameters, generic=True)
        assert not plan.full_scan, f"the generic claim plan scans {TABLE} whole:\n{plan.text}"
        assert TID in plan.indexes, plan.text


def _kept_plan(conn: Any, prefix: str, pre: views._Precompiled, arguments: dict[str, Any]) -> Plan | None:
    """The plan ``conn`` keeps for the statement psycopg prepared last whose text starts
    with ``prefix`` (``EXPLAIN EXECUTE`` of it, with ``arguments``); None if none is prepared."""
    found = conn.exec_driver_sql(
        "SELECT name FROM pg_prepared_statements WHERE statement LIKE %(prefix)s ORDER BY prepare_time DESC LIMIT 1",
        {"prefix": prefix + "%%"},
    ).all()
    if not found:
        return None
    [(name,)] = found
    assert pre.native is not None
    raw = conn.connection.driver_connection
    values = ", ".join(psycopg_sql.Literal(arguments[key]).as_string(raw) for key in pre.native[1])
    document = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({values})").scalar_one()
    conn.commit()  # not a rollback: psycopg forgets its prepared statements on one
    return _pg_plan(document)


@pytest.mark.parametrize("statement", ["claim", "settle"])
def test_a_plan_kept_from_a_table_of_a_few_rows_is_made_anew_once_the_table_grew(
    postgres_server: URL, statement: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL keeps a prepared statement's generic plan once it looks no
    dearer than the custom ones, until the table is analysed again. Made while
    ``watchdog_jobs`` held a few rows (a new deployment, autovacuum not run
    yet), the claim's and the settle's generic plans read the table whole --
    cheaper than a lookup per row on a few pages, 10 ms a statement and more
    once the table has grown. The first such slow statement makes the
    connection's statements planned anew, and the plan kept then reads no more
    than its rows."""
    insert = (
        "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"
        " SELECT '{prefix}-' || n, 'q' || mod(n, 3), 'default', 0, '{{}}', 'queued', 0 FROM generate_series(1, {count}) n"
    )
    names = ["q0", "q1", "q2"]
    with own_database(postgres_server) as engine:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE watchdog_jobs SET (autovacuum_enabled = false)")
            conn.exec_driver_sql(insert.format(prefix="few", count=6))
        if statement == "claim":
            template = views._precompiled(engine.dialect, claims_sql.claim(backend_of(PG), 3, True))
            assert template is not None
            pre = views._with_sizes(template, {"limit": 8})
            prefix = "WITH ready AS MATERIALIZED"
            arguments = {"token": "t", "lease_ms": 60_000, **sql.queue_params(names)}

            def run(conn: Any) -> None:
                store.claim(conn, queues=names, limit=8, lease_ms=60_000)
        else:
            template = views._precompiled(engine.dialect, limits_sql.settle(backend_of(PG), True))
            assert template is not None
            pre = views._with_sizes(template, {"settles_count": 8})
            prefix = "UPDATE watchdog_jobs AS j"
            requests = [store.SettleRequest(f"gone-{n}", f"t-{n}", Decision.completed(), NOW) for n in range(8)]
            arguments = {
                "now": NOW,
                **sql.rows_params(
                    backend_of(PG), "settles", sql.SETTLE_FIELDS, [store.settle_row(r) for r in requests]
                ),
            }

            def run(conn: Any) -> None:
                store.settle_many(conn, requests)

        assert pre is not None
        arguments = {**pre.defaults, **arguments}
        bound = views.REPLAN_AFTER_S
        # No renewal while the plan is made (a statement slowed by a busy machine would renew it).
        monkeypatch.setattr(views, "REPLAN_AFTER_S", 60.0)
        with engine.connect() as conn:
            # psycopg prepares a statement after five executions; PostgreSQL then
            # plans it custom five times, and keeps the generic plan if no dearer.
            for _ in range(5 + CUSTOM_PLANS + 2):
                run(conn)
                conn.commit()
            conn.exec_driver_sql(insert.format(prefix="many", count=200_000))
            conn.commit()
            made_young = _kept_plan(conn, prefix, pre, arguments)
            assert made_young is not None
            monkeypatch.setattr(views, "REPLAN_AFTER_S", bound)
            run(conn)  # with the plan made young: reads 200,000 rows, slow
            conn.commit()
            if made_young.full_scan:
                assert views.plans_generation(conn) == 1  # its statements are sent anew
            # Else the plan was invalidated before it ran on the grown table (as
            # autovacuum's ANALYZE would; here a burst of other tests' catalog
            # changes in parallel can): nothing to renew, and the plan kept below
            # must hold all the same.
            for _ in range(5 + CUSTOM_PLANS + 2):
                run(conn)
                conn.commit()
            kept = _kept_plan(conn, prefix, pre, arguments)
        assert kept is not None, "the statement is prepared again"
        assert not kept.full_scan, f"the {statement}'s kept plan scans {TABLE} whole:\n{kept.text}"


def test_a_one_job_claim_and_settle_keep_their_generic_plans_on_a_table_never_analysed(
    postgres_server: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner claiming and settling one job at a time on a fresh table
    (3,000 jobs queued, autovacuum not run yet): after psycopg prepares them
    and PostgreSQL weighs five custom plans, both statements keep their
    generic plan. With the settle's row count a parameter, the generic plan
    (a tenth of the source's hundred rows, by estimate) looked dearer than
    the custom ones, and every settle was planned again: 0.16 ms of its
    0.33 on the server."""
    seed = (
        "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"
        " SELECT 'one-' || n, 'q', 'default', 0, '{}', 'queued', 0 FROM generate_series(1, 3000) n"
    )
    # A statement slowed by a busy machine would have them sent anew (views._replan_if_slow).
    monkeypatch.setattr(views, "REPLAN_AFTER_S", 60.0)
    with own_database(postgres_server) as engine:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE watchdog_jobs SET (autovacuum_enabled = false)")
            conn.exec_driver_sql(seed)
        with engine.connect() as conn:
            rounds = 5 + CUSTOM_PLANS + 4  # psycopg prepares at the sixth execution
            for _ in range(rounds):
                [claim] = store.claim(conn, queues=["q"], limit=1, lease_ms=60_000).claimed
                conn.commit()
                settled = store.settle(
                    conn, job_id=claim.job.job_id, claim_token=claim.token, decision=Decision.completed()
                )
                assert settled.status is store.SettleStatus.SETTLED
                conn.commit()
            kept: dict[str, str] = dict(
                conn.exec_driver_sql(
                    "SELECT split_part(statement, ' ', 1), (generic_plans, custom_plans)::text FROM pg_prepared_statements"
                    " WHERE statement LIKE 'WITH ready%%' OR statement LIKE 'UPDATE watchdog_jobs AS j%%'"
                ).all()
            )
            conn.commit()
    assert kept == {"WITH": f"(4,{CUSTOM_PLANS})", "UPDATE": f"(4,{CUSTOM_PLANS})"}


def test_a_connection_plans_anew_only_after_a_slow_statement_and_at_most_once_in_ten_seconds(
    postgres_server: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hot statement slower than its bound renews its connection's prepared
    statements; one within the bound does not, nor does a second slow one within
    ``REPLAN_EVERY_S``: a busy server's runner does not lose its plans at every statement."""
    # The claims themselves stay within a bound this wide, however busy the machine.
    monkeypatch.setattr(views, "REPLAN_AFTER_S", 60.0)
    with own_database(postgres_server) as engine:
        metadata.create_all(engine)

        with engine.connect() as conn:

            def claim_until_prepared() -> None:
                for _ in range(6):  # psycopg prepares a statement at its sixth execution
                    store.claim(conn, queues=["q"], limit=8, lease_ms=60_000)
                    conn.commit()

            claim_until_prepared()
            assert (prepared_claims(conn), views.plans_generation(conn)) == (1, 0)
            views._replan_if_slow(conn, views.REPLAN_AFTER_S + 8 * views.REPLAN_PER_ROW_S, 8)  # within the bound
            assert views.plans_generation(conn) == 0
            views._replan_if_slow(conn, 100.0, 8)
            assert views.plans_generation(conn) == 1
            # The claim is sent as another statement: prepared, and planned, anew.
            claim_until_prepared()
            assert prepared_claims(conn) == 2
            views._replan_if_slow(conn, 100.0, 8)  # a second slow statement, within ten seconds
            assert views.plans_generation(conn) == 1
            claim_until_prepared()
            assert prepared_claims(conn) == 2  # the same statement still


@pytest.mark.parametrize(
    "limits", [{"concurrency": 16}, {"concurrency": 16, "concurrency_per_key": 1}], ids=["queue", "per-key"]
)
def test_the_limited_claim_keeps_one_generic_plan_with_keyed_jobs(
    postgres_server: URL, limits: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limited claim is one prepared statement of some 14,000 characters,
    planned afresh at every execution unless PostgreSQL keeps its generic plan
    after the first five. Sent with its constants as parameters, its generic
    plan looked dearer than the custom ones once the queue's jobs had keys (a
    ``LIMIT $n`` is estimated at a tenth of the rows), and every claim was
    planned again: 1.4 ms of a 4 ms claim. With the constants in the text the
    generic plan is kept."""
    seed = (
        "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at, limit_key)"
        " SELECT 'k-' || n, 'limited', 'default', 0, '{}', 'queued', 0, 'key-' || mod(n, 100)"
        " FROM generate_series(1, 5000) n"
    )
    # A claim slowed by a busy machine would have the statement sent anew
    # (views._replan_if_slow), and counted apart.
    monkeypatch.setattr(views, "REPLAN_AFTER_S", 60.0)
    with seeded_database(postgres_server, seed) as engine:
        Watchdog(engine).set_limits("limited", **limits)
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            # psycopg prepares a statement at its sixth execution; the plan cache then
            # makes five custom plans before it weighs the generic one.
            for _ in range(5 + CUSTOM_PLANS + 4):
                claimed = store.claim(conn, queues=["limited"], limit=16, lease_ms=60_000).claimed
                assert len(claimed) == 16
                settles = [store.SettleRequest(c.job.job_id, c.token, Decision.completed()) for c in claimed]
                store.settle_many(conn, settles)
            generic, custom = conn.exec_driver_sql(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE 'WITH RECURSIVE seen AS%%'"
            ).one()
        assert (generic, custom) == (4, CUSTOM_PLANS)


@pytest.mark.parametrize("running", [0, 8], ids=["all-free", "half-at-their-limit"])
def test_the_limited_claim_walks_no_more_keys_than_fill_its_room(postgres_server: URL, running: int) -> None:
    """One job per key (100 keys with queued jobs): the walk stops at the key
    that fills the room, instead of walking ``2 * room + 8`` keys and reading
    the first jobs of each; keys at their limit ahead of the cursor are
    walked past. The claim takes the first job of each key it may take from."""
    seed = (
        "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at, limit_key)"
        " SELECT 'k-' || n, 'limited', 'default', 0, '{}', 'queued', 0, 'key-' || lpad(mod(n, 100)::text, 3, '0')"
        " FROM generate_series(1, 2000) n"
    )
    room = 16
    with seeded_database(postgres_server, seed) as engine:
        Watchdog(engine).set_limits("limited", concurrency=100, concurrency_per_key=1)
        with engine.begin() as conn:  # the first `running` keys have a job running: at their per-key limit
            conn.exec_driver_sql(
                "UPDATE watchdog_jobs SET state = 'running', claim_token = 'r.' || sequence, started_at = 0,"
                " lease_until = 9000000000000 WHERE sequence IN (SELECT min(sequence) FROM watchdog_jobs"
                f" WHERE limit_key < 'key-{running:03d}' GROUP BY limit_key)"
            )
        pre = views._precompiled(engine.dialect, limits_sql.claim_limited_at_once())
        assert pre is not None
        parameters = {**pre.defaults, "queue": "limited", "limit": room, "token": "t", "lease_ms": 60_000}
        with engine.connect() as conn:
            document = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + pre.text, parameters).scalar_one()
            conn.rollback()
            taken = conn.execute(limits_sql.claim_limited_at_once(), parameters).all()
            conn.rollback()

        walked: list[int] = []

        def find(node: dict[str, Any]) -> None:
            if node.get("Subplan Name") == "CTE walk":
                walked.append(node["Actual Rows"])
            for child in node.get("Plans", []):
                find(child)

        find(document[0]["Plan"])
        assert walked == [running + room], json.dumps(document, indent=1)
        keys = sorted(row.limit_key for row in taken)
        assert keys == [f"key-{n:03d}" for n in range(running, running + room)]


@pytest.mark.parametrize("queue_count", [1, 3])
def test_a_claim_never_reads_a_paused_queues_backlog(postgres_server: URL, queue_count: int) -> None:
    """The pause check of each queue's pick names the parameter, so it is a
    one-time filter: the paused queue's index range is never read. As a filter
    on the column it was checked on every row of the paused backlog, each claim."""
    seed = (
        "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, enqueued_at)"
        " SELECT 'p-' || n, 'paused', 'paused', 9, '{}', 'queued', 0 FROM generate_series(1, 20000) n"
        " UNION ALL SELECT 'o-' || n, 'open', 'open', 0, '{}', 'queued', 0 FROM generate_series(1, 100) n"
    )
    pause = "INSERT INTO watchdog_queue_pauses (queue_name, paused_at) VALUES ('paused', 0)"
    with seeded_database(postgres_server, seed, pause) as engine:
        queues = ["paused", "open", "empty"][:queue_count]
        statement, parameters = sent(engine, claims_sql.claim(backend_of(PG), queue_count), _claim(queues)(PG))
        with engine.connect() as conn:
            document = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters).scalar_one()
            conn.rollback()
        read: list[int] = []

        def walk(node: dict[str, Any]) -> None:
            if node.get("Relation Name") == TABLE and node.get("Index Name") == LIVE_QUEUE:
                # Rows a filter removed were read too.
                read.append(node["Actual Rows"] + node.get("Rows Removed by Filter", 0) if node["Actual Loops"] else 0)
            for child in node.get("Plans", []):
                walk(child)

        walk(document[0]["Plan"])
        assert len(read) == queue_count, json.dumps(document, indent=1)
        assert read[0] == 0, json.dumps(document, indent=1)  # the paused queue: never read
        if queue_count > 1:
            assert read[1] == 1  # the open queue: its first job (limit 1)


# -- 1,000,000 jobs: a job_id prefix and a lane are index ranges ------------------------------
#
# Seeding a million rows takes a minute of one CPU: these run in CI and with
# WATCHDOG_SLOW_TESTS=1 (marker slow), not in a day's run, whose budget is five minutes.

MILLION = 1_000_000
TENANTS = 1_000


def million_seed(dialect: str) -> str:
    """1,000,000 settled jobs (``sequence`` = n) of 1,000 tenants interleaved:
    job_id ``t<n mod 1000>-<n>``, queue ``q<n mod 1000>``; an even job in its
    queue's default lane, an odd one in the lane named after the next queue.
    So lane ``q8`` holds queue q8's default-lane jobs (n = 8 mod 1000) and
    queue q7's jobs given lane q8 (n = 7 mod 1000): 2 in 1,000 of the table."""
    with_, source = _numbers(dialect, MILLION)
    return (
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, outcome,"
        " enqueued_at, settled_at)"
        f" SELECT 't' || (n % {TENANTS}) || '-' || n, 'q' || (n % {TENANTS}), 'q' || ((n + n % 2) % {TENANTS}),"
        f" 0, '{{}}', 'settled', 'completed', n, n FROM {source}"
    )


@pytest.fixture(scope="module")
def million_icu(postgres_server: URL) -> Iterator[Engine]:
    """A PostgreSQL database whose collation is ICU's ``en-US`` (linguistic:
    ``a-b`` sorts beside ``ab``) holding :func:`million_seed`, analysed."""
    name = f"watchdog_plans_icu_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(
            f"CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
        )
    engine = create_engine(postgres_server.set(database=name))
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(million_seed(PG).replace("%", "%%"))
            conn.exec_driver_sql(f"ANALYZE {TABLE}")
        yield engine
    finally:
        engine.dispose()
        backend_of("postgresql").forget()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(scope="module")
def million_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A SQLite database holding :func:`million_seed`, analysed."""
    engine = create_engine(f"sqlite:///{tmp_path_factory.mktemp('million') / 'million.db'}")
    metadata.create_all(engine)
    with engine.begin() as conn:
        # Room for the table and its indexes in the page cache while it is filled
        # (this connection only): the seed takes about three quarters of the time.
        conn.exec_driver_sql("PRAGMA cache_size = -1000000")
        conn.exec_driver_sql(million_seed(LITE))
        conn.exec_driver_sql("ANALYZE")
        conn.exec_driver_sql("PRAGMA cache_size = -2000")  # SQLite's default again, for the tests
    yield engine
    engine.dispose()


def test_each_keys_jobs_are_read_in_order_when_statistics_say_one_job_per_key(tmp_path: Path) -> None:
    """SQLite, a limited queue whose keys hold one queued job each, analysed:
    the limited claim's pick reads each key's jobs in ``keyed_queued``'s order.
    With ``limit_key = ?`` the planner, told one row per key, sorted each
    key's jobs in a temporary b-tree (a pager and its page cache, allocated
    and freed per key per claim: up to 0.6 ms of heap trimming per claim)."""
    engine = create_engine(f"sqlite:///{tmp_path / 'one_per_key.db'}")
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"WITH RECURSIVE n(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM n WHERE n < 2000)"
                f" INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, enqueued_at,"
                f" limit_key) SELECT 'one-' || n, 'one', 'one', 0, '{{}}', 'queued', n, 'k' || n FROM n"
            )
            conn.exec_driver_sql("ANALYZE")
        stat = "SELECT stat FROM sqlite_stat1 WHERE idx = 'ix_watchdog_jobs_keyed_queued'"
        with engine.connect() as conn:
            assert conn.exec_driver_sql(stat).scalar_one().split()[2] == "1"  # one job per key, as analysed
        params = {"queue": "one", "unkeyed_n": 0, "unkeyed_scan": 0}
        params |= {f"key_{i}": f"k{100 + i}" for i in range(16)} | {f"n_{i}": 1 for i in range(16)}
        statement, parameters = sent(engine, limits_sql.key_picks(backend_of(LITE), 16), params)
        plan = sqlite_plan(engine, statement, parameters)
        assert KEYED_QUEUED in plan.indexes, plan.text
        assert not plan.sorts, f"each key's jobs sorted instead of read in order:\n{plan.text}"
        with engine.connect() as conn:
            picked = conn.execute(limits_sql.key_picks(backend_of(LITE), 16), params).all()
        assert sorted(row.part for row in picked) == list(range(16))
    finally:
        engine.dispose()


@pytest.mark.slow
def test_a_job_id_prefix_is_an_index_range_at_a_million_jobs_under_a_linguistic_collation(
    million_icu: Engine,
) -> None:
    """A database whose collation is ICU's ``en-US``, 1,000,000 settled jobs
    of 1,000 tenants interleaved (``t<tenant>-<n>``): since w0010 ``job_id``
    is ``COLLATE "C"``, so the store reads the jobs with a prefix as a range
    of ``uq_watchdog_jobs_job_id``, oldest and newest first, on every page of
    keyset paging, in the first executions' custom plans and in a prepared
    statement's generic plan (the range's bounds are literals) -- never a
    walk of the history (one tenant's 1,000 jobs are 1 in 1,000 of it)."""
    engine = million_icu
    backend_of("postgresql").forget()
    with engine.connect() as conn:
        assert store.sorts_by_code_point(conn)
        # The database's own order is linguistic (ICU: 'a' before 'B'), the column's by code point.
        linguistic = "SELECT 'B' < 'a', collation for (job_id) FROM watchdog_jobs LIMIT 1"
        assert conn.exec_driver_sql(linguistic).one() == (False, '"C"')
    reads: list[tuple[str, bool, bool, bool]] = []
    for newest in (False, True):
        for bounds in ({}, {"after_sequence": 300_000, "before_sequence": 700_000}):
            params = _list(job_id_prefix="t7-", job_id_low="t7-", job_id_high="t7.", **bounds)(PG)
            statement, parameters = sent(
                engine, maintenance_sql.list_jobs(("job_id_prefix", "job_id_range"), False, newest), params
            )
            for label, plan in (
                ("first executions", pg_first_plan(engine, statement, parameters)),
                ("prepared, 6th execution", pg_cached_plan(engine, statement, parameters)),
                ("generic plan", pg_cached_plan(engine, statement, parameters, generic=True)),
            ):
                reads.append((label, newest, bool(bounds), JOB_ID[PG] in plan.indexes and not plan.full_scan))
    # Every plan, the prepared statement's generic one too: the bounds are literals.
    assert all(ok for *_, ok in reads), reads
    # And the store's pages, both ways, are the tenant's jobs in order.
    watchdog = Watchdog(engine)
    first = watchdog.list_jobs(job_id_prefix="t7-", limit=100)
    second = watchdog.list_jobs(job_id_prefix="t7-", limit=100, after_sequence=first[-1].sequence)
    sequences = [job.sequence for job in first + second]
    assert sequences == [7 + 1000 * i for i in range(200)]
    newest_page = watchdog.list_jobs(job_id_prefix="t7-", limit=50, newest_first=True, before_sequence=700_000)
    assert [job.sequence for job in newest_page] == [699_007 - 1000 * i for i in range(50)]


@pytest.mark.slow
@pytest.mark.parametrize("dialect", [LITE, PG])
def test_a_lane_is_an_index_range_at_a_million_jobs(dialect: str, request: pytest.FixtureRequest) -> None:
    """1,000,000 settled jobs, lane ``q8`` 2 in 1,000 of them, half in queue
    q8's default lane (``lane = queue_name``), half queue q7's given lane q8:
    the lane filter, alone and with a queue, reads ``ix_watchdog_jobs_lane_history``
    (revision w0010), oldest and newest first, with and without keyset bounds,
    on PostgreSQL in the custom, prepared and generic plans -- never a walk of
    the history between the lane's jobs. Alone, the index delivers the order
    (no sort). And the store's pages, both ways, are exactly the lane's jobs."""
    engine: Engine = request.getfixturevalue("million_sqlite" if dialect == LITE else "million_icu")
    misses: list[tuple[Any, ...]] = []
    for filters, values in ((("lane",), {"lane": "q8"}), (("queue", "lane"), {"lane": "q8", "queue": "q7"})):
        for newest in (False, True):
            for bounds in ({}, {"after_sequence": 300_000, "before_sequence": 700_000}):
                statement, parameters = sent(
                    engine, maintenance_sql.list_jobs(filters, False, newest), _list(**values, **bounds)(dialect)
                )
                if dialect == LITE:
                    plans = [("plan", sqlite_plan(engine, statement, parameters))]
                else:
                    plans = [
                        ("first executions", pg_first_plan(engine, statement, parameters)),
                        ("prepared, 6th execution", pg_cached_plan(engine, statement, parameters)),
                        ("generic plan", pg_cached_plan(engine, statement, parameters, generic=True)),
                    ]
                for label, plan in plans:
                    # With a queue PostgreSQL may sort the lane's matches (see the PLANS case).
                    must_order = filters == ("lane",) or dialect == LITE
                    if LANE_HISTORY not in plan.indexes or plan.full_scan or (must_order and plan.sorts):
                        misses.append((filters, newest, bool(bounds), label, plan.text))
    assert not misses, misses
    watchdog = Watchdog(engine)
    lane = [n for n in range(1, MILLION + 1) if n % TENANTS in (7, 8)]
    first = watchdog.list_jobs(lane="q8", limit=100, with_payload=False)
    second = watchdog.list_jobs(lane="q8", limit=100, after_sequence=first[-1].sequence, with_payload=False)
    assert [job.sequence for job in first + second] == lane[:200]
    assert {(job.queue, job.lane) for job in first} == {("q8", "q8"), ("q7", "q8")}
    newest_page = watchdog.list_jobs(lane="q8", limit=50, newest_first=True, before_sequence=700_000)
    assert [job.sequence for job in newest_page] == [n for n in reversed(lane) if n < 700_000][:50]
    # Both halves of the lane with a queue: its default-lane jobs, and another queue's given the lane.
    own = watchdog.list_jobs(lane="q8", queue="q8", limit=100, newest_first=True)
    assert [job.sequence for job in own] == [n for n in reversed(lane) if n % TENANTS == 8][:100]
    given = watchdog.list_jobs(lane="q8", queue="q7", limit=100, after_sequence=300_000)
    assert [job.sequence for job in given] == [n for n in lane if n % TENANTS == 7 and n > 300_000][:100]


#: The rate log's index of keyed claims (w0015).
CLAIMS_KEYED = "ix_watchdog_limit_claims_keyed"
#: Distinct keys of the limited queue beside the million settled jobs.
MANY_KEYS = 10_000


@pytest.mark.slow  # a million rows too (see above)
@pytest.mark.parametrize("dialect", [LITE, PG])
def test_the_limited_claim_stays_flat_at_a_million_jobs_and_ten_thousand_keys(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    """1,000,000 settled jobs and a limited queue of 10,000 keys (two queued
    jobs each, one key in ten running one): every statement of the limited
    claim reads its index -- the walk over keys and each key's jobs
    ``keyed_queued``, a key's running jobs ``keyed_running``, the unkeyed
    head and the running count ``live_queue``, the update by key -- in the
    custom, prepared and generic plans on PostgreSQL, never a scan of the
    table or a sort of what it read. And the claims take one job per key, in
    rotation."""
    engine: Engine = request.getfixturevalue("million_sqlite" if dialect == LITE else "million_icu")
    with_, source = _numbers(dialect, MANY_KEYS * 2)
    log_with, log_source = _numbers(dialect, MANY_KEYS * 20)
    padded = (
        f"lpad(CAST(n % {MANY_KEYS} AS TEXT), 5, '0')" if dialect == PG else f"substr('0000' || (n % {MANY_KEYS}), -5)"
    )
    seed = [
        f"{with_}INSERT INTO {TABLE} (job_id, queue_name, lane, priority, payload_json, state, enqueued_at, limit_key)"
        f" SELECT 'many-' || n, 'many', 'many', 0, '{{}}', 'queued', n, 'key-' || {padded}"
        f" FROM {source}",
        f"INSERT INTO watchdog_limits (queue_name, concurrency, concurrency_per_key,"
        f" rate_per_key_count, rate_per_key_period_ms, updated_at) VALUES ('many', 100, 1, 1000, 60000, {NOW})",
        # Ten logged claims per key, and as many of other queues: a key's window must be one range.
        f"{log_with}INSERT INTO watchdog_limit_claims (queue_name, claimed_at, jobs, limit_key)"
        f" SELECT CASE WHEN (n / {MANY_KEYS}) % 2 = 0 THEN 'many' ELSE 'other' END, {NOW} - n % 50000, 1,"
        f" 'key-' || {padded} FROM {log_source}",
    ]
    with engine.begin() as conn:
        for insert in seed:
            conn.exec_driver_sql(insert.replace("%", "%%") if dialect == PG else insert)
        conn.exec_driver_sql(f"ANALYZE {TABLE}" if dialect == PG else "ANALYZE")
        if dialect == PG:
            conn.exec_driver_sql("ANALYZE watchdog_limit_claims")
    if dialect == PG:
        # The table as autovacuum keeps it: its visibility map set. Freshly
        # loaded and never vacuumed, every page counts as a heap fetch, and the
        # walk's probe of keyed_queued (an ordered index-only scan, LIMIT 1)
        # costs the same as a bitmap scan of the key range plus a sort of what
        # it read: the generic plan then flipped with ANALYZE's sample (the
        # estimated size of the partial index), about one run in three.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"VACUUM (ANALYZE) {TABLE}")
    try:
        cases: list[tuple[Any, dict[str, Any], tuple[str, ...], bool]] = [
            (limits_sql.walk_keys(), {"queue": "many", "after": "key-05000", "walk": 40}, (KEYED_QUEUED,), False),
            # ... with each key's running jobs counted (a per-key limit): one range of keyed_running per key.
            (limits_sql.walk_keys(True), {"queue": "many", "after": "key-05000", "walk": 40}, (KEYED_RUNNING,), False),
            (
                limits_sql.keys_running(),
                {"queue": "many", "keys": [f"key-{n:05}" for n in range(40)]},
                (KEYED_RUNNING,),
                False,
            ),
            (
                limits_sql.key_picks(backend_of(dialect), 64),
                {
                    "queue": "many",
                    "unkeyed_n": 16,
                    "unkeyed_scan": 272,
                    **{f"key_{i}": f"key-{7000 + i:05}" for i in range(64)},
                    **{f"n_{i}": 1 for i in range(64)},
                },
                (KEYED_QUEUED,),
                True,
            ),
            # The queue's running jobs: its range of live_queue, or (PostgreSQL, few running
            # jobs anywhere) the running jobs of every queue in the lease index.
            (
                limits_sql.limit_usage(backend_of(dialect)),
                {"queue": "many", "period_ms": 60_000},
                (LIVE_QUEUE, LEASE),
                False,
            ),
            (
                limits_sql.claim_limited(16),
                {"token": "t", "lease_ms": 1000, "s_0": 1_000_001, **{f"s_{i}": None for i in range(1, 16)}},
                (PK,),
                False,
            ),
            # A per-key rate: each walked key's claims in its window, one range each.
            (
                limits_sql.keys_rate_used(True),
                {"queue": "many", "keys": [f"key-{n:05}" for n in range(40)], "since": NOW - 60_000},
                (CLAIMS_KEYED,),
                False,
            ),
        ]
        if dialect == PG:
            at_once = {"queue": "many", "limit": 16, "token": "t", "lease_ms": 1000}
            # No sort of rows read from the table in any of its plans: the walk's
            # probes read keyed_queued in order (see the VACUUM above).
            cases.append((limits_sql.claim_limited_at_once(), at_once, (KEYED_QUEUED,), True))
            # ... and each walked key's claims in its per-key window by the keyed log index.
            cases.append((limits_sql.claim_limited_at_once(), at_once, (CLAIMS_KEYED,), False))
        misses: list[tuple[Any, ...]] = []
        for statement, params, index, ordered in cases:
            caught, parameters = sent(engine, statement, params)
            if dialect == LITE:
                table = "watchdog_limit_claims" if index == (CLAIMS_KEYED,) else TABLE
                plans = [("plan", sqlite_plan(engine, caught, parameters, table))]
            else:
                plans = [
                    ("first executions", pg_first_plan(engine, caught, parameters)),
                    ("prepared, 6th execution", pg_cached_plan(engine, caught, parameters)),
                    ("generic plan", pg_cached_plan(engine, caught, parameters, generic=True)),
                ]
            for label, plan in plans:
                if not plan.indexes & set(index) or plan.full_scan or (ordered and plan.sorts):
                    misses.append((index, label, sorted(plan.indexes), plan.full_scan, plan.sorts))
        assert not misses, misses
        taken: list[str] = []
        for _ in range(3):
            with store.write_transaction(engine) as conn:
                batch = store.claim(conn, queues=["many"], limit=16, lease_ms=60_000)
            taken.extend(claim.job.key or "" for claim in batch.claimed)
        assert sorted(taken) == [f"key-{n:05}" for n in range(48)]  # one per key, in rotation
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DELETE FROM {TABLE} WHERE queue_name = 'many'")
            conn.exec_driver_sql("DELETE FROM watchdog_limits")
            conn.exec_driver_sql("DELETE FROM watchdog_limit_claims")
            conn.exec_driver_sql(f"ANALYZE {TABLE}" if dialect == PG else "ANALYZE")
