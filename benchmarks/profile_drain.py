#!/usr/bin/env python3
"""Where a drained job's time goes: py-spy samples of a runner process, by function group.

    .venv/bin/pip install py-spy
    .venv/bin/python benchmarks/profile_drain.py [--jobs 3000] [--shapes sync-c1,sync-c16,async-c16]

For each shape, a worker process exactly as run.py's drain rows start it (``Runner``
at concurrency c, or ``AsyncRunner``) runs under ``py-spy record --gil`` (only samples
of the thread holding the GIL: the process's Python work, which is what threads
contend for); one transaction enqueues ``--jobs`` jobs and the clock runs until none
is left. Reported per job: the wall time (1 / drain rate), the worker's CPU time
(utime + stime from /proc), and the GIL-holding samples split by the innermost frame's
module into groups -- SQL build/compile (SQLAlchemy's statement and compiler
layers), result rows, engine/connection/pool, the driver (psycopg's Python layer;
its C parts and the socket waits do not hold the GIL), thread hand-offs (threading,
queue, concurrent.futures, asyncio's loop), logging, JSON, and our own code.
Each group's share of the samples times the CPU time per job gives its microseconds
per job. ``--raw DIR`` keeps py-spy's collapsed stacks.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness
from harness import create_database, drop_all_created

#: (group, path fragments of the innermost frame's file), first match wins.
GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("ours: sqlalchemy_watchdog", ("sqlalchemy_watchdog/",)),
    ("SQLAlchemy: SQL build/compile/cache key", ("sqlalchemy/sql/",)),
    (
        "SQLAlchemy: result rows",
        ("sqlalchemy/engine/result.py", "sqlalchemy/engine/cursor.py", "sqlalchemy/engine/row.py"),
    ),
    ("SQLAlchemy: engine/connection/pool/events", ("sqlalchemy/engine/", "sqlalchemy/pool/", "sqlalchemy/event/")),
    ("SQLAlchemy: other (util, dialect, orm)", ("sqlalchemy/",)),
    ("driver: psycopg (Python layer)", ("psycopg/", "psycopg_pool/", "psycopg_binary/")),
    ("thread hand-offs: threading/queue/futures", ("threading.py", "queue.py", "concurrent/futures/")),
    ("asyncio event loop", ("asyncio/",)),
    ("logging", ("logging/",)),
    ("json", ("json/",)),
]


def group_of(frame: str) -> str:
    if not frame.strip():
        return "native (GIL held, no Python frame)"
    for name, fragments in GROUPS:
        if any(fragment in frame for fragment in fragments):
            return name
    return "other (stdlib, interpreter)"


def operation_of(frames: list[str]) -> str:
    """The store operation a sample is in: the outermost frame in store.py, else the outermost of ours."""
    for marker in ("sqlalchemy_watchdog/store.py", "sqlalchemy_watchdog/"):
        for frame in frames:
            if marker in frame:
                name = frame.split(" (")[0]
                return (
                    f"store.{name}"
                    if marker.endswith("store.py")
                    else f"{name} ({frame.rsplit('/', 1)[-1].split(':')[0]})"
                )
    return "outside sqlalchemy_watchdog"


def read_collapsed(path: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Samples per group (by each stack's innermost frame) and per store operation
    (py-spy's raw format: ``frame;frame;... count``)."""
    counts: collections.Counter[str] = collections.Counter()
    operations: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        counts[group_of(frames[-1])] += int(count)
        operations[operation_of(frames)] += int(count)
    return counts, operations


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile(shape: str, jobs: int, rate: int, raw_dir: Path | None, count_sql: bool = False) -> dict[str, object]:
    from subjects import SUBJECT

    kind, conc = shape.split("-c")
    concurrency = int(conc)
    target = create_database(f"profile_{kind}_{concurrency}")
    SUBJECT.install(target)
    workdir = Path(tempfile.mkdtemp(prefix="watchdog_profile_"))
    out = workdir / "stacks.txt"
    spy_bin = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [
        sys.executable,
        str(HERE / "run.py"),
        "worker",
        "--subject",
        "watchdog",
        "--target",
        target.to_json(),
        "--concurrency",
        str(concurrency),
    ]
    if kind == "async":
        argv.append("--asyncio")
    # Counting statements attaches a SQLAlchemy event listener, which makes the
    # store send its hot statements through SQLAlchemy's execution (so that the
    # listener sees them): a different path than an application's. Only on request.
    env = {**os.environ, "WATCHDOG_BENCH_COUNT_SQL": "1"} if count_sql else dict(os.environ)
    worker_proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=open(workdir / "worker.log", "w"), text=True, env=env
    )
    spy: subprocess.Popen[str] | None = None
    try:
        assert worker_proc.stdout is not None
        while (line := worker_proc.stdout.readline()) and line.strip() != "READY":
            pass
        probe = SUBJECT.probe(target)
        time.sleep(0.5)
        SUBJECT.prefill(target, 20, "warm")
        harness.poll_until(lambda: not probe.live(), timeout=60, interval=0.005, what="warm-up")
        # Attach only now: start-up and imports stay out of the samples.
        spy = subprocess.Popen(
            [
                spy_bin,
                "record",
                "--gil",
                "--format",
                "raw",
                "--rate",
                str(rate),
                "--output",
                str(out),
                "--pid",
                str(worker_proc.pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / "py-spy.log", "w"),
        )
        time.sleep(1.0)
        cpu_before = cpu_seconds(worker_proc.pid)
        started = SUBJECT.prefill(target, jobs, "profile")
        finished = harness.poll_until(lambda: not probe.live(), timeout=600, interval=0.005, what="drain")
        cpu = cpu_seconds(worker_proc.pid) - cpu_before
        spy.send_signal(2)
        spy.wait(timeout=60)
        probe.close()
    finally:
        for proc in (spy, worker_proc):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        harness.drop_database(target)
    counts, operations = read_collapsed(out)
    # Statements the worker sent, from its exit report (the 20 warm-up jobs included).
    statements: dict[str, float] = {}
    for line in (workdir / "worker.log").read_text().splitlines():
        if line.startswith("SQLCOUNT "):
            _, n, words = line.split(" ", 2)
            statements[words] = int(n) / (jobs + 20)
    if raw_dir:
        raw_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(out, raw_dir / f"{shape}.txt")
    wall_us = (finished - started) / jobs * 1e6
    cpu_us = cpu / jobs * 1e6
    total = sum(counts.values()) or 1
    return {
        "shape": shape,
        "rate": jobs / (finished - started),
        "wall_us": wall_us,
        "cpu_us": cpu_us,
        "groups": {name: cpu_us * n / total for name, n in counts.most_common()},
        "operations": {name: cpu_us * n / total for name, n in operations.most_common()},
        "samples": total,
        "statements": statements,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--shapes", default="sync-c1,sync-c16,async-c16")
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    parser.add_argument("--raw", type=Path, default=None, help="keep py-spy's collapsed stacks here")
    parser.add_argument(
        "--count-sql",
        action="store_true",
        help="also count the statements per job (a SQLAlchemy listener: the hot statements then take SQLAlchemy's path)",
    )
    args = parser.parse_args()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"profile: {load}", flush=True)
    results = []
    try:
        for shape in args.shapes.split(","):
            result = profile(shape, args.jobs, args.rate, args.raw, args.count_sql)
            results.append(result)
            print(
                f"  {shape}: {result['rate']:,.0f} jobs/s, wall {result['wall_us']:,.0f} us/job,"
                f" worker CPU {result['cpu_us']:,.0f} us/job",
                flush=True,
            )
    finally:
        drop_all_created()
    names = [name for name, _ in GROUPS] + ["other (stdlib, interpreter)", "native (GIL held, no Python frame)"]
    header = " | ".join(str(r["shape"]) for r in results)
    print(f"\n| us per job | {header} |")
    print("| --- |" + " --- |" * len(results))
    print("| wall (1 / drain rate) | " + " | ".join(f"{r['wall_us']:,.0f}" for r in results) + " |")
    print("| worker CPU (all threads) | " + " | ".join(f"{r['cpu_us']:,.0f}" for r in results) + " |")
    for name in names:
        cells = [f"{r['groups'].get(name, 0.0):,.0f}" for r in results]  # type: ignore[attr-defined]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for result in results:
        if not result["statements"]:
            continue
        print(f"\n| {result['shape']}: statements per job | per job |")
        print("| --- | --- |")
        for words, per_job in result["statements"].items():  # type: ignore[attr-defined]
            if per_job >= 0.01:
                print(f"| `{words}` | {per_job:.2f} |")
        print(f"\n| {result['shape']}: us per job by operation | us |")
        print("| --- | --- |")
        for name, us in result["operations"].items():  # type: ignore[attr-defined]
            if us >= 5:
                print(f"| {name} | {us:,.0f} |")
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"\nload at the end: {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
