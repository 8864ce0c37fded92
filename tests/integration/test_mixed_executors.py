"""An executor per handler: one runner serves thread and process queues side by side.

A handler names its own executor (``@handler(queue, executor="process")``,
tests/process_handlers.py registers them); the runner's ``executor`` stays
the default of the handlers that name none. Each executor has slots of its
own -- the runner's ``concurrency`` for the handlers in its process, a
process executor's ``processes`` (and ``prefetch``) for its children -- and
each is claimed for apart, so a queue never gets more jobs than its
executor runs. Both runners, on both dialects: the claims are per queue
set, statements the dialects write apart.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Job, JobState, Outcome, ProcessExecutor, RunningJob
from sqlalchemy_watchdog.core.handlers import HandlerRegistry
from sqlalchemy_watchdog.core.settings import RunnerSettings
from tests import process_handlers as h
from tests.helpers import add, read, settled, wait_until
from tests.runner_kinds import RunnerDriver

pytestmark = pytest.mark.dialect_specific

POLL = timedelta(milliseconds=100)


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    directory = tmp_path / "marks"
    directory.mkdir()
    return directory


def test_one_runner_runs_a_thread_queue_in_its_process_and_a_process_queue_in_children(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """The thread handler (a closure: threads need no module path) runs in
    the runner's process; the handler naming ``executor="process"`` runs in
    a child, whatever the runner's own (default: thread) executor."""
    seen: list[int] = []
    lock = threading.Lock()

    def in_the_runner(job: RunningJob) -> None:
        with lock:
            seen.append(os.getpid())

    jobs = [Job(f"io-{n}", "io", payload={"dir": str(marks)}) for n in range(6)]
    jobs += [Job(f"cpu-{n}", "crunch", payload={"dir": str(marks)}) for n in range(4)]
    add(engine, *jobs)
    runner = runners.runner({"io": in_the_runner, "crunch": h.crunch}, poll_interval=POLL, concurrency=3)
    with runner.serving():
        for found in jobs:
            assert settled(engine, found.job_id, timeout=60).outcome is Outcome.COMPLETED
    assert seen == [os.getpid()] * 6, "the thread queue's handlers ran in the runner's process"
    child_pids = {h.wait_for_mark(marks, f"cpu-{n}", "ran")[0] for n in range(4)}
    assert os.getpid() not in child_pids, "the process queue's handlers ran in children"


def test_run_until_idle_runs_each_queue_where_its_handler_says(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    seen: list[int] = []
    add(engine, Job("io", "io", payload={"dir": str(marks)}), Job("cpu", "crunch", payload={"dir": str(marks)}))
    done = runners.runner({"io": lambda job: seen.append(os.getpid()), "crunch": h.crunch}).run_until_idle()
    assert {j.job_id: j.outcome for j in done} == {"io": Outcome.COMPLETED, "cpu": Outcome.COMPLETED}
    assert seen == [os.getpid()]
    assert h.wait_for_mark(marks, "cpu", "ran")[0] != os.getpid()


def test_a_process_queue_is_never_claimed_beyond_its_children_whatever_the_threads_slots(
    engine: Engine, runners: RunnerDriver, marks: Path
) -> None:
    """``held`` runs in one child with nothing claimed ahead of it: while its
    first job runs, its other jobs stay queued -- the runner's four thread
    slots, free meanwhile, serve the thread queue and never claim for it."""
    add(engine, *[Job(f"held-{n}", "held", payload={"dir": str(marks)}) for n in range(3)])
    add(engine, *[Job(f"io-{n}", "io") for n in range(8)])
    runner = runners.runner({"io": lambda job: None, "held": h.held}, poll_interval=POLL, concurrency=4)
    with runner.serving():
        for n in range(8):
            settled(engine, f"io-{n}")
        wait_until(lambda: any(h.marks(marks, f"held-{n}", "started") for n in range(3)), 30, "a held job to start")
        for _ in range(5):  # a few of the runner's passes (poll 0.1 s) with thread slots free
            states = [read(engine, f"held-{n}").state for n in range(3)]
            assert sorted(states, key=str) == sorted([JobState.RUNNING, JobState.QUEUED, JobState.QUEUED], key=str)
            threading.Event().wait(0.2)
        (marks / "release").touch()
        for n in range(3):
            assert settled(engine, f"held-{n}", timeout=60).outcome is Outcome.COMPLETED


def test_handlers_naming_equal_executors_share_one_pool_of_children() -> None:
    settings = RunnerSettings.build(
        {"crunch": h.crunch, "crunch-two": h.crunch_two, "io": lambda job: None},
        {"concurrency": 3},
        default_poll_interval=timedelta(seconds=1),
    )
    groups = settings.slot_groups
    assert [(g.queues, g.executor is None) for g in groups] == [(("crunch", "crunch-two"), False), (("io",), True)]
    assert settings.concurrency == groups[0].concurrency + 3
    assert settings.executors == {"crunch": "process", "crunch-two": "process", "io": "thread"}


def test_a_handler_naming_thread_runs_in_the_runners_process_beside_a_process_default() -> None:
    registry = HandlerRegistry()

    def local(job: Any) -> None:
        """A closure: refused by the process executor, fine in a thread."""

    registry.register("local", executor="thread")(local)
    settings = RunnerSettings.build(
        {"local": local, "cpu": h.done},
        {"executor": ProcessExecutor(processes=2)},
        default_poll_interval=timedelta(seconds=1),
    )
    assert settings.executors == {"local": "thread", "cpu": "process"}
    assert [g.concurrency for g in settings.slot_groups] == [10, 2], "threads: the default concurrency"


def test_a_task_passes_its_executor_to_its_handlers_registration() -> None:
    """``@task(queue, executor=...)`` registers the task's handler with that
    executor: here ``"thread"``, beside a runner whose default is children."""
    from sqlalchemy_watchdog import task

    @task("t-local", registry=HandlerRegistry(), executor="thread")
    def local(n: int) -> int:
        return n

    settings = RunnerSettings.build(
        {"t-local": local.handler, "cpu": h.done},
        {"executor": "process"},
        default_poll_interval=timedelta(seconds=1),
    )
    assert settings.executors == {"t-local": "thread", "cpu": "process"}


def test_a_task_naming_the_process_executor_runs_in_a_child_beside_a_thread_queue(
    engine: Engine, runners: RunnerDriver
) -> None:
    """``@task(queue, executor="process")`` at the top level of a module: its
    handler is found in that module by the child, while the runner's own
    (thread) handlers run in its process."""
    seen: list[int] = []
    add(engine, h.double_in_child.job(n=21, job_id="task-cpu"), Job("io", "io"))
    done = runners.runner(
        {"io": lambda job: seen.append(os.getpid()), "doubles-in-child": h.double_in_child.handler}
    ).run_until_idle()
    assert {j.job_id: j.outcome for j in done} == {"io": Outcome.COMPLETED, "task-cpu": Outcome.COMPLETED}
    assert seen == [os.getpid()]
    result = read(engine, "task-cpu").result
    assert result is not None and result["n"] == 42
    assert result["pid"] != os.getpid(), "the task ran in a child"
