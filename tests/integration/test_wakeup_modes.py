"""Wake-up modes: what a runner proves before it LISTENs, and what it says.

The pooler side (a session that fails the proof) is in tests/integration/test_poolers.py;
here: a direct session passes the proof with every listening driver, SQLite
polls without a warning, ``"listen"`` refuses where it cannot listen, and
the CLI's options are checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine

from sqlalchemy_watchdog import Runner, WakeupMode, WakeupsUnavailable, metadata
from sqlalchemy_watchdog.asyncio import AsyncRunner
from sqlalchemy_watchdog.cli import main
from sqlalchemy_watchdog.wakeups import Listener, connect_and_prove, connect_and_prove_async, listen_async


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = create_engine(f"sqlite:///{tmp_path / 'watchdog.db'}")
    metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_direct_session_passes_the_proof(postgres_url: URL, driver: str) -> None:
    engine = create_engine(postgres_url.set(drivername=f"postgresql+{driver}"))
    try:
        connection, proof = connect_and_prove(engine)
        assert proof is not None and proof.proven, proof
        connection.close()
    finally:
        engine.dispose()


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_a_direct_async_session_passes_the_proof(postgres_url: URL, driver: str) -> None:
    async def prove() -> None:
        engine = create_async_engine(postgres_url.set(drivername=f"postgresql+{driver}"))
        try:
            connection, proof = await connect_and_prove_async(engine)
            assert proof is not None and proof.proven, proof
            if driver == "asyncpg":
                await connection.close()
            else:
                await connection.close()
        finally:
            await engine.dispose()

    asyncio.run(prove())


def test_an_unreachable_database_leaves_the_proof_to_the_listener(caplog: pytest.LogCaptureFixture) -> None:
    engine = create_engine("postgresql+psycopg://postgres@127.0.0.1:9/nowhere", connect_args={"connect_timeout": 2})
    connection, proof = connect_and_prove(engine)
    assert connection is None and proof is None  # not a failed proof: the listener connects later
    assert any("cannot connect" in r.getMessage() for r in caplog.records)


UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:9/nowhere"


def _cannot_connect_lines(caplog: pytest.LogCaptureFixture) -> dict[int, int]:
    """How many "cannot connect" records the listener logged, by level."""
    counts: dict[int, int] = {}
    for record in caplog.records:
        if record.getMessage().startswith("listener: cannot connect"):
            counts[record.levelno] = counts.get(record.levelno, 0) + 1
    return counts


def test_a_listener_that_cannot_connect_warns_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sqlalchemy_watchdog")
    engine = create_engine(UNREACHABLE, connect_args={"connect_timeout": 2})
    listener = Listener.start_for(engine, lambda: None, lambda: None)
    assert listener is not None
    try:
        # Backoff 0.5 s, 1 s, ...: three attempts or more within 2 s.
        threading.Event().wait(2.0)
    finally:
        listener.stop()
        engine.dispose()
    counts = _cannot_connect_lines(caplog)
    assert counts.get(logging.WARNING) == 1, counts  # the episode's first failure pages
    assert counts.get(logging.DEBUG, 0) >= 2, counts  # its retries are there for whoever looks


def test_an_async_listener_that_cannot_connect_warns_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sqlalchemy_watchdog")

    async def listen_for_a_while() -> None:
        engine = create_async_engine(UNREACHABLE, connect_args={"connect_timeout": 2})
        task = asyncio.create_task(listen_async(engine, lambda: None, lambda: None))
        try:
            await asyncio.sleep(2.0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await engine.dispose()

    asyncio.run(listen_for_a_while())
    counts = _cannot_connect_lines(caplog)
    assert counts.get(logging.WARNING) == 1, counts
    assert counts.get(logging.DEBUG, 0) >= 2, counts


def _serve_briefly(runner: Runner) -> None:
    thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        threading.Event().wait(0.3)
    finally:
        runner.stop()
        thread.join(30)


def test_sqlite_polls_at_the_fast_interval_without_a_warning(
    sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sqlalchemy_watchdog")
    runner = Runner(sqlite_engine, {"q": lambda job: None})
    _serve_briefly(runner)
    status = runner.wakeup_status
    assert not status.listening and status.reason == "sqlite has no LISTEN/NOTIFY" and status.poll_interval_s == 0.25
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("wakeups=poll every 0.25s (sqlite has no LISTEN/NOTIFY)" in r.getMessage() for r in caplog.records)


def test_listen_mode_refuses_to_start_where_nothing_can_listen(sqlite_engine: Engine) -> None:
    runner = Runner(sqlite_engine, {"q": lambda job: None}, wakeups="listen")
    with pytest.raises(WakeupsUnavailable, match="sqlite has no LISTEN/NOTIFY"):
        runner.run_forever(install_signal_handlers=False)
    # It left nothing behind: the same runner can be told to poll and serve.
    assert runner.wakeups is WakeupMode.LISTEN


def test_a_direct_postgresql_runner_listens_and_keeps_its_backstop_poll(postgres_url: URL) -> None:
    engine = create_engine(postgres_url)
    try:
        metadata.create_all(engine)
        runner = Runner(engine, {"q": lambda job: None})
        _serve_briefly(runner)
        assert runner.wakeup_status.listening and runner.wakeup_status.poll_interval_s == 2.0
        explicit = Runner(engine, {"q": lambda job: None}, wakeups="poll", poll_interval=timedelta(seconds=1))
        _serve_briefly(explicit)
        assert not explicit.wakeup_status.listening and explicit.wakeup_status.poll_interval_s == 1.0
        metadata.drop_all(engine)
    finally:
        engine.dispose()


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_listen_engine_on_another_database_is_refused_in_listen_mode_and_polled_past_in_auto(
    postgres_url: URL, driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A listen_engine whose URL names another database (a typo) proves its
    own session, but never hears the runner's engine: the proof's NOTIFY
    goes through the runner's engine, so "listen" refuses to start naming
    listen_engine and "auto" polls with a WARNING saying why."""
    engine = create_engine(postgres_url.set(drivername=f"postgresql+{driver}"))
    elsewhere = create_engine(postgres_url.set(drivername=f"postgresql+{driver}", database="postgres"))
    try:
        metadata.create_all(engine)
        strict = Runner(engine, {"q": lambda job: None}, listen_engine=elsewhere, wakeups="listen")
        refused: list[BaseException] = []

        def serve_strictly() -> None:
            try:
                strict.run_forever(install_signal_handlers=False)
            except BaseException as error:
                refused.append(error)

        thread = threading.Thread(target=serve_strictly)
        thread.start()
        thread.join(30)
        if thread.is_alive():  # it started listening where nothing reaches it
            strict.stop()
            thread.join(30)
            pytest.fail('wakeups="listen" started with a listen_engine on another database')
        assert len(refused) == 1 and isinstance(refused[0], WakeupsUnavailable), refused
        message = str(refused[0])
        assert "the listen_engine is not on the runner's database" in message
        assert "'postgres'" in message and repr(postgres_url.database) in message
        auto = Runner(engine, {"q": lambda job: None}, listen_engine=elsewhere)
        _serve_briefly(auto)
        assert not auto.wakeup_status.listening
        assert "listen_engine is not on the runner's database" in auto.wakeup_status.reason
        assert [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING
            and "LISTEN/NOTIFY wake-ups are off" in r.getMessage()
            and "listen_engine is not on the runner's database" in r.getMessage()
        ]
        # The same database through a second engine still listens.
        same = create_engine(postgres_url.set(drivername=f"postgresql+{driver}"))
        try:
            direct = Runner(engine, {"q": lambda job: None}, listen_engine=same, wakeups="listen")
            _serve_briefly(direct)
            assert direct.wakeup_status.listening
        finally:
            same.dispose()
    finally:
        engine.dispose()
        elsewhere.dispose()


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_an_async_listen_engine_on_another_database_is_refused_in_listen_mode_and_polled_past_in_auto(
    postgres_url: URL, driver: str
) -> None:
    sync_engine = create_engine(postgres_url)
    metadata.create_all(sync_engine)
    sync_engine.dispose()

    async def serve() -> None:
        engine = create_async_engine(postgres_url.set(drivername=f"postgresql+{driver}"))
        elsewhere = create_async_engine(postgres_url.set(drivername=f"postgresql+{driver}", database="postgres"))
        try:
            strict = AsyncRunner(engine, {"q": lambda job: None}, listen_engine=elsewhere, wakeups="listen")
            with pytest.raises(WakeupsUnavailable, match="the listen_engine is not on the runner's database"):
                await asyncio.wait_for(strict.run_forever(install_signal_handlers=False), 30)  # not serving for ever
            auto = AsyncRunner(engine, {"q": lambda job: None}, listen_engine=elsewhere)
            task = asyncio.create_task(auto.run_forever(install_signal_handlers=False))
            for _ in range(200):
                if auto.wakeup_status.reason != "not started":
                    break
                await asyncio.sleep(0.05)
            auto.stop()
            await asyncio.wait_for(task, 30)
            assert not auto.wakeup_status.listening
            assert "listen_engine is not on the runner's database" in auto.wakeup_status.reason
        finally:
            await engine.dispose()
            await elsewhere.dispose()

    asyncio.run(serve())


def test_async_runner_reports_its_mode(sqlite_engine: Engine) -> None:

    async def serve() -> Any:
        aengine = create_async_engine(sqlite_engine.url.set(drivername="sqlite+aiosqlite"))
        runner = AsyncRunner(aengine, {"q": lambda job: None}, wakeups="poll")
        task = asyncio.create_task(runner.run_forever(install_signal_handlers=False))
        await asyncio.sleep(0.3)
        runner.stop()
        await asyncio.wait_for(task, 30)
        await aengine.dispose()
        return runner

    runner = asyncio.run(serve())
    assert runner.wakeup_status.reason == 'wakeups="poll"' and "poll every 0.25s" in repr(runner)


@pytest.mark.parametrize(
    "args, says",
    [
        (["run", "tests.workers.worker", "--wakeups", "sometimes"], "invalid choice: 'sometimes'"),
        (["run", "tests.workers.worker", "--listen-url", "sqlite:///x.db"], "--listen-url must be a PostgreSQL URL"),
        (["--url", "postgresql://u@h/d?prepare_threshold=soon", "stats"], "prepare_threshold in the URL"),
    ],
)
def test_the_cli_refuses_bad_wakeup_options(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status: object = main(args)
    except SystemExit as error:  # argparse's own refusal
        status = error.code
    assert status == 2
    assert says in capsys.readouterr().err
