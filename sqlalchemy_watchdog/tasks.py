"""Tasks: a typed function as a handler and an enqueuer.

::

    @task("emails", retry=RetryPolicy(max_attempts=5), timeout=timedelta(seconds=30))
    def send_confirmation(order_id: int, urgent: bool = False) -> dict[str, bool]:
        ...

    send_confirmation.enqueue(session, order_id=42, job_id="confirm-42")
    send_confirmation.configure(priority=10, key="tenant-7").enqueue(session, order_id=43)

``@task`` registers a handler for the queue (as :func:`~sqlalchemy_watchdog.handler`
does, with the same policy arguments) that calls the function with the job's
payload as keyword arguments -- after the job itself with ``pass_job=True``
-- and returns what it returns (the job's result). ``.enqueue`` checks the
arguments against the function's signature -- a missing or an unknown one,
or one whose annotation is a plain payload type (``int``, ``float``,
``bool``, ``str``, ``None``, ``list``, ``dict``, or an ``Optional``/union
of those) that its value is not, is an :class:`~sqlalchemy_watchdog.InvalidJob`
naming it, before anything is written; an argument annotated with a
dataclass or a Pydantic model (or a list, dict or union holding one) is
validated field by field, stored as its JSON object and rebuilt for the
handler -- and enqueues a :class:`~sqlalchemy_watchdog.Job` whose payload
is those arguments (encoded by the task's codec, if it has one) in the
caller's transaction, with the options :meth:`Task.configure` gave.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
import typing
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from .core.handlers import _UNSET, HandlerRegistry, RunningJob, default_registry
from .errors import InvalidJob
from .jobs import (
    QUEUE_MAX_LENGTH,
    Decision,
    EnqueueResult,
    Job,
    JobResult,
    RetryPolicy,
    check_duration,
    check_text,
)
from .jobs.uniqueness import ThrottleExcess, UniqueKind, UniqueStates

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

#: What :meth:`Task.configure` sets for the jobs it enqueues: every field of
#: a :class:`~sqlalchemy_watchdog.Job` that is the call's to choose (not
#: ``job_id``, the payload, the task's codec or ``rerun_of``), and the
#: enqueue's ``delay``.
OPTIONS = (
    "key", "after", "after_policy", "lane", "priority", "delay", "run_at", "retry", "timeout", "max_recoveries",
    "unique_key", "unique_for", "unique_states", "debounce", "max_wait", "throttle", "throttle_excess",
)  # fmt: skip


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


def _hints_of(fn: Callable[..., Any], parameters: Mapping[str, inspect.Parameter]) -> dict[str, Any]:
    """The annotations of ``fn``'s ``parameters``, string annotations
    resolved; when a name cannot be resolved, those the signature holds as
    objects (the others are not checked)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a name the module cannot resolve: what the signature holds as objects
        hints = {name: p.annotation for name, p in parameters.items() if not isinstance(p.annotation, str)}
    return {name: hints[name] for name in parameters if name in hints and hints[name] is not inspect.Parameter.empty}


# -- structured arguments: dataclasses and Pydantic models ------------------------------


def _is_dataclass_type(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _is_model(annotation: Any) -> bool:
    """Whether ``annotation`` is a Pydantic model class (pydantic is only
    looked at when something imported it: a model's module did)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)


def structured(annotation: Any) -> bool:
    """Whether ``annotation`` is, or holds (``list[X]``, ``dict[str, X]``,
    ``X | None``, ...), a dataclass or a Pydantic model."""
    if _is_dataclass_type(annotation) or _is_model(annotation):
        return True
    return any(structured(arg) for arg in typing.get_args(annotation) if isinstance(arg, type) or typing.get_args(arg))


def _is_union(origin: Any) -> bool:
    return origin is typing.Union or origin is types.UnionType


#: :func:`_fields_of` by dataclass, worked out once.
_FIELDS: dict[type[Any], tuple[tuple[str, Any, bool], ...]] = {}


def _fields_of(cls: type[Any]) -> tuple[tuple[str, Any, bool], ...]:
    """A dataclass's fields its constructor takes: (name, annotation --
    ``Any`` when it cannot be resolved --, whether it is required)."""
    known = _FIELDS.get(cls)
    if known is not None:
        return known
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a name its module cannot resolve: those fields are not checked
        hints = {}
    known = _FIELDS[cls] = tuple(
        (f.name, hints.get(f.name, Any), f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
        if f.init
    )
    return known


def _describe(annotation: Any) -> str:
    """An annotation as errors say it (``int``, ``Invoice | None``, ``list[Line]``)."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if _is_union(origin):
        return " | ".join(_describe(arg) for arg in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _describe(typing.get_args(annotation)[0])
    if origin is not None:
        args = ", ".join(_describe(arg) for arg in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return str(getattr(annotation, "__name__", annotation))


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _refused(owner: str, path: str, expected: str, value: Any) -> InvalidJob:
    return InvalidJob(path, f"{owner}() takes {path!r} as {expected}, got {type(value).__name__} {_shown(value)}")


def dump(owner: str, annotation: Any, value: Any, path: str) -> Any:
    """``value`` as the payload carries it, checked against ``annotation``:
    a dataclass (an instance, or a mapping of its fields) as the object of
    its fields, each checked in turn; a Pydantic model as
    ``model_dump(mode="json")`` of the model validated; a list or dict item
    by item (a tuple as a list); a plain type as :func:`check_of` checks it;
    any other annotation as it is (a codec may carry it).

    :raises InvalidJob: naming the field by its path (``invoice.lines[0].amount``).
    """
    origin = typing.get_origin(annotation)
    if annotation is Any or annotation is object:
        return value
    if origin is typing.Annotated:
        return dump(owner, typing.get_args(annotation)[0], value, path)
    if _is_union(origin):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if value is None and len(members) < len(typing.get_args(annotation)):
            return None
        refusals: list[InvalidJob] = []
        for member in members:
            try:
                return dump(owner, member, value, path)
            except InvalidJob as error:
                refusals.append(error)
        # One member (``X | None``): its own words, which name the field inside.
        raise refusals[0] if len(members) == 1 else _refused(owner, path, _describe(annotation), value)
    if _is_dataclass_type(annotation):
        return _dump_dataclass(owner, annotation, value, path)
    if _is_model(annotation):
        return _dump_model(owner, annotation, value, path)
    if origin is list or annotation is list:
        if not isinstance(value, list):
            raise _refused(owner, path, _describe(annotation), value)
        (item,) = typing.get_args(annotation) or (Any,)
        return [dump(owner, item, one, f"{path}[{index}]") for index, one in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            raise _refused(owner, path, _describe(annotation), value)
        items = _tuple_items(annotation, len(value))
        if items is None:
            raise _refused(owner, path, _describe(annotation), value)
        return [dump(owner, item, one, f"{path}[{index}]") for index, (item, one) in enumerate(zip(items, value))]
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise _refused(owner, path, _describe(annotation), value)
        args = typing.get_args(annotation)
        item = args[1] if len(args) == 2 else Any
        for name in value:
            if not isinstance(name, str):
                raise InvalidJob(path, f"{owner}() takes {path!r} with str keys (a JSON object), got {_shown(name)}")
        return {name: dump(owner, item, one, f"{path}[{name!r}]") for name, one in value.items()}
    check = check_of(annotation)
    if check is not None and not check.accepts(value):
        raise _refused(owner, path, check.expected, value)
    return value


def _tuple_items(annotation: Any, length: int) -> list[Any] | None:
    """The annotation of each of ``length`` items of a ``tuple[...]``
    (``tuple[X, ...]``: X each), or None when the length does not fit."""
    args = typing.get_args(annotation)
    if len(args) == 2 and args[1] is Ellipsis:
        return [args[0]] * length
    if args == ((),):  # tuple[()]
        args = ()
    return list(args) if len(args) == length else None


def _dump_dataclass(owner: str, cls: type[Any], value: Any, path: str) -> dict[str, Any]:
    fields = _fields_of(cls)
    if isinstance(value, cls):
        given = {name: getattr(value, name) for name, _, _ in fields}
    elif isinstance(value, Mapping):
        given = dict(value)
        names = [name for name, _, _ in fields]
        for name in given:
            if name not in names:
                raise InvalidJob(
                    f"{path}.{name}",
                    f"{owner}(): {cls.__name__} has no field {name!r} (its fields: {', '.join(names) or 'none'})",
                )
    else:
        raise _refused(owner, path, cls.__name__, value)
    dumped: dict[str, Any] = {}
    for name, annotation, required in fields:
        if name in given:
            dumped[name] = dump(owner, annotation, given[name], f"{path}.{name}")
        elif required:
            raise InvalidJob(f"{path}.{name}", f"{owner}() is missing {cls.__name__}'s field {name!r}")
    return dumped


def _dump_model(owner: str, model: type[Any], value: Any, path: str) -> Any:
    pydantic: Any = sys.modules["pydantic"]
    try:
        # An instance is validated again from its fields (model_construct skips validation).
        valid = model.model_validate(value.model_dump() if isinstance(value, model) else value)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])
        raise InvalidJob(
            f"{path}{where}", f"{owner}(): {first['msg']} (got {_shown(first.get('input'))}, for {model.__name__})"
        ) from None
    return valid.model_dump(mode="json")


def load(annotation: Any, value: Any) -> Any:
    """The inverse of :func:`dump`: a stored argument rebuilt as its
    annotation says (dataclasses built, models validated); a value that
    fits no member of a union is passed as it is.

    :raises Exception: what building a dataclass or a model raised, or
        TypeError for a value of another kind than the annotation's.
    """
    if value is None:
        return None
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return load(typing.get_args(annotation)[0], value)
    if _is_union(origin):
        for member in typing.get_args(annotation):
            if member is type(None):
                continue
            try:
                return load(member, value)
            except Exception:
                continue
        return value
    if _is_dataclass_type(annotation):
        if not isinstance(value, Mapping):
            raise TypeError(f"{annotation.__name__} is built from an object, not {type(value).__name__}")
        fields = _fields_of(annotation)
        return annotation(**{name: load(hint, value[name]) for name, hint, _ in fields if name in value})
    if _is_model(annotation):
        return annotation.model_validate(value)
    if origin is list or annotation is list:
        if not isinstance(value, list):
            raise TypeError(f"a list, not {type(value).__name__}")
        (item,) = typing.get_args(annotation) or (Any,)
        return [load(item, one) for one in value]
    if origin is tuple:
        items = _tuple_items(annotation, len(value)) if isinstance(value, (tuple, list)) else None
        if items is None:
            raise TypeError(f"{_describe(annotation)}, not {type(value).__name__}")
        return tuple(load(item, one) for item, one in zip(items, value))
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise TypeError(f"a dict, not {type(value).__name__}")
        args = typing.get_args(annotation)
        item = args[1] if len(args) == 2 else Any
        return {name: load(item, one) for name, one in value.items()}
    check = check_of(annotation)
    if check is not None and not check.accepts(value):
        raise TypeError(f"{check.expected}, not {type(value).__name__}")
    return value


# -- per-call options ---------------------------------------------------------------------


class _Keep:
    """The default of each :meth:`Task.configure` option: keep what the task has."""

    def __repr__(self) -> str:
        return "unchanged"


_KEEP: Any = _Keep()


@dataclass(frozen=True, slots=True)
class CallOptions:
    """What :meth:`Task.configure` set for the task's next jobs (checked as
    a :class:`~sqlalchemy_watchdog.Job` checks them)."""

    lane: str | None = None
    priority: int = 0
    key: str | None = None
    after: tuple[str, ...] = ()
    after_policy: str = "completed"
    run_at: datetime | None = None
    #: Counted from the database clock at enqueue (``enqueue(..., delay=)``).
    delay: timedelta | None = None
    retry: RetryPolicy | None = None
    timeout: timedelta | None = None
    max_recoveries: int | None = None
    #: Uniqueness windows, debounce and throttle (docs/howto/uniqueness.md).
    unique_key: str | None = None
    unique_for: timedelta | None = None
    unique_states: UniqueStates | str | None = None
    debounce: timedelta | None = None
    max_wait: timedelta | None = None
    throttle: timedelta | None = None
    throttle_excess: ThrottleExcess | str | None = None

    def job_fields(self) -> dict[str, Any]:
        """The options a :class:`~sqlalchemy_watchdog.Job` takes (all but ``delay``)."""
        return {name: getattr(self, name) for name in OPTIONS if name != "delay"}


def checked_options(queue: str, options: CallOptions) -> CallOptions:
    """``options`` checked by the rules of a :class:`~sqlalchemy_watchdog.Job`
    of ``queue`` (and of an enqueue's ``delay``), ``after`` as a tuple.

    :raises InvalidJob: naming the first option refused.
    """
    # A job of this queue with these options, built and dropped: Job's own checks, once.
    probe = Job(f"configure-{uuid.uuid4().hex}", queue, **options.job_fields())
    if options.delay is not None:
        check_duration("delay", options.delay)
        if options.run_at is not None:
            raise InvalidJob("delay", "cannot be combined with run_at (configure one of them)")
        if probe.unique is not None and probe.unique.kind is not UniqueKind.UNIQUE_FOR:
            raise InvalidJob("delay", f"cannot be combined with {probe.unique.kind.value}, which decides the start")
    return dataclasses.replace(
        options, after=probe.after, unique_states=probe.unique_states, throttle_excess=probe.throttle_excess
    )


class Task(Generic[P, R]):
    """A function registered as the handler of its ``queue``, and its enqueuer.

    Calling the task calls the function itself. Made by :func:`task`; a
    task is immutable: :meth:`configure` makes another, with options for
    the jobs it enqueues.
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
        pass_job: bool = False,
    ) -> None:
        self.fn = fn
        self.queue = queue
        self.codec = codec
        #: Whether the function's first parameter receives the job (``RunningJob``).
        self.pass_job = pass_job
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.signature = inspect.signature(fn)
        parameters = list(self.signature.parameters.values())
        if pass_job:
            if not parameters or parameters[0].kind not in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                raise TypeError(
                    f"@task {self.name}: pass_job=True passes the job as the first argument, "
                    "and the function has no positional parameter to take it"
                )
            parameters = parameters[1:]
        for parameter in parameters:
            if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
                raise TypeError(
                    f"@task {self.name}: parameter {parameter.name!r} cannot be passed by keyword; "
                    "a task's arguments travel as a JSON object"
                )
            if parameter.name in RESERVED:
                raise TypeError(f"@task {self.name}: parameter {parameter.name!r} is reserved for the job's id")
        #: The parameters a job's arguments fill (all but the job's, with ``pass_job``).
        self.parameters = types.MappingProxyType({p.name: p for p in parameters})
        #: The parameter ``**kwargs`` is, if any.
        self.open_ended = next((p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        hints = _hints_of(fn, self.parameters)
        #: The annotations of the arguments that are (or hold) dataclasses or
        #: Pydantic models: validated at enqueue, rebuilt for the function.
        self.structured = types.MappingProxyType({name: hint for name, hint in hints.items() if structured(hint)})
        #: The checks of the other arguments whose annotations are plain payload types.
        self.checks = types.MappingProxyType(
            {
                name: check
                for name, hint in hints.items()
                if name not in self.structured and (check := check_of(hint)) is not None
            }
        )
        #: The options of the jobs this task enqueues (see :meth:`configure`).
        self.options = checked_options(queue, CallOptions(lane=lane, priority=priority))
        self.handler: Callable[[RunningJob], Any] = self._make_handler()
        functools.update_wrapper(self, fn)
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_sealed", False):
            raise AttributeError(f"a task is immutable (set {name!r}): configure() makes a new one")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a task is immutable (delete {name!r})")

    def _make_handler(self) -> Callable[[RunningJob], Any]:
        fn: Callable[..., Any] = self.fn
        decode, encode = self._arguments_of, self._result_of
        handler: Callable[[RunningJob], Any]
        if inspect.iscoroutinefunction(fn):
            if self.pass_job:

                async def run_async_with_job(job: RunningJob) -> Any:
                    return encode(await fn(job, **decode(job)))

                handler = run_async_with_job
            else:

                async def run_async(job: RunningJob) -> Any:
                    return encode(await fn(**decode(job)))

                handler = run_async
        elif self.pass_job:

            def run_with_job(job: RunningJob) -> Any:
                return encode(fn(job, **decode(job)))

            handler = run_with_job
        else:

            def run(job: RunningJob) -> Any:
                return encode(fn(**decode(job)))

            handler = run
        # Where the function is, as ``<module>.<function>.handler``: the process
        # executor's children import the function's module and find it there.
        handler.__module__ = getattr(fn, "__module__", None) or __name__
        handler.__name__ = handler.__qualname__ = f"{self.name}.handler"
        return handler

    def _arguments_of(self, job: RunningJob) -> dict[str, Any]:
        payload = job.payload if self.codec is None else self.codec.decode(job.payload)
        if not isinstance(payload, Mapping):
            raise TypeError(f"task {self.name}: the job's payload is not an object of arguments: {payload!r}"[:500])
        arguments = dict(payload)
        if self.structured:
            for name, value in arguments.items():
                annotation = self.structured.get(name if name in self.parameters else str(self.open_ended))
                if annotation is not None:
                    arguments[name] = load(annotation, value)
        return arguments

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

    # -- per-call options ------------------------------------------------------------

    def configure(
        self,
        *,
        key: str | None = _KEEP,
        after: Iterable[str] | None = _KEEP,
        after_policy: str = _KEEP,
        lane: str | None = _KEEP,
        priority: int = _KEEP,
        delay: timedelta | None = _KEEP,
        run_at: datetime | None = _KEEP,
        retry: RetryPolicy | None = _KEEP,
        timeout: timedelta | None = _KEEP,
        max_recoveries: int | None = _KEEP,
        unique_key: str | None = _KEEP,
        unique_for: timedelta | None = _KEEP,
        unique_states: UniqueStates | str | None = _KEEP,
        debounce: timedelta | None = _KEEP,
        max_wait: timedelta | None = _KEEP,
        throttle: timedelta | None = _KEEP,
        throttle_excess: ThrottleExcess | str | None = _KEEP,
        **unknown: Any,
    ) -> Task[P, R]:
        """This task with options for the jobs its :meth:`enqueue` and
        :meth:`job` make: a new task (this one is unchanged), the options
        given replacing this task's, the others kept. They are the
        :class:`~sqlalchemy_watchdog.Job` fields of the same names --
        ``key``, ``after``, ``after_policy``, ``lane`` (None: the queue's),
        ``priority``, ``run_at``, ``retry``, ``timeout``, ``max_recoveries``,
        the uniqueness options ``unique_key`` with ``unique_for`` (and
        ``unique_states``), ``debounce`` (and ``max_wait``) or ``throttle``
        (and ``throttle_excess``) -- and ``delay``, counted from the
        database clock at enqueue (not with ``run_at``, ``debounce`` or
        ``throttle``). They never mix with the function's arguments, so a
        function may have a parameter named ``key`` or ``priority``.

        :raises InvalidJob: naming an option this method does not take, or
            the first whose value a ``Job`` refuses (checked here, before
            any job is made).
        """
        if unknown:
            name = next(iter(unknown))
            raise InvalidJob(
                name, f"{self.name}.configure() takes no option {name!r} (its options: {', '.join(OPTIONS)})"
            )
        given: dict[str, Any] = {
            name: value
            for name, value in (
                ("key", key),
                ("after", after),
                ("after_policy", after_policy),
                ("lane", lane),
                ("priority", priority),
                ("delay", delay),
                ("run_at", run_at),
                ("retry", retry),
                ("timeout", timeout),
                ("max_recoveries", max_recoveries),
                ("unique_key", unique_key),
                ("unique_for", unique_for),
                ("unique_states", unique_states),
                ("debounce", debounce),
                ("max_wait", max_wait),
                ("throttle", throttle),
                ("throttle_excess", throttle_excess),
            )
            if value is not _KEEP
        }
        if given.get("after", ()) is None:
            given["after"] = ()
        options = checked_options(self.queue, dataclasses.replace(self.options, **given))
        made: Task[P, R] = object.__new__(type(self))
        made.__dict__.update(self.__dict__)
        made.__dict__["options"] = options
        return made

    # -- enqueueing ------------------------------------------------------------------

    def arguments(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``kwargs`` checked against the function's signature: the
        arguments given, in the signature's order (defaults are left to the
        call, so they are not part of the job's identity); a structured one
        (a dataclass, a Pydantic model) as the JSON object of its fields.

        :raises InvalidJob: naming the first argument missing or unknown, or
            whose value its annotation refuses (see ``check_of``), or the
            field of a structured one that is missing, unknown or refused
            (``invoice.customer.email``).
        """
        parameters = self.parameters
        open_ended = self.open_ended
        given: dict[str, Any] = {}
        for name, value in kwargs.items():
            if name not in parameters and open_ended is None:
                known = ", ".join(p for p in parameters) or "none"
                raise InvalidJob(name, f"{self.name}() takes no argument {name!r} (its arguments: {known})")
            slot = name if name in parameters else str(open_ended)
            annotation = self.structured.get(slot)
            if annotation is not None:
                given[name] = self._structured_argument(annotation, value, name)
                continue
            check = self.checks.get(slot)
            if check is not None and not check.accepts(value):
                raise _refused(self.name, name, check.expected, value)
            given[name] = value
        for parameter in parameters.values():
            if (
                parameter.default is inspect.Parameter.empty
                and parameter.kind is not inspect.Parameter.VAR_KEYWORD
                and parameter.name not in kwargs
            ):
                raise InvalidJob(parameter.name, f"{self.name}() is missing its argument {parameter.name!r}")
        return {name: given[name] for name in parameters if name in given} | {
            name: value for name, value in given.items() if name not in parameters
        }

    def _structured_argument(self, annotation: Any, value: Any, name: str) -> Any:
        """A dataclass or model argument as stored, checked now; built back
        as the handler will build it, so what its class refuses (a
        ``__post_init__`` check) is refused here, before anything is written."""
        dumped = dump(self.name, annotation, value, name)
        try:
            load(annotation, dumped)
        except Exception as error:
            raise InvalidJob(
                name, f"{self.name}() cannot build {name!r} as {_describe(annotation)}: {type(error).__name__}: {error}"
            ) from None
        return dumped

    def _job(self, job_id: str | None, arguments: Mapping[str, Any]) -> Job:
        checked = self.arguments(arguments)
        if job_id is None:
            job_id = f"{getattr(self.fn, '__name__', 'task')}-{uuid.uuid4().hex}"
        return Job(job_id, self.queue, payload=checked, codec=self.codec, **self.options.job_fields())

    def job(self, *, job_id: str | None = None, **arguments: Any) -> Job:
        """The :class:`~sqlalchemy_watchdog.Job` that calls this task with
        ``arguments``: payload the checked arguments (encoded by the task's
        codec), the other fields the task's options (:meth:`configure`).
        ``job_id`` None makes a fresh unique one (``<function>-<uuid>``):
        such a job is **not idempotent** -- the same call twice enqueues two
        jobs; pass your own ``job_id`` to make a repeat a duplicate.

        :raises InvalidJob: ``delay`` when the task was configured with one:
            a delay is counted from the database clock at enqueue, so it is
            not a field of a Job (use :meth:`enqueue`, or ``enqueue(session,
            jobs, delay=...)``)."""
        if self.options.delay is not None:
            raise InvalidJob(
                "delay",
                f"{self.name}.job(): a delay is counted from the database clock when the job is enqueued, so it "
                "is no field of a Job: call .enqueue(), or pass delay= to enqueue(session, jobs, delay=...)",
            )
        return self._job(job_id, arguments)

    @overload
    def enqueue(
        self, target: Session | Connection, *, job_id: str | None = None, **arguments: Any
    ) -> EnqueueResult: ...
    @overload
    def enqueue(
        self, target: AsyncSession | AsyncConnection, *, job_id: str | None = None, **arguments: Any
    ) -> Awaitable[EnqueueResult]: ...

    def enqueue(
        self,
        target: Session | Connection | AsyncSession | AsyncConnection,
        *,
        job_id: str | None = None,
        **arguments: Any,
    ) -> EnqueueResult | Awaitable[EnqueueResult]:
        """Enqueue a call of this task with ``arguments`` in the caller's
        transaction (see :func:`~sqlalchemy_watchdog.enqueue`; with an
        ``AsyncSession`` or ``AsyncConnection``, await the answer), with the
        task's options (:meth:`configure`). The arguments are checked first:
        nothing is written for a missing or an unknown one. See :meth:`job`
        for ``job_id``."""
        job = self._job(job_id, arguments)
        delay = self.options.delay
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
    pass_job: bool = False,
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
    its own. ``lane`` and ``priority`` go to every job of the task (as
    :meth:`Task.configure` sets them; it sets the other options of a job).
    ``registry``: the ``HandlerRegistry`` (``sqlalchemy_watchdog.core.handlers``)
    to register with (default: the one a ``Runner`` built without handlers
    serves). ``executor``: where the task's jobs run, as
    :func:`~sqlalchemy_watchdog.handler` takes it.

    The function's parameters are the job's arguments: passed by keyword
    (no positional-only parameter or ``*args``), and none named ``job_id``.
    With ``pass_job=True`` its first parameter is not one of them: it
    receives the job (a :class:`~sqlalchemy_watchdog.RunningJob`: its
    ``job_id``, ``attempt``, ``progress()``, ``stop_requested``,
    ``parent_results()``, ...), as a handler does.
    """
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    if codec is not None and not (
        callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))
    ):
        raise InvalidJob("codec", f"must be a PayloadCodec (encode and decode), not {type(codec).__name__}")
    checked_options(queue, CallOptions(lane=lane, priority=priority))
    register = (registry or default_registry).register(
        queue, retry=retry, timeout=timeout, max_recoveries=max_recoveries, executor=executor
    )

    def decorate(fn: Callable[P, R]) -> Task[P, R]:
        made = Task(fn, queue, codec=codec, lane=lane, priority=priority, pass_job=pass_job)
        register(made.handler)
        return made

    return decorate
