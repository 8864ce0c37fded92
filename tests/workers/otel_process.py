"""One side of the cross-process trace tests (``tests/integration/test_otel.py``).

    python tests/workers/otel_process.py produce URL OUT JOB_ID
    python tests/workers/otel_process.py work URL OUT JOB_ID [--hang-first MARKER]

Each process sets up the OpenTelemetry SDK with an in-memory span exporter
and ``sqlalchemy_watchdog.otel.instrument``; at the end it writes the spans
it recorded to ``OUT`` as JSON (name, kind, trace and span ids, parent,
attributes, events, status).

``produce`` enqueues job ``JOB_ID`` (queue ``q``) inside a span named
``request``, in its own transaction. ``work`` runs a Runner (1 s lease)
until ``JOB_ID`` is settled; its handler opens a ``handler work`` span. With
``--hang-first MARKER`` the handler of the job's first execution (recovery
count 0) creates the file ``MARKER`` and blocks forever: the test kills the
process there, and a second ``work`` process recovers the job.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import Job, Runner, RunningJob, Watchdog, enqueue
from sqlalchemy_watchdog.otel import instrument


def span_record(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_span_id": None if span.parent is None else format(span.parent.span_id, "016x"),
        "parent_trace_id": None if span.parent is None else format(span.parent.trace_id, "032x"),
        "attributes": dict(span.attributes or {}),
        "events": [event.name for event in span.events],
        "status": span.status.status_code.name,
    }


def main(argv: list[str]) -> None:
    mode, url, out, job_id = argv[:4]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrument(tracer_provider=provider)
    tracer = provider.get_tracer("tests")
    engine = create_engine(url)
    if mode == "produce":
        with tracer.start_as_current_span("request"), Session(engine) as session:
            enqueue(session, Job(job_id, "q", payload={"n": 1}, max_recoveries=1))
            session.commit()
    else:
        marker = Path(argv[5]) if len(argv) > 5 and argv[4] == "--hang-first" else None

        def handle(job: RunningJob) -> None:
            if marker is not None and job.recovery_count == 0:
                marker.write_text("started")
                while True:
                    time.sleep(1)
            with tracer.start_as_current_span("handler work"):
                pass

        runner = Runner(
            engine,
            {"q": handle},
            lease=timedelta(seconds=1),
            heartbeat=timedelta(milliseconds=200),
            poll_interval=timedelta(milliseconds=50),
        )
        thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False})
        thread.start()
        watchdog = Watchdog(engine)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job = watchdog.read(job_id)
            if job is not None and job.state.value == "settled":
                break
            time.sleep(0.05)
        runner.stop()
        thread.join(30)
    engine.dispose()
    Path(out).write_text(json.dumps([span_record(span) for span in exporter.get_finished_spans()]))


if __name__ == "__main__":
    main(sys.argv[1:])
