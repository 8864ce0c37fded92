"""Durable steps and sleeps inside one job (revision w0021): the handler side.

A handler calls ``job.step(name, fn, *args, **kwargs)``: the first time,
``fn`` runs and its result (encoded by the runner's codec, checked like a
job's result) is recorded under the job's exact claim; any later attempt of
the same job -- a retry, a recovery after its runner died, a resumed
sleep -- returns the recorded result instead of running ``fn`` again.
``job.transaction_step(session, name, fn)`` records the step in the
handler's own transaction, so the step's database writes and its record
commit together. ``job.sleep(delay)`` records when the sleep ends and ends
the attempt (the job is snoozed, its slot freed); the next attempt passes
the recorded sleep once its time has come and goes on with the next step.

This module holds the rules, and no database: the driver gives a
:class:`StepPort` (the store's reads and writes, run its own way), and the
runner's core hands each execution a :class:`DurableSteps`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import InvalidJob
from ..jobs import JobStep, StepKind, check_aware, check_duration, check_step_name, encode_result, epoch_ms

if TYPE_CHECKING:
    from ..codecs import PayloadCodec

__all__ = ["DurableSteps", "SleepRequested", "StepNotRecorded", "StepPort", "run_without_runner"]

#: ``write(job_id, claim_token, name, kind, result_json, delay_ms, attempt) -> the recorded step or None``.
StepWrite = Callable[[str, str, str, StepKind, "str | None", "int | None", int], "JobStep | None"]
AsyncStepWrite = Callable[
    [str, str, str, StepKind, "str | None", "int | None", int], Coroutine[Any, Any, "JobStep | None"]
]
#: ``write_in(session, ...)``: as :data:`StepWrite`, on the handler's own session or connection.
StepWriteIn = Callable[..., "JobStep | None"]


class SleepRequested(Exception):
    """Raised by ``job.sleep(...)`` to end the attempt until the sleep's end:
    the runner snoozes the job (no attempt counted) and frees its slot. Let
    it propagate: a handler that catches it keeps running instead of
    sleeping."""

    def __init__(self, name: str, wake_at_ms: int) -> None:
        super().__init__(f"sleeping ({name}) until {datetime.fromtimestamp(wake_at_ms / 1000):%Y-%m-%d %H:%M:%S}")
        self.name = name
        self.wake_at_ms = wake_at_ms

    def __reduce__(self) -> tuple[Any, ...]:  # crosses from a process child to the runner
        return (SleepRequested, (self.name, self.wake_at_ms))


class StepNotRecorded(RuntimeError):
    """A step ran but could not be recorded: the job no longer holds its
    claim (its lease ended, it was cancelled or settled elsewhere). Another
    attempt may run the step again; the handler should stop."""

    def __init__(self, name: str) -> None:
        super().__init__(f"step {name!r} ran but was not recorded: the job no longer holds its claim")
        self.name = name


@dataclass(frozen=True, slots=True)
class StepPort:
    """How the steps of a runner's executions reach the database (the driver fills it)."""

    read: Callable[[str], list[JobStep]] | None = None
    write: StepWrite | None = None
    read_async: Callable[[str], Coroutine[Any, Any, list[JobStep]]] | None = None
    write_async: AsyncStepWrite | None = None
    #: On the handler's own session (sync), for ``transaction_step``.
    write_in: StepWriteIn | None = None
    #: ``await write_in_async(async_session, ...)``, for ``transaction_step_async``.
    write_in_async: Callable[..., Coroutine[Any, Any, JobStep | None]] | None = None
    #: The runner's codec: what a step's result is encoded and decoded with.
    codec: PayloadCodec | None = None


class DurableSteps:
    """The steps of one execution: what earlier attempts recorded (read once,
    on the first step), the names this attempt used, and how it records."""

    __slots__ = ("_done", "_loop", "_sleeps", "_used", "attempt", "claim_token", "job_id", "port")

    def __init__(self, job_id: str, claim_token: str, attempt: int, port: StepPort) -> None:
        self.job_id = job_id
        self.claim_token = claim_token
        self.attempt = attempt
        self.port = port
        self._done: dict[str, JobStep] | None = None
        self._used: set[str] = set()
        self._sleeps = 0
        # An AsyncRunner admits its jobs on its loop: a thread handler's steps
        # run its coroutines there (the no-raise lookup, as ProgressReporter).
        self._loop: asyncio.AbstractEventLoop | None = asyncio._get_running_loop()

    # -- the rules --------------------------------------------------------------

    def _name(self, name: object) -> str:
        """A new name of this attempt, checked: names are unique per job."""
        checked = check_step_name(name)
        if checked in self._used:
            raise InvalidJob("name", f"step {checked!r} ran already in this attempt: step names are unique per job")
        self._used.add(checked)
        return checked

    def _recorded(self, name: str, kind: StepKind) -> JobStep | None:
        assert self._done is not None
        found = self._done.get(name)
        if found is not None and found.kind is not kind:
            raise InvalidJob("name", f"{name!r} was recorded as a {found.kind.value}, not a {kind.value}")
        return found

    def _decoded(self, found: JobStep) -> Any:
        value = found.result
        codec = self.port.codec
        return value if codec is None or value is None else codec.decode(value)

    def _encoded(self, value: Any) -> str | None:
        return encode_result(value, self.port.codec)  # InvalidJob("result") before anything is recorded

    def _kept(self, name: str, recorded: JobStep | None) -> JobStep:
        if recorded is None:
            raise StepNotRecorded(name)
        assert self._done is not None
        self._done[name] = recorded
        return recorded

    def _sleep_name(self, name: object) -> str:
        if name is None:
            name = f"sleep#{self._sleeps}"
        self._sleeps += 1
        return self._name(name)

    @staticmethod
    def _delay_ms(delay: object = None, until: object = None) -> int:
        if until is not None:
            wake = check_aware("until", until)
            return max(0, epoch_ms(wake) - time.time_ns() // 1_000_000)
        return check_duration("delay", delay, low=timedelta(0)) // timedelta(milliseconds=1)

    @staticmethod
    def _wake(name: str, found: JobStep) -> None:
        """Pass a recorded sleep whose time has come; else sleep on."""
        assert found.wake_at is not None
        wake_at_ms = epoch_ms(found.wake_at)
        if wake_at_ms > time.time_ns() // 1_000_000:
            raise SleepRequested(name, wake_at_ms)

    # -- from a thread -----------------------------------------------------------

    def _read(self) -> list[JobStep]:
        if self.port.read is not None:
            return self.port.read(self.job_id)
        assert self.port.read_async is not None and self._loop is not None
        return asyncio.run_coroutine_threadsafe(self.port.read_async(self.job_id), self._loop).result()

    def _write(self, name: str, kind: StepKind, result_json: str | None, delay_ms: int | None) -> JobStep | None:
        args = (self.job_id, self.claim_token, name, kind, result_json, delay_ms, self.attempt)
        if self.port.write is not None:
            return self.port.write(*args)
        assert self.port.write_async is not None and self._loop is not None
        return asyncio.run_coroutine_threadsafe(self.port.write_async(*args), self._loop).result()

    def _load(self) -> dict[str, JobStep]:
        if self._done is None:
            self._done = {step.name: step for step in self._read()}
        return self._done

    def step(self, name: object, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        checked = self._name(name)
        self._load()
        found = self._recorded(checked, StepKind.STEP)
        if found is not None:
            return self._decoded(found)
        value = fn(*args, **kwargs)
        self._kept(checked, self._write(checked, StepKind.STEP, self._encoded(value), None))
        return value

    def transaction_step(
        self, session: Any, name: object, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        checked = self._name(name)
        self._load()
        found = self._recorded(checked, StepKind.STEP)
        if found is not None:
            return self._decoded(found)
        if self.port.write_in is None:
            raise RuntimeError("transaction_step runs in the runner's process (a thread handler)")
        try:
            value = fn(*args, **kwargs)
            encoded = self._encoded(value)
            recorded = self.port.write_in(
                session, self.job_id, self.claim_token, checked, StepKind.STEP, encoded, None, self.attempt
            )
            if recorded is None:
                raise StepNotRecorded(checked)
        except BaseException:
            session.rollback()
            raise
        session.commit()
        self._kept(checked, recorded)
        return value

    def sleep(self, name: object, delay: object = None, until: object = None) -> None:
        checked = self._sleep_name(name)
        delay_ms = self._delay_ms(delay, until)
        self._load()
        found = self._recorded(checked, StepKind.SLEEP)
        if found is None:
            found = self._kept(checked, self._write(checked, StepKind.SLEEP, None, delay_ms))
        self._wake(checked, found)

    # -- for a handler in a process child (it asks; the runner records) ------------

    def remote_begin(self, name: object) -> tuple[bool, Any]:
        """A child's step ``name`` begins: ``(True, result)`` if recorded
        (the child returns it), else ``(False, None)`` (the child runs it)."""
        checked = self._name(name)
        self._load()
        found = self._recorded(checked, StepKind.STEP)
        return (False, None) if found is None else (True, self._decoded(found))

    def remote_record(self, name: str, value: Any) -> None:
        """A child's step ``name`` returned ``value``: record it."""
        checked = check_step_name(name)
        self._kept(checked, self._write(checked, StepKind.STEP, self._encoded(value), None))

    def remote_sleep(self, name: object, delay_ms: int) -> int | None:
        """A child's sleep: when it ends (epoch ms) if the attempt must end, else None."""
        checked = self._sleep_name(name)
        self._load()
        found = self._recorded(checked, StepKind.SLEEP)
        if found is None:
            found = self._kept(checked, self._write(checked, StepKind.SLEEP, None, delay_ms))
        try:
            self._wake(checked, found)
        except SleepRequested as sleeping:
            return sleeping.wake_at_ms
        return None

    # -- on the runner's event loop ----------------------------------------------

    async def _load_async(self) -> dict[str, JobStep]:
        if self._done is None:
            assert self.port.read_async is not None
            self._done = {step.name: step for step in await self.port.read_async(self.job_id)}
        return self._done

    async def step_async(
        self, name: object, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        checked = self._name(name)
        await self._load_async()
        found = self._recorded(checked, StepKind.STEP)
        if found is not None:
            return self._decoded(found)
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        encoded = self._encoded(value)
        assert self.port.write_async is not None
        self._kept(
            checked,
            await self.port.write_async(
                self.job_id, self.claim_token, checked, StepKind.STEP, encoded, None, self.attempt
            ),
        )
        return value

    async def transaction_step_async(
        self, session: Any, name: object, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        checked = self._name(name)
        await self._load_async()
        found = self._recorded(checked, StepKind.STEP)
        if found is not None:
            return self._decoded(found)
        if self.port.write_in_async is None:
            raise RuntimeError("transaction_step_async runs on an AsyncRunner (a coroutine handler)")
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            encoded = self._encoded(value)
            recorded = await self.port.write_in_async(
                session, self.job_id, self.claim_token, checked, StepKind.STEP, encoded, None, self.attempt
            )
            if recorded is None:
                raise StepNotRecorded(checked)
        except BaseException:
            await session.rollback()
            raise
        await session.commit()
        self._kept(checked, recorded)
        return value

    async def sleep_async(self, name: object, delay: object = None, until: object = None) -> None:
        checked = self._sleep_name(name)
        delay_ms = self._delay_ms(delay, until)
        await self._load_async()
        found = self._recorded(checked, StepKind.SLEEP)
        if found is None:
            assert self.port.write_async is not None
            found = self._kept(
                checked,
                await self.port.write_async(
                    self.job_id, self.claim_token, checked, StepKind.SLEEP, None, delay_ms, self.attempt
                ),
            )
        self._wake(checked, found)


def run_without_runner(name: object, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A step of a job made outside a runner (a handler's own unit test): its
    name checked, ``fn`` run, nothing recorded."""
    check_step_name(name)
    return fn(*args, **kwargs)
