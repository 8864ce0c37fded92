"""Watchdog and AsyncWatchdog are twins: every public method of one has a twin
in the other with the same name, parameters (kinds, names, order),
defaults and annotations -- the async one a coroutine function whose
annotation is the sync one's result (``async def`` annotates the awaited
value). Deliberate differences are listed in ALLOWED, each with its reason.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import pytest

from sqlalchemy_watchdog import Watchdog
from sqlalchemy_watchdog.asyncio import AsyncWatchdog

#: (method, parameter or "return") -> why the twins differ there.
ALLOWED: dict[tuple[str, str], str] = {
    ("__init__", "engine"): "Watchdog takes an Engine, AsyncWatchdog an AsyncEngine",
}


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in vars(cls).items()
        if callable(member) and (not name.startswith("_") or name == "__init__")
    }


def differences(name: str, sync: Callable[..., Any], async_: Callable[..., Any]) -> list[str]:
    """How the twins' signatures differ, outside ALLOWED."""
    found: list[str] = []
    ours, theirs = inspect.signature(sync), inspect.signature(async_)
    sync_params, async_params = list(ours.parameters.values()), list(theirs.parameters.values())
    if [p.name for p in sync_params] != [p.name for p in async_params]:
        return [f"{name}: parameters {[p.name for p in sync_params]} != {[p.name for p in async_params]}"]
    for mine, twin in zip(sync_params, async_params, strict=True):
        if (name, mine.name) in ALLOWED:
            continue
        for facet in ("kind", "default", "annotation"):
            if getattr(mine, facet) != getattr(twin, facet):
                found.append(f"{name}({mine.name}): {facet} {getattr(mine, facet)!r} != {getattr(twin, facet)!r}")
    if (name, "return") not in ALLOWED and ours.return_annotation != theirs.return_annotation:
        found.append(f"{name}: returns {ours.return_annotation!r} != {theirs.return_annotation!r}")
    return found


def test_every_public_method_has_a_twin_of_the_same_name() -> None:
    sync, async_ = public_methods(Watchdog), public_methods(AsyncWatchdog)
    assert sorted(sync) == sorted(async_)


@pytest.mark.parametrize("name", sorted(public_methods(Watchdog)))
def test_the_twins_have_the_same_parameters_defaults_and_annotations(name: str) -> None:
    sync = public_methods(Watchdog)[name]
    async_ = public_methods(AsyncWatchdog)[name]
    assert differences(name, sync, async_) == []
    if name != "__init__":
        assert not inspect.iscoroutinefunction(sync)
        assert inspect.iscoroutinefunction(async_)


@pytest.mark.parametrize("name", sorted(public_methods(Watchdog)))
def test_the_twins_have_the_same_overloads(name: str) -> None:
    sync = typing.get_overloads(public_methods(Watchdog)[name])
    async_ = typing.get_overloads(public_methods(AsyncWatchdog)[name])
    assert len(sync) == len(async_)
    for mine, twin in zip(sync, async_, strict=True):
        assert differences(name, mine, twin) == []


def test_a_drifted_twin_is_reported() -> None:
    """The comparison itself sees a default, a kind, a name and a result that differ."""

    class Sync:
        def read(self, job_id: str, *, limit: int = 1) -> int:
            raise NotImplementedError

    class Async:
        async def read(self, job_id: str, limit: int = 2) -> str:
            raise NotImplementedError

    class Renamed:
        async def read(self, job: str, *, limit: int = 1) -> int:
            raise NotImplementedError

    found = differences("read", Sync.read, Async.read)
    assert any("default 1 != 2" in line for line in found), found
    assert any("kind" in line for line in found), found
    assert any("returns" in line for line in found), found
    assert differences("read", Sync.read, Renamed.read) != []
