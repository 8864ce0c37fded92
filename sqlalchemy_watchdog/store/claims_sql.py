"""The statements of :mod:`.claims`: the reads of a job and of the queue head,
promotion, the claim, and the claim life cycle after it (settle, renew,
start, progress, release, cancel, notify) and recovery (reconcile).

Internal module: its names may change in any release."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    BindParameter,
    Float,
    Integer,
    Select,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    not_,
    null,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from ..backends import Backend
from ..jobs import Outcome
from ..model import (
    job_steps_table,
    limits_table,
)
from ..wakeups import CHANNEL, EVENT_QUEUED, WAITING_LOCK
from .sql import (
    _DELAYED,
    _QUEUED,
    _QUEUES,
    _RUNNING,
    _SETTLED,
    _WAITING,
    CLAIM_ORDER,
    COLUMNS,
    IS_DELAYED,
    IS_LIVE,
    IS_QUEUED,
    IS_RUNNING,
    IS_RUNNING_UNINDEXED,
    IS_SETTLED,
    NOW,
    UNLIMITED,
    UNPAUSED,
    _p,
    batch_size,
    c,
    db_clock_ms,
    effective_now,
    pauses,
    t,
)

#: The keys (``sequence``) of the jobs a pick locked, as an expanding
#: parameter: the write by key where a write returns no rows.
_KEYS: BindParameter[Any] = bindparam("keys", expanding=True)


@cache
def read_job() -> Select[Any]:
    return select(*COLUMNS).where(c.job_id == _p("job"))


@cache
def read_queue_head() -> Select[Any]:
    """The queue's running job, else its next queued one, else its next delayed one."""
    return (
        select(*COLUMNS)
        .where(c.queue_name == _p("queue"), IS_LIVE)
        .order_by(case((IS_RUNNING, 0), (IS_QUEUED, 1), else_=2), c.priority.desc(), c.sequence)
        .limit(1)
    )


@cache
def read_settled() -> Select[Any]:
    return (
        select(*COLUMNS)
        .where(IS_SETTLED, c.sequence > _p("after_sequence"))
        .order_by(c.sequence)
        .limit(_p("limit", Integer()))
    )


@cache
def has_pending_work() -> Select[Any]:
    """A live job's queue, if any: the first entry of
    ``ix_watchdog_jobs_live_queue`` (an unordered EXISTS was planned as a scan
    that reads the whole settled history when no job is live)."""
    return select(c.queue_name).where(IS_LIVE).order_by(c.queue_name).limit(1)


@cache
def any_queued(filtered: bool) -> Select[Any]:
    """A queued job's ``sequence``, if any (of the expanding ``:queues`` when
    ``filtered``): whether a claim would find anything."""
    # IS_LIVE repeats ix_watchdog_jobs_live_queue's predicate: SQLite uses a
    # partial index only for a query whose WHERE has its terms.
    pick = select(c.sequence).where(IS_QUEUED, UNPAUSED, IS_LIVE)
    if filtered:
        pick = pick.where(c.queue_name.in_(_QUEUES))
    return pick.limit(1)


@cache
def count_ready() -> Select[Any]:
    """How many queued jobs of the expanding ``:queues`` wait, up to ``:cap``
    (a runner's summary: a bounded read of ``ix_watchdog_jobs_live_queue``)."""
    pick = select(c.sequence).where(IS_QUEUED, IS_LIVE, c.queue_name.in_(_QUEUES)).limit(_p("cap", Integer()))
    return select(func.count()).select_from(pick.subquery())


@cache
def next_ready() -> Select[Any]:
    """The earliest ready time of any delayed job, and the database clock."""
    return select(
        select(c.ready_at).where(IS_DELAYED).order_by(c.ready_at).limit(1).scalar_subquery(),
        db_clock_ms(),
    )


@cache
def promote(backend: Backend) -> Update:
    """Make up to ``:limit`` delayed jobs whose time has come (by the
    database clock) ``queued``, earliest first; they keep their ``sequence``,
    so among ready jobs the order stays priority, then admission.

    Promotion is the only way out of ``delayed`` besides a cancellation or a
    lane failure; it is idempotent, and two runners promoting at once skip
    each other's rows (PostgreSQL) or take turns (SQLite's one writer).
    """
    target = backend.picked(c.sequence, _due(), "due")
    return update(t).where(target, IS_DELAYED).values(state=_QUEUED).returning(c.sequence)


def _due() -> Select[Any]:
    """Up to ``:limit`` delayed jobs whose time has come, earliest first."""
    return (
        select(c.sequence)
        .where(IS_DELAYED, c.ready_at <= db_clock_ms())
        .order_by(c.ready_at, c.sequence)
        .limit(_p("limit", Integer()))
    )


@cache
def promote_pick(backend: Backend) -> Select[Any]:
    """:func:`promote`'s rows, locked, skipping rows another promoter holds:
    where a write returns no rows, the store runs it, then
    :func:`promote_by_key` on what it returned."""
    return backend.skip_locked(_due())


@cache
def promote_by_key() -> Update:
    """:func:`promote`'s write of the delayed jobs among ``:keys``."""
    return update(t).where(c.sequence.in_(_KEYS), IS_DELAYED).values(state=_QUEUED)


def _addressed(backend: Backend) -> list[ColumnElement[Any]]:
    """The row's address as column ``row`` where the backend has one (see
    ``Backend.row_address``), for a pick a write then reaches by address."""
    address = backend.row_address
    return [] if address is None else [literal_column(f"watchdog_jobs.{address}").label("row")]


def _queue_pick(backend: Backend, index: int, limit: BindParameter[Any], *more: str) -> Select[Any]:
    """The ``sequence``, the row's address where the backend has one
    (:func:`_addressed`) and the ``more`` columns of up to ``limit`` of queue
    ``:queue_<index>``'s queued jobs in claim order, read in that order in
    ``ix_watchdog_jobs_live_queue``; on PostgreSQL locked, skipping rows
    another claimer holds."""
    # IN (:queue_0), which PostgreSQL reads as an equality in the index (with
    # = ANY(array) it read another index filtered, past other queues' jobs).
    queue = _p(f"queue_{index}", Text())
    # The pause check names the parameter, not the column: a condition of no
    # row, checked once before the index is read, so a paused queue's backlog
    # is never walked (on the column it was a filter on every row read).
    unpaused = queue.not_in(select(pauses.c.queue_name).scalar_subquery())
    # The same for limits (revision w0011): a limited queue's jobs are the
    # limited claim's, never this statement's.
    unlimited = queue.not_in(select(limits_table.c.queue_name).scalar_subquery())
    pick = select(c.sequence, *_addressed(backend), *(c[name] for name in more)).where(
        IS_QUEUED, unpaused, unlimited, c.queue_name.in_([queue])
    )
    if backend.repeats_partial_predicates:
        pick = pick.where(IS_LIVE)
    return backend.skip_locked(pick.order_by(*CLAIM_ORDER).limit(limit))


@cache
def claim(backend: Backend, queue_count: int | None, sized: bool = False, ahead: bool = False) -> Update:
    """Take up to ``:limit`` of the best queued jobs (of the ``queue_count``
    queues ``:queue_0``, ``:queue_1``, ...; of every queue when None) for
    ``:lease_ms``, each under its own claim token ``:token.<sequence>``, so
    a settle or renew of one job of the batch cannot name another's claim.

    A job whose cancellation was recorded while it waited is settled
    ``cancelled`` instead of being run. Jobs of a paused queue are not
    taken (:data:`UNPAUSED`). On PostgreSQL the pick is a MATERIALIZED CTE
    that locks its rows and skips rows another claimer holds, so the
    planner can neither run a ``LIMIT`` subquery twice nor touch more rows
    than it locked; the locked rows are still queued when the update
    reaches them, so the update goes to them by their address alone
    (``ctid``; by key on SQLite, where the key is the rowid).

    One bind parameter per queue (not an expanding ``IN``): the text of the
    statement is fixed for a runner's queues, so the store can send it
    precompiled and the driver prepares it once (see ``store.execute_rows``).

    ``sized`` writes ``:limit`` (1 to :data:`LITERAL_LIMIT_MAX`) into the
    text at each execution (:func:`batch_size`). A prepared statement's generic plan does
    not know a ``LIMIT $n``: PostgreSQL estimates it at a tenth of the queued
    rows, so the generic plan of a deep queue looked many times dearer than
    the custom ones and the claim was planned again at every execution (about
    a quarter of its server time). With the number in the text the generic
    plan costs what the custom ones do, and it is kept -- until a statement
    turns slow on a grown table (``store.views._replan_if_slow``).
    """
    pick = claim_pick(backend, queue_count, sized)
    # The picks lock their rows already (skip_locked), and the update reaches
    # them by address where the backend has one (TID scans on PostgreSQL):
    # joined to a pick of a constant number of rows, one TID scan per row in
    # every plan; as an array with `LIMIT :limit` (joined, the generic plan of
    # a queue holding most of the table hash-joined a scan of the whole table:
    # 7 ms a claim at 20,000 jobs, against 0.3). By sequence, a generic plan
    # made on a young table never analysed scanned it whole (1 ms a claim at
    # 9,000 rows, growing).
    target = backend.picked(
        c.sequence, pick, "ready", skip_locked=False, as_array=True, joined=sized, recheck=IS_QUEUED
    )
    return _claim_update(target, ahead)


@cache
def claim_pick(backend: Backend, queue_count: int | None, sized: bool = False) -> Select[Any]:
    """The rows :func:`claim` takes (their ``sequence`` first): up to
    ``:limit`` queued jobs in claim order, each queue read in the order of
    ``ix_watchdog_jobs_live_queue`` and locked, skipping rows another
    claimer holds. Where a write returns no rows (MariaDB/MySQL) the store
    runs it alone, then :func:`claim_by_key` on what it returned (see
    ``store.claims.claim``)."""
    limit = batch_size("limit") if sized else _p("limit", Integer())
    pick: Select[Any]
    if queue_count is None:
        # Every queue: every queued job sorted (no index holds them all in claim
        # order). Runners always name their queues; this serves tests and tools.
        pick = backend.skip_locked(
            select(c.sequence, *_addressed(backend))
            .where(IS_QUEUED, UNPAUSED, UNLIMITED)
            .order_by(*CLAIM_ORDER)
            .limit(limit)
        )
    elif queue_count < 1:
        raise ValueError("queue_count: at least 1")
    elif queue_count == 1:
        pick = _queue_pick(backend, 0, limit)
    else:
        # Several queues: the best `limit` of each queue (each read in claim
        # order in ix_watchdog_jobs_live_queue and, on PostgreSQL, locked), and
        # of those the best `limit`. The rows locked and not taken are free again
        # when the claim commits. No index holds the queued jobs of all queues in
        # claim order (it would cost every enqueue an entry), and one that did
        # made a claim read past the backlogs of queues it does not serve.
        each = [
            _queue_pick(backend, index, limit, "priority").subquery(f"queue_{index}") for index in range(queue_count)
        ]
        best = union_all(*(select(part) for part in each)).subquery("queues")
        # The sequence and the row's address (where the backend has one); the priority only orders.
        taken = [column for column in best.c if column.key != "priority"]
        pick = select(*taken).order_by(best.c.priority.desc(), best.c.sequence).limit(limit)
    return pick


@cache
def claim_by_key(ahead: bool = False) -> Update:
    """:func:`claim`'s write of the rows whose ``sequence`` is among
    ``:keys`` and still queued (the guard, though the pick locked them),
    returning nothing: for a backend whose writes return no rows, after
    :func:`claim_pick` locked them; :func:`read_by_key` reads them back."""
    return _claim_update(and_(c.sequence.in_(_KEYS), IS_QUEUED), ahead, returning=False)


@cache
def queued_queues() -> Select[Any]:
    """The queues that have a queued job (read in ``ix_watchdog_jobs_live_queue``):
    a claim of every queue where a write returns no rows claims these by
    name, each read in its index's order, since no index holds every
    queue's jobs in claim order -- a locking read sorting them locks every
    queued job it sorts, and a concurrent claimer then finds none free."""
    return select(c.queue_name).where(IS_QUEUED).distinct()


@cache
def read_by_key() -> Select[Any]:
    """The jobs whose ``sequence`` is among ``:keys``, every column a
    claim returns (what a write returned where writes return rows)."""
    return select(*COLUMNS).where(c.sequence.in_(_KEYS))


def _claim_update(target: ColumnElement[bool], ahead: bool = False, *, returning: bool = True) -> Update:
    """The claim's UPDATE of the rows ``target`` selects (shared by
    :func:`claim` and :func:`claim_limited`): each runnable job running under
    its own token ``:token.<sequence>`` for ``:lease_ms`` -- with ``ahead``
    marked ``unstarted`` (claimed ahead of the runner's free slots) --; a
    job with a recorded cancellation settled ``cancelled`` instead.
    ``returning``: every column of the rows written (else none)."""
    runnable = c.cancellation_id.is_(None)
    clock = db_clock_ms()
    stmt = (
        update(t)
        .where(target)
        .values(
            started_at=case((runnable, clock), else_=c.started_at),
            settled_at=case((runnable, null()), else_=clock),
            # Settled cancelled here: a retried job's last failure is not its end.
            failure_reason=case((runnable, c.failure_reason), else_=null()),
            failure_detail=case((runnable, c.failure_detail), else_=null()),
            state=case((runnable, _RUNNING), else_=_SETTLED),
            outcome=case((runnable, null()), else_=Outcome.CANCELLED.value),
            # Each job its own token: the statement's random token and the row's key.
            claim_token=case((runnable, _p("token", Text()) + "." + cast(c.sequence, Text)), else_=null()),
            lease_until=case((runnable, db_clock_ms() + _p("lease_ms", BigInteger())), else_=null()),
        )
        # Revision w0019: a claim ahead of the runner's free slots marks its
        # jobs (their handlers not started until the runner's start() clears
        # it); any other claim leaves the column as a queued job has it, NULL.
        .values(**({"unstarted": case((runnable, 1), else_=null())} if ahead else {}))
    )
    return stmt.returning(*COLUMNS) if returning else stmt


def _settle_values(
    cols: dict[str, Any], cancelled: ColumnElement[bool], requeue: ColumnElement[bool], snooze: Any, delay: Any
) -> dict[str, Any]:
    """The settle's SET clause, on the table's columns (:func:`settle` adapts them to its alias)."""
    return dict(
        state=case(
            (requeue, case((delay > 0, _DELAYED), else_=_QUEUED)),
            else_=_SETTLED,
        ),
        outcome=case((cancelled, Outcome.CANCELLED.value), (requeue, null()), else_=cols["outcome"]),
        claim_token=case((requeue, null()), else_=c.claim_token),
        ready_at=case((requeue, db_clock_ms() + delay), else_=c.ready_at),
        attempt=c.attempt + case((requeue, cols["attempt_add"]), else_=0),
        snoozes=c.snoozes + case((requeue, cols["snooze_add"]), else_=0),
        # A snooze keeps the last failure's reason; anything else records its own.
        failure_reason=case((cancelled, null()), (snooze, c.failure_reason), else_=cols["reason"]),
        failure_detail=case((cancelled, null()), (snooze, c.failure_detail), else_=cols["detail"]),
        failure_history=case((cancelled, c.failure_history), else_=func.coalesce(cols["history"], c.failure_history)),
        settled_at=case((requeue, null()), else_=db_clock_ms()),
        lease_until=null(),
        unstarted=null(),
        # Kept only by the completion itself: a cancellation or a requeue drops it.
        result_json=case((cancelled, null()), (requeue, null()), else_=cols["result"]),
        # A requeue starts the next run from nothing; a settle keeps the
        # attempt's last progress, the one it carries if the rate limit held it.
        progress=case((requeue, null()), else_=func.coalesce(cols["progress"], c.progress)),
        progress_note=case(
            (requeue, null()), (cols["progress"].is_not(None), cols["progress_note"]), else_=c.progress_note
        ),
    )


@cache
def settle_unreadable() -> Update:
    """Settle ``failed`` with ``:why`` the job a claim just took
    (``:key``, its ``sequence``, and ``:token``) whose stored text is not UTF-8 (SQLite:
    a producer wrote the bytes; its ``job_id`` may not even read back as it is
    stored, so the row is found by its key and its claim)."""
    return (
        update(t)
        .where(c.sequence == _p("key", BigInteger()), c.claim_token == _p("token", Text()), IS_RUNNING)
        .values(
            state=_SETTLED,
            outcome=Outcome.FAILED.value,
            failure_reason=_p("why", Text()),
            failure_detail=null(),
            settled_at=db_clock_ms(),
            lease_until=null(),
            unstarted=null(),
        )
        .returning(*COLUMNS)
    )


_CLAIMS: BindParameter[Any] = bindparam("claims", expanding=True)


@cache
def renew() -> Update:
    """Extend the leases of exact, live, uncancelled ``:claims`` ``(job_id, token)``.

    The claims not returned have been lost (lease ended, cancellation
    recorded, lane failed or job settled elsewhere).
    """
    return (
        update(t)
        .where(
            tuple_(c.job_id, c.claim_token).in_(_CLAIMS),
            IS_RUNNING,
            c.lease_until > effective_now(NOW),
            c.cancellation_id.is_(None),
        )
        .values(lease_until=db_clock_ms() + _p("lease_ms", BigInteger()))
        .returning(c.job_id, c.claim_token)
    )


@cache
def start() -> Update:
    """Record that the handlers of exact, live, uncancelled ``:claims``
    ``(job_id, token)`` are about to start (revision w0019): their
    ``unstarted`` mark is cleared and their lease renewed, in one statement
    for every job a runner is about to start at that moment.

    Guarded as :func:`renew` (the exact token, a lease alive by
    ``max(:now, database clock)``, no cancellation recorded): a claim not
    returned was lost, and its handler must not start.
    """
    return (
        update(t)
        .where(
            tuple_(c.job_id, c.claim_token).in_(_CLAIMS),
            IS_RUNNING,
            c.lease_until > effective_now(NOW),
            c.cancellation_id.is_(None),
        )
        .values(lease_until=db_clock_ms() + _p("lease_ms", BigInteger()), unstarted=null())
        .returning(c.job_id, c.claim_token)
    )


@cache
def progress() -> Update:
    """Record ``:fraction`` and ``:note`` as the progress of the exact, live
    claim ``:job`` / ``:token`` (guarded like :func:`renew`, by the lease on
    ``max(:now, database clock)``); ``RETURNING job_id`` says it was."""
    return (
        update(t)
        .where(
            c.job_id == _p("job", Text()),
            c.claim_token == _p("token", Text()),
            IS_RUNNING_UNINDEXED,
            c.lease_until > effective_now(NOW),
        )
        .values(progress=_p("fraction", Float()), progress_note=_p("note", Text()))
        .returning(c.job_id)
    )


@cache
def release() -> Update:
    """End the leases of exact ``:claims`` now, for a runner shutting down.

    The jobs stay ``running``; the next recovery pass handles them at once
    instead of after a whole lease.
    """
    return (
        update(t)
        .where(tuple_(c.job_id, c.claim_token).in_(_CLAIMS), IS_RUNNING)
        .values(lease_until=db_clock_ms() - 1)
        .returning(c.job_id)
    )


@cache
def cancel(only_if_queued: bool) -> Update:
    """Record ``:cancellation`` on live job ``:job`` (``only_if_queued``: one
    that has not started: queued or delayed)."""
    not_started = c.state.in_([literal_column(f"'{_DELAYED}'"), literal_column(f"'{_QUEUED}'")])
    # Revision w0012: a job waiting for its parents is settled cancelled at
    # once (nothing would claim it before its parents settle); its own
    # dependents are told by a runner's pass (waiting_on = 0, see propagate).
    waiting = c.state == literal_column(f"'{_WAITING}'")
    return (
        update(t)
        .where(
            c.job_id == _p("job"),
            c.cancellation_id.is_(None),
            or_(not_started if only_if_queued else IS_LIVE, waiting),
        )
        # In this order, state last: MariaDB assigns one column after the
        # other, each expression reading the row as the earlier ones left it,
        # and the others read the state the job had.
        .ordered_values(
            (c.cancellation_id, _p("cancellation", Text())),
            (c.outcome, case((waiting, Outcome.CANCELLED.value), else_=c.outcome)),
            (c.settled_at, case((waiting, db_clock_ms()), else_=c.settled_at)),
            (c.waiting_on, case((waiting, 0), else_=c.waiting_on)),
            # A delayed job is made queued, so the next claim settles it
            # cancelled instead of it waiting for its time.
            (c.state, case((IS_DELAYED, _QUEUED), (waiting, _SETTLED), else_=c.state)),
        )
        .returning(c.job_id)
    )


@cache
def cancellation_holder() -> Select[Any]:
    """The job_id whose cancellation has ``:cancellation``, if any."""
    return select(c.job_id).where(c.cancellation_id == _p("cancellation"))


@cache
def notify_room() -> Select[Any]:
    """Room freed in a limited queue: ``pg_notify`` of ``queued`` while a runner
    waits for work, by the protocol of the enqueue trigger (the waiting lock,
    see :mod:`sqlalchemy_watchdog.wakeups`): the shared lock taken when no
    runner waits, so none can start waiting before this transaction ends."""
    waits = not_(func.pg_try_advisory_xact_lock_shared(WAITING_LOCK[0], WAITING_LOCK[1]))
    return select(case((waits, func.pg_notify(CHANNEL, EVENT_QUEUED)), else_=null()))


@cache
def notify() -> Select[Any]:
    """``pg_notify`` of ``:event``; PostgreSQL folds identical notifications of one transaction."""
    return select(func.pg_notify(CHANNEL, _p("event", Text())))


@cache
def expired_claims() -> Select[Any]:
    """Up to ``:limit`` running jobs whose lease has ended by the database
    clock, earliest first."""
    return (
        select(*COLUMNS)
        .where(IS_RUNNING, c.lease_until <= db_clock_ms())
        .order_by(c.lease_until, c.sequence)
        .limit(_p("limit", Integer()))
    )


@cache
def next_lease_expiry() -> Select[Any]:
    """The earliest lease of any running job, and the database clock."""
    return select(
        select(c.lease_until).where(IS_RUNNING).order_by(c.lease_until).limit(1).scalar_subquery(),
        db_clock_ms(),
    )


@cache
def reconcile_steps() -> Select[Any]:
    """Whether the disappeared claim ``:job`` / ``:token`` was started (not
    marked ``unstarted``), whether its job has a recorded step (kind
    ``step``) and whether it has the compensation marker ``:mark`` -- what
    decides a compensating requeue (revision w0022). Neither can change
    while the lease is over: steps and starts are written only under a live
    lease, the marker only by the recovery that wins the row."""
    steps = job_steps_table.c
    stepped = select(literal_column("1")).where(steps.job_sequence == c.sequence, steps.kind == "step").exists()
    marked = (
        select(literal_column("1")).where(steps.job_sequence == c.sequence, steps.name == _p("mark", Text())).exists()
    )
    started: Any = c.unstarted.is_(None)
    return select(started, stepped, marked).where(c.job_id == _p("job", Text()), c.claim_token == _p("token", Text()))


@cache
def reconcile(requeue: bool, compensate: bool = False) -> Update:
    """Requeue (or settle ``interrupted`` with ``:reason``) the disappeared
    claim ``:job`` / ``:token`` / ``:count``, if nobody
    else got there first.

    ``compensate`` (with ``requeue`` False; the recoverer read the job's
    steps first, :func:`reconcile_steps`): the job is requeued instead of
    settled ``interrupted``, keeping ``:reason``, no recovery counted, for one
    run that compensates (revision w0022); the store writes the marker in the
    same transaction.

    Conditional on the same token, the same recovery count and a lease
    ended by the database clock, so of two recoverers only one wins, and a
    claim that was renewed or settled meanwhile is left alone. A recorded
    cancellation settles the job ``cancelled`` instead. A job still marked
    ``unstarted`` (claimed ahead, its handler never called) is requeued in
    either form, its recovery count and failure fields unchanged.
    """
    uncancelled = c.cancellation_id.is_(None)
    # Revision w0019: a job claimed ahead whose handler never started goes
    # back to the queue as it was -- no recovery counted, its failure fields
    # kept (a retried job's last failure) -- whatever the budget.
    unstarted = and_(uncancelled, c.unstarted.is_not(None))
    if requeue:
        values: dict[str, Any] = dict(
            state=case((uncancelled, _QUEUED), else_=_SETTLED),
            outcome=case((uncancelled, null()), else_=Outcome.CANCELLED.value),
            claim_token=case((uncancelled, null()), else_=c.claim_token),
            recovery_count=c.recovery_count + case((unstarted, 0), (uncancelled, 1), else_=0),
            failure_reason=case((unstarted, c.failure_reason), else_=null()),
            failure_detail=case((unstarted, c.failure_detail), else_=null()),
            settled_at=case((uncancelled, null()), else_=db_clock_ms()),
        )
    elif compensate:
        # Revision w0022: the recoverer found a started job with recorded steps
        # and no compensation marker (reconcile_steps): it goes back to the
        # queue once, for a run that runs its undos -- its reason kept, no
        # recovery counted (recovery_count stays within its budget).
        values = dict(
            state=case((uncancelled, _QUEUED), else_=_SETTLED),
            outcome=case((uncancelled, null()), else_=Outcome.CANCELLED.value),
            claim_token=case((uncancelled, null()), else_=c.claim_token),
            failure_reason=case((unstarted, c.failure_reason), (uncancelled, _p("reason", Text())), else_=null()),
            failure_detail=case((unstarted, c.failure_detail), else_=null()),
            settled_at=case((uncancelled, null()), else_=db_clock_ms()),
        )
    else:
        values = dict(
            state=case((unstarted, _QUEUED), else_=_SETTLED),
            outcome=case((unstarted, null()), (uncancelled, Outcome.INTERRUPTED.value), else_=Outcome.CANCELLED.value),
            claim_token=case((unstarted, null()), else_=c.claim_token),
            failure_reason=case((unstarted, c.failure_reason), (uncancelled, _p("reason", Text())), else_=null()),
            failure_detail=case((unstarted, c.failure_detail), else_=null()),
            settled_at=case((unstarted, null()), else_=db_clock_ms()),
        )
    return (
        update(t)
        .where(
            c.job_id == _p("job"),
            IS_RUNNING,
            c.claim_token == _p("token"),
            c.recovery_count == _p("count"),
            c.lease_until <= db_clock_ms(),
        )
        .values(**values, lease_until=null(), unstarted=null())
        .returning(*COLUMNS)
    )
