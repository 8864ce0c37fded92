"""A scripted performer: drive the core's generators with no database.

A script is the list of steps a rule must ask for, in order, each with the
answer the test gives it (a value, a function of the step, or a
``WatchdogError`` thrown back at the step as a driver does); a ``Stop`` sets
the execution's stop signal, as both drivers do. The rule runs
through the real :func:`~sqlalchemy_watchdog.core.steps.drive`; a step the
script does not expect, or an expected step never asked for, fails the test.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy_watchdog import store
from sqlalchemy_watchdog.core.clock import Clock
from sqlalchemy_watchdog.core.settings import RunnerOptions, RunnerSettings
from sqlalchemy_watchdog.core.state import Execution, RunnerCore
from sqlalchemy_watchdog.core.steps import Step, Steps, Stop, StoreCall, drive
from sqlalchemy_watchdog.errors import WatchdogError
from sqlalchemy_watchdog.jobs import JobState, JobView
from sqlalchemy_watchdog.store import Claim

T = TypeVar("T")

#: Where the fake clocks start: 2026-03-01 10:30 UTC, monotonic 1000 s.
START = datetime(2026, 3, 1, 10, 30, tzinfo=UTC)


class FakeTime:
    """The two clocks of a :class:`Clock`, moved by the test."""

    def __init__(self) -> None:
        self.wall = START
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds

    def now_ms(self) -> int:
        return int(self.wall.timestamp() * 1000)

    @property
    def clock(self) -> Clock:
        return Clock(self.now_ms, lambda: self.mono)


@dataclass
class Expect:
    """One step the rule must ask for: a store function (a :class:`StoreCall`
    of it) or a step type, and its answer."""

    what: Any
    answer: Any = None
    #: Checks the step (asserts what it carries).
    check: Callable[[Any], None] | None = None
    #: The answer is ``answer(step)``.
    computed: bool = False


@dataclass
class Script:
    expected: list[Expect]
    performed: list[Step] = field(default_factory=list)

    def perform(self, step: Step) -> Any:
        assert self.expected, f"the rule asked for a step the script does not expect: {step}"
        expect = self.expected.pop(0)
        if isinstance(step, StoreCall):
            assert step.fn is expect.what, f"expected {expect.what}, the rule asked for {step}"
        else:
            assert isinstance(step, expect.what), f"expected a {expect.what.__name__}, the rule asked for {step}"
        self.performed.append(step)
        if isinstance(step, Stop):  # what both drivers do with a Stop (the async one also cancels a task)
            step.execution.signal.request(step.reason)
        if expect.check is not None:
            expect.check(step)
        answer = expect.answer(step) if expect.computed else expect.answer
        if isinstance(answer, WatchdogError):
            raise answer
        return answer


def run(steps: Steps[T], *expected: Expect) -> T:
    """Drive ``steps`` through the script ``expected``; every expected step
    must have been asked for."""
    script = Script(list(expected))
    result = drive(steps, script.perform)
    assert not script.expected, f"the rule ended without asking for {script.expected}"
    return result


def settings(handlers: Mapping[str, Callable[..., Any]] | None = None, **options: Any) -> RunnerSettings:
    typed: RunnerOptions = {"summary_every": None, **options}  # type: ignore[typeddict-item]
    return RunnerSettings.build(
        handlers if handlers is not None else {"q": lambda job: None},
        typed,
        default_poll_interval=timedelta(seconds=2),
    )


def core(time: FakeTime, handlers: Mapping[str, Callable[..., Any]] | None = None, **options: Any) -> RunnerCore:
    return RunnerCore(settings(handlers, **options), time.clock, store)


_ids = itertools.count(1)


def job(queue: str = "q", **fields: Any) -> JobView:
    n = next(_ids)
    base: dict[str, Any] = dict(
        sequence=n,
        job_id=f"job-{n}",
        queue=queue,
        lane=queue,
        priority=0,
        payload={"n": n},
        max_recoveries=None,
        state=JobState.RUNNING,
        outcome=None,
        failure_reason=None,
        recovery_count=0,
        cancellation_id=None,
    )
    base.update(fields)
    return JobView(**base)


def claim(queue: str = "q", **fields: Any) -> Claim:
    view = job(queue, **fields)
    return Claim(view, f"token-of-{view.job_id}")


def admitted(runner_core: RunnerCore, queue: str = "q", **fields: Any) -> Execution:
    """An execution the core admitted now, as a claim would."""
    return runner_core.admit(claim(queue, **fields), runner_core.clock.monotonic())
