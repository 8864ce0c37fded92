"""The seam between the queue and its instrumentation.

The core calls these hooks at each step of a job's life; nothing here
imports a tracing or metrics library. With no instrumentation installed
(the default) :func:`active` is None and every call site is skipped: one
global read per enqueue and per attempt. :mod:`sqlalchemy_watchdog.otel`
installs an OpenTelemetry implementation (extra ``[otel]``).

An :class:`Instrumentation` is called from the caller's thread (enqueue),
the runner's handler threads or tasks, its heartbeat and its settler; an
implementation must be thread-safe and must not raise -- a hook that
raises is logged and ignored, never allowed to fail a job.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from .jobs import TRACE_CONTEXT_MAX_LENGTH
from .records import Claim

if TYPE_CHECKING:
    from .jobs import Decision, EnqueueResult, Job, JobView
    from .records import Recovery, SettleRequest, StopReason, TickResult

__all__ = [
    "Attempt",
    "AttemptTrace",
    "EnqueueTrace",
    "Instrumentation",
    "active",
    "install",
    "uninstall",
    "encode_trace_context",
    "decode_trace_context",
    "storable_trace_context",
    "trace_context_of",
    "guarded",
]

log = logging.getLogger(__name__)


class AttemptedJob(Protocol):
    """What :meth:`Instrumentation.attempt` reads of the job a handler runs
    (a :class:`~sqlalchemy_watchdog.RunningJob`)."""

    @property
    def max_attempts(self) -> int: ...


class Attempt(Protocol):
    """What :meth:`Instrumentation.attempt` reads of an attempt: the runner's
    execution of one claim (declared here, so this seam imports nothing of
    the runner's core)."""

    @property
    def claim(self) -> Claim: ...

    @property
    def job(self) -> AttemptedJob: ...


class EnqueueTrace:
    """One enqueue call as the instrumentation sees it.

    ``trace_context`` is stored with every job the call admits (None: none).
    """

    trace_context: str | None = None

    def admitted(self, results: Sequence[EnqueueResult]) -> None:
        """The statement ran: what became of each job."""

    def failed(self, error: BaseException) -> None:
        """The enqueue raised (a conflicting replay, a database error)."""

    def end(self) -> None:
        """The call is over."""


class AttemptTrace:
    """One attempt of a job in a runner, from its start to its settle."""

    def context(self) -> contextvars.Context:
        """A context to run the handler in (a copy of the current one, with
        whatever the instrumentation makes current for the attempt)."""
        return contextvars.copy_context()

    def stop_requested(self, reason: StopReason) -> None:
        """The runner told the handler to stop (cancelled, lane failed,
        lease lost, timed out, shutting down)."""

    def raised(self, error: BaseException) -> None:
        """The handler raised ``error`` (the attempt fails; whether it is
        retried is told to :meth:`decided`)."""

    def decided(self, decision: Decision, request: SettleRequest) -> None:
        """The handler decided; ``request`` is what the runner will write
        (a settle, or a requeue for a retry or snooze)."""

    def concluded(self, result: TickResult) -> None:
        """What the database made of it (settled, requeued, rejected, ...)."""

    def end(self) -> None:
        """The execution is over (called exactly once)."""


class Instrumentation:
    """No-op hooks; an implementation overrides what it records."""

    def enqueue(self, jobs: Sequence[Job]) -> EnqueueTrace:
        """An enqueue of ``jobs`` (unique job_ids, in order) starts."""
        return EnqueueTrace()

    def attempt(self, execution: Attempt) -> AttemptTrace:
        """The runner starts executing a claimed job."""
        return AttemptTrace()

    def settled_unrun(self, job: JobView) -> None:
        """A claim found ``job`` cancelled while queued and settled it
        ``cancelled`` without running it."""

    def recovered(self, job: JobView, recovery: Recovery, cause: str) -> None:
        """A disappeared execution of ``job`` was recovered: requeued, or
        settled ``interrupted``; ``cause`` is ``vanished`` (its lease ended)
        or ``shutdown`` (its runner's grace period ran out)."""


_active: Instrumentation | None = None


def active() -> Instrumentation | None:
    """The installed instrumentation, if any."""
    return _active


def install(instrumentation: Instrumentation) -> None:
    """Make ``instrumentation`` receive the hooks of every enqueue and
    runner in this process (replacing any other)."""
    global _active
    if not isinstance(instrumentation, Instrumentation):
        raise TypeError(f"instrumentation must be an Instrumentation, not {type(instrumentation).__name__}")
    _active = instrumentation


def uninstall() -> None:
    """Stop instrumenting (attempts under way finish their traces)."""
    global _active
    _active = None


@contextmanager
def guarded(what: str) -> Iterator[None]:
    """Log and swallow an exception raised by instrumentation code."""
    try:
        yield
    except Exception:
        log.exception("instrumentation failed in %s; ignored", what)


def encode_trace_context(carrier: Mapping[str, str]) -> str | None:
    """The propagation fields as stored (a JSON object), or None when there
    are none. Fields beyond ``traceparent``/``tracestate`` are dropped if
    the whole would not fit :data:`~sqlalchemy_watchdog.jobs.TRACE_CONTEXT_MAX_LENGTH`;
    None if even those do not."""
    if not carrier:
        return None
    fields = {str(k): str(v) for k, v in carrier.items()}
    text = json.dumps(fields, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    if len(text) <= TRACE_CONTEXT_MAX_LENGTH:
        return text
    core = {k: v for k, v in fields.items() if k in ("traceparent", "tracestate")}
    text = json.dumps(core, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    if core and len(text) <= TRACE_CONTEXT_MAX_LENGTH:
        log.warning("trace context too long to store whole; kept traceparent/tracestate only")
        return text
    log.warning("trace context too long to store; the job's trace will not be continued")
    return None


def storable_trace_context(text: object) -> str | None:
    """An instrumentation's ``EnqueueTrace.trace_context`` if the column
    takes it (a str of 2 to :data:`~sqlalchemy_watchdog.jobs.TRACE_CONTEXT_MAX_LENGTH`
    characters of valid Unicode without NUL, as :func:`encode_trace_context`
    makes); anything else would
    make the enqueue itself fail, so it raises for :func:`guarded` to log and
    the jobs are enqueued without one."""
    if text is None:
        return None
    if not isinstance(text, str) or not 2 <= len(text) <= TRACE_CONTEXT_MAX_LENGTH:
        shown = f"{len(text)} characters" if isinstance(text, str) else type(text).__name__
        raise ValueError(f"trace_context must be a str of 2 to {TRACE_CONTEXT_MAX_LENGTH} characters, got {shown}")
    if "\x00" in text:
        raise ValueError("trace_context must not contain NUL (PostgreSQL text cannot hold it)")
    text.encode("utf-8")  # a lone surrogate: UnicodeEncodeError
    return text


def decode_trace_context(text: str | None) -> Mapping[str, str] | None:
    """The stored trace context as a carrier (None when there is none or
    it is not a JSON object of strings -- a trace is never worth failing a job)."""
    if text is None:
        return None
    try:
        return trace_context_of(text)
    except Exception:  # anything a producer may have stored: a RecursionError too
        return None


def trace_context_of(text: str) -> Mapping[str, str]:
    """The stored trace context as a carrier; raises ``ValueError`` (or the
    decoder's ``RecursionError``) for text that is not a JSON object of strings."""
    value: Any = json.loads(text)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError("not a JSON object of strings")
    return value
