"""Runners in real worker processes (``tests/workers/worker.py``), on SQLite
and on PostgreSQL, each test once with ``Runner`` and once with
``AsyncRunner`` workers (``runner_kind``): killed with SIGKILL, stopped with
SIGTERM, commanded from another process, and three of them sharing one set
of jobs.

Every handler writes to an ``audit`` table in the same database, so the test
sees what ran where, and how many times.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, Text, func, select

from sqlalchemy_watchdog import (
    Job,
    JobState,
    JobView,
    Outcome,
    RunningJob,
    Watchdog,
    store,
)
from sqlalchemy_watchdog.model import jobs_table
from tests import forkrun
from tests.helpers import add, read, wait_until
from tests.runner_kinds import RunnerDriver

#: A worker process: forked from the pre-imported interpreter (tests/forkrun.py) or a subprocess.
Process = subprocess.Popen[bytes] | forkrun.Forked
WORKER = Path(__file__).resolve().parents[1] / "workers" / "worker.py"
REPO = Path(__file__).resolve().parents[2]
NO_POLICY = "Execution disappeared without a recovery policy"

audit_metadata = MetaData()
audit_table = Table(
    "audit",
    audit_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("event", Text, nullable=False),
)


# -- helpers -------------------------------------------------------------------


def events(engine: Engine, event: str | None = None) -> list[tuple[str, int, str]]:
    query = select(audit_table.c.job_id, audit_table.c.pid, audit_table.c.event).order_by(audit_table.c.id)
    if event is not None:
        query = query.where(audit_table.c.event == event)
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(query)]


def started(engine: Engine, *job_ids: str) -> bool:
    seen = {job_id for job_id, _, _ in events(engine, "started")}
    return seen.issuperset(job_ids)


@pytest.fixture
def audited(engine: Engine) -> Engine:
    audit_metadata.create_all(engine)
    return engine


class Workers:
    """Starts worker processes of one runner kind and makes sure none
    outlives the test."""

    def __init__(
        self, engine: Engine, logs: Path, runner_kind: str = "sync", forks: forkrun.ForkServer | None = None
    ) -> None:
        self.url = engine.url.render_as_string(hide_password=False)
        self.logs = logs
        self.runner_kind = runner_kind
        self.forks = forks
        self.procs: list[Process] = []

    def start(self, *handles: str, **options: Any) -> Process:
        """A worker process: forked by ``forks`` (a fresh process without the
        second of imports), else a subprocess."""
        argv = [sys.executable, str(WORKER), self.url]
        if self.runner_kind == "async":
            argv.append("--asyncio")
        for handle in handles:
            argv += ["--handle", handle]
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        log = open(self.logs / f"worker-{len(self.procs)}.log", "wb")
        proc: Process
        if self.forks is not None:
            proc = self.forks.popen(argv, REPO, dict(os.environ), log, subprocess.STDOUT)
        else:
            proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("worker-*.log")))

    def stop(self, proc: Process, timeout: float = 30) -> None:
        """SIGTERM, then wait until ``run_forever`` returned (or the process ended)."""
        proc.send_signal(signal.SIGTERM)
        wait_until(
            lambda: "runner stopped" in self.output() or proc.poll() is not None,
            timeout,
            "run_forever to return after SIGTERM",
        )

    def exit_code(self, proc: Process) -> int:
        """The exit code of a stopped worker, which must exit within seconds."""
        try:
            return proc.wait(5)
        except subprocess.TimeoutExpired:
            raise AssertionError("run_forever returned but the process did not exit:\n" + self.output()) from None

    def terminate(self, proc: Process, timeout: float = 30) -> int:
        """SIGTERM: ``run_forever`` returns within ``timeout``, the process exits."""
        self.stop(proc, timeout)
        return self.exit_code(proc)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def workers(audited: Engine, tmp_path: Path, runner_kind: str, forks: forkrun.ForkServer | None) -> Iterator[Workers]:
    """Worker processes running the test's runner kind (``--asyncio`` for ``async``)."""
    started_workers = Workers(audited, tmp_path, runner_kind, forks)
    try:
        yield started_workers
    finally:
        started_workers.cleanup()


def settle_all(engine: Engine, job_ids: list[str], timeout: float) -> dict[str, JobView]:
    """Wait until every one of ``job_ids`` is settled; their final views."""

    def unsettled() -> int:
        with engine.connect() as conn:
            return conn.execute(
                select(func.count())
                .select_from(jobs_table)
                .where(jobs_table.c.job_id.in_(job_ids), jobs_table.c.state != JobState.SETTLED.value)
            ).scalar_one()

    wait_until(lambda: unsettled() == 0, timeout, f"{len(job_ids)} jobs to settle")
    return {job_id: read(engine, job_id) for job_id in job_ids}


# -- a worker killed mid-job ---------------------------------------------------


def test_worker_killed_mid_job_is_recovered_by_another_runner_after_the_lease(
    audited: Engine, workers: Workers, runners: RunnerDriver
) -> None:
    """SIGKILL leaves two claims behind. Once their leases end, another
    runner requeues the job with a recovery budget (and runs it to
    completion) and settles the one without a policy ``interrupted``."""
    add(audited, Job("budget", "q", max_recoveries=1), Job("no-policy", "q"))
    proc = workers.start("q=hang", concurrency=2, lease=3, heartbeat=1)
    wait_until(lambda: started(audited, "budget", "no-policy"), what="both jobs to start")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert read(audited, "budget").state is JobState.RUNNING
    assert read(audited, "no-policy").state is JobState.RUNNING

    recoveries: list[tuple[str, int]] = []

    def rerun(job: RunningJob) -> None:
        recoveries.append((job.job_id, job.recovery_count))

    survivor = runners.runner({"q": rerun}, lease=timedelta(seconds=3), heartbeat=timedelta(seconds=1))
    jobs = {}

    def recovered() -> bool:
        jobs.update({j.job_id: j for j in survivor.run_until_idle()})
        return {"budget", "no-policy"} <= set(jobs)

    wait_until(recovered, timeout=20, what="the survivor to recover both claims")
    budget, no_policy = jobs["budget"], jobs["no-policy"]
    assert (budget.outcome, budget.recovery_count) == (Outcome.COMPLETED, 1)
    assert recoveries == [("budget", 1)]
    assert (no_policy.outcome, no_policy.failure_reason) == (Outcome.INTERRUPTED, NO_POLICY)
    assert read(audited, "budget").outcome is Outcome.COMPLETED
    assert read(audited, "no-policy").outcome is Outcome.INTERRUPTED


# -- graceful shutdown ---------------------------------------------------------


@pytest.mark.slow  # real processes, ~5 s each: CI runs it
def test_sigterm_lets_a_job_finish_within_grace_and_hands_a_job_outliving_it_to_recovery(
    audited: Engine, workers: Workers
) -> None:
    add(
        audited,
        Job("finishing", "slow"),
        Job("stuck-budget", "stuck", max_recoveries=1),
        Job("stuck-no-policy", "stuck"),
    )
    proc = workers.start("slow=work", "stuck=hang", sleep_ms=800, concurrency=3, lease=60, heartbeat=5, grace=2)
    wait_until(lambda: started(audited, "finishing", "stuck-budget", "stuck-no-policy"), what="three jobs to start")
    stopped_at = time.monotonic()
    workers.stop(proc)
    # well within the 60 s lease: nothing was left running for recovery to find later
    assert time.monotonic() - stopped_at < 20
    finishing = read(audited, "finishing")
    assert finishing.outcome is Outcome.COMPLETED, workers.output()
    budget = read(audited, "stuck-budget")
    assert (budget.state, budget.recovery_count) == (JobState.QUEUED, 1)
    no_policy = read(audited, "stuck-no-policy")
    assert (no_policy.state, no_policy.outcome, no_policy.failure_reason) == (
        JobState.SETTLED,
        Outcome.INTERRUPTED,
        f"{store.SHUTDOWN_REASON}; no recovery policy",  # the shutdown's grace ran out, said so
    )
    assert workers.exit_code(proc) == 0, workers.output()


# -- commands from another process ---------------------------------------------


def test_cancel_and_fail_lane_from_this_process_stop_handlers_in_a_worker_process(
    audited: Engine, workers: Workers
) -> None:
    add(audited, Job("cancelled", "q", lane="lane-a"), Job("lane-failed", "q", lane="lane-b"))
    proc = workers.start("q=block", concurrency=2, lease=3, heartbeat=1)
    wait_until(lambda: started(audited, "cancelled", "lane-failed"), what="both jobs to start")
    watchdog = Watchdog(audited)
    assert watchdog.cancel("cancelled", "stop-it").status.value == "recorded"
    assert watchdog.fail_lane("lane-b", "lane b is down").settled == 1
    jobs = settle_all(audited, ["cancelled", "lane-failed"], timeout=20)
    wait_until(
        lambda: len({j for j, _, e in events(audited) if e.startswith("stopped:")}) == 2,
        what="both handlers to stop",
    )
    stops = {job_id: event for job_id, _, event in events(audited) if event.startswith("stopped:")}
    assert stops == {"cancelled": "stopped:cancelled", "lane-failed": "stopped:lane_failed"}
    assert (jobs["cancelled"].outcome, jobs["cancelled"].failure_reason) == (Outcome.CANCELLED, None)
    assert (jobs["lane-failed"].outcome, jobs["lane-failed"].failure_reason) == (Outcome.FAILED, "lane b is down")
    assert workers.terminate(proc) == 0


# -- many runners, one database ------------------------------------------------


@pytest.mark.slow  # 10-15 s on two busy cores: three interpreters start, 150 jobs
def test_three_worker_processes_drain_one_set_of_jobs_each_executed_exactly_once(
    audited: Engine, workers: Workers
) -> None:
    procs = [workers.start("q=work", sleep_ms=20, concurrency=2, lease=20, heartbeat=2, poll=0.1) for _ in range(3)]
    wait_until(lambda: len(events(audited, "ready")) == 3, what="three workers to start")
    job_ids = [f"job-{i:03d}" for i in range(150)]
    add(audited, *(Job(job_id, "q", payload={"i": i}) for i, job_id in enumerate(job_ids)))
    jobs = settle_all(audited, job_ids, timeout=120)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(30) for proc in procs] == [0, 0, 0]
    log = workers.output()
    assert [j for j in job_ids if jobs[j].outcome is not Outcome.COMPLETED] == [], log
    runs = Counter(job_id for job_id, _, _ in events(audited, "started"))
    assert runs == Counter({job_id: 1 for job_id in job_ids})
    pids = {pid for _, pid, _ in events(audited, "started")}
    assert len(pids) >= 2, "the work was not shared"
    assert "database is locked" not in log
    assert "Traceback" not in log
