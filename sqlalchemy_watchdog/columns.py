"""The columns of ``watchdog_jobs`` the library reads and enqueues, declared once.

:data:`JOB_COLUMNS` lists, in the order every read selects them, each column
a job's row is read by: the :class:`~sqlalchemy_watchdog.JobView` field it
fills (or None: the store's own, such as the claim token) and how its stored
value reads (:class:`ReadAs`). From it derive

* the selected columns (``sql.COLUMNS``),
* the view builder (``store.base.view``: the positions, the decoders, the
  fallback that reads an undecodable value as unknown),
* the identity an enqueue writes and a replay compares
  (``sql.IDENTITY_FIELDS`` and ``store.enqueue``'s values of a
  :class:`~sqlalchemy_watchdog.Job`: :attr:`JobColumn.identity`),
* the named positions the store reads a row by (:func:`position`),

and a test holds :class:`~sqlalchemy_watchdog.JobView`'s fields to it: every
field is filled by one column here or named in :data:`FILLED_ELSEWHERE`.

Adding a column to ``watchdog_jobs`` end to end: the model (``model.py``) and
its revision, one line here, and what shows it (``JobView`` and the pages
that print it); see ``docs/design.md``, "Adding a column".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Integer, Text
from sqlalchemy.types import TypeEngine

__all__ = [
    "FILLED_ELSEWHERE",
    "JOB_COLUMNS",
    "NOT_READ",
    "IdentityOf",
    "JobColumn",
    "ReadAs",
    "column_names",
    "position",
]


class ReadAs(enum.Enum):
    """How a stored value becomes its :class:`~sqlalchemy_watchdog.JobView`
    field, and what it reads as when it cannot be decoded (a row a producer
    wrote by hand; see :attr:`JobView.undecodable`)."""

    #: As stored: numbers and values the CHECK grammar holds to their domain.
    STORED = "stored"
    #: Text as stored; text that is not UTF-8 (SQLite) reads as it is, listed unknown.
    TEXT = "text"
    #: The job's state (``JobState``).
    STATE = "state"
    #: The outcome (``Outcome``), None while not settled.
    OUTCOME = "outcome"
    #: Canonical JSON (payload, result); undecodable: the ``Undecodable`` itself.
    JSON = "json"
    #: Epoch milliseconds as an aware ``datetime``; undecodable: None.
    EPOCH_MS = "epoch_ms"
    #: Milliseconds as a ``timedelta``; undecodable: None.
    DURATION_MS = "duration_ms"
    #: The stored retry policy with the row's ``max_attempts``; undecodable:
    #: the default policy with that ``max_attempts``.
    RETRY = "retry"
    #: The failure history (JSON); undecodable: ``()``.
    HISTORY = "history"
    #: A W3C trace context (JSON); undecodable: None.
    TRACE = "trace"


@dataclass(frozen=True)
class IdentityOf:
    """A column an enqueue writes from the :class:`~sqlalchemy_watchdog.Job`
    and a replay compares: the job's attribute and the bind type the rows are
    sent as."""

    attribute: str
    bind: TypeEngine[Any]


@dataclass(frozen=True)
class JobColumn:
    """One column of ``watchdog_jobs`` as the library reads it."""

    #: The table's column.
    column: str
    #: The :class:`~sqlalchemy_watchdog.JobView` field it fills; None for a
    #: column only the store reads (the claim token, the lease).
    field: str | None
    #: How its stored value reads.
    read_as: ReadAs
    #: Part of the job's identity (written by an enqueue from this attribute,
    #: compared by a replay); None: set by the database or the runners.
    identity: IdentityOf | None = None


#: Every column a job is read by, in the order reads select them (append a
#: new one at the end: the hot statements' texts and plans keep theirs).
JOB_COLUMNS: tuple[JobColumn, ...] = (
    JobColumn("sequence", "sequence", ReadAs.STORED),
    JobColumn("job_id", "job_id", ReadAs.TEXT, IdentityOf("job_id", Text())),
    JobColumn("queue_name", "queue", ReadAs.TEXT, IdentityOf("queue", Text())),
    JobColumn("lane", "lane", ReadAs.TEXT, IdentityOf("lane", Text())),
    JobColumn("priority", "priority", ReadAs.STORED, IdentityOf("priority", BigInteger())),
    JobColumn("payload_json", "payload", ReadAs.JSON, IdentityOf("payload_json", Text())),
    JobColumn("recovery_max", "max_recoveries", ReadAs.STORED, IdentityOf("max_recoveries", Integer())),
    JobColumn("state", "state", ReadAs.STATE),
    JobColumn("outcome", "outcome", ReadAs.OUTCOME),
    JobColumn("claim_token", None, ReadAs.STORED),
    JobColumn("recovery_count", "recovery_count", ReadAs.STORED),
    JobColumn("cancellation_id", "cancellation_id", ReadAs.TEXT),
    JobColumn("failure_reason", "failure_reason", ReadAs.TEXT),
    JobColumn("failure_detail", "failure_detail", ReadAs.TEXT),
    JobColumn("lease_until", None, ReadAs.STORED),
    JobColumn("run_at", "run_at", ReadAs.EPOCH_MS, IdentityOf("run_at_ms", BigInteger())),
    JobColumn("ready_at", "ready_at", ReadAs.EPOCH_MS),
    JobColumn("attempt", "attempt", ReadAs.STORED),
    JobColumn("max_attempts", "max_attempts", ReadAs.STORED, IdentityOf("max_attempts", Integer())),
    JobColumn("retry_policy", "retry", ReadAs.RETRY, IdentityOf("retry_json", Text())),
    JobColumn("timeout_ms", "timeout", ReadAs.DURATION_MS, IdentityOf("timeout_ms", BigInteger())),
    JobColumn("snoozes", "snoozes", ReadAs.STORED),
    JobColumn("failure_history", "failure_history", ReadAs.HISTORY),
    JobColumn("enqueued_at", "enqueued_at", ReadAs.EPOCH_MS),
    JobColumn("started_at", "started_at", ReadAs.EPOCH_MS),
    JobColumn("settled_at", "settled_at", ReadAs.EPOCH_MS),
    JobColumn("rerun_of", "rerun_of", ReadAs.TEXT, IdentityOf("rerun_of", Text())),
    JobColumn("trace_context", "trace_context", ReadAs.TRACE),
    JobColumn("limit_key", "key", ReadAs.TEXT, IdentityOf("key", Text())),
    JobColumn("result_json", "result", ReadAs.JSON),
    JobColumn("progress", "progress", ReadAs.STORED),
    JobColumn("progress_note", "progress_note", ReadAs.TEXT),
    JobColumn("waiting_on", "waiting_on", ReadAs.STORED),
    JobColumn("after_policy", "after_policy", ReadAs.STORED),
)

#: The :class:`~sqlalchemy_watchdog.JobView` fields no column of a job's own
#: row fills, with the value a plain read gives them (``Watchdog.read`` fills
#: ``reruns``, ``held_by``, ``parents`` and ``dependents`` from other rows;
#: the view builder fills ``undecodable``).
FILLED_ELSEWHERE: dict[str, Any] = {
    "reruns": (),
    "undecodable": (),
    "held_by": None,
    "parents": (),
    "dependents": (),
}

#: The columns of ``watchdog_jobs`` no read selects, and why: together with
#: :data:`JOB_COLUMNS`, every column of the table (a test holds them to the
#: model, so a new column is declared here or there).
NOT_READ: dict[str, str] = {
    "watched": "a flag for the triggers that count a watched job's edges (revision w0013)",
    "unstarted": "a running job claimed ahead, its handler not started; read by recovery's statement (revision w0019)",
}

_POSITIONS = {spec.column: index for index, spec in enumerate(JOB_COLUMNS)}


def column_names() -> tuple[str, ...]:
    """The columns of :data:`JOB_COLUMNS`, in their order."""
    return tuple(spec.column for spec in JOB_COLUMNS)


def position(column: str) -> int:
    """Where ``column`` stands in a row read by :data:`JOB_COLUMNS` (a
    ``KeyError`` names a column that is not read)."""
    return _POSITIONS[column]
