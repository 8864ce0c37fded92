"""The statements of :mod:`.dependencies` (the store feature, revision w0012):
parents, edges, telling dependents, waiting jobs.

Internal module: its names may change in any release."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    Insert,
    Integer,
    Select,
    Text,
    Update,
    and_,
    bindparam,
    exists,
    literal_column,
    null,
    select,
    true,
    update,
)

from ..backends import Backend
from .sql import (
    _QUEUES,
    _SETTLED,
    IS_WAITING,
    Fields,
    _insert_into,
    _p,
    _rows,
    c,
    edges,
    t,
)


@cache
def waiting_for() -> Select[Any]:
    """FOR TESTS ONLY (:func:`sqlalchemy_watchdog.testing.drain`): up to
    ``:limit`` waiting jobs of the expanding ``:queues`` (read in
    ``ix_watchdog_jobs_waiting``), each with every parent it still waits
    for (an edge whose outcome is not counted yet): job_id, the parent, the
    parent's queue and state (both NULL: the parent row is gone)."""
    waiting = (
        select(c.job_id, c.sequence)
        .where(IS_WAITING, c.queue_name.in_(_QUEUES))
        .order_by(c.sequence)
        .limit(_p("limit", Integer()))
        .subquery()
    )
    parent = t.alias("parent")
    return (
        select(waiting.c.job_id, edges.c.parent, parent.c.queue_name, parent.c.state)
        .select_from(
            waiting.join(edges, edges.c.child == waiting.c.job_id).outerjoin(parent, parent.c.job_id == edges.c.parent)
        )
        .where(edges.c.outcome.is_(None))
        .order_by(waiting.c.sequence, edges.c.parent)
    )


@cache
def read_parents() -> Select[Any]:
    """The state and outcome of the stored jobs among ``:job_ids`` (parents
    named by an enqueue), locked ``FOR NO KEY UPDATE`` on PostgreSQL (the
    lock :func:`watch_parents` takes next, so two enqueues naming one parent
    take turns rather than deadlock upgrading a shared lock): a parent's
    settlement waits for the enqueue to commit, then finds it watched and
    counts the new edge (SQLite's one writer orders them already)."""
    return (
        select(c.job_id, c.state, c.outcome)
        .where(c.job_id.in_(bindparam("job_ids", expanding=True)))
        .with_for_update(key_share=True)
    )


@cache
def watch_parents() -> Update:
    """Mark the live jobs among ``:job_ids`` ``watched`` (revision w0013):
    they have dependents now, so their settlement's trigger must count the
    edges. Jobs marked already, and settled ones, are left as they are."""
    return (
        update(t)
        .where(c.job_id.in_(bindparam("job_ids", expanding=True)), c.state != _SETTLED, c.watched.is_(None))
        .values(watched=1)
    )


@cache
def count_settled_parents() -> Update:
    """Record the outcome of every parent already settled on the uncounted
    edges of the children ``:children`` (the edges trigger counts each).

    An enqueue's read of its parents can be older than a settlement that
    committed before the enqueue's first write -- a caller's SQLite
    transaction reads outside ``BEGIN IMMEDIATE`` -- so it counted such a
    parent as pending and no trigger will tell it. Run after the edges are
    written (the write lock held, on SQLite the snapshot is the newest);
    nothing to do in the usual case."""
    settled = and_(c.job_id == edges.c.parent, c.state == _SETTLED)
    return (
        update(edges)
        .where(
            edges.c.child.in_(bindparam("children", expanding=True)),
            edges.c.outcome.is_(None),
            exists().where(settled),
        )
        .values(outcome=select(c.outcome).where(settled).scalar_subquery())
    )


EDGE_FIELDS: Fields = (("child", Text()), ("parent", Text()), ("outcome", Text()))


@cache
def insert_edges(backend: Backend) -> Insert:
    """Insert dependency rows (``:edges``, rows of :data:`EDGE_FIELDS`); an
    existing (child, parent) is left as it is (``ON CONFLICT DO NOTHING``;
    MariaDB/MySQL: ``ON DUPLICATE KEY UPDATE child = child``, the edges'
    only unique key -- not ``INSERT IGNORE``, which would also let a row
    its CHECKs refuse through as a warning)."""
    source, cols, order = _rows(backend, "edges", EDGE_FIELDS)
    rows = select(cols["child"], cols["parent"], cols["outcome"]).select_from(source).where(true()).order_by(order)
    insert: Any = _insert_into(backend, edges).from_select(["child", "parent", "outcome"], rows)
    if not backend.writes_return_rows:  # no ON CONFLICT
        kept: Insert = backend.upsert(insert, [edges.c.child, edges.c.parent], lambda _new: {"child": edges.c.child})
        return kept
    stmt: Insert = insert.on_conflict_do_nothing(index_elements=[edges.c.child, edges.c.parent])
    return stmt


@cache
def untold(backend: Backend, *, locked: bool = True) -> Select[Any]:
    """Up to ``:limit`` jobs settled while waiting whose dependents are not
    told yet (``waiting_on = 0``), oldest first; when ``locked``, locked,
    skipping locked ones, where rows lock (``Backend.skip_locked``)."""
    pick = (
        select(c.job_id, c.outcome)
        .where(c.waiting_on == literal_column("0"))
        .order_by(c.sequence)
        .limit(_p("limit", Integer()))
    )
    return backend.skip_locked(pick) if locked else pick


@cache
def tell_dependents() -> Update:
    """Record ``:outcome`` on the uncounted edges of parent ``:job`` (the
    edges trigger then counts each for its child)."""
    return (
        update(edges)
        .where(edges.c.parent == _p("job", Text()), edges.c.outcome.is_(None))
        .values(outcome=_p("outcome", Text()))
    )


@cache
def tell_parents() -> Update:
    """Record ``:outcome`` on the uncounted edges of the parents among the
    expanding ``:parents`` (the edges trigger counts each for its child):
    what the parent triggers do where a trigger may write the edges
    (``Backend.triggers_tell_dependents``); elsewhere the store runs this
    after the statement that settled or deleted them. It reads no other
    table, so the edges' trigger may write ``watchdog_jobs`` (MariaDB,
    error 1442)."""
    return (
        update(edges)
        .where(edges.c.parent.in_(bindparam("parents", expanding=True)), edges.c.outcome.is_(None))
        .values(outcome=_p("outcome", Text()))
    )


@cache
def settled_parents() -> Select[Any]:
    """The settled parents, with their outcomes, of the uncounted edges of
    the children ``:children``: what :func:`count_settled_parents` counts,
    read first where the edges' trigger may not write a table the statement
    that fired it reads (MariaDB: then :func:`tell_parents`)."""
    return (
        select(edges.c.parent, c.outcome)
        .select_from(edges.join(t, c.job_id == edges.c.parent))
        .where(
            edges.c.child.in_(bindparam("children", expanding=True)),
            edges.c.outcome.is_(None),
            c.state == _SETTLED,
        )
        .distinct()
    )


@cache
def told() -> Update:
    """Clear the mark of ``:job_ids``, whose dependents were told."""
    return (
        update(t)
        .where(c.job_id.in_(bindparam("job_ids", expanding=True)), c.waiting_on == literal_column("0"))
        .values(waiting_on=null())
    )


@cache
def parents_of_children() -> Select[Any]:
    """(child, parent) of every edge whose child is among ``:job_ids``."""
    return select(edges.c.child, edges.c.parent).where(edges.c.child.in_(bindparam("job_ids", expanding=True)))


@cache
def parents_of() -> Select[Any]:
    """The parents of ``:job`` and, per parent, the outcome counted (NULL: not settled yet)."""
    return select(edges.c.parent, edges.c.outcome).where(edges.c.child == _p("job", Text())).order_by(edges.c.parent)


@cache
def dependents_of() -> Select[Any]:
    """The jobs that wait (or waited) for ``:job``."""
    return select(edges.c.child).where(edges.c.parent == _p("job", Text())).order_by(edges.c.child)


@cache
def parent_results() -> Select[Any]:
    """Each parent of ``:job`` with its outcome and result, as stored now."""
    return (
        select(edges.c.parent, c.state, c.outcome, c.result_json)
        .select_from(edges.outerjoin(t, c.job_id == edges.c.parent))
        .where(edges.c.child == _p("job", Text()))
        .order_by(edges.c.parent)
    )
