"""Retries and timeouts against real worker processes (issue 9).

Each test runs ``tests/faults/chaos_worker.py`` processes (``Runner`` and,
with ``--asyncio``, ``AsyncRunner``) against a real database -- an SQLite
file shared by the processes, and PostgreSQL -- and reads what happened from
the rows, the trigger-fed transition log and the handlers' audit trail
(each audit row names the attempt it ran).

* A worker SIGKILLed during a job's *second attempt* (the first failed and
  was retried): another worker recovers it. A recovery is not an attempt --
  ``attempt`` stays 2 while ``recovery_count`` becomes 1 -- the failure
  history holds exactly the first attempt's failure, and the job completes,
  settled exactly once, having run at most once per attempt and recovery.
* A handler that ignores the stop of its attempt's timeout: its claim is no
  longer renewed, its lease lapses, and recovery takes the job (``attempt``
  unchanged, ``recovery_count`` + 1) while the handler still runs; its late
  settle is refused and changes nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, RetryPolicy, Watchdog
from tests.faults.helpers import (
    WorkerPool,
    assert_settled_exactly_once,
    audit_rows,
    enqueue_jobs,
    first_ended_audit_row,
    jobs_by_id,
    transition_rows,
    wait_until,
)

pytestmark = pytest.mark.slow

LEASE = 3.0
HEARTBEAT = 0.5
TIMING = {"lease": LEASE, "heartbeat": HEARTBEAT, "poll": 0.2}
RETRY = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=200), jitter=0.0)


def kind(runner_kind: str) -> dict[str, bool]:
    """The worker options of ``runner_kind``."""
    return {"asyncio": runner_kind == "async"}


def attempt_of(run: dict[str, Any]) -> int:
    """The attempt an audit row ran (its note: ``attempt N`` or ``attempt N: ACTION``)."""
    note = run["note"] or ""
    assert note.startswith("attempt "), run
    return int(note.split()[1].rstrip(":"))


def runs_of(engine: Engine, job_id: str) -> list[tuple[int, int, int, bool]]:
    """(pid, attempt, recovery_count, ended) of each run of the job's handler."""
    return [
        (r["pid"], attempt_of(r), r["recovery_count"], r["ended_ms"] is not None) for r in audit_rows(engine, job_id)
    ]


def recovery_of(engine: Engine, job_id: str, token: str) -> dict[str, Any]:
    """The transition that took the job from the dead claim ``token``."""
    for t in transition_rows(engine, job_id):
        if t["old_state"] == "running" and t["old_token"] == token and t["new_state"] != "running":
            return t
    raise AssertionError(f"no recovery of {job_id} from its claim {token}")


def test_sigkill_in_a_second_attempt_counts_the_recovery_apart_from_the_attempts(
    instrumented: Engine, db_url: URL, workers: WorkerPool, runner_kind: str
) -> None:
    """The first attempt fails and is retried after the backoff; the worker
    is SIGKILLed while the second attempt runs. Another worker recovers the
    job after its lease: attempt 2, recovery_count 1, one failure in the
    history, completed once -- and no (attempt, recovery) ran twice."""
    engine = instrumented
    victim = Job(
        "victim",
        "chaos",
        payload={"per_attempt": {"1": "fail"}, "action": "block", "only_first": 1},
        retry=RETRY,
        max_recoveries=1,
        priority=9,
    )
    # A bystander retried the same way, never killed: attempts 1 (failed) and 2.
    flaky = Job("flaky", "chaos", payload={"per_attempt": {"1": "fail"}}, retry=RETRY)
    enqueue_jobs(engine, [victim, flaky])

    w1 = workers.start(db_url, "w1", concurrency=2, **TIMING, **kind(runner_kind))
    wait_until(
        lambda: (
            any(attempt == 2 for _, attempt, _, _ in runs_of(engine, "victim"))
            and jobs_by_id(engine)["flaky"]["state"] == "settled"
        ),
        timeout=60,
        what="the victim's second attempt to start and the bystander to finish",
    )
    row = jobs_by_id(engine)["victim"]
    assert (row["state"], row["attempt"], row["recovery_count"]) == ("running", 2, 0), row
    token, lease_until = row["claim_token"], row["lease_until"]
    w1.kill()
    # The retry is the settle statement itself: it dropped the first claim,
    # moved to attempt 2 and recorded the first failure, all on the one row.
    first = Watchdog(engine).read("victim")
    assert first is not None
    assert [(f.attempt, f.reason) for f in first.failure_history] == [(1, "chaos failure")]

    w2 = workers.start(db_url, "w2", **TIMING, **kind(runner_kind))
    wait_until(
        lambda: all(r["state"] == "settled" for r in jobs_by_id(engine).values()),
        timeout=60,
        what="both jobs to settle",
    )
    rows = assert_settled_exactly_once(engine, ["victim", "flaky"])
    assert recovery_of(engine, "victim", token)["at_ms"] >= lease_until, "recovered before its lease ended"

    done = Watchdog(engine).read("victim")
    assert done is not None and done.outcome is not None
    assert (done.outcome.value, done.attempt, done.recovery_count) == ("completed", 2, 1)
    assert [(f.attempt, f.reason) for f in done.failure_history] == [(1, "chaos failure")]
    assert done.failure_reason is None and done.failure_detail is None
    # Every run: attempt 1 and 2 in w1 (the second killed), attempt 2 again in w2 after the recovery.
    assert runs_of(engine, "victim") == [(w1.pid, 1, 0, True), (w1.pid, 2, 0, False), (w2.pid, 2, 1, True)]
    per_attempt_and_recovery = Counter((attempt, count) for _, attempt, count, _ in runs_of(engine, "victim"))
    assert max(per_attempt_and_recovery.values()) == 1, per_attempt_and_recovery

    assert (rows["flaky"]["outcome"], rows["flaky"]["attempt"], rows["flaky"]["recovery_count"]) == ("completed", 2, 0)
    assert [(a, c) for _, a, c, _ in runs_of(engine, "flaky")] == [(1, 0), (2, 0)]
    assert w2.alive


@pytest.mark.parametrize(
    "runner_kind, handler_kind",
    [
        ("sync", "plain"),
        ("async", "coroutine"),
        ("async", "plain"),
    ],
)
def test_a_handler_ignoring_its_timeout_loses_its_lease_to_recovery(
    instrumented: Engine, db_url: URL, workers: WorkerPool, runner_kind: str, handler_kind: str
) -> None:
    """The handler outlives its 1 s timeout and ignores the stop (a plain
    handler sleeping on, in a Runner or in an AsyncRunner's thread; a
    coroutine swallowing the cancellation of its task). Its claim is not
    renewed after the timeout: the lease lapses, the job is recovered --
    requeued within its budget, ``attempt`` unchanged, ``recovery_count`` 1 --
    and run by the other worker, while the first handler still runs; when
    that one returns at last, its settle is refused."""
    engine = instrumented
    timeout = 1.0
    ignores = 10.0  # well past the timeout plus a lease
    action = "ignore_cancel" if handler_kind == "coroutine" else "ignore_stop"
    options = {**kind(runner_kind), "plain": runner_kind == "async" and handler_kind == "plain"}
    job = Job(
        "stuck",
        "chaos",
        payload={"action": action, "seconds": ignores, "only_first": 1},
        timeout=timedelta(seconds=timeout),
        retry=RETRY,
        max_recoveries=1,
    )
    enqueue_jobs(engine, [job])
    w1 = workers.start(db_url, "w1", **TIMING, **options)
    (run,) = wait_until(lambda: audit_rows(engine, "stuck"), timeout=60, what="the handler to start")
    token = jobs_by_id(engine)["stuck"]["claim_token"]
    w2 = workers.start(db_url, "w2", **TIMING, **options)

    wait_until(lambda: jobs_by_id(engine)["stuck"]["state"] == "settled", timeout=60, what="the job to settle")
    settled = jobs_by_id(engine)["stuck"]
    assert (settled["outcome"], settled["attempt"], settled["recovery_count"]) == ("completed", 1, 1), settled
    assert settled["failure_history"] is None, "a recovered timeout is no failed attempt"
    recovery = recovery_of(engine, "stuck", token)
    assert (recovery["new_state"], recovery["new_count"]) == ("queued", 1)
    # Not renewed after the timeout: the lease the recovery found ended within
    # one lease (and a heartbeat) of the deadline, long before the handler returned.
    deadline = run["called_ms"] + timeout * 1000
    assert recovery["old_lease"] <= deadline + (LEASE + HEARTBEAT + 0.5) * 1000, (recovery, run)
    assert recovery["at_ms"] >= recovery["old_lease"], "recovered before its lease ended"
    assert recovery["at_ms"] < run["called_ms"] + ignores * 1000, "recovered only after the handler returned"
    second = audit_rows(engine, "stuck")[1]
    assert (second["pid"], attempt_of(second), second["recovery_count"]) == (w2.pid, 1, 1)
    assert "job stuck: stopping its handler (timeout)" in w1.log_text()

    # The first handler returns at last; its settle (a timed-out attempt) is refused.
    log_before = transition_rows(engine, "stuck")
    first = wait_until(
        lambda: first_ended_audit_row(engine, "stuck"),
        timeout=ignores + 30,
        what="the first handler to return",
    )
    assert (first["pid"], first["stop_reason"]) == (w1.pid, "timeout")
    wait_until(
        lambda: "settlement rejected" in w1.log_text() or "settled elsewhere" in w1.log_text(),
        timeout=30,
        what="the late settle to be refused",
    )
    time.sleep(HEARTBEAT * 2)  # a heartbeat round, if it were to write anything
    assert jobs_by_id(engine)["stuck"] == settled
    assert transition_rows(engine, "stuck") == log_before
    assert_settled_exactly_once(engine, ["stuck"])
    assert w1.alive and w2.alive
