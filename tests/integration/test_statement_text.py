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
the rate log and the cursor in one statement) and the claim of four or more
queues. Without SQLAlchemy events listening no hot statement pays the
conversion at all: the store sends each with PostgreSQL's own ``$n``
placeholders, converted once, through a ``RawCursor`` or ``AsyncRawCursor``
(checked below). The limit still holds when events listen (OpenTelemetry's
SQLAlchemy instrumentation, this module's first test), which take psycopg's
ordinary path.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import psycopg
import pytest
from psycopg import _queries
from sqlalchemy import Engine, event
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.dialects.postgresql import psycopg as postgresql_psycopg
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import Decision, Job, Watchdog, WatchdogError, enqueue, store
from sqlalchemy_watchdog.backends import backend_of
from sqlalchemy_watchdog.backends import postgresql as postgresql_backend
from sqlalchemy_watchdog.gateway import AsyncGateway, SyncGateway
from sqlalchemy_watchdog.store import claims_sql, limits_sql, sql, views
from tests.conftest import make_async_engine, prepared_claims


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


class _Recording(psycopg.RawCursor):
    """A real ``RawCursor`` that keeps the text of every query it executes."""

    sent: ClassVar[list[str]] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        _Recording.sent.append(query)
        return super().execute(query, params, **kwargs)


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_long_hot_statements_reach_psycopg_with_native_placeholders(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limited claim (14,000 characters) and a claim of eight queues go to
    the server as ``$n`` text through a ``RawCursor``: psycopg parses neither
    for placeholders, and each claims what its limits and queues allow."""
    monkeypatch.setattr(postgresql_backend, "_raw_cursor", lambda: _Recording)
    _Recording.sent.clear()
    queues = _seed_limited_and_eight_queues(engine)
    gateway = SyncGateway(engine)
    limited = gateway.run(store.claim, queues=("limited",), limit=4, lease_ms=30_000)
    assert sorted(c.job.job_id for c in limited.claimed) == ["lim-0", "lim-1"]  # the queue's concurrency
    assert limited.held_back
    several = gateway.run(store.claim, queues=tuple(queues), limit=3, lease_ms=30_000)
    assert [c.job.job_id for c in several.claimed] == ["q7-job", "q6-job", "q5-job"]  # by priority
    first = several.claimed[0]
    done = gateway.run(store.settle, job_id=first.job.job_id, claim_token=first.token, decision=Decision.completed())
    assert done.status is store.SettleStatus.SETTLED
    with pytest.raises(WatchdogError, match="SQLSTATE 22003"):  # a driver error, named as any other
        gateway.run(store.claim, queues=("q0",), limit=1, lease_ms=2**63 - 1)
    assert gateway.run(store.claim, queues=("q0",), limit=1, lease_ms=30_000).claimed
    _assert_native(_Recording.sent)


def _seed_limited_and_eight_queues(engine: Engine) -> list[str]:
    watchdog = Watchdog(engine)
    watchdog.set_limits("limited", concurrency=2)
    queues = [f"q{i}" for i in range(8)]
    watchdog.enqueue(
        [Job(f"lim-{i}", "limited", key=f"k{i % 2}") for i in range(4)]
        + [Job(f"{queue}-job", queue, priority=i) for i, queue in enumerate(queues)]
    )
    return queues


def _assert_native(sent: list[str]) -> None:
    """The limited claim, the claim of eight queues and the settle were sent as ``$n`` text."""
    long_texts = [text for text in sent if len(text) > _queries.MAX_CACHED_STATEMENT_LENGTH]
    assert len(long_texts) >= 2, [len(text) for text in sent]
    limited = [text for text in long_texts if text.startswith("WITH RECURSIVE seen")]
    assert limited  # the limited claim
    # Its constants are in its text: the parameters left are the caller's queue, limit, token and lease.
    assert {int(n) for text in limited for n in re.findall(r"\$(\d+)", text)} == {1, 2, 3, 4}
    for text in sent:
        assert "%(" not in text and "$1" in text, text[:200]
    assert any(text.startswith("UPDATE watchdog_jobs AS j") for text in sent)  # the settle


class _AsyncRecording(psycopg.AsyncRawCursor):
    """:class:`_Recording` for the async driver."""

    sent: ClassVar[list[str]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        _AsyncRecording.sent.append(query)
        return await super().execute(query, params, **kwargs)


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_long_hot_statements_reach_async_psycopg_with_native_placeholders(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through an ``AsyncEngine``: the store's greenlet awaits an
    ``AsyncRawCursor`` on the driver's connection."""
    monkeypatch.setattr(postgresql_backend, "_raw_async_cursor", lambda: _AsyncRecording)
    _AsyncRecording.sent.clear()
    queues = _seed_limited_and_eight_queues(engine)
    async_engine = make_async_engine(engine)
    try:
        gateway = AsyncGateway(async_engine)
        limited = await gateway.run(store.claim, queues=("limited",), limit=4, lease_ms=30_000)
        assert sorted(c.job.job_id for c in limited.claimed) == ["lim-0", "lim-1"]
        several = await gateway.run(store.claim, queues=tuple(queues), limit=3, lease_ms=30_000)
        assert [c.job.job_id for c in several.claimed] == ["q7-job", "q6-job", "q5-job"]
        first = several.claimed[0]
        done = await gateway.run(
            store.settle, job_id=first.job.job_id, claim_token=first.token, decision=Decision.completed()
        )
        assert done.status is store.SettleStatus.SETTLED
        # A driver error takes SQLAlchemy's path (wrapped, then named by the
        # gateway's error mapping), and the engine goes on after it.
        with pytest.raises(WatchdogError, match="SQLSTATE 22003"):
            await gateway.run(store.claim, queues=("q0",), limit=1, lease_ms=2**63 - 1)  # bigint out of range
        assert (await gateway.run(store.claim, queues=("q0",), limit=1, lease_ms=30_000)).claimed
    finally:
        await async_engine.dispose()
    _assert_native(_AsyncRecording.sent)


def test_a_hot_statements_own_constants_are_written_into_its_text() -> None:
    """Whole numbers and text the builders wrote become literals (quotes doubled, a percent
    sign escaped for pyformat, a negative number in parentheses); other values and the
    caller's parameters stay parameters."""
    defaults: dict[str, Any] = {
        "param_1": 1, "param_2": "it's 100%", "param_3": -2, "param_4": 1.5, "param_5": True, "param_6": "a\\b",
    }  # fmt: skip
    text = views._inline_constants(
        "SELECT %(param_1)s::INTEGER, %(param_2)s, 1 - %(param_3)s, %(param_4)s, %(param_5)s, %(param_6)s,"
        " %(given)s, '5%%'",
        defaults,
    )
    assert text == (
        "SELECT 1::INTEGER, 'it''s 100%%', 1 - (-2), %(param_4)s, %(param_5)s, %(param_6)s, %(given)s, '5%%'"
    )
    assert defaults == {"param_4": 1.5, "param_5": True, "param_6": "a\\b"}
    native, names = views._native(text)
    assert native == "SELECT 1::INTEGER, 'it''s 100%', 1 - (-2), $1, $2, $3, $4, '5%'"
    assert names == ("param_4", "param_5", "param_6", "given")


def test_native_placeholders_number_each_name_once_and_unescape_percent() -> None:
    text, names = views._native("SELECT %(a)s::INTEGER, %(b)s, %(a)s, '100%%', '%%(a)s'")
    assert text == "SELECT $1::INTEGER, $2, $1, '100%', '%(a)s'"
    assert names == ("a", "b")


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_async_psycopg_plans_anew_after_a_slow_hot_statement(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal of a connection's plans after a slow hot statement
    (``views._replan_if_slow``) reaches async psycopg's connection too: its
    claim is then sent as another statement, prepared anew."""
    monkeypatch.setattr(views, "REPLAN_AFTER_S", 60.0)  # the claims themselves renew nothing
    async_engine = make_async_engine(engine)

    def claim_until_prepared(conn: Any) -> int:
        for _ in range(6):  # psycopg prepares a statement at its sixth execution
            store.claim(conn, queues=["q"], limit=2, lease_ms=30_000)
            conn.commit()
        return prepared_claims(conn)

    def renew(conn: Any) -> int:
        views._replan_if_slow(conn, 100.0, 2)
        return views.plans_generation(conn)

    try:
        async with async_engine.connect() as conn:
            assert await conn.run_sync(claim_until_prepared) == 1
            assert await conn.run_sync(renew) == 1
            assert await conn.run_sync(claim_until_prepared) == 2  # sent, prepared and planned anew
    finally:
        await async_engine.dispose()


@pytest.mark.parametrize("builder", ["claim", "settle"])
@pytest.mark.parametrize("dialect_name", ["postgresql", "sqlite"])
def test_every_batch_size_is_written_into_one_compiled_statement(builder: str, dialect_name: str) -> None:
    """A claim or settle of up to LITERAL_LIMIT_MAX jobs has its size written
    into the text (so a prepared statement's generic plan knows it), from one
    statement built and compiled once: each size's text is made once, from
    the compiled one, and a size outside the range is refused by name."""
    dialect: Any = postgresql_psycopg.dialect() if dialect_name == "postgresql" else sqlite_dialect.dialect()  # type: ignore[no-untyped-call]
    name = "limit" if builder == "claim" else "settles_count"
    backend = backend_of(dialect_name)
    statement = claims_sql.claim(backend, 2, True) if builder == "claim" else limits_sql.settle(backend, True)
    pre = views._precompiled(dialect, statement)
    assert pre is not None and pre.sized == (name,)
    marker = f"__[POSTCOMPILE_{name}]"
    template = pre.native[0] if pre.native is not None else pre.text
    assert marker in template
    for size in (1, 8, sql.LITERAL_LIMIT_MAX):
        variant = views._with_sizes(pre, {name: size})
        text = variant.native[0] if variant.native is not None else variant.text
        assert text == template.replace(marker, str(size))
        assert "POSTCOMPILE" not in text and "POSTCOMPILE" not in variant.text
        assert views._with_sizes(pre, {name: size}) is variant  # made once
        if variant.positions is not None:  # SQLite's ?: the size is no parameter
            assert name not in variant.positions
    for bad in (0, sql.LITERAL_LIMIT_MAX + 1, "8", 8.0, True):
        with pytest.raises(ValueError, match=f"^{name}: a whole number from 1 to {sql.LITERAL_LIMIT_MAX}"):
            views._with_sizes(pre, {name: bad})
    assert sql.size_in_text(sql.LITERAL_LIMIT_MAX) and not sql.size_in_text(sql.LITERAL_LIMIT_MAX + 1)
