"""A slow or broken database: the runner's memory stays bounded, its log stays readable.

Both runner kinds, both dialects (the slow settle's PostgreSQL copy under
CI, see ``dialect_neutral`` in conftest.py). The database is real; its slowness is a
real delay in the runner's own engine (a ``before_cursor_execute`` event
that sleeps before each settle statement), its breakage a dropped table.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from sqlalchemy_watchdog import Job, Outcome, RunningJob
from sqlalchemy_watchdog.core.state import RunnerCore
from tests.helpers import add, wait_until
from tests.runner_kinds import RunnerDriver


def test_a_missing_table_logs_one_error_per_backoff(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    worker = runners.runner({"q": lambda job: None}, poll_interval=_seconds(0.05))
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE watchdog_jobs"))
    caplog.set_level(logging.ERROR, logger="sqlalchemy_watchdog")
    with worker.serving():
        # Back-offs of 0.5 s and 1 s: three failed passes within 1.8 s.
        wait_until(lambda: len(_errors(caplog)) >= 2, 10, "two failed loop passes")
        time.sleep(0.3)
    errors = _errors(caplog)
    # Each line is one failed pass, naming the maintenance steps that failed
    # with it -- not one line per step.
    assert errors and all("retrying in" in message for message in errors), errors
    assert any("failed too" in message for message in errors), errors
    assert not any("claiming goes on" in message for message in errors), errors


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.startswith("sqlalchemy_watchdog")
    ]


def _seconds(value: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=value)


# The bound is the runner's own bookkeeping (claims stop while settles wait
# in its backlog); the slowness is a sleep in the runner's engine, the same
# on both dialects. The PostgreSQL copy (5 s of sleeps per runner kind)
# finds nothing the SQLite one does not; the missing-table test above keeps
# both dialects, as the error a database raises there is its own.
@pytest.mark.dialect_neutral
def test_a_slow_settle_stops_claims_once_the_backlog_is_full(
    engine: Engine, runners: RunnerDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RunnerCore, "SETTLE_BACKLOG_MIN", 4, raising=False)
    concurrency = 2
    bound = max(4, 2 * concurrency)
    add(engine, *[Job(f"j-{i:03}", "q") for i in range(60)])

    def slow_settles(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "settles" in statement:
            time.sleep(0.15)

    peak = 0
    lock = threading.Lock()
    holder: list[Any] = []

    def handler(job: RunningJob) -> None:
        nonlocal peak
        with lock:
            peak = max(peak, len(holder[0].core.active()))

    worker = runners.runner({"q": handler}, concurrency=concurrency, listen={"before_cursor_execute": slow_settles})
    holder.append(worker.runner)
    with worker.serving():
        wait_until(lambda: _completed(engine) == 60, 60, "every job to complete")
    # Running handlers and the jobs claimed ahead for them, plus the settles
    # waiting for the database, plus the jobs claimed just before the backlog
    # filled up: never the whole queue.
    in_flight = concurrency + holder[0].settings.ahead_cap
    assert peak <= bound + 2 * in_flight < 60, peak


def _completed(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM watchdog_jobs WHERE outcome = :o"), {"o": Outcome.COMPLETED.value}
            ).scalar_one()
        )
