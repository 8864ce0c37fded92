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

``job.wait_for(name, timeout)`` (revision w0022) records a wait for signal
``name`` (its timeout on the database clock) and returns the signal's
payload when one is kept (``Watchdog.signal``) within the timeout; else it
ends the attempt like a sleep, until the timeout -- a signal that arrives
meanwhile makes the job due at once -- and raises :class:`WaitTimedOut` once
the timeout passed without one. ``job.step(name, fn, undo=...)`` names
an undo: when the job fails for good, the undos of its recorded steps run
in reverse order, each recorded once it returned (compensation).

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

from ..errors import InvalidJob, safe_text
from ..jobs import JobStep, StepKind, check_aware, check_duration, check_step_name, encode_result, epoch_ms
from ..jobs.durable import UNDO_PREFIX, JobSignal

if TYPE_CHECKING:
    from ..codecs import PayloadCodec

__all__ = [
    "CompensationFailed",
    "Compensating",
    "DurableSteps",
    "SleepRequested",
    "StepNotRecorded",
    "StepPort",
    "WaitRequested",
    "WaitTimedOut",
    "check_undo",
    "check_wait",
    "run_without_runner",
]

#: ``write(job_id, claim_token, name, kind, result_json, delay_ms, attempt) -> the recorded step or None``.
StepWrite = Callable[[str, str, str, StepKind, "str | None", "int | None", int], "JobStep | None"]
AsyncStepWrite = Callable[
    [str, str, str, StepKind, "str | None", "int | None", int], Coroutine[Any, Any, "JobStep | None"]
]
#: ``read_signal(job_id, name) -> (the kept signal or None, the database clock in epoch ms)``.
SignalRead = Callable[[str, str], "tuple[JobSignal | None, int]"]
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


class WaitRequested(SleepRequested):
    """Raised by ``job.wait_for(name, ...)`` while no signal ``name`` is kept:
    the attempt ends and the job is snoozed until the wait's timeout; the
    signal, when it comes, makes it due at once. Let it propagate."""

    def __init__(self, name: str, wake_at_ms: int) -> None:
        Exception.__init__(
            self, f"waiting for signal {name!r} until {datetime.fromtimestamp(wake_at_ms / 1000):%Y-%m-%d %H:%M:%S}"
        )
        self.name = name
        self.wake_at_ms = wake_at_ms

    def __reduce__(self) -> tuple[Any, ...]:
        return (WaitRequested, (self.name, self.wake_at_ms))


class WaitTimedOut(Exception):
    """Raised by ``job.wait_for(name, timeout)`` when the wait's timeout
    (database clock) passed with no signal ``name`` kept within it. Final:
    every later attempt of the job gets it again (a signal kept after the
    timeout does not count). Catch it to go on without the signal; if it
    propagates, the job fails without a retry."""

    def __init__(self, name: str, timeout_at: datetime) -> None:
        super().__init__(f"no signal {name!r} came before the wait's timeout ({timeout_at:%Y-%m-%d %H:%M:%S} UTC)")
        self.name = name
        self.timeout_at = timeout_at

    def __reduce__(self) -> tuple[Any, ...]:
        return (WaitTimedOut, (self.name, self.timeout_at))


class CompensationFailed(Exception):
    """An undo raised while a failed job's compensation ran: compensation
    stopped there (the undos before it are recorded, it and the ones after
    it did not finish) and the job failed with this as its reason."""

    def __init__(self, step: str, error: BaseException) -> None:
        super().__init__(f"the undo of step {step!r} raised {safe_text(error)}")
        self.step = step


class Compensating(Exception):
    """Raised by a step, a sleep or a wait not recorded yet in a run that
    must finish a compensation an earlier run began (an undo of the job is
    recorded): such a run does no new work. The handler stops there -- let
    it propagate -- and the runner runs the undos not recorded yet, then
    settles the job failed; it is never the job's failure reason."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name!r} not run: this run finishes the compensation an earlier run began")
        self.name = name


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
    #: How ``wait_for`` reads its signal (revision w0022).
    read_signal: SignalRead | None = None
    read_signal_async: Callable[[str, str], Coroutine[Any, Any, tuple[JobSignal | None, int]]] | None = None


def check_wait(timeout: object) -> int:
    """A wait's ``timeout`` in milliseconds (a positive timedelta), else :class:`InvalidJob`."""
    return check_duration("timeout", timeout) // timedelta(milliseconds=1)


def check_undo(name: str, undo: object) -> None:
    """``undo`` is a callable, and the step's name leaves room for its undo's (``undo:<name>``)."""
    if not callable(undo):
        raise InvalidJob("undo", f"must be callable (called with the step's result), not {type(undo).__name__}")
    if len(name) + len(UNDO_PREFIX) > 256:
        raise InvalidJob("name", f"a step with an undo has a name of at most {256 - len(UNDO_PREFIX)} characters")


class DurableSteps:
    """The steps of one execution: what earlier attempts recorded (read once,
    on the first step), the names this attempt used, and how it records."""

    __slots__ = ("_done", "_loop", "_sleeps", "_undos", "_used", "attempt", "claim_token", "job_id", "port")

    def __init__(self, job_id: str, claim_token: str, attempt: int, port: StepPort) -> None:
        self.job_id = job_id
        self.claim_token = claim_token
        self.attempt = attempt
        self.port = port
        self._done: dict[str, JobStep] | None = None
        self._used: set[str] = set()
        self._sleeps = 0
        #: The steps of this attempt that name an undo, in the order they came.
        self._undos: list[tuple[str, Callable[[Any], Any]]] = []
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

    def _wake(self, name: str, found: JobStep) -> None:
        """Pass a recorded sleep whose time has come; else sleep on -- but
        not in a run that finishes a compensation (it stops there)."""
        assert found.wake_at is not None
        wake_at_ms = epoch_ms(found.wake_at)
        if wake_at_ms > time.time_ns() // 1_000_000:
            self._no_new_work(name)
            raise SleepRequested(name, wake_at_ms)

    def _undo(self, name: str, undo: Callable[[Any], Any] | None) -> None:
        if undo is not None:
            check_undo(name, undo)
            self._undos.append((name, undo))

    @property
    def loaded(self) -> bool:
        """Whether the recorded steps were read (a step, sleep or wait asked)."""
        return self._done is not None

    @property
    def compensation_began(self) -> bool:
        """Whether an undo of this job is recorded (by an earlier run that
        compensated, then crashed or was interrupted): this run must end
        failed, finishing the compensation (the steps' records read already)."""
        return self._done is not None and any(step.kind is StepKind.UNDO for step in self._done.values())

    def _no_new_work(self, name: str) -> None:
        """A step, sleep or wait ``name`` not recorded yet is about to run:
        not in a run that finishes a compensation (:class:`Compensating`)."""
        if self.compensation_began:
            raise Compensating(name)

    def _waited(self, name: str, found: JobStep, signal: JobSignal | None, clock_ms: int) -> Any:
        """The wait's outcome, the same for every attempt: the payload of a
        signal kept by the timeout; else, once the timeout passed (database
        clock), :class:`WaitTimedOut`; else wait on -- but not in a run that
        finishes a compensation (it stops there)."""
        assert found.wake_at is not None
        timeout_ms = epoch_ms(found.wake_at)
        if signal is not None and epoch_ms(signal.sent_at) <= timeout_ms:
            return signal.payload
        if clock_ms > timeout_ms:
            raise WaitTimedOut(name, found.wake_at)
        self._no_new_work(name)
        raise WaitRequested(name, timeout_ms)

    @property
    def undo_count(self) -> int:
        """How many steps of this attempt name an undo."""
        return len(self._undos)

    def _undo_due(self) -> list[tuple[str, Callable[[Any], Any], Any]]:
        """The undos to run, last step first: of the recorded steps of this
        attempt's undo list whose undo is not recorded yet, with their results."""
        assert self._done is not None
        due = []
        for name, undo in reversed(self._undos):
            found = self._done.get(name)
            if found is None or found.kind is not StepKind.STEP or UNDO_PREFIX + name in self._done:
                continue
            due.append((name, undo, self._decoded(found)))
        return due

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

    def load(self) -> None:
        """Read the recorded steps now, if not read yet (from a thread)."""
        self._load()

    async def load_async(self) -> None:
        """Read the recorded steps now, if not read yet (on the runner's event loop)."""
        await self._load_async()

    def _load(self) -> dict[str, JobStep]:
        if self._done is None:
            self._done = {step.name: step for step in self._read()}
        return self._done

    def step(
        self,
        name: object,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        undo: Callable[[Any], Any] | None = None,
    ) -> Any:
        checked = self._name(name)
        self._undo(checked, undo)
        self._load()
        found = self._recorded(checked, StepKind.STEP)
        if found is not None:
            return self._decoded(found)
        self._no_new_work(checked)
        value = fn(*args, **kwargs)
        self._kept(checked, self._write(checked, StepKind.STEP, self._encoded(value), None))
        return value

    def transaction_step(
        self,
        session: Any,
        name: object,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        undo: Callable[[Any], Any] | None = None,
    ) -> Any:
        checked = self._name(name)
        self._undo(checked, undo)
        self._load()
        found = self._recorded(checked, StepKind.STEP)
        if found is not None:
            return self._decoded(found)
        self._no_new_work(checked)
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
            self._no_new_work(checked)
            found = self._kept(checked, self._write(checked, StepKind.SLEEP, None, delay_ms))
        self._wake(checked, found)

    def _read_signal(self, name: str) -> tuple[JobSignal | None, int]:
        if self.port.read_signal is not None:
            return self.port.read_signal(self.job_id, name)
        assert self.port.read_signal_async is not None and self._loop is not None
        return asyncio.run_coroutine_threadsafe(self.port.read_signal_async(self.job_id, name), self._loop).result()

    def wait_for(self, name: object, timeout: object) -> Any:
        """Signal ``name``'s payload (see the module's docstring)."""
        timeout_ms = check_wait(timeout)
        checked = self._name(name)
        self._load()
        found = self._recorded(checked, StepKind.WAIT)
        if found is None:
            self._no_new_work(checked)
            found = self._kept(checked, self._write(checked, StepKind.WAIT, None, timeout_ms))
        signal, clock_ms = self._read_signal(checked)
        return self._waited(checked, found, signal, clock_ms)

    def compensate(self, fresh: bool = False) -> list[str]:
        """Run the due undos (last step first), each recorded under the claim
        once it returned; the steps undone. An undo that raises stops it:
        :class:`CompensationFailed`. ``fresh``: read the recorded steps
        again first (a handler stopped by its timeout may have recorded a
        step it was not told of: a cancelled coroutine's commit)."""
        if fresh:
            self._done = None
        self._load()
        undone = []
        for name, undo, value in self._undo_due():
            try:
                returned = undo(value)
                if inspect.isawaitable(returned):
                    raise TypeError("a coroutine undo runs in a coroutine handler (job.step_async)")
            except Exception as error:
                raise CompensationFailed(name, error) from error
            self._kept(UNDO_PREFIX + name, self._write(UNDO_PREFIX + name, StepKind.UNDO, None, None))
            undone.append(name)
        return undone

    # -- for a handler in a process child (it asks; the runner records) ------------

    def remote_begin(self, name: object, undo: Callable[[Any], Any] | None = None) -> tuple[bool, Any]:
        """A child's step ``name`` begins: ``(True, result)`` if recorded
        (the child returns it), else ``(False, None)`` (the child runs it).
        ``undo``: the step's undo, unpickled in this process -- it runs here,
        in the runner, if the job fails for good (:meth:`compensate`)."""
        checked = self._name(name)
        self._undo(checked, undo)
        self._load()
        found = self._recorded(checked, StepKind.STEP)
        if found is None:
            self._no_new_work(checked)  # refused: the child's step raises, not run
            return (False, None)
        return (True, self._decoded(found))

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
            self._no_new_work(checked)
            found = self._kept(checked, self._write(checked, StepKind.SLEEP, None, delay_ms))
        try:
            self._wake(checked, found)
        except SleepRequested as sleeping:
            return sleeping.wake_at_ms
        return None

    def remote_wait(self, name: object, timeout_ms: int) -> tuple[str, Any]:
        """A child's wait: ``("signal", payload)``, ``("wait", timeout in
        epoch ms)`` when the attempt must end, or ``("timeout", epoch ms)``."""
        try:
            return ("signal", self.wait_for(name, timedelta(milliseconds=timeout_ms)))
        except WaitRequested as waiting:
            return ("wait", waiting.wake_at_ms)
        except WaitTimedOut as timed_out:
            return ("timeout", epoch_ms(timed_out.timeout_at))

    # -- on the runner's event loop ----------------------------------------------

    async def _load_async(self) -> dict[str, JobStep]:
        if self._done is None:
            assert self.port.read_async is not None
            self._done = {step.name: step for step in await self.port.read_async(self.job_id)}
        return self._done

    async def step_async(
        self,
        name: object,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        undo: Callable[[Any], Any] | None = None,
    ) -> Any:
        checked = self._name(name)
        self._undo(checked, undo)
        await self._load_async()
        found = self._recorded(checked, StepKind.STEP)
        if found is not None:
            return self._decoded(found)
        self._no_new_work(checked)
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
        self,
        session: Any,
        name: object,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        undo: Callable[[Any], Any] | None = None,
    ) -> Any:
        checked = self._name(name)
        self._undo(checked, undo)
        await self._load_async()
        found = self._recorded(checked, StepKind.STEP)
        if found is not None:
            return self._decoded(found)
        self._no_new_work(checked)
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
            self._no_new_work(checked)
            assert self.port.write_async is not None
            found = self._kept(
                checked,
                await self.port.write_async(
                    self.job_id, self.claim_token, checked, StepKind.SLEEP, None, delay_ms, self.attempt
                ),
            )
        self._wake(checked, found)

    async def _write_async(self, name: str, kind: StepKind, delay_ms: int | None) -> JobStep | None:
        assert self.port.write_async is not None
        return await self.port.write_async(self.job_id, self.claim_token, name, kind, None, delay_ms, self.attempt)

    async def wait_for_async(self, name: object, timeout: object) -> Any:
        """:meth:`wait_for` on the runner's event loop."""
        timeout_ms = check_wait(timeout)
        checked = self._name(name)
        await self._load_async()
        found = self._recorded(checked, StepKind.WAIT)
        if found is None:
            self._no_new_work(checked)
            found = self._kept(checked, await self._write_async(checked, StepKind.WAIT, timeout_ms))
        assert self.port.read_signal_async is not None
        signal, clock_ms = await self.port.read_signal_async(self.job_id, checked)
        return self._waited(checked, found, signal, clock_ms)

    async def compensate_async(self, fresh: bool = False) -> list[str]:
        """:meth:`compensate` on the runner's event loop: an undo may be a coroutine function."""
        if fresh:
            self._done = None
        await self._load_async()
        undone = []
        for name, undo, value in self._undo_due():
            try:
                returned = undo(value)
                if inspect.isawaitable(returned):
                    await returned
            except Exception as error:
                raise CompensationFailed(name, error) from error
            self._kept(UNDO_PREFIX + name, await self._write_async(UNDO_PREFIX + name, StepKind.UNDO, None))
            undone.append(name)
        return undone


def run_without_runner(name: object, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A step of a job made outside a runner (a handler's own unit test): its
    name checked, ``fn`` run, nothing recorded."""
    check_step_name(name)
    return fn(*args, **kwargs)
