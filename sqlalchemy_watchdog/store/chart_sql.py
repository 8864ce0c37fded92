"""The statements of :mod:`.chart`: the dashboard's settled-per-minute chart.

Internal module: its names may change in any release."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Select,
    func,
    literal_column,
    select,
)

from ..jobs import Outcome
from .sql import (
    IS_SETTLED,
    _p,
    c,
)


@cache
def settled_per_minute() -> Select[Any]:
    """Per queue, outcome and minute: jobs settled since ``:since`` (epoch
    milliseconds), the minute counted from ``:since`` (0 is the oldest).
    Like :func:`recent_outcomes`, one range of ``ix_watchdog_jobs_settled``
    per outcome."""
    since = _p("since", BigInteger())
    minute = ((c.settled_at - since) // literal_column("60000", BigInteger())).label("minute")
    every_outcome = c.outcome.in_([literal_column(f"'{o.value}'") for o in Outcome])
    return (
        select(c.queue_name, c.outcome, minute, func.count())
        .where(IS_SETTLED, every_outcome, c.settled_at >= since)
        .group_by(c.queue_name, c.outcome, minute)
    )
