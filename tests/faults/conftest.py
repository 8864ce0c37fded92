"""Fixtures of the fault tests (the dialect fixtures come from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.faults.helpers import WorkerPool, install_instrumentation


@pytest.fixture
def instrumented(engine: Engine) -> Engine:
    """``engine`` with the audit table and the transition trigger installed."""
    install_instrumentation(engine)
    return engine


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[WorkerPool]:
    """Start worker processes; every one still alive is killed at teardown."""
    pool = WorkerPool(tmp_path)
    try:
        yield pool
    finally:
        pool.close()
