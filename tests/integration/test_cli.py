"""The ``sqlalchemy-watchdog`` command, on SQLite and PostgreSQL.

Most tests call :func:`sqlalchemy_watchdog.cli.main` in-process; one runs a
real worker process with ``python -m sqlalchemy_watchdog.cli run`` and stops
it with SIGTERM, and one runs the installed console script.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import (
    Decision,
    Job,
    JobState,
    Outcome,
    Rate,
    RetryPolicy,
    Runner,
    RunningJob,
    Watchdog,
    metadata,
    store,
)
from sqlalchemy_watchdog.cli import main
from sqlalchemy_watchdog.store import LANE_FAILURE_BATCH
from tests.conftest import WITH_MARIADB
from tests.helpers import HEAD_REVISION, add, present, read

# The dialect does not matter here but where a test says dialect_specific: the PostgreSQL copy
# runs under CI=true or WATCHDOG_ALL_DIALECTS=1 (tests/conftest.py).
pytestmark = pytest.mark.dialect_neutral

ROOT = Path(__file__).resolve().parents[2]


def url_arg(url: URL) -> str:
    return url.render_as_string(hide_password=False)


#: ``cli(*args) -> (exit status, stdout, stderr)``
Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(db_url: URL, capsys: pytest.CaptureFixture[str]) -> Cli:
    """``cli(*args) -> (exit status, stdout, stderr)`` against the test database."""

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main(["--url", url_arg(db_url), *args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def claim_one(engine: Engine, queue: str) -> store.Claim:
    with engine.begin() as conn:
        batch = store.claim(conn, queues=[queue], limit=1, lease_ms=60_000)
    assert len(batch.claimed) == 1
    return batch.claimed[0]


# -- upgrade ------------------------------------------------------------------------


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", WITH_MARIADB)
def test_upgrade_creates_the_table_and_is_idempotent(empty_engine: Engine, cli: Cli) -> None:
    assert not inspect(empty_engine).has_table("watchdog_jobs")
    status, out, _ = cli("upgrade")
    assert status == 0
    assert HEAD_REVISION in out
    assert inspect(empty_engine).has_table("watchdog_jobs")
    status, out, _ = cli("--json", "upgrade")
    assert status == 0
    assert json.loads(out)["heads"] == [HEAD_REVISION]
    with empty_engine.connect() as conn:
        versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    assert versions == [HEAD_REVISION]
    # The migrated table is the model: jobs go in and come out.
    add(empty_engine, Job("a", "q"))
    assert read(empty_engine, "a").state is JobState.QUEUED


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", WITH_MARIADB)
def test_upgrade_matches_the_model(empty_engine: Engine, cli: Cli) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    assert cli("upgrade")[0] == 0
    with empty_engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", WITH_MARIADB)
def test_upgrade_refuses_a_database_with_foreign_revisions(empty_engine: Engine, cli: Cli) -> None:
    with empty_engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('app0001')"))
    status, _, err = cli("upgrade")
    assert status == 1
    assert "app0001" in err and "alembic upgrade heads" in err


# -- reads ----------------------------------------------------------------------------


@pytest.mark.dialect_specific
@pytest.mark.parametrize("dialect", WITH_MARIADB)
def test_show_ls_stats_and_purge_read_and_act_on_a_migrated_database_of_every_dialect(
    empty_engine: Engine, cli: Cli
) -> None:
    assert cli("upgrade")[0] == 0
    add(empty_engine, Job("parent", "q", payload={"n": 1}), Job("child", "q", after=("parent",)))
    status, out, _ = cli("show", "parent")
    assert status == 0 and "dependents        child" in out and '{"n": 1}' in out
    status, out, _ = cli("--json", "ls")
    assert status == 0 and [json.loads(line)["job_id"] for line in out.splitlines()] == ["parent", "child"]
    status, out, _ = cli("--json", "stats")
    assert status == 0
    (queue,) = json.loads(out)["queues"]
    assert (queue["queue"], queue["queued"], queue["waiting"]) == ("q", 1, 1)
    status, out, _ = cli("purge", "q")
    assert status == 0 and "2 queued or delayed job(s) deleted" in out
    assert Watchdog(empty_engine).read("parent") is None and Watchdog(empty_engine).read("child") is None


def test_show(engine: Engine, cli: Cli) -> None:
    add(engine, Job("order-1", "emails", lane="team:7", priority=3, payload={"to": "ada@example.com"}))
    status, out, _ = cli("show", "order-1")
    assert status == 0
    lines = dict(line.split(None, 1) for line in out.splitlines())
    assert lines["job_id"] == "order-1"
    assert lines["lane"] == "team:7"
    assert lines["state"] == "queued"
    assert lines["outcome"] == "-"
    assert json.loads(lines["payload"]) == {"to": "ada@example.com"}

    status, out, _ = cli("--json", "show", "order-1")
    assert status == 0
    shown = json.loads(out)
    assert shown["priority"] == 3 and shown["payload"] == {"to": "ada@example.com"}


def test_show_says_which_unique_key_a_job_holds_and_how_many_enqueues_it_absorbed(engine: Engine, cli: Cli) -> None:
    digest = {"unique_key": "digest:ada", "unique_for": timedelta(hours=1)}
    add(engine, Job("digest-1", "emails", **digest))  # type: ignore[arg-type]
    add(engine, Job("digest-2", "emails", **digest))  # type: ignore[arg-type]
    status, out, _ = cli("show", "digest-1")
    line = dict(line.split(None, 1) for line in out.splitlines())["unique_key"]
    assert status == 0 and "'digest:ada' (unique_for" in line and "1 later enqueue(s) were duplicates" in line
    status, out, _ = cli("--json", "show", "digest-1")
    (hold,) = json.loads(out)["applies"]["unique_keys"]
    assert (hold["unique_key"], hold["kind"], hold["duplicates"]) == ("digest:ada", "unique_for", 1)
    assert cli("show", "digest-2")[0] != 0  # the duplicate was never written


def test_show_prints_the_trace_context_a_job_was_enqueued_under(engine: Engine, cli: Cli) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    add(engine, Job("traced", "emails"))
    with engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET trace_context = :c"), {"c": json.dumps({"traceparent": parent})})
    status, out, _ = cli("show", "traced")
    assert status == 0 and dict(line.split(None, 1) for line in out.splitlines())["traceparent"] == parent
    status, out, _ = cli("--json", "show", "traced")
    assert json.loads(out)["trace_context"] == {"traceparent": parent}


def test_show_and_ls_print_an_undecodable_stored_payload_as_unknown(engine: Engine, cli: Cli) -> None:
    add(engine, Job("poisoned", "emails", payload={"to": "x"}))
    with engine.begin() as conn:  # a producer's own INSERT/UPDATE
        conn.execute(text("UPDATE watchdog_jobs SET payload_json = :p"), {"p": "[" * 1500 + "]" * 1500})
    status, out, _ = cli("show", "poisoned")
    assert status == 0
    assert dict(line.split(None, 1) for line in out.splitlines())["payload"].startswith(
        "<undecodable payload_json: RecursionError"
    )
    status, out, _ = cli("--json", "show", "poisoned")
    shown = json.loads(out)
    assert shown["payload"] is None and shown["undecodable"]["payload"].startswith("RecursionError")
    status, out, _ = cli("--json", "ls")
    assert status == 0 and "poisoned" in out


def test_show_prints_a_failed_handlers_traceback(engine: Engine, cli: Cli) -> None:
    from sqlalchemy_watchdog import Runner

    def broken(job: Any) -> None:
        raise KeyError("missing")

    add(engine, Job("order-2", "emails"))
    Runner(engine, {"emails": broken}).run_until_idle()
    status, out, _ = cli("show", "order-2")
    assert status == 0
    lines = dict(
        line.split(None, 1) for line in out.splitlines() if len(line.split(None, 1)) == 2 and not line.startswith(" ")
    )
    assert lines["failure_reason"] == "KeyError: 'missing'"
    detail = out[out.index("failure_detail") :].splitlines()
    assert detail[1].strip() == "Traceback (most recent call last):"
    assert detail[-1].strip() == "KeyError: 'missing'"
    status, out, _ = cli("--json", "show", "order-2")
    assert json.loads(out)["failure_detail"].rstrip().endswith("KeyError: 'missing'")


def show_lines(out: str) -> dict[str, str]:
    """The ``name  value`` lines of ``show``'s output (not the blocks: their
    heading line has a name only, their lines are indented)."""
    pairs = [line.split(None, 1) for line in out.splitlines() if line and not line.startswith(" ")]
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


def test_show_a_delayed_job_with_its_own_policy(engine: Engine, cli: Cli) -> None:
    run_at = datetime.fromisoformat("2031-05-04T03:02:01.123+02:00")
    policy = RetryPolicy(
        max_attempts=3, backoff=timedelta(seconds=2), factor=3, max_backoff=timedelta(seconds=90), jitter=0.25
    )
    add(engine, Job("later", "emails", run_at=run_at, retry=policy, timeout=timedelta(milliseconds=2500)))
    status, out, _ = cli("show", "later")
    assert status == 0
    lines = show_lines(out)
    assert lines["state"] == "delayed"
    # Shown in UTC, to the millisecond, as stored.
    assert lines["run_at"] == lines["ready_at"] == "2031-05-04T01:02:01.123+00:00"
    assert lines["attempt"] == "1 of 3"
    assert lines["snoozes"] == "0"
    assert lines["timeout"] == "2.5s (the job's own)"
    assert lines["retry"] == "3 attempts, backoff 2s x 3 (at most 90s), jitter 0.25 (the job's own)"
    assert lines["queue_pause"] == "-"
    assert lines["failure_history"] == "-"

    status, out, _ = cli("--json", "show", "later")
    assert status == 0
    shown = json.loads(out)
    assert datetime.fromisoformat(shown["run_at"]) == run_at
    assert datetime.fromisoformat(shown["ready_at"]) == run_at
    assert (shown["state"], shown["attempt"], shown["max_attempts"], shown["snoozes"]) == ("delayed", 1, 3, 0)
    assert shown["timeout_ms"] == 2500
    assert shown["retry"] == {
        "max_attempts": 3,
        "backoff_ms": 2000,
        "factor": 3.0,
        "max_backoff_ms": 90_000,
        "jitter": 0.25,
    }
    assert shown["failure_history"] == []


def test_show_a_job_without_a_policy_of_its_own(engine: Engine, cli: Cli) -> None:
    add(engine, Job("plain", "emails"))
    lines = show_lines(cli("show", "plain")[1])
    assert (lines["run_at"], lines["ready_at"]) == ("-", "-")  # it never waited
    # No policy of its own, no @handler here: the runner's applies, which this process cannot know.
    assert lines["attempt"] == "1 (of its handler's or runner's maximum, not known here)"
    assert lines["timeout"] == (
        "its handler's or the runner's timeout (@handler(queue, timeout=...) or Runner(timeout=...) where the "
        "runner runs): not known in this process; with neither, none"
    )
    assert lines["retry"].startswith("its handler's or the runner's retry policy (@handler(queue, retry=...) or")
    shown = json.loads(cli("--json", "show", "plain")[1])
    assert {k: shown[k] for k in ("run_at", "ready_at", "max_attempts", "timeout_ms", "retry")} == dict.fromkeys(
        ("run_at", "ready_at", "max_attempts", "timeout_ms", "retry")
    )
    assert (shown["attempt"], shown["snoozes"], shown["failure_history"]) == (1, 0, [])


def test_show_says_what_applies_from_which_level_the_pause_and_the_reason_in_plain_words(
    engine: Engine, cli: Cli
) -> None:
    from sqlalchemy_watchdog import Watchdog, handler
    from sqlalchemy_watchdog.core.handlers import _registry

    @handler("handled", retry=RetryPolicy(max_attempts=5, backoff=timedelta(seconds=1)), timeout=timedelta(seconds=2))
    def handled(job: RunningJob) -> None:
        return None

    try:
        add(engine, Job("by-handler", "handled"), Job("lost", "lost-q", lane="l"))
        Watchdog(engine).pause("handled", reason="deploy")
        claim_one(engine, "lost-q")
        with engine.begin() as conn:  # its worker died: the lease ends, recovery settles it
            conn.exec_driver_sql("UPDATE watchdog_jobs SET lease_until = 0 WHERE job_id = 'lost'")
        Runner(engine, {"lost-q": lambda job: None}).run_until_idle()

        lines = show_lines(cli("show", "by-handler")[1])
        assert lines["attempt"] == "1 of 5"
        assert lines["timeout"] == "2s (its handler's, @handler in this process)"
        assert lines["retry"].startswith("5 attempts, backoff 1s x 2") and lines["retry"].endswith(
            "(its handler's, @handler in this process)"
        )
        assert lines["queue_pause"].startswith("paused since ") and lines["queue_pause"].endswith(": deploy")
        shown = json.loads(cli("--json", "show", "by-handler")[1])
        assert shown["applies"]["timeout"] == {"timeout_ms": 2000, "from": "handler", "known": True}
        assert shown["applies"]["retry"] == {"max_attempts": 5, "from": "handler", "known": True}
        assert shown["applies"]["max_attempts"] == 5 and shown["applies"]["queue_pause"]["reason"] == "deploy"
        assert shown["max_attempts"] is None  # the job's own: none

        lines = show_lines(cli("show", "lost")[1])
        assert lines["outcome"] == "interrupted"
        assert (
            lines["failure_reason"] == "worker died or lost its lease (no recovery budget: max_recoveries is not set)"
        )
        shown = json.loads(cli("--json", "show", "lost")[1])
        assert shown["failure_reason"] == "Execution disappeared without a recovery policy"  # stored as it was
        assert shown["applies"]["reason"].startswith("worker died")
    finally:
        _registry.pop("handled", None)


def test_show_says_the_recovery_budget_that_applies_and_where_it_comes_from(engine: Engine, cli: Cli) -> None:
    """A job without a budget of its own runs under its handler's (or the
    runner's): ``show`` says so, and never "no recovery budget" for a job
    that was requeued."""
    from sqlalchemy_watchdog import handler
    from sqlalchemy_watchdog.core.handlers import _registry

    add(engine, Job("own", "budgets", max_recoveries=2), Job("by-handler", "budgets"))
    with engine.begin() as conn:  # one recovery used, as the runner's requeue leaves it
        conn.exec_driver_sql("UPDATE watchdog_jobs SET recovery_count = 1 WHERE job_id = 'by-handler'")
    assert show_lines(cli("show", "own")[1])["recoveries"] == "0 of 2 (the job's own)"
    requeued = show_lines(cli("show", "by-handler")[1])["recoveries"]
    assert requeued == (
        "1 (of its handler's or runner's budget, not known here, at least 1: it was requeued; "
        "with neither, a vanished execution settles interrupted)"
    )
    assert "no recovery budget" not in requeued

    @handler("budgets", max_recoveries=3)
    def budgets(job: RunningJob) -> None:
        return None

    try:
        lines = show_lines(cli("show", "by-handler")[1])
        assert lines["recoveries"] == "1 of 3 (its handler's, @handler in this process)"
        shown = json.loads(cli("--json", "show", "by-handler")[1])
        assert shown["applies"]["recovery"] == {"max_recoveries": 3, "from": "handler", "known": True}
        add(engine, Job("none", "at-most-once"))

        @handler("at-most-once", max_recoveries=None)
        def at_most_once(job: RunningJob) -> None:
            return None

        assert show_lines(cli("show", "none")[1])["recoveries"] == (
            "0 (no recovery budget, its handler's, @handler in this process: a vanished execution settles interrupted)"
        )
    finally:
        _registry.pop("budgets", None)
        _registry.pop("at-most-once", None)


def test_show_prints_the_failure_history_one_line_per_attempt(engine: Engine, cli: Cli) -> None:
    own = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=1), jitter=0)
    add(engine, Job("own", "emails", retry=own), Job("runners", "emails"))

    def flaky(job: RunningJob) -> Decision:
        if job.job_id == "runners" and job.attempt == 2:
            return Decision.snooze(timedelta(hours=1))
        # Straight back to queued (after=0): run_until_idle runs every attempt.
        return Decision.retry(f"attempt {job.attempt} failed:\nsecond line", after=timedelta(0))

    before = datetime.now(UTC)
    runner = Runner(engine, {"emails": flaky}, retry=RetryPolicy(max_attempts=4))
    runner.run_until_idle()
    after = datetime.now(UTC)

    status, out, _ = cli("show", "own")
    assert status == 0
    lines = show_lines(out)
    assert (lines["state"], lines["outcome"], lines["attempt"]) == ("settled", "failed", "3 of 3")
    assert lines["failure_reason"] == "attempt 3 failed:\\nsecond line"  # one line too
    history = out[out.index("failure_history") :].splitlines()[1:]
    assert len(history) == 3  # one line per failed attempt, the reason's line break shown as \n
    for number, line in enumerate(history, start=1):
        at, word, attempt, reason = line.split(None, 3)
        assert before - timedelta(seconds=1) <= datetime.fromisoformat(at) <= after + timedelta(seconds=1)
        assert (word, attempt, reason) == ("attempt", str(number), f"attempt {number} failed:\\nsecond line")
    shown = json.loads(cli("--json", "show", "own")[1])
    assert [(e["attempt"], e["reason"]) for e in shown["failure_history"]] == [
        (n, f"attempt {n} failed:\nsecond line") for n in (1, 2, 3)
    ]
    assert [datetime.fromisoformat(e["at"]) for e in shown["failure_history"]] == [
        datetime.fromisoformat(line.split()[0]) for line in history
    ]

    # The runner's policy applied: the job has no max_attempts of its own to show.
    status, out, _ = cli("show", "runners")
    lines = show_lines(out)
    assert (lines["state"], lines["snoozes"]) == ("delayed", "1")
    assert lines["attempt"] == "2 (of its handler's or runner's maximum, not known here)"
    ready_at = datetime.fromisoformat(lines["ready_at"])
    assert after + timedelta(minutes=59) < ready_at < after + timedelta(minutes=61)
    assert [line.split()[2] for line in out[out.index("failure_history") :].splitlines()[1:]] == ["1"]
    shown = json.loads(cli("--json", "show", "runners")[1])
    assert (shown["attempt"], shown["max_attempts"], shown["snoozes"]) == (2, None, 1)


def test_show_prints_when_a_job_was_enqueued_started_and_settled_and_its_reruns(engine: Engine, cli: Cli) -> None:
    from sqlalchemy_watchdog import Runner, Watchdog

    add(engine, Job("timed", "emails"))
    Runner(engine, {"emails": lambda job: None}).run_until_idle()
    Watchdog(engine).rerun("timed", rerun_id="again")
    lines = show_lines(cli("show", "timed")[1])
    enqueued, started, settled = (datetime.fromisoformat(lines[k]) for k in ("enqueued_at", "started_at", "settled_at"))
    assert enqueued <= started <= settled
    assert (lines["rerun_of"], lines["reruns"]) == ("-", "timed~rerun~again")
    shown = json.loads(cli("--json", "show", "timed~rerun~again")[1])
    assert shown["rerun_of"] == "timed" and shown["enqueued_at"] and shown["started_at"] is None
    assert shown["settled_at"] is None and shown["reruns"] == []


def test_show_missing_job_exits_1(engine: Engine, cli: Cli) -> None:
    status, out, err = cli("show", "nope")
    assert status == 1
    assert out == ""
    assert "no job 'nope'" in err
    status, out, _ = cli("--json", "show", "nope")
    assert status == 1 and json.loads(out) is None


def test_head(engine: Engine, cli: Cli) -> None:
    status, out, _ = cli("head", "emails")
    assert (status, out.strip()) == (0, "queue 'emails' is idle")
    add(engine, Job("low", "emails"), Job("high", "emails", priority=5), Job("other", "sms", priority=9))
    status, out, _ = cli("--json", "head", "emails")
    assert status == 0 and json.loads(out)["job_id"] == "high"
    claim_one(engine, "emails")  # "high" is running now: the running job is the head
    add(engine, Job("higher", "emails", priority=50))
    status, out, _ = cli("head", "emails")
    assert status == 0
    assert "high\n" in out and "running" in out


def test_settled_pages_in_admission_order(engine: Engine, cli: Cli) -> None:
    add(engine, *(Job(f"job-{i}", "q") for i in range(5)), Job("still-queued", "other"))

    def handle(job: RunningJob) -> Decision | None:
        return Decision.failed("boom") if job.job_id == "job-3" else None

    Runner(engine, {"q": handle}).run_until_idle()
    status, out, _ = cli("settled", "--limit", "2")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["sequence", "job_id", "queue", "outcome", "failure_reason"]
    assert [line.split()[1] for line in lines[1:3]] == ["job-0", "job-1"]
    assert lines[3].startswith("(more may follow: --after ")
    after = lines[3].split("--after ")[1].rstrip(")")

    status, out, _ = cli("--json", "settled", "--after", after)
    assert status == 0
    jobs = [json.loads(line) for line in out.splitlines()]
    assert [j["job_id"] for j in jobs] == ["job-2", "job-3", "job-4"]
    assert jobs[1]["outcome"] == "failed" and jobs[1]["failure_reason"] == "boom"

    status, out, _ = cli("settled", "--after", "1000000")
    assert (status, out.strip()) == (0, "no settled jobs after sequence 1000000")


# -- commands ---------------------------------------------------------------------------


def test_cancel(engine: Engine, cli: Cli) -> None:
    add(engine, Job("a", "q"), Job("b", "q"))
    assert cli("cancel", "a", "cancel-a")[:2] == (0, "a: recorded\n")
    assert cli("cancel", "a", "cancel-a")[:2] == (0, "a: replayed\n")
    status, out, err = cli("cancel", "a", "cancel-a-again")
    assert (status, out) == (1, "a: conflict\n")
    assert "not recorded" in err
    status, out, err = cli("--json", "cancel", "ghost", "cancel-ghost")
    assert status == 1 and json.loads(out) == {"job_id": "ghost", "status": "missing"}
    assert "no job 'ghost'" in err
    assert read(engine, "a").cancellation_id == "cancel-a"


def test_cancel_only_if_queued_refuses_a_running_job(engine: Engine, cli: Cli) -> None:
    add(engine, Job("a", "q"))
    claim_one(engine, "q")
    status, out, err = cli("cancel", "a", "cancel-a", "--only-if-queued")
    assert (status, out) == (1, "a: conflict\n")
    assert "or is running" in err
    assert cli("cancel", "a", "cancel-a")[:2] == (0, "a: recorded\n")


def test_fail_lane_repeats_until_the_lane_is_empty(engine: Engine, cli: Cli) -> None:
    count = LANE_FAILURE_BATCH + 5
    add(engine, *(Job(f"j{i}", "q", lane="team:1") for i in range(count)), Job("other", "q", lane="team:2"))
    claim_one(engine, "q")  # one of them running
    status, out, _ = cli("--json", "fail-lane", "team:1", "upstream key revoked")
    assert status == 0
    assert json.loads(out) == {"lane": "team:1", "settled": count}
    job = read(engine, "j0")
    assert (job.outcome, job.failure_reason) == (Outcome.FAILED, "upstream key revoked")
    assert read(engine, "other").state is JobState.QUEUED
    status, out, _ = cli("fail-lane", "team:1", "again")
    assert (status, out.strip()) == (0, "lane 'team:1': 0 job(s) settled failed")


def test_purge_deletes_only_queued_jobs(engine: Engine, cli: Cli) -> None:
    add(engine, Job("running", "q", priority=9), Job("q1", "q"), Job("q2", "q"), Job("elsewhere", "other"))
    claim_one(engine, "q")
    status, out, _ = cli("purge", "q")
    assert (status, out.strip()) == (0, "queue 'q': 2 queued or delayed job(s) deleted")
    watchdog = Watchdog(engine)
    assert watchdog.read("q1") is None and watchdog.read("q2") is None
    assert read(engine, "running").state is JobState.RUNNING
    assert read(engine, "elsewhere").state is JobState.QUEUED


# -- errors -------------------------------------------------------------------------------


def test_usage_errors_exit_2(engine: Engine, cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert cli("frobnicate")[0] == 2
    assert cli("show")[0] == 2
    assert cli("settled", "--limit", "0")[0] == 2
    assert cli("settled", "--limit", "ten")[0] == 2
    assert cli("run", "a:b:c")[0] == 2
    assert cli("run", ":attr")[0] == 2
    capsys.readouterr()
    assert main(["--url", "nosuchdialect://x", "show", "a"]) == 2
    err = capsys.readouterr().err
    assert "nosuchdialect" in err and len(err.splitlines()) == 1
    assert main(["--help"]) == 0


def test_global_options_go_before_or_after_the_command(
    engine: Engine, db_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    add(engine, Job("anywhere", "q"))
    url = url_arg(db_url)
    for argv in (
        ["--url", url, "--json", "show", "anywhere"],
        ["show", "anywhere", "--url", url, "--json"],
        ["--json", "show", "--url", url, "anywhere", "--log-level", "WARNING"],
        ["--url", "sqlite:////nonexistent/elsewhere.db", "show", "anywhere", "--json", "--url", url],
    ):
        capsys.readouterr()
        assert main(argv) == 0, argv
        assert json.loads(capsys.readouterr().out)["job_id"] == "anywhere"


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"sqlalchemy-watchdog {version('sqlalchemy-watchdog')}\n"


def test_exit_status_rule(engine: Engine, cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    """0: done, "nothing there" included; 1: not done; 2: usage error. The
    rule is the one --help prints."""
    add(engine, Job("a", "q", lane="l"), Job("b", "q"))
    table = [
        (["show", "a"], 0),
        (["show", "ghost"], 1),
        (["head", "idle-queue"], 0),
        (["settled"], 0),  # none settled yet
        (["cancel", "a", "c1"], 0),
        (["cancel", "a", "c1"], 0),  # replayed
        (["cancel", "a", "c2"], 1),  # conflict
        (["cancel", "ghost", "c3"], 1),  # missing
        (["fail-lane", "no-such-lane", "r"], 0),
        (["fail-lane", "l", "r"], 0),
        (["purge", "empty-queue"], 0),
        (["purge", "q"], 0),
        (["show", "a", "--bogus"], 2),
    ]
    for argv, expected in table:
        assert cli(*argv)[0] == expected, argv
    assert main(["--help"]) == 0
    assert "exit status:" in capsys.readouterr().out


#: Hostile command lines: each a usage error (exit 2), one line on stderr
#: naming the culprit, no traceback, no password.
HOSTILE_ARGV = [
    (["run", "json", "--lease", "1e300"], "--lease"),
    (["run", "json", "--grace", "1e300"], "--grace"),
    (["run", "json", "--heartbeat", "1e10"], "--heartbeat"),
    (["run", "json", "--poll-interval", "-1"], "--poll-interval"),
    (["run", "json", "--lease", "nan"], "--lease"),
    (["run", "json", "--lease", "inf"], "--lease"),
    (["run", "json", "--lease", "ten"], "--lease"),
    (["run", "json", "--concurrency", "9" * 400], "--concurrency"),
    (["run", "json", "--concurrency", "0"], "--concurrency"),
    (["run", "json", "--claim-ahead", "-1"], "--claim-ahead"),
    (["run", "json", "--claim-ahead", "10001"], "--claim-ahead"),
    (["--url", "postgresql://u:pw-secret@127.0.0.1:notaport/db", "show", "x"], "notaport"),
    (["show", "x", "--url", "postgresql://u:pw-secret@127.0.0.1:notaport/db"], "notaport"),
    (["--url", "postgresql://u:pw-secret@127.0.0.1:99999999999999999999999/db", "head", "q"], "URL"),
    (["--url", "not a url", "show", "x"], "URL"),
    (["--url", "nosuchdialect://u:pw-secret@h/x", "show", "x"], "nosuchdialect"),
    (["--url", "sqlite+nosuchdriver:///x.db", "show", "x"], "nosuchdriver"),
    (["--log-level", "LOUD", "show", "x"], "--log-level"),
    (["show", "x", "--log-level", "LOUD"], "--log-level"),
    (["settled", "--limit", "1e3"], "--limit"),
    (["settled", "--after", "-1"], "--after"),
    (["settled", "--after", "9" * 5000], "--after"),
    (["show"], "job_id"),
    (["frobnicate"], "frobnicate"),
    ([], "COMMAND"),
    (["run", "a:b:c"], "a:b:c"),
    (["schedules", "json", "--count", "0"], "--count"),
    (["schedules", "json", "--count", "1001"], "--count"),
    (["schedules", "a:b:c"], "a:b:c"),
    (["schedules", "--count", "3"], "MODULE"),  # --count lists slots of a module's schedules: MODULE needed
]


@pytest.mark.parametrize(
    ("argv", "named"), HOSTILE_ARGV, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None
)
def test_hostile_command_lines_are_usage_errors(
    argv: list[str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the default database would be ./watchdog.db
    monkeypatch.delenv("WATCHDOG_DATABASE_URL", raising=False)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert named in err
    assert "Traceback" not in err and "pw-secret" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.dialect_specific
def test_database_errors_are_printed_without_row_contents(engine: Engine, cli: Cli) -> None:
    """A database refusal reaching the command line shows the SQLSTATE /
    constraint, never the failing row (claim token, payload)."""
    add(engine, Job("a", "q", payload={"secret": "payload-secret-7"}))
    claim = claim_one(engine, "q")
    with engine.begin() as conn:  # the row now holds a secret reason too
        conn.execute(text("UPDATE watchdog_jobs SET failure_reason = 'reason-secret-8'"))
    with engine.begin() as conn:
        if engine.dialect.name in ("postgresql", "mysql", "mariadb"):
            conn.execute(text("ALTER TABLE watchdog_jobs ADD CONSTRAINT ck_no_cancel CHECK (cancellation_id IS NULL)"))
        else:
            conn.execute(
                text(
                    "CREATE TRIGGER no_cancel BEFORE UPDATE OF cancellation_id ON watchdog_jobs "
                    "BEGIN SELECT RAISE(ABORT, 'cancellations are disabled'); END"
                )
            )
    status, _, err = cli("cancel", "a", "cid-secret-9")
    assert status == 1
    assert len(err.splitlines()) == 1, err
    for secret in (claim.token, "payload-secret-7", "reason-secret-8", "cid-secret-9"):
        assert secret not in err, err
    assert ("ck_no_cancel" if engine.dialect.name != "sqlite" else "cancellations are disabled") in err


def test_watchdog_errors_exit_1_with_their_message(engine: Engine, cli: Cli) -> None:
    status, _, err = cli("settled", "--limit", "257")
    assert status == 1
    assert "invalid_input" in err and "limit" in err
    status, _, err = cli("show", "x" * 257)
    assert status == 1 and "job_id" in err


NO_TABLE = "no watchdog_jobs table: run `sqlalchemy-watchdog upgrade` first"

#: Every command but upgrade, with arguments; "run" names an importable module.
READ_AND_COMMAND_LINES = [
    ["show", "a"],
    ["head", "q"],
    ["settled"],
    ["cancel", "a", "cancel-a"],
    ["fail-lane", "lane", "reason"],
    ["purge", "q"],
    ["run", "json"],
]


@pytest.mark.parametrize("argv", READ_AND_COMMAND_LINES, ids=lambda argv: argv[0])
def test_no_command_but_upgrade_creates_a_sqlite_file(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command but ``upgrade``, ``run`` included, refuses a SQLite URL
    whose file does not exist, with the hint, exit 1, and leaves no file."""
    path = tmp_path / "absent.db"
    assert main(["--url", f"sqlite:///{path}", *argv]) == 1
    err = capsys.readouterr().err
    assert NO_TABLE in err and str(path) in err
    assert not path.exists()


@pytest.mark.dialect_specific
@pytest.mark.parametrize("argv", READ_AND_COMMAND_LINES, ids=lambda argv: argv[0])
def test_missing_table_on_either_dialect(argv: list[str], empty_engine: Engine, cli: Cli) -> None:
    """A database without the table: every command but ``upgrade`` (``run``
    at start, instead of retrying forever) refuses with the hint, exit 1,
    and creates nothing."""
    with empty_engine.begin() as conn:  # the database exists (on SQLite: the file)
        conn.execute(text("CREATE TABLE unrelated (id INTEGER PRIMARY KEY)"))
    status, _, err = cli(*argv)
    assert status == 1
    assert NO_TABLE in err
    assert inspect(empty_engine).get_table_names() == ["unrelated"]


@pytest.mark.dialect_specific
def test_run_refuses_a_database_without_the_table_whatever_the_runner(
    empty_engine: Engine, cli: Cli, app_module: tuple[str, Path]
) -> None:
    """A factory's runner, sync or async, is checked on its own engine."""
    name, path = app_module
    path.write_text(FACTORY_MODULE + ASYNC_MODULE.replace("def make_runner", "def make_async_runner"))
    for target in (f"{name}:make_runner", f"{name}:make_async_runner", f"{name}:HANDLERS"):
        status, _, err = cli("run", target)
        assert status == 1, err
        assert NO_TABLE in err


def test_url_from_the_environment(
    engine: Engine, db_url: URL, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add(engine, Job("from-env", "q"))
    monkeypatch.setenv("WATCHDOG_DATABASE_URL", url_arg(db_url))
    assert main(["show", "from-env"]) == 0
    assert "from-env" in capsys.readouterr().out


# -- run --------------------------------------------------------------------------------------


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A fresh importable module name in ``tmp_path`` (the working directory)."""
    name = f"watchdog_cli_app_{uuid.uuid4().hex[:8]}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, tmp_path / f"{name}.py"
    sys.modules.pop(name, None)


FACTORY_MODULE = """
from datetime import timedelta
from sqlalchemy_watchdog import Decision, Runner

def make_runner(engine):
    def handle(job):
        if (job.payload or {}).get("last"):
            runner.stop()
        return Decision.failed("declined") if (job.payload or {}).get("declined") else None

    runner = Runner(engine, {"cli-q": handle}, poll_interval=timedelta(milliseconds=50))
    return runner

def handle_mapped(job):
    return None

HANDLERS = {"cli-q": handle_mapped}
"""


def test_run_with_a_runner_factory(engine: Engine, cli: Cli, app_module: tuple[str, Path]) -> None:
    name, path = app_module
    path.write_text(FACTORY_MODULE)
    add(
        engine,
        Job("ok", "cli-q", priority=2),
        Job("declined", "cli-q", priority=1, payload={"declined": True}),
        Job("last", "cli-q", priority=0, payload={"last": True}),
    )
    status, _, err = cli("run", f"{name}:make_runner")
    assert status == 0, err
    watchdog = Watchdog(engine)
    assert read(engine, "ok").outcome is Outcome.COMPLETED
    assert read(engine, "declined").outcome is Outcome.FAILED
    assert read(engine, "last").outcome is Outcome.COMPLETED
    assert not watchdog.has_pending_work()


ASYNC_MODULE = """
from datetime import timedelta
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy_watchdog.asyncio import AsyncRunner

def make_runner(engine):
    driver = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}.get(engine.dialect.name, "mysql+aiomysql")
    async_engine = create_async_engine(engine.url.set(drivername=driver), poolclass=NullPool)

    async def handle(job):
        if (job.payload or {}).get("last"):
            runner.stop()

    runner = AsyncRunner(async_engine, {"cli-async": handle}, poll_interval=timedelta(milliseconds=50))
    return runner
"""


def test_run_with_an_async_runner_factory(engine: Engine, cli: Cli, app_module: tuple[str, Path]) -> None:
    name, path = app_module
    path.write_text(ASYNC_MODULE)
    add(engine, Job("first", "cli-async", priority=1), Job("last", "cli-async", payload={"last": True}))
    status, _, err = cli("run", f"{name}:make_runner")
    assert status == 0, err
    watchdog = Watchdog(engine)
    assert [j.outcome for j in watchdog.read_settled()] == [Outcome.COMPLETED, Outcome.COMPLETED]


def test_run_refuses_options_with_a_factory_and_bad_targets(
    engine: Engine, cli: Cli, app_module: tuple[str, Path]
) -> None:
    name, path = app_module
    path.write_text(FACTORY_MODULE + "\nNOT_A_RUNNER = 42\n")
    status, _, err = cli("run", f"{name}:make_runner", "--concurrency", "4")
    assert status == 2 and "--concurrency" in err
    status, _, err = cli("run", f"{name}:NOT_A_RUNNER")
    assert status == 1 and "int" in err
    status, _, err = cli("run", f"{name}:missing")
    assert status == 1 and "no attribute 'missing'" in err
    status, _, err = cli("run", "no_such_module_for_cli_tests")
    assert status == 1 and "cannot import" in err
    # A mapping gets the runner options; an invalid one is refused before it runs.
    status, _, err = cli("run", f"{name}:HANDLERS", "--lease", "1", "--heartbeat", "1")
    assert status == 1 and "heartbeat" in err
    status, _, err = cli("run", f"{name}:HANDLERS", "--queue", "not-served")
    assert status == 1 and "not-served" in err


SCHEDULED_MODULE = """
from datetime import timedelta
from sqlalchemy_watchdog import Runner, Schedule, handler

NIGHTLY = Schedule("nightly", "0 3 * * *", "cli-sched", timezone="Europe/Paris")
MORE = [Schedule("hourly", "0 * * * *", "cli-sched")]

@handler("cli-sched")
def work(job):
    return None

HANDLERS = {"cli-sched": work}

def unscheduled_runner(engine):
    return Runner(engine, HANDLERS)

def scheduled_runner(engine):
    return Runner(engine, HANDLERS, schedules=[NIGHTLY, *MORE])

def redefined_runner(engine):
    return Runner(engine, HANDLERS, schedules=[NIGHTLY, Schedule("hourly", "30 * * * *", "cli-sched")])
"""


def _built_runner(engine: Engine, *argv: str) -> Any:
    from sqlalchemy_watchdog.cli import build_parser, build_runner

    return build_runner(build_parser().parse_args(["run", *argv]), engine)


def test_run_module_serves_the_modules_schedules_as_the_schedules_command_finds_them(
    engine: Engine, cli: Cli, app_module: tuple[str, Path]
) -> None:
    """``run MODULE`` (and ``run MODULE:HANDLERS``) never skip the module's
    schedules: the runner it builds serves exactly those ``schedules MODULE``
    lists; ``--no-schedules`` serves none, on purpose."""
    name, path = app_module
    path.write_text(SCHEDULED_MODULE.replace("cli-sched", name))  # @handler registers each queue once
    status, out, err = cli("schedules", name, "--json")
    listed = [json.loads(line)["name"] for line in out.splitlines()]
    assert (status, err, listed) == (0, "", ["nightly", "hourly"])
    for target in (name, f"{name}:HANDLERS"):
        served = [schedule.name for schedule in _built_runner(engine, target).settings.schedules]
        assert served == listed, target
        assert _built_runner(engine, target, "--no-schedules").settings.schedules == ()


def test_run_refuses_a_runner_that_does_not_serve_the_modules_schedules(
    engine: Engine, cli: Cli, app_module: tuple[str, Path]
) -> None:
    """A runner (or a factory's) that leaves out -- or defines otherwise -- a
    schedule of its module is refused with a message naming it, exit 1; one
    serving them all runs; ``--no-schedules`` accepts it knowingly."""
    name, path = app_module
    path.write_text(SCHEDULED_MODULE.replace("cli-sched", name))  # @handler registers each queue once
    status, _, err = cli("run", f"{name}:unscheduled_runner")
    assert status == 1
    assert "'nightly', 'hourly'" in err and "does not serve" in err and "--no-schedules" in err
    status, _, err = cli("run", f"{name}:redefined_runner")
    assert status == 1 and "'hourly'" in err and "'nightly'" not in err
    runner = _built_runner(engine, f"{name}:scheduled_runner")
    assert [schedule.name for schedule in runner.settings.schedules] == ["nightly", "hourly"]
    assert _built_runner(engine, f"{name}:unscheduled_runner", "--no-schedules").settings.schedules == ()


def test_run_passes_claim_ahead_to_the_runner_it_builds(engine: Engine, app_module: tuple[str, Path]) -> None:
    """``--claim-ahead N`` caps the jobs claimed beyond the concurrency (0: never);
    without it the runner's default, twice the concurrency."""
    name, path = app_module
    path.write_text(FACTORY_MODULE)
    assert _built_runner(engine, f"{name}:HANDLERS", "--claim-ahead", "0").settings.ahead_cap == 0
    assert _built_runner(engine, f"{name}:HANDLERS", "--claim-ahead", "7").settings.ahead_cap == 7
    assert _built_runner(engine, f"{name}:HANDLERS", "--concurrency", "3").settings.ahead_cap == 12


WORKER_MODULE = """
from sqlalchemy_watchdog import handler

@handler("cli-sub")
def work(job):
    return None
"""


def test_run_in_a_subprocess_until_sigterm(engine: Engine, db_url: URL, tmp_path: Path) -> None:
    name = f"watchdog_cli_worker_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(WORKER_MODULE)
    add(engine, Job("sub-1", "cli-sub"), Job("sub-2", "cli-sub", payload={"n": 2}))
    env = {**os.environ, "WATCHDOG_DATABASE_URL": url_arg(db_url), "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "sqlalchemy_watchdog.cli", "run", name, "--poll-interval", "0.1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        watchdog = Watchdog(engine)
        deadline = time.monotonic() + 30
        while watchdog.has_pending_work() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.05)
        assert not watchdog.has_pending_work(), worker.poll()
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, err
    # The budget the platform's termination period must exceed, printed at start.
    assert "shutdown budget: 22s (grace 20s + stop wait 2s)" in out
    # INFO logging is on for `run`: the start line, no line per job (DEBUG).
    assert "shutdown_budget=22s" in err and "settled job sub-1" not in err
    assert "runner stopped" in err
    assert [j.job_id for j in Watchdog(engine).read_settled()] == ["sub-1", "sub-2"]


PROCESS_WORKER_MODULE = """
import os
from pathlib import Path
from sqlalchemy_watchdog import handler

@handler("cli-proc")
def work(job):
    Path(f"ran-{job.job_id}").write_text(str(os.getpid()))
"""


def test_run_with_the_process_executor_in_a_subprocess_until_sigterm(
    engine: Engine, db_url: URL, tmp_path: Path
) -> None:
    """``run MODULE --executor process --processes 2``: the module's
    handlers run in child processes of the command, which ends them on SIGTERM."""
    name = f"watchdog_cli_proc_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(PROCESS_WORKER_MODULE)
    add(engine, *(Job(f"p{i}", "cli-proc") for i in range(4)))
    env = {**os.environ, "WATCHDOG_DATABASE_URL": url_arg(db_url), "PYTHONPATH": str(ROOT)}
    argv = ["run", name, "--poll-interval", "0.1", "--executor", "process", "--processes", "2", "--kill-grace", "1"]
    argv += ["--prefetch", "1"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "sqlalchemy_watchdog.cli", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        watchdog = Watchdog(engine)
        deadline = time.monotonic() + 60
        while watchdog.has_pending_work() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.05)
        assert not watchdog.has_pending_work(), worker.poll()
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, err
    assert "concurrency=2 (processes)" in err
    pids = {int((tmp_path / f"ran-p{i}").read_text()) for i in range(4)}
    assert worker.pid not in pids and 1 <= len(pids) <= 2
    assert [j.outcome for j in Watchdog(engine).read_settled()] == [Outcome.COMPLETED] * 4


MIXED_WORKER_MODULE = """
import os
from pathlib import Path
from sqlalchemy_watchdog import handler

@handler("cli-io")
def io(job):
    Path(f"ran-{job.job_id}").write_text(str(os.getpid()))

@handler("cli-cpu")
def cpu(job):
    Path(f"ran-{job.job_id}").write_text(str(os.getpid()))
"""


def test_run_with_one_queue_in_children_beside_the_others_in_threads_in_a_subprocess(
    engine: Engine, db_url: URL, tmp_path: Path
) -> None:
    """``run MODULE --executor cli-cpu=process --processes 1``: that queue's
    handler runs in a child of the command, the other queue's in the
    command's own process; the start line says which runs where."""
    name = f"watchdog_cli_mixed_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(MIXED_WORKER_MODULE)
    add(engine, *(Job(f"io{i}", "cli-io") for i in range(3)), *(Job(f"cpu{i}", "cli-cpu") for i in range(3)))
    env = {**os.environ, "WATCHDOG_DATABASE_URL": url_arg(db_url), "PYTHONPATH": str(ROOT)}
    argv = ["run", name, "--poll-interval", "0.1", "--concurrency", "2", "--executor", "cli-cpu=process"]
    argv += ["--processes", "1", "--kill-grace", "1"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "sqlalchemy_watchdog.cli", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        watchdog = Watchdog(engine)
        deadline = time.monotonic() + 60
        while watchdog.has_pending_work() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.05)
        assert not watchdog.has_pending_work(), worker.poll()
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, err
    assert "concurrency=3 (thread 2: cli-io; process 1: cli-cpu)" in err
    assert {int((tmp_path / f"ran-io{i}").read_text()) for i in range(3)} == {worker.pid}
    cpu_pids = {int((tmp_path / f"ran-cpu{i}").read_text()) for i in range(3)}
    assert len(cpu_pids) == 1 and worker.pid not in cpu_pids
    assert [j.outcome for j in Watchdog(engine).read_settled()] == [Outcome.COMPLETED] * 6


def test_run_forward_logger_reaches_the_process_executor(engine: Engine, app_module: tuple[str, Path]) -> None:
    name, path = app_module
    path.write_text(FACTORY_MODULE)
    argv = ["--executor", "process", "--forward-logger", "httpx", "--forward-logger", "app.db"]
    runner = _built_runner(engine, f"{name}:HANDLERS", *argv)
    assert runner.settings.executor.forward_loggers == ("httpx", "app.db")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--executor", "fork"], "expected thread, process, QUEUE=thread or QUEUE=process, got 'fork'"),
        (["--executor", "cli-q=fork"], "got 'cli-q=fork'"),
        (["--executor", "=process"], "the queue before '=' is empty"),
        (["--executor", "nope=process"], "--executor: queue 'nope' is not served by this runner"),
        (["--executor", "process", "--executor", "thread"], "give the runner's default once"),
        (["--executor", "cli-q=process", "--executor", "cli-q=thread"], "give a queue's once"),
        (["--executor", "cli-q=thread", "--processes", "2"], "--processes apply only with --executor process"),
    ],
    ids=["unknown", "unknown-for-a-queue", "no-queue", "unknown-queue", "two-defaults", "a-queue-twice", "no-process"],
)
def test_run_refuses_a_malformed_or_unknown_executor(
    engine: Engine, cli: Cli, app_module: tuple[str, Path], flags: list[str], says: str
) -> None:
    name, path = app_module
    path.write_text(FACTORY_MODULE)
    status, _, err = cli("run", f"{name}:HANDLERS", *flags)
    assert status == 2, err
    assert says in err


def test_run_gives_a_queues_executor_to_the_runner(
    engine: Engine, app_module: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--executor QUEUE=process`` with the process options: that queue's
    handler is placed in children of one ``ProcessExecutor`` built from them,
    the others keep the default."""
    from sqlalchemy_watchdog.cli.commands.serving import build_runner
    from sqlalchemy_watchdog.cli.parser import build_parser

    name, path = app_module
    path.write_text(FACTORY_MODULE + "\nHANDLERS['cli-r'] = handle_mapped\n")
    args = build_parser().parse_args(
        ["run", f"{name}:HANDLERS", "--executor", "cli-r=process", "--processes", "3", "--concurrency", "5"]
    )
    runner = build_runner(args, engine)
    assert runner.settings.executors == {"cli-q": "thread", "cli-r": "process"}
    assert [(g.queues, g.concurrency) for g in runner.settings.slot_groups] == [(("cli-q",), 5), (("cli-r",), 3)]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--processes", "2"], "--processes apply only with --executor process"),
        (["--executor", "thread", "--kill-grace", "3"], "--kill-grace apply only with --executor process"),
        (["--prefetch", "0"], "--prefetch apply only with --executor process"),
        (["--forward-logger", "httpx"], "--forward-loggers apply only with --executor process"),
        (["--executor", "process", "--concurrency", "4"], "not --concurrency"),
        (["--executor", "process", "--claim-ahead", "4"], "not --claim-ahead"),
    ],
    ids=[
        "processes-without-executor",
        "kill-grace-with-threads",
        "prefetch-with-threads",
        "forward-logger-with-threads",
        "concurrency-with-processes",
        "claim-ahead-with-processes",
    ],
)
def test_run_refuses_process_options_that_do_not_go_together(
    engine: Engine, cli: Cli, app_module: tuple[str, Path], flags: list[str], says: str
) -> None:
    name, path = app_module
    path.write_text(FACTORY_MODULE)
    status, _, err = cli("run", f"{name}:HANDLERS", *flags)
    assert status == 2, err
    assert says in err


def test_console_script(engine: Engine, db_url: URL) -> None:
    script = Path(sys.executable).parent / "sqlalchemy-watchdog"
    if not script.exists():
        pytest.skip(f"console script not installed beside {sys.executable}")
    add(engine, Job("via-script", "q"))
    done = subprocess.run(
        [str(script), "--url", url_arg(db_url), "--json", "show", "via-script"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "queued"
    done = subprocess.run([str(script), "frobnicate"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2


# -- schedules ----------------------------------------------------------------------------------

SCHEDULES_MODULE = """
from sqlalchemy_watchdog import Schedule

NIGHTLY = Schedule("nightly-report", "30 2 * * *", "reports", timezone="Europe/Berlin")
SCHEDULES = [
    NIGHTLY,  # listed twice: shown once
    Schedule("new-year", "0 0 1 1 *", "fun", timezone="America/New_York", priority=3),
]
MORE = (Schedule("leap-day", "0 12 29 2 *", "rare"),)
NOT_A_SCHEDULE = {"name": "ignored"}
"""


def _schedules_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["schedules", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_schedules_lists_a_modules_schedules_with_their_next_slots(
    app_module: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No database is used: not even a bad database URL in the environment
    matters, and no SQLite file appears."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    name, path = app_module
    path.write_text(SCHEDULES_MODULE)
    monkeypatch.setenv("WATCHDOG_DATABASE_URL", "not a url")
    before = datetime.now(UTC)
    status, out, err = _schedules_cli(capsys, name, "--count", "2")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["name", "cron", "timezone", "queue", "next", "(local)", "next", "(UTC)"]
    module = sys.modules[name]
    expected_rows: list[list[str]] = []
    for schedule in (module.NIGHTLY, module.SCHEDULES[1], module.MORE[0]):
        for index, slot in enumerate(schedule.slots(before, 2)):
            local = slot.astimezone(ZoneInfo(schedule.timezone))
            cells = [schedule.name, *schedule.cron.split(), schedule.timezone, schedule.queue] if index == 0 else []
            expected_rows.append(
                [
                    *cells,
                    *local.isoformat(sep=" ", timespec="minutes").split(),
                    local.tzname() or "",
                    f"{slot:%Y-%m-%d}",
                    f"{slot:%H:%M}",
                    "UTC",
                ]
            )
    assert [line.split() for line in lines[1:]] == expected_rows
    # e.g. the Berlin night slot in winter: 02:30 local is 01:30 UTC (in summer 00:30 UTC).
    nightly = lines[1]
    assert "02:30+01:00 CET" in nightly or "02:30+02:00 CEST" in nightly
    assert list(path.parent.glob("*.db")) == []


def test_schedules_json(app_module: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    name, path = app_module
    path.write_text(SCHEDULES_MODULE)
    status, out, _ = _schedules_cli(capsys, name, "--json", "--count", "1")
    assert status == 0
    shown = [json.loads(line) for line in out.splitlines()]
    assert [s["name"] for s in shown] == ["nightly-report", "new-year", "leap-day"]
    new_year = shown[1]
    assert {k: new_year[k] for k in ("cron", "timezone", "queue", "lane", "priority", "catch_up")} == {
        "cron": "0 0 1 1 *",
        "timezone": "America/New_York",
        "queue": "fun",
        "lane": "fun",
        "priority": 3,
        "catch_up": 1,
    }
    [slot] = new_year["next"]
    assert slot["local"].endswith("-01-01T00:00:00-05:00")
    assert slot["utc"].endswith("-01-01T05:00:00Z")
    # MODULE:ATTR names one schedule or a list of them.
    status, out, _ = _schedules_cli(capsys, f"{name}:MORE", "--json")
    assert status == 0 and [json.loads(line)["name"] for line in out.splitlines()] == ["leap-day"]
    assert len(json.loads(out)["next"]) == 3  # the default count


def test_schedules_of_a_module_without_any_is_not_an_error(
    app_module: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    name, path = app_module
    path.write_text("VALUE = 1\n")
    assert _schedules_cli(capsys, name) == (0, f"no schedules in {name!r}\n", "")
    assert _schedules_cli(capsys, name, "--json") == (0, "", "")


def test_schedules_errors_are_one_line(app_module: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    name, path = app_module
    cases = [
        # A module that cannot be imported, for any reason: exit 1, one line.
        ("raise RuntimeError('boom at import')\n", name, f"cannot import {name!r}: RuntimeError: boom at import"),
        ("import no_such_dependency_for_cli_tests\n", name, "No module named 'no_such_dependency_for_cli_tests'"),
        (
            "from sqlalchemy_watchdog import Schedule\nBAD = Schedule('x', '61 * * * *', 'q')\n",
            name,
            "InvalidJob: cron: '61 * * * *' is not a valid cron expression: Bad minute",
        ),
        ("", "no_such_module_for_cli_tests", "cannot import 'no_such_module_for_cli_tests'"),
        # Two schedules sharing a name would share job ids: refused as a runner refuses them.
        (
            "from sqlalchemy_watchdog import Schedule\n"
            "A = Schedule('same', '0 * * * *', 'q')\nB = Schedule('same', '0 0 * * *', 'q')\n",
            name,
            "schedules: the name 'same' is used by more than one schedule",
        ),
        ("VALUE = 1\n", f"{name}:VALUE", "expected a module, a Schedule or a list of them, got a int"),
    ]
    for source, target, message in cases:
        sys.modules.pop(name, None)
        path.write_text(source)
        status, out, err = _schedules_cli(capsys, target)
        assert (status, out) == (1, ""), (source, err)
        assert len(err.splitlines()) == 1 and message in err, err
        assert "Traceback" not in err


# -- operations: ls, stats, prune, pause, resume, rerun ----------------------------------------


def age_settled(engine: Engine, days: float, *job_ids: str) -> None:
    """Move the jobs' settled time ``days`` into the past (as if they settled then)."""
    with engine.begin() as conn:
        for job_id in job_ids:
            conn.execute(
                text("UPDATE watchdog_jobs SET settled_at = settled_at - :ms WHERE job_id = :job_id"),
                {"ms": int(days * 86_400_000), "job_id": job_id},
            )


def job_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT job_id FROM watchdog_jobs")).scalars())


def run_all(engine: Engine, queue: str, failing: tuple[str, ...] = ()) -> None:
    def handle(job: RunningJob) -> Decision | None:
        return Decision.failed("declined") if job.job_id in failing else None

    Runner(engine, {queue: handle}).run_until_idle()


def test_ls_table_filters_and_pages(engine: Engine, cli: Cli) -> None:
    add(
        engine,
        Job("a_1", "emails", lane="team:1"),
        Job("ab2", "emails", lane="team:2"),
        Job("a_3", "emails", lane="team:1"),
        Job("sms-1", "sms", lane="team:1"),
    )
    run_all(engine, "emails", failing=("ab2",))
    add(engine, Job("a_4", "emails"))
    claim_one(engine, "sms")

    status, out, _ = cli("ls")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "sequence",
        "job_id",
        "queue",
        "state",
        "attempt",
        "enqueued_at",
        "started_at",
        "settled_at",
    ]
    rows = {cells[1]: cells for cells in (line.split() for line in lines[1:])}
    assert list(rows) == ["a_1", "ab2", "a_3", "sms-1", "a_4"]  # admission order, no paging note
    assert rows["a_1"][3] == "settled/completed" and rows["ab2"][3] == "settled/failed"
    assert rows["sms-1"][3] == "running" and rows["a_4"][3] == "queued"
    assert rows["a_1"][4] == "1"
    # Times: UTC to the second; a queued job has not started nor settled.
    for cell in rows["a_1"][5:]:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", cell), cell
    assert rows["sms-1"][7] == "-" and rows["sms-1"][6] != "-"
    assert rows["a_4"][6:] == ["-", "-"]

    # A full page says where the next one starts; the next page follows on.
    status, out, _ = cli("ls", "--limit", "2")
    lines = out.splitlines()
    assert [line.split()[1] for line in lines[1:3]] == ["a_1", "ab2"]
    assert lines[3].startswith("(more may follow: --after ")
    after = lines[3].split("--after ")[1].rstrip(")")
    status, out, _ = cli("ls", "--limit", "2", "--after", after)
    assert [line.split()[1] for line in out.splitlines()[1:3]] == ["a_3", "sms-1"]

    def listed(*argv: str) -> list[str]:
        status, out, err = cli("--json", "ls", *argv)
        assert status == 0, err
        return [json.loads(line)["job_id"] for line in out.splitlines()]

    assert listed("--queue", "sms") == ["sms-1"]
    assert listed("--state", "settled") == ["a_1", "ab2", "a_3"]
    assert listed("--outcome", "failed") == ["ab2"]
    assert listed("--lane", "team:1", "--state", "settled") == ["a_1", "a_3"]
    assert listed("--prefix", "a_") == ["a_1", "a_3", "a_4"]  # literal: "_" is no wildcard
    assert listed("--queue", "emails", "--after", after, "--limit", "1") == ["a_3"]

    # Newest first (-r), paged down with --before.
    assert listed("--newest-first") == ["a_4", "sms-1", "a_3", "ab2", "a_1"]
    status, out, _ = cli("ls", "-r", "--limit", "2")
    lines = out.splitlines()
    assert [line.split()[1] for line in lines[1:3]] == ["a_4", "sms-1"]
    assert lines[3].startswith("(more may follow: --before ")
    before = lines[3].split("--before ")[1].rstrip(")")
    assert listed("-r", "--limit", "2", "--before", before) == ["a_3", "ab2"]
    assert listed("--before", before) == ["a_1", "ab2", "a_3"]
    assert listed("-r", "--prefix", "a_", "--before", before) == ["a_3", "a_1"]
    status, out, _ = cli("ls", "-r", "--before", "1")
    assert (status, out.strip()) == (0, "no matching jobs before sequence 1")

    status, out, _ = cli("ls", "--queue", "nothing-here")
    assert (status, out.strip()) == (0, "no matching jobs after sequence 0")
    status, out, _ = cli("--json", "ls", "--queue", "nothing-here")
    assert (status, out) == (0, "")


def test_ls_json_carries_attempt_times_and_rerun_of(engine: Engine, cli: Cli) -> None:
    add(engine, Job("orig", "q", payload={"n": 1}))
    run_all(engine, "q")
    Watchdog(engine).rerun("orig", rerun_id="again")
    status, out, _ = cli("--json", "ls")
    assert status == 0
    orig, copy = (json.loads(line) for line in out.splitlines())
    assert orig["job_id"] == "orig" and orig["outcome"] == "completed" and orig["attempt"] == 1
    enqueued, started, settled_ = (
        datetime.fromisoformat(orig[name]) for name in ("enqueued_at", "started_at", "settled_at")
    )
    assert enqueued.utcoffset() == timedelta(0)
    assert enqueued <= started <= settled_
    assert abs(datetime.now(UTC) - settled_) < timedelta(minutes=5)
    assert orig["rerun_of"] is None
    assert copy["job_id"] == "orig~rerun~again" and copy["rerun_of"] == "orig"
    assert copy["state"] == "queued" and copy["payload"] == {"n": 1}
    assert copy["started_at"] is None and copy["settled_at"] is None


def test_stats_table_and_json(engine: Engine, cli: Cli) -> None:
    status, out, _ = cli("stats")
    assert status == 0
    assert out.splitlines()[1] == "no queue has live jobs, jobs settled in the last hour, or a pause"
    status, out, _ = cli("--json", "stats")
    assert status == 0 and json.loads(out)["queues"] == []

    add(engine, *(Job(f"done-{i}", "emails") for i in range(3)))
    run_all(engine, "emails", failing=("done-1",))
    add(
        engine,
        Job("waiting-1", "emails"),
        Job("waiting-2", "emails"),
        Job("later", "emails", run_at=datetime.now(UTC) + timedelta(hours=1)),
        Job("stuck", "emails", priority=9),
        Job("follows", "emails", after=["later"]),  # waits for its parent: counted apart
    )
    with engine.begin() as conn:  # "stuck" is running under a lease that has ended
        assert [c.job.job_id for c in store.claim(conn, queues=["emails"], limit=1, lease_ms=1).claimed] == ["stuck"]
    Watchdog(engine).pause("sms", reason="provider outage")

    status, out, _ = cli("--json", "stats")
    assert status == 0
    document = json.loads(out)
    assert datetime.fromisoformat(document["at"]).utcoffset() == timedelta(0)
    emails, sms = document["queues"]
    age = emails.pop("oldest_ready_age_seconds")
    assert 0 <= age < 300
    assert emails == {
        "queue": "emails",
        "delayed": 1,
        "queued": 2,
        "running": 1,
        "waiting": 1,
        "expired_leases": 1,
        "settled_last_minute": {"completed": 2, "failed": 1, "cancelled": 0, "outcome_unknown": 0, "interrupted": 0},
        "settled_last_hour": {"completed": 2, "failed": 1, "cancelled": 0, "outcome_unknown": 0, "interrupted": 0},
        "paused": False,
        "workers": 0,
        "unserved": True,  # ready jobs, and no live worker serves the queue
        "pause": None,
        "limits": None,
    }
    paused_at = datetime.fromisoformat(sms["pause"].pop("paused_at"))
    assert abs(paused_at - datetime.fromisoformat(document["at"])) < timedelta(minutes=5)
    assert sms == {
        "queue": "sms",
        "delayed": 0,
        "queued": 0,
        "running": 0,
        "waiting": 0,
        "expired_leases": 0,
        "oldest_ready_age_seconds": None,
        "settled_last_minute": {"completed": 0, "failed": 0, "cancelled": 0, "outcome_unknown": 0, "interrupted": 0},
        "settled_last_hour": {"completed": 0, "failed": 0, "cancelled": 0, "outcome_unknown": 0, "interrupted": 0},
        "paused": True,
        "workers": 0,
        "unserved": False,
        "pause": {"reason": "provider outage"},
        "limits": None,
    }

    status, out, _ = cli("stats")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith("queues at ") and lines[0].endswith("Z (database clock)")
    assert lines[1].split() == [
        "queue",
        "delayed",
        "queued",
        "running",
        "waiting",
        "expired_leases",
        "oldest_ready",
        "last_minute",
        "last_hour",
        "workers",
        "paused",
    ]
    emails_row = lines[2].split(None, 10)
    assert emails_row[:6] == ["emails", "1", "2", "1", "1", "1"]
    assert re.fullmatch(r"\d+s|\d+m\d\ds", emails_row[6]), emails_row[6]
    assert emails_row[7:] == ["completed=2,failed=1", "completed=2,failed=1", "0!", "-"]
    sms_row = lines[3].split(None, 10)
    assert sms_row[:10] == ["sms", "0", "0", "0", "0", "0", "-", "-", "-", "0"]
    assert re.fullmatch(r"since \S+Z: provider outage", sms_row[10]), sms_row[10]
    assert lines[4:] == ["! no live worker serves 'emails', which has ready jobs"]


def read_frames(process: subprocess.Popen[bytes], until: Callable[[bytes], bool], timeout: float = 30) -> bytes:
    """Read the process's stdout as it comes until ``until(everything so far)``."""
    import selectors

    assert process.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while not until(seen):
            remaining = deadline - time.monotonic()
            assert remaining > 0 and process.poll() is None, (seen, process.poll())
            if selector.select(remaining):
                seen += os.read(process.stdout.fileno(), 65536)
    return seen


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_stats_watch_redraws_until_sigint(engine: Engine, db_url: URL, tmp_path: Path, as_json: bool) -> None:
    """``stats --watch`` redraws every --interval (showing what changed) and
    exits 0 on Ctrl-C; with --json it prints one document per line instead."""
    add(engine, Job("first", "before"))
    env = {**os.environ, "WATCHDOG_DATABASE_URL": url_arg(db_url), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "sqlalchemy_watchdog.cli", "stats", "--watch", "--interval", "0.2"]
    watcher = subprocess.Popen(
        [*argv, "--json"] if as_json else argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        seen = read_frames(watcher, lambda seen: b"before" in seen)
        add(engine, Job("second", "after"))  # a later frame shows the new queue
        seen += read_frames(watcher, lambda more: b"after" in seen + more)
        watcher.send_signal(signal.SIGINT)
        rest, err = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 0, err
    assert b"Traceback" not in err
    output = (seen + rest).decode()
    if as_json:
        assert "\x1b" not in output
        documents = [json.loads(line) for line in output.splitlines()]
        frames = [[q["queue"] for q in document["queues"]] for document in documents]
    else:
        assert output.startswith("\x1b[H\x1b[2J")
        frames = [
            [line.split()[0] for line in frame.splitlines()[2:] if line and not line.startswith(("(", "!"))]
            for frame in output.split("\x1b[H\x1b[2J")[1:]
        ]
        assert all(frame.splitlines()[0].startswith("queues at ") for frame in output.split("\x1b[H\x1b[2J")[1:])
    assert len(frames) >= 2
    assert frames[0] == ["before"]
    assert frames[-1] == ["after", "before"]


#: Start the command (``sys.argv[2:]``) in a process whose SIGINT is, as
#: ``sys.argv[1]`` says, ignored -- as a shell without job control leaves it
#: for whatever it starts with ``&`` (a script, a CI step, a test run in the
#: background) -- or blocked; both survive the exec.
INHERIT_SIGINT = """\
import os, signal, sys
if sys.argv[1] == "ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
else:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
os.execv(sys.executable, [sys.executable, "-m", "sqlalchemy_watchdog.cli", *sys.argv[2:]])
"""


@pytest.mark.parametrize("inherited", ["ignored", "blocked"])
def test_stats_watch_stops_on_sigint_even_when_it_inherited_sigint_ignored_or_blocked(
    engine: Engine, db_url: URL, tmp_path: Path, inherited: str
) -> None:
    """Ctrl-C always stops ``stats --watch`` (exit 0): started from a parent
    that ignored or blocked SIGINT, it still takes SIGINT as its stop, as
    ``run`` does -- it would otherwise redraw until killed."""
    add(engine, Job("first", "before"))
    env = {**os.environ, "WATCHDOG_DATABASE_URL": url_arg(db_url), "PYTHONPATH": str(ROOT)}
    argv = ["stats", "--watch", "--interval", "0.2", "--json"]
    watcher = subprocess.Popen(
        [sys.executable, "-c", INHERIT_SIGINT, inherited, *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        seen = read_frames(watcher, lambda seen: seen.count(b"\n") >= 2)
        watcher.send_signal(signal.SIGINT)
        rest, err = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 0, err
    assert b"Traceback" not in err
    documents = [json.loads(line) for line in (seen + rest).decode().splitlines()]
    assert [q["queue"] for q in documents[0]["queues"]] == ["before"]


def test_stats_usage_errors(engine: Engine, cli: Cli) -> None:
    status, out, err = cli("stats", "--interval", "1")
    assert (status, out) == (2, "") and "--interval applies only with --watch" in err
    for bad in ("0", "0.01", "-1", "nan", "soon"):
        status, out, err = cli("stats", "--watch", "--interval", bad)
        assert (status, out) == (2, ""), bad
        assert "--interval" in err and len(err.splitlines()) == 1


def test_prune_deletes_old_settled_jobs_only(engine: Engine, cli: Cli) -> None:
    add(engine, *(Job(name, "q") for name in ("old-ok-1", "old-ok-2", "old-failed", "new-ok", "undated")))
    run_all(engine, "q", failing=("old-failed",))
    age_settled(engine, 3, "old-ok-1", "old-ok-2", "old-failed")
    with engine.begin() as conn:  # settled before revision w0004: no time recorded
        conn.execute(text("UPDATE watchdog_jobs SET settled_at = NULL WHERE job_id = 'undated'"))
    add(
        engine,
        Job("running", "q"),
        Job("queued", "q"),
        Job("delayed", "q", run_at=datetime.now(UTC) + timedelta(days=1)),
    )
    claim_one(engine, "q")

    status, out, _ = cli("prune", "--older-than", "2d", "--outcome", "failed")
    assert (status, out) == (0, "1 failed job(s) pruned (settled more than 2d ago)\n")
    assert "old-failed" not in job_ids(engine)
    status, out, _ = cli("--json", "prune", "--older-than", "2d", "--limit", "1")
    assert status == 0
    assert json.loads(out) == {"deleted": 1, "older_than_seconds": 172800.0, "outcomes": None, "include_undated": False}
    status, out, _ = cli("prune", "--older-than", "4d")  # none settled that long ago
    assert (status, out) == (0, "0 settled job(s) pruned (settled more than 4d ago)\n")
    status, out, _ = cli("prune", "--older-than", "1d12h", "--outcome", "completed", "failed", "--outcome", "cancelled")
    assert (status, out) == (0, "1 completed/failed/cancelled job(s) pruned (settled more than 1d12h ago)\n")
    assert job_ids(engine) == {"new-ok", "undated", "running", "queued", "delayed"}
    status, out, _ = cli("prune", "--older-than", "0s")  # everything settled, but undated rows stay
    assert (status, out) == (0, "1 settled job(s) pruned (settled more than 0s ago)\n")
    assert job_ids(engine) == {"undated", "running", "queued", "delayed"}
    status, out, _ = cli("prune", "--older-than", "0s", "--include-undated")
    assert (status, out) == (0, "1 settled job(s) pruned (settled more than 0s ago)\n")
    assert job_ids(engine) == {"running", "queued", "delayed"}  # live jobs are never pruned


#: Bad prune command lines: exit 2, one line naming the option, nothing deleted.
BAD_PRUNES = [
    (["prune"], "--older-than"),
    (["prune", "--older-than", "30"], "--older-than"),
    (["prune", "--older-than", "30x"], "--older-than"),
    (["prune", "--older-than", "30D"], "--older-than"),
    (["prune", "--older-than", "-1d"], "--older-than"),
    (["prune", "--older-than", "+1d"], "--older-than"),
    (["prune", "--older-than", "1.5h"], "--older-than"),
    (["prune", "--older-than", " 30d"], "--older-than"),
    (["prune", "--older-than", "30 d"], "--older-than"),
    (["prune", "--older-than", "1h1d"], "--older-than"),
    (["prune", "--older-than", "1d1d"], "--older-than"),
    (["prune", "--older-than", "d"], "--older-than"),
    (["prune", "--older-than", ""], "--older-than"),
    (["prune", "--older-than", "\u0663d"], "--older-than"),  # an Arabic-Indic digit
    (["prune", "--older-than", "3651d"], "--older-than"),
    (["prune", "--older-than", "9" * 5000 + "d"], "--older-than"),
    (["prune", "--older-than", "1d", "--outcome", "finished"], "--outcome"),
    (["prune", "--older-than", "1d", "--outcome"], "--outcome"),
    (["prune", "--older-than", "1d", "--limit", "0"], "--limit"),
    (["prune", "--older-than", "1d", "--limit", "many"], "--limit"),
]


@pytest.mark.parametrize(
    ("argv", "named"), BAD_PRUNES, ids=lambda v: repr(" ".join(v)[:40]) if isinstance(v, list) else None
)
def test_prune_refuses_bad_input(argv: list[str], named: str, engine: Engine, cli: Cli) -> None:
    add(engine, Job("old", "q"))
    run_all(engine, "q")
    age_settled(engine, 4000, "old")
    status, out, err = cli(*argv)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1, err
    assert named in err
    assert job_ids(engine) == {"old"}


@pytest.mark.parametrize(
    ("text_", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("15m", timedelta(minutes=15)),
        ("90s", timedelta(seconds=90)),
        ("1h30m", timedelta(minutes=90)),
        ("1d2h3m4s", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("0s", timedelta(0)),
        ("3650d", timedelta(days=3650)),
    ],
)
def test_duration_syntax(text_: str, expected: timedelta) -> None:
    from sqlalchemy_watchdog.cli import format_duration, parse_duration

    assert parse_duration(text_) == expected
    assert parse_duration(format_duration(expected)) == expected


def test_pause_and_resume_are_idempotent_and_stop_claims(engine: Engine, cli: Cli) -> None:
    add(engine, Job("a", "q"))
    assert cli("pause", "q", "--reason", "deploying")[:2] == (0, "queue 'q': paused\n")
    assert cli("pause", "q", "--reason", "other")[:2] == (0, "queue 'q': already paused (its reason is unchanged)\n")
    status, out, _ = cli("--json", "pause", "q")
    assert (status, json.loads(out)) == (0, {"queue": "q", "status": "already_paused"})
    pause = Watchdog(engine).stats().queue("q").pause
    assert pause is not None and pause.reason == "deploying"
    with engine.begin() as conn:
        assert store.claim(conn, queues=["q"], limit=1, lease_ms=60_000).claimed == ()

    assert cli("resume", "q")[:2] == (0, "queue 'q': resumed\n")
    assert cli("resume", "q")[:2] == (0, "queue 'q': not paused\n")
    status, out, _ = cli("--json", "resume", "never-paused")
    assert (status, json.loads(out)) == (0, {"queue": "never-paused", "status": "not_paused"})
    assert claim_one(engine, "q").job.job_id == "a"
    status, out, _ = cli("--json", "pause", "q")
    assert (status, json.loads(out)) == (0, {"queue": "q", "status": "paused"})
    assert Watchdog(engine).stats().queue("q").pause.reason is None  # type: ignore[union-attr]


def test_pause_refuses_a_bad_reason(engine: Engine, cli: Cli) -> None:
    status, out, err = cli("pause", "q", "--reason", "x" * 2001)
    assert (status, out) == (1, "")
    assert "invalid_input" in err and "reason" in err
    assert not Watchdog(engine).stats().queue("q").paused


def test_rerun_and_cancel_where_count_first_then_act_once(engine: Engine, cli: Cli) -> None:
    add(engine, *(Job(f"mail-{n}", "mail") for n in range(3)), Job("sms-0", "sms"))
    run_all(engine, "mail", failing=("mail-0", "mail-2"))
    add(engine, Job("later-1", "mail", lane="team:1"), Job("later-2", "mail"))

    status, out, _ = cli("rerun", "--where", "queue=mail", "--where", "outcome=failed", "--rerun-id", "t1")
    assert (status, out) == (0, "2 job(s) match; nothing changed. Run again with --yes to rerun them.\n")
    assert Watchdog(engine).read("mail-0~rerun~t1") is None
    argv = ("rerun", "--where", "queue=mail", "--where", "outcome=failed", "--rerun-id", "t1", "--yes")
    status, out, _ = cli(*argv)
    assert (status, out.splitlines()) == (
        0,
        ["2 job(s) match.", "2 rerun, 0 already rerun by this id, 0 skipped (1 batch(es))."],
    )
    assert Watchdog(engine).read("mail-2~rerun~t1") is not None
    status, out, _ = cli("--json", *argv)
    assert json.loads(out) == {
        "matched": 2,
        "done": [],
        "repeated": ["mail-0~rerun~t1", "mail-2~rerun~t1"],
        "skipped": [],
        "batches": 1,
        "dry_run": False,
    }
    status, out, _ = cli("rerun", "--where", "settled-after=1h", "--where", "outcome=completed", "--rerun-id", "t2")
    assert out.startswith("1 job(s) match")

    status, out, _ = cli("cancel", "--where", "lane=team:1", "stop", "--yes")
    assert (status, out.splitlines()[-1]) == (
        0,
        "1 cancelled, 0 already cancelled by this id, 0 skipped (1 batch(es)).",
    )
    assert present(Watchdog(engine).read("later-1")).cancellation_id == "stop~later-1"
    assert present(Watchdog(engine).read("later-2")).cancellation_id is None


@pytest.mark.parametrize(
    ("argv", "status", "says"),
    [
        (["rerun", "--where", "queue", "--rerun-id", "x", "--yes"], 2, "KEY=VALUE"),
        (["rerun", "--where", "color=red", "--rerun-id", "x", "--yes"], 2, "KEY=VALUE"),
        (["rerun", "--where", "outcome=lost", "--rerun-id", "x", "--yes"], 2, "'lost'"),
        (["rerun", "--where", "settled-after=yesterday", "--rerun-id", "x", "--yes"], 2, "ISO 8601"),
        (["rerun", "--where", "settled-after=2026-01-01T00:00:00", "--rerun-id", "x", "--yes"], 2, "ISO 8601"),
        (["rerun", "orig", "--where", "queue=q", "--rerun-id", "x", "--yes"], 2, "not both"),
        (["rerun", "--rerun-id", "x", "--yes"], 2, "JOB_ID"),
        (["rerun", "--where", "queue=q", "--where", "queue=r", "--rerun-id", "x", "--yes"], 2, "twice"),
        (["cancel", "--where", "outcome=failed", "c", "--yes"], 2, "--where outcome"),
        (["cancel", "--where", "queue=q", "job", "c", "--yes"], 2, "CANCELLATION_ID alone"),
        (["rerun", "--where", "queue=q", "--rerun-id", "", "--yes"], 1, "rerun_id"),
    ],
)
def test_a_bad_where_is_refused_and_changes_nothing(
    engine: Engine, cli: Cli, argv: list[str], status: int, says: str
) -> None:
    add(engine, Job("orig", "q"), Job("waiting", "q"))
    run_all(engine, "q", failing=("orig",))
    add(engine, Job("waiting-2", "q"))
    before = [(job.job_id, job.state, job.cancellation_id) for job in Watchdog(engine).list_jobs()]
    code, _, err = cli(*argv)
    assert code == status and says in err, err
    assert [(job.job_id, job.state, job.cancellation_id) for job in Watchdog(engine).list_jobs()] == before


def test_rerun(engine: Engine, cli: Cli) -> None:
    add(engine, Job("orig", "q", lane="team:1", priority=4, payload={"n": 1}), Job("live", "q"))
    run_all(engine, "q", failing=("orig",))
    add(engine, Job("waiting", "q"))

    assert cli("rerun", "orig", "--rerun-id", "ticket-7")[:2] == (0, "orig~rerun~ticket-7: queued\n")
    assert cli("rerun", "orig", "--rerun-id", "ticket-7")[:2] == (0, "orig~rerun~ticket-7: duplicate\n")
    status, out, _ = cli("--json", "rerun", "orig", "--rerun-id", "ticket-8")
    assert (status, json.loads(out)) == (0, {"job_id": "orig~rerun~ticket-8", "rerun_of": "orig", "status": "queued"})
    copy = read(engine, "orig~rerun~ticket-7")
    assert (copy.state, copy.queue, copy.lane, copy.priority, copy.payload, copy.rerun_of) == (
        JobState.QUEUED,
        "q",
        "team:1",
        4,
        {"n": 1},
        "orig",
    )
    assert read(engine, "orig").reruns == ("orig~rerun~ticket-7", "orig~rerun~ticket-8")

    before = job_ids(engine)
    status, out, err = cli("rerun", "ghost", "--rerun-id", "r")
    assert (status, out) == (1, "") and "no job 'ghost'" in err
    status, out, err = cli("rerun", "waiting", "--rerun-id", "r")
    assert (status, out) == (1, "")
    assert "job 'waiting' is queued: only a settled job can be rerun" in err
    status, out, err = cli("rerun", "orig", "--rerun-id", "x" * 129)
    assert (status, out) == (1, "") and "rerun_id" in err
    status, out, err = cli("rerun", "orig")
    assert (status, out) == (2, "") and "--rerun-id" in err
    assert job_ids(engine) == before


def test_operations_exit_status_rule(engine: Engine, cli: Cli) -> None:
    add(engine, Job("done", "q"))
    run_all(engine, "q")
    add(engine, Job("waiting", "q"))
    table = [
        (["ls"], 0),
        (["ls", "--queue", "none"], 0),
        (["ls", "--state", "finished"], 2),
        (["ls", "--limit", "1001"], 2),
        (["ls", "--after", "-1"], 2),
        (["stats"], 0),
        (["prune", "--older-than", "30d"], 0),  # nothing that old
        (["prune", "--older-than", "30"], 2),
        (["pause", "q"], 0),
        (["pause", "q"], 0),
        (["resume", "q"], 0),
        (["resume", "q"], 0),
        (["rerun", "done", "--rerun-id", "r"], 0),
        (["rerun", "done", "--rerun-id", "r"], 0),  # duplicate
        (["rerun", "waiting", "--rerun-id", "r"], 1),
        (["rerun", "ghost", "--rerun-id", "r"], 1),
    ]
    for argv, expected in table:
        assert cli(*argv)[0] == expected, argv


OPERATIONS_COMMAND_LINES = [
    ["ls"],
    ["stats"],
    ["prune", "--older-than", "1d"],
    ["pause", "q"],
    ["resume", "q"],
    ["rerun", "a", "--rerun-id", "r"],
]


@pytest.mark.parametrize("argv", OPERATIONS_COMMAND_LINES, ids=lambda argv: argv[0])
def test_operations_refuse_a_missing_sqlite_file(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    test_no_command_but_upgrade_creates_a_sqlite_file(argv, tmp_path, capsys)


@pytest.mark.dialect_specific
@pytest.mark.parametrize("argv", OPERATIONS_COMMAND_LINES, ids=lambda argv: argv[0])
def test_operations_refuse_a_missing_table(argv: list[str], empty_engine: Engine, cli: Cli) -> None:
    test_missing_table_on_either_dialect(argv, empty_engine, cli)


# -- stored text never drives the terminal ---------------------------------------------------------

#: What a producer may put in a job id, a queue, a lane or a reason: retitle the
#: terminal (OSC 0, ended by BEL), clear it (CSI 2J), forge a line, reverse the text.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\nFORGED LINE\r\u202e\u061c\u180e\x9b31m"
#: How the command line shows it: every such character as its escape, on one line.
HOSTILE_SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\nFORGED LINE\\r\\u202e\\u061c\\u180e\\x9b31m"


def assert_shown_as_escapes(text: str) -> None:
    """No character of :data:`HOSTILE` that acts reached the output raw, and
    no stored line break made a line of its own."""
    for raw in ("\x1b", "\x07", "\r", "\u202e", "\u061c", "\u180e", "\x9b"):
        assert raw not in text, repr(raw)
    assert not any(line.startswith("FORGED LINE") for line in text.splitlines()), text
    assert HOSTILE_SHOWN in text, text


def test_every_human_readable_command_shows_stored_control_characters_as_escapes(engine: Engine, cli: Cli) -> None:
    job_id, queue, lane = f"id{HOSTILE}", f"q{HOSTILE}", f"lane{HOSTILE}"
    add(
        engine,
        Job(job_id, queue, lane=lane, payload={"note": HOSTILE}),
        Job(f"live{HOSTILE}", queue, lane=lane),
        Job(f"queued{HOSTILE}", queue),
    )
    Runner(engine, {queue: lambda job: Decision.failed(f"reason{HOSTILE}", retry=False)}).run_until_idle(max_ticks=1)
    Watchdog(engine).pause(queue, reason=f"pause{HOSTILE}")
    outputs = {
        "show": cli("show", job_id),
        "head": cli("head", queue),
        "settled": cli("settled"),
        "ls": cli("ls"),
        "stats": cli("stats"),
        "cancel": cli("cancel", f"queued{HOSTILE}", "c1"),
        "rerun": cli("rerun", job_id, "--rerun-id", f"r{HOSTILE}"),
        "pause": cli("pause", queue, "--reason", HOSTILE),
        "fail-lane": cli("fail-lane", lane, "why"),
        "resume": cli("resume", queue),
        "purge": cli("purge", queue),
        "show-missing": cli("show", f"ghost{HOSTILE}"),
    }
    for command, (status, out, err) in outputs.items():
        assert status in (0, 1), (command, err)
        for shown in (out, err):
            for raw in ("\x1b", "\x07", "\r", "\u202e", "\u061c", "\u180e", "\x9b"):
                assert raw not in shown, (command, repr(raw), shown)
            assert not any(line.startswith("FORGED LINE") for line in shown.splitlines()), (command, shown)
    # The escapes show what is stored, whole.
    for command in ("show", "settled", "ls", "stats", "rerun", "fail-lane"):
        assert_shown_as_escapes(outputs[command][1])
    show = show_lines(outputs["show"][1])
    assert show["failure_reason"] == f"reason{HOSTILE_SHOWN}"


def test_json_output_stays_exact(engine: Engine, cli: Cli) -> None:
    add(engine, Job(f"id{HOSTILE}", f"q{HOSTILE}", payload={"note": HOSTILE}))
    status, out, _ = cli("--json", "show", f"id{HOSTILE}")
    assert status == 0
    shown = json.loads(out)
    assert (shown["job_id"], shown["queue"], shown["payload"]) == (f"id{HOSTILE}", f"q{HOSTILE}", {"note": HOSTILE})
    status, out, _ = cli("--json", "ls")
    assert status == 0 and json.loads(out)["job_id"] == f"id{HOSTILE}"


# -- workers, recorded schedules ------------------------------------------------------------


def _register_worker(
    engine: Engine, worker_id: str, queues: tuple[str, ...], *, host: str = "host-1", processes: tuple[str, ...] = ()
) -> None:
    registration = store.WorkerRegistration(
        worker_id, host, 42, queues, 4, "listen", "0.1.0", 10_000, claim_ahead=16, process_queues=processes
    )
    with engine.begin() as conn:
        store.register_worker(conn, registration)


def test_workers_lists_live_and_gone_runners_as_a_table_and_json(engine: Engine, cli: Cli) -> None:
    status, out, _ = cli("workers")
    assert (status, out.strip()) == (0, "no workers registered (none serving, or none since the last clean shutdown)")
    _register_worker(engine, "w-live", ("emails", "sms"), processes=("sms",))
    _register_worker(engine, "w-dead", ("emails",), host="evil\x1b[2Jhost")
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE watchdog_workers SET last_seen = last_seen - 600000, started_at = started_at - 600000,"
                " running = 3 WHERE worker_id = 'w-dead'"
            )
        )
    status, out, _ = cli("workers")
    assert status == 0
    header, *rows = out.splitlines()
    assert header.split() == [
        "worker_id", "host", "pid", "queues", "concurrency", "ahead", "running", "started_at", "status", "wakeups",
    ]  # fmt: skip
    dead, live = sorted(rows)
    # Its sms handlers run in child processes, its emails handlers in its own process.
    assert live.split()[:7] == ["w-live", "host-1", "42", "emails,sms(process)", "4", "16", "0"]
    assert "live (seen" in live and dead.split()[3] == "emails"
    assert "GONE (silent 10m" in dead
    # A gone worker's last count is stale: the table shows none (JSON keeps it, beside "gone").
    assert dead.split()[6] == "-"
    assert "\x1b" not in out  # a host name's control characters are escaped
    status, out, _ = cli("--json", "workers")
    documents = {d["worker_id"]: d for d in map(json.loads, out.splitlines())}
    assert documents["w-live"]["queues"] == ["emails", "sms"] and documents["w-live"]["gone"] is False
    assert (documents["w-live"]["concurrency"], documents["w-live"]["claim_ahead"]) == (4, 16)
    assert documents["w-live"]["executors"] == {"emails": "thread", "sms": "process"}
    assert documents["w-dead"]["executors"] == {"emails": "thread"}
    assert documents["w-dead"]["gone"] is True and documents["w-dead"]["gone_after_seconds"] == 60.0
    assert documents["w-dead"]["running"] == 3


def test_schedules_without_a_module_shows_what_the_runners_serve_and_disputed_definitions(
    engine: Engine, cli: Cli
) -> None:
    status, out, _ = cli("schedules")
    assert (status, out.strip()) == (0, "no schedules recorded: no runner has served one in the last week")
    records = [
        store.ScheduleRecord("nightly", "f-1", "0 3 * * *", "Europe/Paris", "reports", 1_000_000, None),
        store.ScheduleRecord("hourly", "f-2", "0 * * * *", "UTC", "reports", None, 7_200_000),
    ]
    with engine.begin() as conn:
        store.record_schedules(conn, records, "w-old")
        store.record_schedules(
            conn, [store.ScheduleRecord("hourly", "f-3", "30 * * * *", "UTC", "reports", None, None)], "w-new"
        )
    status, out, _ = cli("schedules")
    assert status == 0
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["name", "cron", "timezone", "queue"]
    hourly = [row for row in rows if row.startswith("hourly")]
    assert len(hourly) == 2 and all("DISPUTED" in row for row in hourly)
    [nightly] = [row for row in rows if row.startswith("nightly")]
    assert "1970-01-01T00:16:40Z" in nightly and nightly.endswith("served")
    status, out, _ = cli("--json", "schedules")
    documents = [json.loads(line) for line in out.splitlines()]
    assert sorted((d["name"], d["cron"], d["disputed"]) for d in documents) == [
        ("hourly", "0 * * * *", True),
        ("hourly", "30 * * * *", True),
        ("nightly", "0 3 * * *", False),
    ]


def test_limits_shows_sets_and_clears_a_queues_limits(engine: Engine, cli: Cli) -> None:
    status, out, _ = cli("limits")
    assert (status, out) == (0, "no queue has limits\n")
    add(engine, *(Job(f"export-{i}", "exports", key=f"customer-{i % 2}") for i in range(4)))
    status, out, _ = cli("limits", "exports", "--concurrency", "1", "--per-key", "1", "--rate", "100/minute")
    assert status == 0
    assert out.split() == [
        "exports", "concurrency", "1", "(running", "0),", "per", "key", "1,", "rate", "100/m", "(used", "0),",
        "held", "back", "3",
    ]  # fmt: skip  # 4 ready, room for 1
    limits = Watchdog(engine).limits()
    assert [(q.queue, q.concurrency, q.concurrency_per_key, str(q.rate)) for q in limits] == [
        ("exports", 1, 1, "100/m")
    ]
    with engine.begin() as conn:
        assert len(store.claim(conn, queues=["exports"], limit=4, lease_ms=60_000).claimed) == 1
    status, out, _ = cli("--json", "limits")
    document = json.loads(out)
    assert (document["queue"], document["running"], document["rate_used"], document["held_back"]) == (
        "exports", 1, 1, 3,
    )  # fmt: skip
    assert document["rate"] == {"count": 100, "period_ms": 60_000, "text": "100/m"}
    status, out, _ = cli("show", "export-1")
    assert status == 0 and "waiting_for_room" in out and "concurrency limit is reached" in out
    status, out, _ = cli("stats")
    assert "limits of 'exports': concurrency 1 (running 1)" in out
    status, out, _ = cli("limits", "exports", "--rate-per-key", "2/30s")  # replaces the three above
    assert (status, out) == (0, "exports  rate per key 2/30s (busiest key used 0), held back 0\n")
    (per_key,) = Watchdog(engine).limits()
    assert (per_key.concurrency, per_key.rate, per_key.rate_per_key) == (None, None, Rate(2, timedelta(seconds=30)))
    status, out, _ = cli("--json", "limits", "exports")
    document = json.loads(out)
    assert document["rate_per_key"] == {"count": 2, "period_ms": 30_000, "text": "2/30s"}
    assert (document["rate_used"], document["rate_per_key_used"]) == (None, 0)
    status, out, _ = cli("limits", "exports", "--clear")
    assert (status, out) == (0, "queue 'exports': limits cleared\n")
    status, out, _ = cli("limits", "exports", "--clear")
    assert (status, out) == (0, "queue 'exports': had no limits\n")
    assert Watchdog(engine).limits() == ()


@pytest.mark.dialect_neutral
def test_limits_refuses_bad_values_naming_the_option_and_changes_nothing(engine: Engine, cli: Cli) -> None:
    for args in (
        ["limits", "q", "--concurrency", "0"],
        ["limits", "q", "--concurrency", "1000001"],
        ["limits", "q", "--per-key", "-1"],
        ["limits", "q", "--rate", "10/0s"],
        ["limits", "q", "--rate", "ten/s"],
        ["limits", "q", "--rate-per-key", "0/minute"],
        ["limits", "q", "--rate-per-key", "10/0s"],
        ["limits", "q", "--rate-per-key", "9999999999/s"],
        ["limits", "q", "--rate-per-key", "ten"],
        ["limits", "--rate-per-key", "1/s"],
        ["limits", "--concurrency", "3"],
        ["limits", "q", "--clear", "--concurrency", "3"],
    ):
        status, _, err = cli(*args)
        assert status == 2, (args, err)
    assert Watchdog(engine).limits() == ()


# -- results ----------------------------------------------------------------------------


def test_show_prints_a_completed_jobs_result(engine: Engine, cli: Cli) -> None:
    from sqlalchemy_watchdog import Runner

    add(engine, Job("priced", "emails"), Job("plain", "emails"))
    Runner(engine, {"emails": lambda job: {"total": 42} if job.job_id == "priced" else None}).run_until_idle()
    status, out, _ = cli("show", "priced")
    assert status == 0 and json.loads(dict(line.split(None, 1) for line in out.splitlines())["result"]) == {"total": 42}
    status, out, _ = cli("--json", "show", "priced")
    assert json.loads(out)["result"] == {"total": 42}
    status, out, _ = cli("show", "plain")
    assert dict(line.split(None, 1) for line in out.splitlines())["result"] == "-"
    assert dict(line.split(None, 1) for line in out.splitlines())["progress"] == "-"
    with engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET progress = 0.425, progress_note = 'step 3' WHERE job_id = 'plain'"))
    status, out, _ = cli("show", "plain")
    assert dict(line.split(None, 1) for line in out.splitlines())["progress"] == "42.5%: step 3"
    shown = json.loads(cli("--json", "show", "plain")[1])
    assert (shown["progress"], shown["progress_note"]) == (0.425, "step 3")
    assert shown["result"] is None


def test_show_prints_a_jobs_parents_and_dependents(engine: Engine, cli: Cli) -> None:
    add(engine, Job("p", "q"), Job("c", "q", after=["p"]))
    lines = dict(line.split(None, 1) for line in cli("show", "c")[1].splitlines())
    assert lines["waits_for"] == "p (not settled)" and lines["dependents"] == "-"
    assert dict(line.split(None, 1) for line in cli("show", "p")[1].splitlines())["dependents"] == "c"
    shown = json.loads(cli("--json", "show", "c")[1])
    assert shown["parents"] == [{"job_id": "p", "outcome": None}] and shown["waiting_on"] == 1
