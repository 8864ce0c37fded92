"""Dependencies: telling the dependents of jobs settled while waiting, and
reading a job's parents, dependents and their results.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring and
:mod:`sqlalchemy_watchdog.dependencies`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Connection

from ..backends import backend_of
from ..jobs import JOB_ID_MAX_LENGTH, JobState, Outcome, Undecodable, check_text, payload_of
from ..records import PROPAGATE_BATCH as PROPAGATE_BATCH
from ..records import ParentResult as ParentResult
from . import dependencies_sql
from .operation import Shape, operation


def _untold_peek(conn: Connection, *, limit: int = PROPAGATE_BATCH) -> int | None:
    """0 when no job waits to have its dependents told (read without the
    write lock); None to propagate."""
    # The pick without its lock.
    return (
        0
        if conn.execute(dependencies_sql.untold(backend_of(conn), locked=False), {"limit": 1}).first() is None
        else None
    )


@operation(Shape.WRITE, peek=_untold_peek)
def propagate(conn: Connection, *, limit: int = PROPAGATE_BATCH) -> int:
    """Tell the dependents of up to ``limit`` jobs settled while waiting (a
    parent's cancellation reached them, or ``cancel``): their edges get the
    outcome, which the edges trigger counts -- settling those dependents
    ``cancelled`` in turn where their policy says so (the next call tells
    theirs: one hop per transaction). Returns how many jobs were told."""
    rows = conn.execute(dependencies_sql.untold(backend_of(conn)), {"limit": limit}).all()
    for job_id, outcome in rows:
        conn.execute(dependencies_sql.tell_dependents(), {"job": job_id, "outcome": outcome})
    if rows:
        conn.execute(dependencies_sql.told(), {"job_ids": [row[0] for row in rows]})
    return len(rows)


def tell(conn: Connection, ended: Iterable[tuple[str, str | None]]) -> None:
    """Tell the dependents of the jobs ``ended`` (``(job_id, outcome)``),
    which a statement of this transaction settled from a live state or
    deleted, that they ended so: their uncounted edges get the outcome, and
    the edges' trigger counts each for its child -- where the triggers on
    ``watchdog_jobs`` do not do it themselves
    (``Backend.triggers_tell_dependents`` is false: MariaDB/MySQL); else
    nothing. Jobs settled from ``waiting`` are not passed: as with the
    triggers, a runner's pass (:func:`propagate`) tells theirs."""
    if backend_of(conn).triggers_tell_dependents:
        return
    by_outcome: dict[str | None, list[str]] = {}
    for job_id, outcome in ended:
        by_outcome.setdefault(outcome, []).append(job_id)
    for outcome, parents in sorted(by_outcome.items(), key=lambda item: item[0] or ""):
        for start in range(0, len(parents), 1000):
            conn.execute(
                dependencies_sql.tell_parents(), {"parents": sorted(parents[start : start + 1000]), "outcome": outcome}
            )


def count_settled_parents(conn: Connection, children: Sequence[str]) -> None:
    """Record the outcome of every parent already settled on the uncounted
    edges of ``children`` (see :func:`dependencies_sql.count_settled_parents`);
    where the store tells the edges itself, the settled parents are read
    first, then told (a statement that fires the edges' trigger reads no
    ``watchdog_jobs``: MariaDB, error 1442)."""
    if backend_of(conn).triggers_tell_dependents:
        conn.execute(dependencies_sql.count_settled_parents(), {"children": list(children)})
        return
    settled = conn.execute(dependencies_sql.settled_parents(), {"children": list(children)})
    tell(conn, [(row[0], row[1]) for row in settled])


@operation(Shape.READ)
def relations(conn: Connection, job_id: str) -> tuple[tuple[tuple[str, str | None], ...], tuple[str, ...]]:
    """The job's parents (each with the outcome counted for it) and its dependents."""
    parents = tuple((row[0], row[1]) for row in conn.execute(dependencies_sql.parents_of(), {"job": job_id}))
    dependents = tuple(conn.execute(dependencies_sql.dependents_of(), {"job": job_id}).scalars())
    return parents, dependents


@operation(Shape.READ)
def parent_results(conn: Connection, job_id: str) -> tuple[ParentResult, ...]:
    """The parents of ``job_id`` with their outcomes and results, by parent job_id."""
    check_text("job_id", job_id, JOB_ID_MAX_LENGTH)
    found: list[ParentResult] = []
    for parent, state, outcome, result_json in conn.execute(dependencies_sql.parent_results(), {"job": job_id}):
        try:
            result = None if result_json is None else payload_of(result_json)
        except Exception as error:
            result = Undecodable.of("result", "result_json", error)
        found.append(
            ParentResult(
                parent,
                None if state is None else JobState(state),
                None if outcome is None else Outcome(outcome),
                result,
            )
        )
    return tuple(found)


@operation(Shape.READ)
def waiting_for(
    conn: Connection, queues: Sequence[str], limit: int = 10
) -> dict[str, list[tuple[str, str | None, str | None]]]:
    """FOR TESTS ONLY (:func:`sqlalchemy_watchdog.testing.drain`): up to
    ``limit`` waiting jobs of ``queues``, oldest first, each with the parents
    it still waits for as (parent, its queue, its state); queue and state
    are None for a parent that is gone."""
    if not queues:
        return {}
    found: dict[str, list[tuple[str, str | None, str | None]]] = {}
    for job_id, parent, queue, state in conn.execute(
        dependencies_sql.waiting_for(), {"queues": list(queues), "limit": limit}
    ):
        found.setdefault(job_id, []).append((parent, queue, state))
    return found
