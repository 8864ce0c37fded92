from sqlalchemy import Engine

from sqlalchemy_watchdog import Job, Watchdog, enqueue
from sqlalchemy_watchdog.asyncio import AsyncWatchdog
from tests.conftest import make_async_engine


def test_enqueue_then_read(engine: Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, Job("a", "q"))
    assert Watchdog(engine).read("a").queue == "q"


async def test_async_read(engine: Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, Job("a", "q"))
    aengine = make_async_engine(engine)
    try:
        assert (await AsyncWatchdog(aengine).read("a")).job_id == "a"
    finally:
        await aengine.dispose()
