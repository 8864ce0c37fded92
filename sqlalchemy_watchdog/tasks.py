"""Tasks: a typed function as a handler and an enqueuer.

::

    @task("emails", retry=RetryPolicy(max_attempts=5), timeout=timedelta(seconds=30))
    def send_confirmation(order_id: int, urgent: bool = False) -> dict[str, bool]:
        ...

    send_confirmation.enqueue(session, order_id=42, job_id="confirm-42")

``@task`` registers a handler for the queue (as :func:`~sqlalchemy_watchdog.handler`
does, with the same policy arguments) that calls the function with the job's
payload as keyword arguments and returns what it returns (the job's result).
``.enqueue`` checks the arguments against the function's signature -- a
missing or an unknown one, or one whose annotation is a plain payload type
(``int``, ``float``, ``bool``, ``str``, ``None``, ``list``, ``dict``, or an
``Optional``/union of those) that its value is not, is an
:class:`~sqlalchemy_watchdog.InvalidJob` naming it, before anything is
written -- and enqueues a
:class:`~sqlalchemy_watchdog.Job` whose payload is those arguments (encoded by
the task's codec, if it has one) in the caller's transaction.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from .core.handlers import _UNSET, HandlerRegistry, RunningJob, default_registry
from .errors import InvalidJob
from .jobs import QUEUE_MAX_LENGTH, Decision, EnqueueResult, Job, JobResult, RetryPolicy, check_text

if TYPE_CHECKING:
    from .asyncio import AsyncWatchdog
    from .client import Watchdog
    from .codecs import PayloadCodec
    from .executors import ProcessExecutor

__all__ = ["task", "Task"]

P = ParamSpec("P")
R = TypeVar("R")

#: The keyword ``.enqueue`` and ``.job`` keep for themselves: a task's
#: function may not have a parameter of this name.
RESERVED = frozenset({"job_id"})


#: The annotations an argument is checked against, with their names in
#: errors: what JSON (and so any codec) carries as it is.
_PLAIN: dict[Any, tuple[str, Callable[[Any], bool]]] = {
    int: ("int", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    # An int is a float's value too (PEP 484's numeric tower).
    float: ("float", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    bool: ("bool", lambda v: isinstance(v, bool)),
    str: ("str", lambda v: isinstance(v, str)),
    type(None): ("None", lambda v: v is None),
    None: ("None", lambda v: v is None),
    list: ("list", lambda v: isinstance(v, list)),
    dict: ("dict", lambda v: isinstance(v, dict)),
}


@dataclass(frozen=True, slots=True)
class ArgumentCheck:
    """What an argument's annotation lets through, when it is one :func:`check_of` understands."""

    #: As errors say it (``int``, ``str | None``).
    expected: str
    accepts: Callable[[Any], bool]


def check_of(annotation: Any) -> ArgumentCheck | None:
    """The check of a parameter annotated ``annotation``, or None when it is
    not a plain type the payload carries (``int``, ``float``, ``bool``,
    ``str``, ``None``, ``list``, ``dict`` -- ``list[int]`` and ``dict[str,
    int]`` by their container alone -- or an ``Optional``/union of those):
    such an argument is not checked (``Any``, a class, a ``datetime`` a
    codec carries, a ``TypedDict``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = [check_of(member) for member in typing.get_args(annotation)]
        if any(member is None for member in members):
            return None
        checks = [member for member in members if member is not None]
        return ArgumentCheck(
            " | ".join(check.expected for check in checks), lambda v: any(check.accepts(v) for check in checks)
        )
    if origin in (list, dict):
        annotation = origin
    try:
        plain = _PLAIN.get(annotation)
    except TypeError:  # an unhashable annotation: not one of ours
        return None
    return None if plain is None else ArgumentCheck(*plain)


def _checks_of(fn: Callable[..., Any], signature: inspect.Signature) -> dict[str, ArgumentCheck]:
    """The checks of ``fn``'s parameters whose annotations :func:`check_of`
    understands (string annotations resolved; one that cannot be is not
    checked); ``**kwargs``' check is under its own name."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a name the module cannot resolve: check what the signature holds as objects
        hints = {name: p.annotation for name, p in signature.parameters.items() if not isinstance(p.annotation, str)}
    checks: dict[str, ArgumentCheck] = {}
    for name in signature.parameters:
        if name in hints and (check := check_of(hints[name])) is not None:
            checks[name] = check
    return checks


class Task(Generic[P, R]):
    """A function registered as the handler of its ``queue``, and its enqueuer.

    Calling the task calls the function itself. Made by :func:`task`.
    """

    #: The function's name (and ``__doc__``, ``__wrapped__``: functools.update_wrapper).
    __name__: str

    def __init__(
        self,
        fn: Callable[P, R],
        queue: str,
        *,
        codec: PayloadCodec | None,
        lane: str | None,
        priority: int,
    ) -> None:
        self.fn = fn
        self.queue = queue
        self.codec = codec
        self.lane = lane
        self.priority = priority
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.signature = inspect.signature(fn)
        for parameter in self.signature.parameters.values():
            if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
                raise TypeError(
                    f"@task {self.name}: parameter {parameter.name!r} cannot be passed by keyword; "
                    "a task's arguments travel as a JSON object"
                )
            if parameter.name in RESERVED:
                raise TypeError(f"@task {self.name}: parameter {parameter.name!r} is reserved for the job's id")
        #: The checks of the arguments whose annotations are plain payload types.
        self.checks = _checks_of(fn, self.signature)
        self.handler: Callable[[RunningJob], Any] = self._make_handler()
        functools.update_wrapper(self, fn)

    def _make_handler(self) -> Callable[[RunningJob], Any]:
        fn: Callable[..., Any] = self.fn
        decode, encode = self._arguments_of, self._result_of
        if inspect.iscoroutinefunction(fn):

            async def run_async(job: RunningJob) -> Any:
                return encode(await fn(**decode(job)))

            handler: Callable[[RunningJob], Any] = run_async
        else:

            def run(job: RunningJob) -> Any:
                return encode(fn(**decode(job)))

            handler = run
        handler.__name__ = handler.__qualname__ = f"{self.name}.handler"
        return handler

    def _arguments_of(self, job: RunningJob) -> dict[str, Any]:
        payload = job.payload if self.codec is None else self.codec.decode(job.payload)
        if not isinstance(payload, Mapping):
            raise TypeError(f"task {self.name}: the job's payload is not an object of arguments: {payload!r}"[:500])
        return dict(payload)

    def _result_of(self, value: Any) -> Any:
        """The function's return value as the job's result (a Decision as it is)."""
        if self.codec is None or value is None or isinstance(value, Decision):
            return value
        return self.codec.encode(value)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the function itself (no job, no queue)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<task {self.name} on queue {self.queue!r}>"

    # -- enqueueing ------------------------------------------------------------------

    def arguments(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``kwargs`` checked against the function's signature: the
        arguments given, in the signature's order (defaults are left to the
        call, so they are not part of the job's identity).

        :raises InvalidJob: naming the first argument missing or unknown, or
            whose value its annotation refuses (see ``check_of``).
        """
        parameters = self.signature.parameters
        open_ended = next((p.name for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        for name, value in kwargs.items():
            if name not in parameters and open_ended is None:
                known = ", ".join(p for p in parameters) or "none"
                raise InvalidJob(name, f"{self.name}() takes no argument {name!r} (its arguments: {known})")
            check = self.checks.get(name if name in parameters else str(open_ended))
            if check is not None and not check.accepts(value):
                shown = repr(value)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                raise InvalidJob(
                    name, f"{self.name}() takes {name!r} as {check.expected}, got {type(value).__name__} {shown}"
                )
        for parameter in parameters.values():
            if (
                parameter.default is inspect.Parameter.empty
                and parameter.kind is not inspect.Parameter.VAR_KEYWORD
                and parameter.name not in kwargs
            ):
                raise InvalidJob(parameter.name, f"{self.name}() is missing its argument {parameter.name!r}")
        return {name: kwargs[name] for name in parameters if name in kwargs} | {
            name: value for name, value in kwargs.items() if name not in parameters
        }

    def job(
        self,
        *,
        job_id: str | None = None,
        run_at: datetime | None = None,
        max_recoveries: int | None = None,
        **kwargs: Any,
    ) -> Job:
        """The :class:`~sqlalchemy_watchdog.Job` that calls this task with
        ``kwargs``: payload the checked arguments (encoded by the task's
        codec). ``job_id`` None makes a fresh unique one (``<function>-<uuid>``):
        such a job is **not idempotent** -- the same call twice enqueues two
        jobs; pass your own ``job_id`` to make a repeat a duplicate."""
        arguments = self.arguments(kwargs)
        if job_id is None:
            job_id = f"{getattr(self.fn, '__name__', 'task')}-{uuid.uuid4().hex}"
        return Job(
            job_id,
            self.queue,
            lane=self.lane,
            priority=self.priority,
            payload=arguments,
            run_at=run_at,
            max_recoveries=max_recoveries,
            codec=self.codec,
        )

    @overload
    def enqueue(
        self, target: Session | Connection, *, job_id: str | None = None, delay: timedelta | None = None, **kwargs: Any
    ) -> EnqueueResult: ...
    @overload
    def enqueue(
        self,
        target: AsyncSession | AsyncConnection,
        *,
        job_id: str | None = None,
        delay: timedelta | None = None,
        **kwargs: Any,
    ) -> Awaitable[EnqueueResult]: ...

    def enqueue(
        self,
        target: Session | Connection | AsyncSession | AsyncConnection,
        *,
        job_id: str | None = None,
        delay: timedelta | None = None,
        **kwargs: Any,
    ) -> EnqueueResult | Awaitable[EnqueueResult]:
        """Enqueue a call of this task with ``kwargs`` in the caller's
        transaction (see :func:`~sqlalchemy_watchdog.enqueue`; with an
        ``AsyncSession`` or ``AsyncConnection``, await the answer). The
        arguments are checked first: nothing is written for a missing or an
        unknown one. See :meth:`job` for ``job_id``."""
        job = self.job(job_id=job_id, **kwargs)
        if isinstance(target, (AsyncSession, AsyncConnection)):
            from . import asyncio as watchdog_asyncio

            return watchdog_asyncio.enqueue(target, job, delay=delay)
        from .client import enqueue

        return enqueue(target, job, delay=delay)

    # -- results ---------------------------------------------------------------------

    @overload
    def result(self, watchdog: Watchdog, job_id: str) -> JobResult: ...
    @overload
    def result(self, watchdog: AsyncWatchdog, job_id: str) -> Awaitable[JobResult]: ...

    def result(self, watchdog: Watchdog | AsyncWatchdog, job_id: str) -> JobResult | Awaitable[JobResult]:
        """The result of this task's job ``job_id`` (decoded by the task's
        codec), as :meth:`Watchdog.result <sqlalchemy_watchdog.Watchdog.result>`
        answers it; with an ``AsyncWatchdog``, await it."""
        return watchdog.result(job_id, codec=self.codec)

    @overload
    def wait(self, watchdog: Watchdog, job_id: str, *, timeout: timedelta) -> JobResult: ...
    @overload
    def wait(self, watchdog: AsyncWatchdog, job_id: str, *, timeout: timedelta) -> Awaitable[JobResult]: ...

    def wait(
        self, watchdog: Watchdog | AsyncWatchdog, job_id: str, *, timeout: timedelta
    ) -> JobResult | Awaitable[JobResult]:
        """:meth:`Watchdog.wait <sqlalchemy_watchdog.Watchdog.wait>` for this
        task's job ``job_id``, decoded by the task's codec."""
        return watchdog.wait(job_id, timeout=timeout, codec=self.codec)


def task(
    queue: str,
    *,
    retry: RetryPolicy | None = _UNSET,
    timeout: timedelta | None = _UNSET,
    max_recoveries: int | None = _UNSET,
    codec: PayloadCodec | None = None,
    lane: str | None = None,
    priority: int = 0,
    registry: HandlerRegistry | None = None,
    executor: ProcessExecutor | str = _UNSET,
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Make the decorated function a :class:`Task`: the handler of ``queue``
    and an enqueuer of calls to it.

    ``retry``, ``timeout`` and ``max_recoveries`` are the handler's policy,
    as :func:`~sqlalchemy_watchdog.handler` takes them. ``codec`` (e.g.
    :class:`~sqlalchemy_watchdog.TaggedJSON`) encodes the arguments into the
    payload and the return value into the result, and decodes both back: the
    task applies it itself, so give the runner serving ``queue`` no codec of
    its own. ``lane`` and ``priority`` go to every job of the task.
    ``registry``: the ``HandlerRegistry`` (``sqlalchemy_watchdog.core.handlers``)
    to register with (default: the one a ``Runner`` built without handlers
    serves). ``executor``: where the task's jobs run, as
    :func:`~sqlalchemy_watchdog.handler` takes it.

    The function's parameters are the job's arguments: passed by keyword
    (no positional-only parameter or ``*args``), and none named ``job_id``.
    """
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    if codec is not None and not (
        callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))
    ):
        raise InvalidJob("codec", f"must be a PayloadCodec (encode and decode), not {type(codec).__name__}")
    register = (registry or default_registry).register(
        queue, retry=retry, timeout=timeout, max_recoveries=max_recoveries, executor=executor
    )

    def decorate(fn: Callable[P, R]) -> Task[P, R]:
        made = Task(fn, queue, codec=codec, lane=lane, priority=priority)
        register(made.handler)
        return made

    return decorate
