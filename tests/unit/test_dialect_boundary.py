"""Every dialect difference lives in ``backends/`` (and the frozen revisions).

Outside those, no code branches on a dialect: no comparison with a dialect's
name, no call naming one, no dispatch table keyed or indexed by one, and no test of
``.dialect.name`` or ``get_backend_name()``. A difference is a
:class:`~sqlalchemy_watchdog.backends.Backend` attribute or method instead,
so a new dialect is a new backend module, not a hunt through the package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import sqlalchemy_watchdog

PACKAGE = Path(sqlalchemy_watchdog.__file__).parent
#: Where dialect differences belong (each a path under the package).
ALLOWED = ("backends", "migrations/versions")
DIALECT_NAMES = frozenset({"postgresql", "sqlite", "mysql", "mariadb"})


def _names_dialect(node: ast.AST) -> bool:
    """Whether ``node`` is a dialect name literal, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in DIALECT_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_dialect(element) for element in node.elts)
    return False


def _asks_dialect(node: ast.AST) -> bool:
    """Whether ``node`` itself reads ``<x>.dialect.name``, ``dialect.name`` or
    ``<x>.get_backend_name()`` -- not where it only hands one to a call
    (``backend_of(conn.dialect.name)``: the callee decides)."""
    if isinstance(node, ast.Attribute) and node.attr == "name":
        value = node.value
        if (isinstance(value, ast.Attribute) and value.attr == "dialect") or (
            isinstance(value, ast.Name) and value.id == "dialect"
        ):
            return True
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get_backend_name":
            return True
        return _asks_dialect(node.func)  # ``conn.dialect.name.startswith(...)``, not its arguments
    return any(_asks_dialect(child) for child in ast.iter_child_nodes(node))


def dialect_branches(source: str) -> Iterator[tuple[int, str]]:
    """``(line, what)`` for each place ``source`` branches on a dialect."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_names_dialect(operand) for operand in operands):
                yield node.lineno, "compares with a dialect name"
            elif _asks_dialect(node):
                yield node.lineno, "compares the dialect's name"
        elif isinstance(node, ast.Call):
            arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
            if any(_names_dialect(argument) for argument in arguments):
                yield node.lineno, "calls with a dialect name"
        elif isinstance(node, ast.Subscript):
            if _names_dialect(node.slice):
                yield node.lineno, "picks by a dialect name"
        elif isinstance(node, ast.Dict):
            if any(key is not None and _names_dialect(key) for key in node.keys):
                yield node.lineno, "keys a table by dialect name"
        elif isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            if _asks_dialect(node.test):
                yield node.lineno, "branches on the dialect's name"
        elif isinstance(node, ast.Match):
            if _asks_dialect(node.subject):
                yield node.lineno, "matches on the dialect's name"
        elif isinstance(node, ast.MatchValue) and _names_dialect(node.value):
            yield node.lineno, "matches a dialect name"


def _package_files() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not any(relative.startswith(f"{allowed}/") for allowed in ALLOWED):
            yield path


def test_no_module_outside_the_backends_branches_on_a_dialect() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent).as_posix()}:{line}: {what}"
        for path in _package_files()
        for line, what in dialect_branches(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "dialect branches outside backends/:\n" + "\n".join(found)


def test_the_walk_covers_the_package_but_not_the_backends() -> None:
    walked = {path.relative_to(PACKAGE).as_posix() for path in _package_files()}
    assert "model.py" in walked
    assert "store/limits.py" in walked
    assert "backends/postgresql.py" not in walked
    assert not any(name.startswith("migrations/versions/") for name in walked)


@pytest.mark.parametrize(
    "source",
    [
        'if conn.dialect.name == "postgresql":\n    pass',
        'x = 1 if dialect in ("postgresql", "sqlite") else 2',
        'if engine.dialect.name != "sqlite":\n    pass',
        'if url.get_backend_name() == "mysql":\n    pass',
        "if conn.dialect.name == NAME:\n    pass",
        "if url.get_backend_name() in SUPPORTED:\n    pass",
        "if not conn.dialect.name.startswith(PREFIX):\n    pass",
        'ok = "mariadb" not in names',
        'column = BigInteger().with_variant(Integer, "sqlite")',
        'check = check.ddl_if(dialect="sqlite")',
        'statement = sql.untold("sqlite")',
        'url = url.set(drivername="sqlite")',
        'TYPES = {"postgresql": 1, "sqlite": 2}',
        'backend = BACKENDS["sqlite"]',
        "match conn.dialect.name:\n    case _:\n        pass",
        'match name:\n    case "postgresql":\n        pass',
        "assert dialect.name",
    ],
)
def test_a_planted_dialect_branch_is_found(source: str) -> None:
    assert list(dialect_branches(source)) != [], source


@pytest.mark.parametrize(
    "source",
    [
        "backend = backend_of(conn)\nif backend.notifies:\n    pass",
        "statement = sql.set_limits(backend_of(conn))",
        "if backend_of(url.get_backend_name()).has_schemas:\n    pass",
        "if not listens(engine.dialect.name, engine.dialect.driver):\n    pass",
        'url = "postgresql+psycopg://app@db/app"',
        'key = f"{url.get_backend_name()}://{url.host}"',
        "name = conn.dialect.name",
        '"""Runs on postgresql and sqlite."""',
    ],
)
def test_code_that_asks_the_backend_is_not_a_branch(source: str) -> None:
    assert list(dialect_branches(source)) == [], source
