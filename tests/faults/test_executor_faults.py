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
  the runner exits within its budget and leaves no child behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Job, JobState, Outcome, Runner, store
from tests import process_handlers as h
from tests.helpers import add, read, settled, wait_until

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
