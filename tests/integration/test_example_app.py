"""examples/fastapi_app.py end to end, with real processes over PostgreSQL:
``sqlalchemy-watchdog upgrade``, the app served by uvicorn, a worker started
with ``sqlalchemy-watchdog run fastapi_app``; an order POSTed to the app is
confirmed by the worker, and the mounted dashboard shows its job."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
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

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 30.0


@pytest.fixture
def database(postgres_server: URL) -> Iterator[str]:
    name = f"watchdog_example_{uuid.uuid4().hex[:10]}"
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield postgres_server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def request(url: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"content-type": "application/json"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def eventually(check: Any, what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow  # ~6 s: two real processes (run by CI, or with WATCHDOG_SLOW_TESTS=1)
def test_order_to_settled_job_to_dashboard(database: str) -> None:
    env = {**os.environ, "WATCHDOG_DATABASE_URL": database, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "sqlalchemy_watchdog.cli"]
    upgrade = subprocess.run([*cli, "upgrade"], cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=60)
    assert upgrade.returncode == 0, upgrade.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    processes: list[subprocess.Popen[str]] = []
    try:
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--host", "127.0.0.1", "--port", str(port)],
                cwd=EXAMPLES,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        eventually(lambda: request(f"{base}/orders/0")[0] == 404, "the app to serve")
        processes.append(
            subprocess.Popen(
                [*cli, "run", "fastapi_app", "--poll-interval", "0.2", "--log-level", "WARNING"],
                cwd=EXAMPLES,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        status, body = request(f"{base}/orders", {"customer": "ada", "amount_cents": 1990})
        assert status == 201, body
        placed = json.loads(body)
        assert placed["status"] == "placed" and placed["job_id"] == f"confirm-order-{placed['id']}"
        rejected = json.loads(request(f"{base}/orders", {"customer": "bob", "amount_cents": 0})[1])

        eventually(lambda: '"confirmed"' in request(f"{base}/orders/{placed['id']}")[1], "the order to be confirmed")
        eventually(lambda: '"rejected"' in request(f"{base}/orders/{rejected['id']}")[1], "the order to be rejected")

        # The handler commits the order's new status before the runner's settler
        # commits the job's settlement: wait for the job page to show it.
        job_page = f"{base}/watchdog/job?job_id={placed['job_id']}"
        eventually(lambda: "outcome-completed" in request(job_page)[1], "the job page to show it completed")
        status, page = request(job_page)
        assert status == 200 and "/watchdog/lane?lane=customer%3Aada" in page
        eventually(
            lambda: rejected["job_id"] in request(f"{base}/watchdog/jobs?queue=confirmations&outcome=failed")[1],
            "the rejected order's job to settle failed",
        )
        failed = request(f"{base}/watchdog/jobs?queue=confirmations&outcome=failed")[1]
        assert rejected["job_id"] in failed and placed["job_id"] not in failed

        def overview_with_both() -> str | None:
            page = request(f"{base}/watchdog/")[1]
            return page if "1 completed" in page else None

        overview = eventually(overview_with_both, "the overview")
        assert "1 failed" in overview and "/watchdog/actions/pause" in overview  # from 127.0.0.1: may act
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
        codes = []
        for process in processes:
            try:
                codes.append(process.wait(timeout=30))
            except subprocess.TimeoutExpired:
                process.kill()
                raise
        # uvicorn shuts down gracefully, then re-raises SIGTERM (exit -15); the worker exits 0.
        assert codes[0] in (0, -signal.SIGTERM), processes[0].stderr.read() if processes[0].stderr else codes
        assert "Finished server process" in (processes[0].stderr.read() if processes[0].stderr else "")
        if len(codes) > 1:
            assert codes[1] == 0, processes[1].stderr.read() if processes[1].stderr else codes
