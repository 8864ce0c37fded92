"""The dashboard's chart.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection

from ..jobs import (
    THROUGHPUT_MINUTES,
    Outcome,
    Throughput,
    at_epoch_ms,
)
from . import chart_sql, maintenance_sql
from .operation import Shape, operation

log = logging.getLogger("sqlalchemy_watchdog.store")


# -- the dashboard's chart --------------------------------------------------------


@operation(Shape.READ)
def throughput(conn: Connection) -> Throughput:
    """Jobs settled in each minute of the last hour (database clock), by
    queue and outcome: O(jobs settled in the last hour), like :func:`stats`."""
    clock = conn.execute(maintenance_sql.stats_clock()).scalar_one()
    since = clock - THROUGHPUT_MINUTES * 60_000
    counts: dict[str, dict[Outcome, list[int]]] = {}
    for queue, outcome, minute, count in conn.execute(chart_sql.settled_per_minute(), {"since": since}):
        # A job settled after the clock was read lands in the last minute.
        index = min(max(int(minute), 0), THROUGHPUT_MINUTES - 1)
        per_outcome = counts.setdefault(queue, {})
        per_outcome.setdefault(Outcome(outcome), [0] * THROUGHPUT_MINUTES)[index] += int(count)
    return Throughput(
        at_epoch_ms(clock),
        {
            queue: {outcome: tuple(per_outcome[outcome]) for outcome in Outcome if outcome in per_outcome}
            for queue, per_outcome in sorted(counts.items())
        },
    )
