"""The process executor under real signals: a runner process
(tests/workers/process_worker.py) with child processes running handlers
(tests/process_handlers.py), its children or itself killed or stopped.

* a child SIGKILLed mid-handler fails its job with the signal, is replaced,
  and the runner goes on;
* the parent SIGKILLed: its children are gone within seconds (they never
  outlive it), and its jobs are recovered after their lease as today;
* SIGTERM while children are busy: claiming stops, a handler that stops
  when asked settles ``completed``, one that ignores its stop is killed
  after the grace and its job handed to recovery with the shutdown reason,
  a job claimed ahead that no child took is given back untouched;
  the runner exits within its budget and leaves no child behind;
* a handler that never pauses talking to the runner -- progress reports
  every 10 ms, or a flood of log records -- is stopped and killed on time
  all the same: at its timeout, at a cancellation, and at a SIGTERM, where
  its job goes to recovery only once its child is dead, within the budget
  the runner printed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, JobState, Outcome, ProcessExecutor, Runner, TickStatus, Watchdog, store
from sqlalchemy_watchdog.model import jobs_table
from tests import process_handlers as h
from tests.helpers import add, read, settled, wait_until
from tests.runner_kinds import PROCESS_KINDS, DrivenRunner, RunnerDriver

pytestmark = pytest.mark.dialect_neutral

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "workers" / "process_worker.py"
LEASE = timedelta(seconds=3)


class ProcessWorker:
    """A process_worker.py process (killed at teardown if still alive)."""

    def __init__(self, url: URL, log: Path, *, asyncio: bool, grace: float = 0.5) -> None:
        args = [sys.executable, str(SCRIPT), url.render_as_string(hide_password=False), "--grace", str(grace)]
        if asyncio:
            args.append("--asyncio")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        wait_until(lambda: "process-worker ready" in self.log_text() or self.proc.poll() is not None, 60, "ready")
        assert self.proc.poll() is None, self.log_text()[-3000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._log.close()


@pytest.fixture
def worker_kind(runner_kind: str) -> bool:
    """Whether the worker process runs an AsyncRunner."""
    return runner_kind == "async"


@pytest.fixture
def start(tmp_path: Path, engine: Engine, worker_kind: bool) -> Iterator[Callable[..., ProcessWorker]]:
    """Start a worker process on the test's database (``grace=`` seconds)."""
    started: list[ProcessWorker] = []

    def begin(grace: float = 0.5) -> ProcessWorker:
        worker = ProcessWorker(engine.url, tmp_path / f"worker-{len(started)}.log", asyncio=worker_kind, grace=grace)
        started.append(worker)
        return worker

    yield begin
    for worker in started:
        worker.close()


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    directory = tmp_path / "marks"
    directory.mkdir()
    return directory


def payload(marks: Path, **more: object) -> dict[str, object]:
    return {"dir": str(marks), **more}


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(h.pid_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def test_a_child_killed_mid_handler_fails_its_job_and_the_runner_goes_on(
    engine: Engine, start: Callable[..., ProcessWorker], marks: Path
) -> None:
    add(
        engine,
        Job("victim", "stubborn", payload=payload(marks, sleep=60)),
        Job("bystander", "block", payload=payload(marks, wait=3)),
    )
    worker = start()
    worker.wait_ready()
    victim_pid = h.wait_for_mark(marks, "victim", "started")[0]
    h.wait_for_mark(marks, "bystander", "started")
    os.kill(victim_pid, signal.SIGKILL)
    victim = settled(engine, "victim")
    assert (victim.outcome, victim.failure_reason) == (
        Outcome.FAILED,
        f"the handler's process (pid {victim_pid}) died: it killed by signal SIGKILL",
    )
    # The other child's job is untouched, and a new job runs in a new child.
    assert settled(engine, "bystander").outcome is Outcome.COMPLETED
    add(engine, Job("after", "pid", payload=payload(marks)))
    assert settled(engine, "after").outcome is Outcome.COMPLETED
    assert h.wait_for_mark(marks, "after", "ran")[0] != victim_pid
    assert worker.proc.poll() is None


@pytest.mark.parametrize(
    "queue",
    [
        "stubborn",
        pytest.param(
            "hog",
            marks=pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"),
        ),
    ],
    ids=["sleeping", "holding-the-GIL"],
)
def test_children_never_outlive_a_sigkilled_parent_and_its_jobs_are_recovered(
    engine: Engine, start: Callable[..., ProcessWorker], marks: Path, queue: str
) -> None:
    """A sleeping child also sees its pipe close; one holding its GIL in a C
    call cannot, and dies of the kernel's parent-death signal."""
    add(engine, *(Job(j, queue, payload=payload(marks, sleep=60), max_recoveries=1) for j in ("a", "b")))
    worker = start()
    worker.wait_ready()
    children = [h.wait_for_mark(marks, j, "started")[0] for j in ("a", "b")]
    assert worker.proc.pid not in children
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait(10)
    try:
        assert gone_within(children, 5), "a child outlived its SIGKILLed parent"
    finally:  # never leave an orphan behind (a hog spins until killed)
        for pid in children:
            if h.pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert [read(engine, j).state for j in ("a", "b")] == [JobState.RUNNING, JobState.RUNNING]
    # Recovered after the lease, as for any vanished worker: requeued within the budget, then run.
    recoverer = Runner(engine, {queue: h.done}, lease=LEASE, heartbeat=timedelta(seconds=1))
    wait_until(lambda: recoverer.tick() and all(read(engine, j).state is JobState.SETTLED for j in ("a", "b")), 30)
    for j in ("a", "b"):
        job = read(engine, j)
        assert (job.outcome, job.recovery_count) == (Outcome.COMPLETED, 1)
        assert h.marks(marks, j, "finished") == []


def test_sigterm_with_busy_children_settles_or_hands_over_every_job_and_leaves_no_child(
    engine: Engine, start: Callable[..., ProcessWorker], marks: Path
) -> None:
    add(
        engine,
        Job("polite", "block", payload=payload(marks)),
        Job("stubborn", "stubborn", payload=payload(marks, sleep=60)),
    )
    worker = start(grace=0.5)
    worker.wait_ready()
    children = [h.wait_for_mark(marks, j, "started")[0] for j in ("polite", "stubborn")]
    # Both children busy: this one is claimed ahead (prefetch) and waits for a child.
    add(engine, Job("waiting", "pid", payload=payload(marks)))
    wait_until(lambda: read(engine, "waiting").state is JobState.RUNNING, 10, "claimed ahead")
    began = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(15) == 0, worker.log_text()[-3000:]
    # grace 0.5 s + stop wait 0.5 s, and the last statements: never the handler's 60 s.
    assert time.monotonic() - began < 10
    assert gone_within(children, 2)
    polite = read(engine, "polite")
    assert polite.outcome is Outcome.COMPLETED
    assert h.wait_for_mark(marks, "polite", "stopped")[2] == "shutdown"
    stubborn = read(engine, "stubborn")
    assert (stubborn.outcome, stubborn.failure_reason) == (
        Outcome.INTERRUPTED,
        f"{store.SHUTDOWN_REASON}; no recovery policy",
    )
    assert h.marks(marks, "stubborn", "finished") == []
    # The job claimed ahead never started: its claim was given back as it was
    # (queued, no attempt, snooze or recovery counted, never ``interrupted``).
    waiting = read(engine, "waiting")
    assert (waiting.state, waiting.attempt, waiting.snoozes, waiting.recovery_count) == (JobState.QUEUED, 1, 0, 0)
    assert h.marks(marks, "waiting", "ran") == []


def test_sigkill_with_jobs_prefetched_for_busy_children_requeues_those_never_started_uncounted(
    engine: Engine, start: Callable[..., ProcessWorker], marks: Path
) -> None:
    """Issue 54: jobs the process executor claims ahead of its busy children
    (``prefetch``) are marked ``unstarted`` by their claim, and the mark is
    cleared only once a child is free to take the job -- never while it waits,
    nor behind a busy child's running job. A runner SIGKILLed while they wait
    leaves them marked: recovery requeues them without counting a recovery,
    at-most-once budget or not, and each runs once, on the survivor."""
    add(engine, *(Job(j, "block", payload=payload(marks, wait=60), max_recoveries=1) for j in ("a", "b")))
    worker = start()
    worker.wait_ready()
    children = [h.wait_for_mark(marks, j, "started")[0] for j in ("a", "b")]
    # Both children busy: the default prefetch (one per process) claims these two ahead.
    waiting = ["w1", "w2"]
    add(engine, *(Job(j, "pid", payload=payload(marks)) for j in waiting))  # no recovery budget
    wait_until(lambda: all(read(engine, j).state is JobState.RUNNING for j in waiting), 10, "claimed ahead")
    time.sleep(0.3)  # a mark cleared too early would be cleared by now
    with engine.connect() as conn:
        flags = {row.job_id: row.unstarted for row in conn.execute(select(jobs_table.c.job_id, jobs_table.c.unstarted))}
    assert {j: flags[j] for j in waiting} == {"w1": 1, "w2": 1}, "marked while waiting for a child"
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait(10)
    assert gone_within(children, 5)
    assert all(h.marks(marks, j, "ran") == [] for j in waiting)
    recoverer = Runner(engine, {"block": h.done, "pid": h.pid}, lease=LEASE, heartbeat=timedelta(seconds=1))
    ids = ["a", "b", *waiting]
    wait_until(lambda: recoverer.tick() and all(read(engine, j).state is JobState.SETTLED for j in ids), 30)
    for j in waiting:
        job = read(engine, j)
        assert (job.outcome, job.recovery_count) == (Outcome.COMPLETED, 0), (j, job.failure_reason)
        assert [pid for _, pid, *_ in h.marks(marks, j, "ran")] == [os.getpid()], "ran once, on the survivor"
    for j in ("a", "b"):  # they had started: recovered as before, within their budget
        assert (read(engine, j).outcome, read(engine, j).recovery_count) == (Outcome.COMPLETED, 1)


# -- a handler that never pauses talking to the runner -------------------------------------

#: Progress reports every 10 ms, or a WARNING every 2 ms: never a pause of
#: the 50 ms the runner's wait for its child's answer lasts.
TALKERS = ["chatty", "floods"]
#: The timeout and the kill grace of these tests, and what the kill may take
#: beyond them (the kill, the reap, the settle, on a busy machine).
TIMEOUT = timedelta(milliseconds=500)
KILL_GRACE = timedelta(milliseconds=500)
MARGIN_S = 1.5


@pytest.fixture(params=PROCESS_KINDS)
def process_runners(request: pytest.FixtureRequest, engine: Engine) -> Iterator[RunnerDriver]:
    """``Runner`` and ``AsyncRunner`` with the process executor, in this process."""
    driver = RunnerDriver(request.param, engine.url)
    try:
        yield driver
    finally:
        driver.close()


def talker(runners: RunnerDriver, queue: str) -> DrivenRunner:
    return runners.runner(
        {queue: getattr(h, queue)},
        executor=ProcessExecutor(processes=1, kill_grace=KILL_GRACE),
        lease=LEASE,
        heartbeat=timedelta(milliseconds=500),
        poll_interval=timedelta(milliseconds=100),
    )


@pytest.mark.parametrize("queue", TALKERS)
def test_a_handler_that_never_pauses_talking_is_still_killed_at_its_timeout_and_grace(
    engine: Engine, process_runners: RunnerDriver, marks: Path, queue: str
) -> None:
    add(engine, Job("talker", queue, payload=payload(marks), timeout=TIMEOUT))
    result = talker(process_runners, queue).tick()
    ended = time.time()
    pid, began, _ = h.wait_for_mark(marks, "talker", "started")
    assert result.status is TickStatus.SETTLED and result.job is not None
    assert (result.job.outcome, result.job.failure_reason) == (
        Outcome.FAILED,
        "killed after timeout (timed out after 0.5s, then 0.5s to stop)",
    )
    # From its first line to its settle: the timeout, the grace, the kill -- never its 8 s.
    assert ended - began < (TIMEOUT + KILL_GRACE).total_seconds() + MARGIN_S
    assert not h.pid_alive(pid)
    assert h.marks(marks, "talker", "finished") == []


@pytest.mark.parametrize("queue", TALKERS)
def test_a_handler_that_never_pauses_talking_is_still_killed_at_a_cancellation(
    engine: Engine, process_runners: RunnerDriver, marks: Path, queue: str
) -> None:
    add(engine, Job("talker", queue, payload=payload(marks)))
    with talker(process_runners, queue).serving():
        pid = h.wait_for_mark(marks, "talker", "started")[0]
        began = time.monotonic()
        Watchdog(engine).cancel("talker", "stop-it")
        cancelled = settled(engine, "talker", timeout=15)
        took = time.monotonic() - began
        assert not h.pid_alive(pid)
    assert cancelled.outcome is Outcome.CANCELLED
    assert took < KILL_GRACE.total_seconds() + MARGIN_S  # never the handler's 8 s
    assert h.marks(marks, "talker", "finished") == []


class Death:
    """When the process ``pid`` was first seen gone (a thread polls every 5 ms)."""

    def __init__(self, pid: int) -> None:
        self.at: float | None = None
        self._pid = pid
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not h.pid_alive(self._pid):
                self.at = time.monotonic()
                return
            time.sleep(0.005)


@pytest.mark.parametrize("queue", TALKERS)
def test_at_sigterm_a_handler_that_never_pauses_talking_is_killed_before_its_job_is_requeued_within_the_budget(
    engine: Engine, start: Callable[..., ProcessWorker], marks: Path, queue: str
) -> None:
    """The job goes to recovery only once its child's kill is confirmed:
    when the test first sees it queued again, the child is already gone --
    and that is within the shutdown budget the runner printed."""
    add(engine, Job("talker", queue, payload=payload(marks, seconds=30), max_recoveries=1))
    worker = start(grace=1.0)
    worker.wait_ready()
    pid = h.wait_for_mark(marks, "talker", "started")[0]
    found = re.search(r"shutdown_budget=([0-9.]+)s", worker.log_text())
    assert found is not None, worker.log_text()[-3000:]
    budget = float(found.group(1))
    death = Death(pid)
    began = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)

    def requeued() -> tuple[float, bool] | None:
        if read(engine, "talker").state is not JobState.QUEUED:
            return None
        return time.monotonic(), h.pid_alive(pid)

    seen_at, alive = wait_until(requeued, 30, "the job to be requeued")
    assert not alive, "the job was requeued while its child still ran"
    assert death.at is not None and death.at <= seen_at
    assert seen_at - began < budget + MARGIN_S, (seen_at - began, budget)
    assert worker.proc.wait(15) == 0, worker.log_text()[-3000:]
    # And the runner is gone soon after (its last statements, its engine closed).
    assert time.monotonic() - began < budget + 2 * MARGIN_S, worker.log_text()[-3000:]
    assert read(engine, "talker").recovery_count == 1
    assert h.marks(marks, "talker", "finished") == []
