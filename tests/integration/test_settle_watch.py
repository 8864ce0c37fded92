"""The settle watch (revision w0013): only a job something waits for runs the
settle triggers, and a dependent enqueued while its parent settles is told
whichever transaction commits first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text

from sqlalchemy_watchdog import Decision, Job, JobState, Watchdog, enqueue
from sqlalchemy_watchdog.store.claims import SettleRequest, claim, settle_many

LEASE_MS = 60_000


def _running(engine: Engine, job_id: str) -> str:
    """Claim ``job_id`` (the only queued job of queue q): its token."""
    with engine.begin() as conn:
        batch = claim(conn, queues=["q"], limit=1, lease_ms=LEASE_MS)
    assert [c.job.job_id for c in batch.claimed] == [job_id]
    return batch.claimed[0].token


def _in_thread(work: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # pragma: no cover - reported by the test
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def _watched(engine: Engine) -> dict[str, int | None]:
    with engine.connect() as conn:
        return {row[0]: row[1] for row in conn.execute(text("SELECT job_id, watched FROM watchdog_jobs"))}


def test_only_jobs_with_dependents_are_watched(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("stored-parent", "q"), Job("alone", "q")])
    wd.enqueue([Job("in-call-parent", "q"), Job("child", "q", after=["stored-parent", "in-call-parent"])])
    assert _watched(engine) == {"stored-parent": 1, "alone": None, "in-call-parent": 1, "child": None}


@pytest.mark.dialect_specific
def test_a_parent_settling_while_its_dependent_is_enqueued_waits_and_then_releases_it(engine: Engine) -> None:
    """The enqueue holds the parent's row: the settlement waits for its
    commit, finds the parent watched, and releases the child."""
    wd = Watchdog(engine)
    wd.enqueue(Job("p", "q"))
    token = _running(engine, "p")
    with engine.connect() as conn:
        with conn.begin():
            enqueue(conn, Job("c", "q", after=["p"]))

            def settle() -> None:
                with engine.begin() as other:
                    settle_many(other, [SettleRequest("p", token, Decision.completed())])

            thread, errors = _in_thread(settle)
            time.sleep(0.3)
            assert thread.is_alive(), "the settlement should wait for the enqueue's commit"
        thread.join(30)
    assert not thread.is_alive() and errors == []
    child = wd.read("c")
    assert child is not None and child.state is JobState.QUEUED


@pytest.mark.dialect_specific
def test_a_dependent_enqueued_while_its_parent_settles_counts_the_settlement(engine: Engine) -> None:
    """The settlement holds the parent's row: the enqueue waits for its
    commit, reads the parent settled, and the child is ready at once."""
    wd = Watchdog(engine)
    wd.enqueue(Job("p", "q"))
    token = _running(engine, "p")
    with engine.connect() as conn:
        with conn.begin():
            settle_many(conn, [SettleRequest("p", token, Decision.completed())])

            def enqueue_child() -> None:
                with engine.begin() as other:
                    enqueue(other, Job("c", "q", after=["p"]))

            thread, errors = _in_thread(enqueue_child)
            time.sleep(0.3)
            assert thread.is_alive(), "the enqueue should wait for the settlement's commit"
        thread.join(30)
    assert not thread.is_alive() and errors == []
    child = wd.read("c")
    assert child is not None and child.state is JobState.QUEUED
    assert _watched(engine)["p"] is None  # settled before anyone depended on it
