"""Dependencies between jobs: the edges table's triggers, what every dialect shares.

Internal module; see ``docs/design.md`` ("Dependencies"). Each backend
renders :func:`edge_triggers` in its own DDL (``Backend.trigger_sql``: a
PL/pgSQL function and a trigger on PostgreSQL, a trigger with its body on
SQLite); the store's side of dependencies is ``store/dependencies.py``.

A job enqueued with ``after=[...]`` is ``waiting`` with ``waiting_on`` = the
number of its parents not settled yet; one row of ``watchdog_job_edges``
(child, parent, outcome) per parent, ``outcome`` NULL until that parent's
settlement is counted.

* **A parent settles** (any statement moving it from ``delayed``,
  ``queued`` or ``running`` to ``settled``: a settle, a claim finding a
  cancellation, ``fail_lane``, recovery) or **is purged** (deleted while
  live): the trigger ``watchdog_jobs_parent_settled`` /
  ``watchdog_jobs_parent_deleted`` writes its outcome (``purged`` for a
  purge) on its uncounted edges, in the same statement's transaction.
* **An edge gets its outcome**: the trigger ``watchdog_job_edges_counted``
  updates the child, if it still waits: a parent that did not complete
  (with ``after_policy = 'completed'``) settles it ``cancelled`` with the
  reason ``parent <job_id> ended <outcome>``; otherwise ``waiting_on`` goes
  down by one, and the one update that finds it at 1 makes the child
  ``queued`` (``delayed`` if its own ``run_at`` is ahead). On PostgreSQL
  two parents settling at once update the child row one after the other
  (the second waits for the first's row lock, then re-reads the row: READ
  COMMITTED), so exactly one of them releases it.
* **A job settled while waiting** (a parent's cancellation, or ``cancel``)
  keeps ``waiting_on = 0``: its own dependents are not told in that
  transaction -- the parent trigger fires only for a job leaving a live
  state, so a cascade never recurses (SQLite's ``recursive_triggers`` is
  off by default, and a chain of 10,000 would overflow either database's
  trigger depth). A runner's pass (``store.propagate``) tells them, one hop
  per transaction, and clears the mark.
* **A job is deleted** (pruned when settled, purged when ``queued``,
  ``delayed`` or ``waiting``): its edges as a child go with it
  (``watchdog_jobs_child_pruned``, for a row of any state since revision
  w0014; before, for settled rows only, and a purged child left its edges
  behind). A ``waiting`` job purged tells its own dependents ``purged``, as
  a live parent does, and so does a job settled while waiting whose
  dependents were not told yet (w0014 added both to
  ``watchdog_jobs_parent_deleted``).

The triggers that fire on ``watchdog_jobs`` do so only for rows that can
have edges (revision w0013): a parent's only when it is ``watched`` (the
enqueue that gives a live job its first dependent marks it, under the lock
that makes the parent's settlement wait for that enqueue's commit), a
child's only when it has an ``after_policy`` (every job enqueued with
``after`` has one). A job without dependents or parents settles and is
pruned without running them: their cost is paid by the jobs that use them.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["EDGE_OUTCOMES", "TRIGGER_NAMES", "Trigger", "edge_triggers"]

#: What an edge may record: a parent's outcome, or ``purged``.
EDGE_OUTCOMES = ("completed", "failed", "cancelled", "outcome_unknown", "interrupted", "purged")

_LIVE = "('delayed', 'queued', 'running')"
#: A job whose deletion counts for its dependents as a parent's end (``purged``).
_UNSETTLED = "('delayed', 'queued', 'running', 'waiting')"

#: The statements of the release, by name; ``{clock}`` is the dialect's clock.
_COUNT_EDGE = """\
UPDATE watchdog_jobs SET
    state = CASE
        WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed' THEN 'settled'
        WHEN waiting_on > 1 THEN 'waiting'
        WHEN ready_at > {clock} THEN 'delayed'
        ELSE 'queued' END,
    outcome = CASE WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed' THEN 'cancelled' END,
    failure_reason = CASE WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed'
        THEN 'parent ' || {parent} || ' ended ' || {parent_outcome} ELSE failure_reason END,
    settled_at = CASE WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed' THEN {clock} END,
    waiting_on = CASE
        WHEN {parent_outcome} <> 'completed' AND after_policy = 'completed' THEN 0
        WHEN waiting_on > 1 THEN waiting_on - 1 END
WHERE job_id = {child} AND state = 'waiting'"""
_SETTLE_EDGES = "UPDATE watchdog_job_edges SET outcome = {outcome} WHERE parent = {job_id} AND outcome IS NULL"
_FORGET_CHILD = "DELETE FROM watchdog_job_edges WHERE child = {job_id}"

TRIGGER_NAMES = (
    "watchdog_jobs_parent_settled",
    "watchdog_jobs_parent_deleted",
    "watchdog_jobs_child_pruned",
    "watchdog_job_edges_counted",
)


class Trigger(NamedTuple):
    """One trigger of the edges, whatever the dialect: each backend writes it
    in its own DDL."""

    #: The trigger's name (and on PostgreSQL its function's).
    name: str
    #: When it fires, e.g. ``AFTER DELETE ON watchdog_jobs``.
    event: str
    #: The condition (on ``NEW``/``OLD``) under which it runs.
    when: str
    #: The one statement it runs.
    body: str


def edge_triggers(clock: str) -> tuple[Trigger, ...]:
    """The triggers of :data:`TRIGGER_NAMES`, ``clock`` being the dialect's
    clock SQL (``Backend.clock_ms_sql()``)."""
    count = _COUNT_EDGE.format(parent_outcome="NEW.outcome", parent="NEW.parent", child="NEW.child", clock=clock)
    settled = _SETTLE_EDGES.format(outcome="NEW.outcome", job_id="NEW.job_id")
    purged = _SETTLE_EDGES.format(outcome="'purged'", job_id="OLD.job_id")
    pruned = _FORGET_CHILD.format(job_id="OLD.job_id")
    return (
        Trigger("watchdog_jobs_parent_settled", "AFTER UPDATE OF state ON watchdog_jobs",
                f"NEW.state = 'settled' AND OLD.state IN {_LIVE} AND NEW.watched = 1", settled),
        # Revision w0014: a waiting job too (purge deletes them), and a job
        # settled while waiting whose dependents are not told yet (SQLite's
        # DELETE also removes a row its own statement's trigger settled).
        Trigger("watchdog_jobs_parent_deleted", "AFTER DELETE ON watchdog_jobs",
                f"OLD.watched = 1 AND (OLD.state IN {_UNSETTLED} OR OLD.waiting_on = 0)", purged),
        # Revision w0014: a deleted job of any state (a purged one left its edges).
        Trigger("watchdog_jobs_child_pruned", "AFTER DELETE ON watchdog_jobs", "OLD.after_policy IS NOT NULL", pruned),
        Trigger("watchdog_job_edges_counted", "AFTER UPDATE OF outcome ON watchdog_job_edges",
                "OLD.outcome IS NULL AND NEW.outcome IS NOT NULL", count),
    )  # fmt: skip
