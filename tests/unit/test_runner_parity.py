"""The runner twins: ``Runner`` and ``AsyncRunner`` offer the same things.

Both take the one declared option set (``**options: Unpack[RunnerOptions]``)
and have the same public methods, properties and attributes, with the same
parameters and defaults. What differs on purpose is listed below, each with
its reason; anything else that differs fails here.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from sqlalchemy_watchdog import Runner
from sqlalchemy_watchdog.asyncio import AsyncRunner
from sqlalchemy_watchdog.core.settings import RunnerOptions

#: Methods that are coroutines in AsyncRunner (the same parameters).
COROUTINES = {"tick", "run_until_idle", "run_forever"}
#: ``running()`` is a context manager in Runner, an async one in AsyncRunner.
CONTEXT_MANAGERS = {"running"}
#: Parameters whose annotation differs: each driver's own engine and handler types.
DRIVER_TYPED = {"engine", "listen_engine", "handlers"}
#: Public members only one of them has, and why (none today).
ONLY_ONE: dict[str, str] = {}


def public(cls: type) -> dict[str, Any]:
    return {name: value for name, value in inspect.getmembers(cls) if not name.startswith("_")}


def shape(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_both_runners_have_the_same_public_methods_and_properties() -> None:
    sync, async_ = public(Runner), public(AsyncRunner)
    assert set(sync) ^ set(async_) == set(ONLY_ONE)
    for name in sorted(set(sync) & set(async_)):
        ours, theirs = sync[name], async_[name]
        if isinstance(ours, property):
            assert isinstance(theirs, property), f"{name} is a property of Runner only"
            continue
        assert shape(ours) == shape(theirs), f"{name}: {inspect.signature(ours)} != {inspect.signature(theirs)}"
        assert inspect.iscoroutinefunction(theirs) is (name in COROUTINES), name
        assert not inspect.iscoroutinefunction(ours), name


def test_both_runners_take_the_one_declared_option_set() -> None:
    sync, async_ = inspect.signature(Runner.__init__), inspect.signature(AsyncRunner.__init__)
    assert shape(Runner.__init__) == shape(AsyncRunner.__init__)
    for name, parameter in sync.parameters.items():
        if name not in DRIVER_TYPED:
            assert parameter.annotation == async_.parameters[name].annotation, name
    (options,) = [p for p in sync.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert options.annotation == "Unpack[RunnerOptions]"
    keyword_only = {p.name for p in sync.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keyword_only == {"listen_engine"}, "a runner option belongs in RunnerOptions, declared once"


def test_running_is_a_context_manager_of_each_kind() -> None:
    for name in CONTEXT_MANAGERS:
        assert inspect.isgeneratorfunction(inspect.unwrap(getattr(Runner, name)))
        assert inspect.isasyncgenfunction(inspect.unwrap(getattr(AsyncRunner, name)))


def test_both_runners_refuse_an_unknown_option_as_python_refuses_a_keyword() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'concurency'"):
        Runner(create_engine("sqlite://"), {"q": lambda job: None}, concurency=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'concurency'"):
        AsyncRunner(create_async_engine("sqlite+aiosqlite://"), {"q": lambda job: None}, concurency=2)  # type: ignore[call-arg]


@pytest.mark.parametrize("option", sorted(RunnerOptions.__optional_keys__))
def test_every_option_is_documented_once(option: str) -> None:
    assert f"``{option}``" in (RunnerOptions.__doc__ or "")


def test_built_runners_have_the_same_public_attributes() -> None:
    handlers = {"q": lambda job: None}
    sync = Runner(create_engine("sqlite://"), handlers, poll_interval=None)
    async_ = AsyncRunner(create_async_engine("sqlite+aiosqlite://"), handlers, poll_interval=None)
    ours = {name for name in vars(sync) if not name.startswith("_")}
    theirs = {name for name in vars(async_) if not name.startswith("_")}
    assert ours == theirs
    assert sync.settings == async_.settings, "the same options make the same settings"
