"""The conformance suite covers every store operation: each function declared
with ``@operation`` in the package is named by at least one test of
``tests/backends/test_ops_*.py`` (``@pytest.mark.operation("name")``), so an
operation added without a conformance test fails here, and a mark naming no
operation (a typo, a renamed operation) fails too.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# The package imports every module that declares operations: the registry is whole.
from sqlalchemy_watchdog import store
from sqlalchemy_watchdog.store.operation import OPERATIONS

HERE = Path(__file__).parent


def _conformance_modules() -> list[ModuleType]:
    return [importlib.import_module(f"tests.backends.{path.stem}") for path in sorted(HERE.glob("test_ops_*.py"))]


def _marks(obj: Any) -> Iterator[pytest.Mark]:
    for mark in getattr(obj, "pytestmark", []):
        if mark.name == "operation":
            yield mark


def _named_operations() -> dict[str, list[str]]:
    """Every operation named by a conformance test, with the tests naming it."""
    named: dict[str, list[str]] = {}
    for module in _conformance_modules():
        for name, test in vars(module).items():
            if not name.startswith("test_") or not callable(test):
                continue
            for mark in [*_marks(module), *_marks(test)]:
                for operation in mark.args:
                    named.setdefault(operation, []).append(f"{module.__name__}::{name}")
    return named


def test_the_registry_lists_the_package_operations_and_only_them() -> None:
    assert {"enqueue", "claim", "settle", "reconcile", "Pruning.run_batch"} <= set(OPERATIONS)
    for name, fn in OPERATIONS.items():
        assert store.operation_of(fn) is not None, name
        assert fn.__module__.startswith("sqlalchemy_watchdog."), name


def test_every_declared_store_operation_has_a_conformance_test() -> None:
    missing = sorted(set(OPERATIONS) - set(_named_operations()))
    assert not missing, (
        f"store operations without a conformance test: {missing}; add a test to tests/backends/test_ops_*.py "
        'marked @pytest.mark.operation("<name>") that checks the operation\'s contract on every backend'
    )


def test_every_operation_a_conformance_test_names_is_declared() -> None:
    unknown = {name: tests for name, tests in _named_operations().items() if name not in OPERATIONS}
    assert not unknown, f"conformance tests name operations the store does not declare: {unknown}"
