"""replace_job: Watchdog.replace inside the caller's own transaction (issue 59).

The waiting job takes its new payload and start only when the caller commits,
with the caller's other writes; a rollback drops both. Sync and asyncio, on
both dialects.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import InvalidJob, Job, JobState, ReplaceStatus, replace_job, store
from sqlalchemy_watchdog import asyncio as watchdog_asyncio
from tests.conftest import make_async_engine
from tests.helpers import add, read

pytestmark = pytest.mark.dialect_neutral


def _notes(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM app_notes")).scalar_one())


@pytest.fixture
def notes(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE app_notes (note VARCHAR(50))"))
    return engine


def test_a_replacement_commits_with_the_callers_writes_and_a_rollback_drops_both(notes: Engine) -> None:
    engine = notes
    add(engine, Job("export", "q", payload={"columns": ["a"]}))
    with Session(engine) as session:
        session.execute(text("INSERT INTO app_notes VALUES ('asked for b')"))
        result = replace_job(session, "export", payload={"columns": ["a", "b"]})
        assert result.status is ReplaceStatus.REPLACED
        session.rollback()
    assert read(engine, "export").payload == {"columns": ["a"]} and _notes(engine) == 0
    later = datetime.now(UTC) + timedelta(hours=1)
    with Session(engine) as session:
        session.execute(text("INSERT INTO app_notes VALUES ('asked for b')"))
        replace_job(session, "export", payload={"columns": ["a", "b"]}, run_at=later)
        session.commit()
    job = read(engine, "export")
    assert (job.payload, job.state, _notes(engine)) == ({"columns": ["a", "b"]}, JobState.DELAYED, 1)


def test_a_claimed_job_is_not_replaced_and_bad_input_is_refused_before_any_sql(engine: Engine) -> None:
    add(engine, Job("running", "q", payload=1))
    with engine.connect() as conn:
        store.transact(conn, store.claim, queues=["q"], limit=1, lease_ms=60_000)
    with Session(engine) as session:
        assert replace_job(session, "running", payload=2).status is ReplaceStatus.NOT_WAITING
        assert replace_job(session, "nobody", payload=2).status is ReplaceStatus.MISSING
        with pytest.raises(InvalidJob) as refused:
            replace_job(session, "running")
        assert refused.value.field == "payload"
        with pytest.raises(InvalidJob) as refused:
            replace_job(session, "running", run_at=datetime(2030, 1, 1))
        assert refused.value.field == "run_at"
        session.commit()
    assert read(engine, "running").payload == 1


def test_the_asyncio_replace_job_runs_in_the_callers_async_transaction(engine: Engine) -> None:
    add(engine, Job("export", "q", payload=1))

    async def main() -> ReplaceStatus:
        aengine = make_async_engine(engine)
        try:
            async with AsyncSession(aengine) as session:
                result = await watchdog_asyncio.replace_job(session, "export", payload=2)
                await session.commit()
                return result.status
        finally:
            await aengine.dispose()

    assert asyncio.run(main()) is ReplaceStatus.REPLACED
    assert read(engine, "export").payload == 2
