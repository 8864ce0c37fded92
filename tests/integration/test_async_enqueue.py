"""The asyncio API: the same transactional enqueue with AsyncSession / AsyncConnection
(sqlite+aiosqlite, postgresql+psycopg), and AsyncWatchdog reads equal to Watchdog's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest
from sqlalchemy import Engine, String, Table, Text, insert, literal, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_watchdog import (
    Decision,
    EnqueueConflict,
    EnqueueStatus,
    Job,
    JobState,
    RetryPolicy,
    Watchdog,
    enqueue,
    store,
)
from sqlalchemy_watchdog import asyncio as watchdog_asyncio
from sqlalchemy_watchdog.asyncio import AsyncWatchdog
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.testing import assert_enqueued_async, assert_not_enqueued, assert_not_enqueued_async
from tests.conftest import make_async_engine

QUEUED = EnqueueStatus.QUEUED
DUPLICATE = EnqueueStatus.DUPLICATE


class AppBase(DeclarativeBase):
    pass


class Order(AppBase):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String(100), unique=True)


orders = cast(Table, Order.__table__)


@pytest.fixture
def db(engine: Engine) -> Engine:
    AppBase.metadata.create_all(engine)
    return engine


def order_refs(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(orders.c.reference).order_by(orders.c.id)).scalars())


def job_rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(jobs_table).order_by(jobs_table.c.sequence)).mappings()]


ORIGINAL = Job("order-1", "emails", priority=5, payload={"a": 1})
CONFLICTING = Job("order-1", "emails", priority=5, payload={"a": 2})


# -- AsyncSession ------------------------------------------------------------------------


async def test_async_session_commit_makes_both_durable(db: Engine) -> None:
    aengine = make_async_engine(db)
    try:
        async with AsyncSession(aengine) as session:
            session.add_all([Order(reference="A-1"), Order(reference="A-2")])
            result = await watchdog_asyncio.enqueue(session, Job("confirm-A-1", "emails"))
            await assert_enqueued_async(session, job_id="confirm-A-1")  # in the session's transaction
            await assert_not_enqueued_async(aengine)  # nowhere else before the commit
            await session.commit()
    finally:
        await aengine.dispose()
    assert result.status is QUEUED
    assert order_refs(db) == ["A-1", "A-2"]
    assert [r["job_id"] for r in job_rows(db)] == ["confirm-A-1"]


async def test_async_session_rollback_drops_both(db: Engine) -> None:
    aengine = make_async_engine(db)
    try:
        async with AsyncSession(aengine) as session:
            session.add(Order(reference="A-1"))
            await session.flush()
            await watchdog_asyncio.enqueue(session, Job("confirm-A-1", "emails"))
            await assert_enqueued_async(session, job_id="confirm-A-1", count=1)
            await session.rollback()
    finally:
        await aengine.dispose()
    assert order_refs(db) == []
    assert_not_enqueued(db)


async def test_async_identical_replay_is_duplicate_and_changes_nothing(db: Engine) -> None:
    with db.begin() as conn:
        enqueue(conn, ORIGINAL)
    before = job_rows(db)
    aengine = make_async_engine(db)
    try:
        async with AsyncSession(aengine) as session:
            results = await watchdog_asyncio.enqueue(
                session, [Job("order-1", "emails", priority=5, payload={"a": 1}), Job("new", "q")]
            )
            await session.commit()
    finally:
        await aengine.dispose()
    assert [(r.job_id, r.status) for r in results] == [("order-1", DUPLICATE), ("new", QUEUED)]
    assert job_rows(db)[0] == before[0]


@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "pending"])
async def test_async_session_conflicting_replay_rolls_back_caller_writes(db: Engine, flushed: bool) -> None:
    with db.begin() as conn:
        enqueue(conn, ORIGINAL)
    before = job_rows(db)
    aengine = make_async_engine(db)
    try:
        async with AsyncSession(aengine) as session:
            session.add(Order(reference="A-1"))
            if flushed:
                await session.flush()
            with pytest.raises(EnqueueConflict) as caught:
                await watchdog_asyncio.enqueue(session, CONFLICTING)
            await session.commit()  # the caller ignores the error and commits anyway
    finally:
        await aengine.dispose()
    assert caught.value.job_id == "order-1"
    assert order_refs(db) == []
    assert job_rows(db) == before


# -- AsyncConnection ---------------------------------------------------------------------


async def test_async_connection_commit_makes_both_durable_and_rollback_drops_both(db: Engine) -> None:
    aengine = make_async_engine(db)
    try:
        async with aengine.connect() as conn:
            await conn.execute(insert(orders).values(reference="kept"))
            assert (await watchdog_asyncio.enqueue(conn, Job("job-kept", "q"))).status is QUEUED
            await conn.commit()
            await conn.execute(insert(orders).values(reference="dropped"))
            await watchdog_asyncio.enqueue(conn, Job("job-dropped", "q"))
            await conn.rollback()
            assert (await watchdog_asyncio.enqueue(conn, Job("job-kept", "q"))).status is DUPLICATE
            await conn.commit()
    finally:
        await aengine.dispose()
    assert order_refs(db) == ["kept"]
    assert [r["job_id"] for r in job_rows(db)] == ["job-kept"]


async def test_async_connection_conflicting_replay_rolls_back_caller_writes(db: Engine) -> None:
    with db.begin() as conn:
        enqueue(conn, ORIGINAL)
    before = job_rows(db)
    aengine = make_async_engine(db)
    try:
        async with aengine.connect() as conn:
            await conn.execute(insert(orders).values(reference="A-1"))
            with pytest.raises(EnqueueConflict):
                await watchdog_asyncio.enqueue(conn, CONFLICTING)
            await conn.commit()
        with pytest.raises(EnqueueConflict):
            async with aengine.begin() as conn:
                await conn.execute(insert(orders).values(reference="A-2"))
                await watchdog_asyncio.enqueue(conn, CONFLICTING)
    finally:
        await aengine.dispose()
    assert order_refs(db) == []
    assert job_rows(db) == before


# -- enqueue_select ------------------------------------------------------------------------


def confirmation_select() -> Any:
    return select(
        (literal("confirm-", Text) + orders.c.reference).label("job_id"),
        literal("emails", Text).label("queue"),
        (literal('{"ref": "', Text) + orders.c.reference + literal('"}', Text)).label("payload"),
    ).order_by(orders.c.id)


@pytest.mark.parametrize("target", ["session", "connection"])
async def test_async_enqueue_select_admits_one_job_per_row_and_replays_as_duplicate(db: Engine, target: str) -> None:
    with Session(db) as session:
        session.add_all([Order(reference="A"), Order(reference="B")])
        session.commit()
    aengine = make_async_engine(db)
    try:
        for expected in (QUEUED, DUPLICATE):
            if target == "session":
                async with AsyncSession(aengine) as session:
                    results = await watchdog_asyncio.enqueue_select(session, confirmation_select())
                    await session.commit()
            else:
                async with aengine.begin() as conn:
                    results = await watchdog_asyncio.enqueue_select(conn, confirmation_select())
            assert [(r.job_id, r.status) for r in results] == [("confirm-A", expected), ("confirm-B", expected)]
    finally:
        await aengine.dispose()
    job = Watchdog(db).read("confirm-B")
    assert job is not None and job.payload == {"ref": "B"}
    with db.begin() as conn:
        assert enqueue(conn, Job("confirm-A", "emails", payload={"ref": "A"})).status is DUPLICATE


async def test_async_enqueue_refuses_sync_targets(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(TypeError, match="AsyncSession"):
            await watchdog_asyncio.enqueue(session, Job("a", "q"))  # type: ignore[call-overload]
    with engine.connect() as conn:
        with pytest.raises(TypeError, match="AsyncSession"):
            await watchdog_asyncio.enqueue_select(conn, select(literal("a").label("job_id")))  # type: ignore[arg-type]
    assert job_rows(engine) == []


# -- AsyncWatchdog reads ---------------------------------------------------------------------


def populate(engine: Engine) -> None:
    """Delayed, queued, running, settled (completed, failed, cancelled) jobs across two queues."""
    with engine.begin() as conn:
        enqueue(
            conn,
            [
                Job("done", "q", priority=9, payload={"n": 1}),
                Job("failed", "q", priority=8, max_recoveries=1),
                Job("runs", "q", priority=7),
                Job("waits", "q", priority=1, payload=[1, "two"]),
                Job("later", "q", priority=1),
                Job("other", "other", lane="team:1"),
            ],
        )
        enqueue(conn, Job("tomorrow", "q", retry=RetryPolicy(max_attempts=3)), delay=timedelta(days=1))
        enqueue(conn, Job("after-later", "q", after=["later"]))  # waiting for its parent
    for decision in (Decision.completed(), Decision.failed("boom")):
        with store.write_transaction(engine) as conn:
            taken = store.claim(conn, queues=["q"], lease_ms=60_000).claimed[0]
            store.settle(conn, job_id=taken.job.job_id, claim_token=taken.token, decision=decision)
    with store.write_transaction(engine) as conn:
        store.claim(conn, queues=["q"], lease_ms=60_000)
    Watchdog(engine).cancel("waits", "cancel-waits")
    Watchdog(engine).fail_lane("team:1", "lane down")


async def test_async_watchdog_reads_equal_the_sync_reads(engine: Engine) -> None:
    populate(engine)
    sync = Watchdog(engine)
    aengine = make_async_engine(engine)
    try:
        watchdog = AsyncWatchdog(aengine)
        for job_id in ("done", "failed", "runs", "waits", "later", "other", "after-later", "missing"):
            assert await watchdog.read(job_id) == sync.read(job_id), job_id
        for queue in ("q", "other", "idle"):
            assert await watchdog.read_queue_head(queue) == sync.read_queue_head(queue), queue
        assert await watchdog.read_settled(limit=2) == sync.read_settled(limit=2)
        after = sync.read_settled(limit=1)[0].sequence
        assert await watchdog.read_settled(limit=10, after_sequence=after) == sync.read_settled(
            limit=10, after_sequence=after
        )
        assert await watchdog.has_pending_work() is sync.has_pending_work() is True
    finally:
        await aengine.dispose()
    # The fixture above really covers every state the reads can show.
    read = [sync.read(j) for j in ("done", "runs", "waits", "tomorrow", "after-later")]
    assert {job.state for job in read if job is not None} == set(JobState)
    assert [j.job_id for j in sync.read_settled()] == ["done", "failed", "other"]
    head = sync.read_queue_head("q")
    assert head is not None and head.job_id == "runs"


async def test_async_watchdog_has_no_pending_work_on_an_empty_queue(engine: Engine) -> None:
    aengine = make_async_engine(engine)
    try:
        watchdog = AsyncWatchdog(aengine)
        assert await watchdog.has_pending_work() is False
        assert await watchdog.read_queue_head("q") is None
        assert await watchdog.read_settled() == []
        result = await watchdog.enqueue(Job("a", "q"))
        assert result.status is QUEUED
        assert await watchdog.has_pending_work() is True
    finally:
        await aengine.dispose()
