"""Operation declarations: a store function's transaction shape as data.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .base import (
    F,
)

log = logging.getLogger("sqlalchemy_watchdog.store")


# -- operation declarations ----------------------------------------------------------


class Shape(enum.Enum):
    """A store operation's transaction shape, declared with :func:`operation`."""

    #: Reads only. Where reads do not block the writer (SQLite in WAL mode)
    #: it never takes the write lock up front, so a polling runner does not
    #: queue for the lock behind the application's writes only to look.
    READ = "read"
    #: Writes, each statement correct and atomic on its own (one conditional
    #: write, plus reads): runs in autocommit where the backend is
    #: self-committing (PostgreSQL: one round trip instead of three), else in
    #: a write transaction (SQLite: ``BEGIN IMMEDIATE``).
    WRITE = "write"
    #: Needs a transaction of its own everywhere, even where the other
    #: operations run in autocommit: its statements hold a transaction-scoped
    #: lock across several statements, or must commit together.
    TRANSACTION = "transaction"


@dataclass(frozen=True)
class Operation:
    """What :func:`transact_as` needs to know about a store function.

    ``autocommit_if(*args, **kwargs)``: for a :attr:`Shape.WRITE` operation
    that is one statement only for some arguments (an enqueue of more than
    one chunk is not), whether this call is. ``peek(conn, *args, **kwargs)``:
    the look-before-lock -- where reads do not block the writer, a read
    without the write lock that returns the operation's result when there
    is nothing to do (so the operation need not queue for the lock), or
    None to run it.
    """

    shape: Shape
    autocommit_if: Callable[..., bool] | None = None
    peek: Callable[..., Any] | None = None


#: What an undeclared function passed to :func:`transact_as` runs as: the
#: test suite's and the fault tools' ad-hoc functions write. The gateways
#: refuse undeclared functions (see :func:`declared`).
UNDECLARED = Operation(Shape.WRITE)

_OPERATION_ATTRIBUTE = "__watchdog_operation__"

#: Every function declared with :func:`operation` inside this package, by
#: qualified name (``claim``, ``Pruning.run_batch``), in declaration order:
#: what the backend conformance suite (tests/backends) must cover, one test
#: at least per name. Functions declared elsewhere (an application's, a
#: test's) are declared all the same but not listed.
OPERATIONS: dict[str, Callable[..., Any]] = {}
_PACKAGE = __name__.split(".", 1)[0]


def operation(
    shape: Shape,
    *,
    autocommit_if: Callable[..., bool] | None = None,
    peek: Callable[..., Any] | None = None,
) -> Callable[[F], F]:
    """Declare a store function's transaction shape (see :class:`Operation`).

    Returns the very function, its type unchanged: callers keep typing it as
    ``Callable[Concatenate[Connection, P], R]``. A method may be declared
    too (its bound methods carry the declaration).
    """
    declaration = Operation(shape, autocommit_if, peek)

    def declare(fn: F) -> F:
        setattr(fn, _OPERATION_ATTRIBUTE, declaration)
        module = getattr(fn, "__module__", "") or ""
        if module == _PACKAGE or module.startswith(_PACKAGE + "."):
            OPERATIONS[fn.__qualname__] = fn
        return fn

    return declare


def operation_of(fn: Callable[..., Any]) -> Operation | None:
    """``fn``'s declaration, or None if it has none."""
    found = getattr(fn, _OPERATION_ATTRIBUTE, None)
    return found if isinstance(found, Operation) else None


def declared(fn: Callable[..., Any]) -> Operation:
    """``fn``'s declaration; a TypeError if it has none (what the gateways
    check: every store operation says how it runs)."""
    found = operation_of(fn)
    if found is None:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(f"{name} is not a declared store operation (decorate it with @store.operation)")
    return found
