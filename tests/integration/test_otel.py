"""OpenTelemetry: a job's work joins the trace of the request that enqueued
it, in whatever process runs it; runners record metrics users alert on; and
without the instrumentation nothing of OpenTelemetry is loaded.

Real databases (both dialects), the SDK's in-memory span exporter and
metric reader, and real processes for the cross-process tests.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import (
    Decision,
    EnqueueStatus,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    RetryPolicy,
    Runner,
    RunningJob,
    StopReason,
    Watchdog,
    enqueue,
    store,
    telemetry,
)
from sqlalchemy_watchdog.asyncio import AsyncRunner
from sqlalchemy_watchdog.otel import instrument, uninstrument
from tests.conftest import make_async_engine
from tests.runner_kinds import RunnerDriver, dual

# The dialect does not matter here but where a test says dialect_specific: the PostgreSQL copy
# runs under CI=true or WATCHDOG_ALL_DIALECTS=1 (tests/conftest.py).
pytestmark = pytest.mark.dialect_neutral

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "workers" / "otel_process.py"


@dataclass
class Otel:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer_provider: TracerProvider

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def points(self, metric: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        found: list[Any] = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found.extend(m.data.data_points)
        return found

    def total(self, metric: str, **attributes: Any) -> float:
        total: float = sum(
            p.value for p in self.points(metric) if all(p.attributes.get(k) == v for k, v in attributes.items())
        )
        return total


@pytest.fixture
def otel(engine: Engine) -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        stats_engine=engine,
        stats_every=timedelta(milliseconds=1),
    )
    try:
        yield Otel(spans, reader, tracer_provider)
    finally:
        uninstrument()
        meter_provider.shutdown()


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _events(span: ReadableSpan) -> list[str]:
    return [event.name for event in span.events]


def _ids(span: ReadableSpan) -> tuple[int, int]:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id, context.span_id


def _wait_for(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


# -- traces ------------------------------------------------------------------------


def test_each_attempt_continues_the_trace_of_the_request_that_enqueued_it(engine: Engine, otel: Otel) -> None:
    tracer = otel.tracer_provider.get_tracer("app")
    calls: list[int] = []

    def handle(job: RunningJob) -> Decision | None:
        calls.append(job.attempt)
        with tracer.start_as_current_span("send email"):
            pass
        if job.attempt == 1:
            raise RuntimeError("smtp down")
        return None

    with tracer.start_as_current_span("POST /orders"), Session(engine) as session:
        enqueue(
            session,
            Job(
                "order-1",
                "mail",
                payload={"to": "a@example.com"},
                retry=RetryPolicy(max_attempts=2, backoff=timedelta(milliseconds=1)),
            ),
        )
        session.commit()
    runner = Runner(engine, {"mail": handle})
    runner.run_until_idle()
    time.sleep(0.05)  # the retry's 1 ms backoff
    runner.run_until_idle()
    assert calls == [1, 2]

    [request] = otel.finished("POST /orders")
    [send] = otel.finished("send mail")
    assert send.kind is SpanKind.PRODUCER and send.parent is not None and send.parent.span_id == _ids(request)[1]
    assert _attrs(send) == {
        "messaging.system": "sqlalchemy_watchdog",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": "mail",
        "messaging.message.id": "order-1",
        "watchdog.job.lane": "mail",
        "watchdog.enqueue.status": "queued",
    }
    # The stored context is the producer span's.
    stored = Watchdog(engine).read("order-1")
    assert stored is not None and stored.trace_context is not None
    trace_id, send_id = _ids(send)
    assert stored.trace_context["traceparent"].startswith(f"00-{trace_id:032x}-{send_id:016x}-")

    first, second = sorted(otel.finished("process mail"), key=lambda s: _attrs(s)["watchdog.job.attempt"])
    for attempt in (first, second):
        assert attempt.kind is SpanKind.CONSUMER
        assert attempt.parent is not None and (attempt.parent.trace_id, attempt.parent.span_id) == (trace_id, send_id)
        assert _attrs(attempt)["messaging.message.id"] == "order-1"
        assert _attrs(attempt)["messaging.destination.name"] == "mail"
    assert first.status.status_code is StatusCode.ERROR and "smtp down" in (first.status.description or "")
    # The handler's exception is recorded on its attempt's span (type, message, traceback).
    assert _events(first) == ["exception", "watchdog.retry_scheduled", "watchdog.requeued"]
    exception = first.events[0].attributes or {}
    assert exception["exception.type"] == "RuntimeError" and exception["exception.message"] == "smtp down"
    assert "smtp down" in str(exception["exception.stacktrace"])
    assert second.status.status_code is StatusCode.UNSET
    assert _attrs(second)["watchdog.job.outcome"] == "completed" and "watchdog.settled" in _events(second)
    # The handler's own spans nest under its attempt.
    handler_spans = otel.finished("send email")
    assert sorted(s.parent.span_id for s in handler_spans if s.parent) == sorted(_ids(s)[1] for s in (first, second))

    assert otel.total("messaging.client.sent.messages", **{"messaging.destination.name": "mail"}) == 1
    assert otel.total("messaging.client.consumed.messages") == 2
    assert otel.total("watchdog.job.settled", **{"watchdog.job.outcome": "completed"}) == 1
    durations = {p.attributes.get("error.type"): p.count for p in otel.points("messaging.process.duration")}
    assert durations == {"failed": 1, None: 1}
    # Seconds, in the messaging conventions' buckets (not the SDK's millisecond-sized defaults).
    assert all(p.explicit_bounds[:2] == (0.005, 0.01) for p in otel.points("messaging.process.duration"))
    assert sum(p.count for p in otel.points("watchdog.job.wait.duration")) == 2


def test_async_runner_runs_coroutine_and_plain_handlers_inside_their_attempt_span(engine: Engine, otel: Otel) -> None:
    tracer = otel.tracer_provider.get_tracer("app")

    async def coroutine(job: RunningJob) -> None:
        await asyncio.sleep(0)
        with tracer.start_as_current_span("in coroutine"):
            pass

    def plain(job: RunningJob) -> Decision:
        with tracer.start_as_current_span("in thread"):
            pass
        return Decision.failed("no such user", retry=False)

    with tracer.start_as_current_span("request"), Session(engine) as session:
        enqueue(session, [Job("a", "async"), Job("b", "plain")])
        session.commit()

    async def main() -> None:
        async_engine = make_async_engine(engine)
        try:
            await AsyncRunner(async_engine, {"async": coroutine, "plain": plain}).run_until_idle()
        finally:
            await async_engine.dispose()

    asyncio.run(main())
    [send] = otel.finished("send")  # one enqueue call of two queues
    assert _attrs(send)["messaging.batch.message_count"] == 2 and _attrs(send)["watchdog.enqueue.queued"] == 2
    for queue, child in (("async", "in coroutine"), ("plain", "in thread")):
        [attempt] = otel.finished(f"process {queue}")
        assert attempt.parent is not None and attempt.parent.span_id == _ids(send)[1]
        [inner] = otel.finished(child)
        assert inner.parent is not None and inner.parent.span_id == _ids(attempt)[1]
    [failed] = otel.finished("process plain")
    assert failed.status.status_code is StatusCode.ERROR and failed.status.description == "no such user"
    assert _attrs(failed)["watchdog.job.outcome"] == "failed"
    assert otel.total("watchdog.job.settled", **{"watchdog.job.outcome": "failed"}) == 1


def test_identical_replay_keeps_the_first_trace_context(engine: Engine, otel: Otel) -> None:
    """The trace context is not part of a job's identity: a replay from
    another trace is a duplicate and leaves the stored context alone."""
    tracer = otel.tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("first"), Session(engine) as session:
        enqueue(session, Job("same", "q"))
        session.commit()
    before = Watchdog(engine).read("same")
    with tracer.start_as_current_span("second"), Session(engine) as session:
        assert enqueue(session, Job("same", "q")).status is EnqueueStatus.DUPLICATE
        session.commit()
    after = Watchdog(engine).read("same")
    assert before is not None and after is not None and before.trace_context == after.trace_context
    statuses = [_attrs(s)["watchdog.enqueue.status"] for s in otel.finished("send q")]
    assert statuses == ["queued", "duplicate"]
    assert otel.total("messaging.client.sent.messages") == 1


def test_a_conflicting_replay_marks_its_enqueue_span_as_an_error(engine: Engine, otel: Otel) -> None:
    from sqlalchemy_watchdog import EnqueueConflict

    with Session(engine) as session:
        enqueue(session, Job("k", "q", payload=1))
        session.commit()
    with Session(engine) as session, pytest.raises(EnqueueConflict):
        enqueue(session, Job("k", "q", payload=2))
    conflict = otel.finished("send q")[-1]
    assert conflict.status.status_code is StatusCode.ERROR and _attrs(conflict)["error.type"] == "EnqueueConflict"


def test_cancellation_and_lost_lease_are_span_events_and_counted(engine: Engine, otel: Otel) -> None:
    started: dict[str, threading.Event] = {"stop-me": threading.Event(), "lose-me": threading.Event()}
    reasons: dict[str, StopReason | None] = {}

    def block(job: RunningJob) -> None:
        started[job.job_id].set()
        job.stop_requested.wait(30)
        reasons[job.job_id] = job.stop_reason

    with Session(engine) as session:
        enqueue(session, [Job("stop-me", "q"), Job("lose-me", "q")])
        session.commit()
    runner = Runner(
        engine, {"q": block}, concurrency=2, lease=timedelta(seconds=5), heartbeat=timedelta(milliseconds=100)
    )
    thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        for event in started.values():
            assert event.wait(15)
        watchdog = Watchdog(engine)
        watchdog.cancel("stop-me", "operator-1")
        # Another runner took the claim over: this one's lease is lost.
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE watchdog_jobs SET claim_token = 'claim_other', lease_until = lease_until + 60000"
                     " WHERE job_id = 'lose-me'")
            )  # fmt: skip
        _wait_for(lambda: len(reasons) == 2)
    finally:
        runner.stop()
        thread.join(30)
    assert reasons == {"stop-me": StopReason.CANCELLED, "lose-me": StopReason.LEASE_LOST}
    spans = {_attrs(s)["messaging.message.id"]: s for s in otel.finished("process q")}
    cancelled = spans["stop-me"]
    assert _events(cancelled)[:1] == ["watchdog.stop_requested"]
    assert cancelled.events[0].attributes == {"watchdog.stop.reason": "cancelled"}
    assert _attrs(cancelled)["watchdog.job.outcome"] == "cancelled" and "watchdog.cancelled" in _events(cancelled)
    lost = spans["lose-me"]
    assert lost.events[0].attributes == {"watchdog.stop.reason": "lease_lost"}
    assert lost.status.status_code is StatusCode.ERROR and _attrs(lost)["error.type"] == "claim_lost"
    assert otel.total("watchdog.lease.lost") == 1
    assert otel.total("watchdog.job.settled", **{"watchdog.job.outcome": "cancelled"}) == 1


def test_lane_failure_is_a_span_event(engine: Engine, otel: Otel) -> None:
    started = threading.Event()

    def block(job: RunningJob) -> None:
        started.set()
        job.stop_requested.wait(30)

    with Session(engine) as session:
        enqueue(session, Job("j", "q", lane="tenant-7"))
        session.commit()
    runner = Runner(engine, {"q": block}, heartbeat=timedelta(milliseconds=100))
    thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        assert started.wait(15)
        Watchdog(engine).fail_lane("tenant-7", "tenant deleted")
        _wait_for(lambda: bool(otel.finished("process q")))
    finally:
        runner.stop()
        thread.join(30)
    [span] = otel.finished("process q")
    assert span.events[0].attributes == {"watchdog.stop.reason": "lane_failed"}
    assert _attrs(span)["watchdog.job.lane"] == "tenant-7"


def test_recovery_of_a_vanished_execution_joins_the_jobs_trace(engine: Engine, otel: Otel) -> None:
    tracer = otel.tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("request"), Session(engine) as session:
        enqueue(session, Job("v", "q", max_recoveries=1))
        session.commit()
    # A worker claims it and vanishes: its lease ends.
    with store.write_transaction(engine) as conn:
        [claim] = store.claim(conn, queues=["q"], limit=1, lease_ms=50).claimed
    time.sleep(0.2)
    ran: list[int] = []
    result = Runner(engine, {"q": lambda job: ran.append(job.recovery_count)}).tick()
    assert result.job is not None and result.job.state is JobState.QUEUED and claim.job.job_id == "v"
    [send] = otel.finished("send q")
    [recover] = otel.finished("recover q")
    assert recover.parent is not None and recover.parent.span_id == _ids(send)[1]
    assert _attrs(recover)["watchdog.recovery.result"] == "requeued"
    assert _attrs(recover)["watchdog.recovery.cause"] == "vanished"
    assert otel.total("watchdog.job.recoveries", **{"watchdog.recovery.result": "requeued"}) == 1
    Runner(engine, {"q": lambda job: ran.append(job.recovery_count)}).run_until_idle()
    assert ran == [1]
    [attempt] = otel.finished("process q")
    assert _attrs(attempt)["watchdog.job.recovery_count"] == 1 and attempt.parent is not None
    assert attempt.parent.span_id == _ids(send)[1]


# -- metrics from stats() ------------------------------------------------------------


def test_gauges_report_queue_depth_and_oldest_ready_age(engine: Engine, otel: Otel) -> None:
    with Session(engine) as session:
        enqueue(session, [Job("a", "q"), Job("b", "q"), Job("c", "other")])
        enqueue(session, Job("d", "q"), delay=timedelta(hours=1))
        session.commit()
    time.sleep(0.01)
    depth = {
        (p.attributes["messaging.destination.name"], p.attributes["watchdog.job.state"]): p.value
        for p in otel.points("watchdog.queue.depth")
    }
    assert depth == {
        ("q", "delayed"): 1, ("q", "queued"): 2, ("q", "running"): 0,
        ("other", "delayed"): 0, ("other", "queued"): 1, ("other", "running"): 0,
    }  # fmt: skip
    ages = {p.attributes["messaging.destination.name"]: p.value for p in otel.points("watchdog.queue.oldest_ready.age")}
    assert set(ages) == {"q", "other"} and all(0 <= age < 60 for age in ages.values())


def test_refused_arguments_leave_the_previous_instrumentation_in_place(engine: Engine, otel: Otel) -> None:
    """(The refusals themselves are in tests/faults/test_bad_input.py.)"""
    before = telemetry.active()
    with pytest.raises(InvalidJob, match="stats_engine"):
        instrument(stats_engine=make_async_engine(engine))  # type: ignore[arg-type]
    assert telemetry.active() is before is not None


# -- the seam itself ------------------------------------------------------------------


class _Broken(telemetry.Instrumentation):
    def enqueue(self, jobs: Any) -> telemetry.EnqueueTrace:
        raise RuntimeError("exporter exploded")

    def attempt(self, execution: Any) -> telemetry.AttemptTrace:
        raise RuntimeError("exporter exploded")


def test_broken_instrumentation_never_fails_an_enqueue_or_a_job(engine: Engine) -> None:
    telemetry.install(_Broken())
    try:
        with Session(engine) as session:
            enqueue(session, Job("j", "q"))
            session.commit()
        [done] = Runner(engine, {"q": lambda job: None}).run_until_idle()
    finally:
        telemetry.uninstall()
    assert done.outcome is Outcome.COMPLETED and done.trace_context is None


class _BrokenAttempt(telemetry.AttemptTrace):
    """An attempt trace every hook of which raises."""

    def context(self) -> contextvars.Context:
        raise RuntimeError("context exploded")

    def decided(self, decision: Any, request: Any) -> None:
        raise RuntimeError("decided exploded")

    def concluded(self, result: Any) -> None:
        raise RuntimeError("concluded exploded")

    def end(self) -> None:
        raise RuntimeError("end exploded")


class _BrokenAttempts(telemetry.Instrumentation):
    def attempt(self, execution: Any) -> telemetry.AttemptTrace:
        return _BrokenAttempt()


def test_a_trace_whose_context_raises_never_fails_the_job_and_is_logged_once(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    async def coroutine(job: RunningJob) -> None:
        ran.append(job.job_id)

    handler = dual(lambda job: ran.append(job.job_id), coroutine)
    with Session(engine) as session:
        enqueue(session, Job("traced", "q"))
        session.commit()
    telemetry.install(_BrokenAttempts())
    try:
        with caplog.at_level(logging.ERROR, logger="sqlalchemy_watchdog.telemetry"):
            [done] = runners.runner({"q": handler}).run_until_idle()
    finally:
        telemetry.uninstall()
    assert (done.job_id, done.outcome, done.failure_reason) == ("traced", Outcome.COMPLETED, None)
    assert ran == ["traced"]
    failed = [r.getMessage() for r in caplog.records if r.name == "sqlalchemy_watchdog.telemetry"]
    assert failed.count("instrumentation failed in context; ignored") == 1, failed
    assert {"instrumentation failed in decided; ignored", "instrumentation failed in end; ignored"} <= set(failed)


class _OddEnqueueTrace(telemetry.EnqueueTrace):
    def __init__(self, trace_context: Any) -> None:
        self.trace_context = trace_context


class _OddContexts(telemetry.Instrumentation):
    def __init__(self, trace_context: Any) -> None:
        self.trace_context = trace_context

    def enqueue(self, jobs: Any) -> telemetry.EnqueueTrace:
        return _OddEnqueueTrace(self.trace_context)


@pytest.mark.dialect_specific
@pytest.mark.parametrize(
    "trace_context",
    ["x", "x" * 5000, 42, '{"a":"\x00"}', '{"a":"\ud800"}'],
    ids=["too-short", "too-long", "not-a-str", "nul", "lone-surrogate"],
)
def test_a_trace_context_the_column_refuses_never_fails_an_enqueue(
    engine: Engine, trace_context: Any, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry.install(_OddContexts(trace_context))
    try:
        with caplog.at_level(logging.ERROR, logger="sqlalchemy_watchdog.telemetry"):
            with Session(engine) as session:
                enqueue(session, Job("j", "q"))
                session.commit()
    finally:
        telemetry.uninstall()
    job = Watchdog(engine).read("j")
    assert job is not None and job.trace_context is None
    assert [r.getMessage() for r in caplog.records] == ["instrumentation failed in enqueue; ignored"]


def test_an_oversized_trace_context_keeps_only_its_traceparent() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert telemetry.encode_trace_context({}) is None
    text_ = telemetry.encode_trace_context({"traceparent": parent, "baggage": "k=" + "v" * 5000})
    assert text_ is not None and json.loads(text_) == {"traceparent": parent}
    assert telemetry.encode_trace_context({"traceparent": "x" * 5000}) is None
    assert telemetry.decode_trace_context("not json") is None
    assert telemetry.decode_trace_context('{"traceparent": 1}') is None


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_without_instrumentation_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    code = f"""
import sys
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
import sqlalchemy_watchdog
from sqlalchemy_watchdog import Job, Runner, enqueue, metadata
from sqlalchemy_watchdog.asyncio import AsyncRunner
engine = create_engine("sqlite:///{tmp_path / "plain.db"}")
metadata.create_all(engine)
with Session(engine) as session:
    enqueue(session, Job("j", "q"))
    session.commit()
[job] = Runner(engine, {{"q": lambda job: None}}).run_until_idle()
assert job.outcome.value == "completed", job
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
print(loaded)
assert not loaded
"""
    result = _python(code)
    assert result.returncode == 0, result.stderr + result.stdout


def test_the_otel_module_without_the_extra_says_how_to_install_it() -> None:
    result = _python("import sys; sys.modules['opentelemetry'] = None; import sqlalchemy_watchdog.otel")
    assert result.returncode != 0
    assert "pip install 'sqlalchemy-watchdog[otel]'" in result.stderr


# -- across real processes -------------------------------------------------------------


def _run(mode: str, url: str, out: Path, job_id: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(WORKER), mode, url, str(out), job_id, *extra], cwd=REPO)


def _spans(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text()))


def test_worker_span_in_another_process_belongs_to_the_enqueuing_trace(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    producer = _run("produce", url, tmp_path / "produce.json", "order-7")
    assert producer.wait(60) == 0
    worker = _run("work", url, tmp_path / "work.json", "order-7")
    assert worker.wait(90) == 0
    produced = _spans(tmp_path / "produce.json")
    worked = _spans(tmp_path / "work.json")
    [request] = [s for s in produced if s["name"] == "request"]
    [send] = [s for s in produced if s["name"] == "send q"]
    [process] = [s for s in worked if s["name"] == "process q"]
    [work] = [s for s in worked if s["name"] == "handler work"]
    assert send["kind"] == "PRODUCER" and send["parent_span_id"] == request["span_id"]
    assert process["kind"] == "CONSUMER"
    assert process["trace_id"] == request["trace_id"] == work["trace_id"]
    assert process["parent_span_id"] == send["span_id"]
    assert work["parent_span_id"] == process["span_id"]
    assert process["attributes"]["watchdog.job.outcome"] == "completed"


@pytest.mark.slow
def test_a_killed_workers_job_is_recovered_and_run_in_the_same_trace(engine: Engine, tmp_path: Path) -> None:
    """Fault: the worker running the job is SIGKILLed mid-handler; another
    worker process recovers the job after its lease and runs it -- the
    recovery and the new attempt both belong to the request's trace."""
    url = engine.url.render_as_string(hide_password=False)
    assert _run("produce", url, tmp_path / "produce.json", "j").wait(60) == 0
    marker = tmp_path / "started"
    doomed = _run("work", url, tmp_path / "doomed.json", "j", "--hang-first", str(marker))
    try:
        _wait_for(marker.exists, timeout=60)
    finally:
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(30)
    survivor = _run("work", url, tmp_path / "survivor.json", "j")
    assert survivor.wait(90) == 0
    [request] = [s for s in _spans(tmp_path / "produce.json") if s["name"] == "request"]
    worked = _spans(tmp_path / "survivor.json")
    [recover] = [s for s in worked if s["name"] == "recover q"]
    [process] = [s for s in worked if s["name"] == "process q"]
    assert recover["trace_id"] == process["trace_id"] == request["trace_id"]
    assert recover["attributes"]["watchdog.recovery.result"] == "requeued"
    assert process["attributes"]["watchdog.job.recovery_count"] == 1
    assert process["attributes"]["watchdog.job.outcome"] == "completed"
    job = Watchdog(engine).read("j")
    assert job is not None and job.outcome is Outcome.COMPLETED and job.recovery_count == 1
