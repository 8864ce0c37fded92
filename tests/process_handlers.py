"""Handlers for the process executor's tests, at the top level of an
importable module (the process executor locates a handler by module path).

A child process shares no memory with the test, so these handlers leave
marks in a directory the job's payload names (``{"dir": ...}``): a file
``<job_id>.<attempt>.<event>`` holding the child's pid and the time
(:func:`mark`), read back by the test with :func:`marks` and
:func:`wait_for_mark`. Other payload keys steer a handler (see each).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy_watchdog import Decision, InvalidJob, ProcessExecutor, RunningJob, task
from sqlalchemy_watchdog.core.handlers import HandlerRegistry

#: What a memory-hungry handler keeps alive in its child (never freed).
_HOARD: list[bytes] = []


def mark(job: RunningJob, event: str, text: str = "") -> None:
    """Leave the mark ``event`` of this attempt: the child's pid, the time, ``text``."""
    directory = Path(job.payload["dir"])
    path = directory / f"{job.job_id}.{job.attempt}.{event}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{os.getpid()} {time.time()!r} {text}")
    tmp.rename(path)  # whole or absent: a reader never sees half a mark


def marks(directory: Path | str, job_id: str, event: str) -> list[tuple[int, int, float, str]]:
    """The marks ``event`` of ``job_id``'s attempts: (attempt, pid, time, text)."""
    found = []
    for path in Path(directory).glob(f"{job_id}.*.{event}"):
        attempt = int(path.name[len(job_id) + 1 :].split(".")[0])
        pid, at, *text = path.read_text().split(" ", 2)
        found.append((attempt, int(pid), float(at), text[0] if text else ""))
    return sorted(found)


def wait_for_mark(directory: Path | str, job_id: str, event: str, timeout: float = 60) -> tuple[int, float, str]:
    """The first attempt's mark ``event`` of ``job_id`` once it exists: (pid, time, text)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = marks(directory, job_id, event)
        if found:
            return found[0][1:]
        time.sleep(0.02)
    raise AssertionError(f"no mark {event!r} of {job_id} in {directory} after {timeout}s")


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


# -- the handlers ---------------------------------------------------------------------


def done(job: RunningJob) -> None:
    """Completes at once."""
    return None


def record(job: RunningJob) -> None:
    """Writes what it saw of the job (``repr`` of its fields) and completes."""
    seen = {
        "job_id": job.job_id,
        "queue": job.queue,
        "lane": job.lane,
        "priority": job.priority,
        "key": job.key,
        "payload": {k: v for k, v in job.payload.items() if k != "dir"},
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "recovery_count": job.recovery_count,
        "timeout": job.timeout,
        "stop_requested": job.stop_requested.is_set(),
    }
    mark(job, "seen", repr(seen))


def decide(job: RunningJob) -> Decision | None:
    """Returns the decision the payload names: ``failed``, ``unknown``, ``completed``."""
    what = job.payload["decide"]
    if what == "failed":
        return Decision.failed("it did not work", retry=False)
    if what == "unknown":
        return Decision.outcome_unknown("maybe it worked")
    return Decision.completed()


def raises(job: RunningJob) -> None:
    """Raises ``ValueError`` with the payload's message."""
    raise ValueError(job.payload.get("message", "bad input"))


class _Unpicklable(Exception):
    """An exception that cannot be rebuilt from its pickle (its ``__init__``
    takes two arguments, ``args`` holds one)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} (code {code})")


def raises_unpicklable(job: RunningJob) -> None:
    raise _Unpicklable("the printer is on fire", 7)


def returns_value(job: RunningJob) -> Any:
    """Returns ``payload["value"]`` (not a Decision)."""
    return job.payload["value"]


def returns_unencodable(job: RunningJob) -> Any:
    """Returns something no pipe can carry (a lock)."""
    return threading.Lock()


def flaky(job: RunningJob) -> Decision | None:
    """Fails (raises) until attempt ``payload["succeed_at"]``, then completes."""
    mark(job, "started")
    if job.attempt < job.payload["succeed_at"]:
        raise RuntimeError(f"attempt {job.attempt} failed")
    return None


def blocking(job: RunningJob) -> Decision | None:
    """Marks ``started``, waits for its stop (at most ``payload["wait"]``,
    default 30 s), marks ``stopped`` with the reason and returns None."""
    mark(job, "started")
    stopped = job.stop_requested.wait(job.payload.get("wait", 30))
    reason = job.stop_reason.value if stopped and job.stop_reason is not None else "none"
    mark(job, "stopped", reason)
    return None


def progress_after_stop(job: RunningJob) -> str:
    """Marks ``started``, waits for its stop (at most ``payload["wait"]``,
    default 30 s), then reports progress; marks ``reported`` with the stop
    reason and the report's answer, and returns the answer."""
    mark(job, "started")
    stopped = job.stop_requested.wait(job.payload.get("wait", 30))
    reason = job.stop_reason.value if stopped and job.stop_reason is not None else "none"
    answer = job.progress(0.75, "after the stop").value
    mark(job, "reported", f"{reason} {answer}")
    return answer


def stubborn(job: RunningJob) -> None:
    """Marks ``started``; from attempt ``payload.get("behave_from", 0)`` on
    completes at once; before that ignores every stop for ``payload["sleep"]``
    seconds (default 30), then marks ``finished`` -- a side effect that must
    never happen once its child was killed. Each attempt marks ``overlap``
    when an earlier attempt's child is still alive as it starts."""
    directory = job.payload["dir"]
    for _, pid, _, _ in marks(directory, job.job_id, "started"):
        if pid_alive(pid):
            mark(job, "overlap", str(pid))
    mark(job, "started")
    behave_from = job.payload.get("behave_from", 0)
    if behave_from and job.attempt >= behave_from:
        return None
    time.sleep(job.payload.get("sleep", 30))
    mark(job, "finished")


def hog(job: RunningJob) -> None:
    """Marks ``started``, then computes in one C call that never lets another
    thread of its process run (``sum`` over a huge range holds the GIL): the
    child's reader thread cannot see its pipe close, so only the kernel's
    death signal can end it when its parent dies."""
    mark(job, "started")
    sum(range(10**15))


def logs(job: RunningJob) -> None:
    """Marks ``ran``; logs a WARNING through ``job.log`` and an ERROR with a
    traceback through a logger of its own."""
    mark(job, "ran")
    job.log.warning("charging card %s", job.payload["card"])
    try:
        raise KeyError("no such card")
    except KeyError:
        logging.getLogger("tests.process_handlers").exception("lookup failed")


def exits(job: RunningJob) -> None:
    """Marks ``started`` and ends its process with ``os._exit(payload["code"])``."""
    mark(job, "started")
    os._exit(job.payload.get("code", 3))


def exits_after(job: RunningJob) -> None:
    """Marks ``started``, sleeps ``payload["wait"]`` seconds, then ends its
    process with ``os._exit(payload["code"])``."""
    mark(job, "started")
    time.sleep(job.payload.get("wait", 0))
    os._exit(job.payload.get("code", 3))


def naps(job: RunningJob) -> None:
    """Marks ``started``, sleeps ``payload["wait"]`` seconds (default 0), completes."""
    mark(job, "started")
    time.sleep(job.payload.get("wait", 0))


def kills_itself(job: RunningJob) -> None:
    """Marks ``started`` and SIGKILLs its own process (as the OOM killer would)."""
    mark(job, "started")
    os.kill(os.getpid(), signal.SIGKILL)


def pid(job: RunningJob) -> None:
    """Marks ``ran`` (with its pid) and completes."""
    mark(job, "ran")


#: A registry of these tests' own: registering with it attaches the
#: handler's policy (its executor) to the function, while the registry a
#: ``Runner()`` without handlers serves stays as the other tests expect.
own_registry = HandlerRegistry()


@own_registry.register("crunch", executor="process")
def crunch(job: RunningJob) -> None:
    """Names the process executor itself: runs in a child whatever the
    runner's own executor. Marks ``ran`` (with its pid) and completes."""
    mark(job, "ran")


@own_registry.register("crunch-two", executor="process")
def crunch_two(job: RunningJob) -> None:
    """Like :func:`crunch`, for a second queue sharing its executor."""
    mark(job, "ran")


@own_registry.register("held", executor=ProcessExecutor(processes=1, prefetch=0, kill_grace=timedelta(seconds=1)))
def held(job: RunningJob) -> None:
    """One child, nothing claimed ahead of it. Marks ``started``, then waits
    (at most 30 s) for a file ``release`` in the marks directory, and completes."""
    mark(job, "started")
    release = Path(job.payload["dir"]) / "release"
    deadline = time.monotonic() + 30
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def hoard(job: RunningJob) -> None:
    """Marks ``ran``, then keeps ``payload["mib"]`` MiB alive in its process and completes."""
    mark(job, "ran")
    _HOARD.append(os.urandom(job.payload["mib"] * 1024 * 1024))


def burn(job: RunningJob) -> None:
    """Spends about ``payload["ms"]`` milliseconds of pure-Python CPU, marks ``ran``."""
    deadline = time.perf_counter() + job.payload.get("ms", 10) / 1000
    n = 0
    while time.perf_counter() < deadline:
        n += 1
    mark(job, "ran", str(n))


def reports_progress(job: RunningJob) -> list[str]:
    """Reports progress twice (the runner writes the first, keeps the second
    back: rate limit) and once out of range; returns what each answered."""
    answers = [job.progress(0.25, "quarter").value, job.progress(0.5, "half").value]
    try:
        job.progress(1.5)
    except InvalidJob as error:
        answers.append(f"refused {error.field}")
    return answers


def reads_parents(job: RunningJob) -> list[Any]:
    """Returns its parents as it reads them: job_id, outcome, result."""
    return [[p.job_id, None if p.outcome is None else p.outcome.value, p.result] for p in job.parent_results()]


def reports_and_reads(job: RunningJob) -> list[Any]:
    """Once the mark file ``payload["after"]`` (a name in the marks
    directory) exists, if given: reports progress twice (written, then kept
    back) and reads its parents; marks ``reported`` and returns the answers
    and the parents."""
    if "after" in job.payload:
        path, deadline = Path(job.payload["dir"]) / job.payload["after"], time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    answers: list[Any] = [job.progress(0.25, "quarter").value, job.progress(0.5, "half").value]
    answers += [[p.job_id, None if p.outcome is None else p.outcome.value, p.result] for p in job.parent_results()]
    mark(job, "reported")
    return answers


def returns_nan(job: RunningJob) -> Any:
    """Returns NaN: it crosses the pipe, but no JSON result can hold it."""
    return float("nan")


# -- @task functions: the process executor finds a task's handler in its module ---------

#: The registry the tasks below register with (not the default one, which
#: other tests' runners serve).
TASKS = HandlerRegistry()


@task("doubles", registry=TASKS)
def double(n: int) -> dict[str, int]:
    """A task run in a child: its argument doubled, and the child's pid."""
    return {"n": n * 2, "pid": os.getpid()}


@task("doubles-with-job", pass_job=True, registry=TASKS)
def double_with_job(job: RunningJob, n: int) -> dict[str, Any]:
    """A task given its job in a child: reports its progress (the runner
    writes it) and reads its parents (the runner reads them) as a handler would."""
    parents = [[p.job_id, None if p.outcome is None else p.outcome.value, p.result] for p in job.parent_results()]
    written = job.progress(1.0, "doubled").value
    return {"n": n * 2, "job_id": job.job_id, "attempt": job.attempt, "progress": written, "parents": parents}


@task("doubles-in-child", registry=TASKS, executor="process")
def double_in_child(n: int) -> dict[str, int]:
    """A task naming the process executor itself: runs in a child whatever
    the runner's own executor; its argument doubled, and the child's pid."""
    return {"n": n * 2, "pid": os.getpid()}


def chatty(job: RunningJob) -> None:
    """Marks ``started``, then reports progress every ``payload["every"]``
    seconds (default 10 ms) for ``payload["seconds"]`` (default 8), ignoring
    every stop, and marks ``finished`` -- which must never happen once its
    child was killed."""
    mark(job, "started")
    every, until = job.payload.get("every", 0.01), time.monotonic() + job.payload.get("seconds", 8)
    n = 0
    while time.monotonic() < until:
        n += 1
        job.progress(min(1.0, n / 1000), f"step {n}")
        time.sleep(every)
    mark(job, "finished")


def floods(job: RunningJob) -> None:
    """Marks ``started``, then logs a WARNING every ``payload["every"]``
    seconds (default 2 ms) for ``payload["seconds"]`` (default 8), ignoring
    every stop, and marks ``finished``."""
    mark(job, "started")
    every, until = job.payload.get("every", 0.002), time.monotonic() + job.payload.get("seconds", 8)
    flood = logging.getLogger("tests.process_handlers.flood")
    n = 0
    while time.monotonic() < until:
        n += 1
        flood.warning("line %d", n)
        time.sleep(every)
    mark(job, "finished")


def logs_everywhere(job: RunningJob) -> None:
    """Logs an INFO and a WARNING through a third-party library's logger
    (``thirdparty.http``), an INFO through its own module's and one through
    ``job.log``; marks ``ran``."""
    library = logging.getLogger("thirdparty.http")
    library.info("GET https://api.example/1 200")
    library.warning("GET https://api.example/2 took 9s")
    logging.getLogger(__name__).info("handler info")
    job.log.info("job info")
    mark(job, "ran")


def durable(job: RunningJob) -> Any:
    """Durable steps in a child: step ``a`` (marked each time it runs), a
    durable sleep of ``sleep_ms`` (if given), then step ``b``; the first
    attempt raises after ``b`` (payload ``fail_first``)."""

    def step_a() -> dict[str, int]:
        mark(job, "a")
        return {"a": 1}

    def step_b() -> int:
        mark(job, "b")
        return 2

    a = job.step("a", step_a)
    if job.payload.get("sleep_ms"):
        job.sleep(timedelta(milliseconds=job.payload["sleep_ms"]))
    b = job.step("b", step_b)
    if job.payload.get("fail_first") and job.attempt == 1:
        raise RuntimeError("after b")
    return {"a": a, "b": b}


def waits(job: RunningJob) -> Any:
    """A wait for signal ``approved`` in a child (an hour's timeout): its payload returned."""
    return {"approval": job.wait_for("approved", timeout=timedelta(hours=1))}


def _booked(directory: str, what: str) -> dict[str, str]:
    return {"dir": directory, "what": what}


def undo_booking(booked: dict[str, str]) -> None:
    """The undo of a :func:`saga` step, called with the step's result: it
    leaves ``undo-<what>`` (its pid, the time) -- in the runner's process."""
    path = Path(booked["dir"]) / f"undo-{booked['what']}"
    path.write_text(f"{os.getpid()} {time.time()!r}")


def saga(job: RunningJob) -> Any:
    """Two steps in a child naming module-level undos, then a failure: with
    no retry left the runner runs both undos (``charge``'s first). Payload
    ``timeout_sleep``: sleep that long after the steps instead (a timeout
    kills the child)."""
    directory = job.payload["dir"]
    job.step("reserve", _booked, directory, "reserve", undo=undo_booking)
    job.step("charge", _booked, directory, "charge", undo=undo_booking)
    if job.payload.get("timeout_sleep"):
        time.sleep(job.payload["timeout_sleep"])
    raise RuntimeError("declined")


async def _async_undo(value: Any) -> None:
    return None


def undo_refused(job: RunningJob) -> dict[str, Any]:
    """Undos a child cannot send: a lambda (not picklable by reference) and a
    coroutine function (the runner calls it plainly). Each refusal's field
    and text, and whether the step ran."""
    seen: dict[str, Any] = {"ran": []}
    for name, undo in (("lambda", lambda value: None), ("coroutine", _async_undo)):
        try:
            job.step(name, seen["ran"].append, name, undo=undo)
        except InvalidJob as refused:
            seen[name] = [refused.field, str(refused)]
    return seen
