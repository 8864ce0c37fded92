"""Constants, type variables, and rows made views.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from .. import telemetry
from ..backends import UnreadableText
from ..columns import FILLED_ELSEWHERE, JOB_COLUMNS, JobColumn, ReadAs, column_names
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
from . import sql

log = logging.getLogger("sqlalchemy_watchdog.store")

T = TypeVar("T")
P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])


#: Rows per multi-row INSERT (all rows travel as one JSON parameter).
ENQUEUE_CHUNK = 1000

#: The most characters of text one multi-row statement carries (enqueue,
#: settle): all its rows travel as one JSON parameter, and MariaDB refuses a
#: packet over its ``max_allowed_packet`` (16 MiB by default; MySQL 8's is
#: 64 MiB) by closing the connection. Two million characters stay under 16
#: MiB even when each encodes to four bytes of UTF-8 and JSON escapes add
#: half again; one job's payload or result is at most 1 MiB.
STATEMENT_CHARS_MAX = 2 * 1024 * 1024

#: What a job's row carries besides its payload (fields, separators), counted
#: towards :data:`STATEMENT_CHARS_MAX`.
_ROW_CHARS = 256


def job_chars(job: Job) -> int:
    """About how many characters ``job``'s row adds to an enqueue statement."""
    return len(job.payload_json) + len(job.job_id) + _ROW_CHARS


def sized_chunks(items: Sequence[T], size: Callable[[T], int], count_max: int) -> list[Sequence[T]]:
    """``items`` cut, in order, into runs of at most ``count_max`` items and
    :data:`STATEMENT_CHARS_MAX` characters (by ``size``) -- one statement
    each; an item alone over the limit is a run of its own."""
    chunks: list[Sequence[T]] = []
    start = chars = 0
    for index, item in enumerate(items):
        n = size(item)
        if index > start and (index - start >= count_max or chars + n > STATEMENT_CHARS_MAX):
            chunks.append(items[start:index])
            start, chars = index, 0
        chars += n
    if start < len(items):
        chunks.append(items[start:])
    return chunks


def _one_chunk(jobs: Sequence[Job], **_: object) -> bool:
    """Whether enqueueing ``jobs`` writes with one statement (atomic by itself)."""
    # Jobs with parents read them and write their edges, and a job with a
    # unique_key locks its key before it is written: a transaction.
    return (
        len({job.job_id for job in jobs}) <= ENQUEUE_CHUNK
        and sum(map(job_chars, jobs)) <= STATEMENT_CHARS_MAX
        and not any(job.after or job.unique is not None for job in jobs)
    )


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
#: The columns a row starts with, in :data:`~sqlalchemy_watchdog.columns.JOB_COLUMNS` order.
_VIEW_ORDER = column_names()
assert tuple(column.key for column in sql.COLUMNS) == _VIEW_ORDER, "view() must unpack sql.COLUMNS"
_WIDTH = len(_VIEW_ORDER)
#: JobView's fields, in its order: what :func:`view` fills.
_JOBVIEW_FIELDS = tuple(field.name for field in dataclasses.fields(JobView))
_FILLING = {spec.field: spec for spec in JOB_COLUMNS if spec.field is not None}
assert set(_FILLING).isdisjoint(FILLED_ELSEWHERE), "a JobView field filled twice"
assert set(_JOBVIEW_FIELDS) == set(_FILLING) | set(FILLED_ELSEWHERE), (
    "every JobView field is filled by one column of columns.JOB_COLUMNS or named in columns.FILLED_ELSEWHERE"
)
#: A JobView from its fields' values (jobs.frozen_builder), 0.4 us: the frozen
#: dataclass's __init__ sets its slots one object.__setattr__ call at a
#: time (4.6 us), the slots' own setters took 2.5 -- and view() runs for
#: every claimed job.
_build_view = frozen_builder(JobView, _JOBVIEW_FIELDS)

#: How each kind of stored value reads on :func:`view`'s fast path: an
#: expression of the column's value ``{v}`` (and of ``max_attempts``, ``{m}``, which
#: the stored retry policy needs).
_FAST_READ = {
    ReadAs.STORED: "{v}",
    ReadAs.TEXT: "{v}",
    ReadAs.STATE: "_STATES[{v}]",
    ReadAs.OUTCOME: "None if {v} is None else _OUTCOMES[{v}]",
    ReadAs.JSON: "None if {v} is None else payload_of({v})",
    ReadAs.EPOCH_MS: "None if {v} is None else at_epoch_ms({v})",
    ReadAs.DURATION_MS: "None if {v} is None else timedelta(milliseconds={v})",
    ReadAs.RETRY: "None if {m} is None else RetryPolicy.from_stored({m}, {v})",
    ReadAs.HISTORY: "history_of({v}) if {v} else ()",
    ReadAs.TRACE: "None if {v} is None else trace_context_of({v})",
}


def _view_source() -> str:
    """The source of :func:`view`, written from the column declarations:
    positional, not by name, as a hand-written unpack would be -- the
    runner's hot statements hand over the driver's tuples
    (:func:`execute_rows`), and it runs once per claimed job (and per settled
    job whose view is read)."""
    names = ", ".join(f"c_{column}" for column in _VIEW_ORDER)
    values = []
    for field in _JOBVIEW_FIELDS:
        spec = _FILLING.get(field)
        if spec is None:
            values.append(f"ELSEWHERE_{field}")
        else:
            values.append(_FAST_READ[spec.read_as].format(v=f"c_{spec.column}", m="c_max_attempts"))
    body = ",\n            ".join(values)
    return (
        "def view(row):\n"
        f"    ({names},) = row[:{_WIDTH}]\n"
        "    try:\n"
        f"        values = (\n            {body},\n        )\n"
        "        if UnreadableText in map(type, row):  # text that is not UTF-8 (SQLite)\n"
        "            raise ValueError('unreadable text')\n"
        "    except Exception:  # a value the library would never have stored\n"
        "        values = _decoded_field_by_field(row)\n"
        "    return _build_view(*values)\n"
    )


def _compiled_view() -> Callable[[Sequence[Any]], JobView]:
    scope: dict[str, Any] = {
        "_STATES": _STATES,
        "_OUTCOMES": _OUTCOMES,
        "payload_of": payload_of,
        "at_epoch_ms": at_epoch_ms,
        "timedelta": timedelta,
        "RetryPolicy": RetryPolicy,
        "history_of": history_of,
        "trace_context_of": telemetry.trace_context_of,
        "UnreadableText": UnreadableText,
        "_decoded_field_by_field": _decoded_field_by_field,
        "_build_view": _build_view,
        **{f"ELSEWHERE_{field}": value for field, value in FILLED_ELSEWHERE.items()},
    }
    exec(compile(_view_source(), f"<{__name__}.view, from columns.JOB_COLUMNS>", "exec"), scope)
    function: Callable[[Sequence[Any]], JobView] = scope["view"]
    function.__doc__ = _VIEW_DOC
    function.__module__ = __name__
    function.__qualname__ = "view"
    return function


_VIEW_DOC = """Turn a row that starts with :data:`sql.COLUMNS` (a ``Row`` or
    a driver's tuple) into a :class:`JobView`.

    Written from :data:`~sqlalchemy_watchdog.columns.JOB_COLUMNS` when the
    module loads (positional, for speed: it runs once per claimed job).

    Never raises for a stored value it cannot decode (a row a producer
    wrote itself): that field reads as unknown (:class:`~sqlalchemy_watchdog.Undecodable`,
    see :attr:`JobView.undecodable`), so one such row never stops a claim,
    a settle, a recovery or a read of the others."""


def unreadable_columns(row: Sequence[Any]) -> list[str]:
    """The columns of a row starting with :data:`sql.COLUMNS` that
    hold :class:`~sqlalchemy_watchdog.backends.UnreadableText`."""
    return [name for name, value in zip(_VIEW_ORDER, row) if type(value) is UnreadableText]


#: ``decoded(..., otherwise=_ITSELF)``: an undecodable value reads as its :class:`Undecodable`.
_ITSELF: Any = object()
_NOT_UTF8 = "stored text is not UTF-8"


def _decoded_field_by_field(row: Sequence[Any]) -> tuple[Any, ...]:
    """:func:`view`'s values for a row with a value it cannot decode: each
    decoded on its own, what fails read as unknown (as its
    :class:`~sqlalchemy_watchdog.columns.ReadAs` says) and listed, in
    column order."""
    stored = dict(zip(_VIEW_ORDER, row[:_WIDTH], strict=True))
    unknown: list[Undecodable] = []

    def decoded(spec: JobColumn, decode: Callable[[Any], Any], value: Any, otherwise: Any) -> Any:
        if value is None:
            return None
        try:
            if type(value) is UnreadableText:
                raise UnicodeError(_NOT_UTF8)
            return decode(value)
        except Exception as error:
            assert spec.field is not None
            unknown.append(Undecodable.of(spec.field, spec.column, error))
            return unknown[-1] if otherwise is _ITSELF else otherwise

    values: dict[str, Any] = dict(FILLED_ELSEWHERE)
    for spec in JOB_COLUMNS:
        if spec.field is None:
            continue
        value = stored[spec.column]
        kind = spec.read_as
        if kind is ReadAs.STORED:
            read = value
        elif kind is ReadAs.TEXT:
            read = value
            if type(value) is UnreadableText:  # read as it is (U+FFFD for the bytes), listed unknown
                unknown.append(Undecodable(spec.field, spec.column, _NOT_UTF8))
        elif kind is ReadAs.STATE:
            read = _STATES[value]
        elif kind is ReadAs.OUTCOME:
            read = None if value is None else _OUTCOMES[value]
        elif kind is ReadAs.JSON:
            read = decoded(spec, payload_of, value, _ITSELF)
        elif kind is ReadAs.EPOCH_MS:
            read = decoded(spec, at_epoch_ms, value, None)
        elif kind is ReadAs.DURATION_MS:
            read = decoded(spec, lambda ms: timedelta(milliseconds=ms), value, None)
        elif kind is ReadAs.RETRY:
            # The stored max_attempts (a plain, CHECKed column) still bounds
            # the job's attempts: only the backoff falls back to the defaults.
            max_attempts = stored["max_attempts"]
            fallback = None if max_attempts is None else RetryPolicy(max_attempts=max_attempts)
            read = (
                None
                if max_attempts is None
                else decoded(spec, functools.partial(RetryPolicy.from_stored, max_attempts), value, fallback)
                or fallback
            )
        elif kind is ReadAs.HISTORY:
            read = decoded(spec, history_of, value or None, ()) or ()
        else:
            assert kind is ReadAs.TRACE, kind
            read = decoded(spec, telemetry.trace_context_of, value, None)
        values[spec.field] = read
    values["undecodable"] = tuple(unknown)
    return tuple(values[field] for field in _JOBVIEW_FIELDS)


view = _compiled_view()
