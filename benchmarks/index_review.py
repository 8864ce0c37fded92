#!/usr/bin/env python3
"""Index review: what each index of ``watchdog_jobs`` costs an enqueue, and what it buys.

    .venv/bin/python benchmarks/index_review.py [--quick] [--rounds N] [--history N]

On PostgreSQL (``WATCHDOG_BENCH_POSTGRES``), for each variant of the index set
(the model's, and the model's with one index dropped or made partial, and the
recommended set), two figures:

* batch enqueue: ``enqueue(session, [1,000 jobs])`` + commit, and the same SQL
  statement alone (its parameter built beforehand, over psycopg, prepared), jobs/s
  per transaction. Each variant has its own database; the ``--batches``
  transactions interleave across the variants (the order rotated every batch), so
  a change of machine load or a checkpoint hits them all alike; the figure is the
  median over the batches, with the interquartile range.
* claim+settle with history: ``Runner.run_until_idle()`` claiming and settling
  ``--claim-jobs`` jobs one at a time in a table that also holds ``--history``
  settled jobs (one ``INSERT ... SELECT generate_series`` and ``VACUUM (ANALYZE)``,
  built once and altered per variant), ms per job, median over rounds.

Which statements read which index comes from ``tests/integration/test_plans.py`` (its
``PLANS`` table); the README's "Index review" section puts both together.
Never changes a server setting; its databases (``watchdog_bench_<pid>_*``) are
dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness
import psycopg
from harness import Target, create_database, drop_all_created

QUEUE = "bench"

#: Each variant: the DDL turning the model's index set into it (run on a table holding the model's set).
MODEL = "model (as in model.py)"
LIVE = "state IN ('delayed', 'queued', 'running')"
#: Revision w0008 back to w0007: the index set a ready job entered seven of.
BEFORE_W0008 = "the set before w0008 (7 entries per ready job)"
CANCELLATION_FULL = [
    "DROP INDEX uq_watchdog_jobs_cancellation_id",
    "ALTER TABLE watchdog_jobs ADD CONSTRAINT uq_watchdog_jobs_cancellation_id UNIQUE (cancellation_id)",
]
READY = ["CREATE INDEX ix_watchdog_jobs_ready ON watchdog_jobs (priority DESC, sequence) WHERE state = 'queued'"]
UNDO_W0008 = [
    *CANCELLATION_FULL,
    *READY,
    "CREATE INDEX ix_watchdog_jobs_queued_since ON watchdog_jobs (queue_name, coalesce(ready_at, enqueued_at))"
    " WHERE state = 'queued'",
    "DROP INDEX ix_watchdog_jobs_live_lane",
    f"CREATE INDEX ix_watchdog_jobs_live_lane ON watchdog_jobs (lane, state DESC, sequence) WHERE {LIVE}",
    "DROP INDEX ix_watchdog_jobs_live_queue",
    "CREATE INDEX ix_watchdog_jobs_live_queue ON watchdog_jobs (queue_name, state, priority DESC, sequence)"
    f" WHERE {LIVE}",
]
VARIANTS: dict[str, list[str]] = {
    MODEL: [],
    BEFORE_W0008: UNDO_W0008,
    "+ ix_watchdog_jobs_ready (dropped in w0008)": READY,
    "cancellation_id NULLs indexed again (before w0008)": CANCELLATION_FULL,
    "- ix_watchdog_jobs_live_queue": ["DROP INDEX ix_watchdog_jobs_live_queue"],
    "- ix_watchdog_jobs_live_lane": ["DROP INDEX ix_watchdog_jobs_live_lane"],
    # Not an index: the statement-level NOTIFY trigger, for scale.
    "- the NOTIFY trigger (not an index)": ["ALTER TABLE watchdog_jobs DISABLE TRIGGER watchdog_jobs_queued"],
    "PK + job_id unique only": [
        f"DROP INDEX {name}"
        for name in (
            "uq_watchdog_jobs_cancellation_id",
            "ix_watchdog_jobs_delayed",
            "ix_watchdog_jobs_settled",
            "ix_watchdog_jobs_rerun_of",
            "ix_watchdog_jobs_lease",
            "ix_watchdog_jobs_live_lane",
            "ix_watchdog_jobs_live_queue",
        )
    ],
}
#: The variants the claim figure is measured for (each rebuild costs an index build on the history).
CLAIM_VARIANTS = (MODEL, BEFORE_W0008)


def load() -> str:
    out = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return out.split("load average:")[-1].strip() if "load average" in out else out


def build(target: Target, variant: str) -> None:
    """A fresh ``watchdog_jobs`` with the variant's index set."""
    from sqlalchemy import create_engine

    from sqlalchemy_watchdog import metadata

    engine = create_engine(target.sqlalchemy_url)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    engine.dispose()
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        for statement in VARIANTS[variant]:
            conn.execute(statement)


def captured_enqueue(target: Target, size: int, tag: str) -> tuple[str, dict[str, Any]]:
    """The SQL and parameters ``enqueue(session, [size jobs])`` sends (run once, committed)."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.orm import Session

    from sqlalchemy_watchdog import Job, enqueue

    engine = create_engine(target.sqlalchemy_url)
    sent: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if statement.startswith("INSERT INTO watchdog_jobs"):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", keep)
    try:
        with Session(engine) as session:
            enqueue(session, [Job(f"{tag}-{i}", QUEUE, payload={"i": i}) for i in range(size)])
            session.commit()
    finally:
        engine.dispose()
    return sent[0]


class EnqueueClient:
    """One variant's database: ``enqueue()`` through a Session, and the same
    statement alone over psycopg (its JSON parameter built beforehand: what
    the database and one round trip cost, without the Python client)."""

    def __init__(self, target: Target, size: int) -> None:
        from sqlalchemy import create_engine

        self.size = size
        self.engine = create_engine(target.sqlalchemy_url)
        self.statement, self.parameters = captured_enqueue(target, size, "warm")
        self.raw = psycopg.connect(target.dsn)

    def enqueue_once(self, tag: str) -> float:
        from sqlalchemy.orm import Session

        from sqlalchemy_watchdog import Job, enqueue

        started = time.perf_counter()
        with Session(self.engine) as session:
            enqueue(session, [Job(f"{tag}-{i}", QUEUE, payload={"i": i}) for i in range(self.size)])
            session.commit()
        return self.size / (time.perf_counter() - started)

    def statement_once(self, tag: str) -> float:
        body = self.parameters["jobs"].replace('"warm-', f'"{tag}-')
        started = time.perf_counter()
        self.raw.execute(self.statement, {**self.parameters, "jobs": body}, prepare=True)
        self.raw.commit()
        return self.size / (time.perf_counter() - started)

    def close(self) -> None:
        self.raw.close()
        self.engine.dispose()


def insert_history(target: Target, rows: int) -> None:
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, outcome,"
            " claim_token, enqueued_at, started_at, settled_at)"
            " SELECT 'history-' || g, %(queue)s, %(queue)s, 0, '{\"i\":' || g || '}', 'settled', 'completed',"
            " 'claim_history_' || g, 1, 2, 3 FROM generate_series(1, %(rows)s) AS g",
            {"queue": QUEUE, "rows": rows},
        )
        conn.execute("VACUUM (ANALYZE) watchdog_jobs")


def reindex_to(target: Target, variant: str) -> None:
    """Turn the history table's index set into ``variant``'s (from the model's, kept in between)."""
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        for statement in VARIANTS[variant]:
            conn.execute(statement)
        conn.execute("VACUUM (ANALYZE) watchdog_jobs")


def restore_model(target: Target, variant: str) -> None:
    """Undo ``variant`` (one of CLAIM_VARIANTS) on the history table."""
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        if variant == BEFORE_W0008:
            conn.execute("ALTER TABLE watchdog_jobs DROP CONSTRAINT uq_watchdog_jobs_cancellation_id")
            conn.execute(
                "CREATE UNIQUE INDEX uq_watchdog_jobs_cancellation_id ON watchdog_jobs (cancellation_id)"
                " WHERE cancellation_id IS NOT NULL"
            )
            for name in ("ready", "queued_since", "live_lane", "live_queue"):
                conn.execute(f"DROP INDEX ix_watchdog_jobs_{name}")
            conn.execute(
                "CREATE INDEX ix_watchdog_jobs_live_lane ON watchdog_jobs (lane, state DESC, sequence)"
                f" WHERE {LIVE} AND lane <> queue_name"
            )
            conn.execute(
                "CREATE INDEX ix_watchdog_jobs_live_queue ON watchdog_jobs"
                f" (queue_name, state, priority DESC, sequence, ready_at, enqueued_at) WHERE {LIVE}"
            )


def claim_settle_ms(target: Target, jobs: int, tag: str) -> float:
    """ms per job of ``Runner.run_until_idle()`` over ``jobs`` freshly enqueued jobs."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from sqlalchemy_watchdog import Job, Runner, enqueue

    engine = create_engine(target.sqlalchemy_url)
    try:
        with Session(engine) as session:
            enqueue(session, [Job(f"{tag}-{i}", QUEUE, payload={"i": i}) for i in range(jobs)])
            session.commit()
        runner = Runner(engine, {QUEUE: lambda job: None}, poll_interval=timedelta(seconds=1))
        started = time.perf_counter()
        settled = runner.run_until_idle()
        elapsed = time.perf_counter() - started
        if len(settled) != jobs:
            raise harness.ScenarioFailed(f"settled {len(settled)} of {jobs}")
        return elapsed / jobs * 1000
    finally:
        engine.dispose()


def spread(values: list[float]) -> str:
    """Median (interquartile range)."""
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return f"{statistics.median(values):,.0f} ({q1:,.0f}-{q3:,.0f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 round, small history")
    parser.add_argument("--rounds", type=int, default=None, help="claim rounds over the variants (default 3)")
    parser.add_argument(
        "--batches", type=int, default=None, help="1,000-job transactions per variant (default 40, --quick 10)"
    )
    parser.add_argument("--history", type=int, default=None, help="settled rows under the claim (default 1,000,000)")
    parser.add_argument("--claim-jobs", type=int, default=500)
    parser.add_argument("--skip-claim", action="store_true")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    batches = args.batches or (10 if args.quick else 40)
    history = args.history or (100_000 if args.quick else 1_000_000)
    print(f"index review: load at start {load()}, {os.cpu_count()} cpus, rounds={rounds}", flush=True)
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    statement_rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    claims: dict[str, list[float]] = {name: [] for name in CLAIM_VARIANTS}
    try:
        # One database per variant; batches interleave across the variants (order
        # rotated each batch), so load changes and checkpoints hit them all alike.
        clients: dict[str, EnqueueClient] = {}
        for i, variant in enumerate(VARIANTS):
            variant_target = create_database(f"indexes{i}")
            build(variant_target, variant)
            clients[variant] = EnqueueClient(variant_target, 1000)
        names = list(VARIANTS)
        for b in range(batches):
            order = names[b % len(names) :] + names[: b % len(names)]
            for variant in order:
                results[variant].append(clients[variant].enqueue_once(f"e{b}"))
                statement_rates[variant].append(clients[variant].statement_once(f"s{b}"))
            if b % 10 == 9:
                print(f"  {b + 1} batches per variant, load {load()}", flush=True)
        for client in clients.values():
            client.close()
        target = create_database("indexes")
        if not args.skip_claim:
            build(target, MODEL)
            started = time.perf_counter()
            insert_history(target, history)
            print(f"  {history:,} settled rows in {time.perf_counter() - started:.1f}s", flush=True)
            for r in range(rounds):
                for variant in CLAIM_VARIANTS:
                    reindex_to(target, variant)
                    ms = claim_settle_ms(target, args.claim_jobs, f"c{r}-{variant[:6]}")
                    claims[variant].append(ms)
                    restore_model(target, variant)
                    print(f"  round {r + 1} claim {variant:46} {ms:6.3f} ms/job   load {load()}", flush=True)
    finally:
        drop_all_created()
    base = statistics.median(results[MODEL])
    raw_base = statistics.median(statement_rates[MODEL])
    print(
        "\n| index set | enqueue(), 1,000 jobs per statement (jobs/s) | vs model | the statement alone (jobs/s) | vs model |"
    )
    print("| --- | --- | --- | --- | --- |")
    for variant, values in results.items():
        raw = statement_rates[variant]
        print(
            f"| {variant} | {spread(values)} | {statistics.median(values) / base:.2f}x"
            f" | {spread(raw)} | {statistics.median(raw) / raw_base:.2f}x |"
        )
    if not args.skip_claim:
        cbase = statistics.median(claims[MODEL])
        print(f"\n| index set | claim+settle, {history:,} settled rows (ms/job) | vs model |")
        print("| --- | --- | --- |")
        for variant, values in claims.items():
            med = statistics.median(values)
            print(f"| {variant} | {med:.3f} ({min(values):.3f}-{max(values):.3f}) | {med / cbase:.2f}x |")
    print(f"\nload at end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
