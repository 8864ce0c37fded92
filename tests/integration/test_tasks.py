"""The task API: @task turns a typed function into a handler and an enqueuer;
arguments are checked against its signature before anything is written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import (
    EnqueueStatus,
    InvalidJob,
    Outcome,
    ResultStatus,
    RetryPolicy,
    Runner,
    TaggedJSON,
    Task,
    Watchdog,
    task,
)
from sqlalchemy_watchdog.asyncio import AsyncWatchdog
from sqlalchemy_watchdog.core.handlers import HandlerRegistry
from tests.conftest import make_async_engine
from tests.helpers import present

pytestmark = pytest.mark.dialect_neutral


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM watchdog_jobs")).scalar_one())


def test_a_task_enqueues_checked_arguments_and_runs_them_keeping_its_result(engine: Engine) -> None:
    registry = HandlerRegistry()
    calls: list[tuple[int, bool]] = []

    @task("emails", retry=RetryPolicy(max_attempts=3), timeout=timedelta(seconds=5), registry=registry)
    def send_confirmation(order_id: int, urgent: bool = False) -> dict[str, int]:
        calls.append((order_id, urgent))
        return {"sent": order_id}

    assert isinstance(send_confirmation, Task) and send_confirmation.__name__ == "send_confirmation"
    assert send_confirmation(7) == {"sent": 7} and calls == [(7, False)]  # still the plain function
    with Session(engine) as session:
        first = send_confirmation.enqueue(session, order_id=42, job_id="confirm-42")
        again = send_confirmation.enqueue(session, order_id=42, job_id="confirm-42")
        urgent = send_confirmation.enqueue(session, order_id=43, urgent=True, job_id="confirm-43")
        session.commit()
    assert first.status is EnqueueStatus.QUEUED and again.status is EnqueueStatus.DUPLICATE
    assert urgent.job_id == "confirm-43"
    wd = Watchdog(engine)
    assert present(wd.read("confirm-42")).payload == {"order_id": 42}  # defaults are the call's
    assert present(wd.read("confirm-43")).payload == {"order_id": 43, "urgent": True}

    settled = Runner(engine, registry.handlers()).run_until_idle()
    assert [job.outcome for job in settled] == [Outcome.COMPLETED] * 2
    assert calls[1:] == [(42, False), (43, True)]
    assert send_confirmation.result(wd, "confirm-42").value == {"sent": 42}
    assert send_confirmation.wait(wd, "confirm-43", timeout=timedelta(seconds=5)).value == {"sent": 43}
    # The policy goes with the handler, as @handler's does.
    policy = registry.policy_for("emails", send_confirmation.handler)
    assert policy is not None and policy.timeout == timedelta(seconds=5)
    assert policy.retry == RetryPolicy(max_attempts=3)


def test_a_missing_or_unknown_argument_is_refused_by_name_before_anything_is_written(engine: Engine) -> None:
    registry = HandlerRegistry()

    @task("emails", registry=registry)
    def send(order_id: int, template: str = "default") -> None:
        pass

    with Session(engine) as session:
        with pytest.raises(InvalidJob, match=r"order_id: .*send\(\) is missing its argument 'order_id'") as missing:
            send.enqueue(session, template="x", job_id="j1")
        assert missing.value.field == "order_id"
        with pytest.raises(InvalidJob, match=r"ordr_id: .*takes no argument 'ordr_id' \(its arguments: order_id, "):
            send.enqueue(session, ordr_id=1, job_id="j2")
        with pytest.raises(InvalidJob, match="order_id: .*takes 'order_id' as int, got object"):
            send.enqueue(session, order_id=object(), job_id="j3")
        with pytest.raises(InvalidJob, match="job_id"):
            send.enqueue(session, order_id=1, job_id="")
        session.commit()
    assert count(engine) == 0


def test_arguments_are_checked_against_plain_annotations_naming_the_argument(engine: Engine) -> None:
    """int, float, bool, str, None, list, dict and Optional/unions of them are
    checked (a bool is no int, an int is a float); any other annotation, or
    none, is not -- what the payload cannot carry is still InvalidJob("payload")."""
    registry = HandlerRegistry()

    @task("checked", registry=registry)
    def work(
        count: int,
        ratio: float = 1.0,
        flag: bool = False,
        name: str | None = None,
        tags: list[str] | None = None,
        options: dict[str, int] | None = None,
        anything: object = None,
        when: datetime | None = None,
        **extra: int,
    ) -> None:
        pass

    good = work.job(job_id="ok", count=1, ratio=2, flag=True, name=None, tags=["a"], options={"a": 1}, more=3)
    assert good.payload == {
        "count": 1,
        "ratio": 2,
        "flag": True,
        "name": None,
        "tags": ["a"],
        "options": {"a": 1},
        "more": 3,
    }
    refused: list[tuple[dict[str, Any], str, str]] = [
        ({"count": "1"}, "count", "takes 'count' as int, got str '1'"),
        ({"count": True}, "count", "takes 'count' as int, got bool True"),
        ({"count": 1.5}, "count", "takes 'count' as int, got float 1.5"),
        ({"count": 1, "ratio": "2"}, "ratio", "takes 'ratio' as float, got str"),
        ({"count": 1, "flag": 1}, "flag", "takes 'flag' as bool, got int 1"),
        ({"count": 1, "name": 7}, "name", "takes 'name' as str | None, got int 7"),
        ({"count": 1, "tags": ("a",)}, "tags", "takes 'tags' as list | None, got tuple"),
        ({"count": 1, "options": [1]}, "options", "takes 'options' as dict | None, got list"),
        ({"count": 1, "more": "x"}, "more", "takes 'more' as int, got str 'x'"),
        ({"count": "x" * 500}, "count", "got str 'xxxx"),
    ]
    with Session(engine) as session:
        for arguments, field, words in refused:
            with pytest.raises(InvalidJob) as error:
                work.enqueue(session, job_id="bad", **arguments)
            assert error.value.field == field and words in str(error.value), (arguments, str(error.value))
            assert len(str(error.value)) < 300
        # Not checked: object, and a datetime (a codec could carry it); the payload refuses what JSON cannot hold.
        with pytest.raises(InvalidJob, match="payload"):
            work.enqueue(session, job_id="bad", count=1, when=datetime.now(UTC))
        session.commit()
    assert count(engine) == 0


def test_without_a_job_id_each_enqueue_is_a_new_job(engine: Engine) -> None:
    registry = HandlerRegistry()

    @task("emails", registry=registry)
    def ping(n: int) -> int:
        return n + 1

    with Session(engine) as session:
        one = ping.enqueue(session, n=1)
        two = ping.enqueue(session, n=1)
        session.commit()
    assert one.job_id != two.job_id and one.job_id.startswith("ping-")
    assert one.status is two.status is EnqueueStatus.QUEUED
    assert count(engine) == 2


def test_a_tasks_codec_carries_rich_arguments_and_results_both_ways(engine: Engine) -> None:
    registry = HandlerRegistry()

    @task("billing", codec=TaggedJSON(), registry=registry)
    def invoice(amount: Decimal, due: datetime) -> dict[str, object]:
        return {"amount": amount * 2, "due": due + timedelta(days=1)}

    due = datetime(2025, 3, 1, tzinfo=UTC)
    with Session(engine) as session:
        invoice.enqueue(session, amount=Decimal("9.95"), due=due, job_id="inv-1")
        session.commit()
    wd = Watchdog(engine)
    assert present(wd.read("inv-1")).payload == {"amount": {"$decimal": "9.95"}, "due": {"$datetime": due.isoformat()}}
    Runner(engine, registry.handlers()).run_until_idle()
    assert invoice.result(wd, "inv-1").value == {"amount": Decimal("19.90"), "due": due + timedelta(days=1)}


def test_a_function_that_cannot_take_its_arguments_as_keywords_is_refused() -> None:
    registry = HandlerRegistry()
    with pytest.raises(TypeError, match="cannot be passed by keyword"):

        @task("q", registry=registry)
        def positional(a: int, /) -> None:
            pass

    with pytest.raises(TypeError, match="reserved"):

        @task("q", registry=registry)
        def with_id(job_id: str) -> None:
            pass

    with pytest.raises(InvalidJob, match="queue"):
        task("")


async def test_async_tasks_enqueue_on_an_async_session_and_read_results(engine: Engine) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    from sqlalchemy_watchdog.asyncio import AsyncRunner

    registry = HandlerRegistry()

    @task("async-q", registry=registry)
    async def shout(word: str) -> str:
        return word.upper()

    async_engine = make_async_engine(engine)
    try:
        async with AsyncSession(async_engine) as session:
            queued = await shout.enqueue(session, word="hi", job_id="s-1")
            await session.commit()
        assert queued.status is EnqueueStatus.QUEUED
        await AsyncRunner(async_engine, registry.handlers()).run_until_idle()
        awd = AsyncWatchdog(async_engine)
        assert (await shout.result(awd, "s-1")).value == "HI"
        assert (await shout.wait(awd, "s-1", timeout=timedelta(seconds=1))).status is ResultStatus.COMPLETED
    finally:
        await async_engine.dispose()
