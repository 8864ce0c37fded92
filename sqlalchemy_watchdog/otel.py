"""OpenTelemetry traces and metrics for sqlalchemy_watchdog (extra ``[otel]``).

Install the extra and call :func:`instrument` once per process -- in the
web application that enqueues and in every worker::

    pip install 'sqlalchemy-watchdog[otel]'

    from sqlalchemy_watchdog.otel import instrument
    instrument()                        # the global tracer and meter providers
    instrument(stats_engine=engine)     # ... plus queue-depth gauges from stats()

Traces (OpenTelemetry messaging conventions):

* every enqueue records a ``send <queue>`` span (kind PRODUCER) and stores
  its W3C trace context with the job (``trace_context``);
* every attempt a runner makes records a ``process <queue>`` span (kind
  CONSUMER) whose parent is that stored context, so the job's work joins
  the trace of the request that enqueued it, in whatever process runs it.
  The handler runs with this span current: its own spans nest under it.
  Stop requests (cancelled, lane failed, lease lost, timeout, shutdown),
  retries, snoozes, the settle and its outcome are span events and
  attributes; a failed attempt has status ERROR with the failure reason,
  and a handler's exception is recorded on its span (``record_exception``);
* a recovery of a disappeared execution records a ``recover <queue>``
  span in the job's trace.

Metrics: ``messaging.client.sent.messages`` and
``messaging.client.consumed.messages`` (counters), ``messaging.process.duration``
(attempt duration, s), ``watchdog.job.wait.duration`` (enqueue or ready to
start, by the database clock, s), ``watchdog.job.settled`` (by queue and
outcome), ``watchdog.job.recoveries`` and ``watchdog.lease.lost``
(counters); with ``stats_engine``, the observable gauges
``watchdog.queue.depth`` (by queue and state) and
``watchdog.queue.oldest_ready.age`` (s), read from
:meth:`~sqlalchemy_watchdog.Watchdog.stats` at most every ``stats_every``.

Without this module imported nothing of OpenTelemetry is loaded and the
core's hooks cost one global read per enqueue and per attempt.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "sqlalchemy_watchdog.otel needs OpenTelemetry: pip install 'sqlalchemy-watchdog[otel]'"
    ) from error

from sqlalchemy import Engine

from . import telemetry
from .errors import InvalidJob
from .jobs import Decision, EnqueueResult, EnqueueStatus, Job, JobView, Outcome
from .records import Recovery, RecoveryStatus, SettleRequest, StopReason, TickResult, TickStatus

__all__ = ["MESSAGING_SYSTEM", "OpenTelemetryInstrumentation", "instrument", "uninstrument"]

log = logging.getLogger(__name__)

#: The ``messaging.system`` attribute of every span and metric.
MESSAGING_SYSTEM = "sqlalchemy_watchdog"
_SCOPE = "sqlalchemy_watchdog"

# Attribute names: the messaging conventions where they have one.
SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
ERROR_TYPE = "error.type"
LANE = "watchdog.job.lane"
ATTEMPT = "watchdog.job.attempt"
MAX_ATTEMPTS = "watchdog.job.max_attempts"
RECOVERY_COUNT = "watchdog.job.recovery_count"
OUTCOME = "watchdog.job.outcome"
STATE = "watchdog.job.state"


#: Histogram buckets (seconds): the messaging conventions' for durations,
#: and for waits the same stretched to an hour (a backlog can wait long).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
WAIT_BUCKETS = (*DURATION_BUCKETS, 30.0, 60.0, 300.0, 900.0, 3600.0)


def _version() -> str:
    from . import __version__

    return __version__


class OpenTelemetryInstrumentation(telemetry.Instrumentation):
    """The hooks of :mod:`sqlalchemy_watchdog.telemetry`, recorded as
    OpenTelemetry spans and metrics. Made by :func:`instrument`."""

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        stats_engine: Engine | None = None,
        stats_every: timedelta = timedelta(seconds=5),
    ) -> None:
        if stats_engine is not None and not isinstance(stats_engine, Engine):
            raise InvalidJob(
                "stats_engine",
                f"must be a sqlalchemy Engine, not {type(stats_engine).__name__}"
                " (for an AsyncEngine, pass a sync Engine on the same database)",
            )
        if not isinstance(stats_every, timedelta) or stats_every <= timedelta(0):
            raise InvalidJob("stats_every", f"must be a positive datetime.timedelta, not {stats_every!r}")
        version = _version()
        self.tracer = trace.get_tracer(_SCOPE, version, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, version, meter_provider=meter_provider)
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", unit="{message}", description="Jobs enqueued (new jobs, not replays)."
        )
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", unit="{message}", description="Attempts started by runners."
        )
        self.process_duration = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="How long an attempt's handler ran.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.wait_duration = meter.create_histogram(
            "watchdog.job.wait.duration",
            unit="s",
            description="From when a job was enqueued (or became ready) to when its attempt started.",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self.settled = meter.create_counter(
            "watchdog.job.settled", unit="{job}", description="Jobs settled, by queue and outcome."
        )
        self.recoveries = meter.create_counter(
            "watchdog.job.recoveries",
            unit="{job}",
            description="Disappeared executions recovered (requeued, or settled interrupted).",
        )
        self.lost_leases = meter.create_counter(
            "watchdog.lease.lost", unit="{lease}", description="Claims a runner found lost while it ran them."
        )
        self._stats: _StatsCache | None = None
        if stats_engine is not None:
            self._stats = _StatsCache(stats_engine, stats_every.total_seconds())
            meter.create_observable_gauge(
                "watchdog.queue.depth",
                callbacks=[self._stats.depth],
                unit="{job}",
                description="Live jobs by queue and state (delayed, queued, running).",
            )
            meter.create_observable_gauge(
                "watchdog.queue.oldest_ready.age",
                callbacks=[self._stats.oldest_ready_age],
                unit="s",
                description="How long the oldest ready job of each queue has waited.",
            )

    # -- producer

    def enqueue(self, jobs: Sequence[Job]) -> telemetry.EnqueueTrace:
        queues = sorted({job.queue for job in jobs})
        attributes: dict[str, Any] = {SYSTEM: MESSAGING_SYSTEM, OPERATION_TYPE: "send", OPERATION_NAME: "enqueue"}
        if len(queues) == 1:
            attributes[DESTINATION] = queues[0]
        if len(jobs) == 1:
            attributes[MESSAGE_ID] = jobs[0].job_id
            attributes[LANE] = jobs[0].lane
        else:
            attributes[BATCH_COUNT] = len(jobs)
        name = f"send {queues[0]}" if len(queues) == 1 else "send"
        span = self.tracer.start_span(name, kind=SpanKind.PRODUCER, attributes=attributes)
        return _Send(self, span, {job.job_id: job.queue for job in jobs})

    # -- consumer

    def attempt(self, execution: telemetry.Attempt) -> telemetry.AttemptTrace:
        job = execution.claim.job
        running = execution.job
        attributes: dict[str, Any] = {
            SYSTEM: MESSAGING_SYSTEM,
            DESTINATION: job.queue,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "process",
            MESSAGE_ID: job.job_id,
            LANE: job.lane,
            ATTEMPT: job.attempt,
            MAX_ATTEMPTS: running.max_attempts,
            RECOVERY_COUNT: job.recovery_count,
        }
        span = self.tracer.start_span(
            f"process {job.queue}", context=_parent(job), kind=SpanKind.CONSUMER, attributes=attributes
        )
        labels = {SYSTEM: MESSAGING_SYSTEM, DESTINATION: job.queue, OPERATION_NAME: "process"}
        self.consumed.add(1, labels)
        waited = _waited(job)
        if waited is not None:
            self.wait_duration.record(waited, {SYSTEM: MESSAGING_SYSTEM, DESTINATION: job.queue})
        return _Attempt(self, span, job.queue)

    def settled_unrun(self, job: JobView) -> None:
        self.settled.add(1, {SYSTEM: MESSAGING_SYSTEM, DESTINATION: job.queue, OUTCOME: Outcome.CANCELLED.value})

    def recovered(self, job: JobView, recovery: Recovery, cause: str) -> None:
        after = recovery.job
        if recovery.status is RecoveryStatus.REQUEUED:
            result = "requeued"
        else:
            result = after.outcome.value if after is not None and after.outcome is not None else recovery.status.value
        attributes: dict[str, Any] = {
            SYSTEM: MESSAGING_SYSTEM,
            DESTINATION: job.queue,
            MESSAGE_ID: job.job_id,
            RECOVERY_COUNT: after.recovery_count if after is not None else job.recovery_count,
            "watchdog.recovery.cause": cause,
            "watchdog.recovery.result": result,
        }
        span = self.tracer.start_span(f"recover {job.queue}", context=_parent(job), attributes=attributes)
        if recovery.status is RecoveryStatus.SETTLED:
            span.set_status(Status(StatusCode.ERROR, f"settled {result}"))
        span.end()
        self.recoveries.add(
            1,
            {SYSTEM: MESSAGING_SYSTEM, DESTINATION: job.queue, "watchdog.recovery.cause": cause,
             "watchdog.recovery.result": result},
        )  # fmt: skip
        if recovery.status is RecoveryStatus.SETTLED and after is not None and after.outcome is not None:
            self.settled.add(1, {SYSTEM: MESSAGING_SYSTEM, DESTINATION: job.queue, OUTCOME: after.outcome.value})

    def close(self) -> None:
        """Stop reading stats for the gauges (they report nothing after this)."""
        if self._stats is not None:
            self._stats.closed = True


class _Send(telemetry.EnqueueTrace):
    def __init__(self, owner: OpenTelemetryInstrumentation, span: Span, queues: dict[str, str]) -> None:
        self.owner = owner
        self.span = span
        self.queues = queues
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        self.trace_context = telemetry.encode_trace_context(carrier)

    def admitted(self, results: Sequence[EnqueueResult]) -> None:
        queued: dict[str, int] = {}
        duplicates = 0
        for result in results:
            if result.status is EnqueueStatus.QUEUED:
                queue = self.queues[result.job_id]
                queued[queue] = queued.get(queue, 0) + 1
            else:
                duplicates += 1
        if len(results) == 1:
            self.span.set_attribute("watchdog.enqueue.status", results[0].status.value)
        else:
            self.span.set_attribute("watchdog.enqueue.queued", sum(queued.values()))
            self.span.set_attribute("watchdog.enqueue.duplicates", duplicates)
        for queue, count in queued.items():
            self.owner.sent.add(count, {SYSTEM: MESSAGING_SYSTEM, DESTINATION: queue, OPERATION_NAME: "enqueue"})

    def failed(self, error: BaseException) -> None:
        self.span.record_exception(error)
        self.span.set_attribute(ERROR_TYPE, type(error).__qualname__)
        self.span.set_status(Status(StatusCode.ERROR, str(error)))

    def end(self) -> None:
        self.span.end()


class _Attempt(telemetry.AttemptTrace):
    def __init__(self, owner: OpenTelemetryInstrumentation, span: Span, queue: str) -> None:
        self.owner = owner
        self.span = span
        self.queue = queue
        self.started = time.perf_counter()
        self.handled: float | None = None
        self.outcome: str | None = None
        self.error_type: str | None = None

    def context(self) -> contextvars.Context:
        context = contextvars.copy_context()
        # Attach inside the copy: the handler's thread or task sees the span
        # as current; the caller's own context is untouched.
        context.run(otel_context.attach, trace.set_span_in_context(self.span))
        return context

    def stop_requested(self, reason: StopReason) -> None:
        self.span.add_event("watchdog.stop_requested", {"watchdog.stop.reason": reason.value})
        if reason is StopReason.LEASE_LOST:
            self.owner.lost_leases.add(1, {SYSTEM: MESSAGING_SYSTEM, DESTINATION: self.queue})

    def raised(self, error: BaseException) -> None:
        self.span.record_exception(error)

    def decided(self, decision: Decision, request: SettleRequest) -> None:
        self.handled = time.perf_counter()
        if decision.snoozed:
            self.span.add_event("watchdog.snoozed", {"watchdog.requeue.delay_ms": request.requeue_after_ms or 0})
            return
        if decision.outcome is Outcome.FAILED:
            reason = decision.reason or "failed"
            self.error_type = "failed"
            self.span.set_status(Status(StatusCode.ERROR, reason))
            self.span.set_attribute(ERROR_TYPE, "failed")
            if request.requeue_after_ms is not None:
                self.span.add_event("watchdog.retry_scheduled", {"watchdog.requeue.delay_ms": request.requeue_after_ms})

    def concluded(self, result: TickResult) -> None:
        status = result.status
        job = result.job
        if status is TickStatus.SETTLED and job is not None and job.outcome is not None:
            self.outcome = job.outcome.value
            self.span.set_attribute(OUTCOME, self.outcome)
            self.span.add_event("watchdog.settled", {OUTCOME: self.outcome})
            if job.outcome is Outcome.CANCELLED:
                self.span.add_event("watchdog.cancelled")
            self.owner.settled.add(1, {SYSTEM: MESSAGING_SYSTEM, DESTINATION: self.queue, OUTCOME: self.outcome})
        elif status is TickStatus.REQUEUED:
            attributes: dict[str, Any] = {}
            if job is not None:
                attributes = {STATE: job.state.value, ATTEMPT: job.attempt}
            self.span.add_event("watchdog.requeued", attributes)
        else:
            self.span.add_event("watchdog.settle_rejected", {"watchdog.tick.status": status.value})
            if self.error_type is None:
                self.error_type = "claim_lost"
                self.span.set_attribute(ERROR_TYPE, "claim_lost")
                self.span.set_status(Status(StatusCode.ERROR, "the claim was lost before the attempt settled"))

    def end(self) -> None:
        handled = self.handled if self.handled is not None else time.perf_counter()
        labels: dict[str, Any] = {SYSTEM: MESSAGING_SYSTEM, DESTINATION: self.queue, OPERATION_NAME: "process"}
        if self.error_type is not None:
            labels[ERROR_TYPE] = self.error_type
        self.owner.process_duration.record(max(0.0, handled - self.started), labels)
        self.span.end()


def _parent(job: JobView) -> Context | None:
    """The context the job was enqueued under (None: start a new trace)."""
    if not job.trace_context:
        return None
    return propagate.extract(dict(job.trace_context), context=Context())


def _waited(job: JobView) -> float | None:
    """Seconds from when the job was enqueued or became ready (the later)
    to when this attempt started, all by the database clock."""
    if job.started_at is None or job.enqueued_at is None:
        return None
    since = job.enqueued_at if job.ready_at is None else max(job.enqueued_at, job.ready_at)
    return max(0.0, (job.started_at - since).total_seconds())


class _StatsCache:
    """``Watchdog.stats()`` for the gauges, read at most every ``every`` seconds."""

    def __init__(self, engine: Engine, every: float) -> None:
        from .client import Watchdog

        self.watchdog = Watchdog(engine)
        self.every = every
        self.lock = threading.Lock()
        self.read_at = -float("inf")
        self.snapshot: Any = None
        self.closed = False

    def current(self) -> Any:
        with self.lock:
            if self.closed:
                return None
            if time.monotonic() - self.read_at >= self.every:
                try:
                    self.snapshot = self.watchdog.stats()
                except Exception as error:
                    log.warning("watchdog gauges: stats() failed (%s)", error)
                    self.snapshot = None
                self.read_at = time.monotonic()
            return self.snapshot

    def depth(self, options: CallbackOptions) -> Iterable[Observation]:
        stats = self.current()
        if stats is None:
            return []
        return [
            Observation(getattr(queue, state), {SYSTEM: MESSAGING_SYSTEM, DESTINATION: queue.queue, STATE: state})
            for queue in stats.queues
            for state in ("delayed", "queued", "running")
        ]

    def oldest_ready_age(self, options: CallbackOptions) -> Iterable[Observation]:
        stats = self.current()
        if stats is None:
            return []
        return [
            Observation(
                0.0 if queue.oldest_ready_age is None else queue.oldest_ready_age.total_seconds(),
                {SYSTEM: MESSAGING_SYSTEM, DESTINATION: queue.queue},
            )
            for queue in stats.queues
        ]


_installed: OpenTelemetryInstrumentation | None = None


def instrument(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    stats_engine: Engine | None = None,
    stats_every: timedelta = timedelta(seconds=5),
) -> OpenTelemetryInstrumentation:
    """Record traces and metrics of every enqueue and runner in this process.

    :param tracer_provider: the provider of the tracer (default: the global one).
    :param meter_provider: the provider of the meter (default: the global one).
    :param stats_engine: a sync Engine on the jobs' database; given, the
        queue-depth and oldest-ready-age gauges are read from
        :meth:`~sqlalchemy_watchdog.Watchdog.stats` (index reads only).
    :param stats_every: how often at most the gauges read ``stats()``.

    Calling it again replaces the previous instrumentation.
    """
    global _installed
    instrumentation = OpenTelemetryInstrumentation(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        stats_engine=stats_engine,
        stats_every=stats_every,
    )
    if _installed is not None:
        _installed.close()
    _installed = instrumentation
    telemetry.install(instrumentation)
    return instrumentation


def uninstrument() -> None:
    """Stop recording (attempts under way still end their spans)."""
    global _installed
    if _installed is not None:
        _installed.close()
        _installed = None
    telemetry.uninstall()
