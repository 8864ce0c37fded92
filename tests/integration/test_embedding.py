"""The runner inside the application: signals stay the host's, ``running()``
starts and stops it with the application, the shutdown fits the platform,
transient database errors can be retried, failure reasons keep no bound
parameters, and the log says one INFO line per period instead of two per job.

The process-level proof (uvicorn and a WSGI server, SIGTERM, load and
``pg_terminate_backend``) is tests/integration/test_in_process.py."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

from sqlalchemy_watchdog import (
    Decision,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    RetryPolicy,
    Runner,
    RunningJob,
    WakeupsUnavailable,
    metadata,
)
from sqlalchemy_watchdog.asyncio import AsyncRunner
from sqlalchemy_watchdog.core.settings import DEFAULT_GRACE
from sqlalchemy_watchdog.core.signals import signals_to_install
from sqlalchemy_watchdog.errors import redacted_detail, safe_text
from tests.conftest import make_async_engine
from tests.helpers import add, read, settled, wait_until
from tests.runner_kinds import RunnerDriver

# The dialect does not matter here but where a test says dialect_specific: the PostgreSQL copy
# runs under CI=true or WATCHDOG_ALL_DIALECTS=1 (tests/conftest.py).
pytestmark = pytest.mark.dialect_neutral

SECRET = "ada@example.com"


def host_handler(signum: int, frame: FrameType | None) -> None:  # pragma: no cover - never delivered
    """A server's own stop handler (uvicorn's, gunicorn's)."""


@pytest.fixture
def sqlite_engine(tmp_path: Any) -> Iterator[Engine]:
    engine = create_engine(f"sqlite:///{tmp_path / 'embed.db'}")
    metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def host_signals() -> Iterator[None]:
    """SIGINT and SIGTERM handled by the host, as inside a running server."""
    previous = {sig: signal.signal(sig, host_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@pytest.fixture
def default_signals() -> Iterator[None]:
    """A script's process: nobody handles SIGTERM, SIGINT is Python's."""
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- signals are the host's -------------------------------------------------------------


def test_run_forever_inside_a_server_never_replaces_its_signal_handlers(
    sqlite_engine: Engine, host_signals: None
) -> None:
    """In the main thread of a process whose server installed its own
    SIGINT/SIGTERM handlers, ``run_forever()`` (default arguments) leaves
    them in place while it serves and after it returns."""
    runner = Runner(sqlite_engine, {"q": lambda job: None}, poll_interval=timedelta(milliseconds=50))
    seen: list[Any] = []

    def watch() -> None:
        wait_until(lambda: runner.wakeup_status.reason != "not started", what="the runner to serve")
        seen.extend(signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM))
        runner.stop()

    threading.Thread(target=watch, daemon=True).start()
    runner.run_forever()
    assert seen == [host_handler, host_handler]
    assert [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)] == [host_handler, host_handler]


async def test_an_async_runner_started_as_a_task_in_a_server_keeps_its_handlers_and_leaves_no_default_behind(
    engine: Engine, host_signals: None
) -> None:
    """``asyncio.create_task(runner.run_forever())`` inside a server: the
    server's handlers stay (a SIGTERM is still the server's to act on), and
    when the runner stops it does not leave ``SIG_DFL`` behind (which would
    let a second SIGTERM kill the process without the lifespan's shutdown)."""
    async_engine = make_async_engine(engine)
    runner = AsyncRunner(async_engine, {"q": lambda job: None}, poll_interval=timedelta(milliseconds=50))
    try:
        task = asyncio.create_task(runner.run_forever())
        while runner.wakeup_status.reason == "not started":
            await asyncio.sleep(0.02)
        during = [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)]
        runner.stop()
        await asyncio.wait_for(task, 30)
    finally:
        await async_engine.dispose()
    assert during == [host_handler, host_handler]
    assert [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)] == [host_handler, host_handler]


def test_a_script_runner_stops_on_sigterm_and_puts_the_default_back(
    sqlite_engine: Engine, default_signals: None
) -> None:
    """A script's ``Runner.run_forever()`` owns its process: SIGTERM stops
    it gracefully (the running job completes), and the handlers it
    replaced are put back when it returns."""
    started = threading.Event()

    def work(job: RunningJob) -> None:
        started.set()
        time.sleep(0.3)

    add(sqlite_engine, Job("a", "q"))
    runner = Runner(sqlite_engine, {"q": work}, poll_interval=timedelta(milliseconds=50))

    def terminate() -> None:
        assert started.wait(20)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate, daemon=True).start()
    runner.run_forever()
    assert read(sqlite_engine, "a").outcome is Outcome.COMPLETED
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


#: A runner's process whose main thread holds the lock of the loop's wake-up event -- where
#: the loop is, for a few bytecodes, inside ``Event.wait`` or ``Event.clear`` -- when SIGTERM
#: arrives: Python runs the handler there, between two bytecodes of that thread.
_SIGNAL_IN_THE_LOOPS_LOCK = """
import os, signal, sys
from sqlalchemy import create_engine
from sqlalchemy_watchdog import Runner
runner = Runner(create_engine(sys.argv[1]), {"q": lambda job: None})
runner._install_signals(True)
with runner._wake._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100_000):
        pass
print("stopping" if runner._stopping.is_set() else "not stopping", flush=True)
"""


def test_a_stop_signal_landing_while_the_loop_holds_its_wake_up_lock_stops_the_runner(tmp_path: Path) -> None:
    """SIGTERM may arrive while the loop's thread holds the lock of its
    wake-up event (inside ``Event.wait`` or ``clear``). The handler then runs
    in that same thread and sets the event: with a plain ``threading.Event``
    it would wait forever for a lock its own thread holds, and the runner
    would never stop. The runner's events let a signal handler in."""
    url = f"sqlite:///{tmp_path / 'watchdog.db'}"
    run = subprocess.run(
        [sys.executable, "-c", _SIGNAL_IN_THE_LOOPS_LOCK, url],
        capture_output=True, text=True, timeout=20, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "stopping"


async def test_a_script_async_runner_under_asyncio_run_takes_the_signals_and_puts_them_back(
    engine: Engine, default_signals: None
) -> None:
    """``asyncio.run(runner.run_forever())`` in a script: SIGTERM stops the
    runner; ``asyncio.run``'s own SIGINT handler counts as the default, is
    taken over while the runner serves and put back afterwards."""
    before = signal.getsignal(signal.SIGINT)
    async_engine = make_async_engine(engine)
    runner = AsyncRunner(async_engine, {"q": lambda job: None}, poll_interval=timedelta(milliseconds=50))
    try:
        task = asyncio.create_task(runner.run_forever())
        while runner.wakeup_status.reason == "not started":
            await asyncio.sleep(0.02)
        assert signal.getsignal(signal.SIGINT) is not before
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, 30)
    finally:
        await async_engine.dispose()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is before


def test_which_signals_a_runner_takes(host_signals: None) -> None:
    """``True`` takes both in the main thread, ``False`` none, the default
    none of a host's; no thread but the main one ever takes any."""
    assert signals_to_install(None) == ()
    assert signals_to_install(False) == ()
    assert signals_to_install(True) == (signal.SIGINT, signal.SIGTERM)
    elsewhere: list[Any] = []
    thread = threading.Thread(target=lambda: elsewhere.append(signals_to_install(True)))
    thread.start()
    thread.join()
    assert elsewhere == [()]


# -- running() ----------------------------------------------------------------------------


def test_runner_running_serves_for_the_block_and_a_job_finishing_within_grace_completes(engine: Engine) -> None:
    """``with runner.running():`` serves in a thread of its own; leaving the
    block stops it, and a handler still at work then gets its grace and
    settles ``completed`` -- its normal return means it did its work."""
    started = threading.Event()

    def work(job: RunningJob) -> None:
        started.set()
        time.sleep(0.5)  # ignores stop_requested: finishes well within grace

    add(engine, Job("a", "q", max_recoveries=3))
    runner = Runner(engine, {"q": work}, poll_interval=timedelta(milliseconds=50), grace=timedelta(seconds=5))
    before = signal.getsignal(signal.SIGTERM)
    with runner.running() as same:
        assert same is runner
        assert started.wait(20)
        assert signal.getsignal(signal.SIGTERM) is before
    job = read(engine, "a")
    assert (job.state, job.outcome, job.recovery_count) == (JobState.SETTLED, Outcome.COMPLETED, 0)
    assert not [t for t in threading.enumerate() if t.name == "watchdog-runner"]


def test_runner_running_stops_within_its_shutdown_budget(sqlite_engine: Engine) -> None:
    """A handler that ignores its stop cannot hold the block's exit past the
    shutdown budget: the job is handed to recovery and the block ends."""
    started, release = threading.Event(), threading.Event()

    def stubborn(job: RunningJob) -> None:
        started.set()
        release.wait(30)

    add(sqlite_engine, Job("a", "q"))
    runner = Runner(
        sqlite_engine, {"q": stubborn}, poll_interval=timedelta(milliseconds=50), grace=timedelta(seconds=0.3)
    )
    try:
        with runner.running():
            assert started.wait(20)
            asked = time.monotonic()
        took = time.monotonic() - asked
    finally:
        release.set()
    assert took < runner.shutdown_budget.total_seconds() + 2.0, took
    job = read(sqlite_engine, "a")
    assert (job.state, job.outcome) == (JobState.SETTLED, Outcome.INTERRUPTED)


def test_runner_running_raises_what_stopped_it_from_starting(sqlite_engine: Engine) -> None:
    runner = Runner(sqlite_engine, {"q": lambda job: None}, wakeups="listen")
    with pytest.raises(WakeupsUnavailable), runner.running():
        pytest.fail("the block must not run")  # pragma: no cover


def test_runner_running_hands_the_blocks_exception_back_after_stopping(sqlite_engine: Engine) -> None:
    runner = Runner(sqlite_engine, {"q": lambda job: None}, poll_interval=timedelta(milliseconds=50))
    with pytest.raises(KeyError, match="boom"), runner.running():
        raise KeyError("boom")
    assert not [t for t in threading.enumerate() if t.name == "watchdog-runner"]


def test_a_runner_serves_one_loop_a_second_entry_is_refused_and_the_first_keeps_serving(
    sqlite_engine: Engine,
) -> None:
    """Entering ``running()`` (or ``run_forever``) again on a serving runner is
    refused with a clear error; the outer block goes on serving its jobs, and
    after it ends the runner can serve again."""
    ran: list[str] = []
    runner = Runner(sqlite_engine, {"q": lambda job: ran.append(job.job_id)}, poll_interval=timedelta(milliseconds=50))
    with runner.running():
        with pytest.raises(RuntimeError, match=r"running\(\): this runner is already serving"), runner.running():
            pytest.fail("the inner block must not run")  # pragma: no cover
        with pytest.raises(RuntimeError, match=r"run_forever\(\): this runner is already serving"):
            runner.run_forever(install_signal_handlers=False)
        add(sqlite_engine, Job("after-the-refusals", "q"))
        wait_until(lambda: "after-the-refusals" in ran, timeout=20)
    assert settled(sqlite_engine, "after-the-refusals").outcome is Outcome.COMPLETED
    with runner.running():  # one loop after the other is fine
        add(sqlite_engine, Job("second-block", "q"))
        wait_until(lambda: "second-block" in ran, timeout=20)


async def test_an_async_runner_serves_one_loop_a_second_entry_is_refused_and_the_first_keeps_serving(
    sqlite_engine: Engine,
) -> None:
    ran: list[str] = []

    async def work(job: RunningJob) -> None:
        ran.append(job.job_id)

    async_engine = make_async_engine(sqlite_engine)
    runner = AsyncRunner(async_engine, {"q": work}, poll_interval=timedelta(milliseconds=50))
    try:
        async with runner.running():
            with pytest.raises(RuntimeError, match=r"running\(\): this runner is already serving"):
                async with runner.running():
                    pytest.fail("the inner block must not run")  # pragma: no cover
            with pytest.raises(RuntimeError, match=r"run_forever\(\): this runner is already serving"):
                await runner.run_forever(install_signal_handlers=False)
            add(sqlite_engine, Job("after-the-refusals", "q"))
            for _ in range(400):
                if "after-the-refusals" in ran:
                    break
                await asyncio.sleep(0.05)
            assert "after-the-refusals" in ran
        async with runner.running():
            add(sqlite_engine, Job("second-block", "q"))
            for _ in range(400):
                if "second-block" in ran:
                    break
                await asyncio.sleep(0.05)
            assert "second-block" in ran
    finally:
        await async_engine.dispose()


async def test_async_runner_running_serves_for_the_block_and_a_job_finishing_within_grace_completes(
    engine: Engine,
) -> None:
    """``async with runner.running():`` (a FastAPI/Starlette lifespan):
    the runner serves as a task; on exit a coroutine handler still at work
    gets its grace and settles ``completed``."""
    started = asyncio.Event()

    async def work(job: RunningJob) -> None:
        started.set()
        await asyncio.sleep(0.5)

    add(engine, Job("a", "q", max_recoveries=3))
    async_engine = make_async_engine(engine)
    runner = AsyncRunner(
        async_engine, {"q": work}, poll_interval=timedelta(milliseconds=50), grace=timedelta(seconds=5)
    )
    try:
        async with runner.running() as same:
            assert same is runner
            await asyncio.wait_for(started.wait(), 20)
    finally:
        await async_engine.dispose()
    job = read(engine, "a")
    assert (job.state, job.outcome, job.recovery_count) == (JobState.SETTLED, Outcome.COMPLETED, 0)


async def test_async_runner_running_raises_what_stopped_it_from_starting(sqlite_engine: Engine) -> None:
    async_engine = make_async_engine(sqlite_engine)
    runner = AsyncRunner(async_engine, {"q": lambda job: None}, wakeups="listen")
    try:
        with pytest.raises(WakeupsUnavailable):
            async with runner.running():
                pytest.fail("the block must not run")  # pragma: no cover
    finally:
        await async_engine.dispose()


async def test_async_runner_running_stops_within_its_shutdown_budget(sqlite_engine: Engine) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def stubborn(job: RunningJob) -> None:
        started.set()
        while not release.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # swallows every cancellation until released

    add(sqlite_engine, Job("a", "q"))
    async_engine = make_async_engine(sqlite_engine)
    runner = AsyncRunner(
        async_engine, {"q": stubborn}, poll_interval=timedelta(milliseconds=50), grace=timedelta(seconds=0.3)
    )
    try:
        async with runner.running():
            await asyncio.wait_for(started.wait(), 20)
            asked = time.monotonic()
        took = time.monotonic() - asked
    finally:
        release.set()
        await asyncio.sleep(0.1)
        await async_engine.dispose()
    assert took < runner.shutdown_budget.total_seconds() + 2.0, took
    assert read(sqlite_engine, "a").outcome is Outcome.INTERRUPTED


# -- the default shutdown fits a 30 s termination period ------------------------------


def test_the_default_shutdown_budget_leaves_room_in_a_30_second_termination_period(sqlite_engine: Engine) -> None:
    """Grace plus the stop wait, by default, leaves 8 s of a 30 s period
    (Kubernetes' default, gunicorn's graceful_timeout) for the server's own
    drain and the last statements."""
    runner = Runner(sqlite_engine, {"q": lambda job: None})
    assert timedelta(seconds=20) == DEFAULT_GRACE
    assert runner.shutdown_budget == timedelta(seconds=22)
    assert 30 - runner.shutdown_budget.total_seconds() >= 8
    assert Runner(sqlite_engine, {"q": lambda job: None}, grace=timedelta(seconds=1)).shutdown_budget == timedelta(
        seconds=2
    )


# -- transient database errors in handlers ---------------------------------------------


def cut_connection(engine: Engine) -> None:
    """Fail the way a handler's database does when its connection is cut:
    an ``OperationalError`` whose statement was bound to personal data."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            # The server ends this session (what pg_terminate_backend does from outside).
            conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid()) WHERE :email <> ''"), {"email": SECRET})
        elif engine.dialect.name in ("mysql", "mariadb"):
            # Another session kills this one (KILL CONNECTION); its next statement finds it gone.
            session_id = conn.execute(text("SELECT CONNECTION_ID()")).scalar_one()
            with engine.connect() as killer:
                killer.execute(text(f"KILL CONNECTION {int(session_id)}"))
            conn.execute(text("SELECT :email"), {"email": SECRET})
        else:
            conn.execute(text("SELECT * FROM no_such_table WHERE email = :email"), {"email": SECRET})


@pytest.mark.dialect_specific
def test_a_retry_policy_restricted_to_operational_errors_retries_a_cut_connection_only(
    engine: Engine, runners: RunnerDriver
) -> None:
    """``RetryPolicy(retry_on=(OperationalError,))``: a handler whose
    connection was cut runs again and completes; a handler's own bug
    (a ValueError) is not retried."""
    calls: dict[str, int] = {"blip": 0, "bug": 0}

    def blip(job: RunningJob) -> None:
        calls["blip"] += 1
        if calls["blip"] == 1:
            cut_connection(engine)

    def bug(job: RunningJob) -> None:
        calls["bug"] += 1
        raise ValueError("a bug")

    policy = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=10), jitter=0, retry_on=(OperationalError,))
    add(engine, Job("blip", "blip"), Job("bug", "bug"))
    with runners.runner({"blip": blip, "bug": bug}, retry=policy, poll_interval=timedelta(milliseconds=50)).serving():
        blipped, bugged = settled(engine, "blip"), settled(engine, "bug")
    assert (blipped.outcome, blipped.attempt) == (Outcome.COMPLETED, 2)
    assert (bugged.outcome, bugged.attempt, calls["bug"]) == (Outcome.FAILED, 1, 1)
    assert blipped.failure_history[0].reason.startswith("OperationalError: ")


def test_retry_on_is_refused_on_a_job_and_checked(sqlite_engine: Engine) -> None:
    """A job's own policy is stored with it, exception types cannot be:
    ``retry_on`` belongs to a handler's or a runner's policy."""
    with pytest.raises(InvalidJob, match="^retry: retry_on is not stored"):
        Job("a", "q", retry=RetryPolicy(retry_on=(OperationalError,)))
    with pytest.raises(InvalidJob, match="^retry_on: "):
        RetryPolicy(retry_on=("OperationalError",))  # type: ignore[arg-type]
    assert RetryPolicy(retry_on=OperationalError).retry_on  # type: ignore[arg-type]  # one class is taken too == (OperationalError,)


@pytest.mark.dialect_specific
def test_a_database_errors_failure_reason_and_detail_keep_no_bound_parameters(
    engine: Engine, runners: RunnerDriver
) -> None:
    """A handler failing on a statement bound to personal data: the job's
    failure reason (on the dashboard) and its kept traceback name the
    error, never the parameter values (nor the SQL in the reason)."""

    def handler(job: RunningJob) -> None:
        cut_connection(engine)

    add(engine, Job("a", "q"))
    with runners.runner({"q": handler}, poll_interval=timedelta(milliseconds=50)).serving():
        job = settled(engine, "a")
    assert job.outcome is Outcome.FAILED
    assert job.failure_reason is not None and job.failure_detail is not None
    assert job.failure_reason.startswith("OperationalError: ")
    assert SECRET not in job.failure_reason and "[SQL" not in job.failure_reason
    assert SECRET not in job.failure_detail and "[parameters" not in job.failure_detail, job.failure_detail
    assert "Traceback (most recent call last)" in job.failure_detail and "cut_connection" in job.failure_detail


def test_safe_text_and_detail_leave_other_exceptions_as_python_prints_them() -> None:
    try:
        raise ValueError("order 7 has no lines")
    except ValueError as error:
        assert safe_text(error) == "ValueError: order 7 has no lines"
        detail = redacted_detail(error)
    assert detail.startswith("Traceback (most recent call last)") and detail.endswith(
        "ValueError: order 7 has no lines\n"
    )


# -- logs at scale -------------------------------------------------------------------------


def test_per_job_lines_are_debug_and_a_summary_counts_outcomes(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """At INFO, a busy runner logs no line per job: a summary every
    ``summary_every`` jobs (or seconds) counts what they became, with the
    ready backlog; errors stay."""
    add(engine, *[Job(f"ok-{n}", "q") for n in range(3)], Job("bad", "q", payload={"fail": True}))

    def handler(job: RunningJob) -> Decision | None:
        return Decision.failed("declined", retry=False) if job.payload else None

    with caplog.at_level(logging.INFO, logger="sqlalchemy_watchdog"):
        with runners.runner({"q": handler}, summary_every=4, poll_interval=timedelta(milliseconds=50)).serving():
            wait_until(lambda: [r for r in caplog.records if "runner summary" in r.getMessage()], what="the summary")
    per_job = [r for r in caplog.records if r.getMessage().startswith(("claimed job", "settled job"))]
    assert per_job == []
    (summary,) = [r.getMessage() for r in caplog.records if "runner summary" in r.getMessage()]
    assert summary.startswith("runner summary: 4 job(s) ended in the last ")
    assert "(3 completed, 1 failed)" in summary and "0 ready in q" in summary


def test_a_summary_every_few_seconds_and_none_while_idle(
    sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    add(sqlite_engine, Job("a", "q"))
    runner = Runner(
        sqlite_engine,
        {"q": lambda job: None},
        summary_every=timedelta(milliseconds=300),
        poll_interval=timedelta(milliseconds=50),
    )
    with caplog.at_level(logging.INFO, logger="sqlalchemy_watchdog"), runner.running():
        wait_until(lambda: [r for r in caplog.records if "runner summary" in r.getMessage()], what="the summary")
        time.sleep(1.0)  # idle now: no further summary
    summaries = [r.getMessage() for r in caplog.records if "runner summary" in r.getMessage()]
    assert len(summaries) == 1 and "1 job(s) ended" in summaries[0] and "(1 completed)" in summaries[0]


def test_summary_every_is_checked(sqlite_engine: Engine) -> None:
    for bad in (0, -1, True, 1.5, "60"):
        with pytest.raises(InvalidJob, match="^summary_every: "):
            Runner(sqlite_engine, {"q": lambda job: None}, summary_every=bad)  # type: ignore[arg-type]


# -- pool sizing -------------------------------------------------------------------------------


def test_a_pool_smaller_than_the_runner_and_its_handlers_is_warned_about(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    small = create_engine(url, pool_size=4, max_overflow=2)
    default = create_engine(url)
    metadata.create_all(default)
    try:
        with caplog.at_level(logging.WARNING, logger="sqlalchemy_watchdog"):
            with Runner(default, {"q": lambda job: None}).running():
                pass
            assert not [r for r in caplog.records if "pool" in r.getMessage()]  # 5 + 10 serves 3 + 10
            with Runner(small, {"q": lambda job: None}, concurrency=8).running():
                pass
        (warning,) = [r for r in caplog.records if "pool" in r.getMessage()]
        assert warning.levelno == logging.WARNING
        assert "at most 6 connections" in warning.getMessage() and "pool_size=11" in warning.getMessage()
    finally:
        small.dispose()
        default.dispose()
