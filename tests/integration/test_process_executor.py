"""The runner contract with the process executor, and what only it gives.

Every test here runs with ``Runner`` and ``AsyncRunner`` driving the
process executor (the ``process`` and ``async-process`` runner kinds of
tests/runner_kinds.py): plain handlers run in real child processes, so
they are the module-level functions of tests/process_handlers.py, which
leave marks in a directory the job's payload names instead of sharing
memory with the test. The guarantees of tests/integration/test_runners.py
-- decisions, exceptions, retries, timeouts, cancellation, lane failure,
shutdown -- hold here too; then what threads cannot give: a handler that
ignores its stop is killed (confirmed dead before its job settles, so a
retry never overlaps it), a child that dies is contained and replaced,
children are recycled by job count and memory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import (
    Decision,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    ProcessExecutor,
    RetryPolicy,
    RunningJob,
    TickStatus,
    Watchdog,
    enqueue,
    store,
)
from sqlalchemy_watchdog.core.handlers import StopSignal
from sqlalchemy_watchdog.executors import locate
from sqlalchemy_watchdog.executors.pool import Ending, ProcessPool
from tests import process_handlers as h
from tests.helpers import add, read, settled, wait_until
from tests.runner_kinds import KILL_GRACE, PROCESS_KINDS, RunnerDriver

# What these tests prove lies in the pool and its children, below the runner's
# driver: a day's run takes the Runner copy, CI both (tests/conftest.py).
pytestmark = [pytest.mark.dialect_neutral, pytest.mark.driver_neutral]

LEASE = timedelta(seconds=3)
HEARTBEAT = timedelta(seconds=1)
POLL = timedelta(milliseconds=100)


@pytest.fixture(params=PROCESS_KINDS)
def runner_kind(request: pytest.FixtureRequest) -> str:
    """``Runner`` and ``AsyncRunner`` with the process executor."""
    kind: str = request.param
    return kind


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    """The directory the handlers leave their marks in."""
    directory = tmp_path / "marks"
    directory.mkdir()
    return directory


def make(runners: RunnerDriver, handlers: dict[str, Any], **kwargs: Any) -> Any:
    kwargs.setdefault("lease", LEASE)
    kwargs.setdefault("heartbeat", HEARTBEAT)
    kwargs.setdefault("poll_interval", POLL)
    kwargs.setdefault("concurrency", 1)
    return runners.runner(handlers, **kwargs)


def job(job_id: str, marks: Path, queue: str = "q", **payload: Any) -> Job:
    options = {k: payload.pop(k) for k in ("retry", "timeout", "max_recoveries", "lane") if k in payload}
    return Job(job_id, queue, payload={"dir": str(marks), **payload}, **options)


def quick_retry(max_attempts: int) -> RetryPolicy:
    return RetryPolicy(max_attempts=max_attempts, backoff=timedelta(milliseconds=20), factor=1.0, jitter=0.0)


# -- running handlers ----------------------------------------------------------------


def test_a_handler_runs_in_a_child_process_and_sees_the_running_job(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, Job("a", "q", lane="L", priority=3, key="tenant-1", payload={"dir": str(marks), "to": "x@example.com"}))
    result = make(runners, {"q": h.record}).tick()
    assert result.status is TickStatus.SETTLED and result.job is not None
    assert result.job.outcome is Outcome.COMPLETED
    pid, _, seen = h.wait_for_mark(marks, "a", "seen")
    assert pid != os.getpid()
    assert seen == repr(
        {
            "job_id": "a",
            "queue": "q",
            "lane": "L",
            "priority": 3,
            "key": "tenant-1",
            "payload": {"to": "x@example.com"},
            "attempt": 1,
            "max_attempts": 1,
            "recovery_count": 0,
            "timeout": None,
            "stop_requested": False,
        }
    )


def test_progress_in_a_child_is_written_by_the_runner_under_the_claim(engine: Engine, runners: RunnerDriver) -> None:
    """The child asks, the runner writes as for a thread's handler: the
    first report at once, the next within a second kept and written with the
    settle; bad input is refused in the child, naming the field."""
    add(engine, Job("p", "q"))
    result = make(runners, {"q": h.reports_progress}).tick()
    assert result.job is not None and result.job.outcome is Outcome.COMPLETED
    assert Watchdog(engine).result("p").value == ["written", "deferred", "refused fraction"]
    stored = read(engine, "p")
    assert (stored.progress, stored.progress_note) == (0.5, "half")


def test_progress_of_a_child_whose_job_lost_its_claim_answers_lost(engine: Engine) -> None:
    """The runner's write is guarded by the exact claim: asked for a job
    whose claim is gone, it writes nothing, and the child hears LOST."""
    from sqlalchemy_watchdog.core.handlers import StopSignal
    from sqlalchemy_watchdog.core.progress import ProgressReporter, ProgressStatus
    from sqlalchemy_watchdog.executors import locate
    from sqlalchemy_watchdog.executors.pool import ProcessPool

    add(engine, Job("lost", "q"))
    with store.write_transaction(engine) as conn:
        (claim,) = store.claim(conn, queues=["q"], limit=1, lease_ms=60_000).claimed

    def write(job_id: str, token: str, fraction: float, note: str | None) -> bool:
        with store.write_transaction(engine) as conn:
            return bool(store.report_progress(conn, job_id, token, fraction, note))

    signal = StopSignal()
    running = RunningJob(
        "lost", "q", "q", 0, None, 0, None, _signal=signal,
        _progress=ProgressReporter("lost", "not-the-token", write, None, interval_s=3600),
    )  # fmt: skip
    pool = ProcessPool(ProcessExecutor(processes=1))
    try:
        outcome = pool.call(locate("q", h.reports_progress), running, signal, stop_wait_s=5)
    finally:
        pool.close()
    assert outcome.value == ["lost", "deferred", "refused fraction"]
    assert read(engine, "lost").progress is None and claim.token != "not-the-token"
    assert ProgressStatus.LOST.value == "lost"


def test_progress_of_a_child_whose_claim_was_recovered_and_taken_by_another_runner_answers_lost(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """A real loss, not a wrong token: the job's lease ends by the database
    clock (its runner froze, say), recovery requeues it and another runner
    claims it. The child, told to stop (``lease_lost``), reports progress:
    it hears LOST, as a thread's handler would, and nothing is written over
    the new claim."""
    add(engine, job("a", marks, max_recoveries=1))
    with make(runners, {"q": h.progress_after_stop}).serving():
        h.wait_for_mark(marks, "a", "started")
        with store.write_transaction(engine) as conn:  # one transaction: the serving runner cannot step in
            conn.execute(text("UPDATE watchdog_jobs SET lease_until = 0 WHERE job_id = 'a'"))
            (expired,) = store.expired_claims(conn, limit=10)
            assert store.reconcile(conn, expired).status is store.RecoveryStatus.REQUEUED
            (taken,) = store.claim(conn, queues=["q"], limit=1, lease_ms=600_000).claimed
        assert taken.token != expired.token
        assert h.wait_for_mark(marks, "a", "reported")[2] == "lease_lost lost"
    now = read(engine, "a")
    assert (now.state, now.attempt, now.recovery_count) == (JobState.RUNNING, 1, 1)  # a recovery uses no attempt
    assert (now.progress, now.progress_note) == (None, None)
    with store.write_transaction(engine) as conn:  # the other runner still holds it
        assert store.report_progress(conn, "a", taken.token, 0.5, "mine")


def test_parent_results_in_a_child_are_read_by_the_runner(engine: Engine, runners: RunnerDriver) -> None:
    add(engine, Job("p1", "parents"), Job("p2", "parents"))
    add(engine, Job("cb", "q", after=["p1", "p2"], after_policy="any_outcome"))
    with store.write_transaction(engine) as conn:
        first, second = store.claim(conn, queues=["parents"], limit=2, lease_ms=60_000).claimed
        done = store.SettleRequest("p1", first.token, Decision.completed(), result_json='{"n":1}')
        store.settle_many(conn, [done])
        store.settle(conn, job_id="p2", claim_token=second.token, decision=Decision.failed("no", retry=False))
    result = make(runners, {"q": h.reads_parents}, queues=["q"]).tick()
    assert result.job is not None and result.job.outcome is Outcome.COMPLETED, result
    assert Watchdog(engine).result("cb").value == [["p1", "completed", {"n": 1}], ["p2", "failed", None]]


def test_a_task_runs_in_a_child_found_by_the_module_that_defines_it(engine: Engine, runners: RunnerDriver) -> None:
    """@task's handler is ``<module>.<function>.handler`` (the function's
    module, not the library's): a child imports tests.process_handlers and
    finds it there, runs the function -- with pass_job, given its job, whose
    progress and parents the runner writes and reads -- and the job keeps
    what it returned."""
    where = locate("doubles", h.double.handler)
    assert (where.module, where.qualname) == ("tests.process_handlers", "double.handler")
    with Session(engine) as session:
        enqueue(session, Job("count", "parents"))
        h.double.enqueue(session, n=21, job_id="double-21")
        h.double_with_job.configure(after=["count"], after_policy="any_outcome").enqueue(
            session, n=5, job_id="double-5"
        )
        session.commit()
    with store.write_transaction(engine) as conn:
        (claim,) = store.claim(conn, queues=["parents"], limit=1, lease_ms=60_000).claimed
        store.settle_many(conn, [store.SettleRequest("count", claim.token, Decision.completed(), result_json="12")])
    jobs = make(runners, h.TASKS.handlers(), queues=["doubles", "doubles-with-job"]).run_until_idle()
    assert [job.outcome for job in jobs] == [Outcome.COMPLETED] * 2, [job.failure_reason for job in jobs]
    doubled = Watchdog(engine).result("double-21").value
    assert doubled["n"] == 42 and doubled["pid"] != os.getpid()
    assert Watchdog(engine).result("double-5").value == {
        "n": 10,
        "job_id": "double-5",
        "attempt": 1,
        "progress": "written",
        "parents": [["count", "completed", 12]],
    }
    assert (read(engine, "double-5").progress, read(engine, "double-5").progress_note) == (1.0, "doubled")


@pytest.mark.parametrize(
    ("decide", "outcome", "reason"),
    [
        ("completed", Outcome.COMPLETED, None),
        ("failed", Outcome.FAILED, "it did not work"),
        ("unknown", Outcome.OUTCOME_UNKNOWN, "maybe it worked"),
    ],
)
def test_a_handlers_decision_settles_the_job(
    engine: Engine, runners: RunnerDriver, marks: Path, decide: str, outcome: Outcome, reason: str | None
) -> None:
    add(engine, job("a", marks, decide=decide))
    (settled_job,) = make(runners, {"q": h.decide}).run_until_idle()
    assert (settled_job.outcome, settled_job.failure_reason) == (outcome, reason)


def test_a_handlers_exception_settles_failed_with_its_type_message_and_traceback(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks, message="no such customer"))
    (failed,) = make(runners, {"q": h.raises}).run_until_idle()
    assert (failed.outcome, failed.failure_reason) == (Outcome.FAILED, "ValueError: no such customer")
    # The traceback is the child's: it names the handler's own line.
    assert failed.failure_detail is not None
    assert "process_handlers.py" in failed.failure_detail and "in raises" in failed.failure_detail
    assert failed.failure_detail.rstrip().endswith("ValueError: no such customer")


def test_an_exception_that_cannot_be_rebuilt_still_fails_the_job_with_its_type_and_message(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks))
    (failed,) = make(runners, {"q": h.raises_unpicklable}).run_until_idle()
    assert (failed.outcome, failed.failure_reason) == (Outcome.FAILED, "_Unpicklable: the printer is on fire (code 7)")


def test_a_handler_returning_a_value_completes_with_it_as_under_threads(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks, value={"total": 42}), job("b", marks, queue="n"))
    settled = {j.job_id: j for j in make(runners, {"q": h.returns_value, "n": h.returns_nan}).run_until_idle()}
    assert (settled["a"].outcome, settled["a"].result) == (Outcome.COMPLETED, {"total": 42})
    # What crosses the pipe but no JSON result can hold fails the job, as under threads.
    assert settled["b"].outcome is Outcome.FAILED and settled["b"].result is None
    assert (settled["b"].failure_reason or "").startswith("the handler's result: ")


def test_a_handler_returning_what_cannot_leave_its_process_settles_failed_saying_so(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks), job("b", marks))
    results = make(runners, {"q": h.returns_unencodable}).run_until_idle()
    assert [(j.job_id, j.outcome) for j in results] == [("a", Outcome.FAILED), ("b", Outcome.FAILED)]
    assert results[0].failure_reason is not None
    assert results[0].failure_reason.startswith(
        "handler returned lock, which cannot be sent from its process to the runner (TypeError: cannot pickle"
    )


def test_a_failing_job_is_retried_under_its_policy_until_it_succeeds(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks, succeed_at=3, retry=quick_retry(3)))
    worker = make(runners, {"q": h.flaky})
    wait_until(lambda: worker.tick() and read(engine, "a").state is JobState.SETTLED, what="a to settle")
    done = read(engine, "a")
    assert (done.outcome, done.attempt) == (Outcome.COMPLETED, 3)
    assert [(f.attempt, f.reason) for f in done.failure_history] == [
        (1, "RuntimeError: attempt 1 failed"),
        (2, "RuntimeError: attempt 2 failed"),
    ]


def test_serving_drains_many_jobs_over_several_children(engine: Engine, runners: RunnerDriver, marks: Path) -> None:
    add(engine, *(job(f"j{i}", marks) for i in range(30)))
    with make(runners, {"q": h.pid}, concurrency=2).serving():
        wait_until(
            lambda: all(read(engine, f"j{i}").state is JobState.SETTLED for i in range(30)), what="30 jobs to settle"
        )
    pids = {h.marks(marks, f"j{i}", "ran")[0][1] for i in range(30)}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    for i in range(30):
        assert read(engine, f"j{i}").outcome is Outcome.COMPLETED


def test_a_handlers_log_records_reach_the_runners_logging_with_their_fields(
    engine: Engine, runners: RunnerDriver, marks: Path, caplog: pytest.LogCaptureFixture
) -> None:
    add(engine, job("a", marks, card="visa-42"))
    with caplog.at_level(logging.INFO):
        (done,) = make(runners, {"q": h.logs}).run_until_idle()
    assert done.outcome is Outcome.COMPLETED
    child = h.wait_for_mark(marks, "a", "ran")[0]
    (charging,) = [r for r in caplog.records if r.name == "sqlalchemy_watchdog.job"]
    assert (charging.levelno, charging.getMessage()) == (logging.WARNING, "charging card visa-42")
    assert (charging.job_id, charging.attempt, charging.process) == ("a", 1, child)  # type: ignore[attr-defined]
    (failed,) = [r for r in caplog.records if r.name == "tests.process_handlers"]
    assert failed.getMessage() == "lookup failed" and failed.exc_text is not None
    assert "KeyError: 'no such card'" in failed.exc_text


@pytest.mark.parametrize("forward", [(), ("thirdparty",)], ids=["by-default", "asked-for"])
def test_a_childs_third_party_info_records_are_not_sent_unless_asked_for(
    engine: Engine, runners: RunnerDriver, marks: Path, caplog: pytest.LogCaptureFixture, forward: tuple[str, ...]
) -> None:
    """Under a runner logging INFO, a library's INFO lines in a child (an
    HTTP client's one per request) stay there; its WARNINGs, and the INFO
    records of the handler's package and of ``job.log``, reach the runner --
    a library's INFO too once ``forward_loggers`` names it."""
    add(engine, job("a", marks))
    executor = ProcessExecutor(processes=1, kill_grace=KILL_GRACE, forward_loggers=forward)
    with caplog.at_level(logging.INFO):
        (done,) = make(runners, {"q": h.logs_everywhere}, executor=executor).run_until_idle()
    assert done.outcome is Outcome.COMPLETED
    child = h.wait_for_mark(marks, "a", "ran")[0]
    sent = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.process == child]
    library = [("thirdparty.http", "WARNING", "GET https://api.example/2 took 9s")]
    if forward:
        library.insert(0, ("thirdparty.http", "INFO", "GET https://api.example/1 200"))
    assert [r for r in sent if r[0] == "thirdparty.http"] == library
    assert ("tests.process_handlers", "INFO", "handler info") in sent
    assert ("sqlalchemy_watchdog.job", "INFO", "job info") in sent


def test_a_child_sends_the_packages_records_from_the_runners_level_for_them(
    engine: Engine, runners: RunnerDriver, marks: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The runner's root logger at WARNING, ``sqlalchemy_watchdog`` at INFO:
    a ``job.log.info`` line in a child reaches the runner's log."""
    add(engine, job("a", marks))
    with caplog.at_level(logging.INFO, logger="sqlalchemy_watchdog"):
        assert logging.getLogger().getEffectiveLevel() == logging.WARNING
        (done,) = make(runners, {"q": h.logs_everywhere}).run_until_idle()
    assert done.outcome is Outcome.COMPLETED
    child = h.wait_for_mark(marks, "a", "ran")[0]
    sent = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.process == child]
    assert ("sqlalchemy_watchdog.job", "INFO", "job info") in sent
    assert ("tests.process_handlers", "INFO", "handler info") not in sent  # the runner logs no INFO of it


# -- hard timeouts -------------------------------------------------------------------------


def test_a_handler_stopping_at_its_timeout_fails_the_attempt_as_under_threads(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks, timeout=timedelta(milliseconds=300)))
    (failed,) = make(runners, {"q": h.blocking}).run_until_idle()
    assert (failed.outcome, failed.failure_reason) == (Outcome.FAILED, "timed out after 0.3s")
    assert h.wait_for_mark(marks, "a", "stopped")[2] == "timeout"


def test_a_handler_ignoring_its_timeout_is_killed_before_its_job_settles_and_the_retry_never_overlaps(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """The child is told to stop at the timeout and killed a grace later; the
    kill is confirmed before the settle, so the retry starts only once the
    first attempt's process is gone, and its side effect never happened."""
    add(engine, job("a", marks, timeout=timedelta(milliseconds=300), retry=quick_retry(2), behave_from=2, sleep=5))
    worker = make(runners, {"q": h.stubborn})
    first = worker.tick()
    ended = time.time()
    assert first.status is TickStatus.REQUEUED
    reason = f"killed after timeout (timed out after 0.3s, then {KILL_GRACE.total_seconds():g}s to stop)"
    assert first.job is not None and first.job.failure_history[0].reason == reason
    ((_, first_pid, began, _),) = h.marks(marks, "a", "started")
    # From the handler's first line (not the child's start-up, seconds on a busy machine):
    assert ended - began < 4  # the timeout and the grace, never the handler's 5 s
    assert not h.pid_alive(first_pid)  # reaped before the settle
    wait_until(lambda: worker.tick() and read(engine, "a").state is JobState.SETTLED, what="the retry to settle")
    done = read(engine, "a")
    assert (done.outcome, done.attempt) == (Outcome.COMPLETED, 2)
    assert [f.reason for f in done.failure_history] == [reason]
    assert h.marks(marks, "a", "finished") == []  # the killed attempt never finished its work
    assert h.marks(marks, "a", "overlap") == []
    assert [attempt for attempt, *_ in h.marks(marks, "a", "started")] == [1, 2]


def test_a_fresh_childs_import_of_the_handlers_module_does_not_count_against_the_first_jobs_timeout(
    engine: Engine, runners: RunnerDriver
) -> None:
    """A module whose import takes 1.5 s, a 1 s timeout, a handler that
    returns at once: every job completes, the first one too -- its timeout
    counts from its handler's first line, after the fresh child imported the
    module. Its claim is renewed meanwhile: the import outlasts the lease."""
    from tests import slow_import_handlers as slow  # the runner's own import of it (slow once)

    second = timedelta(seconds=1)
    add(engine, *(Job(f"j{i}", "q", priority=9 - i, timeout=second) for i in range(3)))
    executor = ProcessExecutor(processes=1, kill_grace=KILL_GRACE)
    worker = make(runners, {"q": slow.done}, executor=executor, lease=second, heartbeat=timedelta(milliseconds=250))
    done = worker.run_until_idle()
    assert [(j.job_id, j.outcome, j.failure_reason, j.recovery_count) for j in done] == [
        (f"j{i}", Outcome.COMPLETED, None, 0) for i in range(3)
    ]


def test_a_killed_attempt_without_attempts_left_settles_failed_killed_after_timeout(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks, timeout=timedelta(milliseconds=200), sleep=5))
    (failed,) = make(runners, {"q": h.stubborn}).run_until_idle()
    assert failed.outcome is Outcome.FAILED
    assert failed.failure_reason is not None and failed.failure_reason.startswith("killed after timeout")
    assert failed.failure_detail is not None and "was killed by signal SIGKILL" in failed.failure_detail


def test_a_kill_grace_longer_than_the_lease_keeps_the_claim_until_the_kill_is_confirmed(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """Unlike a thread past its timeout (left to its lease), a child past its
    timeout keeps its claim renewed until it is killed: the settle after a
    5 s grace under a 3 s lease holds, and nobody recovered the job meanwhile."""
    add(engine, job("a", marks, timeout=timedelta(milliseconds=200), sleep=30))
    executor = ProcessExecutor(processes=1, kill_grace=timedelta(seconds=5))
    result = make(runners, {"q": h.stubborn}, executor=executor).tick()
    assert result.status is TickStatus.SETTLED and result.job is not None
    assert (result.job.outcome, result.job.recovery_count) == (Outcome.FAILED, 0)
    assert result.job.failure_reason == "killed after timeout (timed out after 0.2s, then 5s to stop)"


# -- cancellation, lane failure ------------------------------------------------------------


def test_cancelling_a_running_job_stops_its_handler_in_its_child(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks))
    with make(runners, {"q": h.blocking}).serving():
        h.wait_for_mark(marks, "a", "started")
        Watchdog(engine).cancel("a", "stop-a")
        cancelled = settled(engine, "a")
    assert (cancelled.outcome, cancelled.failure_reason) == (Outcome.CANCELLED, None)
    assert h.wait_for_mark(marks, "a", "stopped")[2] == "cancelled"


def test_cancelling_a_job_whose_handler_ignores_the_stop_kills_its_child_then_settles_cancelled(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks, sleep=10))
    with make(runners, {"q": h.stubborn}).serving():
        pid = h.wait_for_mark(marks, "a", "started")[0]
        Watchdog(engine).cancel("a", "stop-a")
        cancelled = settled(engine, "a", timeout=8)
        assert not h.pid_alive(pid)
    assert cancelled.outcome is Outcome.CANCELLED
    assert h.marks(marks, "a", "finished") == []


def test_failing_a_lane_stops_a_running_handler_in_its_child(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks, lane="provider-x"))
    with make(runners, {"q": h.blocking}).serving():
        h.wait_for_mark(marks, "a", "started")
        Watchdog(engine).fail_lane("provider-x", "provider x is down")
        assert h.wait_for_mark(marks, "a", "stopped")[2] == "lane_failed"
    failed = read(engine, "a")
    assert (failed.outcome, failed.failure_reason) == (Outcome.FAILED, "provider x is down")


# -- crashes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "cause"),
    [(h.exits, "exited with code 3"), (h.kills_itself, "killed by signal SIGKILL")],
    ids=["os._exit", "SIGKILL"],
)
def test_a_child_that_dies_fails_its_job_with_the_cause_and_is_replaced(
    engine: Engine, runners: RunnerDriver, marks: Path, handler: Any, cause: str
) -> None:
    add(engine, Job("dies", "crash", payload={"dir": str(marks), "code": 3}, priority=9), job("after", marks))
    worker = make(runners, {"crash": handler, "q": h.pid})
    results = worker.run_until_idle()
    assert [(j.job_id, j.outcome) for j in results] == [("dies", Outcome.FAILED), ("after", Outcome.COMPLETED)]
    died = results[0]
    crashed_pid = h.wait_for_mark(marks, "dies", "started")[0]
    assert died.failure_reason == f"the handler's process (pid {crashed_pid}) died: it {cause}"
    assert h.wait_for_mark(marks, "after", "ran")[0] != crashed_pid


def test_a_crash_is_retried_under_the_jobs_policy(engine: Engine, runners: RunnerDriver, marks: Path) -> None:
    add(engine, job("a", marks, code=9, retry=quick_retry(2)))
    worker = make(runners, {"q": h.exits})
    first = worker.tick()
    assert first.status is TickStatus.REQUEUED
    wait_until(lambda: worker.tick() and read(engine, "a").state is JobState.SETTLED, what="the retry to settle")
    failed = read(engine, "a")
    assert (failed.outcome, failed.attempt, len(failed.failure_history)) == (Outcome.FAILED, 2, 2)


# -- recycling ----------------------------------------------------------------------------------


def test_max_jobs_per_child_replaces_a_child_between_jobs(engine: Engine, runners: RunnerDriver, marks: Path) -> None:
    add(engine, *(Job(f"j{i}", "q", priority=9 - i, payload={"dir": str(marks)}) for i in range(5)))
    executor = ProcessExecutor(processes=1, max_jobs_per_child=2)
    assert len(make(runners, {"q": h.pid}, executor=executor).run_until_idle()) == 5
    pids = [h.wait_for_mark(marks, f"j{i}", "ran")[0] for i in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
    assert len(set(pids)) == 3


def test_the_memory_ceiling_replaces_a_child_between_jobs_never_during_one(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """The job that took the child over its ceiling completes; the child is
    replaced before the next job."""
    add(
        engine,
        Job("small", "q", priority=9, payload={"dir": str(marks), "mib": 1}),
        Job("big", "q", priority=8, payload={"dir": str(marks), "mib": 300}),
        Job("next", "q", priority=7, payload={"dir": str(marks), "mib": 1}),
    )
    executor = ProcessExecutor(processes=1, max_memory_per_child=250 * 2**20)
    results = make(runners, {"q": h.hoard}, executor=executor).run_until_idle()
    assert [(j.job_id, j.outcome) for j in results] == [(n, Outcome.COMPLETED) for n in ("small", "big", "next")]
    small, big, following = (h.wait_for_mark(marks, n, "ran")[0] for n in ("small", "big", "next"))
    assert small == big != following


# -- shutdown -----------------------------------------------------------------------------------


def test_shutdown_lets_a_handler_finish_after_its_stop_and_settles_it_completed(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    add(engine, job("a", marks, max_recoveries=1))
    with make(runners, {"q": h.blocking}, grace=timedelta(milliseconds=200)).serving():
        h.wait_for_mark(marks, "a", "started")
    assert h.wait_for_mark(marks, "a", "stopped")[2] == "shutdown"
    done = read(engine, "a")
    assert (done.outcome, done.recovery_count) == (Outcome.COMPLETED, 0)


def test_a_hand_off_to_recovery_slower_than_the_shutdown_budget_ends_before_the_runner_returns(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """With no grace the budget (0.1 s) is spent by the time the killed
    child's job is handed to recovery; that last statement still gets its
    second (workers page: "1 s covers the last statements"), so a loaded
    database does not leave the job ``running`` under its live lease."""
    add(engine, job("a", marks, sleep=10, max_recoveries=1))
    stopping = threading.Event()

    def slow_writes_once_stopping(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        if stopping.is_set() and statement.lstrip().upper().startswith("UPDATE"):
            time.sleep(0.4)

    worker = make(
        runners,
        {"q": h.stubborn},
        lease=timedelta(seconds=60),
        heartbeat=timedelta(seconds=5),
        grace=timedelta(0),
        listen={"before_cursor_execute": slow_writes_once_stopping},
    )
    with worker.serving():
        h.wait_for_mark(marks, "a", "started")
        stopping.set()
    after = read(engine, "a")
    assert (after.state, after.recovery_count) == (JobState.QUEUED, 1)


@pytest.mark.parametrize(
    ("max_recoveries", "state", "outcome"),
    [(1, JobState.QUEUED, None), (None, JobState.SETTLED, Outcome.INTERRUPTED)],
    ids=["requeued", "interrupted"],
)
@pytest.mark.parametrize("grace_ms", [200, 0], ids=["grace", "no-grace"])
def test_shutdown_kills_a_child_outliving_its_grace_and_hands_the_job_to_recovery(
    engine: Engine,
    runners: RunnerDriver,
    marks: Path,
    max_recoveries: int | None,
    state: JobState,
    outcome: Outcome | None,
    grace_ms: int,
) -> None:
    """Also without grace (no stop wait either: the kill is at once), the job
    goes to recovery only once its child is dead, exactly once."""
    add(engine, job("a", marks, sleep=10, max_recoveries=max_recoveries))
    worker = make(
        runners,
        {"q": h.stubborn},
        lease=timedelta(seconds=60),
        heartbeat=timedelta(seconds=5),
        grace=timedelta(milliseconds=grace_ms),
    )
    with worker.serving():
        pid = h.wait_for_mark(marks, "a", "started")[0]
        began = time.monotonic()
    assert time.monotonic() - began < 5  # within the shutdown budget, not the handler's 10 s
    assert not h.pid_alive(pid)
    after = read(engine, "a")
    assert (after.state, after.outcome, after.recovery_count) == (state, outcome, 1 if max_recoveries else 0)
    if outcome is not None:
        assert after.failure_reason == f"{store.SHUTDOWN_REASON}; no recovery policy"
    assert h.marks(marks, "a", "finished") == []


# -- concurrency ----------------------------------------------------------------------------


def test_processes_run_that_many_handlers_at_once_each_in_its_own_child(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    # Each blocks until shutdown stops it: on a loaded machine the second
    # child may take longer to start than the handler's default 30 s wait, and
    # a job that ended by itself would free its child for "c".
    # Which two start is not asserted: the three are claimed together and reach
    # the pool from the runner's threads in whatever order those run, so the
    # last to arrive may be sent behind a running job although it was claimed
    # before the job a new child took (see docs/howto/executors.md).
    # A lease of its own, longer than the module's 3 s: what is asserted is how
    # many children run, not leases, and on a loaded CI machine two children
    # starting at once once kept the heartbeat from renewing within 3 s (every
    # job then lost its claim before it started).
    add(engine, *(job(j, marks, wait=600) for j in ("a", "b", "c")))

    def started() -> dict[str, int]:
        return {j: found[0][1] for j in "abc" if (found := h.marks(marks, j, "started"))}

    lease = timedelta(seconds=20)
    with make(runners, {"q": h.blocking}, concurrency=2, grace=timedelta(0), lease=lease).serving():
        wait_until(lambda: len(started()) >= 2, timeout=120, what="two jobs started")
        time.sleep(0.5)
        first = started()
        assert len(first) == 2, first  # no third child
        assert len(set(first.values())) == 2 and os.getpid() not in first.values()


# -- jobs claimed ahead (prefetch) ----------------------------------------------------------------


def ahead(processes: int = 1, prefetch: int = 1) -> ProcessExecutor:
    return ProcessExecutor(processes=processes, prefetch=prefetch, kill_grace=KILL_GRACE)


def test_a_job_claimed_ahead_waits_leased_for_a_child_then_runs_in_claim_order(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """One child, three jobs claimed ahead: each waits (claimed, its lease
    renewed past the lease's length) and takes the child as it frees up, by
    priority; its timeout counts from its start in the child, not its claim."""
    add(
        engine,
        job("first", marks, wait=LEASE.total_seconds() + 1),
        Job("low", "q", priority=-5, payload={"dir": str(marks)}, timeout=timedelta(seconds=1)),
        Job("high", "q", priority=5, payload={"dir": str(marks)}),
        Job("mid", "q", priority=0, payload={"dir": str(marks)}),
    )
    # One claim takes all four (1 child + 3 ahead); the child runs them in claim
    # order: priority, then admission ("first" before "mid"). "mid" and "low" wait
    # longer than the lease behind "first"; "low" still has its whole second.
    with make(runners, {"q": h.naps}, executor=ahead(prefetch=3)).serving():
        wait_until(lambda: all(read(engine, j).state is JobState.SETTLED for j in ("first", "low", "high", "mid")), 30)
    order = sorted(("high", "mid", "first", "low"), key=lambda j: h.wait_for_mark(marks, j, "started")[1])
    assert order == ["high", "first", "mid", "low"]
    for j in order:
        done = read(engine, j)
        assert (done.outcome, done.attempt, done.recovery_count) == (Outcome.COMPLETED, 1, 0), j
    assert len({h.wait_for_mark(marks, j, "started")[0] for j in order}) == 1


def _pooled(job_id: str, marks: Path, wait: float = 0) -> tuple[RunningJob, StopSignal]:
    """A job for a bare pool: ``h.naps`` marks ``started`` and sleeps ``wait`` s."""
    signal = StopSignal()
    return RunningJob(job_id, "q", "q", 0, {"dir": str(marks), "wait": wait}, 0, None, _signal=signal), signal


def test_jobs_of_one_claim_take_the_children_in_claim_order_whatever_order_they_arrive_in(marks: Path) -> None:
    """The runner's threads reach the pool in no set order. Told the claim's
    ranks first (``expect``), an idle child goes to no job ranked after one
    that has not asked yet: here the jobs arrive last-ranked first, beside
    an idle child, and still run by rank."""
    pool = ProcessPool(ProcessExecutor(processes=1, kill_grace=KILL_GRACE))
    ref = locate("q", h.naps)
    ranks = {"high": (-5, 3), "first": (0, 1), "mid": (0, 4), "low": (5, 2)}
    calls: list[threading.Thread] = []
    try:
        warm, signal = _pooled("warm", marks)
        pool.call(ref, warm, signal, stop_wait_s=5)  # the child is up, and idle
        pool.expect(ranks.values())
        for n, job_id in enumerate(("low", "mid", "first", "high"), 1):
            running, signal = _pooled(job_id, marks, wait=0.2)
            call = functools.partial(pool.call, ref, running, signal, stop_wait_s=5, rank=ranks[job_id])
            calls.append(threading.Thread(target=call))
            calls[-1].start()
            if job_id != "high":  # it waits in line beside the idle child
                wait_until(lambda: pool.waiting == n, 10, f"{job_id} in line")
        for thread in calls:
            thread.join(30)
    finally:
        pool.close()
    order = sorted(ranks, key=lambda j: h.wait_for_mark(marks, j, "started")[1])
    assert order == ["high", "first", "mid", "low"]


def test_a_job_expected_that_never_asks_holds_no_child_once_withdrawn(marks: Path) -> None:
    """A job of the claim stopped before it started never asks for a child:
    its execution's end withdraws it, and the job ranked after it, which
    waited beside the idle child, runs."""
    pool = ProcessPool(ProcessExecutor(processes=1, kill_grace=KILL_GRACE))
    ref = locate("q", h.naps)
    try:
        warm, signal = _pooled("warm", marks)
        pool.call(ref, warm, signal, stop_wait_s=5)
        pool.expect([(0, 1), (0, 2)])
        later, signal = _pooled("later", marks)
        thread = threading.Thread(target=functools.partial(pool.call, ref, later, signal, stop_wait_s=5, rank=(0, 2)))
        thread.start()
        wait_until(lambda: pool.waiting == 1, 10, "the later job in line")
        time.sleep(0.3)
        assert h.marks(marks, "later", "started") == []  # the idle child waits for the job ranked first
        pool.withdraw((0, 1))
        h.wait_for_mark(marks, "later", "started", timeout=10)
        thread.join(30)
        pool.withdraw((0, 1))  # idempotent
    finally:
        pool.close()


def test_a_job_whose_claim_is_renewed_before_it_starts_keeps_its_place_in_claim_order(marks: Path) -> None:
    """A job about to take a child whose claim was last known live over a
    heartbeat ago is not sent (``Ending.LATE``): it renews its claim, then
    asks again. Meanwhile it keeps its place: a job ranked after it that
    arrives and renews faster still starts after it."""
    pool = ProcessPool(ProcessExecutor(processes=1, kill_grace=KILL_GRACE))
    ref = locate("q", h.naps)
    ranks = {"first": (0, 1), "mid": (0, 2)}
    renewal_s = {"first": 0.5, "mid": 0.0}  # the job ranked first renews slower
    endings: dict[str, list[Ending]] = {j: [] for j in ranks}

    def run(job_id: str) -> None:
        on_start: Any = lambda now: now  # noqa: E731 -- the claim's last check is stale: not sent
        while True:
            running, signal = _pooled(job_id, marks)
            ending = pool.call(ref, running, signal, stop_wait_s=5, on_start=on_start, rank=ranks[job_id]).ending
            endings[job_id].append(ending)
            if ending is not Ending.LATE:
                return
            time.sleep(renewal_s[job_id])
            on_start = None  # renewed

    try:
        busy, signal = _pooled("busy", marks, wait=2)
        holder = threading.Thread(target=functools.partial(pool.call, ref, busy, signal, stop_wait_s=5))
        holder.start()
        h.wait_for_mark(marks, "busy", "started", timeout=30)
        first = threading.Thread(target=run, args=("first",))
        first.start()  # to be sent behind the running job, found late: it renews
        wait_until(lambda: endings["first"] == [Ending.LATE], 10, "the first job found late")
        mid = threading.Thread(target=run, args=("mid",))
        mid.start()
        for thread in (holder, first, mid):
            thread.join(30)
    finally:
        pool.close()
    assert endings["first"] == [Ending.LATE, Ending.RETURNED]
    assert endings["mid"][-1] is Ending.RETURNED
    order = sorted(ranks, key=lambda j: h.wait_for_mark(marks, j, "started")[1])
    assert order == ["first", "mid"]


def test_cancelling_a_job_claimed_ahead_settles_it_cancelled_and_it_never_runs(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """The job claimed ahead sits behind the child's running job (sent to its
    pipe): told to stop, the child skips it at once -- it settles
    ``cancelled`` within a heartbeat or so, not when its lease would end --
    and the running job is untouched."""
    add(engine, job("busy", marks))
    with make(runners, {"q": h.blocking}, executor=ahead(), grace=timedelta(milliseconds=200)).serving():
        h.wait_for_mark(marks, "busy", "started")
        add(engine, job("ahead", marks))
        wait_until(lambda: read(engine, "ahead").state is JobState.RUNNING, 10, "the job claimed ahead")
        Watchdog(engine).cancel("ahead", "stop-ahead")
        cancelled = settled(engine, "ahead", timeout=LEASE.total_seconds() - 0.5)
        assert read(engine, "busy").state is JobState.RUNNING  # the child's job goes on
    assert (cancelled.outcome, cancelled.failure_reason) == (Outcome.CANCELLED, None)
    assert h.marks(marks, "ahead", "started") == []


def test_a_job_claimed_ahead_of_a_child_that_crashes_runs_in_its_replacement(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """Neither lost nor failed with the crash: it never reached the dead child."""
    add(engine, Job("dies", "crash", payload={"dir": str(marks), "code": 3, "wait": 0.5}, priority=9))
    add(engine, job("after", marks))
    with make(runners, {"crash": h.exits_after, "q": h.pid}, executor=ahead()).serving():
        died = settled(engine, "dies")
        after = settled(engine, "after")
    crashed_pid = h.wait_for_mark(marks, "dies", "started")[0]
    assert died.outcome is Outcome.FAILED and "exited with code 3" in (died.failure_reason or "")
    assert after.started_at is not None and died.settled_at is not None
    assert after.started_at <= died.settled_at  # claimed ahead, before the crash
    assert (after.outcome, after.attempt, after.recovery_count) == (Outcome.COMPLETED, 1, 0)
    assert h.wait_for_mark(marks, "after", "ran")[0] != crashed_pid


def test_shutdown_gives_back_the_jobs_claimed_ahead_untouched(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """They never start once the runner stops: queued again as they were --
    no attempt, snooze or recovery counted, never ``interrupted`` -- while
    the child's job gets its grace."""
    add(engine, job("busy", marks))
    with make(runners, {"q": h.blocking}, executor=ahead(prefetch=2), grace=timedelta(milliseconds=300)).serving():
        h.wait_for_mark(marks, "busy", "started")
        add(engine, job("a", marks), job("b", marks))
        wait_until(lambda: all(read(engine, j).state is JobState.RUNNING for j in ("a", "b")), 10, "claimed ahead")
    assert h.wait_for_mark(marks, "busy", "stopped")[2] == "shutdown"
    assert read(engine, "busy").outcome is Outcome.COMPLETED
    for j in ("a", "b"):
        back = read(engine, j)
        assert (back.state, back.attempt, back.snoozes, back.recovery_count) == (JobState.QUEUED, 1, 0, 0), j
        assert back.failure_reason is None
        assert h.marks(marks, j, "started") == []
    # Given back, they run on the next runner like any queued job.
    results = make(runners, {"q": h.pid}, executor=ahead()).run_until_idle()
    assert sorted((r.job_id, r.outcome) for r in results) == [("a", Outcome.COMPLETED), ("b", Outcome.COMPLETED)]


def test_prefetch_0_claims_only_for_an_idle_child(engine: Engine, runners: RunnerDriver, marks: Path) -> None:
    add(engine, job("busy", marks), job("next", marks))
    with make(runners, {"q": h.blocking}, executor=ahead(prefetch=0), grace=timedelta(0)).serving():
        h.wait_for_mark(marks, "busy", "started")
        time.sleep(0.5)  # several polls
        assert read(engine, "next").state is JobState.QUEUED


# -- the async runner ---------------------------------------------------------------------------


@pytest.mark.parametrize("runner_kind", ["async-process"])
def test_an_async_runner_runs_plain_handlers_in_children_and_coroutines_on_its_loop(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    seen: list[int] = []

    async def on_the_loop(job: RunningJob) -> None:
        seen.append(os.getpid())

    add(engine, job("plain", marks, queue="plain"), job("coro", marks, queue="coro"))
    results = make(runners, {"plain": h.pid, "coro": on_the_loop}).run_until_idle()
    assert {j.job_id: j.outcome for j in results} == {"plain": Outcome.COMPLETED, "coro": Outcome.COMPLETED}
    assert seen == [os.getpid()]
    assert h.wait_for_mark(marks, "plain", "ran")[0] != os.getpid()


@pytest.mark.parametrize("runner_kind", ["async-process"])
def test_an_async_runner_answers_a_childs_progress_and_parent_results_while_a_coroutine_waits_on_its_loop(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """The child's requests reach the AsyncRunner's loop from the thread that
    waits for the child: they are answered while a coroutine handler holds
    a slot on that loop (each waits for the other's mark, so the two overlap)."""
    add(engine, Job("p1", "parents"))
    with store.write_transaction(engine) as conn:
        (claim,) = store.claim(conn, queues=["parents"], limit=1, lease_ms=60_000).claimed
        store.settle(conn, job_id="p1", claim_token=claim.token, decision=Decision.completed(result={"n": 1}))
    add(
        engine,
        job("coro", marks, queue="coro"),
        Job("cb", "q", after=["p1"], payload={"dir": str(marks), "after": "coro.1.started"}),
    )
    overlapped: list[bool] = []

    async def waits_for_the_child(job: RunningJob) -> None:
        h.mark(job, "started")
        deadline = time.monotonic() + 30
        while not h.marks(marks, "cb", "reported") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        overlapped.append(bool(h.marks(marks, "cb", "reported")))

    runner = make(runners, {"q": h.reports_and_reads, "coro": waits_for_the_child}, queues=["coro", "q"], concurrency=2)
    with runner.serving():
        cb = settled(engine, "cb")
        settled(engine, "coro")
    assert overlapped == [True]
    assert cb.outcome is Outcome.COMPLETED
    assert Watchdog(engine).result("cb").value == ["written", "deferred", ["p1", "completed", {"n": 1}]]
    assert (cb.progress, cb.progress_note) == (0.5, "half")  # the kept-back report, written with the settle


async def test_progress_of_a_child_under_an_async_runner_whose_job_lost_its_claim_answers_lost(
    engine: Engine, marks: Path
) -> None:
    """The AsyncRunner's twin of the test above with a wrong token: the
    report crosses from the thread that waits for the child to the loop
    (``write_async``), whose claim-guarded write updates nothing."""
    from sqlalchemy_watchdog.core.handlers import StopSignal
    from sqlalchemy_watchdog.core.progress import ProgressReporter
    from sqlalchemy_watchdog.executors import locate
    from sqlalchemy_watchdog.executors.pool import ProcessPool
    from sqlalchemy_watchdog.gateway import AsyncGateway
    from tests.conftest import make_async_engine

    add(engine, Job("lost", "q"))
    with store.write_transaction(engine) as conn:
        (claim,) = store.claim(conn, queues=["q"], limit=1, lease_ms=60_000).claimed
    async_engine = make_async_engine(engine)
    gateway = AsyncGateway(async_engine)

    async def write(job_id: str, token: str, fraction: float, note: str | None) -> bool:
        return bool(await gateway.run(store.report_progress, job_id, token, fraction, note))

    async def read_parents(job_id: str) -> Any:
        return await gateway.read(store.parent_results, job_id)

    signal = StopSignal()
    reporter = ProgressReporter("lost", "not-the-token", None, write, read_async=read_parents)  # made on the loop
    running = RunningJob("lost", "q", "q", 0, {"dir": str(marks)}, 0, None, _signal=signal, _progress=reporter)
    pool = ProcessPool(ProcessExecutor(processes=1))
    try:
        outcome = await asyncio.to_thread(pool.call, locate("q", h.reports_and_reads), running, signal, stop_wait_s=5)
    finally:
        pool.close()
        await async_engine.dispose()
    assert outcome.value == ["lost", "deferred"]  # no parents
    assert read(engine, "lost").progress is None and claim.token != "not-the-token"


# -- handlers a child cannot find, bad settings -------------------------------------------------


def _nested() -> Any:
    def inner(job: RunningJob) -> None:
        return None

    return inner


class _CallableObject:
    def __call__(self, job: RunningJob) -> None:
        return None


def _in_main(job: RunningJob) -> None:
    return None


_in_main.__module__ = "__main__"


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (lambda job: None, "is a lambda"),
        (_nested(), "is a nested function"),
        (_in_main, "is defined in __main__"),
        (_CallableObject(), "has no module path"),
        (Decision.completed, "has no module path"),
    ],
    ids=["lambda", "nested", "__main__", "callable-object", "bound-method"],
)
def test_a_handler_a_child_cannot_import_is_refused_at_start(fn: Any, says: str) -> None:
    from sqlalchemy import create_engine

    from sqlalchemy_watchdog import Runner

    with pytest.raises(InvalidJob) as caught:
        Runner(create_engine("sqlite://"), {"q": fn}, executor="process")
    assert caught.value.field == "handlers"
    assert says in str(caught.value) and "top level of an importable module" in str(caught.value)


class _RegistryChangedWhileCopied(dict[str, Any]):
    """The ``logging`` module's registry of loggers as another thread adding
    a logger leaves it for a copy in progress: its first ``failures`` copies
    fail as CPython's iteration of a dict that changed size does."""

    def __init__(self, loggers: dict[str, Any], failures: int) -> None:
        super().__init__(loggers)
        self.failures = failures

    def items(self) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("dictionary changed size during iteration")
        return super().items()


def test_a_logger_made_by_another_thread_while_a_job_is_sent_to_a_child_does_not_fail_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sending a job tells its child the runner's logging levels, read from
    the registry of loggers; another thread making a logger meanwhile (an
    ORM's first query, a library imported late) once failed the job as
    "the job's payload cannot be sent" -- it is read again instead."""
    registry = _RegistryChangedWhileCopied(logging.Logger.manager.loggerDict, failures=3)
    monkeypatch.setattr(logging.Logger.manager, "loggerDict", registry)
    signal = StopSignal()
    running = RunningJob("logged", "q", "q", 0, {"value": 7}, 0, None, _signal=signal)
    pool = ProcessPool(ProcessExecutor(processes=1))
    try:
        outcome = pool.call(locate("q", h.returns_value), running, signal, stop_wait_s=5)
    finally:
        pool.close()
    assert (outcome.ending, outcome.value) == (Ending.RETURNED, 7), outcome
    assert registry.failures == 0
