"""Uniqueness windows, debounce and throttle: the keys jobs hold (revision w0020).

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring); this feature's
statements are its own, in :mod:`.unique_sql`.

An enqueue of a job with a ``unique_key`` (``Job(unique_for=... |
debounce=... | throttle=...)``) first decides, in the caller's transaction,
what the key says:

1. ``INSERT ... ON CONFLICT DO NOTHING`` of the key's row: a key nobody
   holds is now this job's (it is then enqueued as any job).
2. Else the row is read ``FOR UPDATE`` (on SQLite the first statement took
   the write lock already): concurrent enqueues of one key are judged one
   after the other, each seeing what the one before it committed. The
   holder's state is read by a statement *after* that lock, so it sees
   the holder as committed (a holder enqueued concurrently is never missed).
3. By the row and the holder's state: the key is free (its window ended,
   or its holder left the states it holds in) and this job takes it; or a
   debounced holder still waiting gets this job's payload and a later start
   (one ``UPDATE`` guarded by its state: a holder a runner claimed in the
   meantime is never changed, and the key passes to this job); or a
   throttled key's next period takes this job (``throttle_excess="delay"``);
   or this enqueue is a duplicate of the holder (its row counts it).

A replay of a stored ``job_id`` is judged by its contents as always
(duplicate or :class:`~sqlalchemy_watchdog.EnqueueConflict`), whatever key
it names. Every window is on the database clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from ..backends import backend_of
from ..jobs import Job, JobState, ReplaceResult, ReplaceStatus, at_epoch_ms, epoch_ms
from ..jobs.uniqueness import ThrottleExcess, UniqueIntent, UniqueKeyHold, UniqueKind, UniqueStates
from .operation import Shape, operation
from .unique_sql import (
    count_duplicate,
    count_replacement,
    held_by,
    insert_key,
    job_state,
    lock_key,
    pass_key,
    prune_ended,
    replace_job,
    replace_waiting,
    take_fresh,
)

__all__ = [
    "KEY_RETENTION_MS",
    "Admission",
    "Decision",
    "admit",
    "keys_held_by",
    "prune_keys",
    "replace",
]

#: States in which a job is waiting: not yet claimed by a runner.
WAITING = frozenset({JobState.DELAYED.value, JobState.QUEUED.value, JobState.WAITING.value})
#: ... and in which it is not settled yet.
UNSETTLED = WAITING | {JobState.RUNNING.value}
#: A key row is deleted by the retention pass this long after its window
#: ended (a debounce's: after its holder's planned start): an ended window
#: holds nothing, and a day leaves ``show`` something to explain.
KEY_RETENTION_MS = 86_400_000


class Decision(enum.Enum):
    """What an enqueue's key decided (:func:`admit`)."""

    #: The job holds the key: enqueue it (with :attr:`Admission.delay_ms`).
    HOLD = "hold"
    #: The job is a replay of the key's holder, or its ``job_id`` is stored
    #: already: the enqueue statement judges it by its contents.
    REPLAY = "replay"
    #: A duplicate of the holder (:attr:`Admission.holder`): nothing written
    #: but the count on the key's row.
    DUPLICATE = "duplicate"
    #: The waiting holder took this job's payload and start.
    REPLACED = "replaced"


@dataclass(frozen=True, slots=True)
class Admission:
    """What :func:`admit` decided for one job."""

    decision: Decision
    #: The key's holder (the job itself when it holds it).
    holder: str
    #: The delay its enqueue applies, in ms from the database clock (None: none).
    delay_ms: int | None = None


# -- the operations -----------------------------------------------------------------


@operation(Shape.WRITE)
def replace(
    conn: Connection,
    job_id: str,
    *,
    payload: str | None,
    start: datetime | None,
    set_start: bool,
) -> ReplaceResult:
    """Give waiting job ``job_id`` the encoded ``payload`` (None: keep its
    own) and, when ``set_start``, the start ``start`` (None: at once) --
    refused once a runner claimed it."""
    params = {
        "target": job_id,
        "payload": payload,
        "start": None if start is None else epoch_ms(start),
        "set_start": 1 if set_start else 0,
    }
    if conn.execute(replace_job(), params).rowcount > 0:
        return ReplaceResult(job_id, ReplaceStatus.REPLACED)
    found = conn.execute(job_state(), {"job_id": job_id}).first()
    return ReplaceResult(job_id, ReplaceStatus.MISSING if found is None else ReplaceStatus.NOT_WAITING)


def admit(conn: Connection, job: Job) -> Admission:
    """Decide what ``job``'s key says (see the module's docstring), writing
    the key's row; the caller then enqueues the job if it holds the key."""
    intent = job.unique
    assert intent is not None
    params = {
        "key": intent.key,
        "job_id": job.job_id,
        "kind": intent.kind.value,
        "states": intent.states.value,
        "window": intent.window_ms,
    }
    row = _take_fresh(conn, params)
    if row is None:
        return Admission(Decision.HOLD, job.job_id, _first_delay(intent))
    if row.job_id == job.job_id:
        return Admission(Decision.REPLAY, job.job_id)
    if conn.execute(job_state(), {"job_id": job.job_id}).first() is not None:
        return Admission(Decision.REPLAY, job.job_id)  # stored already: its replay rules apply
    now: int = row.now
    state: str | None = conn.execute(job_state(), {"job_id": row.job_id}).scalar()
    if not _held(row.kind, row.states, row.until_ms, state, now):
        return _take(conn, job, intent, now)
    if intent.kind is UniqueKind.DEBOUNCE and row.kind == UniqueKind.DEBOUNCE.value:
        start = now + intent.window_ms
        if intent.max_wait_ms is not None:
            start = max(min(start, row.since_ms + intent.max_wait_ms), row.since_ms + 1)
        replaced = conn.execute(
            replace_waiting(), {"holder": row.job_id, "payload": job.payload_json, "ready_at": start}
        ).rowcount
        if not replaced:  # claimed since its state was read: the key is free
            return _take(conn, job, intent, now)
        conn.execute(count_replacement(), {"key": intent.key, "until": start})
        return Admission(Decision.REPLACED, row.job_id)
    if (
        intent.kind is UniqueKind.THROTTLE
        and intent.excess is ThrottleExcess.DELAY
        and row.kind == UniqueKind.THROTTLE.value
        and row.since_ms <= now
    ):
        # The period's job has its turn; this one takes the next period.
        since = row.until_ms
        _pass(conn, job, intent, since, since + intent.window_ms)
        return Admission(Decision.HOLD, job.job_id, since - now)
    conn.execute(count_duplicate(), {"key": intent.key})
    return Admission(Decision.DUPLICATE, row.job_id)


def _take_fresh(conn: Connection, params: dict[str, Any]) -> Any:
    """Take the key for the job if no row holds it (None), else the key's
    row, locked (steps 1 and 2 of the module's docstring).

    Where writes return no rows (MariaDB/MySQL: no ``ON CONFLICT``), one
    ``INSERT ... ON DUPLICATE KEY UPDATE`` inserts the row or locks the one
    there (waiting for the enqueue that holds it), and the row is read: it
    is this job's own when it names the job and no such job is stored (a
    stored one is a replay, as below)."""
    backend = backend_of(conn)
    key = {"key": params["key"]}
    if backend.writes_return_rows:
        if conn.execute(take_fresh(backend), params).first() is not None:
            return None
        return conn.execute(lock_key(), key).one()
    conn.execute(insert_key(backend), params)
    row = conn.execute(lock_key(), key).one()
    if row.job_id == params["job_id"] and conn.execute(job_state(), {"job_id": params["job_id"]}).first() is None:
        return None
    return row


def _held(kind: str, states: str, until_ms: int, state: str | None, now: int) -> bool:
    """Whether a key's row still holds it against a newcomer."""
    if kind == UniqueKind.DEBOUNCE.value:
        return state in WAITING
    if until_ms <= now:
        return False
    if kind == UniqueKind.THROTTLE.value or states == UniqueStates.ANY.value:
        return True
    return state in (WAITING if states == UniqueStates.WAITING.value else UNSETTLED)


def _first_delay(intent: UniqueIntent) -> int | None:
    """A debounced job starts its window after its enqueue."""
    return intent.window_ms if intent.kind is UniqueKind.DEBOUNCE else None


def _take(conn: Connection, job: Job, intent: UniqueIntent, now: int) -> Admission:
    _pass(conn, job, intent, now, now + intent.window_ms)
    return Admission(Decision.HOLD, job.job_id, _first_delay(intent))


def _pass(conn: Connection, job: Job, intent: UniqueIntent, since: int, until: int) -> None:
    conn.execute(
        pass_key(),
        {
            "key": intent.key,
            "holder": job.job_id,
            "kind": intent.kind.value,
            "states": intent.states.value,
            "since": since,
            "until": until,
        },
    )


@operation(Shape.READ)
def keys_held_by(conn: Connection, job_id: str) -> list[UniqueKeyHold]:
    """The unique keys job ``job_id`` holds (usually none or one)."""
    return [
        UniqueKeyHold(
            row.unique_key,
            UniqueKind(row.kind),
            UniqueStates(row.states),
            at_epoch_ms(row.since_ms),
            at_epoch_ms(row.until_ms),
            row.duplicates,
            row.replacements,
        )
        for row in conn.execute(held_by(), {"job_id": job_id})
    ]


def prune_keys(conn: Connection, *, limit: int) -> int:
    """Delete at most ``limit`` key rows a day past their window; how many."""
    return int(conn.execute(prune_ended(backend_of(conn)), {"age": KEY_RETENTION_MS, "limit": limit}).rowcount)
