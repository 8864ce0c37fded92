"""What the per-operation conformance tests (``tests/backends/test_ops_*.py``) share.

Each store operation runs the way the runner and the client run it: in a
transaction of its own on a fresh connection, as its ``@operation``
declaration says (:func:`store.transact`). Leases end without sleeping:
either ``release`` ends one now, or a ``now=`` ten days ahead makes every
lease look ended to the operations that take the application clock (the
statements compare leases with ``max(now, database clock)``).

A test names the operations whose contract it checks with
``@pytest.mark.operation("claim", ...)``; ``test_coverage_of_operations.py``
fails when a declared operation is named by none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Engine

from sqlalchemy_watchdog import Decision, EnqueueResult, Job, store
from sqlalchemy_watchdog.store import Claim, ClaimBatch, Settlement, SettleRequest

P = ParamSpec("P")
T = TypeVar("T")

LEASE_MS = 60_000
DAY_MS = 24 * 3600 * 1000


def op(engine: Engine, fn: Callable[Concatenate[Any, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(conn, ...)`` in a transaction of its own, committed."""
    with engine.connect() as conn:
        return store.transact(conn, fn, *args, **kwargs)


def add(engine: Engine, *jobs: Job, delay: timedelta | None = None) -> list[EnqueueResult]:
    return op(engine, store.enqueue, list(jobs), delay=delay)


def claim(
    engine: Engine, queues: Sequence[str] | None = None, *, limit: int = 1, lease_ms: int = LEASE_MS
) -> ClaimBatch:
    return op(engine, store.claim, queues=queues, limit=limit, lease_ms=lease_ms)


def claim_one(engine: Engine, queues: Sequence[str] | None = None, *, lease_ms: int = LEASE_MS) -> Claim:
    batch = claim(engine, queues, lease_ms=lease_ms)
    assert len(batch.claimed) == 1, batch
    return batch.claimed[0]


def claimed_ids(batch: ClaimBatch) -> list[str]:
    return [c.job.job_id for c in batch.claimed]


def settle(
    engine: Engine, held: Claim, decision: Decision, *, token: str | None = None, now: int | None = None
) -> Settlement:
    return op(
        engine,
        store.settle,
        job_id=held.job.job_id,
        claim_token=held.token if token is None else token,
        decision=decision,
        now=now,
    )


def requeue(engine: Engine, held: Claim, after_ms: int, decision: Decision | None = None) -> Settlement:
    """Settle ``held`` as a retry: ready again ``after_ms`` after the database clock."""
    request = SettleRequest(
        held.job.job_id, held.token, decision or Decision.failed("try again"), requeue_after_ms=after_ms
    )
    (result,) = op(engine, store.settle_many, [request])
    return result


def read(engine: Engine, job_id: str) -> Any:
    """The job as the store reads it (a ``JobView``, or None)."""
    return op(engine, store.read, job_id)


def token_of(engine: Engine, job_id: str) -> str | None:
    found = op(engine, store.read_claim, job_id)
    assert found is not None
    return found[1]


def end_lease(engine: Engine, held: Claim) -> None:
    """End ``held``'s lease now, as a runner that vanished would leave it."""
    assert op(engine, store.release, [(held.job.job_id, held.token)]) == {held.job.job_id}


def far_future() -> int:
    """An application clock ten days ahead: every lease looks ended."""
    return store.now_ms() + 10 * DAY_MS
