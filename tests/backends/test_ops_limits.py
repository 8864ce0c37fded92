"""Conformance of flow control: a queue's limits stored, read and cleared,
and the claim of a limited queue kept within them.

Every backend runs this file (SQLite on a real file, PostgreSQL); see
``tests/backends/ops.py`` for how the operations are run.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import Decision, InvalidJob, Job, Rate, store
from tests.backends.ops import add, claim, claimed_ids, op, settle


@pytest.mark.operation("set_limits", "read_limits", "clear_limits")
def test_limits_are_stored_read_back_replaced_and_cleared(db: Engine) -> None:
    assert op(db, store.read_limits) == ()
    stored = op(db, store.set_limits, "lim", concurrency=3, rate=Rate(10, timedelta(minutes=1)))
    assert (stored.queue, stored.concurrency, stored.concurrency_per_key) == ("lim", 3, None)
    assert stored.rate == Rate(10, timedelta(minutes=1))
    assert op(db, store.read_limits) == (stored,)
    replaced = op(db, store.set_limits, "lim", concurrency_per_key=1)
    assert (replaced.concurrency, replaced.concurrency_per_key, replaced.rate) == (None, 1, None)
    other = op(db, store.set_limits, "other", concurrency=1)
    assert [limits.queue for limits in op(db, store.read_limits)] == ["lim", "other"]
    assert op(db, store.read_limits, ["other"]) == (other,)
    assert op(db, store.clear_limits, "lim") is True
    assert op(db, store.clear_limits, "lim") is False
    assert op(db, store.read_limits) == (other,)


@pytest.mark.operation("set_limits")
def test_limits_without_any_limit_are_refused_and_write_nothing(db: Engine) -> None:
    with pytest.raises(InvalidJob):
        op(db, store.set_limits, "lim")
    with pytest.raises(InvalidJob):
        op(db, store.set_limits, "lim", concurrency=0)
    assert op(db, store.read_limits) == ()


@pytest.mark.operation("claim", "set_limits")
def test_a_limited_queue_runs_at_most_its_concurrency_and_claims_again_when_room_frees(db: Engine) -> None:
    op(db, store.set_limits, "lim", concurrency=2)
    add(db, *(Job(f"l{n}", "lim") for n in range(4)), Job("free", "free"))
    batch = claim(db, limit=5)
    assert sorted(claimed_ids(batch)) == ["free", "l0", "l1"] and batch.held_back
    assert claim(db, ["lim"], limit=5).claimed == ()
    first = next(c for c in batch.claimed if c.job.job_id == "l0")
    settle(db, first, Decision.completed())
    assert claimed_ids(claim(db, ["lim"], limit=5)) == ["l2"]


@pytest.mark.operation("claim", "set_limits")
def test_a_key_runs_at_most_its_per_key_concurrency_while_other_keys_go_on(db: Engine) -> None:
    op(db, store.set_limits, "lim", concurrency_per_key=1)
    add(db, Job("a1", "lim", key="a"), Job("a2", "lim", key="a"), Job("b1", "lim", key="b"))
    assert sorted(claimed_ids(claim(db, ["lim"], limit=3))) == ["a1", "b1"]
    assert claim(db, ["lim"], limit=3).claimed == ()


@pytest.mark.operation("claim", "set_limits", "clear_limits")
def test_a_rate_limits_the_claims_in_its_window_and_clearing_the_limits_frees_the_queue(db: Engine) -> None:
    op(db, store.set_limits, "lim", rate=Rate(2, timedelta(hours=1)))
    add(db, *(Job(f"r{n}", "lim") for n in range(4)))
    assert claimed_ids(claim(db, ["lim"], limit=4)) == ["r0", "r1"]
    assert claim(db, ["lim"], limit=4).claimed == ()  # the window holds two claims; none ended it
    assert op(db, store.clear_limits, "lim") is True
    assert claimed_ids(claim(db, ["lim"], limit=4)) == ["r2", "r3"]
