"""Workflows: chain() and group().then() build after relations, enqueued as one
batch in the caller's transaction; a callback reads its parents' results."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import Job, Outcome, RetryPolicy, Runner, TaggedJSON, Watchdog, Workflow, chain, enqueue, group
from tests.helpers import present

pytestmark = pytest.mark.dialect_neutral


def test_chain_and_group_build_the_relations_parents_first() -> None:
    workflow = chain(Job("a", "q"), group([Job("b", "q"), Job("c", "q")]).then(Job("d", "q")), Job("e", "q"))
    assert isinstance(workflow, Workflow) and workflow.job_ids == ("a", "b", "c", "d", "e")
    assert [job.after for job in workflow] == [(), ("a",), ("a",), ("b", "c"), ("d",)]
    assert (workflow.heads, workflow.tails) == (("a",), ("e",))
    with pytest.raises(ValueError):
        chain()
    with pytest.raises(TypeError):
        chain(Job("a", "q"), "b")  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, slots=True)
class TenantJob(Job):
    tenant: str = "none"


def test_a_step_made_to_wait_keeps_everything_else_of_its_job() -> None:
    """chain() gives a step its parents and changes nothing else: its key (flow
    control), retry, timeout, priority, stored payload and its class."""
    policy = RetryPolicy(max_attempts=3)
    second = TenantJob(
        "b", "q", key="tenant-7", retry=policy, timeout=timedelta(seconds=5), priority=4,
        payload={"n": 1}, run_at=datetime(2030, 1, 1, tzinfo=UTC), tenant="acme",
    )  # fmt: skip
    first, waiting = chain(Job("a", "q"), second)
    assert waiting.after == ("a",) and first.after == ()
    assert isinstance(waiting, TenantJob) and waiting.tenant == "acme"
    assert (waiting.key, waiting.retry, waiting.timeout, waiting.priority, waiting.run_at) == (
        "tenant-7", policy, timedelta(seconds=5), 4, datetime(2030, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    assert waiting.payload_json == second.payload_json == '{"n":1}'
    assert second.after == ()  # the step given is not changed


def test_a_workflow_is_enqueued_atomically_with_the_callers_writes(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
    with Session(engine) as session:
        session.execute(text("INSERT INTO orders VALUES (1)"))
        enqueue(session, chain(Job("w-a", "q"), Job("w-b", "q")))
        session.rollback()
    wd = Watchdog(engine)
    assert wd.read("w-a") is None and wd.read("w-b") is None
    with Session(engine) as session:
        session.execute(text("INSERT INTO orders VALUES (1)"))
        enqueue(session, chain(Job("w-a", "q"), Job("w-b", "q")))
        session.commit()
    assert present(wd.read("w-b")).parents == (("w-a", None),)


def test_a_fan_in_callback_reads_its_parents_results_and_a_failure_stops_the_chain(engine: Engine) -> None:
    codec = TaggedJSON()
    parts = [Job(f"p{i}", "parts", payload=i, codec=codec) for i in range(3)]
    wd = Watchdog(engine)
    wd.enqueue(chain(group(parts).then(Job("sum", "sum")), Job("after-sum", "fails"), Job("never", "q")))
    assert present(wd.read("p1")).payload == 1  # the codec's JSON form survived the relations

    def add(job: object) -> int:
        return sum(parent.result for parent in job.parent_results())  # type: ignore[attr-defined]

    Runner(
        engine,
        {
            "parts": lambda job: job.payload * 2,
            "sum": add,
            "fails": lambda job: (_ for _ in ()).throw(RuntimeError("no")),
            "q": lambda job: None,
        },
    ).run_until_idle()
    assert wd.result("sum").value == 6
    never = present(wd.read("never"))
    assert never.outcome is Outcome.CANCELLED and never.failure_reason == "parent after-sum ended failed"
