"""The statements of the runner's hot path stay within psycopg's query cache.

psycopg 3 converts a query's ``%(name)s`` placeholders once per distinct text
and caches the result -- for texts of at most
``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH`` characters (4,096). A
longer text is parsed for its placeholders in Python at every execution: the
settle statement grew past it with the columns of results, progress and
dependencies, and each settle paid about 0.1 ms of CPU for it. This module
runs each statement a runner sends for every job of a queue without limits
-- the enqueue (in a ``Session`` and in a batch), the claim, the heartbeat's
renewal, the settle (a completion, a retry) -- and checks its text.

Not held to it: the one-statement claim of a limited queue
(``claim_limited_at_once``, about 14,700 characters: the key walk, the room,
the rate log and the cursor in one statement), which pays the conversion,
about 0.15 ms, once per claim batch.
"""

from __future__ import annotations

import pytest
from psycopg import _queries
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import Decision, Job, Watchdog, enqueue, store
from sqlalchemy_watchdog.gateway import SyncGateway


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_every_statement_of_a_jobs_life_fits_psycopgs_query_cache(engine: Engine) -> None:
    sent: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    watchdog = Watchdog(engine)
    gateway = SyncGateway(engine)
    with Session(engine) as session:
        enqueue(session, Job("one", "plain", payload={"n": 1}))
        session.commit()
    watchdog.enqueue([Job(f"batch-{i}", "plain") for i in range(4)])
    claimed = gateway.run(store.claim, queues=("plain",), limit=1, lease_ms=30_000).claimed
    claimed += gateway.run(store.claim, queues=("plain",), limit=10, lease_ms=30_000).claimed
    assert sorted(c.job.job_id for c in claimed) == ["batch-0", "batch-1", "batch-2", "batch-3", "one"]
    pairs = [(c.job.job_id, c.token) for c in claimed]
    assert set(gateway.run(store.renew, pairs, lease_ms=30_000)) == {job_id for job_id, _ in pairs}
    first, second, *rest = claimed
    done = gateway.run(store.settle, job_id=first.job.job_id, claim_token=first.token, decision=Decision.completed())
    retry = store.SettleRequest(second.job.job_id, second.token, Decision.retry("again"), requeue_after_ms=0)
    requests = [store.SettleRequest(c.job.job_id, c.token, Decision.completed(result={"ok": True})) for c in rest]
    settled = [done, *gateway.run(store.settle_many, [retry, *requests])]
    statuses = [s.status for s in settled]
    assert statuses == [store.SettleStatus.SETTLED, store.SettleStatus.REQUEUED] + [store.SettleStatus.SETTLED] * 3
    event.remove(engine, "before_cursor_execute", record)
    limit = _queries.MAX_CACHED_STATEMENT_LENGTH
    too_long = [(len(text), text[:80]) for text in sent if len(text) > limit]
    assert not too_long, f"statements longer than psycopg caches ({limit} characters): {too_long}"
    assert any(text.startswith("UPDATE watchdog_jobs AS j") for text in sent)  # the settle was among them
