"""A process that enqueues jobs sharing unique keys (tests/faults/test_unique_races.py).

Run by ``multiprocessing`` (spawn): each process waits at a barrier with the
others, then enqueues its jobs one transaction each and reports the
``(job_id asked, job_id answered, status)`` of every enqueue.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import Job, enqueue, store


def enqueue_rounds(
    url: str, worker: int, rounds: int, keys: list[str], options: dict[str, Any], barrier: Any, out: Any
) -> None:
    """``rounds`` enqueues per key, as ``Job(f"w{worker}-r{round}-{key}", ...)``."""
    engine = create_engine(url, connect_args={"timeout": 60} if url.startswith("sqlite") else {})
    # Durations cross the process boundary as milliseconds ("unique_for_ms").
    chosen: dict[str, Any] = {
        name.removesuffix("_ms"): timedelta(milliseconds=value) if name.endswith("_ms") else value
        for name, value in options.items()
    }
    answers: list[tuple[str, str, str]] = []
    barrier.wait()
    try:
        _rounds(engine, worker, rounds, keys, chosen, answers)
    except Exception as error:  # reported to the test at once, not after its timeout
        out.put(f"worker {worker} failed: {error!r}")
        raise
    finally:
        engine.dispose()
    out.put(answers)


def _rounds(
    engine: Any, worker: int, rounds: int, keys: list[str], chosen: dict[str, Any], answers: list[tuple[str, str, str]]
) -> None:
    for round_ in range(rounds):
        for key in keys:
            job = Job(
                f"w{worker}-r{round_}-{key}",
                "races",
                payload={"worker": worker, "round": round_},
                unique_key=key,
                **chosen,
            )
            result = _enqueued(engine, job)
            answers.append((job.job_id, result.job_id, result.status.value))


def _enqueued(engine: Any, job: Job) -> Any:
    """``job`` enqueued in a transaction of its own, run again on a transient
    error -- a deadlock (1213) between MariaDB's racing enqueuers rolls the
    whole transaction back, and the MariaDB page tells an application to run
    it again, as this one does (at most 20 times)."""
    for attempt in range(20):
        try:
            with Session(engine) as session:
                result = enqueue(session, job)
                session.commit()
                return result
        except DBAPIError as error:
            if attempt == 19 or not store.is_transient(error):
                raise
            time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")
