"""Fast construction of frozen dataclasses, for the values made per job.

A frozen dataclass's own ``__init__`` sets each field through
``object.__setattr__``; the runner builds a :class:`~sqlalchemy_watchdog.JobView`
per claimed row and batch enqueue builds thousands of
:class:`~sqlalchemy_watchdog.Job`, so both are built here instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

__all__ = ["frozen_builder", "slot_setters"]

_T = TypeVar("_T")


def slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[Any, Any], None], ...]:
    """The setters of a frozen slots dataclass's fields, in ``names`` order,
    which must name all its fields in their declared order (else TypeError).

    For building instances on a hot path: a frozen dataclass's own ``__init__``
    sets each field through ``object.__setattr__``, several times slower than
    the slot's setter. Whoever uses them must set every field."""
    declared = tuple(f.name for f in fields(cls))
    if declared != names:
        raise TypeError(f"{cls.__name__} has the fields {declared}, not {names}")
    return tuple(cls.__dict__[name].__set__ for name in names)


def frozen_builder(cls: type[_T], names: tuple[str, ...]) -> Callable[..., _T]:
    """A function ``build(*values)`` making an instance of the frozen
    dataclass ``cls`` with its fields ``names`` (all of them, in declared
    order, else TypeError) set to ``values``, without ``__init__``: no
    defaults, no ``__post_init__``, so whoever calls it passes values the
    class's own checks would accept.

    For the instances the runner makes per job (a :class:`JobView` per
    claimed row). A frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, and even the slots' own setters are a call per
    field: 2.5 us for a ``JobView``. The builder is generated code (as
    dataclasses generate ``__init__``) that assigns each field on an
    instance of a private subclass with the plain ``__setattr__`` -- for a
    slots class one specialised bytecode per field, no call -- then sets its
    ``__class__`` to ``cls`` (the same layout: the subclass adds no slot and
    no ``__dict__``): 0.4 us. What it returns is a plain, frozen ``cls``.
    A dataclass without slots has its ``__dict__`` filled in one update."""
    declared = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    if declared != names:
        raise TypeError(f"{cls.__name__} has the fields {declared}, not {names}")
    params = ", ".join(f"v{i}" for i in range(len(names)))
    if "__slots__" in cls.__dict__:
        open_twin = type(
            f"_Building{cls.__name__}",
            (cls,),
            # Both plain: CPython then gives the twin the generic set-attribute
            # slot, which STORE_ATTR specialises for slots; with either of the
            # dataclass's own left, every assignment calls through it.
            {"__slots__": (), "__setattr__": object.__setattr__, "__delattr__": object.__delattr__},
        )
        assign = "".join(f"    made.{name} = v{i}\n" for i, name in enumerate(names))
        source = f"def build({params}):\n    made = new(open_twin)\n{assign}    made.__class__ = cls\n    return made\n"
        namespace: dict[str, Any] = {"new": object.__new__, "open_twin": open_twin, "cls": cls}
    else:  # the fields live in the instance's __dict__: set it whole
        assign = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
        source = f"def build({params}):\n    made = new(cls)\n    made.__dict__.update({{{assign}}})\n    return made\n"
        namespace = {"new": object.__new__, "cls": cls}
    exec(source, namespace)  # generated from the dataclass's own field names
    build: Callable[..., _T] = namespace["build"]
    return build
