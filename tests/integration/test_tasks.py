"""The task API: @task turns a typed function into a handler and an enqueuer;
arguments are checked against its signature before anything is written."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import (
    Decision,
    EnqueueStatus,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    ResultStatus,
    RetryPolicy,
    Runner,
    RunningJob,
    TaggedJSON,
    Task,
    Watchdog,
    enqueue,
    task,
)
from sqlalchemy_watchdog.asyncio import AsyncWatchdog
from sqlalchemy_watchdog.core.handlers import HandlerRegistry
from tests.conftest import make_async_engine
from tests.helpers import present
from tests.runner_kinds import RunnerDriver, dual

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


def test_a_configured_task_debounces_its_calls_into_one_job_with_the_last_arguments(engine: Engine) -> None:
    registry = HandlerRegistry()

    @task("search", registry=registry)
    def reindex(document: str, revision: int) -> None:
        return None

    burst = reindex.configure(unique_key="reindex:doc-7", debounce=timedelta(seconds=30))
    with Session(engine) as session:
        results = [burst.enqueue(session, document="doc-7", revision=n) for n in range(1, 4)]
        session.commit()
    assert [r.status for r in results] == [EnqueueStatus.QUEUED, EnqueueStatus.REPLACED, EnqueueStatus.REPLACED]
    assert {r.job_id for r in results} == {results[0].job_id}
    assert count(engine) == 1
    stored = Watchdog(engine).read(results[0].job_id)
    assert stored is not None and stored.payload["revision"] == 3 and stored.state is JobState.DELAYED


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
            later = await shout.configure(key="k-1", delay=timedelta(hours=1)).enqueue(session, word="yo", job_id="s-2")
            await session.commit()
        assert queued.status is later.status is EnqueueStatus.QUEUED
        delayed = present(Watchdog(engine).read("s-2"))
        assert (delayed.state, delayed.key) == (JobState.DELAYED, "k-1")  # the options reach an async enqueue too
        await AsyncRunner(async_engine, registry.handlers()).run_until_idle()
        awd = AsyncWatchdog(async_engine)
        assert (await shout.result(awd, "s-1")).value == "HI"
        assert (await shout.wait(awd, "s-1", timeout=timedelta(seconds=1))).status is ResultStatus.COMPLETED
    finally:
        await async_engine.dispose()


# -- pass_job: a task sees its job -------------------------------------------------------


def _seen(job: RunningJob, sku: str, progress: str, parents: list[list[Any]]) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "key": job.key,
        "lane": job.lane,
        "priority": job.priority,
        "stopping": job.stop_requested.is_set(),
        "sku": sku,
        "progress": progress,
        "parents": parents,
    }


def test_a_task_given_its_job_does_what_a_handler_can(engine: Engine, runners: RunnerDriver) -> None:
    """pass_job=True: the first parameter receives the RunningJob (id,
    attempt, key, progress, stop_requested, parent_results), for a plain
    function under either runner and a coroutine under AsyncRunner."""
    plain_registry, async_registry = HandlerRegistry(), HandlerRegistry()

    @task("restock", pass_job=True, registry=plain_registry)
    def restock(job: RunningJob, sku: str) -> dict[str, Any]:
        progress = job.progress(0.5, "half").value
        parents = [[p.job_id, None if p.outcome is None else p.outcome.value, p.result] for p in job.parent_results()]
        return _seen(job, sku, progress, parents)

    @task("restock", pass_job=True, registry=async_registry)
    async def restock_async(job: RunningJob, sku: str) -> dict[str, Any]:
        progress = (await job.progress_async(0.5, "half")).value
        parents = [
            [p.job_id, None if p.outcome is None else p.outcome.value, p.result]
            for p in await job.parent_results_async()
        ]
        return _seen(job, sku, progress, parents)

    assert list(restock.parameters) == ["sku"]  # the job is no argument
    with Session(engine) as session:
        enqueue(session, Job("count-shelf", "count", payload=None))
        configured = restock.configure(
            after=["count-shelf"], key="shop-3", lane="shop:3", priority=4, retry=RetryPolicy(max_attempts=2)
        )
        configured.enqueue(session, sku="A-1", job_id="restock-a1")
        session.commit()
    make_runner = runners.runner
    make_runner({"count": lambda job: {"counted": 12}}).run_until_idle()
    handler = dual(restock.handler, restock_async.handler)
    (job,) = make_runner({"restock": handler}).run_until_idle()
    assert job.outcome is Outcome.COMPLETED, job.failure_reason
    assert job.result == {
        "job_id": "restock-a1",
        "attempt": 1,
        "max_attempts": 2,
        "key": "shop-3",
        "lane": "shop:3",
        "priority": 4,
        "stopping": False,
        "sku": "A-1",
        "progress": "written",
        "parents": [["count-shelf", "completed", {"counted": 12}]],
    }
    assert job.progress == 0.5 and job.progress_note == "half"


def test_pass_job_needs_a_first_parameter_to_take_the_job() -> None:
    registry = HandlerRegistry()
    with pytest.raises(TypeError, match="pass_job=True passes the job as the first argument"):

        @task("q", pass_job=True, registry=registry)
        def no_parameters() -> None:
            pass

    with pytest.raises(TypeError, match="pass_job=True passes the job as the first argument"):

        @task("q", pass_job=True, registry=registry)
        def keyword_only(*, job: RunningJob) -> None:
            pass

    @task("q", pass_job=True, registry=registry)
    def positional_job(job: RunningJob, /, job_count: int) -> int:  # the job's may be positional-only
        return job_count

    assert positional_job.job(job_id="p", job_count=2).payload == {"job_count": 2}


# -- configure: per-call options -----------------------------------------------------------


def test_configure_sets_each_per_call_job_field_on_a_new_task(engine: Engine) -> None:
    registry = HandlerRegistry()

    @task("invoices", lane="billing", priority=1, registry=registry)
    def render_invoice(key: str, priority: int = 0, delay: int = 0, lane: str = "x") -> None:
        """Arguments named like the options: still the function's own."""

    run_at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    policy = RetryPolicy(max_attempts=4)
    configured = render_invoice.configure(
        key="tenant-7",
        after=["a", "b", "a"],
        after_policy="any_outcome",
        lane="tenant:7",
        priority=9,
        run_at=run_at,
        retry=policy,
        timeout=timedelta(seconds=30),
        max_recoveries=2,
    )
    assert configured is not render_invoice and isinstance(configured, Task)
    job = configured.job(job_id="inv-1", key="k", priority=5, delay=1, lane="l")
    assert job.payload == {"key": "k", "priority": 5, "delay": 1, "lane": "l"}
    assert (job.key, job.after, job.after_policy, job.lane, job.priority) == (
        "tenant-7",
        ("a", "b"),
        "any_outcome",
        "tenant:7",
        9,
    )
    assert (job.run_at, job.retry, job.timeout, job.max_recoveries) == (run_at, policy, timedelta(seconds=30), 2)
    # The task itself is unchanged, and keeps its own lane and priority.
    plain = render_invoice.job(job_id="inv-2", key="k")
    assert (plain.key, plain.after, plain.lane, plain.priority, plain.run_at, plain.retry) == (
        None,
        (),
        "billing",
        1,
        None,
        None,
    )
    # Options given again replace; the others are kept; lane=None is the queue's, after=None none.
    again = configured.configure(priority=2, lane=None, after=None).job(job_id="inv-3", key="k")
    assert (again.priority, again.lane, again.after, again.key, again.max_recoveries) == (
        2,
        "invoices",
        (),
        "tenant-7",
        2,
    )
    with pytest.raises(AttributeError, match="immutable"):
        configured.queue = "other"
    # The handler is the task's own: configuring registers nothing.
    assert registry.handlers() == {"invoices": render_invoice.handler} and configured.handler is render_invoice.handler


def test_a_configured_delay_counts_from_the_database_clock_at_enqueue(engine: Engine) -> None:
    registry = HandlerRegistry()

    @task("later", registry=registry)
    def remind(n: int) -> None:
        pass

    later = remind.configure(delay=timedelta(hours=1))
    with Session(engine) as session:
        first = later.enqueue(session, n=1, job_id="remind-1")
        now = remind.enqueue(session, n=2, job_id="remind-2")
        session.commit()
    assert first.status is now.status is EnqueueStatus.QUEUED
    wd = Watchdog(engine)
    delayed, due = present(wd.read("remind-1")), present(wd.read("remind-2"))
    assert delayed.state is JobState.DELAYED and due.state is JobState.QUEUED
    assert delayed.ready_at is not None and delayed.enqueued_at is not None
    assert delayed.ready_at - delayed.enqueued_at == timedelta(hours=1)
    with pytest.raises(InvalidJob, match="delay: .*no field of a Job"):
        later.job(job_id="remind-3", n=3)


# -- a returned failure is the handler's decision ---------------------------------------------


def test_a_failure_a_task_returns_is_logged_as_a_warning_and_an_exception_as_an_error(
    engine: Engine, runners: RunnerDriver, caplog: pytest.LogCaptureFixture
) -> None:
    registry = HandlerRegistry()

    @task("charges", retry=RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=10)), registry=registry)
    def charge(card: str) -> Decision | None:
        if card == "declined":
            return Decision.failed("card declined", retry=False)
        if card == "expired":
            # Retried until no attempt is left: that failure is decided by the handler too.
            return Decision.retry("card expired", after=timedelta(milliseconds=10))
        raise RuntimeError(f"gateway down for {card}")

    with Session(engine) as session:
        for card in ("declined", "expired", "broken"):
            charge.enqueue(session, card=card, job_id=f"charge-{card}")
        session.commit()
    runner = runners.runner(registry.handlers())
    wd = Watchdog(engine)
    with caplog.at_level(logging.WARNING, logger="sqlalchemy_watchdog"):
        deadline = time.monotonic() + 30
        while any(present(wd.read(f"charge-{c}")).state is not JobState.SETTLED for c in ("expired", "broken")):
            assert time.monotonic() < deadline, "the retries did not end"
            runner.run_until_idle()
            time.sleep(0.02)
    assert [present(wd.read(f"charge-{c}")).outcome for c in ("declined", "expired", "broken")] == [Outcome.FAILED] * 3
    final = [r for r in caplog.records if r.name == "sqlalchemy_watchdog.runner" and "the job failed" in r.getMessage()]
    levels = {r.getMessage().split(":")[0]: r.levelno for r in final}
    assert levels == {
        "job charge-declined": logging.WARNING,
        "job charge-expired": logging.WARNING,
        "job charge-broken": logging.ERROR,
    }, [(r.levelname, r.getMessage()) for r in final]
    declined = next(r.getMessage() for r in final if "charge-declined" in r.getMessage())
    assert "(card declined)" in declined and "as its handler decided" in declined
    assert [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "charge-declined" in r.getMessage()
    ] == []


# -- typed arguments: dataclasses and Pydantic models ------------------------------------------


@dataclass(frozen=True)
class Address:
    street: str
    city: str
    postcode: str | None = None


@dataclass
class Line:
    sku: str
    quantity: int
    unit_cents: int

    def __post_init__(self) -> None:
        if self.quantity < 1:
            raise ValueError(f"quantity must be at least 1, got {self.quantity}")


@dataclass
class Invoice:
    number: int
    bill_to: Address
    lines: list[Line]
    ship_to: Address | None = None
    notes: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()


class Customer(BaseModel):
    name: str
    email: str
    vip: bool = False


def _invoice() -> Invoice:
    return Invoice(
        7,
        Address("1 Main St", "Springfield"),
        [Line("A-1", 2, 350), Line("B-2", 1, 1200)],
        notes={"po": "PO-9"},
        tags=("rush", "gift"),
    )


def _invoice_numbered(number: Any) -> Invoice:
    """An invoice whose number is ``number``, whatever its type (a dataclass does not check)."""
    return dataclass_replace(_invoice(), number=number)


def _invoice_task(registry: HandlerRegistry, seen: list[Any]) -> Task[..., int]:
    @task("invoices", registry=registry)
    def render_invoice(invoice: Invoice, customer: Customer, copies: list[Address] | None = None) -> int:
        seen.append((invoice, customer, copies))
        return sum(line.quantity * line.unit_cents for line in invoice.lines)

    return render_invoice


def test_dataclass_and_pydantic_arguments_are_stored_as_json_and_rebuilt_for_the_task(
    engine: Engine, runners: RunnerDriver
) -> None:
    registry = HandlerRegistry()
    seen: list[Any] = []
    render_invoice = _invoice_task(registry, seen)
    customer = Customer(name="Ada", email="ada@example.com")
    with Session(engine) as session:
        render_invoice.enqueue(session, invoice=_invoice(), customer=customer, job_id="inv-7")
        # The JSON form is taken too, and checked the same way.
        render_invoice.enqueue(
            session,
            invoice={"number": 8, "bill_to": {"street": "2 Elm", "city": "Shelbyville"}, "lines": []},
            customer={"name": "Bo", "email": "bo@example.com", "vip": True},
            copies=[{"street": "3 Oak", "city": "Ogdenville", "postcode": "12345"}],
            job_id="inv-8",
        )
        session.commit()
    assert present(Watchdog(engine).read("inv-7")).payload == {
        "invoice": {
            "number": 7,
            "bill_to": {"street": "1 Main St", "city": "Springfield", "postcode": None},
            "lines": [
                {"sku": "A-1", "quantity": 2, "unit_cents": 350},
                {"sku": "B-2", "quantity": 1, "unit_cents": 1200},
            ],
            "ship_to": None,
            "notes": {"po": "PO-9"},
            "tags": ["rush", "gift"],  # a tuple travels as a list, and is a tuple again for the task
        },
        "customer": {"name": "Ada", "email": "ada@example.com", "vip": False},
    }
    jobs = runners.runner(registry.handlers()).run_until_idle()
    assert [job.result for job in jobs] == [1900, 0]
    (invoice, got, copies), (second, bo, more) = seen
    assert invoice == _invoice() and isinstance(invoice.bill_to, Address) and isinstance(invoice.lines[0], Line)
    assert got == customer and isinstance(got, Customer) and copies is None
    assert second == Invoice(8, Address("2 Elm", "Shelbyville"), [])
    assert bo == Customer(name="Bo", email="bo@example.com", vip=True)
    assert more == [Address("3 Oak", "Ogdenville", "12345")]


def test_a_typed_argument_that_fails_validation_names_its_field_and_writes_nothing(engine: Engine) -> None:
    registry = HandlerRegistry()
    render_invoice = _invoice_task(registry, [])
    customer = Customer(name="Ada", email="ada@example.com")
    good = {"number": 1, "bill_to": {"street": "s", "city": "c"}, "lines": []}
    refused: list[tuple[dict[str, Any], str, str]] = [
        ({"invoice": _invoice_numbered("7")}, "invoice.number", "as int, got str '7'"),
        ({"invoice": {**good, "bill_to": {"street": "s"}}}, "invoice.bill_to.city", "missing Address's field 'city'"),
        ({"invoice": {**good, "totl": 3}}, "invoice.totl", "Invoice has no field 'totl'"),
        (
            {"invoice": {**good, "lines": [{"sku": "A", "quantity": "2", "unit_cents": 1}]}},
            "invoice.lines[0].quantity",
            "as int",
        ),
        (
            {"invoice": {**good, "lines": [{"sku": "A", "quantity": 0, "unit_cents": 1}]}},
            "invoice",
            "quantity must be at least 1",
        ),
        ({"invoice": {**good, "ship_to": "home"}}, "invoice.ship_to", "as Address, got str"),
        ({"invoice": {**good, "notes": {"po": 9}}}, "invoice.notes['po']", "as str, got int 9"),
        ({"invoice": "INV-7"}, "invoice", "as Invoice, got str"),
        ({"invoice": {**good, "tags": ["a", 2]}}, "invoice.tags[1]", "as str, got int 2"),
        ({"customer": {"name": "Ada"}}, "customer.email", "Field required"),
        ({"customer": {"name": "Ada", "email": "a@b", "vip": "perhaps"}}, "customer.vip", "valid boolean"),
        ({"copies": [{"street": "s", "city": 5}]}, "copies[0].city", "as str, got int 5"),
    ]
    with Session(engine) as session:
        for arguments, field_path, words in refused:
            call = {"invoice": _invoice(), "customer": customer} | arguments
            with pytest.raises(InvalidJob) as error:
                render_invoice.enqueue(session, job_id="bad", **call)
            assert error.value.field == field_path and words in str(error.value), (field_path, str(error.value))
        session.commit()
    assert count(engine) == 0
