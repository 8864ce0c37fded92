"""The settler's gather: a runner that claims ahead of its child processes
waits a moment for its other children's answers, so that they share one
settle statement; every other runner settles at once.

The settlers are driven with a stand-in runner that records each batch it
is asked to settle (the batches' statements are the store's, tested with
real databases elsewhere); the gather's window is widened for the test so
that no timing of a loaded machine decides the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest

from sqlalchemy_watchdog import Decision, store
from sqlalchemy_watchdog.core import settings as settings_module
from sqlalchemy_watchdog.core.settings import SETTLE_GATHER_S, RunnerSettings
from sqlalchemy_watchdog.core.state import RunnerCore
from sqlalchemy_watchdog.drivers.asyncio import _AsyncSettler
from sqlalchemy_watchdog.drivers.sync import _Settler
from sqlalchemy_watchdog.store import SettleRequest

from .scripted import FakeTime, settings

#: The gather window while these tests run: long, so that "settled before
#: the window ended" cannot be a matter of luck.
WIDE_S = 30.0


def claiming_ahead(children: int = 2) -> RunnerSettings:
    """The settings of a runner with ``children`` processes and one job claimed ahead of each."""
    return dataclasses.replace(settings(), concurrency=children, claim_ahead=children)


def execution(name: str) -> Any:
    """What the settler hands back to the runner's ``_finish`` (opaque to it)."""
    return f"execution-{name}"


def request(job_id: str) -> SettleRequest:
    return SettleRequest(job_id, f"token-{job_id}", Decision.completed(), 0)


class Recorder:
    """What a settler needs of its runner: the batches it settles are recorded."""

    def __init__(self, runner_settings: RunnerSettings) -> None:
        self.settings = runner_settings
        self.core = RunnerCore(runner_settings, FakeTime().clock, store)
        self.batches: list[list[str]] = []
        self.finished: list[object] = []
        self.settled = threading.Event()

    @contextlib.contextmanager
    def _holding_connection(self) -> Iterator[None]:
        yield

    @contextlib.asynccontextmanager
    async def _holding_connection_async(self) -> AsyncIterator[None]:
        yield

    def _settle(self, requests: list[SettleRequest], perform: object = None) -> list[None]:
        self.batches.append([r.job_id for r in requests])
        self.settled.set()
        return [None] * len(requests)

    async def _settle_async(self, requests: list[SettleRequest]) -> list[None]:
        return self._settle(requests)

    def _finish(self, execution: object, settlement: object) -> None:
        self.finished.append(execution)


@pytest.fixture
def wide_gather(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_module, "SETTLE_GATHER_S", WIDE_S)


def test_a_runner_claiming_ahead_gathers_one_answer_per_child_for_ten_milliseconds() -> None:
    assert claiming_ahead(3).settle_gather == (3, SETTLE_GATHER_S)
    assert SETTLE_GATHER_S == 0.010


def test_a_runner_without_jobs_claimed_ahead_settles_at_once() -> None:
    assert settings().settle_gather == (1, 0.0)
    assert dataclasses.replace(settings(), concurrency=4, claim_ahead=0).settle_gather == (1, 0.0)


def test_a_runner_whose_claims_limits_hold_back_settles_at_once() -> None:
    """Under a binding limit a job keeps its room until its settle commits:
    a gathered settle would hold the next claim back too."""
    core = RunnerCore(claiming_ahead(2), FakeTime().clock, store)
    assert core.settle_gather() == (2, SETTLE_GATHER_S)
    core.held_back = True
    assert core.settle_gather() == (1, 0.0)
    core.held_back = False
    assert core.settle_gather() == (2, SETTLE_GATHER_S)


@pytest.mark.usefixtures("wide_gather")
def test_two_childrens_answers_share_one_settle() -> None:
    runner = Recorder(claiming_ahead(2))
    settler = _Settler(cast(Any, runner))
    try:
        assert settler.submit(request("a"), execution("a"))
        time.sleep(0.2)
        assert runner.batches == [], "the first answer waits for the second child's"
        started = time.monotonic()
        assert settler.submit(request("b"), execution("b"))
        assert runner.settled.wait(5)
        assert time.monotonic() - started < WIDE_S / 2, "the batch is sent once it is full, not at the window's end"
    finally:
        settler.stop()
    assert runner.batches == [["a", "b"]]
    assert runner.finished == ["execution-a", "execution-b"]


def test_a_lone_answer_is_settled_when_the_window_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_module, "SETTLE_GATHER_S", 0.3)
    runner = Recorder(claiming_ahead(2))
    settler = _Settler(cast(Any, runner))
    try:
        started = time.monotonic()
        settler.submit(request("a"), execution("a"))
        assert runner.settled.wait(5)
        assert time.monotonic() - started >= 0.3
    finally:
        settler.stop()
    assert runner.batches == [["a"]]


@pytest.mark.usefixtures("wide_gather")
@pytest.mark.parametrize("runner_kind", ["threads", "process children under binding limits"])
def test_a_settler_that_may_not_gather_settles_without_waiting_for_others(runner_kind: str) -> None:
    if runner_kind == "threads":
        runner = Recorder(dataclasses.replace(settings(), concurrency=4))
    else:
        runner = Recorder(claiming_ahead(2))
        runner.core.held_back = True
    settler = _Settler(cast(Any, runner))
    try:
        settler.submit(request("a"), execution("a"))
        assert runner.settled.wait(5), "settled alone, long before the (widened) window"
    finally:
        settler.stop()
    assert runner.batches == [["a"]]


@pytest.mark.usefixtures("wide_gather")
def test_stopping_the_settler_sends_what_it_gathered_at_once() -> None:
    runner = Recorder(claiming_ahead(4))
    settler = _Settler(cast(Any, runner))
    settler.submit(request("a"), execution("a"))
    time.sleep(0.1)
    started = time.monotonic()
    settler.stop()
    assert time.monotonic() - started < WIDE_S / 2
    assert runner.batches == [["a"]] and runner.finished == ["execution-a"]


def async_settler(runner: Recorder) -> _AsyncSettler:
    shim = type(
        "Shim",
        (),
        {
            "settings": runner.settings,
            "core": runner.core,
            "_holding_connection": staticmethod(runner._holding_connection_async),
            "_settle": staticmethod(runner._settle_async),
        },
    )()
    return _AsyncSettler(cast(Any, shim))


@pytest.mark.usefixtures("wide_gather")
def test_two_childrens_answers_share_one_settle_in_the_async_runner() -> None:
    runner = Recorder(claiming_ahead(2))

    async def scenario() -> list[Any]:
        settler = async_settler(runner)
        task = asyncio.create_task(settler.run())
        first = asyncio.create_task(settler.settle(request("a")))
        await asyncio.sleep(0.2)
        assert runner.batches == [], "the first answer waits for the second child's"
        second = asyncio.create_task(settler.settle(request("b")))
        done = await asyncio.wait_for(asyncio.gather(first, second), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return list(done)

    assert asyncio.run(scenario()) == [None, None]
    assert runner.batches == [["a", "b"]]


@pytest.mark.usefixtures("wide_gather")
def test_an_async_thread_runner_settles_without_waiting_for_others() -> None:
    runner = Recorder(dataclasses.replace(settings(), concurrency=4))

    async def scenario() -> None:
        settler = async_settler(runner)
        task = asyncio.create_task(settler.run())
        await asyncio.wait_for(settler.settle(request("a")), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert runner.batches == [["a"]]
