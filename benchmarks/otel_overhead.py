#!/usr/bin/env python3
"""What OpenTelemetry instrumentation costs a drain.

    .venv/bin/python benchmarks/otel_overhead.py                 # both dialects, 3 runs each
    .venv/bin/python benchmarks/otel_overhead.py --jobs 500 --repeat 1 --dialects sqlite

Each figure is one fresh worker process that drains N jobs enqueued in one
transaction with ``Runner(engine, concurrency=C).run_forever()`` on a
no-op handler; the clock runs from the runner's start until the database
shows every job settled. Three modes, alternated within each repeat so a
change in machine load hits all of them:

``off``
    ``sqlalchemy_watchdog`` only: the process never imports OpenTelemetry
    (checked: the run fails if any ``opentelemetry`` module is loaded).
``on``
    ``sqlalchemy_watchdog.otel.instrument()`` with the SDK: a
    ``TracerProvider`` with a ``BatchSpanProcessor`` to an exporter that
    drops the spans, and a ``MeterProvider`` with an in-memory reader --
    every span and metric of every job is recorded; only the export is free.
``on+stats``
    ``on`` plus the queue-depth gauges (``stats_engine=``, at their default
    ``stats_every`` of 5 s), collected every second -- more often than a
    Prometheus scrape (15-60 s).

Prints a table: median jobs/s, min-max over the repeats, and each mode's
median as a ratio of ``off``. PostgreSQL comes from
``WATCHDOG_BENCH_POSTGRES`` like ``benchmarks/run.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness

MODES = ("off", "on", "on+stats")


def child(url: str, jobs: int, concurrency: int, mode: str) -> None:
    """One drain in this process; prints its jobs/s as JSON."""
    import threading
    import time

    from sqlalchemy import create_engine, func, select
    from sqlalchemy.orm import Session

    from sqlalchemy_watchdog import Job, Runner, enqueue, metadata
    from sqlalchemy_watchdog.model import jobs_table

    engine = create_engine(url)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    provider_shutdown = []
    if mode != "off":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        from sqlalchemy_watchdog.otel import instrument

        class Drop(SpanExporter):
            def export(self, spans):  # type: ignore[no-untyped-def]
                return SpanExportResult.SUCCESS

        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(BatchSpanProcessor(Drop()))
        reader = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[reader])
        instrument(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            stats_engine=engine if mode == "on+stats" else None,
        )
        provider_shutdown = [tracer_provider.shutdown, meter_provider.shutdown]
        if mode == "on+stats":
            collecting = threading.Event()

            def collect() -> None:
                while not collecting.wait(1.0):
                    reader.get_metrics_data()

            threading.Thread(target=collect, daemon=True).start()
    with Session(engine) as session:
        enqueue(session, [Job(f"job-{i}", "bench", payload={"i": i}) for i in range(jobs)])
        session.commit()
    runner = Runner(engine, {"bench": lambda job: None}, concurrency=concurrency)
    count = select(func.count()).select_from(jobs_table).where(jobs_table.c.state != "settled")
    start = time.perf_counter()
    thread = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False})
    thread.start()
    with engine.connect() as conn:
        while conn.execute(count).scalar_one() > 0:
            conn.rollback()
            time.sleep(0.005)
    elapsed = time.perf_counter() - start
    runner.stop()
    thread.join(60)
    for shutdown in provider_shutdown:
        shutdown()
    loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
    if mode == "off" and loaded:
        raise SystemExit(f"mode off loaded OpenTelemetry: {loaded[:3]}")
    print(json.dumps({"jobs_per_s": jobs / elapsed}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dialects", default="postgresql,sqlite")
    parser.add_argument("--child", nargs=3, metavar=("URL", "MODE", "JOBS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, mode, jobs = args.child
        child(url, int(jobs), args.concurrency, mode)
        return 0
    print(f"# load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(f"# {args.jobs} jobs per drain, concurrency {args.concurrency}, {args.repeat} repeat(s)")
    results: dict[tuple[str, str], list[float]] = {}
    workdir = Path(tempfile.mkdtemp(prefix="watchdog_otel_"))
    try:
        for dialect in args.dialects.split(","):
            target = (
                harness.create_database("otel")
                if dialect == "postgresql"
                else harness.Target("sqlite", str(workdir / "otel.db"), "otel.db")
            )
            try:
                for r in range(args.repeat):
                    # Rotate the order so no mode always runs first.
                    for mode in MODES[r % 3 :] + MODES[: r % 3]:
                        out = subprocess.run(
                            [sys.executable, __file__, "--concurrency", str(args.concurrency),
                             "--child", target.sqlalchemy_url, mode, str(args.jobs)],
                            capture_output=True, text=True, timeout=900,
                        )  # fmt: skip
                        if out.returncode != 0:
                            print(out.stderr[-2000:], file=sys.stderr)
                            return 1
                        rate = json.loads(out.stdout.strip().splitlines()[-1])["jobs_per_s"]
                        results.setdefault((dialect, mode), []).append(rate)
                        print(f"  {dialect:<10} {mode:<9} run {r + 1}: {rate:8.0f} jobs/s", flush=True)
            finally:
                harness.drop_database(target)
    finally:
        harness.drop_all_created()
    print()
    print("| dialect | instrumentation | jobs/s (median) | min-max | vs off |")
    print("| --- | --- | ---: | ---: | ---: |")
    for (dialect, mode), rates in results.items():
        base = statistics.median(results[(dialect, "off")])
        median = statistics.median(rates)
        print(f"| {dialect} | {mode} | {median:,.0f} | {min(rates):,.0f}-{max(rates):,.0f} | {median / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
