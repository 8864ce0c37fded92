"""The statements of :mod:`.maintenance`: lanes, retention, listing, bulk
actions, stats, pauses, reruns, workers and schedules (revision w0009), and
the testing-only ``make_due``.

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
    bindparam,
    case,
    delete,
    func,
    insert,
    literal_column,
    not_,
    null,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.elements import ColumnElement

from ..backends import Backend
from ..jobs import JobState, Outcome
from ..model import (
    schedules_table,
    workers_table,
)
from .sql import (
    _QUEUES,
    _RUNNING,
    _SETTLED,
    COLUMNS,
    IS_DELAYED,
    IS_LIVE,
    IS_QUEUED,
    IS_RUNNING,
    IS_SETTLED,
    IS_WAITING,
    UNPAUSED,
    _insert_into,
    _p,
    c,
    db_clock_ms,
    edges,
    pauses,
    t,
    text_length,
)

#: A lane's jobs that name it as their own lane (ix_watchdog_jobs_live_lane's
#: predicate, written as the index writes it), and its queue's jobs when the
#: lane is a queue's name and its jobs kept that default (ix_watchdog_jobs_live_queue).
IS_CUSTOM_LANE = c.lane != c.queue_name
IS_DEFAULT_LANE = c.lane == c.queue_name
#: IS_DEFAULT_LANE as a test no planner carries over: with ``queue_name =
#: :lane`` an equality would let both derive ``lane = :lane`` and read the
#: lane's whole history in ix_watchdog_jobs_lane_history (PostgreSQL in a
#: bitmap with ix_watchdog_jobs_live_queue, SQLite instead of it). Both
#: columns are NOT NULL, so it is the same test.
_DEFAULT_LANE_NO_TRANSITIVE: ColumnElement[bool] = IS_DEFAULT_LANE.self_group().is_(true())


def _lane_jobs(lane: ColumnElement[Any]) -> tuple[Select[Any], Select[Any]]:
    """Lane ``lane``'s live jobs in two parts, each read in its own index:
    the jobs given it as their lane (running first, then in admission
    order), and -- when it is a queue's name -- that queue's jobs whose lane
    is the default, its index read backwards (running first, then queued
    from the lowest priority and newest, then delayed)."""
    custom = (
        select(c.sequence, c.state).where(c.lane == lane, IS_LIVE, IS_CUSTOM_LANE).order_by(c.state.desc(), c.sequence)
    )
    # ix_watchdog_jobs_live_queue read backwards: running (the last state) first.
    own = (
        select(c.sequence, c.state)
        .where(c.queue_name == lane, IS_LIVE, _DEFAULT_LANE_NO_TRANSITIVE)
        .order_by(c.state.desc(), c.priority, c.sequence.desc())
    )
    return custom, own


@cache
def fail_lane(backend: Backend) -> Update:
    """Settle a batch (``:batch``) of lane ``:lane_name``'s live jobs ``failed``
    with ``:reason``, running ones first; their claims are dropped.

    The lane's jobs come from two indexes (:func:`_lane_jobs`): at most a
    batch from each, locked on PostgreSQL, of which the update takes a batch,
    running jobs first. The order only decides which batch a job falls in:
    the calls that follow settle the rest."""
    batch = _p("batch", Integer())
    custom, own = (part.limit(batch) for part in _lane_jobs(_p("lane_name", Text())))
    both = backend.union_picked(((custom, "custom_lane"), (own, "default_lane")))
    pick = select(both.c.sequence).order_by(both.c.state.desc(), both.c.sequence).limit(batch)
    return (
        update(t)
        .where(backend.among(c.sequence, pick), IS_LIVE)
        .values(
            state=_SETTLED,
            outcome=Outcome.FAILED.value,
            failure_reason=_p("reason", Text()),
            failure_detail=null(),
            lease_until=null(),
            unstarted=null(),
            claim_token=null(),
            settled_at=db_clock_ms(),
        )
        .returning(*COLUMNS)
    )


@cache
def lane_has_live_jobs() -> Select[Any]:
    """Whether lane ``:lane_name`` has a live job. Each part is a first row in
    its index's order, not an EXISTS: PostgreSQL costs an EXISTS as a scan
    that stops at the first match, and a queue's default-lane jobs, which it
    takes for rare (it does not know that ``lane = queue_name`` holds for
    most rows), can all sit behind the settled history."""
    parts = _lane_jobs(_p("lane_name", Text()))
    firsts = (part.with_only_columns(c.sequence).limit(1).scalar_subquery() for part in parts)
    return select(or_(*(first.is_not(None) for first in firsts)))


@cache
def purge() -> Delete:
    """Delete queue ``:queue``'s queued and delayed jobs; running and settled ones stay."""
    return delete(t).where(c.queue_name == _p("queue"), IS_LIVE, c.state != literal_column(f"'{_RUNNING}'"))


@cache
def purge_waiting() -> Delete:
    """Delete queue ``:queue``'s waiting jobs (revision w0014: their own
    dependents are told ``purged`` by the delete trigger)."""
    return delete(t).where(c.queue_name == _p("queue"), IS_WAITING)


@cache
def purge_pick(backend: Backend, waiting: bool) -> Select[Any]:
    """The jobs :func:`purge_waiting` (``waiting``) or :func:`purge` would
    delete -- ``sequence``, ``job_id`` and ``watched`` -- locked until the
    transaction ends: where the store tells dependents itself (MariaDB), it
    deletes them by key (:func:`purge_by_key`) and tells the watched ones'."""
    pick = select(c.sequence, c.job_id, c.watched).where(c.queue_name == _p("queue"), _purged(waiting))
    return backend.locked(pick)


@cache
def purge_by_key(waiting: bool) -> Delete:
    """Delete the jobs among ``:keys`` (their ``sequence``) that
    :func:`purge_pick` locked, their state checked again."""
    return delete(t).where(c.sequence.in_(bindparam("keys", expanding=True)), _purged(waiting))


def _purged(waiting: bool) -> ColumnElement[bool]:
    """The state of a job a purge deletes: waiting, or queued and delayed."""
    return IS_WAITING if waiting else and_(IS_LIVE, c.state != literal_column(f"'{_RUNNING}'"))


@cache
def fail_lane_waiting(backend: Backend) -> Update:
    """Settle a batch (``:batch``) of lane ``:lane_name``'s waiting jobs
    ``failed`` with ``:reason``, oldest first (revision w0014). Like a
    cancelled waiting job, each keeps ``waiting_on = 0``: a runner's pass
    tells its own dependents (:func:`untold`)."""
    pick = (
        select(c.sequence)
        .where(c.lane == _p("lane_name", Text()), IS_WAITING)
        .order_by(c.sequence)
        .limit(_p("batch", Integer()))
    )
    return (
        update(t)
        .where(
            backend.picked(c.sequence, backend.locked(pick), "waiting", skip_locked=False),
            IS_WAITING,
        )
        .values(
            state=_SETTLED,
            outcome=Outcome.FAILED.value,
            failure_reason=_p("reason", Text()),
            failure_detail=null(),
            settled_at=db_clock_ms(),
            waiting_on=0,
        )
        .returning(*COLUMNS)
    )


@cache
def lane_has_waiting_jobs() -> Select[Any]:
    """A waiting job of lane ``:lane_name``, if any (its sequence)."""
    return select(c.sequence).where(c.lane == _p("lane_name", Text()), IS_WAITING).limit(1)


@cache
def prune(backend: Backend, undated: bool) -> Delete:
    """Delete up to ``:limit`` settled jobs of outcome ``:outcome`` that
    settled before ``database clock - :age_ms``, oldest first -- or, when
    ``undated``, that have no recorded ``settled_at`` (settled before
    revision w0004).

    Only ``settled`` rows can match: queued, delayed and running jobs are
    never pruned. The pick reads ``ix_watchdog_jobs_settled`` (outcome,
    then time) in order, so a batch costs O(limit) however long the history
    is, other outcomes' rows included.
    """
    return delete(t).where(backend.picked(c.sequence, _prune_pick(undated), "old"), IS_SETTLED)


def _prune_pick(undated: bool) -> Select[Any]:
    """Up to ``:limit`` settled jobs of :func:`prune` (their ``sequence``)."""
    pick = select(c.sequence).where(IS_SETTLED, c.outcome == _p("outcome", Text()))
    if undated:
        # Ordered as the index is (settled_at is NULL throughout), so the pick
        # reads ix_watchdog_jobs_settled, not the primary key filtered.
        pick = pick.where(c.settled_at.is_(None)).order_by(c.settled_at, c.sequence)
    else:
        pick = pick.where(c.settled_at < db_clock_ms() - _p("age_ms", BigInteger()))
        pick = pick.order_by(c.settled_at, c.sequence)
    # Revision w0012: never a parent a live job still waits on (its callback
    # reads the parents' results).
    child = t.alias("child")
    waited_on = (
        select(literal_column("1"))
        .select_from(edges.join(child, child.c.job_id == edges.c.child))
        .where(edges.c.parent == c.job_id, child.c.state != literal_column(f"'{_SETTLED}'"))
        .exists()
    )
    return pick.where(not_(waited_on)).limit(_p("limit", Integer()))


@cache
def prune_pick(backend: Backend, undated: bool) -> Select[Any]:
    """The ``sequence`` of the jobs :func:`prune` deletes, locked: where writes
    return no rows (MariaDB/MySQL) the store reads them first, then deletes
    them by key (:func:`delete_settled`): a DELETE of jobs must not read
    ``watchdog_job_edges``, which the deleted jobs' trigger writes (error 1442)."""
    return backend.locked(_prune_pick(undated))


@cache
def delete_settled() -> Delete:
    """Delete the settled jobs among ``:keys`` (their ``sequence``, locked by
    :func:`prune_pick`)."""
    return delete(t).where(c.sequence.in_(bindparam("keys", expanding=True)), IS_SETTLED)


#: The payload column of a list that does not read payloads.
_NO_PAYLOAD: ColumnElement[Any] = literal_column("'null'").label("payload_json")
#: A listing without payloads leaves results out too (each up to 1 MB as well).
_NO_RESULT: ColumnElement[Any] = null().label("result_json")
#: The filters :func:`list_jobs` may combine (each one a bound parameter).
LIST_FILTERS = ("queue", "state", "outcome", "lane", "job_id_prefix", "job_id_range", "job_id_range_first")


@cache
def list_jobs(filters: tuple[str, ...], with_payload: bool = True, newest_first: bool = False) -> Select[Any]:
    """Up to ``:limit`` jobs with ``:after_sequence < sequence <
    :before_sequence`` in admission order (``newest_first``: the reverse, so
    the page is the newest below ``:before_sequence``), matching the named
    ``filters`` (``:queue``, ``state=<state>``, ``:outcome``, ``:lane``,
    ``:job_id_prefix`` -- a prefix compared with ``substr``, so LIKE
    wildcards in it mean nothing). Without ``with_payload`` the payload is
    not read: the JSON ``null`` stands in its column (a payload may be up
    to 1 MB), and no result is read either."""
    light = {c.payload_json: _NO_PAYLOAD, c.result_json: _NO_RESULT}
    columns = COLUMNS if with_payload else tuple(light.get(col, col) for col in COLUMNS)
    # With the prefix as a range on SQLite, the bounds must not draw its planner
    # to the primary key (it takes any rowid range for selective, knowing nothing
    # of the prefix): `sequence + 0` is no index's, so it reads the prefix's range
    # and sorts what matched. PostgreSQL weighs the range by its statistics.
    sequence = c.sequence + 0 if "job_id_range_first" in filters else c.sequence
    query = select(*columns).where(
        sequence > _p("after_sequence", BigInteger()), sequence < _p("before_sequence", BigInteger())
    )
    for name in filters:
        if name == "queue":
            query = query.where(c.queue_name == _p("queue", Text()))
        elif name.startswith("state="):
            # A literal, so the planner can use the state's partial indexes.
            query = query.where(c.state == literal_column(f"'{JobState(name[6:]).value}'"))
        elif name == "outcome":
            query = query.where(c.outcome == _p("outcome", Text()))
        elif name == "lane":
            # One range of ix_watchdog_jobs_lane_history (lane, sequence), every job's:
            # both orders and the sequence bounds read in it, however long the history.
            query = query.where(c.lane == _p("lane", Text()))
        elif name == "job_id_prefix":
            prefix = _p("job_id_prefix", Text())
            query = query.where(func.substr(c.job_id, 1, text_length(prefix)) == prefix)
        elif name in ("job_id_range", "job_id_range_first"):
            # The same jobs as the prefix, said as a range uq_watchdog_jobs_job_id
            # can read: exact only where job_id sorts by code point (the store checks).
            # PostgreSQL: the bounds are literals, so that even a prepared statement's
            # generic plan weighs the range by its statistics (unknown bounds it
            # costs as 0.5% of the table, and walks the primary key).
            literal = name == "job_id_range"
            low = bindparam("job_id_low", type_=Text(), literal_execute=literal)
            high = bindparam("job_id_high", type_=Text(), literal_execute=literal)
            query = query.where(c.job_id >= low, c.job_id < high)
        else:  # pragma: no cover - the store checks the names
            raise ValueError(name)
    return query.order_by(c.sequence.desc() if newest_first else c.sequence).limit(_p("limit", Integer()))


#: The filters :func:`bulk_pick` may combine (each one a bound parameter).
BULK_FILTERS = (
    "queue",
    "lane",
    "outcomes",
    "settled_after",
    "settled_before",
    "enqueued_after",
    "enqueued_before",
)


@cache
def bulk_pick(backend: Backend, kind: str, filters: tuple[str, ...]) -> Select[Any]:
    """The next ``:limit`` jobs a bulk action selects, with ``:after_sequence
    < sequence < :before_sequence``, in admission order: settled ones for
    ``kind`` ``rerun`` (whole rows, to copy; on PostgreSQL share-locked
    ``FOR KEY SHARE`` so a concurrent prune skips them until the copies are
    committed), live ones for ``cancel`` (job_id alone). The named
    ``filters``: ``:queue``, ``:lane``, ``:outcomes`` (a list), and times
    strictly after / before ``:settled_after`` ... ``:enqueued_before``
    (epoch ms)."""
    live = kind == "cancel"
    columns = (c.sequence, c.job_id) if live else COLUMNS
    query = select(*columns).where(
        c.sequence > _p("after_sequence", BigInteger()),
        c.sequence < _p("before_sequence", BigInteger()),
        IS_LIVE if live else IS_SETTLED,
    )
    for name in filters:
        if name == "queue":
            query = query.where(c.queue_name == _p("queue", Text()))
        elif name == "lane" and live:
            # The same as lane = :lane, said so that each part has its index:
            # a lane of its own (live_lane), a queue's default lane (live_queue).
            lane = _p("lane", Text())
            query = query.where(
                or_(and_(c.lane == lane, IS_CUSTOM_LANE), and_(c.queue_name == lane, _DEFAULT_LANE_NO_TRANSITIVE))
            )
        elif name == "lane":
            query = query.where(c.lane == _p("lane", Text()))
        elif name == "outcomes":
            query = query.where(c.outcome.in_(bindparam("outcomes", expanding=True)))
        elif name in ("settled_after", "enqueued_after"):
            query = query.where(c[name.replace("after", "at")] > _p(name, BigInteger()))
        elif name in ("settled_before", "enqueued_before"):
            query = query.where(c[name.replace("before", "at")] < _p(name, BigInteger()))
        else:  # pragma: no cover - the store checks the names
            raise ValueError(name)
    query = query.order_by(c.sequence).limit(_p("limit", Integer()))
    return query if live else backend.share_locked(query, t)


@cache
def bulk_pick_waiting(filters: tuple[str, ...]) -> Select[Any]:
    """:func:`bulk_pick` for ``cancel``, of the waiting jobs (revision w0014;
    read in ix_watchdog_jobs_waiting): ``:queue``, ``:lane`` and the enqueue
    times among ``filters``."""
    query = select(c.sequence, c.job_id).where(
        c.sequence > _p("after_sequence", BigInteger()),
        c.sequence < _p("before_sequence", BigInteger()),
        IS_WAITING,
    )
    for name in filters:
        if name == "queue":
            query = query.where(c.queue_name == _p("queue", Text()))
        elif name == "lane":
            # Said so that no planner reads the lane's whole history in
            # ix_watchdog_jobs_lane_history instead (the same test: NOT NULL).
            query = query.where((c.lane == _p("lane", Text())).self_group().is_(true()))
        elif name == "enqueued_after":
            query = query.where(c.enqueued_at > _p(name, BigInteger()))
        elif name == "enqueued_before":
            query = query.where(c.enqueued_at < _p(name, BigInteger()))
        else:  # pragma: no cover - BulkAction refuses the others for a cancel
            raise ValueError(name)
    # Ordered by an expression: no index delivers it, so SQLite's planner no
    # longer prefers the primary key (or the lane's history) for the order
    # and reads the waiting jobs' own index; they are few, the sort is small.
    return query.order_by(c.sequence + literal_column("0")).limit(_p("limit", Integer()))


@cache
def job_id_collation() -> Any:
    """PostgreSQL: the collation of ``watchdog_jobs.job_id`` (``default`` when the
    database's), the database's collation and its provider (``c`` libc, ``i``
    ICU, ``b`` builtin; before PostgreSQL 15 always libc)."""
    from sqlalchemy import text

    return text(
        "SELECT coalesce(co.collname, 'default'), d.datcollate,"
        " CASE WHEN current_setting('server_version_num')::int >= 150000"
        " THEN (to_jsonb(d) ->> 'datlocprovider') ELSE 'c' END"
        " FROM pg_database d, pg_attribute a"
        " LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100"
        " WHERE d.datname = current_database()"
        " AND a.attrelid = to_regclass('watchdog_jobs') AND a.attname = 'job_id'"
    )


@cache
def newest_sequence() -> Select[Any]:
    """The greatest ``sequence`` there is (NULL: no job): where a bulk action stops."""
    return select(func.max(c.sequence))


@cache
def live_counts() -> Select[Any]:
    """Live jobs per queue and state, and the earliest time one of them became
    ready (its ready time, else its enqueue time; rows from before w0004 have
    neither): for the queued ones, the queue's oldest ready job. One
    index-only read of ``ix_watchdog_jobs_live_queue``, which holds both times."""
    return (
        select(c.queue_name, c.state, func.count(), func.min(func.coalesce(c.ready_at, c.enqueued_at)))
        .where(IS_LIVE)
        .group_by(c.queue_name, c.state)
    )


@cache
def waiting_counts() -> Select[Any]:
    """Waiting jobs per queue (revision w0014: read in ix_watchdog_jobs_waiting alone)."""
    return select(c.queue_name, func.count()).where(IS_WAITING).group_by(c.queue_name)


@cache
def expired_counts() -> Select[Any]:
    """Running jobs per queue whose lease has ended by the database clock."""
    return select(c.queue_name, func.count()).where(IS_RUNNING, c.lease_until <= db_clock_ms()).group_by(c.queue_name)


@cache
def recent_outcomes() -> Select[Any]:
    """Per queue and outcome: jobs settled in the last minute and the last
    hour by the database clock (a range of ``ix_watchdog_jobs_settled``)."""
    clock = db_clock_ms()
    last_minute = func.sum(case((c.settled_at >= clock - 60_000, 1), else_=0))
    # Every outcome named, so the index (outcome, settled_at) serves one range per outcome.
    every_outcome = c.outcome.in_([literal_column(f"'{o.value}'") for o in Outcome])
    return (
        select(c.queue_name, c.outcome, last_minute, func.count())
        .where(IS_SETTLED, every_outcome, c.settled_at >= clock - 3_600_000)
        .group_by(c.queue_name, c.outcome)
    )


@cache
def stats_clock() -> Select[Any]:
    return select(db_clock_ms())


@cache
def paused_queues() -> Select[Any]:
    return select(pauses.c.queue_name, pauses.c.reason, pauses.c.paused_at).order_by(pauses.c.queue_name)


@cache
def pause(backend: Backend) -> Insert:
    """Pause ``:queue`` with ``:reason`` unless it is paused already (then no row returns)."""
    stmt: Insert = (
        _insert_into(backend, pauses)
        .values(queue_name=_p("queue", Text()), reason=_p("reason", Text()), paused_at=db_clock_ms())
        .on_conflict_do_nothing(index_elements=[pauses.c.queue_name])
        .returning(pauses.c.queue_name)
    )
    return stmt


@cache
def insert_pause() -> Insert:
    """Pause ``:queue`` with ``:reason``, a plain INSERT: where writes return
    no rows, after :func:`locked_pause` found no row (``store.maintenance.pause``)."""
    stmt: Insert = insert(pauses).values(
        queue_name=_p("queue", Text()), reason=_p("reason", Text()), paused_at=db_clock_ms()
    )
    return stmt


@cache
def locked_pause(backend: Backend) -> Select[Any]:
    """The pause of ``:queue``, if any, locked until the transaction ends."""
    return backend.locked(select(pauses.c.queue_name).where(pauses.c.queue_name == _p("queue", Text())))


@cache
def delete_pause() -> Delete:
    """:func:`resume` returning nothing (its row count says whether it was paused)."""
    return delete(pauses).where(pauses.c.queue_name == _p("queue", Text()))


@cache
def resume() -> ReturningDelete[Any]:
    """Resume ``:queue``; returns its row if it was paused."""
    return delete(pauses).where(pauses.c.queue_name == _p("queue", Text())).returning(pauses.c.queue_name)


@cache
def reruns_of() -> Select[Any]:
    """The job_ids of the reruns of ``:job``, in admission order."""
    return select(c.job_id).where(c.rerun_of == _p("job", Text())).order_by(c.sequence)


@cache
def try_advisory_xact_lock() -> Select[Any]:
    """PostgreSQL: take the advisory lock ``:key`` for this transaction if it
    is free. Never a session lock: behind a pooler in transaction mode a
    session lock would stay with whichever server session ran it."""
    return select(func.pg_try_advisory_xact_lock(_p("key", BigInteger())))


workers = workers_table
w = workers.c
recorded = schedules_table
r = recorded.c


def worker_gone_after(heartbeat_ms: ColumnElement[int], gone_heartbeats: int, margin_ms: int) -> ColumnElement[int]:
    """How long after its last heartbeat a worker counts as gone (ms)."""
    return heartbeat_ms * gone_heartbeats + margin_ms


@cache
def register_worker(backend: Backend) -> Insert:
    """Register the worker ``:worker_id`` -- or, for one registered already,
    refresh its ``last_seen`` (database clock), ``running``, ``wakeups``,
    ``claim_ahead`` and ``process_queues``: the same one statement serves the start and every
    heartbeat, and brings back a row pruned while its worker was frozen."""
    clock = db_clock_ms()
    stmt = _insert_into(backend, workers).values(
        worker_id=_p("worker_id", Text()),
        host=_p("host", Text()),
        pid=_p("pid", Integer()),
        queues=_p("queues", Text()),
        concurrency=_p("concurrency", Integer()),
        wakeups=_p("wakeups", Text()),
        version=_p("version", Text()),
        heartbeat_ms=_p("heartbeat_ms", BigInteger()),
        started_at=clock,
        last_seen=clock,
        running=_p("running", Integer()),
        claim_ahead=_p("claim_ahead", Integer()),
        process_queues=_p("process_queues", Text()),
    )
    # claim_ahead and process_queues too: a row registered before revision
    # w0017 (w0018) reads 0 ([]) until then.
    return backend.upsert(
        stmt,
        [w.worker_id],
        lambda ex: {
            "last_seen": clock,
            "running": ex.running,
            "wakeups": ex.wakeups,
            "claim_ahead": ex.claim_ahead,
            "process_queues": ex.process_queues,
        },
    )


@cache
def deregister_worker() -> Delete:
    return delete(workers).where(w.worker_id == _p("worker_id", Text()))


@cache
def list_workers() -> Select[Any]:
    """Every registered worker, oldest first, with the database clock."""
    return select(*w, db_clock_ms().label("now")).order_by(w.started_at, w.worker_id)


@cache
def live_worker_queues(gone_heartbeats: int, margin_ms: int) -> Select[Any]:
    """The queues (JSON arrays) of the workers not gone by the database clock."""
    return select(w.queues).where(
        w.last_seen + worker_gone_after(w.heartbeat_ms, gone_heartbeats, margin_ms) >= db_clock_ms()
    )


@cache
def prune_workers(backend: Backend, gone_heartbeats: int, margin_ms: int) -> Delete:
    """Delete at most ``:limit`` workers gone for longer than ``:keep_ms``."""
    long_gone = (
        select(w.worker_id)
        .where(
            w.last_seen + worker_gone_after(w.heartbeat_ms, gone_heartbeats, margin_ms) + _p("keep_ms", BigInteger())
            < db_clock_ms()
        )
        .limit(_p("limit", Integer()))
    )
    return delete(workers).where(backend.among(w.worker_id, long_gone))


@cache
def record_schedule(backend: Backend) -> Insert:
    """Record that ``:recorded_by`` serves a schedule (one row per name and
    definition): its next slot and the latest slot enqueued (never moved
    back), seen now by the database clock."""
    clock = db_clock_ms()
    stmt = _insert_into(backend, recorded).values(
        name=_p("name", Text()),
        fingerprint=_p("fingerprint", Text()),
        cron=_p("cron", Text()),
        timezone=_p("timezone", Text()),
        queue_name=_p("queue", Text()),
        next_slot=_p("next_slot", BigInteger()),
        last_enqueued=_p("last_enqueued", BigInteger()),
        recorded_by=_p("recorded_by", Text()),
        last_seen=clock,
    )

    def updated(excluded: Any) -> dict[str, Any]:
        # The latest slot enqueued, never moved back (MariaDB assigns in
        # order: last_enqueued is read before anything assigns it).
        latest = case(
            (r.last_enqueued.is_(None), excluded.last_enqueued),
            (excluded.last_enqueued.is_(None), r.last_enqueued),
            (excluded.last_enqueued > r.last_enqueued, excluded.last_enqueued),
            else_=r.last_enqueued,
        )
        return {
            "next_slot": excluded.next_slot,
            "last_enqueued": latest,
            "recorded_by": excluded.recorded_by,
            "last_seen": clock,
        }

    return backend.upsert(stmt, [r.name, r.fingerprint], updated)


@cache
def list_schedules() -> Select[Any]:
    """Every recorded schedule by name, most recently seen definition first."""
    return select(*r, db_clock_ms().label("now")).order_by(r.name, r.last_seen.desc(), r.fingerprint)


@cache
def prune_schedules(backend: Backend) -> Delete:
    """Forget at most ``:limit`` recorded schedules not seen for ``:keep_ms``."""
    stale = (
        select(r.name, r.fingerprint)
        .where(r.last_seen + _p("keep_ms", BigInteger()) < db_clock_ms())
        .limit(_p("limit", Integer()))
    )
    return delete(recorded).where(backend.among(tuple_(r.name, r.fingerprint), stale))


@cache
def make_due(filtered: bool) -> Update:
    """FOR TESTS ONLY (:func:`sqlalchemy_watchdog.testing.drain` with
    ``advance_time=True``): set ``ready_at`` of every delayed job (of the
    expanding ``:queues`` when ``filtered``) whose time has not come to the
    database clock, so the next promotion makes it ``queued``. Jobs already
    due keep their ``ready_at``.

    A delayed job stays ``delayed`` here -- promotion remains the only way
    to ``queued`` -- and the row keeps every CHECK of the state grammar
    (a delayed job has a ``ready_at``). Never run by a runner.
    """
    clock = db_clock_ms()
    stmt = update(t).where(IS_DELAYED, c.ready_at > clock)
    if filtered:
        stmt = stmt.where(c.queue_name.in_(_QUEUES))
    return stmt.values(ready_at=clock).returning(c.sequence)


@cache
def waiting_jobs() -> Select[Any]:
    """FOR TESTS ONLY (:func:`sqlalchemy_watchdog.testing.drain`): up to
    ``:limit`` jobs of the expanding ``:queues`` that still wait to run --
    delayed, or queued in a queue that is not paused -- job_id and state,
    read from ``ix_watchdog_jobs_live_queue``."""
    return (
        select(c.job_id, c.state)
        .where(IS_LIVE, c.queue_name.in_(_QUEUES), or_(IS_DELAYED, and_(IS_QUEUED, UNPAUSED)))
        .limit(_p("limit", Integer()))
    )
