"""Request latency and CPU of a web process with the runner inside it.

Serves examples/fastapi_in_process.py with uvicorn and sends POST /orders
at a fixed rate for ``--seconds``, in two phases: the runner idle (each
order's job takes 0 ms, so the runner is busy only with its own orders),
and the runner busy (``--backlog`` jobs of ``--work-ms`` each enqueued
first). Prints request latency p50/p95 and the server process's CPU per
phase. One command::

    python benchmarks/in_process.py --url postgresql+psycopg://app@localhost/app --rate 75 --seconds 30

The database must exist; its ``watchdog_jobs`` table is created with
``sqlalchemy-watchdog upgrade``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def post(url: str, body: dict[str, Any]) -> float | None:
    """The request's latency in seconds, None when it failed."""
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            response.read()
            return time.perf_counter() - started if response.status == 201 else None
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phase(base: str, pid: int, rate: float, seconds: float, work_ms: int) -> dict[str, Any]:
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()
    cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
    threads = []
    interval = 1.0 / rate
    deadline = time.monotonic() + seconds
    next_at = time.monotonic()

    def one() -> None:
        nonlocal failures
        latency = post(f"{base}/orders", {"customer": "bench", "work_ms": work_ms})
        with lock:
            if latency is None:
                failures += 1
            else:
                latencies.append(latency)

    while next_at < deadline:
        time.sleep(max(0.0, next_at - time.monotonic()))
        thread = threading.Thread(target=one, daemon=True)
        thread.start()
        threads.append(thread)
        next_at += interval
    for thread in threads:
        thread.join(15)
    cpu = cpu_seconds(pid) - cpu_before
    wall = time.monotonic() - wall_before
    ordered = sorted(latencies) or [float("nan")]
    return {
        "requests": len(latencies),
        "failed": failures,
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 2),
        "cpu_percent": round(100 * cpu / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="async-capable URL, e.g. postgresql+psycopg://...")
    parser.add_argument("--rate", type=float, default=75.0, help="requests per second (default 75)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase (default 30)")
    parser.add_argument("--backlog", type=int, default=2000, help="jobs enqueued before the busy phase")
    parser.add_argument("--work-ms", type=int, default=5, help="each backlog job's work (default 5 ms)")
    args = parser.parse_args()
    env = {**os.environ, "WATCHDOG_DATABASE_URL": args.url}
    cli = [sys.executable, "-m", "sqlalchemy_watchdog.cli"]
    subprocess.run([*cli, "upgrade"], cwd=EXAMPLES, env=env, check=True, capture_output=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "fastapi_in_process:app", "--port", str(port), "--log-level", "warning"],
        cwd=EXAMPLES,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while post(f"{base}/orders", {"customer": "warmup"}) is None:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the app did not start")
            time.sleep(0.1)
        results = {"rate": args.rate, "seconds": args.seconds}
        results["runner_idle"] = phase(base, server.pid, args.rate, args.seconds, 0)
        for _ in range(args.backlog):  # the busy phase: a backlog the runner works through meanwhile
            post(f"{base}/orders", {"customer": "backlog", "work_ms": args.work_ms})
        results["runner_busy"] = phase(base, server.pid, args.rate, args.seconds, args.work_ms)
        print(json.dumps(results, indent=2))
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
