"""``store/declaration.py`` names every store operation, as the store defines it.

The declaration is a table of contents: it is only worth reading while it is
true. These tests hold it to the functions: the operations it names are the
ones ``@operation`` registered (:data:`store.operation.OPERATIONS`), each
declared signature is the function's (``inspect.signature``: names, kinds,
order, defaults, annotations), each declared shape is the function's
:class:`~sqlalchemy_watchdog.store.Shape`, and the runner's core port
(``core/ports.py: Store``) asks for nothing the declaration lacks. mypy
--strict checks the module-level assignments below: the store's module, the
client's module and a ``Pruning`` satisfy the declared protocols.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Connection

import sqlalchemy_watchdog  # noqa: F401 - every module declaring operations is imported: the registry is whole
from sqlalchemy_watchdog import store
from sqlalchemy_watchdog.client import operations as client_operations
from sqlalchemy_watchdog.core import ports
from sqlalchemy_watchdog.store.declaration import (
    SHAPES,
    ClientStoreOperations,
    PruningOperations,
    StoreOperations,
)
from sqlalchemy_watchdog.store.operation import OPERATIONS

# What mypy --strict checks: each implementation satisfies its declaration.
_STORE: StoreOperations = store
_CLIENT: ClientStoreOperations = client_operations


def _a_pruning_satisfies_its_declaration(pruning: store.Pruning) -> PruningOperations:
    return pruning


def _members(protocol: type) -> dict[str, Callable[..., Any]]:
    return {name: value for name, value in vars(protocol).items() if not name.startswith("_") and callable(value)}


def _declared() -> dict[str, Callable[..., Any]]:
    """Each declared operation by the name OPERATIONS lists it under."""
    declared = dict(_members(StoreOperations))
    declared.update({f"Pruning.{name}": fn for name, fn in _members(PruningOperations).items()})
    declared.update(_members(ClientStoreOperations))
    return declared


def _without_self(signature: inspect.Signature) -> inspect.Signature:
    parameters = list(signature.parameters.values())
    assert parameters and parameters[0].name == "self"
    return signature.replace(parameters=parameters[1:])


def _declared_signature(name: str, declared: Callable[..., Any]) -> inspect.Signature:
    """A protocol method's signature as its implementation has it: a
    module's function takes no ``self``; a method (``Pruning.run_batch``) does."""
    signature = inspect.signature(declared)
    return signature if "." in name else _without_self(signature)


def test_the_declaration_names_every_registered_operation_and_only_them() -> None:
    assert len(OPERATIONS) >= 50
    assert set(_declared()) == set(OPERATIONS)
    assert set(SHAPES) == set(OPERATIONS)


def test_the_store_module_defines_every_operation_its_protocol_declares() -> None:
    for name in _members(StoreOperations):
        assert getattr(store, name) is OPERATIONS[name], name
    assert client_operations.cancel_in is OPERATIONS["cancel_in"]
    assert store.Pruning.run_batch is OPERATIONS["Pruning.run_batch"]


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_declared_signature_is_the_functions(name: str) -> None:
    declared = _declared_signature(name, _declared()[name])
    actual = inspect.signature(OPERATIONS[name])
    assert declared == actual, f"{name}: declared {declared}, defined {actual}"
    parameters = list(actual.parameters.values())
    if "." in name:
        parameters = parameters[1:]
    first = parameters[0]
    assert (first.name, first.annotation) == ("conn", "Connection"), f"{name}: the connection comes first"


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_declared_shape_is_the_functions(name: str) -> None:
    declaration = store.operation_of(OPERATIONS[name])
    assert declaration is not None
    assert SHAPES[name] is declaration.shape, f"{name}: declared {SHAPES[name]}, decorated {declaration.shape}"


#: What the core's port may say differently from the store's declaration:
#: a read-only view of a result whose element type the core declares itself
#: (the core imports no store: ports.Settlement is a Protocol of the store's).
PORT_RESULT_VIEWS = {"settle_many": ("list[Settlement]", "Sequence[Settlement]")}

#: The port's members that are not operations: a classification of a
#: failure the core calls directly, never run on a connection.
PORT_HELPERS = {"transient_failure"}


def _port_differences(name: str, port: inspect.Signature, declared: inspect.Signature) -> list[str]:
    """How the core's port of an operation differs from its declaration,
    beyond what a port may: take positional-only what the store also takes by
    keyword (the core passes them by position), and spell a default ``...``
    (the core cannot name the store's defaults)."""
    found: list[str] = []
    port_parameters = list(port.parameters.values())
    declared_parameters = list(declared.parameters.values())
    if [p.name for p in port_parameters] != [p.name for p in declared_parameters]:
        return [f"parameters {[p.name for p in port_parameters]} != {[p.name for p in declared_parameters]}"]
    for asked, offered in zip(port_parameters, declared_parameters, strict=True):
        kind_ok = asked.kind == offered.kind or (
            asked.kind is inspect.Parameter.POSITIONAL_ONLY and offered.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        if not kind_ok:
            found.append(f"{asked.name}: kind {asked.kind.name} != {offered.kind.name}")
        if asked.annotation != offered.annotation:
            found.append(f"{asked.name}: annotation {asked.annotation} != {offered.annotation}")
        if (asked.default is inspect.Parameter.empty) != (offered.default is inspect.Parameter.empty):
            found.append(f"{asked.name}: default {asked.default!r} vs {offered.default!r}")
        elif asked.default is not inspect.Parameter.empty and asked.default is not Ellipsis:
            found.append(f"{asked.name}: the port's default must be ..., not {asked.default!r}")
    results = (declared.return_annotation, port.return_annotation)
    if results[0] != results[1] and PORT_RESULT_VIEWS.get(name) != results:
        found.append(f"result {port.return_annotation} != {declared.return_annotation}")
    return found


def test_the_cores_port_is_a_subset_of_the_declaration() -> None:
    port = _members(ports.Store)
    declared = _members(StoreOperations)
    assert set(port) >= PORT_HELPERS
    assert not PORT_HELPERS & set(OPERATIONS)
    missing = sorted(set(port) - PORT_HELPERS - set(declared))
    assert not missing, f"the core's port asks for operations the store does not declare: {missing}"
    differences = {
        name: found
        for name in sorted(set(port) - PORT_HELPERS)
        if (
            found := _port_differences(
                name, _without_self(inspect.signature(port[name])), _without_self(inspect.signature(declared[name]))
            )
        )
    }
    assert not differences, f"the core's port and the store's declaration differ: {differences}"


def test_a_port_that_drifts_from_the_declaration_is_reported() -> None:
    """The comparison can fail: a port asking for another parameter, a
    keyword the store takes by position, or another result is named."""

    class Drifted:
        def renew(self, conn: ports.Connection, claims: list[str], /, *, lease_ms: int) -> set[str]:
            return set()

        def read(self, conn: ports.Connection, /, *, job_id: str) -> ports.Settlement | None:
            return None

    renew = _port_differences(
        "renew",
        _without_self(inspect.signature(Drifted.renew)),
        _without_self(inspect.signature(StoreOperations.renew)),
    )
    assert renew == ["parameters ['conn', 'claims', 'lease_ms'] != ['conn', 'claims', 'lease_ms', 'now']"]
    read = _port_differences(
        "read",
        _without_self(inspect.signature(Drifted.read)),
        _without_self(inspect.signature(StoreOperations.read)),
    )
    assert read == [
        "conn: annotation ports.Connection != Connection",
        "job_id: kind KEYWORD_ONLY != POSITIONAL_OR_KEYWORD",
        "result ports.Settlement | None != JobView | None",
    ]


def test_a_declaration_that_drifts_from_its_function_is_unequal() -> None:
    """``inspect.Signature`` equality sees a changed default, kind or annotation."""

    def limit_changed(conn: Connection, *, limit: int = 999) -> int:
        return 0

    def limit_by_position(conn: Connection, limit: int = store.PROPAGATE_BATCH) -> int:
        return 0

    def limit_retyped(conn: Connection, *, limit: float = store.PROPAGATE_BATCH) -> int:
        return 0

    def as_declared(conn: Connection, *, limit: int = store.PROPAGATE_BATCH) -> int:
        return 0

    declared = _without_self(inspect.signature(StoreOperations.propagate))
    assert declared == inspect.signature(as_declared)
    for drifted in (limit_changed, limit_by_position, limit_retyped):
        assert declared != inspect.signature(drifted), drifted.__name__


def test_every_name_the_store_package_exports_exists() -> None:
    missing = [name for name in store.__all__ if not hasattr(store, name)]
    assert not missing, f"store.__all__ names what the package does not define: {missing}"
