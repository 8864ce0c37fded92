"""Constants, type variables, and rows made views.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from .. import statements as sql
from .. import telemetry
from ..backends import UnreadableText
from ..jobs import (
    Job,
    JobState,
    JobView,
    Outcome,
    RetryPolicy,
    Undecodable,
    at_epoch_ms,
    frozen_builder,
    history_of,
    payload_of,
)
from ..records import PROMOTE_BATCH as PROMOTE_BATCH

log = logging.getLogger("sqlalchemy_watchdog.store")

T = TypeVar("T")
P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])


#: Rows per multi-row INSERT (all rows travel as one JSON parameter).
ENQUEUE_CHUNK = 1000


def _one_chunk(jobs: Sequence[Job], **_: object) -> bool:
    """Whether enqueueing ``jobs`` writes with one statement (atomic by itself)."""
    # Jobs with parents read them and write their edges: a transaction.
    return len({job.job_id for job in jobs}) <= ENQUEUE_CHUNK and not any(job.after for job in jobs)


#: Live jobs settled per ``fail_lane`` call.
LANE_FAILURE_BATCH = 100
NO_POLICY_REASON = "Execution disappeared without a recovery policy"


def now_ms() -> int:
    """The application clock in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def new_claim_token() -> str:
    return f"claim_{uuid.uuid4().hex}"


_STATES = {state.value: state for state in JobState}
_OUTCOMES = {outcome.value: outcome for outcome in Outcome}
#: The order :func:`view` unpacks (asserted against :data:`statements.COLUMNS`).
_VIEW_ORDER = (
    "sequence", "job_id", "queue_name", "lane", "priority", "payload_json", "recovery_max", "state",
    "outcome", "claim_token", "recovery_count", "cancellation_id", "failure_reason", "failure_detail",
    "lease_until", "run_at", "ready_at", "attempt", "max_attempts", "retry_policy", "timeout_ms",
    "snoozes", "failure_history", "enqueued_at", "started_at", "settled_at", "rerun_of", "trace_context",
    "limit_key",
    "result_json", "progress", "progress_note", "waiting_on", "after_policy",
)  # fmt: skip
assert tuple(column.key for column in sql.COLUMNS) == _VIEW_ORDER, "view() must unpack statements.COLUMNS"
_WIDTH = len(_VIEW_ORDER)


#: JobView's fields in the order :func:`view` fills them (asserted against the class).
_JOBVIEW_FIELDS = (
    "sequence", "job_id", "queue", "lane", "priority", "payload", "max_recoveries", "state", "outcome",
    "failure_reason", "recovery_count", "cancellation_id", "failure_detail", "run_at", "ready_at", "attempt",
    "max_attempts", "snoozes", "timeout", "retry", "failure_history", "enqueued_at", "started_at",
    "settled_at", "rerun_of", "reruns", "trace_context", "undecodable", "key", "held_by", "result",
    "progress", "progress_note", "waiting_on", "after_policy", "parents", "dependents",
)  # fmt: skip
#: A JobView from its fields' values (jobs.frozen_builder), 0.4 us: the frozen
#: dataclass's __init__ sets its 37 slots one object.__setattr__ call at a
#: time (4.6 us), the slots' own setters took 2.5 -- and view() runs for
#: every claimed job.
_build_view = frozen_builder(JobView, _JOBVIEW_FIELDS)


def unreadable_columns(row: Sequence[Any]) -> list[str]:
    """The columns of a row starting with :data:`statements.COLUMNS` that
    hold :class:`~sqlalchemy_watchdog.backends.UnreadableText`."""
    return [name for name, value in zip(_VIEW_ORDER, row) if type(value) is UnreadableText]


def view(row: Sequence[Any]) -> JobView:
    """Turn a row that starts with :data:`statements.COLUMNS` (a ``Row`` or
    a driver's tuple) into a :class:`JobView`.

    Positional, not by name: the runner's hot statements hand over the
    driver's tuples (:func:`execute_rows`), and this runs once per claimed
    job (and per settled job whose view is read).

    Never raises for a stored value it cannot decode (a row a producer
    wrote itself): that field reads as unknown (:class:`~sqlalchemy_watchdog.Undecodable`,
    see :attr:`JobView.undecodable`), so one such row never stops a claim,
    a settle, a recovery or a read of the others."""
    (
        sequence, job_id, queue_name, lane, priority, payload_json, recovery_max, state,
        outcome, _token, recovery_count, cancellation_id, failure_reason, failure_detail,
        _lease, run_at, ready_at, attempt, max_attempts, retry_policy, timeout_ms,
        snoozes, failure_history, enqueued_at, started_at, settled_at, rerun_of, trace_context, limit_key,
        result_json, progress, progress_note, waiting_on, after_policy,
    ) = row[:_WIDTH]  # fmt: skip
    try:
        values = (
            sequence,
            job_id,
            queue_name,
            lane,
            priority,
            payload_of(payload_json),
            recovery_max,
            _STATES[state],
            None if outcome is None else _OUTCOMES[outcome],
            failure_reason,
            recovery_count,
            cancellation_id,
            failure_detail,
            None if run_at is None else at_epoch_ms(run_at),
            None if ready_at is None else at_epoch_ms(ready_at),
            attempt,
            max_attempts,
            snoozes,
            None if timeout_ms is None else timedelta(milliseconds=timeout_ms),
            None if max_attempts is None else RetryPolicy.from_stored(max_attempts, retry_policy),
            history_of(failure_history) if failure_history else (),
            None if enqueued_at is None else at_epoch_ms(enqueued_at),
            None if started_at is None else at_epoch_ms(started_at),
            None if settled_at is None else at_epoch_ms(settled_at),
            rerun_of,
            (),
            None if trace_context is None else telemetry.trace_context_of(trace_context),
            (),
            limit_key,
            None,
            None if result_json is None else payload_of(result_json),
            progress,
            progress_note,
            waiting_on,
            after_policy,
            (),
            (),
        )
        if UnreadableText in map(type, row):  # text that is not UTF-8 (SQLite)
            raise ValueError("unreadable text")
    except Exception:  # a value the library would never have stored
        values = _decoded_field_by_field(row)
    return _build_view(*values)


def _decoded_field_by_field(row: Sequence[Any]) -> tuple[Any, ...]:
    """:func:`view`'s values for a row with a value it cannot decode: each
    decoded on its own, what fails read as unknown and listed."""
    (
        sequence, job_id, queue_name, lane, priority, payload_json, recovery_max, state,
        outcome, _token, recovery_count, cancellation_id, failure_reason, failure_detail,
        _lease, run_at, ready_at, attempt, max_attempts, retry_policy, timeout_ms,
        snoozes, failure_history, enqueued_at, started_at, settled_at, rerun_of, trace_context, limit_key,
        result_json, progress, progress_note, waiting_on, after_policy,
    ) = row[:_WIDTH]  # fmt: skip
    unknown: list[Undecodable] = []

    def decoded(field: str, column: str, decode: Callable[[Any], Any], value: Any, otherwise: Any) -> Any:
        if value is None:
            return None
        try:
            if type(value) is UnreadableText:
                raise UnicodeError("stored text is not UTF-8")
            return decode(value)
        except Exception as error:
            unknown.append(Undecodable.of(field, column, error))
            return unknown[-1] if otherwise is _ITSELF else otherwise

    def time_of(field: str, value: Any) -> datetime | None:
        return decoded(field, field, at_epoch_ms, value, None)  # type: ignore[no-any-return]

    payload = decoded("payload", "payload_json", payload_of, payload_json, _ITSELF)
    run = time_of("run_at", run_at)
    ready = time_of("ready_at", ready_at)
    timeout = decoded("timeout", "timeout_ms", lambda ms: timedelta(milliseconds=ms), timeout_ms, None)
    # The stored max_attempts (a plain, CHECKed column) still bounds the job's
    # attempts: only the backoff falls back to the defaults.
    fallback = None if max_attempts is None else RetryPolicy(max_attempts=max_attempts)
    retry = (
        None
        if max_attempts is None
        else decoded(
            "retry", "retry_policy", lambda text: RetryPolicy.from_stored(max_attempts, text), retry_policy, fallback
        )
        or fallback
    )
    history = decoded("failure_history", "failure_history", history_of, failure_history or None, ()) or ()
    enqueued = time_of("enqueued_at", enqueued_at)
    started = time_of("started_at", started_at)
    settled = time_of("settled_at", settled_at)
    trace = decoded("trace_context", "trace_context", telemetry.trace_context_of, trace_context, None)
    result = decoded("result", "result_json", payload_of, result_json, _ITSELF)
    for field, column, value in (
        ("job_id", "job_id", job_id), ("queue", "queue_name", queue_name), ("lane", "lane", lane),
        ("cancellation_id", "cancellation_id", cancellation_id), ("failure_reason", "failure_reason", failure_reason),
        ("failure_detail", "failure_detail", failure_detail), ("rerun_of", "rerun_of", rerun_of),
        ("key", "limit_key", limit_key),
        ("progress_note", "progress_note", progress_note),
    ):  # fmt: skip
        if type(value) is UnreadableText:  # read as it is (U+FFFD for the bytes), listed unknown
            unknown.append(Undecodable(field, column, "stored text is not UTF-8"))
    return (
        sequence,
        job_id,
        queue_name,
        lane,
        priority,
        payload,
        recovery_max,
        _STATES[state],
        None if outcome is None else _OUTCOMES[outcome],
        failure_reason,
        recovery_count,
        cancellation_id,
        failure_detail,
        run,
        ready,
        attempt,
        max_attempts,
        snoozes,
        timeout,
        retry,
        history,
        enqueued,
        started,
        settled,
        rerun_of,
        (),
        trace,
        tuple(unknown),
        limit_key,
        None,
        result,
        progress,
        progress_note,
        waiting_on,
        after_policy,
        (),
        (),
    )


#: ``decoded(..., otherwise=_ITSELF)``: an undecodable value reads as its :class:`Undecodable`.
_ITSELF: Any = object()
