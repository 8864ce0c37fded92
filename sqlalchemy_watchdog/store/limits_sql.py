"""The statements of :mod:`.limits`: flow control (revision w0011) -- the
limits, their usage, the keyed walk and the limited claim.

Internal module: its names may change in any release."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Delete,
    Insert,
    Integer,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    delete,
    false,
    func,
    insert,
    literal_column,
    not_,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.util import ClauseAdapter

from ..backends import Backend
from ..model import (
    KEYED_QUEUED,
    KEYED_RUNNING,
    limit_claims_table,
    limits_table,
)
from .claims_sql import (
    _claim_update,
    _settle_values,
)
from .sql import (
    _DELAYED,
    _QUEUED,
    _QUEUES,
    _RUNNING,
    _SETTLED,
    _WAITING,
    CLAIM_ORDER,
    COLUMNS,
    IS_LIVE,
    IS_QUEUED,
    IS_RUNNING,
    IS_RUNNING_UNINDEXED,
    NOW,
    SETTLE_FIELDS,
    _insert_into,
    _p,
    _rows,
    c,
    db_clock_ms,
    effective_now,
    pauses,
    t,
)

lim = limits_table.c
logged = limit_claims_table.c
_QUEUE = _p("queue", Text())
#: Literal predicates of the keyed partial indexes (model.KEYED_QUEUED,
#: model.KEYED_RUNNING), repeated by the statements that read them.
IS_KEYED = c.limit_key.is_not(None)
assert KEYED_QUEUED == "state = 'queued' AND limit_key IS NOT NULL"
assert KEYED_RUNNING == "state = 'running' AND limit_key IS NOT NULL"


@cache
def read_limits(filtered: bool) -> Select[Any]:
    """Every queue's limits (of the expanding ``:queues`` when ``filtered``), by name."""
    query = select(*limits_table.c).order_by(lim.queue_name)
    if filtered:
        query = query.where(lim.queue_name.in_(_QUEUES))
    return query


@cache
def lock_limits(backend: Backend) -> Select[Any]:
    """Queue ``:queue``'s limits, its row locked until the transaction ends
    (PostgreSQL ``FOR UPDATE``; SQLite's write lock is held already): the
    limited claimers of one queue take turns, and each one's next statement
    sees every claim committed before it. ``has_queued``: whether the queue
    had a queued job when the statement started (a hint, from the snapshot
    before the lock: a claim that finds none ends there, as a claim racing
    an enqueue may miss it anyway)."""
    queued = select(c.sequence).where(c.queue_name == _QUEUE, IS_QUEUED)
    if backend.repeats_partial_predicates:
        queued = queued.where(IS_LIVE)
    has_queued = queued.limit(1).exists().label("has_queued")
    query = select(*limits_table.c, has_queued).where(lim.queue_name == _QUEUE)
    if backend.locks_before_reading:
        # The lock is held already, so this statement's counts are exact: what
        # limit_usage reads, with the queue's own rate period, in the same
        # statement (clock, running, rate_used, paused).
        query = query.add_columns(*_usage(backend, func.coalesce(lim.rate_period_ms, 0)))
    return backend.locked(query)


def _usage(backend: Backend, period: ColumnElement[Any]) -> list[ColumnElement[Any]]:
    """The database clock, queue ``:queue``'s running jobs, the jobs its limited
    claims started after ``clock - period`` (none when ``period`` is 0), and
    whether it is paused (1) or not (0), labelled as :func:`limit_usage` returns them."""
    clock = db_clock_ms()
    running = select(func.count()).where(c.queue_name == _QUEUE, IS_RUNNING)
    if backend.repeats_partial_predicates:
        running = running.where(IS_LIVE)
    used = select(func.coalesce(func.sum(logged.jobs), 0)).where(
        logged.queue_name == _QUEUE, logged.claimed_at > clock - period
    )
    paused = select(func.count()).where(pauses.c.queue_name == _QUEUE)
    return [
        clock.label("clock"),
        running.scalar_subquery().label("running"),
        used.scalar_subquery().label("rate_used"),
        paused.scalar_subquery().label("paused"),
    ]


@cache
def limit_usage(backend: Backend) -> Select[Any]:
    """The database clock, queue ``:queue``'s running jobs, the jobs its
    limited claims started after ``clock - :period_ms`` (0 when ``:period_ms``
    is 0), and whether it is paused (1) or not (0): what a limited claim has
    room for. Run after :func:`lock_limits`,
    as a statement of its own, so its snapshot is taken after the lock
    (where the backend locks before reading, :func:`lock_limits` reads them itself)."""
    return select(*_usage(backend, _p("period_ms", BigInteger())))


def _next_key(after: ColumnElement[Any] | None) -> ColumnElement[Any]:
    """The smallest key of queue ``:queue``'s queued jobs above ``after``
    (None: the smallest of all): the first entry of a range of
    ``ix_watchdog_jobs_keyed_queued``."""
    query = select(c.limit_key).where(c.queue_name == _QUEUE, IS_QUEUED, IS_KEYED)
    if after is not None:
        query = query.where(c.limit_key > after)
    return query.order_by(c.limit_key).limit(1).scalar_subquery()


def _key_running(key: ColumnElement[Any], *within: Any) -> ColumnElement[Any]:
    """The running jobs of key ``key`` of queue ``:queue``, counted in
    ``within``'s rows (one range of ``ix_watchdog_jobs_keyed_running``)."""
    return (
        select(func.count())
        .where(c.queue_name == _QUEUE, IS_RUNNING, IS_KEYED, c.limit_key == key)
        .correlate(*within)
        .scalar_subquery()
    )


@cache
def walk_keys(counted: bool = False) -> Select[Any]:
    """Up to ``:walk`` keys of queue ``:queue``'s queued jobs, ascending from
    the first above ``:after``: a skip scan, one index probe per key
    (``WITH RECURSIVE``: each key the next above the previous one), so the
    cost is O(walk · log n) whatever the backlog of each key. ``counted``:
    each key with its running jobs (what :func:`keys_running` counts), in
    the same statement."""
    walk = select(_next_key(_p("after", Text())).label("key"), literal_column("1", Integer()).label("step")).cte(
        "walk", recursive=True
    )
    step = select(_next_key(walk.c.key), walk.c.step + 1).where(
        walk.c.key.is_not(None), walk.c.step < _p("walk", Integer())
    )
    walk = walk.union_all(step)
    columns = [walk.c.key, _key_running(walk.c.key, walk)] if counted else [walk.c.key]
    return select(*columns).where(walk.c.key.is_not(None)).order_by(walk.c.step)


@cache
def keys_running() -> Select[Any]:
    """Running jobs per key of queue ``:queue``, for the expanding ``:keys``
    (``ix_watchdog_jobs_keyed_running``)."""
    return (
        select(c.limit_key, func.count())
        .where(c.queue_name == _QUEUE, IS_RUNNING, IS_KEYED, c.limit_key.in_(bindparam("keys", expanding=True)))
        .group_by(c.limit_key)
    )


@cache
def keys_rate_used(filtered: bool) -> Select[Any]:
    """The jobs queue ``:queue``'s limited claims started per key after
    ``:since`` (database clock), of the expanding ``:keys`` when
    ``filtered`` (else of every key): what a per-key rate leaves, one range of
    ``ix_watchdog_limit_claims_keyed`` per key."""
    query = select(logged.limit_key, func.sum(logged.jobs)).where(
        logged.queue_name == _QUEUE, logged.limit_key.is_not(None), logged.claimed_at > _p("since", BigInteger())
    )
    if filtered:
        query = query.where(logged.limit_key.in_(bindparam("keys", expanding=True)))
    return query.group_by(logged.limit_key)


#: How far the unkeyed group's pick reads a limited queue's head (in claim
#: order, keyed jobs included) for unkeyed jobs, beyond the jobs it takes.
UNKEYED_SCAN = 256


@cache
def key_picks(backend: Backend, parts: int) -> Select[Any]:
    """The candidates of a limited claim, ``(sequence, priority, part)``:
    for each part ``i`` below ``parts`` the best ``:n_<i>`` queued jobs of
    key ``:key_<i>`` of queue ``:queue`` (one range of
    ``ix_watchdog_jobs_keyed_queued`` each; a NULL key matches nothing), and
    as part -1 up to ``:unkeyed_n`` unkeyed jobs among the queue's first
    ``:unkeyed_scan`` queued jobs in claim order (``ix_watchdog_jobs_live_queue``)."""
    head = select(c.sequence, c.priority, c.limit_key).where(c.queue_name == _QUEUE, IS_QUEUED)
    if backend.repeats_partial_predicates:
        head = head.where(IS_LIVE)
    scanned = head.order_by(*CLAIM_ORDER).limit(_p("unkeyed_scan", Integer())).subquery("head")
    unkeyed = (
        select(scanned.c.sequence, scanned.c.priority, literal_column("-1", Integer()).label("part"))
        .where(scanned.c.limit_key.is_(None))
        .limit(_p("unkeyed_n", Integer()))
        .subquery("unkeyed")
    )
    selects = [select(unkeyed.c.sequence, unkeyed.c.priority, unkeyed.c.part)]
    for index in range(parts):
        key = _p(f"key_{index}", Text())
        # The key as a range of one value, ordered by the whole index: with
        # `limit_key = ?` and statistics of about one job per key, SQLite sorted
        # each key's jobs in a temporary b-tree -- a pager with its own page
        # cache, allocated and freed per key per claim, which glibc's heap
        # trimming could turn into ~35 us of page faults each. As a range the
        # index's order is the order asked for, whatever the statistics.
        part = (
            select(c.sequence, c.priority, literal_column(str(index), Integer()).label("part"))
            .where(c.queue_name == _QUEUE, IS_QUEUED, IS_KEYED, c.limit_key >= key, c.limit_key <= key)
            .order_by(c.limit_key, *CLAIM_ORDER)
            .limit(_p(f"n_{index}", Integer()))
            .subquery(f"key_{index}")
        )
        selects.append(select(part.c.sequence, part.c.priority, part.c.part))
    return select(union_all(*selects).subquery("candidates"))


@cache
def claim_limited(parts: int, ahead: bool = False) -> Update:
    """Claim the queued jobs among ``:s_0`` ... ``:s_<parts - 1>`` (a limited
    claim's pick, made under the queue's lock; NULL pads a shorter pick), as
    :func:`claim` does. One parameter each, not an expanding ``IN``: the
    statement is compiled once per size (see :func:`_parts` in the store)
    and sent as it is, like the other hot statements."""
    if parts < 1:
        raise ValueError("parts: at least 1")
    picked = c.sequence.in_([_p(f"s_{index}", BigInteger()) for index in range(parts)])
    return _claim_update(and_(picked, IS_QUEUED), ahead)


#: Rate-log rows a claim deletes at most (the queue's rows out of the window).
FORGET_BATCH = 1000
#: Keys a one-statement limited claim walks at most in each direction, and
#: the rotation order of its unkeyed entry (after every key walked above the
#: cursor, before every key walked from the start).
FAST_WALK_MAX = 256


@cache
def claim_limited_at_once(mark_ahead: bool = False) -> Select[Any]:
    """The whole limited claim of queue ``:queue`` in one statement
    (PostgreSQL, autocommit): its limits row locked, the room, the fair walk
    and pick, the claim of up to ``:limit`` jobs (``:token``, ``:lease_ms``),
    the cursor moved and the rate logged -- what :func:`lock_limits`,
    :func:`limit_usage`, :func:`walk_keys`, :func:`keys_running`,
    :func:`key_picks`, :func:`claim_limited`, :func:`move_cursor`,
    :func:`log_claim` and :func:`forget_claims` do in a transaction, with the
    same result, in one round trip.

    Rows: ``(go, held, *COLUMNS)``, one per claimed job, or one row of NULL
    columns when none was claimed; no row at all when the queue has no
    limits. ``held``: a limit holds the queue back -- more jobs were queued
    than taken, and fewer were taken than asked or the claim used up the
    queue's room (room frees only when one of its running jobs ends). ``go``
    false: the statement changed nothing and the caller must claim by the
    transaction instead, because

    * its snapshot is older than the lock: the limits row it locked is not the
      version its snapshot sees (``ctid``), so a claim committed in between
      (every claim that takes jobs writes that row) -- its counts could be
      stale. Under READ COMMITTED a statement reads with the snapshot it began
      with, even after waiting for a lock; the check makes that wait visible.
      When the versions agree, every claim committed before the lock was
      granted is in the snapshot, and no other can commit until this
      statement ends: the counts are exact.
    * its bounded walk (:data:`FAST_WALK_MAX` keys each way, and ``2 · room +
      8`` above the cursor, as the transaction's first segment) found fewer
      entries with a job than the room and did not reach the end of the
      rotation: the transaction walks further.

    Otherwise the pick is the transaction's: the rotation (keys above the
    cursor, the unkeyed entry, keys from the start up to the cursor), each
    entry's first jobs in claim order (a key's up to its per-key room), ranked
    by position within the entry and then the entry's place in the rotation.
    """
    queue = _QUEUE
    version: ColumnElement[Any] = literal_column("watchdog_limits.ctid")
    seen = select(version.label("version")).where(lim.queue_name == queue).cte("seen")
    locked = (
        select(*limits_table.c, version.label("version"))
        .where(lim.queue_name == queue)
        .with_for_update()
        .cte("locked")
        .prefix_with("MATERIALIZED")
    )
    clock = db_clock_ms()
    running = select(func.count()).where(c.queue_name == queue, IS_RUNNING).scalar_subquery()
    used = (
        select(func.coalesce(func.sum(logged.jobs), 0))
        .where(logged.queue_name == queue, logged.claimed_at > clock - locked.c.rate_period_ms)
        .scalar_subquery()
    )
    paused = select(pauses.c.queue_name).where(pauses.c.queue_name == queue).exists()
    fresh = (locked.c.version == select(seen.c.version).scalar_subquery()).label("fresh")
    asked = _p("limit", Integer())
    room = func.least(
        asked,
        func.coalesce(locked.c.concurrency - running, asked),
        func.coalesce(locked.c.rate_count - used, asked),
    )
    usage = (
        select(
            locked.c.cursor_key,
            locked.c.concurrency_per_key,
            locked.c.rate_count,
            locked.c.rate_period_ms,
            locked.c.rate_per_key_count,
            locked.c.rate_per_key_period_ms,
            clock.label("clock"),
            fresh,
            case((fresh, case((paused, 0), else_=func.greatest(room, 0))), else_=0).label("room"),
            # What the queue-wide limits leave (NULL: none set; LEAST skips NULLs).
            func.least(locked.c.concurrency - running, locked.c.rate_count - used).label("headroom"),
        )
        .select_from(locked)
        .cte("usage")
        .prefix_with("MATERIALIZED")
    )
    u = usage.c

    def take_of(key: ColumnElement[Any], *within: Any) -> ColumnElement[Any]:
        """How many of key ``key``'s jobs the claim may take (the room, its
        per-key room, its per-key rate left), counted in ``within``'s rows."""
        key_running = _key_running(key, *within)
        # A key's claims in its per-key window (ix_watchdog_limit_claims_keyed);
        # NULL (no per-key rate) leaves the take to the other limits.
        key_used = (
            select(func.coalesce(func.sum(logged.jobs), 0))
            .where(
                logged.queue_name == queue,
                logged.limit_key.is_not(None),
                logged.limit_key == key,
                logged.claimed_at > u.clock - u.rate_per_key_period_ms,
            )
            .correlate(*within, usage)
            .scalar_subquery()
        )
        # CASE, not COALESCE: a count whose limit is not set is not read at all
        # (PostgreSQL runs a subquery an arithmetic operand names, NULL or not).
        return func.greatest(
            0,
            func.least(
                u.room,
                case((u.concurrency_per_key.is_(None), u.room), else_=u.concurrency_per_key - key_running),
                case((u.rate_per_key_count.is_(None), u.room), else_=u.rate_per_key_count - key_used),
            ),
        )

    segment = func.least(u.room * 2 + 8, FAST_WALK_MAX)
    # Keys above the cursor, ascending, one index probe each (walk_keys' skip
    # scan); ``found``: the keys walked before this one that the claim may take
    # from. The walk stops once they fill the room: every job it takes is the
    # first of one of them (a key further on ranks after them all), so the
    # keys beyond change nothing but the work.
    walk = (
        select(
            _next_key(func.coalesce(u.cursor_key, "")).label("key"),
            literal_column("1", Integer()).label("step"),
            literal_column("0", Integer()).label("found"),
        )
        .where(u.room > 0)
        .cte("walk", recursive=True)
    )
    found_so_far = walk.c.found + case((take_of(walk.c.key, walk) > 0, 1), else_=0)
    walk = walk.union_all(
        select(_next_key(walk.c.key), walk.c.step + 1, found_so_far).where(
            walk.c.key.is_not(None), walk.c.step < segment, found_so_far < u.room
        )
    )
    # The walk ran out of keys above the cursor (not cut by its bound or the room).
    ended = select(walk.c.step).where(walk.c.key.is_(None)).exists()
    # Keys from the start up to the cursor (the rotation's wrap), once the walk above ended.
    wrap = (
        # No bound: with the literal '' PostgreSQL's custom plan read every key's entry and sorted them.
        select(_next_key(None).label("key"), literal_column("1", Integer()).label("step"))
        .where(u.room > 0, u.cursor_key.is_not(None), ended)
        .cte("wrap", recursive=True)
    )
    wrap = wrap.union_all(
        select(_next_key(wrap.c.key), wrap.c.step + 1).where(
            wrap.c.key.is_not(None), wrap.c.key < u.cursor_key, wrap.c.step < FAST_WALK_MAX
        )
    )
    wrap_cut = (
        select(func.count(wrap.c.key)).where(wrap.c.key < select(u.cursor_key).scalar_subquery()).scalar_subquery()
        >= FAST_WALK_MAX
    )
    unkeyed_at = FAST_WALK_MAX + 1
    # ``before``: the entries ahead of this one that the claim takes a first job
    # from (known for the walk's keys; 0, no bound, for the others).
    entries = union_all(
        select(walk.c.key, walk.c.step.label("ord"), walk.c.found.label("before")).where(walk.c.key.is_not(None)),
        select(null().label("key"), literal_column(str(unkeyed_at), Integer()), literal_column("0", Integer())).where(
            u.room > 0, ended
        ),
        select(wrap.c.key, wrap.c.step + unkeyed_at, literal_column("0", Integer())).where(
            wrap.c.key.is_not(None), wrap.c.key <= u.cursor_key
        ),
    ).cte("entries")
    e = entries.c
    # Each entry with what the limits let it take (evaluated once per entry).
    sized = (
        select(e.key, e.ord, e.before, take_of(e.key, entries).label("take"))
        .select_from(entries.join(usage, true()))
        .cte("sized")
        .prefix_with("MATERIALIZED")
    )
    z = sized.c
    # Keys the claim may take from: each has a queued job (the walk found it),
    # so at least this many entries have a first job to rank.
    ahead = select(func.count()).select_from(sized).where(z.key.is_not(None), z.take > 0).scalar_subquery()
    # A key's n-th job ranks after its own n - 1 and the first jobs of the
    # entries ahead of it in the rotation (``before``) -- and, for n >= 2, of
    # every other key with a job (``ahead`` - 1): with ``room`` picks it can be
    # one only for n <= room - before and n <= max(1, room - ahead + 1). A
    # queue limit over many keys reads one job of each key walked, not 16.
    take = func.greatest(0, func.least(z.take, u.room - z.before, func.greatest(1, u.room - ahead + 1)))
    row: ColumnElement[Any] = literal_column("watchdog_jobs.ctid")
    keyed = (
        select(c.sequence, c.priority, row.label("row"))
        .where(c.queue_name == queue, IS_QUEUED, IS_KEYED, c.limit_key == z.key)
        .order_by(*CLAIM_ORDER)
        .limit(take)
        .correlate(sized, usage)
        .lateral("keyed")
    )
    head = (
        select(c.sequence, c.priority, c.limit_key, row.label("row"))
        .where(c.queue_name == queue, IS_QUEUED, select(e.key).where(e.ord == unkeyed_at).exists())
        .order_by(*CLAIM_ORDER)
        .limit(select(u.room + UNKEYED_SCAN).scalar_subquery())
        .subquery("head")
    )
    # The unkeyed entry's n-th job (n >= 2) ranks after the first job of every key ahead.
    unkeyed = (
        select(head.c.sequence, head.c.priority, head.c.row)
        .where(head.c.limit_key.is_(None))
        .limit(select(func.least(u.room, func.greatest(1, u.room - ahead))).scalar_subquery())
        .subquery("unkeyed")
    )
    found = union_all(
        select(z.ord, z.key, keyed.c.sequence, keyed.c.priority, keyed.c.row)
        .select_from(sized.join(usage, true()).join(keyed, true()))
        .where(z.key.is_not(None)),
        select(
            literal_column(str(unkeyed_at), Integer()).label("ord"),
            null(),
            unkeyed.c.sequence,
            unkeyed.c.priority,
            unkeyed.c.row,
        ),
    ).subquery("found")
    position = func.row_number().over(partition_by=found.c.ord, order_by=(found.c.priority.desc(), found.c.sequence))
    candidates = select(found, position.label("position")).cte("candidates").prefix_with("MATERIALIZED")
    k = candidates.c
    complete = and_(ended, not_(wrap_cut))
    go = and_(u.fresh, or_(select(func.count(k.ord.distinct())).scalar_subquery() >= u.room, complete)).label("go")
    status = select(go, u.cursor_key, u.room).cte("status").prefix_with("MATERIALIZED")
    s = status.c
    picks = (
        select(k.sequence, k.key, k.ord, k.position, k.row)
        .where(select(s.go).scalar_subquery())
        .order_by(k.position, k.ord)
        .limit(select(s.room).scalar_subquery())
        .cte("picks")
        .prefix_with("MATERIALIZED")
    )
    # The cursor: the entry of the last job taken, in rank order; none taken,
    # the last entry walked (a run of keys at their limit is not walked again).
    last_pick = select(picks.c.key).order_by(picks.c.position.desc(), picks.c.ord.desc()).limit(1)
    last_entry = select(e.key).order_by(e.ord.desc()).limit(1)
    took = select(picks.c.sequence).exists()
    cursor = case((took, last_pick.scalar_subquery()), else_=last_entry.scalar_subquery())
    # Nothing queued: the cursor stays (the transaction path ends at the lock then).
    any_queued = select(c.sequence).where(c.queue_name == queue, IS_QUEUED).limit(1).exists()
    moves = and_(
        s.go,
        or_(
            took,
            and_(any_queued, select(e.ord).exists(), last_entry.scalar_subquery().is_distinct_from(s.cursor_key)),
        ),
    )
    # By the rows' physical address (a TID scan, whatever the planner knows of
    # the table): by sequence, a generic plan made while the table was small
    # scanned it whole for every claim afterwards. A row updated meanwhile is
    # followed to its new version and checked again (still queued).
    picked = row == any_(func.array(select(picks.c.row).scalar_subquery()))
    # Still queued, written so that no index's predicate matches it: the rows
    # are found by key (with state = 'queued' PostgreSQL read every queued
    # job's entry in live_queue for a bitmap).
    still_queued = c.state.not_in([literal_column(f"'{state}'") for state in (_DELAYED, _RUNNING, _SETTLED, _WAITING)])
    claimed = _claim_update(and_(picked, still_queued), mark_ahead).cte("claimed")
    # Always written when jobs were taken: a claimer whose snapshot predates
    # this commit then sees another version of the row than it locks.
    moved = (
        update(limits_table)
        .where(lim.queue_name == queue, select(moves).scalar_subquery())
        .values(cursor_key=cursor)
        .returning(lim.queue_name)
        .cte("moved")
    )
    # One row per claim, or with a per-key rate one per key it started jobs
    # of (NULL: the unkeyed ones), so a key's count in a window is one range.
    log_key = case((u.rate_per_key_count.is_not(None), claimed.c.limit_key), else_=null())
    logs = (
        insert(limit_claims_table)
        .from_select(
            ["queue_name", "claimed_at", "jobs", "limit_key"],
            select(queue, u.clock, func.count(), log_key)
            .select_from(claimed.join(usage, true()))
            .where(claimed.c.state == _RUNNING, or_(u.rate_count.is_not(None), u.rate_per_key_count.is_not(None)))
            .group_by(u.clock, u.rate_per_key_count, log_key),
        )
        .returning(logged.id)
        .cte("logs")
    )
    old = (
        select(logged.id)
        .where(
            logged.queue_name == queue,
            # The longer period's window (GREATEST skips a NULL).
            logged.claimed_at <= u.clock - func.greatest(u.rate_period_ms, u.rate_per_key_period_ms),
        )
        .order_by(logged.claimed_at)
        .limit(FORGET_BATCH)
        .correlate(None)
    )
    # Forgotten by every claim that goes ahead, jobs taken or not, as the
    # transaction path forgets them at the lock.
    forgotten = (
        delete(limit_claims_table)
        .where(logged.id.in_(old.scalar_subquery()), select(s.go).scalar_subquery())
        .returning(logged.id)
        .cte("forgotten")
    )
    # Held back by a limit: more jobs were queued than taken, and either fewer
    # were taken than asked or the claim used up the queue's room.
    # In claim order, so the queue's range of ix_watchdog_jobs_live_queue is read
    # (asked + 1 entries); unordered, a plan from a young table's statistics read
    # the table from its start, past every settled job, to find them.
    queued = (
        select(c.sequence)
        .where(c.queue_name == queue, IS_QUEUED)
        .order_by(*CLAIM_ORDER)
        .limit(asked + 1)
        .subquery("queued")
    )
    taken = select(func.count()).select_from(picks).scalar_subquery()
    headroom = select(u.headroom).scalar_subquery()
    held = and_(
        select(func.count()).select_from(queued).scalar_subquery() > taken,
        or_(taken < asked, func.coalesce(headroom - taken <= 0, false())),
    ).label("held")
    rows = select(claimed).subquery("rows")
    return select(s.go, held, *rows.c).select_from(status.outerjoin(rows, true())).add_cte(moved, logs, forgotten)


@cache
def move_cursor(returning: bool = True) -> Update:
    """Queue ``:queue``'s round-robin position: ``:cursor``, the key that got
    the last job (NULL: the unkeyed jobs). ``returning``: the row, as
    ``execute_rows`` reads one (where writes return rows; else nothing)."""
    stmt = update(limits_table).where(lim.queue_name == _QUEUE).values(cursor_key=_p("cursor", Text()))
    return stmt.returning(lim.queue_name) if returning else stmt


@cache
def log_claim() -> Insert:
    """Record that a limited claim of queue ``:queue`` started ``:jobs`` jobs
    at ``:clock`` (of key ``:key``: a queue with a per-key rate; else NULL)."""
    return limit_claims_table.insert().values(
        queue_name=_QUEUE,
        claimed_at=_p("clock", BigInteger()),
        jobs=_p("jobs", Integer()),
        limit_key=_p("key", Text()),
    )


@cache
def forget_claims(backend: Backend) -> Delete:
    """Delete up to ``:batch`` of queue ``:queue``'s logged claims made at or
    before ``:before`` (outside every window a claim will look at); the
    ``LIMIT``ed pick through :meth:`Backend.among` (MariaDB, error 1235)."""
    old = (
        select(logged.id)
        .where(logged.queue_name == _QUEUE, logged.claimed_at <= _p("before", BigInteger()))
        .order_by(logged.claimed_at)
        .limit(_p("batch", Integer()))
    )
    return delete(limit_claims_table).where(backend.among(logged.id, old))


@cache
def forget_queue_claims() -> Delete:
    """Delete every logged claim of queue ``:queue`` (its limits are cleared)."""
    return delete(limit_claims_table).where(logged.queue_name == _QUEUE)


@cache
def set_limits(backend: Backend) -> Insert:
    """Store queue ``:queue``'s limits (``:concurrency``, ``:per_key``,
    ``:rate_count``, ``:rate_period_ms``, ``:rate_per_key_count``,
    ``:rate_per_key_period_ms``), its round-robin cursor kept; a row already
    holding exactly these keeps its ``updated_at`` (and its values). One
    upsert (:meth:`Backend.upsert`: ``ON CONFLICT DO UPDATE``, or MariaDB's
    ``ON DUPLICATE KEY UPDATE``); it returns nothing."""
    clock = db_clock_ms()
    stmt = _insert_into(backend, limits_table).values(
        queue_name=_QUEUE,
        concurrency=_p("concurrency", Integer()),
        concurrency_per_key=_p("per_key", Integer()),
        rate_count=_p("rate_count", Integer()),
        rate_period_ms=_p("rate_period_ms", BigInteger()),
        rate_per_key_count=_p("rate_per_key_count", Integer()),
        rate_per_key_period_ms=_p("rate_per_key_period_ms", BigInteger()),
        updated_at=clock,
    )

    def updated(new: Any) -> dict[str, Any]:
        same = and_(
            lim.concurrency.is_not_distinct_from(new.concurrency),
            lim.concurrency_per_key.is_not_distinct_from(new.concurrency_per_key),
            lim.rate_count.is_not_distinct_from(new.rate_count),
            lim.rate_period_ms.is_not_distinct_from(new.rate_period_ms),
            lim.rate_per_key_count.is_not_distinct_from(new.rate_per_key_count),
            lim.rate_per_key_period_ms.is_not_distinct_from(new.rate_per_key_period_ms),
        )
        # updated_at first: MariaDB assigns in order, each assignment reading
        # the row as the earlier ones left it, so `same` must be read before
        # any limit changes (the other dialects read the old row throughout).
        return {
            "updated_at": case((same, lim.updated_at), else_=clock),
            "concurrency": new.concurrency,
            "concurrency_per_key": new.concurrency_per_key,
            "rate_count": new.rate_count,
            "rate_period_ms": new.rate_period_ms,
            "rate_per_key_count": new.rate_per_key_count,
            "rate_per_key_period_ms": new.rate_per_key_period_ms,
        }

    return backend.upsert(stmt, [lim.queue_name], updated)


@cache
def clear_limits() -> ReturningDelete[Any]:
    """Remove queue ``:queue``'s limits; returns its row if it had any."""
    return delete(limits_table).where(lim.queue_name == _QUEUE).returning(lim.queue_name)


@cache
def delete_limits() -> Delete:
    """:func:`clear_limits` returning nothing (MySQL has no ``DELETE ...
    RETURNING``): whether the queue had limits is the row count."""
    return delete(limits_table).where(lim.queue_name == _QUEUE)


@cache
def keyed_counts(backend: Backend) -> Select[Any]:
    """Queue ``:queue``'s queued and running jobs per key (NULL: unkeyed),
    for the stats of a limited queue: one read of its live jobs in
    ``ix_watchdog_jobs_live_queue``."""
    query = select(c.limit_key, c.state, func.count()).where(
        c.queue_name == _QUEUE, c.state.in_([literal_column(f"'{_QUEUED}'"), literal_column(f"'{_RUNNING}'")])
    )
    if backend.repeats_partial_predicates:
        query = query.where(IS_LIVE)
    return query.group_by(c.limit_key, c.state)


@cache
def settle(backend: Backend, sized: bool = False) -> Update:
    """Settle exact claims (rows of :data:`SETTLE_FIELDS` in ``settles``),
    each only while its lease lives by ``max(:now, database clock)``.

    A row with a ``delay_ms`` is requeued instead (a retry or a snooze):
    ``delayed`` until ``database clock + delay_ms`` (``queued`` at once for
    0), its claim dropped, its attempt or snooze count moved. A recorded
    cancellation turns any decision, a requeue included, into ``cancelled``. The claim
    token stays on the row so a repeated settle can be recognised as a
    replay. One statement settles a whole batch; every row keeps its own
    guard.

    The plan looks each row up by ``job_id`` (``uq_watchdog_jobs_job_id``),
    whatever the table holds. Written with ``state = 'running'``, the guard
    let PostgreSQL read the running jobs through the partial
    ``ix_watchdog_jobs_lease`` instead, as a bitmap scan that also visits
    every entry left by jobs settled since the last vacuum (a drain of 5,000
    jobs: 3,000 of them per settle, a fifth of the server's CPU per job).
    ``state NOT IN ('delayed', 'queued', 'settled')`` -- the same rows under
    the state grammar -- does not imply that index's predicate, and the
    counted source (:func:`_rows`) makes the lookups by ``job_id`` the
    cheaper plan even on a small table.

    ``sized`` writes ``:settles_count`` (1 to :data:`LITERAL_LIMIT_MAX`)
    into the text at each execution, as the claim does with its limit (see
    :func:`claim`). A generic plan that does not know the count
    estimates a tenth of the source's hundred rows, which on a table never
    analysed made the custom plans of one-row settles look cheaper: the
    settle was planned again at every execution (0.16 ms of its 0.33 at
    3,000 jobs). Each batch size up to that is then a text of its own.
    """
    _source, cols, _ = _rows(backend, "settles", SETTLE_FIELDS, counted=True, sized=sized)
    cancelled = c.cancellation_id.is_not(None)
    delay = cols["delay_ms"]
    # A requeue (retry or snooze) of an uncancelled job: back to waiting.
    requeue = and_(c.cancellation_id.is_(None), delay.is_not(None))
    snooze = cols["snooze_add"] > 0
    # Written against the table, sent against its alias ``j``: the statement's
    # text stays under psycopg's 4,096-character query cache (a longer one is
    # parsed for its placeholders in Python at every execution, ~0.1 ms a settle).
    j: Any = t.alias("j")  # typed as the table's alias: update() takes it as PostgreSQL and SQLite do
    on_j = ClauseAdapter(j).traverse
    return (
        update(j)
        .where(
            on_j(c.job_id == cols["job_id"]),
            on_j(IS_RUNNING_UNINDEXED),
            on_j(c.claim_token == cols["claim_token"]),
            on_j(c.lease_until > effective_now(NOW)),
        )
        .values({name: on_j(value) for name, value in _settle_values(cols, cancelled, requeue, snooze, delay).items()})
        .returning(*(on_j(column) for column in COLUMNS))
    )
