"""The package's layers hold: what ``lint-imports`` checks, run by plain pytest too.

The contracts live in pyproject.toml (``[tool.importlinter]``) and
docs/design.md ("Layers") says what each layer is: the runner's core imports
no database -- neither SQLAlchemy nor the store, the statements, the model or
the backends -- and names what it needs in its ports (``core/ports.py``),
which the store's module fills; every module imports only the layers below
its own. ``python3 dev.py test`` runs ``lint-imports`` before mypy; these
tests make a plain ``pytest`` run catch a broken contract too, and show the
contracts can break. Every import counts: TYPE_CHECKING and function-local
ones as much as the module's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import grimp
import pytest

from sqlalchemy_watchdog import store
from sqlalchemy_watchdog.core.ports import Store

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGE = "sqlalchemy_watchdog"


def lint_imports(cwd: Path, *, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = None if path is None else {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_layer_contracts_are_kept() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    kept = len(contracts["contracts"])
    assert kept >= 3 and f"Contracts: {kept} kept, 0 broken." in done.stdout, done.stdout


def test_a_core_that_imports_the_store_breaks_its_contract_and_the_layers(tmp_path: Path) -> None:
    """The contracts are not vacuous: the same check over a copy of the
    package whose core imports the store (and through it SQLAlchemy) fails,
    naming the import."""
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    steps = tmp_path / PACKAGE / "core" / "steps.py"
    text = steps.read_text(encoding="utf-8")
    anchor = "from ..errors import WatchdogError\n"
    assert anchor in text
    steps.write_text(text.replace(anchor, anchor + "from ..store import claim  # noqa: F401\n"), encoding="utf-8")
    done = lint_imports(tmp_path, path=str(tmp_path))
    assert done.returncode != 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())  # as one line, however the report wraps
    assert "The runner's core imports no database (it declares its ports in core/ports.py) BROKEN" in said
    assert "Layers: a module imports only from the layers below its own BROKEN" in said
    assert "The vocabulary (values, no I/O) imports no database KEPT" in said
    assert "sqlalchemy_watchdog.core.steps -> sqlalchemy_watchdog.store" in said


def _circles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The import graph's strongly connected components of more than one
    module (Tarjan's algorithm, iterative)."""
    modules = sorted(graph.modules)
    edges = {module: sorted(graph.find_modules_directly_imported_by(module)) for module in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            module, i = work.pop()
            if i == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            targets = edges[module]
            if i < len(targets):
                work.append((module, i + 1))
                target = targets[i]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            if low[module] == index[module]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
    return found


def test_no_module_imports_itself_through_a_circle() -> None:
    """No circle of imports among the package's modules, type-only and
    function-local imports included (the layers contract sees circles
    between layers; this sees them inside one too)."""
    circles = _circles(grimp.build_graph(PACKAGE, cache_dir=None))
    assert circles == [], [sorted(c) for c in circles]


def test_the_circle_finder_finds_a_type_only_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")  # as a TYPE_CHECKING import would
    graph.add_import(importer="p.c", imported="p.a")
    assert _circles(graph) == [frozenset({"p.a", "p.b"})]


def _port_operations() -> list[str]:
    return [name for name in Store.__dict__ if not name.startswith("_") and callable(getattr(Store, name))]


@pytest.mark.parametrize("name", _port_operations())
def test_each_operation_of_the_cores_port_is_a_declared_store_operation(name: str) -> None:
    """The drivers fill the core's port with the store module (mypy checks
    the signatures where they do); each operation a step can name says how
    a driver runs it -- its transaction shape -- as every store call must."""
    filled = getattr(store, name)
    if name == "transient_failure":  # called by the core itself, not through a step
        assert store.operation_of(filled) is None
        return
    assert store.declared(filled).shape in set(store.Shape)
    hints = typing.get_type_hints(getattr(Store, name))
    assert hints["conn"] is typing.Any, "the core never sees the driver's connection type"
