"""Steps: the typed I/O requests the rules yield and the drivers perform."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, cast

from ..errors import WatchdogError
from ..jobs import (
    Decision,
    JobView,
)
from .ports import Connection

if TYPE_CHECKING:
    from .execution import Execution
    from .handlers import StopReason


T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class StoreCall(Generic[T]):
    """Run ``fn(conn, *args, **kwargs)`` -- an operation of the core's
    :class:`~.ports.Store` -- in a transaction of its own; the answer is
    its result (a failure comes back as a WatchdogError)."""

    fn: Callable[..., T]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunHandler:
    """Run the execution's handler; the answer is its :class:`Decision`, or
    None when shutdown stopped it before it decided."""

    execution: Execution


@dataclass(frozen=True, slots=True)
class RecordStart:
    """Record that the handler of an execution claimed ahead is about to
    start (``store.start``: its ``unstarted`` mark cleared, its lease
    renewed); the answer is the set of job_ids whose claim held. Drivers
    send the starts asked for at one moment in one statement, beside their
    settler's batch, by driving :func:`~.loop.record_starts` (the call and
    its round trip, written once); a failure comes back as a WatchdogError."""

    execution: Execution


@dataclass(frozen=True, slots=True)
class Stop:
    """Tell an execution's handler to stop (an async handler's task is cancelled)."""

    execution: Execution
    reason: StopReason


@dataclass(frozen=True, slots=True)
class Probe:
    """Ask ``is_alive(job)``; the answer is True, False, or :data:`UNKNOWN`."""

    job: JobView


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start running these claimed executions in the background."""

    executions: tuple[Execution, ...]


@dataclass(frozen=True, slots=True)
class WaitDone:
    """Wait until every execution is done, or ``timeout`` seconds."""

    executions: tuple[Execution, ...]
    timeout: float


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds`` before trying again (a retry's back-off); the answer
    is True, or False when the driver is stopping the work that paused and
    the rule should give up now (the sync settler when it is stopped; the
    async driver cancels its task instead)."""

    seconds: float


UNKNOWN: Any = object()


Step = StoreCall[Any] | RunHandler | RecordStart | Stop | Probe | Spawn | WaitDone | Pause


Steps = Generator[Step, Any, T]


def call(fn: Callable[Concatenate[Connection, P], R], /, *args: P.args, **kwargs: P.kwargs) -> Generator[Step, Any, R]:
    """The step that runs the store function ``fn(conn, *args, **kwargs)``,
    typed: ``batch = yield from call(core.store.claim, queues=..., limit=...,
    lease_ms=...)`` is a ``ClaimBatch``, and an argument ``fn`` does not take
    fails the type check. A failure of the call is raised here (the driver
    throws it in at the :class:`StoreCall` this yields)."""
    answer = yield StoreCall(fn, args, kwargs)
    return cast(R, answer)


def drive(steps: Steps[T], perform: Callable[[Step], Any]) -> T:
    """Run ``steps`` to the end with a sync ``perform``; a WatchdogError it
    raises goes back into ``steps`` at the step that caused it."""
    try:
        step = next(steps)
        while True:
            try:
                answer = perform(step)
            except WatchdogError as error:
                step = steps.throw(error)
                continue
            step = steps.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def drive_async(steps: Steps[T], perform: Callable[[Step], Awaitable[Any]]) -> T:
    """:func:`drive` with an async ``perform``."""
    try:
        step = next(steps)
        while True:
            try:
                answer = await perform(step)
            except WatchdogError as error:
                step = steps.throw(error)
                continue
            step = steps.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


#: What a driver answers :class:`RunHandler` with when it did not call the
#: handler because the claim's last check was over a heartbeat old by then
#: (:meth:`Execution.started_late`): :func:`execute` renews and asks again.
STARTED_LATE: Decision = Decision.failed("the handler was about to start late; not run")
#: What a driver returns for a job it claimed ahead and never started (the
#: runner shuts down while it waits for a child): :func:`execute` gives the
#: claim back -- the job is queued again as it was, no count moved.
NEVER_STARTED: Decision = Decision.failed("claimed ahead and never started; given back")
