"""One public surface: :class:`Watchdog` and :class:`AsyncWatchdog` are both
built from the one declaration of the operations,
:data:`sqlalchemy_watchdog.client.operations.OPERATIONS`.

Every declared operation is a method of both facades with the
declaration's parameters (names, kinds, order, defaults, annotations) and
result (the async one a coroutine function: ``async def`` annotates the
awaited value), the declaration's docstring, and the same overloads.
Neither facade has a public name the other lacks, and neither has a public
method that is not declared, except the differences listed in
:data:`DIFFERENCES`, each with its reason. Each method runs its own
declaration with the arguments it was given (its first request to the
database is the declaration's, on both facades). The module-level enqueue
helpers are twins in the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from sqlalchemy_watchdog import Job, Outcome, Rate, TaggedJSON, Watchdog, client
from sqlalchemy_watchdog import asyncio as async_api
from sqlalchemy_watchdog.asyncio import AsyncWatchdog
from sqlalchemy_watchdog.client import operations
from sqlalchemy_watchdog.client.operations import OPERATIONS, Program

#: (member, parameter or "return" or "") -> why the facades differ there.
DIFFERENCES: dict[tuple[str, str], str] = {
    ("__init__", ""): "the constructor is each facade's own, not an operation",
    ("__init__", "engine"): "Watchdog takes an Engine, AsyncWatchdog an AsyncEngine",
}
#: (helper, parameter) -> why the module-level enqueue helpers differ there.
HELPER_DIFFERENCES: dict[tuple[str, str], str] = {
    ("enqueue", "target"): "a Session or Connection, or an AsyncSession or AsyncConnection",
    ("enqueue_select", "target"): "a Session or Connection, or an AsyncSession or AsyncConnection",
}
FACADES = (Watchdog, AsyncWatchdog)


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in vars(cls).items()
        if callable(member) and (not name.startswith("_") or name == "__init__")
    }


def public_names(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def differences(
    name: str,
    ours: Callable[..., Any],
    theirs: Callable[..., Any],
    *,
    allowed: dict[tuple[str, str], str] = DIFFERENCES,
    result: Callable[[Any], Any] = lambda annotation: annotation,
) -> list[str]:
    """How two signatures differ outside ``allowed`` (``self`` aside: a
    declaration has none). ``result`` maps ``ours``' return annotation to
    what ``theirs`` must have."""
    found: list[str] = []
    mine_sig, their_sig = inspect.signature(ours), inspect.signature(theirs)
    mine = [p for p in mine_sig.parameters.values() if p.name != "self"]
    twin = [p for p in their_sig.parameters.values() if p.name != "self"]
    if [p.name for p in mine] != [p.name for p in twin]:
        return [f"{name}: parameters {[p.name for p in mine]} != {[p.name for p in twin]}"]
    for a, b in zip(mine, twin, strict=True):
        if (name, a.name) in allowed:
            continue
        for facet in ("kind", "default", "annotation"):
            if getattr(a, facet) != getattr(b, facet):
                found.append(f"{name}({a.name}): {facet} {getattr(a, facet)!r} != {getattr(b, facet)!r}")
    if (name, "return") not in allowed and result(mine_sig.return_annotation) != their_sig.return_annotation:
        found.append(f"{name}: returns {result(mine_sig.return_annotation)!r} != {their_sig.return_annotation!r}")
    return found


def program_result(annotation: str) -> str:
    """``Program[X]`` (a declaration's result) -> ``X`` (its methods')."""
    assert annotation.startswith("Program[") and annotation.endswith("]"), annotation
    return annotation[len("Program[") : -1]


def test_every_declared_operation_is_a_method_of_both_facades_and_nothing_else_is() -> None:
    declared = set(OPERATIONS)
    exempt = {member for member, part in DIFFERENCES if part == ""}
    for facade in FACADES:
        assert set(public_methods(facade)) - exempt == declared, facade.__name__


def test_neither_facade_has_a_public_name_the_other_lacks() -> None:
    """Classes and instances: the attributes set by each constructor too."""
    assert public_names(Watchdog) == public_names(AsyncWatchdog)
    sync = Watchdog(create_engine("sqlite://"))
    async_ = AsyncWatchdog(create_async_engine("sqlite+aiosqlite://"))
    assert public_names(sync) == public_names(async_)
    assert "engine" in public_names(sync)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
@pytest.mark.parametrize("facade", FACADES, ids=lambda cls: cls.__name__)
def test_each_method_has_its_declarations_parameters_result_and_docstring(facade: type, name: str) -> None:
    declaration = OPERATIONS[name]
    method = public_methods(facade)[name]
    found = differences(name, declaration, method, result=program_result)
    assert found == [], found
    assert getattr(method, "__watchdog_declaration__", None) is declaration
    assert declaration.__doc__ and declaration.__doc__.strip()
    assert inspect.getdoc(method) == inspect.getdoc(declaration)
    assert inspect.iscoroutinefunction(method) is (facade is AsyncWatchdog)


def test_the_constructors_differ_only_in_the_engine_they_take() -> None:
    found = differences("__init__", Watchdog.__init__, AsyncWatchdog.__init__)
    assert found == [], found


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_the_facades_have_the_same_overloads(name: str) -> None:
    sync = typing.get_overloads(public_methods(Watchdog)[name])
    async_ = typing.get_overloads(public_methods(AsyncWatchdog)[name])
    assert len(sync) == len(async_)
    for mine, twin in zip(sync, async_, strict=True):
        assert differences(name, mine, twin) == []


@pytest.mark.parametrize("name", ["enqueue", "enqueue_select"])
def test_the_enqueue_helpers_are_twins(name: str) -> None:
    sync, async_ = getattr(client, name), getattr(async_api, name)
    assert differences(name, sync, async_, allowed=HELPER_DIFFERENCES) == []
    assert not inspect.iscoroutinefunction(sync)
    assert inspect.iscoroutinefunction(async_)
    assert inspect.getdoc(async_)
    assert len(typing.get_overloads(sync)) == len(typing.get_overloads(async_))


def test_every_declaration_is_a_generator_function_with_a_docstring() -> None:
    """What the facades drive: a program of steps, documented once."""
    for name, declaration in OPERATIONS.items():
        assert declaration.__name__ == name
        assert inspect.isgeneratorfunction(declaration), name
        assert declaration.__module__ == operations.__name__, name


T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Arguments for each operation, every parameter given a value other than its
#: default where one can be, so that a method passing one on wrongly is seen.
SAMPLES: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "enqueue": ((Job("j1", "q"),), {"delay": timedelta(seconds=5)}),
    "read": (("j1",), {}),
    "result": (("j1",), {"codec": TaggedJSON()}),
    "wait": (
        ("j1",),
        {"timeout": timedelta(seconds=7), "codec": TaggedJSON(), "poll_interval": timedelta(seconds=2)},
    ),
    "explain": (("j1",), {}),
    "read_queue_head": (("q",), {}),
    "read_settled": ((17, 3), {}),
    "has_pending_work": ((), {}),
    "list_jobs": (
        (),
        {
            "queue": "q",
            "state": "queued",
            "outcome": "failed",
            "lane": "l",
            "job_id_prefix": "j",
            "limit": 7,
            "after_sequence": 2,
            "before_sequence": 90,
            "newest_first": True,
            "with_payload": False,
        },
    ),
    "stats": ((), {}),
    "workers": ((), {}),
    "schedules": ((), {}),
    "prune": (
        (),
        {
            "older_than": timedelta(days=3),
            "outcomes": [Outcome.FAILED],
            "limit": 40,
            "batch": 20,
            "include_undated": True,
        },
    ),
    "pause": (("q",), {"reason": "deploy"}),
    "resume": (("q",), {}),
    "set_limits": (
        ("q",),
        {
            "concurrency": 3,
            "concurrency_per_key": 2,
            "rate": Rate(5, timedelta(seconds=1)),
            "rate_per_key": Rate(1, timedelta(seconds=1)),
        },
    ),
    "clear_limits": (("q",), {}),
    "limits": ((), {}),
    "rerun": (("j1",), {"rerun_id": "r1"}),
    "rerun_many": (
        (),
        {
            "rerun_id": "r1",
            "queue": "q",
            "lane": "l",
            "outcome": "failed",
            "settled_after": T0,
            "settled_before": T0 + timedelta(days=1),
            "enqueued_after": T0 - timedelta(days=1),
            "enqueued_before": T0 + timedelta(days=2),
            "batch": 10,
            "limit": 30,
            "dry_run": True,
        },
    ),
    "cancel_many": (
        (),
        {
            "cancellation_id": "c1",
            "queue": "q",
            "lane": "l",
            "enqueued_after": T0,
            "enqueued_before": T0 + timedelta(days=1),
            "only_if_queued": True,
            "batch": 10,
            "limit": 30,
            "dry_run": True,
        },
    ),
    "cancel": (("j1", "c1"), {"only_if_queued": True}),
    "replace": (("j1",), {"payload": {"n": 2}, "run_at": None, "codec": None}),
    "steps": (("j1",), {}),
    "signal": (("j1", "approved"), {"payload": {"by": "ann"}}),
    "signals": (("j1",), {}),
    "fail_lane": (("l", "why"), {}),
    "purge": (("q",), {}),
    "throughput": ((), {}),
}


class Asked(Exception):
    """What a recording facade raises at an operation's first step."""

    def __init__(self, step: operations.Step) -> None:
        super().__init__(step)
        self.step = step


class RecordingWatchdog(Watchdog):
    def _step(self, step: operations.Step) -> Any:
        raise Asked(step)


class RecordingAsyncWatchdog(AsyncWatchdog):
    async def _step(self, step: operations.Step) -> Any:
        raise Asked(step)


def first_step(call: Callable[[], Any]) -> operations.Step:
    with pytest.raises(Asked) as asked:
        result = call()
        if inspect.iscoroutine(result):
            asyncio.run(result)
    return asked.value.step


def comparable(step: operations.Step) -> object:
    """A step as a value: a bound method (``Pruning.run_batch``) compares
    by its function and an equal object (method equality is by identity)."""
    if isinstance(step, operations.WaitFor):
        return step
    fn: Any = step.fn
    key = (fn.__func__, fn.__self__) if inspect.ismethod(fn) else fn
    return (key, step.as_look, step.args, dict(step.kwargs))


def test_the_samples_cover_every_operation() -> None:
    assert set(SAMPLES) == set(OPERATIONS)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_method_runs_its_own_declaration_with_the_arguments_it_was_given(name: str) -> None:
    """Both facades ask the database for what the declaration asks first,
    with every argument passed on where the declaration puts it."""
    args, kwargs = SAMPLES[name]
    expected = comparable(next(OPERATIONS[name](*args, **kwargs)))
    sync = RecordingWatchdog.__new__(RecordingWatchdog)
    async_ = RecordingAsyncWatchdog.__new__(RecordingAsyncWatchdog)
    assert comparable(first_step(lambda: getattr(sync, name)(*args, **kwargs))) == expected
    assert comparable(first_step(lambda: getattr(async_, name)(*args, **kwargs))) == expected


def test_a_drifted_facade_is_reported() -> None:
    """The comparison itself sees a default, a kind, a name and a result that differ."""

    def read(job_id: str, *, limit: int = 1) -> Program[int]:
        raise NotImplementedError

    class Drifted:
        async def read(self, job_id: str, limit: int = 2) -> str:
            raise NotImplementedError

    class Renamed:
        def read(self, job: str, *, limit: int = 1) -> int:
            raise NotImplementedError

    class Faithful:
        def read(self, job_id: str, *, limit: int = 1) -> int:
            raise NotImplementedError

    found = differences("read", read, Drifted.read, result=program_result)
    assert any("default 1 != 2" in line for line in found), found
    assert any("kind" in line for line in found), found
    assert any("returns 'int' != 'str'" in line for line in found), found
    assert differences("read", read, Renamed.read, result=program_result) != []
    assert differences("read", read, Faithful.read, result=program_result) == []
