"""The runner's one clock."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..errors import InvalidJob

if TYPE_CHECKING:
    pass

log = logging.getLogger("sqlalchemy_watchdog.runner")

T = TypeVar("T")


def check_clock(clock: object) -> Callable[[], int]:
    """Refuse a runner ``clock`` that cannot be called."""
    if not callable(clock):
        raise InvalidJob("clock", f"must be a callable returning epoch milliseconds, not {type(clock).__name__}")
    return clock
