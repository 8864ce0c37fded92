"""The runner inside the application, with real processes over PostgreSQL:
examples/fastapi_in_process.py under uvicorn (``async with runner.running()``
in the lifespan, the dashboard mounted) and examples/flask_in_process.py
under a threaded WSGI server (``with runner.running()``). Under load, with
``pg_terminate_backend`` cutting every connection of the app, then one
SIGTERM: the process ends with its shutdown run (it says so), within the
runner's shutdown budget; jobs still working at SIGTERM finish within grace
and settle ``completed``; every placed order has its job and every job is
completed -- nothing lost, nothing doubled."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Outcome, Watchdog

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: The examples' runners use the default shutdown budget.
BUDGET_S = 22.0


@pytest.fixture
def database(postgres_server: URL) -> Iterator[URL]:
    name = f"watchdog_inproc_{uuid.uuid4().hex[:10]}"
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield postgres_server.set(database=name, drivername="postgresql+psycopg")
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None
    except OSError:
        return 0, None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve_under_load_then_sigterm(command: list[str], database: URL) -> None:
    url = database.render_as_string(hide_password=False)
    env = {**os.environ, "WATCHDOG_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    upgrade = subprocess.run(
        [sys.executable, "-m", "sqlalchemy_watchdog.cli", "upgrade"],
        cwd=EXAMPLES,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [*(arg.replace("{port}", str(port)) for arg in command)],
        cwd=EXAMPLES,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    engine = create_engine(url)
    try:
        deadline = time.monotonic() + 30
        while post(f"{base}/orders", {"customer": "warmup"})[0] != 201:
            assert process.poll() is None and time.monotonic() < deadline, "the app did not start"
            time.sleep(0.1)
        placed: list[str] = []
        stop_load = threading.Event()

        def load() -> None:  # ~40 requests/s
            while not stop_load.is_set():
                status, body = post(f"{base}/orders", {"customer": "ada", "work_ms": 20})
                if status == 201 and body is not None:
                    placed.append(body["job_id"])
                time.sleep(0.025)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(1.5)
        with engine.connect() as conn:  # cut every connection of the app, twice
            for _ in range(2):
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()"
                    ),
                    {"db": database.database},
                )
                conn.commit()
                time.sleep(0.5)
        time.sleep(1.5)
        # Long jobs still at work when SIGTERM arrives: they finish within grace.
        long_jobs = []
        for _ in range(3):
            status, body = post(f"{base}/orders", {"customer": "bob", "work_ms": 2500})
            assert status == 201 and body is not None
            long_jobs.append(body["job_id"])
        watchdog = Watchdog(engine)
        deadline = time.monotonic() + 20
        while not all((job := watchdog.read(j)) is not None and job.state.value == "running" for j in long_jobs):
            assert time.monotonic() < deadline, "the long jobs did not start"
            time.sleep(0.05)
        stop_load.set()
        loader.join(15)
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = process.communicate(timeout=BUDGET_S + 20)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    try:
        assert "lifespan shutdown done" in err or "server stopped, runner stopped" in err, err[-3000:]
        assert "engine disposed" in err
        assert took < BUDGET_S, took
        with engine.connect() as conn:
            orders = conn.execute(text("SELECT id, status FROM orders")).all()
            jobs: dict[str, str | None] = {
                job_id: outcome for job_id, outcome in conn.execute(text("SELECT job_id, outcome FROM watchdog_jobs"))
            }
        # An order exists if and only if its job does (one transaction each).
        assert {f"confirm-order-{order_id}" for order_id, _ in orders} == set(jobs)
        assert set(placed) | set(long_jobs) <= set(jobs)
        for job_id in long_jobs:
            assert jobs[job_id] == Outcome.COMPLETED.value, (job_id, jobs[job_id])
        assert all(outcome == "completed" for outcome in jobs.values()), {
            j: o for j, o in jobs.items() if o != "completed"
        }
        assert all(status == "confirmed" for _, status in orders)
        assert len(placed) > 20
    finally:
        engine.dispose()


@pytest.mark.slow  # ~15 s: a real uvicorn process under load
def test_fastapi_lifespan_runner_survives_cut_connections_and_stops_with_one_sigterm(database: URL) -> None:
    serve_under_load_then_sigterm(
        [sys.executable, "-m", "uvicorn", "fastapi_in_process:app", "--host", "127.0.0.1", "--port", "{port}"],
        database,
    )


@pytest.mark.slow  # ~15 s: a real WSGI server process under load
def test_flask_thread_runner_survives_cut_connections_and_stops_with_one_sigterm(database: URL) -> None:
    serve_under_load_then_sigterm([sys.executable, "flask_in_process.py", "{port}"], database)
