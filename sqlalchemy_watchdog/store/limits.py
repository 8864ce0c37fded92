"""Flow control: the queues' limits, and the limited claim.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring). The design and
the argument that the limits are exact are in docs/design.md ("Flow control").
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from ..backends import Backend, backend_of
from ..errors import InvalidJob
from ..jobs import (
    KEY_MAX_LENGTH,
    LIMIT_MAX,
    QUEUE_MAX_LENGTH,
    HeldBy,
    JobState,
    JobView,
    QueueLimits,
    Rate,
    at_epoch_ms,
    check_int,
    check_text,
)
from . import limits_sql, sql
from .operation import Shape, operation
from .views import execute_rows, write_returning

# -- which queues are limited ---------------------------------------------------

#: How long a process trusts its list of limited queues. The plain claim
#: statement itself refuses a limited queue's jobs (``sql.UNLIMITED``),
#: so a stale list never breaks a limit: a queue limited meanwhile is claimed
#: by nobody until the list is read again (at most this long), a queue whose
#: limits were cleared is claimed the plain way within the limited path.
LIMITED_TTL = 1.0

_limited: weakref.WeakKeyDictionary[Engine, tuple[float, frozenset[str]]] = weakref.WeakKeyDictionary()


def limited_queues(conn: Connection) -> frozenset[str]:
    """The names of the queues with limits, read at most every
    :data:`LIMITED_TTL` seconds per engine (so an unlimited claim costs
    what it did before limits existed)."""
    engine = conn.engine
    now = time.monotonic()
    known = _limited.get(engine)
    if known is not None and now - known[0] < LIMITED_TTL:
        return known[1]
    names = frozenset(
        conn.execute(limits_sql.read_limits(False).with_only_columns(limits_sql.lim.queue_name)).scalars()
    )
    _limited[engine] = (now, names)
    return names


def forget_limited(conn: Connection) -> None:
    """Read the limited queues afresh at the next claim (this process changed them)."""
    _limited.pop(conn.engine, None)


# -- limits ------------------------------------------------------------------------


def _rate_of(count: int | None, period_ms: int | None) -> Rate | None:
    if count is None or period_ms is None:
        return None
    return Rate(count, timedelta(milliseconds=period_ms))


def _limits_of(row: Any) -> QueueLimits:
    return QueueLimits(
        row.queue_name,
        row.concurrency,
        row.concurrency_per_key,
        _rate_of(row.rate_count, row.rate_period_ms),
        at_epoch_ms(row.updated_at),
        _rate_of(row.rate_per_key_count, row.rate_per_key_period_ms),
    )


def check_rate(name: str, value: object) -> Rate | None:
    """A rate limit: None, or a valid :class:`Rate` (checked again here, so
    that a Rate altered after construction is refused naming ``name``)."""
    if value is None:
        return None
    if not isinstance(value, Rate):
        raise InvalidJob(name, f"must be a Rate (e.g. Rate(100, timedelta(minutes=1))), not {type(value).__name__}")
    try:
        Rate(value.count, value.per)
    except InvalidJob as error:
        raise InvalidJob(name, str(error).removeprefix("rate: ")) from None
    return value


def check_limit(name: str, value: object) -> int | None:
    """A limit: None, or an int in ``[1, LIMIT_MAX]``."""
    return None if value is None else check_int(name, value, 1, LIMIT_MAX)


@operation(Shape.READ)
def read_limits(conn: Connection, queues: Sequence[str] | None = None) -> tuple[QueueLimits, ...]:
    """Every limited queue's limits (of ``queues`` when given), by name."""
    if queues is None:
        return tuple(_limits_of(row) for row in conn.execute(limits_sql.read_limits(False)))
    names = [check_text("queue", queue, QUEUE_MAX_LENGTH) for queue in queues]
    return tuple(_limits_of(row) for row in conn.execute(limits_sql.read_limits(True), {"queues": names}))


@operation(Shape.WRITE)
def set_limits(
    conn: Connection,
    queue: str,
    *,
    concurrency: int | None = None,
    concurrency_per_key: int | None = None,
    rate: Rate | None = None,
    rate_per_key: Rate | None = None,
) -> QueueLimits:
    """Store ``queue``'s limits (replacing the ones it had); idempotent."""
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    check_limit("concurrency", concurrency)
    check_limit("concurrency_per_key", concurrency_per_key)
    check_rate("rate", rate)
    check_rate("rate_per_key", rate_per_key)
    if concurrency is None and concurrency_per_key is None and rate is None and rate_per_key is None:
        raise InvalidJob(
            "concurrency",
            "give at least one of concurrency, concurrency_per_key, rate and rate_per_key (clear_limits removes them)",
        )
    params = {
        "queue": queue,
        "concurrency": concurrency,
        "per_key": concurrency_per_key,
        "rate_count": None if rate is None else rate.count,
        "rate_period_ms": None if rate is None else rate.period_ms,
        "rate_per_key_count": None if rate_per_key is None else rate_per_key.count,
        "rate_per_key_period_ms": None if rate_per_key is None else rate_per_key.period_ms,
    }
    conn.execute(limits_sql.set_limits(backend_of(conn)), params)
    forget_limited(conn)
    stored = conn.execute(limits_sql.read_limits(True), {"queues": [queue]}).one()
    return _limits_of(stored)


@operation(Shape.TRANSACTION)
def clear_limits(conn: Connection, queue: str) -> bool:
    """Remove ``queue``'s limits (and its rate log); whether it had any."""
    check_text("queue", queue, QUEUE_MAX_LENGTH)
    if backend_of(conn).writes_return_rows:
        had = conn.execute(limits_sql.clear_limits(), {"queue": queue}).first() is not None
    else:  # MySQL has no DELETE ... RETURNING: the row count
        had = conn.execute(limits_sql.delete_limits(), {"queue": queue}).rowcount > 0
    conn.execute(limits_sql.forget_queue_claims(), {"queue": queue})
    forget_limited(conn)
    return had


# -- the limited claim -----------------------------------------------------------

#: Rate-log rows a claim deletes at most (the queue's rows out of the window).
FORGET_BATCH = limits_sql.FORGET_BATCH
#: Keys walked per segment at most, and segments per claim at most.
WALK_MAX = 256
WALK_SEGMENTS = 4


@contextlib.contextmanager
def own_transaction(conn: Connection) -> Iterator[None]:
    """Run the block in a transaction: the caller's when ``conn`` has one
    (SQLite's ``BEGIN IMMEDIATE``, or the caller's own), else -- an
    autocommit connection on PostgreSQL -- one begun and committed here,
    the connection back in autocommit afterwards."""
    if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
        yield
        return
    if conn.in_transaction():
        conn.commit()  # SQLAlchemy's autobegun no-op: nothing is pending in autocommit
    conn.execution_options(isolation_level=conn.default_isolation_level)
    try:
        with conn.begin():
            yield
    except BaseException:
        # A cut connection may refuse even this: the gateway discards it
        # anyway; the error that matters is the one raised in the block.
        with contextlib.suppress(Exception):
            conn.execution_options(isolation_level="AUTOCOMMIT")
        raise
    conn.execution_options(isolation_level="AUTOCOMMIT")


@dataclass(frozen=True, slots=True)
class Room:
    """What a limited queue has room for now, under its lock."""

    clock: int
    running: int
    rate_used: int
    room: int


def _room(conn: Connection, row: Any, limit: int) -> Room:
    if backend_of(conn).locks_before_reading:  # lock_limits read the usage with the lock held
        clock, running, used, paused = row.clock, row.running, row.rate_used, row.paused
    else:
        period = row.rate_period_ms or 0
        clock, running, used, paused = conn.execute(
            limits_sql.limit_usage(backend_of(conn)), {"queue": row.queue_name, "period_ms": period}
        ).one()
    used = int(used or 0)
    room = 0 if paused else limit  # a paused queue: no claim takes its jobs
    if row.concurrency is not None:
        room = min(room, row.concurrency - running)
    if row.rate_count is not None:
        room = min(room, row.rate_count - used)
    return Room(clock, running, used, room)


#: A walked entry of the rotation: a key (None: the unkeyed jobs) and its
#: running jobs (counted only under a per-key concurrency limit, else 0).
Entry = tuple[str | None, int]


def _rotation(
    conn: Connection, queue: str, cursor: str | None, segment: int, first: int | None = None, counted: bool = False
) -> Iterator[list[Entry]]:
    """The queue's rotation from after ``cursor``, in segments: its keys
    above the cursor (ascending, code point order), the unkeyed jobs as one
    entry (None), then its keys up to the cursor -- the first segment at
    most ``first`` keys (``segment`` if None), each other at most
    ``segment``, read by a skip scan; each key with its running jobs when
    ``counted``."""
    walk = limits_sql.walk_keys(counted)

    def walked(after: str, size: int) -> list[Entry]:
        rows = execute_rows(conn, walk, {"queue": queue, "after": after, "walk": size})
        return [(row[0], int(row[1]) if counted else 0) for row in rows]

    after = "" if cursor is None else cursor
    size = segment if first is None else first
    while True:
        keys = walked(after, size)
        if keys:
            yield keys
        if len(keys) < size:
            break
        size = segment
        last = keys[-1][0]
        assert last is not None
        after = last
    yield [(None, 0)]
    if cursor is None:
        return
    after = ""
    while True:
        keys = walked(after, segment)
        inside = [entry for entry in keys if entry[0] is not None and entry[0] <= cursor]
        if inside:
            yield inside
        if len(inside) < len(keys) or len(keys) < segment:
            return
        last = keys[-1][0]
        assert last is not None
        after = last


def _parts(count: int) -> int:
    """The statement size for ``count`` keys: the next power of two (few variants)."""
    return 0 if count == 0 else 1 << math.ceil(math.log2(count))


def fair_pick(
    conn: Connection, row: Any, room: int, clock: int = 0
) -> tuple[list[tuple[int, str | None]], str | None, bool]:
    """Up to ``room`` of the queue's queued jobs, fairly: ``(sequence, key)``
    in rank order -- the first job of each entry of the rotation, then the
    second of each, ... (priority, then admission, orders a key's jobs) --
    with the cursor to store and whether to store it. A key takes at most
    its room under ``concurrency_per_key`` and, with a per-key rate, what
    its claims logged after ``clock`` minus the period leave."""
    queue = row.queue_name
    per_key = row.concurrency_per_key
    rate_per_key = row.rate_per_key_count
    segment = min(room * 2 + 8, WALK_MAX)
    backend = backend_of(conn)
    groups: list[list[tuple[int, int]]] = []  # per rotation entry: (priority, sequence)
    entries: list[str | None] = []
    found = 0  # entries with at least one job
    # The first segment only as many keys as the room: when each of them may
    # take a job (the usual case: the keys at their limit are the ones just
    # claimed, behind the cursor), no other key can be picked.
    rotation = _rotation(conn, queue, row.cursor_key, segment, first=min(room, segment), counted=per_key is not None)
    for number, keys in enumerate(rotation):
        named = [key for key, _running in keys if key is not None]
        take = dict.fromkeys(named, room)
        if per_key is not None:
            take = {key: max(0, min(room, per_key - running)) for key, running in keys if key is not None}
        if rate_per_key is not None and named:
            since = clock - row.rate_per_key_period_ms
            used: dict[str, int] = {
                key: int(count)
                for key, count in conn.execute(
                    limits_sql.keys_rate_used(True), {"queue": queue, "keys": named, "since": since}
                )
            }
            take = {key: max(0, min(take[key], rate_per_key - used.get(key, 0))) for key in named}
        open_keys = [key for key in named if take[key] > 0]
        # Every open key has a queued job (the walk found it), so at least
        # ``ahead`` entries have a first job: an entry's n-th job (n >= 2)
        # ranks after its own n - 1 and the first job of every other such
        # entry, so with ``room`` picks it can be one only for
        # n <= room - (ahead - 1) -- for a keyed entry among them; the
        # unkeyed entry is not among them, so n <= room - ahead. A queue
        # limit over many keys reads one job of each key, not ``room``.
        ahead = found + len(open_keys)
        keyed_bound = max(1, room - ahead + 1)
        parts = _parts(len(open_keys))
        unkeyed = any(key is None for key, _running in keys)
        params: dict[str, Any] = {"queue": queue, "unkeyed_n": max(1, room - ahead) if unkeyed else 0}
        params["unkeyed_scan"] = room + limits_sql.UNKEYED_SCAN if unkeyed else 0
        for index in range(parts):
            key = open_keys[index] if index < len(open_keys) else None
            params[f"key_{index}"] = key
            params[f"n_{index}"] = 0 if key is None else min(take[key], keyed_bound)
        candidates: dict[int, list[tuple[int, int]]] = {}
        if parts or unkeyed:
            for sequence, priority, part in execute_rows(conn, limits_sql.key_picks(backend, parts), params):
                candidates.setdefault(part, []).append((priority, sequence))
        for key, _running in keys:
            part = -1 if key is None else (open_keys.index(key) if take.get(key, 0) > 0 else None)
            jobs = sorted(candidates.get(part, []), key=lambda job: (-job[0], job[1])) if part is not None else []
            entries.append(key)
            groups.append(jobs)
            found += 1 if jobs else 0
        # Enough entries with a job for every slot: walking further could
        # only add jobs ranked after these (rank: position, then entry).
        if found >= room or number + 1 >= WALK_SEGMENTS * 2 + 1:
            break
    ranked = sorted(
        (
            (position, order, job[1], entries[order])
            for order, jobs in enumerate(groups)
            for position, job in enumerate(jobs)
        ),
    )[:room]
    picks = [(sequence, key) for _position, _order, sequence, key in ranked]
    if picks:  # the cursor: the entry that got the last job, in rank order
        return picks, ranked[-1][3], True
    # Nothing to take: the next claim starts after the entries walked, so a
    # run of keys at their limit is not walked again and again.
    if entries:
        return picks, entries[-1], entries[-1] != row.cursor_key
    return picks, None, False


#: Positions in a claimed row (sql.COLUMNS).
STATE = [column.name for column in sql.COLUMNS].index("state")
LIMIT_KEY = [column.name for column in sql.COLUMNS].index("limit_key")
STARTED_AT = [column.name for column in sql.COLUMNS].index("started_at")

#: What :func:`claim_at_once` returns when the transaction must claim instead.
AGAIN = object()


@dataclass(frozen=True, slots=True)
class Taken:
    """What a limited claim of one queue took: the claim statement's rows,
    and whether a limit held it back (fewer taken than asked while more jobs
    were queued: room frees only when a running job of the queue ends)."""

    rows: list[Sequence[Any]]
    held: bool


def claim_at_once(conn: Connection, queue: str, *, limit: int, lease_ms: int, token: str, ahead: bool = False) -> Any:
    """The limited claim in one statement (PostgreSQL, autocommit): what it
    took (:class:`Taken`), None when the queue has no limits, or
    :data:`AGAIN` when the statement changed nothing and
    :func:`claim_in_transaction` must claim (see
    :func:`limits_sql.claim_limited_at_once`)."""
    params = {"queue": queue, "limit": limit, "token": token, "lease_ms": lease_ms}
    found = execute_rows(conn, limits_sql.claim_limited_at_once(ahead), params)
    if not found:
        return None
    if not found[0][0]:
        return AGAIN
    return Taken([row[2:] for row in found if row[2] is not None], bool(found[0][1]))


def claim_queue(
    conn: Connection, queue: str, *, limit: int, lease_ms: int, token: str, ahead: bool = False
) -> Taken | None:
    """Claim up to ``limit`` of limited queue ``queue``'s jobs within its
    limits; None when the queue has no limits now (the caller claims it the
    plain way). On PostgreSQL in autocommit usually one statement
    (:func:`claim_at_once`), else a transaction of a few
    (:func:`claim_in_transaction`)."""
    at_once = backend_of(conn).limited_claim_at_once
    if at_once and conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        taken = claim_at_once(conn, queue, limit=limit, lease_ms=lease_ms, token=token, ahead=ahead)
        if taken is not AGAIN:
            done: Taken | None = taken
            return done
    return claim_in_transaction(conn, queue, limit=limit, lease_ms=lease_ms, token=token, ahead=ahead)


@functools.cache
def _locked_row(backend: Backend) -> Any:
    """The named tuple of a :func:`limits_sql.lock_limits` row (sent by
    :func:`execute_rows`, which returns the driver's plain tuples)."""
    return collections.namedtuple("LockedLimits", list(limits_sql.lock_limits(backend).selected_columns.keys()))


def claim_in_transaction(
    conn: Connection,
    queue: str,
    *,
    limit: int,
    lease_ms: int,
    token: str,
    at_once: bool = True,
    ahead: bool = False,
) -> Taken | None:
    """:func:`claim_queue` as a transaction (see :func:`own_transaction`): the
    limits row locked first; on PostgreSQL then usually the one statement
    (its snapshot now younger than the lock); else the room read, the keys
    walked segment by segment, the jobs picked and claimed, each its own
    statement (``at_once`` False: always so -- for tests comparing the two)."""
    backend = backend_of(conn)
    with own_transaction(conn):
        locked = execute_rows(conn, limits_sql.lock_limits(backend), {"queue": queue})
        if not locked:
            return None
        row = _locked_row(backend)._make(locked[0])
        if at_once and backend.limited_claim_at_once:
            # The lock is held now, so the one statement's snapshot is younger
            # than it: the usual claim in one more round trip. It declines only
            # when its walk was too short; the walk below goes further.
            taken = claim_at_once(conn, queue, limit=limit, lease_ms=lease_ms, token=token, ahead=ahead)
            if taken is not AGAIN:
                done: Taken | None = taken
                return done
        room = _room(conn, row, limit)
        periods = [period for period in (row.rate_period_ms, row.rate_per_key_period_ms) if period is not None]
        if periods:  # out of every window a claim looks at: the longer period's
            before = room.clock - max(periods)
            conn.execute(limits_sql.forget_claims(backend), {"queue": queue, "before": before, "batch": FORGET_BATCH})
        if not row.has_queued:
            return Taken([], False)
        if room.room <= 0:
            return Taken([], True)
        picks, cursor, move = fair_pick(conn, row, room.room, room.clock)
        rows: list[Sequence[Any]] = []
        if picks:
            params = {"token": token, "lease_ms": lease_ms}
            parts = _parts(len(picks))
            for index in range(parts):
                params[f"s_{index}"] = picks[index][0] if index < len(picks) else None
            claim = limits_sql.claim_limited(parts, ahead)
            if backend.writes_return_rows:
                rows = execute_rows(conn, claim, params)
            else:  # MariaDB: the picks still queued locked, claimed by key, read back
                rows.extend(write_returning(conn, claim, params))
        if move or rows:
            # Always written when jobs were taken: under REPEATABLE READ a
            # claimer whose snapshot predates this commit then fails its lock
            # (a serialization failure, retried) instead of counting stale rows;
            # under READ COMMITTED claim_at_once sees another version of the row.
            if backend.writes_return_rows:
                execute_rows(conn, limits_sql.move_cursor(), {"queue": queue, "cursor": cursor})
            else:
                conn.execute(limits_sql.move_cursor(False), {"queue": queue, "cursor": cursor})
        # Logged at the jobs' own start (the claim statement's clock, which
        # wrote started_at), not at room.clock read statements before it: a
        # claim delayed between the two (a descheduled process) would
        # otherwise log its starts earlier than they happened, and a claim a
        # period after that log row would no longer count them although they
        # started less than a period before it. Counting from room.clock <=
        # the start only counts more (see "Flow control" in the design).
        started: dict[tuple[str | None, int], int] = {}
        for claimed in rows:
            if claimed[STATE] == JobState.RUNNING.value:
                # With a per-key rate one log row per key (NULL: the unkeyed jobs).
                key = claimed[LIMIT_KEY] if row.rate_per_key_count is not None else None
                at = int(claimed[STARTED_AT])
                started[key, at] = started.get((key, at), 0) + 1
        if periods:
            for (key, at), jobs in started.items():
                conn.execute(limits_sql.log_claim(), {"queue": queue, "clock": at, "jobs": jobs, "key": key})
        # Held back: the room was below the ask or is used up now, or a
        # per-key limit left walked keys' jobs behind (an approximation: the
        # queue may simply have had fewer jobs than the room).
        left = [row.concurrency - room.running] if row.concurrency is not None else []
        if row.rate_count is not None:
            left.append(row.rate_count - room.rate_used)
        used_up = bool(left) and min(left) - len(rows) <= 0
        per_key_limited = row.concurrency_per_key is not None or row.rate_per_key_count is not None
        held = room.room < limit or used_up or (len(picks) < room.room and per_key_limited)
        return Taken(rows, held)


# -- what a limit holds back ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LimitUse:
    """A limited queue's use now (for stats)."""

    limits: QueueLimits
    rate_used: int | None
    held_back: int
    #: The busiest key's claims in its window (None: no per-key rate).
    rate_per_key_used: int | None = None


def queue_use(conn: Connection, limits: QueueLimits) -> LimitUse:
    """How much of ``limits`` is used, and how many queued jobs no claim could take now."""
    backend = backend_of(conn)
    period = 0 if limits.rate is None else limits.rate.period_ms
    clock, running, used, _paused = conn.execute(
        limits_sql.limit_usage(backend), {"queue": limits.queue, "period_ms": period}
    ).one()
    used = int(used or 0)
    queued: dict[str | None, int] = {}
    running_by_key: dict[str | None, int] = {}
    for key, state, count in conn.execute(limits_sql.keyed_counts(backend), {"queue": limits.queue}):
        (queued if state == JobState.QUEUED.value else running_by_key)[key] = count
    total = sum(queued.values())
    key_used: dict[str | None, int] = {}
    if limits.rate_per_key is not None:
        since = clock - limits.rate_per_key.period_ms
        key_used = {
            key: int(count)
            for key, count in conn.execute(limits_sql.keys_rate_used(False), {"queue": limits.queue, "since": since})
        }
    claimable = 0
    for key, count in queued.items():
        if key is not None and limits.concurrency_per_key is not None:
            count = max(0, min(count, limits.concurrency_per_key - running_by_key.get(key, 0)))
        if key is not None and limits.rate_per_key is not None:
            count = max(0, min(count, limits.rate_per_key.count - key_used.get(key, 0)))
        claimable += count
    if limits.concurrency is not None:
        claimable = min(claimable, max(0, limits.concurrency - running))
    if limits.rate is not None:
        claimable = min(claimable, max(0, limits.rate.count - used))
    busiest = None if limits.rate_per_key is None else max(key_used.values(), default=0)
    return LimitUse(limits, None if limits.rate is None else used, total - claimable, busiest)


def held_by(conn: Connection, job: JobView) -> HeldBy | None:
    """The limit that leaves queued ``job`` no room now, if any."""
    if job.state is not JobState.QUEUED:
        return None
    found = conn.execute(limits_sql.read_limits(True), {"queues": [job.queue]}).first()
    if found is None:
        return None
    limits = _limits_of(found)
    period = 0 if limits.rate is None else limits.rate.period_ms
    clock, running, used, _paused = conn.execute(
        limits_sql.limit_usage(backend_of(conn)), {"queue": job.queue, "period_ms": period}
    ).one()
    if limits.concurrency is not None and running >= limits.concurrency:
        return HeldBy.CONCURRENCY
    if limits.rate is not None and int(used or 0) >= limits.rate.count:
        return HeldBy.RATE
    if limits.concurrency_per_key is not None and job.key is not None:
        counts: dict[str, int] = {
            key: count
            for key, count in conn.execute(limits_sql.keys_running(), {"queue": job.queue, "keys": [job.key]})
        }
        if counts.get(job.key, 0) >= limits.concurrency_per_key:
            return HeldBy.CONCURRENCY_PER_KEY
    if limits.rate_per_key is not None and job.key is not None:
        since = clock - limits.rate_per_key.period_ms
        logged = conn.execute(
            limits_sql.keys_rate_used(True), {"queue": job.queue, "keys": [job.key], "since": since}
        ).first()
        if logged is not None and int(logged[1]) >= limits.rate_per_key.count:
            return HeldBy.RATE_PER_KEY
    return None


__all__ = [
    "KEY_MAX_LENGTH",
    "LimitUse",
    "Taken",
    "claim_queue",
    "clear_limits",
    "held_by",
    "limited_queues",
    "read_limits",
    "queue_use",
    "set_limits",
]
