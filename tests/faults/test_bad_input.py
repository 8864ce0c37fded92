"""Fault 10: hostile and malformed input, as a table.

Every entry of ``REFUSED`` is a call with one bad argument. Each must raise a
clear error whose message names the field, and leave the database exactly as
it was (a full dump of ``watchdog_jobs`` before and after, on a table
already holding queued, running, cancelled, settled and delayed jobs, one of
them waiting for its retry) -- on SQLite, PostgreSQL and MariaDB.

``ROUND_TRIP`` holds inputs that look dangerous but are valid -- quotes, SQL
metacharacters, format strings, control characters, non-ASCII at the exact
length limits: they must be stored and read back exactly.
"""

from __future__ import annotations

import datetime
import decimal
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, literal, select, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import (
    Decision,
    EnqueueConflict,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    ProcessExecutor,
    Rate,
    Retention,
    RetryPolicy,
    Runner,
    Undecodable,
    Watchdog,
    WatchdogError,
    enqueue,
    enqueue_select,
    metadata,
    otel,
    signal_job,
    store,
    task,
)
from sqlalchemy_watchdog import handler as register_handler
from sqlalchemy_watchdog.asyncio import AsyncRunner, AsyncWatchdog
from sqlalchemy_watchdog.asyncio import enqueue as async_enqueue
from sqlalchemy_watchdog.codecs import EncryptedJSON, TaggedJSON
from sqlalchemy_watchdog.core.handlers import HandlerRegistry, _registry
from sqlalchemy_watchdog.jobs import (
    FAILURE_REASON_MAX_LENGTH,
    MAX_DELAY,
    PAUSE_REASON_MAX_LENGTH,
    PAYLOAD_MAX_BYTES,
    PAYLOAD_MAX_DEPTH,
    RESULT_MAX_BYTES,
    CancelStatus,
)
from sqlalchemy_watchdog.model import (
    job_signals_table,
    job_steps_table,
    jobs_table,
    pauses_table,
    schedules_table,
    workers_table,
)
from tests import process_handlers
from tests.conftest import WITH_MARIADB, make_async_engine, mysql_database
from tests.faults.helpers import dump_jobs
from tests.helpers import present, stable_repr, wait_until
from tests.runner_kinds import RunnerDriver

# The dialect does not matter here but where a test says dialect_specific: the PostgreSQL copy
# runs under CI=true or WATCHDOG_ALL_DIALECTS=1 (tests/conftest.py).
pytestmark = pytest.mark.dialect_neutral

HEAVY = "x" * (PAYLOAD_MAX_BYTES - 2)  # '"' + HEAVY + '"' is exactly the limit
LATER = datetime.datetime(2100, 1, 1, tzinfo=UTC)
FERNET_KEY = "b" * 43 + "="  # 32 bytes, url-safe base64: a Fernet key
NOT_A_KEY = "secret-passphrase-not-a-key"
SHORT_KEY = "c" * 22 + "=="  # 16 bytes: too short


def nested(depth: int, leaf: Any = 0) -> Any:
    """``depth`` levels of arrays around ``leaf``."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_objects(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"k": value}
    return value


def handler(job: Any) -> None:
    return None


def _seed(engine: Engine) -> None:
    """Queued, running (and cancelled), settled and delayed jobs -- one
    waiting for its second attempt: something to damage."""
    wd = Watchdog(engine)
    wd.enqueue([Job("seed-running", "q"), Job("seed-queued", "q"), Job("seed-settled", "q2")])
    wd.enqueue(Job("seed-delayed", "q3", run_at=LATER, retry=RetryPolicy(max_attempts=2), timeout=timedelta(seconds=9)))
    wd.enqueue(Job("seed-retried", "q4", retry=RetryPolicy(max_attempts=3, backoff=timedelta(hours=1))))
    # Its first attempt fails: requeued (delayed) for the second, not settled.
    assert Runner(engine, {"q4": lambda job: Decision.failed("seed failure")}).run_until_idle() == []
    assert present(wd.read("seed-retried")).attempt == 2
    with store.write_transaction(engine) as conn:
        store.claim(conn, queues=["q2"], lease_ms=1)
    time.sleep(0.01)  # the 1 ms lease has ended by the database clock
    with store.write_transaction(engine) as conn:
        (settled,) = store.expired_claims(conn, limit=5)
    with store.write_transaction(engine) as conn:
        store.reconcile(conn, settled)  # interrupted
    with store.write_transaction(engine) as conn:
        store.claim(conn, queues=["q"], lease_ms=60_000, limit=1)
    wd.cancel("seed-queued", "seed-cancel")
    wd.pause("seed-paused", reason="seed")  # a pause a bad resume must not lift
    wd.set_limits("seed-limited", concurrency=3, rate=Rate(5, timedelta(seconds=7)))  # limits a bad call must keep


def _forged(**fields: object) -> Rate:
    """A Rate of 10 a minute whose fields are then set past its own checks."""
    rate = Rate(10, timedelta(minutes=1))
    for name, value in fields.items():
        object.__setattr__(rate, name, value)
    return rate


@dataclass(frozen=True)
class Entry:
    field: str
    call: Callable[[Engine], Any]
    #: The error type; InvalidJob entries are also checked for ``.field``.
    error: type[BaseException] = InvalidJob
    #: Text the message must contain besides the field name.
    says: str | None = None


def worker_row(**overrides: Any) -> Callable[[Engine], Any]:
    """Insert a ``watchdog_workers`` row by hand (as a buggy tool would)."""
    values = {
        "worker_id": "hand-written",
        "host": "h",
        "pid": 1,
        "queues": '["q"]',
        "concurrency": 1,
        "wakeups": "poll",
        "version": "0",
        "heartbeat_ms": 1000,
        "started_at": 5,
        "last_seen": 6,
        "running": 0,
        **overrides,
    }

    def insert(engine: Engine) -> None:
        with engine.begin() as conn:
            conn.execute(workers_table.insert().values(**values))

    return insert


def schedule_row(**overrides: Any) -> Callable[[Engine], Any]:
    """Insert a ``watchdog_schedules`` row by hand."""
    values = {
        "name": "s",
        "fingerprint": "f",
        "cron": "* * * * *",
        "timezone": "UTC",
        "queue_name": "q",
        "recorded_by": "w",
        "last_seen": 1,
        **overrides,
    }

    def insert(engine: Engine) -> None:
        with engine.begin() as conn:
            conn.execute(schedules_table.insert().values(**values))

    return insert


def job_row(**overrides: Any) -> Callable[[Engine], Any]:
    """Insert a queued ``watchdog_jobs`` row by hand, as a producer may, with
    ``overrides`` (SQLite keeps any type in any column unless a CHECK refuses)."""
    values = {"job_id": "hand-written", "queue_name": "q", "lane": "q", "priority": 0, "payload_json": "null",
              "state": "queued", "recovery_count": 0, "attempt": 1, "snoozes": 0, **overrides}  # fmt: skip

    def insert(engine: Engine) -> None:
        with engine.begin() as conn:
            conn.execute(jobs_table.insert().values(**values))

    return insert


def job(**overrides: Any) -> Callable[[Engine], Any]:
    """Enqueue ``Job(**defaults | overrides)`` through the public client."""
    fields = {"job_id": "new-job", "queue": "q", **overrides}
    return lambda engine: Watchdog(engine).enqueue(Job(**fields))


def _signal_in_session(engine: Engine, *args: Any) -> Any:
    """``signal_job`` in a session of the caller's (committed if it returns)."""
    with Session(engine) as session:
        result = signal_job(session, *args)
        session.commit()
        return result


def wd(method: str, *args: Any, **kwargs: Any) -> Callable[[Engine], Any]:
    return lambda engine: getattr(Watchdog(engine), method)(*args, **kwargs)


def runner(**kwargs: Any) -> Callable[[Engine], Any]:
    settings = {"handlers": {"q": handler}, **kwargs}
    engine_override = settings.pop("engine", None)

    def build(engine: Engine) -> Any:
        return Runner(engine_override if engine_override is not None else engine, **settings)

    return build


def process_runner(**executor: Any) -> Callable[[Engine], Any]:
    """A runner with ``ProcessExecutor(**executor)`` (the executor refuses first)."""
    return lambda engine: Runner(engine, {"q": handler}, executor=ProcessExecutor(**executor))


def async_process_runner(**executor: Any) -> Callable[[Engine], Any]:
    """An AsyncRunner with ``ProcessExecutor(**executor)`` (the executor refuses first)."""
    return lambda engine: AsyncRunner(make_async_engine(engine), {"q": handler}, executor=ProcessExecutor(**executor))


def in_main(job: Any) -> None:
    """A handler as if defined in the script being run."""


in_main.__module__ = "__main__"


def nested_handler() -> Callable[[Any], None]:
    def inner(job: Any) -> None:
        return None

    return inner


class CallableHandler:
    def __call__(self, job: Any) -> None:
        return None


def dashboard(**kwargs: Any) -> Callable[[Engine], Any]:
    def build(engine: Engine) -> Any:
        from sqlalchemy_watchdog.web import create_app

        return create_app(engine, **kwargs)

    return build


def scheduled(*args: Any, **fields: Any) -> Callable[[Engine], Any]:
    """A runner given ``Schedule(*args, **fields)`` (the schedule refuses first)."""
    from sqlalchemy_watchdog import Schedule

    return lambda engine: Runner(engine, {"q": handler}, schedules=[Schedule(*args, **fields)])


def policy(**fields: Any) -> Callable[[Engine], Any]:
    """Enqueue a job with ``RetryPolicy(**fields)`` (the policy refuses first)."""
    return lambda engine: Watchdog(engine).enqueue(Job("new-job", "q", retry=RetryPolicy(**fields)))


def delayed(delay: Any, *jobs: Job) -> Callable[[Engine], Any]:
    """Enqueue ``jobs`` (default: one plain job) with ``delay``, through the client."""
    return lambda engine: Watchdog(engine).enqueue(list(jobs) or Job("new-job", "q"), delay=delay)


def delayed_in_transaction(delay: Any) -> Callable[[Engine], Any]:
    """The same through ``enqueue(connection, ...)`` in the caller's transaction."""
    return lambda engine: _in_transaction(engine, lambda conn: enqueue(conn, Job("new-job", "q"), delay=delay))


def async_runner_with(handlers: dict[str, Any], **kwargs: Any) -> Callable[[Engine], Any]:
    """Build an AsyncRunner with ``handlers`` on the database's AsyncEngine (never connected)."""
    return lambda engine: AsyncRunner(make_async_engine(engine), handlers, **kwargs)


def async_runner(**kwargs: Any) -> Callable[[Engine], Any]:
    """Build an AsyncRunner on the database's AsyncEngine (never connected)."""

    def build(engine: Engine) -> Any:
        return AsyncRunner(make_async_engine(engine), {"q": handler}, **kwargs)

    return build


def registered(**kwargs: Any) -> Callable[[Engine], Any]:
    """``@handler("q-bad", **kwargs)``: refused before anything is registered."""

    def call(engine: Engine) -> Any:
        before = dict(_registry)
        try:
            return register_handler("q-bad", **kwargs)(handler)
        finally:
            assert _registry == before, "a refused @handler registered something"

    return call


async def _coroutine_in_a_process(job: Any) -> None:
    """A coroutine handler that names the process executor (refused: it runs on the loop)."""


HandlerRegistry().register("q", executor="process")(_coroutine_in_a_process)


def _process_lambda() -> Callable[[Any], None]:
    """A lambda that names the process executor itself (a child could not import it)."""
    fn: Callable[[Any], None] = lambda job: None  # noqa: E731
    HandlerRegistry().register("q", executor="process")(fn)
    return fn


def settle_with(decision: Any) -> Callable[[Engine], Any]:
    """Settle the seeded running job's exact claim with ``decision``."""

    def call(engine: Engine) -> Any:
        row = next(r for r in dump_jobs(engine) if r["job_id"] == "seed-running")
        with store.write_transaction(engine) as conn:
            return store.settle(conn, job_id="seed-running", claim_token=row["claim_token"], decision=decision)

    return call


def _in_transaction(engine: Engine, fn: Callable[[Any], Any]) -> Any:
    with engine.begin() as conn:
        return fn(conn)


def conflicting_batch(engine: Engine) -> Any:
    with engine.begin() as conn:
        enqueue(conn, [Job("fresh", "q"), Job("seed-queued", "other-queue")])


def conflicting_batch_in_savepoint(engine: Engine) -> Any:
    """The caller's own writes in the same transaction must not commit without their job."""
    with engine.begin() as conn:
        enqueue(conn, Job("fresh-too", "q"))
        enqueue(conn, Job("seed-settled", "q", payload={"changed": True}))


def enqueue_select_of(**columns: Any) -> Callable[[Engine], Any]:
    def call(engine: Engine) -> Any:
        with engine.begin() as conn:
            return enqueue_select(conn, select(*[literal(v).label(k) for k, v in columns.items()]))

    return call


def _replace_in_session(engine: Engine) -> Any:
    """``replace_job`` with nothing to change, in a session of ``engine`` (committed if it gets that far)."""
    from sqlalchemy_watchdog import replace_job

    with Session(engine) as session:
        result = replace_job(session, "seed-queued")
        session.commit()
        return result


def _unclaimed() -> Any:
    """A job as a handler sees it, made outside a runner: it checks a progress report's input."""
    from sqlalchemy_watchdog import RunningJob
    from sqlalchemy_watchdog.core.handlers import StopSignal

    return RunningJob("x", "q", "q", 0, None, 0, None, _signal=StopSignal())


def _in_child() -> Any:
    """A job as a handler in a process child sees it: its step refuses an
    undo the runner could not be sent, before it asks the runner anything."""
    from sqlalchemy_watchdog import RunningJob
    from sqlalchemy_watchdog.core.handlers import StopSignal
    from sqlalchemy_watchdog.executors.child import _child_job

    return _child_job(RunningJob)("x", "q", "q", 0, None, 0, None, _signal=StopSignal())


async def _async_undo(value: Any) -> None:
    """An undo a process child's step cannot name (the runner calls it plainly)."""


def _typed(count: int, label: str | None = None) -> None:
    """A task's function with plain annotations (checked on enqueue)."""


_typed_task = task("typed-task", registry=HandlerRegistry())(_typed)


@dataclass
class _Line:
    sku: str
    quantity: int


@dataclass
class _Invoice:
    number: int
    lines: list[_Line]


class _Customer(BaseModel):
    name: str
    email: str


def _render(invoice: _Invoice, customer: _Customer | None = None) -> None:
    """A task's function with a dataclass argument and a Pydantic one."""


_invoice_task = task("invoice-task", registry=HandlerRegistry())(_render)


def _task_enqueue(engine: Engine, made: Any, **arguments: Any) -> Any:
    """Enqueue a call of the task ``made`` in a session of ``engine`` (committed if it gets that far)."""
    with Session(engine) as session:
        result = made.enqueue(session, job_id="task-job", **arguments)
        session.commit()
        return result


REFUSED: dict[str, Entry] = {
    "Schedule cron 61 minutes": Entry("cron", scheduled("s", "61 * * * *", "q"), says="Bad minute"),
    "Schedule cron six fields": Entry("cron", scheduled("s", "0 * * * * *", "q")),
    "Schedule cron empty": Entry("cron", scheduled("s", "", "q")),
    "Schedule cron not a str": Entry("cron", scheduled("s", 5, "q")),
    "Schedule cron never matches": Entry("cron", scheduled("s", "0 0 30 2 *", "q")),
    "Schedule unknown timezone": Entry("timezone", scheduled("s", "* * * * *", "q", timezone="Mars/Olympus")),
    "Schedule timezone not a str": Entry("timezone", scheduled("s", "* * * * *", "q", timezone=1)),
    "Schedule name with a space": Entry("name", scheduled("a b", "* * * * *", "q")),
    "Schedule name empty": Entry("name", scheduled("", "* * * * *", "q")),
    "Schedule catch_up 101": Entry("catch_up", scheduled("s", "* * * * *", "q", catch_up=101)),
    "Schedule catch_up -1": Entry("catch_up", scheduled("s", "* * * * *", "q", catch_up=-1)),
    "Schedule payload not JSON": Entry("payload", scheduled("s", "* * * * *", "q", payload={1, 2})),
    "Schedule timeout zero": Entry("timeout", scheduled("s", "* * * * *", "q", timeout=timedelta(0))),
    "Schedule retry int": Entry("retry", scheduled("s", "* * * * *", "q", retry=3)),
    "Runner schedules a str": Entry("schedules", runner(schedules="* * * * *")),
    # ids
    "job_id empty": Entry("job_id", job(job_id="")),
    "job_id 257 chars": Entry("job_id", job(job_id="j" * 257)),
    "job_id with NUL": Entry("job_id", job(job_id="a\x00b")),
    "job_id lone surrogate": Entry("job_id", job(job_id="a\ud800")),
    "job_id int": Entry("job_id", job(job_id=123)),
    "job_id None": Entry("job_id", job(job_id=None)),
    "job_id bytes": Entry("job_id", job(job_id=b"abc")),
    "queue empty": Entry("queue", job(queue="")),
    "queue 257 chars": Entry("queue", job(queue="q" * 257)),
    "queue list": Entry("queue", job(queue=["q"])),
    "lane empty": Entry("lane", job(lane="")),
    "lane 513 chars": Entry("lane", job(lane="l" * 513)),
    "lane with NUL": Entry("lane", job(lane="\x00")),
    # flow control: a job's key, a queue's limits (revision w0011)
    "key empty": Entry("key", job(key="")),
    "key 257 chars": Entry("key", job(key="k" * 257)),
    "key with NUL": Entry("key", job(key="k\x00")),
    "key lone surrogate": Entry("key", job(key="k\ud800")),
    "key int": Entry("key", job(key=42)),
    "key bytes": Entry("key", job(key=b"tenant")),
    # uniqueness windows, debounce, throttle (revision w0020)
    "unique_key without how long it holds": Entry("unique_key", job(unique_key="k"), says="needs unique_for"),
    "unique_for without a unique_key": Entry("unique_for", job(unique_for=timedelta(hours=1)), says="unique_key"),
    "unique_key empty": Entry("unique_key", job(unique_key="", unique_for=timedelta(hours=1))),
    "unique_key 257 chars": Entry("unique_key", job(unique_key="k" * 257, unique_for=timedelta(hours=1))),
    "unique_key with NUL": Entry("unique_key", job(unique_key="k\x00", unique_for=timedelta(hours=1))),
    "unique_key int": Entry("unique_key", job(unique_key=7, unique_for=timedelta(hours=1))),
    "unique_for zero": Entry("unique_for", job(unique_key="k", unique_for=timedelta(0))),
    "unique_for over a year": Entry("unique_for", job(unique_key="k", unique_for=timedelta(days=367))),
    "unique_for a number": Entry("unique_for", job(unique_key="k", unique_for=3600)),
    "unique_states unknown": Entry(
        "unique_states", job(unique_key="k", unique_for=timedelta(hours=1), unique_states="sometimes")
    ),
    "unique_states without unique_for": Entry(
        "unique_states", job(unique_key="k", throttle=timedelta(hours=1), unique_states="any")
    ),
    "debounce and unique_for together": Entry(
        "debounce", job(unique_key="k", unique_for=timedelta(hours=1), debounce=timedelta(seconds=5))
    ),
    "max_wait shorter than debounce": Entry(
        "max_wait", job(unique_key="k", debounce=timedelta(seconds=5), max_wait=timedelta(seconds=1))
    ),
    "max_wait without debounce": Entry("max_wait", job(max_wait=timedelta(seconds=5))),
    "debounce with run_at": Entry(
        "run_at",
        job(unique_key="k", debounce=timedelta(seconds=5), run_at=datetime.datetime(2030, 1, 1, tzinfo=UTC)),
    ),
    "throttle with parents": Entry("after", job(unique_key="k", throttle=timedelta(hours=1), after=["seed-queued"])),
    "throttle_excess unknown": Entry(
        "throttle_excess", job(unique_key="k", throttle=timedelta(hours=1), throttle_excess="queue")
    ),
    "enqueue debounce with a delay": Entry(
        "delay",
        lambda e: Watchdog(e).enqueue(
            Job("new-job", "q", unique_key="k", debounce=timedelta(seconds=5)), delay=timedelta(seconds=1)
        ),
    ),
    "enqueue a child of a keyed job in one call": Entry(
        "after",
        lambda e: Watchdog(e).enqueue(
            [Job("k1", "q", unique_key="k", unique_for=timedelta(hours=1)), Job("k2", "q", after=["k1"])]
        ),
    ),
    "replace with nothing to change": Entry("payload", wd("replace", "seed-queued")),
    "replace payload not JSON": Entry("payload", wd("replace", "seed-queued", payload={1, 2})),
    "replace run_at naive": Entry("run_at", wd("replace", "seed-queued", run_at=datetime.datetime(2030, 1, 1))),
    "replace job_id empty": Entry("job_id", wd("replace", "", payload=1)),
    "replace_job in a session with nothing to change": Entry("payload", lambda e: _replace_in_session(e)),
    "set_limits concurrency 0": Entry("concurrency", wd("set_limits", "q", concurrency=0)),
    "set_limits concurrency negative": Entry("concurrency", wd("set_limits", "q", concurrency=-5)),
    "set_limits concurrency huge": Entry("concurrency", wd("set_limits", "q", concurrency=10**12)),
    "set_limits concurrency bool": Entry("concurrency", wd("set_limits", "q", concurrency=True)),
    "set_limits concurrency float": Entry("concurrency", wd("set_limits", "q", concurrency=1.5)),
    "set_limits concurrency str": Entry("concurrency", wd("set_limits", "q", concurrency="5")),
    "set_limits per key 0": Entry("concurrency_per_key", wd("set_limits", "q", concurrency_per_key=0)),
    "set_limits per key huge": Entry("concurrency_per_key", wd("set_limits", "q", concurrency_per_key=2**40)),
    "set_limits nothing to set": Entry("concurrency", wd("set_limits", "q"), says="at least one"),
    "set_limits rate a tuple": Entry("rate", wd("set_limits", "q", rate=(100, timedelta(minutes=1)))),
    "set_limits rate a str": Entry("rate", wd("set_limits", "q", rate="100/minute")),
    "set_limits rate count 0": Entry("rate", lambda engine: Rate(0, timedelta(minutes=1))),
    "set_limits rate count bool": Entry("rate", lambda engine: Rate(True, timedelta(minutes=1))),
    "set_limits rate period zero": Entry("rate", lambda engine: Rate(10, timedelta(0))),
    "set_limits rate period negative": Entry("rate", lambda engine: Rate(10, timedelta(seconds=-1))),
    "set_limits rate period over a day": Entry("rate", lambda engine: Rate(10, timedelta(days=1, seconds=1))),
    "set_limits rate period sub-millisecond": Entry("rate", lambda engine: Rate(10, timedelta(microseconds=10))),
    "set_limits rate period an int": Entry("rate", lambda engine: Rate(10, 60)),  # type: ignore[arg-type]
    "set_limits rate text zero period": Entry("rate", lambda engine: Rate.parse("10/0s")),
    "set_limits rate text spaces around the slash": Entry("rate", lambda engine: Rate.parse("5 / s")),
    "set_limits rate text a space before the unit": Entry("rate", lambda engine: Rate.parse("5/30 s")),
    "set_limits rate text arabic-indic digits": Entry("rate", lambda engine: Rate.parse("\u0663/s")),
    "set_limits rate text fullwidth digits": Entry("rate", lambda engine: Rate.parse("\uff15/s")),
    "set_limits rate text non-ASCII period amount": Entry("rate", lambda engine: Rate.parse("5/\u0663s")),
    "set_limits rate_per_key a tuple": Entry(
        "rate_per_key", wd("set_limits", "q", rate_per_key=(100, timedelta(minutes=1)))
    ),
    "set_limits rate_per_key a str": Entry("rate_per_key", wd("set_limits", "q", rate_per_key="100/minute")),
    "set_limits rate_per_key an int": Entry("rate_per_key", wd("set_limits", "q", rate_per_key=100)),
    # A Rate whose fields were set past its checks (a hand-made or unpickled one): checked again.
    "set_limits rate_per_key count 0": Entry("rate_per_key", wd("set_limits", "q", rate_per_key=_forged(count=0))),
    "set_limits rate_per_key count negative": Entry(
        "rate_per_key", wd("set_limits", "q", rate_per_key=_forged(count=-1))
    ),
    "set_limits rate_per_key count huge": Entry(
        "rate_per_key", wd("set_limits", "q", rate_per_key=_forged(count=10**12))
    ),
    "set_limits rate_per_key count bool": Entry(
        "rate_per_key", wd("set_limits", "q", rate_per_key=_forged(count=True))
    ),
    "set_limits rate_per_key period zero": Entry(
        "rate_per_key", wd("set_limits", "q", rate_per_key=_forged(per=timedelta(0)))
    ),
    "set_limits rate_per_key period over a day": Entry(
        "rate_per_key", wd("set_limits", "q", rate_per_key=_forged(per=timedelta(days=2)))
    ),
    "set_limits rate_per_key period an int": Entry("rate_per_key", wd("set_limits", "q", rate_per_key=_forged(per=60))),
    "set_limits rate_per_key beside a bad rate": Entry(
        "rate", wd("set_limits", "q", rate=_forged(count=0), rate_per_key=Rate(1, timedelta(seconds=1)))
    ),
    "set_limits queue empty": Entry("queue", wd("set_limits", "", concurrency=1)),
    "set_limits queue 257 chars": Entry("queue", wd("set_limits", "q" * 257, concurrency=1)),
    "set_limits queue NUL": Entry("queue", wd("set_limits", "q\x00", concurrency=1)),
    "set_limits queue int": Entry("queue", wd("set_limits", 5, concurrency=1)),
    "clear_limits queue 257 chars": Entry("queue", wd("clear_limits", "seed-limited" + "q" * 250)),
    "clear_limits queue NUL": Entry("queue", wd("clear_limits", "seed-limited\x00")),
    # payloads
    "payload NaN": Entry("payload", job(payload=math.nan)),
    "payload inf": Entry("payload", job(payload=math.inf)),
    "payload nested -inf": Entry("payload", job(payload={"a": [1, -math.inf]})),
    "payload over 1 MiB": Entry("payload", job(payload=HEAVY + "x")),
    "payload multibyte over 1 MiB": Entry("payload", job(payload="é" * (PAYLOAD_MAX_BYTES // 2))),
    "payload arrays too deep": Entry("payload", job(payload=nested(PAYLOAD_MAX_DEPTH + 1))),
    "payload objects too deep": Entry("payload", job(payload=nested_objects(PAYLOAD_MAX_DEPTH + 1))),
    "payload 100k deep": Entry("payload", job(payload=nested(100_000))),
    "payload set": Entry("payload", job(payload={1, 2})),
    "payload bytes": Entry("payload", job(payload=b"raw")),
    "payload datetime": Entry("payload", job(payload={"at": datetime.datetime(2024, 1, 1)})),
    "payload object": Entry("payload", job(payload=object())),
    "payload int key": Entry("payload", job(payload={1: "one"})),
    "payload lone surrogate": Entry("payload", job(payload={"s": "\udc80"})),
    "payload key lone surrogate": Entry("payload", job(payload={"k\ud800": 1})),
    "payload nested lone surrogate": Entry("payload", job(payload=[{"a": ["x", "\udfff"]}])),
    # payloads through the opt-in codec
    "codec naive datetime": Entry(
        "payload", job(codec=TaggedJSON(), payload={"at": datetime.datetime(2024, 1, 1)}), says="naive datetime"
    ),
    "codec NaN Decimal": Entry("payload", job(codec=TaggedJSON(), payload=decimal.Decimal("NaN")), says="non-finite"),
    "codec set": Entry("payload", job(codec=TaggedJSON(), payload={"s": {1, 2}}), says="set"),
    "codec bytes": Entry("payload", job(codec=TaggedJSON(), payload=b"raw"), says="bytes"),
    "codec time of day": Entry("payload", job(codec=TaggedJSON(), payload=datetime.time(12)), says="time"),
    "codec not a codec": Entry("codec", job(codec="json", payload=1)),
    # the encrypting codec: its keys, and what it encrypts
    "encrypted no keys": Entry("codec", lambda engine: EncryptedJSON([]), says="at least one key"),
    "encrypted keys a str": Entry("codec", lambda engine: EncryptedJSON(FERNET_KEY), says="list of keys"),
    "encrypted key not base64": Entry("codec", lambda engine: EncryptedJSON([NOT_A_KEY]), says="key #1"),
    "encrypted key 16 bytes": Entry(
        "codec", lambda engine: EncryptedJSON([FERNET_KEY, SHORT_KEY]), says="key #2 (str) is not a Fernet key"
    ),
    "encrypted key int": Entry("codec", lambda engine: EncryptedJSON([7]), says="key #1 (int)"),  # type: ignore[list-item]
    "encrypted inner not a codec": Entry(
        "codec",
        lambda engine: EncryptedJSON([FERNET_KEY], inner="json"),  # type: ignore[arg-type]
        says="inner",
    ),
    "encrypted NaN": Entry("payload", job(codec=EncryptedJSON([FERNET_KEY]), payload=math.nan)),
    "encrypted naive datetime": Entry(
        "payload",
        job(codec=EncryptedJSON([FERNET_KEY], inner=TaggedJSON()), payload=datetime.datetime(2024, 1, 1)),
        says="inner codec TaggedJSON refused the value (InvalidJob; message not shown",
    ),
    # priority and budget
    "priority bool": Entry("priority", job(priority=True)),
    "priority float": Entry("priority", job(priority=1.5)),
    "priority 2**63": Entry("priority", job(priority=2**63)),
    "priority -2**63-1": Entry("priority", job(priority=-(2**63) - 1)),
    "priority str": Entry("priority", job(priority="1")),
    "priority None": Entry("priority", job(priority=None)),
    "max_recoveries -1": Entry("max_recoveries", job(max_recoveries=-1)),
    "max_recoveries bool": Entry("max_recoveries", job(max_recoveries=True)),
    "max_recoveries float": Entry("max_recoveries", job(max_recoveries=1.0)),
    "max_recoveries 2**31": Entry("max_recoveries", job(max_recoveries=2**31)),
    # enqueue plumbing
    "enqueue non-Job": Entry("Job", lambda e: Watchdog(e).enqueue([{"job_id": "x", "queue": "q"}]), TypeError),  # type: ignore[list-item]
    "enqueue None": Entry("Job", lambda e: Watchdog(e).enqueue(None), TypeError),  # type: ignore[call-overload]
    "enqueue an int": Entry("Job", lambda e: Watchdog(e).enqueue(5), TypeError),  # type: ignore[call-overload]
    "enqueue fn with None": Entry("Job", lambda e: _in_transaction(e, lambda conn: enqueue(conn, None)), TypeError),  # type: ignore[call-overload]
    "enqueue into a str": Entry("Session", lambda e: enqueue("not a session", Job("x", "q")), TypeError),  # type: ignore[call-overload]
    "conflicting duplicate in one batch": Entry(
        "job_id", lambda e: Watchdog(e).enqueue([Job("dup", "q"), Job("dup", "q2")]), EnqueueConflict
    ),
    "conflicting replay in a batch": Entry("job_id", conflicting_batch, EnqueueConflict, says="'seed-queued'"),
    "conflicting replay after own writes": Entry("job_id", conflicting_batch_in_savepoint, EnqueueConflict),
    "enqueue_select NaN payload": Entry("payload", enqueue_select_of(job_id="s1", queue="q", payload="NaN")),
    "enqueue_select payload not JSON": Entry("payload", enqueue_select_of(job_id="s1", queue="q", payload="{")),
    "enqueue_select unknown column": Entry("select", enqueue_select_of(job_id="s1", queue="q", color="red")),
    "enqueue_select without queue": Entry("select", enqueue_select_of(job_id="s1")),
    "enqueue_select bad priority": Entry("priority", enqueue_select_of(job_id="s1", queue="q", priority=1.5)),
    "enqueue_select naive run_at": Entry(
        "run_at", enqueue_select_of(job_id="s1", queue="q", run_at=datetime.datetime(2030, 1, 1)), says="row 0"
    ),
    "enqueue_select run_at str": Entry("run_at", enqueue_select_of(job_id="s1", queue="q", run_at="2030-01-01")),
    # run_at
    "run_at naive": Entry("run_at", job(run_at=datetime.datetime(2030, 1, 1)), says="naive"),
    "run_at before 1970": Entry("run_at", job(run_at=datetime.datetime(1969, 12, 31, 23, 59, tzinfo=UTC))),
    "run_at in 9999": Entry("run_at", job(run_at=datetime.datetime(9999, 6, 1, tzinfo=UTC))),
    "run_at year 1 with an offset": Entry(
        "run_at", job(run_at=datetime.datetime(1, 1, 2, tzinfo=timezone(timedelta(hours=12))))
    ),
    "run_at str": Entry("run_at", job(run_at="2030-01-01T00:00:00+00:00")),
    "run_at epoch int": Entry("run_at", job(run_at=1_900_000_000)),
    "run_at date": Entry("run_at", job(run_at=datetime.date(2030, 1, 1))),
    # enqueue delay
    "delay zero": Entry("delay", delayed(timedelta(0))),
    "delay negative": Entry("delay", delayed(timedelta(seconds=-1))),
    "delay under 1 ms": Entry("delay", delayed(timedelta(microseconds=999))),
    "delay over MAX_DELAY": Entry("delay", delayed(MAX_DELAY + timedelta(milliseconds=1))),
    "delay int": Entry("delay", delayed(5)),
    "delay float": Entry("delay", delayed(1.5)),
    "delay zero in a transaction": Entry("delay", delayed_in_transaction(timedelta(0))),
    "delay with run_at": Entry(
        "delay", delayed(timedelta(seconds=1), Job("new-job", "q", run_at=LATER)), says="run_at"
    ),
    "delay with run_at later in a batch": Entry(
        "delay",
        delayed(timedelta(seconds=1), Job("new-job", "q"), Job("new-job-2", "q", run_at=LATER)),
        says="'new-job-2'",
    ),
    # RetryPolicy
    "max_attempts 0": Entry("max_attempts", policy(max_attempts=0)),
    "max_attempts 1001": Entry("max_attempts", policy(max_attempts=1001)),
    "max_attempts bool": Entry("max_attempts", policy(max_attempts=True)),
    "max_attempts float": Entry("max_attempts", policy(max_attempts=3.0)),
    "max_attempts None": Entry("max_attempts", policy(max_attempts=None)),
    "backoff zero": Entry("backoff", policy(backoff=timedelta(0))),
    "backoff negative": Entry("backoff", policy(backoff=timedelta(seconds=-1))),
    "backoff int": Entry("backoff", policy(backoff=1)),
    "backoff over MAX_DELAY": Entry("backoff", policy(backoff=MAX_DELAY * 2, max_backoff=MAX_DELAY * 2)),
    "max_backoff under backoff": Entry(
        "max_backoff", policy(backoff=timedelta(seconds=10), max_backoff=timedelta(seconds=9))
    ),
    "max_backoff over MAX_DELAY": Entry("max_backoff", policy(max_backoff=MAX_DELAY + timedelta(days=1))),
    "factor under 1": Entry("factor", policy(factor=0.5)),
    "factor over 100": Entry("factor", policy(factor=101)),
    "factor NaN": Entry("factor", policy(factor=math.nan)),
    "factor inf": Entry("factor", policy(factor=math.inf)),
    "factor bool": Entry("factor", policy(factor=True)),
    "factor str": Entry("factor", policy(factor="2")),
    "jitter negative": Entry("jitter", policy(jitter=-0.1)),
    "jitter over 1": Entry("jitter", policy(jitter=1.5)),
    "jitter NaN": Entry("jitter", policy(jitter=math.nan)),
    "Job retry int": Entry("retry", job(retry=3)),
    "Job retry dict": Entry("retry", job(retry={"max_attempts": 3})),
    "Job retry True": Entry("retry", job(retry=True)),
    # per-attempt timeouts: the job's, the handler's, the runners'
    "Job timeout zero": Entry("timeout", job(timeout=timedelta(0))),
    "Job timeout negative": Entry("timeout", job(timeout=timedelta(seconds=-1))),
    "Job timeout over MAX_DELAY": Entry("timeout", job(timeout=MAX_DELAY + timedelta(days=1))),
    "Job timeout int": Entry("timeout", job(timeout=30)),
    "Job timeout float": Entry("timeout", job(timeout=0.5)),
    "@handler timeout zero": Entry("timeout", registered(timeout=timedelta(0))),
    "@handler timeout negative": Entry("timeout", registered(timeout=timedelta(seconds=-1))),
    "@handler timeout over MAX_DELAY": Entry("timeout", registered(timeout=MAX_DELAY * 2)),
    "@handler timeout int": Entry("timeout", registered(timeout=30)),
    "@handler retry str": Entry("retry", registered(retry="x")),
    "@handler retry int": Entry("retry", registered(retry=3)),
    "Runner wakeups unknown": Entry("wakeups", runner(wakeups="sometimes")),
    "Runner wakeups not a str": Entry("wakeups", runner(wakeups=True)),
    "Runner listen_engine a URL": Entry("listen_engine", runner(listen_engine="postgresql://x/y")),
    "AsyncRunner wakeups unknown": Entry("wakeups", async_runner(wakeups="LISTEN!")),
    "AsyncRunner listen_engine a sync Engine": Entry(
        "listen_engine",
        lambda engine: AsyncRunner(make_async_engine(engine), {"q": handler}, listen_engine=engine),  # type: ignore[arg-type]
    ),
    "Runner timeout zero": Entry("timeout", runner(timeout=timedelta(0))),
    "Runner timeout negative": Entry("timeout", runner(timeout=timedelta(seconds=-1))),
    "Runner timeout over MAX_DELAY": Entry("timeout", runner(timeout=MAX_DELAY * 2)),
    "Runner timeout int": Entry("timeout", runner(timeout=30)),
    "Runner retry int": Entry("retry", runner(retry=3)),
    "Runner retry dict": Entry("retry", runner(retry={"max_attempts": 3})),
    "AsyncRunner timeout zero": Entry("timeout", async_runner(timeout=timedelta(0))),
    "AsyncRunner timeout negative": Entry("timeout", async_runner(timeout=timedelta(seconds=-1))),
    "AsyncRunner timeout over MAX_DELAY": Entry("timeout", async_runner(timeout=MAX_DELAY * 2)),
    "AsyncRunner timeout int": Entry("timeout", async_runner(timeout=30)),
    "AsyncRunner retry int": Entry("retry", async_runner(retry=3)),
    # the process executor
    "Runner executor unknown": Entry("executor", runner(executor="fork")),
    "Runner executor int": Entry("executor", runner(executor=4)),
    "ProcessExecutor processes 0": Entry("processes", process_runner(processes=0)),
    "ProcessExecutor processes negative": Entry("processes", process_runner(processes=-2)),
    "ProcessExecutor processes huge": Entry("processes", process_runner(processes=1025), says="from 1 to 1024"),
    "ProcessExecutor processes bool": Entry("processes", process_runner(processes=True)),
    "ProcessExecutor processes str": Entry("processes", process_runner(processes="4")),
    "ProcessExecutor max_jobs_per_child 0": Entry("max_jobs_per_child", process_runner(max_jobs_per_child=0)),
    "ProcessExecutor max_jobs_per_child float": Entry("max_jobs_per_child", process_runner(max_jobs_per_child=1.5)),
    "ProcessExecutor memory ceiling tiny": Entry("max_memory_per_child", process_runner(max_memory_per_child=1024)),
    "ProcessExecutor memory ceiling negative": Entry("max_memory_per_child", process_runner(max_memory_per_child=-1)),
    "ProcessExecutor memory ceiling bool": Entry("max_memory_per_child", process_runner(max_memory_per_child=True)),
    "ProcessExecutor memory ceiling str": Entry("max_memory_per_child", process_runner(max_memory_per_child="1G")),
    "ProcessExecutor memory ceiling 2 TiB": Entry("max_memory_per_child", process_runner(max_memory_per_child=2**41)),
    "ProcessExecutor kill_grace negative": Entry("kill_grace", process_runner(kill_grace=timedelta(seconds=-1))),
    "ProcessExecutor kill_grace int": Entry("kill_grace", process_runner(kill_grace=5)),
    "ProcessExecutor kill_grace a day": Entry("kill_grace", process_runner(kill_grace=timedelta(days=1))),
    "ProcessExecutor prefetch negative": Entry("prefetch", process_runner(prefetch=-1), says="from 0 to 10000"),
    "ProcessExecutor prefetch huge": Entry("prefetch", process_runner(prefetch=10_001)),
    "ProcessExecutor prefetch bool": Entry("prefetch", process_runner(prefetch=True)),
    "ProcessExecutor prefetch float": Entry("prefetch", process_runner(prefetch=1.5)),
    "ProcessExecutor forward_loggers str": Entry(
        "forward_loggers", process_runner(forward_loggers="httpx"), says="a tuple of logger names"
    ),
    "ProcessExecutor forward_loggers None": Entry("forward_loggers", process_runner(forward_loggers=None)),
    "ProcessExecutor forward_loggers int name": Entry("forward_loggers", process_runner(forward_loggers=(3,))),
    "ProcessExecutor forward_loggers newline": Entry(
        "forward_loggers", process_runner(forward_loggers=("httpx\nforged",)), says="printable"
    ),
    "ProcessExecutor forward_loggers trailing dot": Entry(
        "forward_loggers", process_runner(forward_loggers=("httpx.",))
    ),
    "ProcessExecutor forward_loggers too long": Entry("forward_loggers", process_runner(forward_loggers=("x" * 201,))),
    "ProcessExecutor forward_loggers too many": Entry(
        "forward_loggers", process_runner(forward_loggers=tuple(f"lib{i}" for i in range(101))), says="at most 100"
    ),
    "Runner process executor with another concurrency": Entry(
        "concurrency", runner(executor=ProcessExecutor(processes=2), concurrency=4), says="processes=4"
    ),
    "Runner process executor lambda handler": Entry(
        "handlers", runner(executor="process", handlers={"q": lambda job: None}), says="is a lambda"
    ),
    "Runner process executor handler in __main__": Entry(
        "handlers", runner(executor="process", handlers={"q": in_main}), says="defined in __main__"
    ),
    "Runner process executor nested handler": Entry(
        "handlers", runner(executor="process", handlers={"q": nested_handler()}), says="nested function"
    ),
    "Runner process executor callable object": Entry(
        "handlers", runner(executor="process", handlers={"q": CallableHandler()}), says="no module path"
    ),
    "AsyncRunner process executor lambda handler": Entry(
        "handlers", async_runner_with({"q": lambda job: None}, executor="process"), says="is a lambda"
    ),
    "AsyncRunner process executor processes 0": Entry("processes", async_process_runner(processes=0)),
    # an executor per handler
    "handler executor unknown": Entry("executor", registered(executor="fork"), says='"thread", "process"'),
    "handler executor int": Entry("executor", registered(executor=4)),
    "handler executor None": Entry("executor", registered(executor=None)),
    "handler executor class": Entry("executor", registered(executor=ProcessExecutor)),
    "task executor unknown": Entry(
        "executor",
        lambda e: task("q-task-bad", registry=HandlerRegistry(), executor="fork"),
    ),
    "Runner executors not a mapping": Entry("executors", runner(executors=["q"]), says="must be a mapping"),
    "Runner executors unserved queue": Entry(
        "executors", runner(executors={"nope": "process"}), says="'nope' is not served by this runner"
    ),
    "Runner executors unknown executor": Entry("executors", runner(executors={"q": "fork"}), says="of 'q'"),
    "Runner executors process for a lambda": Entry(
        "handlers", runner(handlers={"q": lambda job: None}, executors={"q": "process"}), says="is a lambda"
    ),
    "Runner handler naming the process executor is a lambda": Entry(
        "handlers", runner(handlers={"q": _process_lambda()}), says="is a lambda"
    ),
    "AsyncRunner coroutine handler naming the process executor": Entry(
        "executor", async_runner_with({"q": _coroutine_in_a_process}), says="coroutine function"
    ),
    # reads
    "read empty id": Entry("job_id", wd("read", "")),
    "read int id": Entry("job_id", wd("read", 5)),
    "read 257 chars": Entry("job_id", wd("read", "r" * 257)),
    "read_queue_head None": Entry("queue", wd("read_queue_head", None)),
    "read_settled limit 0": Entry("limit", wd("read_settled", 0)),
    "read_settled limit 257": Entry("limit", wd("read_settled", 257)),
    "read_settled limit bool": Entry("limit", wd("read_settled", True)),
    "read_settled limit str": Entry("limit", wd("read_settled", "5")),
    "read_settled after -1": Entry("after_sequence", wd("read_settled", 10, -1)),
    "read_settled after float": Entry("after_sequence", wd("read_settled", 10, 0.5)),
    # commands
    "cancel int job_id": Entry("job_id", wd("cancel", 123, "c1")),
    "cancel int cancellation_id": Entry("cancellation_id", wd("cancel", "seed-running", 5)),
    "cancel empty cancellation_id": Entry("cancellation_id", wd("cancel", "seed-running", "")),
    "cancel 257-char cancellation_id": Entry("cancellation_id", wd("cancel", "seed-running", "c" * 257)),
    "cancel NUL cancellation_id": Entry("cancellation_id", wd("cancel", "seed-running", "c\x00")),
    "cancel only_if_queued str": Entry(
        "only_if_queued", wd("cancel", "seed-running", "c1", only_if_queued="yes"), WatchdogError
    ),
    "fail_lane empty reason": Entry("reason", wd("fail_lane", "q", ""), WatchdogError),
    "fail_lane None reason": Entry("reason", wd("fail_lane", "q", None), WatchdogError),
    "fail_lane int reason": Entry("reason", wd("fail_lane", "q", 7), WatchdogError),
    "fail_lane empty lane": Entry("lane", wd("fail_lane", "", "down")),
    "fail_lane int lane": Entry("lane", wd("fail_lane", 5, "down")),
    "purge empty": Entry("queue", wd("purge", "")),
    "purge None": Entry("queue", wd("purge", None)),
    # decisions
    "decision str outcome": Entry("decision", lambda e: Decision("completed")),  # type: ignore[arg-type]
    "decision cancelled": Entry("decision", lambda e: Decision(Outcome.CANCELLED)),
    "decision interrupted": Entry("decision", lambda e: Decision(Outcome.INTERRUPTED)),
    "decision None": Entry("decision", lambda e: Decision(None)),
    "decision int reason": Entry("reason", lambda e: Decision.failed(123)),  # type: ignore[arg-type]
    "decision snooze 0": Entry("after", lambda e: Decision.snooze(timedelta(0))),
    "decision snooze negative": Entry("after", lambda e: Decision.snooze(timedelta(seconds=-1))),
    "decision snooze over MAX_DELAY": Entry("after", lambda e: Decision.snooze(MAX_DELAY * 2)),
    "decision snooze int": Entry("after", lambda e: Decision.snooze(5)),  # type: ignore[arg-type]
    "decision retry after -1s": Entry("after", lambda e: Decision.retry("r", after=timedelta(seconds=-1))),
    "decision retry after int": Entry("after", lambda e: Decision.retry("r", after=1)),  # type: ignore[arg-type]
    "decision completed retryable": Entry("retryable", lambda e: Decision(Outcome.COMPLETED, retryable=True)),
    "decision failed retry str": Entry("retry", lambda e: Decision.failed("r", retry="yes")),  # type: ignore[arg-type]
    "decision completed with after": Entry("after", lambda e: Decision(Outcome.COMPLETED, after=timedelta(seconds=1))),
    "decision failed retry=False with after": Entry(
        "after", lambda e: Decision(Outcome.FAILED, "r", retryable=False, after=timedelta(seconds=1))
    ),
    "settle with a str decision": Entry("decision", settle_with("completed"), WatchdogError),
    "settle with a dict decision": Entry("decision", settle_with({"outcome": "completed"}), WatchdogError),
    "settle with a result too large": Entry(
        "result", settle_with(Decision.completed(result="x" * (RESULT_MAX_BYTES + 1))), says="bytes of JSON"
    ),
    "settle with a result not JSON": Entry(
        "result", settle_with(Decision.completed(result={"at": object()})), says="not a JSON type"
    ),
    # clients and runners
    "Watchdog of a str": Entry("Engine", lambda e: Watchdog("sqlite://"), TypeError),  # type: ignore[arg-type]
    "Runner of a str": Entry("Engine", runner(engine="sqlite://"), TypeError),
    "Runner no handlers": Entry("handlers", runner(handlers={})),
    "Runner handler not callable": Entry("handlers", runner(handlers={"q": 5})),
    "Runner empty queue name": Entry("queue", runner(handlers={"": handler})),
    "Runner queues as str": Entry("queues", runner(queues="q")),
    "Runner queue without handler": Entry("queues", runner(queues=["nope"])),
    "Runner concurrency 0": Entry("concurrency", runner(concurrency=0)),
    "Runner concurrency bool": Entry("concurrency", runner(concurrency=True)),
    "Runner concurrency str": Entry("concurrency", runner(concurrency="2")),
    "Runner concurrency float": Entry("concurrency", runner(concurrency=2.0)),
    "Runner claim_ahead negative": Entry("claim_ahead", runner(claim_ahead=-1), says="from 0 to 10000"),
    "Runner claim_ahead huge": Entry("claim_ahead", runner(claim_ahead=10_001)),
    "Runner claim_ahead bool": Entry("claim_ahead", runner(claim_ahead=True)),
    "Runner claim_ahead float": Entry("claim_ahead", runner(claim_ahead=2.0)),
    "Runner claim_ahead str": Entry("claim_ahead", runner(claim_ahead="4")),
    "Runner claim_ahead beside the process executor": Entry(
        "claim_ahead", runner(executor=ProcessExecutor(processes=2), claim_ahead=2), says="prefetch"
    ),
    "AsyncRunner claim_ahead negative": Entry("claim_ahead", async_runner(claim_ahead=-1)),
    "Runner lease int": Entry("lease", runner(lease=120)),
    "Runner lease zero": Entry("lease", runner(lease=timedelta(0))),
    "Runner lease negative": Entry("lease", runner(lease=timedelta(seconds=-5))),
    "Runner heartbeat over a third": Entry("heartbeat", runner(heartbeat=timedelta(seconds=60))),
    "Runner heartbeat float": Entry("heartbeat", runner(heartbeat=1.0)),
    "Runner poll_interval zero": Entry("poll_interval", runner(poll_interval=timedelta(0))),
    "Runner grace negative": Entry("grace", runner(grace=timedelta(seconds=-1))),
    "Runner grace int": Entry("grace", runner(grace=30)),
    "Runner is_alive str": Entry("is_alive", runner(is_alive="yes")),
    "Runner clock str": Entry("clock", runner(clock="now")),
    # operations (issue 10). Every other argument of each call is valid and
    # would change something (older_than=0 prunes the settled seeds).
    "prune older_than negative": Entry("older_than", wd("prune", older_than=timedelta(seconds=-1))),
    "prune older_than int": Entry("older_than", wd("prune", older_than=0)),
    "prune older_than None": Entry("older_than", wd("prune", older_than=None)),
    "prune outcome unknown": Entry("outcomes", wd("prune", older_than=timedelta(0), outcomes=["done"])),
    "prune outcome unknown beside a known": Entry(
        "outcomes", wd("prune", older_than=timedelta(0), outcomes=["interrupted", "done"])
    ),
    "prune outcomes empty": Entry("outcomes", wd("prune", older_than=timedelta(0), outcomes=[])),
    "prune outcomes int": Entry("outcomes", wd("prune", older_than=timedelta(0), outcomes=5)),
    "prune outcome int": Entry("outcomes", wd("prune", older_than=timedelta(0), outcomes=[5])),
    "prune batch 0": Entry("batch", wd("prune", older_than=timedelta(0), batch=0)),
    "prune batch 10001": Entry("batch", wd("prune", older_than=timedelta(0), batch=10_001)),
    "prune batch str": Entry("batch", wd("prune", older_than=timedelta(0), batch="5")),
    "prune limit 0": Entry("limit", wd("prune", older_than=timedelta(0), limit=0)),
    "prune limit negative": Entry("limit", wd("prune", older_than=timedelta(0), limit=-1)),
    "prune include_undated str": Entry("include_undated", wd("prune", older_than=timedelta(0), include_undated="yes")),
    "prune include_undated int": Entry("include_undated", wd("prune", older_than=timedelta(0), include_undated=1)),
    "prune_batch older_than negative": Entry(
        "older_than",
        lambda e: _in_transaction(e, lambda c: store.prune_batch(c, older_than=timedelta(seconds=-1))),
    ),
    "prune_batch limit 0": Entry(
        "limit", lambda e: _in_transaction(e, lambda c: store.prune_batch(c, older_than=timedelta(0), limit=0))
    ),
    "list_jobs limit 0": Entry("limit", wd("list_jobs", limit=0)),
    "list_jobs limit 1001": Entry("limit", wd("list_jobs", limit=1001)),
    "list_jobs after_sequence negative": Entry("after_sequence", wd("list_jobs", after_sequence=-1)),
    "list_jobs after_sequence str": Entry("after_sequence", wd("list_jobs", after_sequence="0")),
    "list_jobs state unknown": Entry("state", wd("list_jobs", state="finished")),
    "list_jobs outcome unknown": Entry("outcome", wd("list_jobs", outcome="done")),
    "list_jobs queue NUL": Entry("queue", wd("list_jobs", queue="q\x00")),
    "list_jobs with_payload str": Entry("with_payload", wd("list_jobs", with_payload="no")),
    "list_jobs queue lone surrogate": Entry("queue", wd("list_jobs", queue="q\ud800")),
    "list_jobs queue 257 chars": Entry("queue", wd("list_jobs", queue="q" * 257)),
    "list_jobs lane NUL": Entry("lane", wd("list_jobs", lane="l\x00")),
    "list_jobs lane lone surrogate": Entry("lane", wd("list_jobs", lane="l\udfff")),
    "list_jobs lane too long": Entry("lane", wd("list_jobs", lane="l" * 10_000)),
    "list_jobs prefix NUL": Entry("job_id_prefix", wd("list_jobs", job_id_prefix="seed\x00")),
    "list_jobs prefix lone surrogate": Entry("job_id_prefix", wd("list_jobs", job_id_prefix="seed\ud800")),
    "list_jobs prefix 257 chars": Entry("job_id_prefix", wd("list_jobs", job_id_prefix="s" * 257)),
    "pause queue empty": Entry("queue", wd("pause", "")),
    "pause queue NUL": Entry("queue", wd("pause", "q\x00")),
    "pause queue lone surrogate": Entry("queue", wd("pause", "q\ud800")),
    "pause queue 257 chars": Entry("queue", wd("pause", "q" * 257)),
    "pause queue int": Entry("queue", wd("pause", 5)),
    "pause reason too long": Entry("reason", wd("pause", "q", reason="r" * (PAUSE_REASON_MAX_LENGTH + 1))),
    "pause reason NUL": Entry("reason", wd("pause", "q", reason="a\x00b")),
    "pause reason empty": Entry("reason", wd("pause", "q", reason="")),
    "resume queue empty": Entry("queue", wd("resume", "")),
    "resume queue NUL": Entry("queue", wd("resume", "seed-paused\x00")),
    "resume queue lone surrogate": Entry("queue", wd("resume", "seed-paused\ud800")),
    "resume queue 257 chars": Entry("queue", wd("resume", "q" * 257)),
    "rerun missing job": Entry("job_id", wd("rerun", "no-such-job", rerun_id="r1"), says="no job"),
    "rerun running job": Entry("job_id", wd("rerun", "seed-running", rerun_id="r1"), says="only a settled job"),
    "rerun delayed job": Entry("job_id", wd("rerun", "seed-delayed", rerun_id="r1"), says="only a settled job"),
    "rerun job_id NUL": Entry("job_id", wd("rerun", "seed-settled\x00", rerun_id="r1")),
    "rerun rerun_id empty": Entry("rerun_id", wd("rerun", "seed-settled", rerun_id="")),
    "rerun rerun_id 129 chars": Entry("rerun_id", wd("rerun", "seed-settled", rerun_id="r" * 129)),
    "rerun rerun_id NUL": Entry("rerun_id", wd("rerun", "seed-settled", rerun_id="r\x00")),
    "rerun rerun_id int": Entry("rerun_id", wd("rerun", "seed-settled", rerun_id=1)),
    # Bulk actions: each call would act on the seeds (q2's settled job, q's live
    # ones) but for its one bad argument, checked before anything is read.
    "rerun_many no filter": Entry("filter", wd("rerun_many", rerun_id="r1"), says="at least one"),
    "rerun_many rerun_id empty": Entry("rerun_id", wd("rerun_many", rerun_id="", queue="q2")),
    "rerun_many rerun_id NUL": Entry("rerun_id", wd("rerun_many", rerun_id="r\x00", queue="q2")),
    "rerun_many queue NUL": Entry("queue", wd("rerun_many", rerun_id="r1", queue="q2\x00")),
    "rerun_many lane lone surrogate": Entry("lane", wd("rerun_many", rerun_id="r1", queue="q2", lane="l\ud800")),
    "rerun_many outcome unknown": Entry("outcomes", wd("rerun_many", rerun_id="r1", queue="q2", outcome="done")),
    "rerun_many outcomes empty": Entry("outcomes", wd("rerun_many", rerun_id="r1", queue="q2", outcome=[])),
    "rerun_many settled_after naive": Entry(
        "settled_after", wd("rerun_many", rerun_id="r1", queue="q2", settled_after=datetime.datetime(2024, 1, 1))
    ),
    "rerun_many settled_before str": Entry(
        "settled_before", wd("rerun_many", rerun_id="r1", queue="q2", settled_before="2024-01-01")
    ),
    "rerun_many enqueued range empty": Entry(
        "enqueued_before",
        wd("rerun_many", rerun_id="r1", queue="q2", enqueued_after=LATER, enqueued_before=LATER),
        says="later than",
    ),
    "rerun_many batch 0": Entry("batch", wd("rerun_many", rerun_id="r1", queue="q2", batch=0)),
    "rerun_many batch 1001": Entry("batch", wd("rerun_many", rerun_id="r1", queue="q2", batch=1001)),
    "rerun_many limit 0": Entry("limit", wd("rerun_many", rerun_id="r1", queue="q2", limit=0)),
    "rerun_many dry_run str": Entry("dry_run", wd("rerun_many", rerun_id="r1", queue="q2", dry_run="no")),
    "cancel_many no filter": Entry("filter", wd("cancel_many", cancellation_id="c1"), says="at least one"),
    "cancel_many cancellation_id 257 chars": Entry(
        "cancellation_id", wd("cancel_many", cancellation_id="c" * 257, queue="q")
    ),
    "cancel_many queue 257 chars": Entry("queue", wd("cancel_many", cancellation_id="c1", queue="q" * 257)),
    "cancel_many enqueued_after int": Entry(
        "enqueued_after", wd("cancel_many", cancellation_id="c1", queue="q", enqueued_after=0)
    ),
    "cancel_many only_if_queued int": Entry(
        "only_if_queued", wd("cancel_many", cancellation_id="c1", queue="q", only_if_queued=1)
    ),
    "cancel_many batch str": Entry("batch", wd("cancel_many", cancellation_id="c1", queue="q", batch="5")),
    "list_jobs before_sequence 0": Entry("before_sequence", wd("list_jobs", before_sequence=0)),
    "list_jobs newest_first str": Entry("newest_first", wd("list_jobs", newest_first="yes")),
    "Retention completed negative": Entry("completed", lambda e: Retention(completed=timedelta(seconds=-1))),
    "Retention failed int": Entry("failed", lambda e: Retention(failed=60)),  # type: ignore[arg-type]
    "Retention interrupted negative": Entry("interrupted", lambda e: Retention(interrupted=timedelta(days=-1))),
    "Retention every zero": Entry("every", lambda e: Retention(every=timedelta(0))),
    "Retention every negative": Entry("every", lambda e: Retention(every=timedelta(seconds=-1))),
    "Retention batch 0": Entry("batch", lambda e: Retention(batch=0)),
    "Retention batch 10001": Entry("batch", lambda e: Retention(batch=10_001)),
    "Runner retention dict": Entry("retention", runner(retention={"completed": timedelta(0)})),
    "Runner retention timedelta": Entry("retention", runner(retention=timedelta(days=1))),
    "AsyncRunner retention dict": Entry("retention", async_runner(retention={"completed": timedelta(0)})),
    # OpenTelemetry (extra [otel]): refused before anything is installed.
    "instrument stats_engine URL": Entry("stats_engine", lambda e: otel.instrument(stats_engine=str(e.url))),  # type: ignore[arg-type]
    "instrument stats_engine connection": Entry("stats_engine", lambda e: otel.instrument(stats_engine=e.connect())),  # type: ignore[arg-type]
    "instrument stats_every zero": Entry("stats_every", lambda e: otel.instrument(stats_every=timedelta(0))),
    "instrument stats_every negative": Entry("stats_every", lambda e: otel.instrument(stats_every=timedelta(-1))),
    "instrument stats_every seconds": Entry("stats_every", lambda e: otel.instrument(stats_every=5)),  # type: ignore[arg-type]
    # The dashboard (extra [web]): a base_path that is not a path of this site.
    "create_app base_path //host": Entry("base_path", dashboard(base_path="//evil.example"), error=ValueError),
    "create_app base_path URL": Entry("base_path", dashboard(base_path="http://x"), error=ValueError),
    "create_app base_path backslash": Entry("base_path", dashboard(base_path="/\\evil.example"), error=ValueError),
    "create_app base_path control": Entry("base_path", dashboard(base_path="/ops\x1b[2J"), error=ValueError),
    "create_app base_path bidi": Entry("base_path", dashboard(base_path="/ops\u202e"), error=ValueError),
    "create_app identify str": Entry("identify", dashboard(identify="user"), error=TypeError),
    # The workers and schedules tables (revision w0009): whoever writes a row by
    # hand, the CHECK constraints refuse one out of bounds (the runners cut theirs to fit).
    "worker concurrency 0": Entry("concurrency", worker_row(concurrency=0), error=IntegrityError),
    "worker running negative": Entry("running", worker_row(running=-1), error=IntegrityError),
    "worker host empty": Entry("host", worker_row(host=""), error=IntegrityError),
    "worker host too long": Entry("host", worker_row(host="h" * 256), error=IntegrityError),
    "worker heartbeat 0": Entry("heartbeat", worker_row(heartbeat_ms=0), error=IntegrityError),
    "worker seen before it started": Entry("seen_after_start", worker_row(last_seen=1), error=IntegrityError),
    "worker queues empty": Entry("queues", worker_row(queues=""), error=IntegrityError),
    "worker process queues empty": Entry("process_queues", worker_row(process_queues=""), error=IntegrityError),
    "worker process queues too long": Entry(
        "process_queues", worker_row(process_queues="[" + "q" * 65_536 + "]"), error=IntegrityError
    ),
    "worker id too long": Entry("worker_id", worker_row(worker_id="w" * 65), error=IntegrityError),
    "schedule name too long": Entry("name", schedule_row(name="s" * 201), error=IntegrityError),
    "schedule cron empty": Entry("cron", schedule_row(cron=""), error=IntegrityError),
    "schedule recorded_by empty": Entry("recorded_by", schedule_row(recorded_by=""), error=IntegrityError),
    # A value of another type than an integer column's, written by hand:
    # PostgreSQL's types refuse it, SQLite's stored-type CHECKs (revision w0010)
    # too. (A BLOB in a text column: test_a_blob_in_a_text_column_...)
    **{
        f"job row {column} as {kind}": Entry(column, job_row(**{column: value}), error=DBAPIError)
        for column, kind, value in (
            ("priority", "text", "abc"),
            ("attempt", "text", "x"),
            ("recovery_count", "a blob", b"\x01"),
            ("snoozes", "text", "many"),
            ("run_at", "text", "tomorrow"),
            ("ready_at", "a blob", b"\x01"),
            ("lease_until", "text", "soon"),
            ("timeout_ms", "text", "long"),
            ("enqueued_at", "text", "now"),
            ("started_at", "text", "earlier"),
            ("recovery_max", "text", "some"),
            ("max_attempts", "a blob", b"\x03"),
        )
    },
    # -- dependencies, progress and tasks (revisions w0012, w0014) --------------------
    "Job after a str": Entry("after", lambda e: Job("x", "q", after="seed-queued")),
    "Job after not iterable": Entry("after", lambda e: Job("x", "q", after=5)),  # type: ignore[arg-type]
    "Job after itself": Entry("after", lambda e: Job("x", "q", after=["x"]), says="cannot wait for itself"),
    "Job after an empty job_id": Entry("after", lambda e: Job("x", "q", after=[""])),
    "Job after too many parents": Entry("after", lambda e: Job("x", "q", after=[f"p{i}" for i in range(10_001)])),
    "Job after_policy unknown": Entry("after_policy", lambda e: Job("x", "q", after=["p"], after_policy="maybe")),
    "enqueue after an unknown job": Entry("after", lambda e: Watchdog(e).enqueue(Job("x", "q", after=["nobody"]))),
    "enqueue after a job that did not complete": Entry(
        "after", lambda e: Watchdog(e).enqueue(Job("x", "q", after=["seed-settled"])), says="ended interrupted"
    ),
    "enqueue a cycle": Entry(
        "after",
        lambda e: Watchdog(e).enqueue([Job("c1", "q", after=["c2"]), Job("c2", "q", after=["c1"])]),
        says="comes later in this call",
    ),
    "replay adding parents to a stored job": Entry(
        "after",
        lambda e: Watchdog(e).enqueue(
            [Job("fresh", "q"), Job("seed-queued", "q", after=["seed-settled"], after_policy="any_outcome")]
        ),
        EnqueueConflict,
    ),
    "progress fraction above 1": Entry("fraction", lambda e: _unclaimed().progress(1.5)),
    "progress fraction NaN": Entry("fraction", lambda e: _unclaimed().progress(math.nan)),
    "progress fraction a bool": Entry("fraction", lambda e: _unclaimed().progress(True)),
    "progress note too long": Entry("note", lambda e: _unclaimed().progress(0.5, "n" * 501)),
    "progress note not text": Entry("note", lambda e: _unclaimed().progress(0.5, 7)),
    # durable steps (revision w0021): checked before anything runs or is recorded
    "step name empty": Entry("name", lambda e: _unclaimed().step("", lambda: 1)),
    "step name 257 chars": Entry("name", lambda e: _unclaimed().step("s" * 257, lambda: 1)),
    "step name with NUL": Entry("name", lambda e: _unclaimed().step("a\x00b", lambda: 1)),
    "step name not text": Entry("name", lambda e: _unclaimed().step(3, lambda: 1)),
    "sleep delay negative": Entry("delay", lambda e: _unclaimed().sleep(timedelta(seconds=-1))),
    "sleep delay not a timedelta": Entry("delay", lambda e: _unclaimed().sleep(5)),
    "sleep_until naive": Entry("until", lambda e: _unclaimed().sleep_until(datetime.datetime(2030, 1, 1))),
    "steps job_id empty": Entry("job_id", wd("steps", "")),
    # events and compensation (revision w0022): checked before anything is kept or recorded
    "signal name empty": Entry("name", wd("signal", "seed-queued", "", 1)),
    "signal name 257 chars": Entry("name", wd("signal", "seed-queued", "s" * 257, 1)),
    "signal name not text": Entry("name", wd("signal", "seed-queued", 7, 1)),
    "signal payload not JSON": Entry("payload", wd("signal", "seed-queued", "approved", {1, 2})),
    "signal payload NaN": Entry("payload", wd("signal", "seed-queued", "approved", math.nan)),
    "signal job_id empty": Entry("job_id", wd("signal", "", "approved", 1)),
    "signal_job name empty": Entry("name", lambda e: _signal_in_session(e, "seed-queued", "", 1)),
    "signal_job payload not JSON": Entry("payload", lambda e: _signal_in_session(e, "seed-queued", "a", object())),
    "signals job_id empty": Entry("job_id", wd("signals", "")),
    "wait_for timeout negative": Entry(
        "timeout", lambda e: _unclaimed().wait_for("approved", timeout=timedelta(seconds=-1))
    ),
    "wait_for timeout zero": Entry("timeout", lambda e: _unclaimed().wait_for("approved", timeout=timedelta(0))),
    "wait_for timeout not a timedelta": Entry("timeout", lambda e: _unclaimed().wait_for("approved", timeout=5)),
    "wait_for name empty": Entry("name", lambda e: _unclaimed().wait_for("", timeout=timedelta(seconds=1))),
    "step undo not callable": Entry("undo", lambda e: _unclaimed().step("x", lambda: 1, undo="release")),
    "step undo with no room for its name": Entry("name", lambda e: _unclaimed().step("s" * 252, lambda: 1, undo=print)),
    "child step undo a lambda": Entry("undo", lambda e: _in_child().step("x", lambda: 1, undo=lambda value: None)),
    "child step undo a coroutine function": Entry("undo", lambda e: _in_child().step("x", lambda: 1, undo=_async_undo)),
    "child step undo not callable": Entry("undo", lambda e: _in_child().step("x", lambda: 1, undo="release")),
    "task argument of another type": Entry("count", lambda e: _typed_task.job(job_id="t", count="1")),
    "task argument a bool for an int": Entry("count", lambda e: _typed_task.job(job_id="t", count=True)),
    "task argument unknown": Entry("cuont", lambda e: _typed_task.job(job_id="t", cuont=1)),
    "task argument missing": Entry("count", lambda e: _typed_task.job(job_id="t")),
    # -- task options (configure) and typed arguments ----------------------------------
    "task configure an unknown option": Entry(
        "priorty", lambda e: _typed_task.configure(priorty=3), says="takes no option 'priorty'"
    ),
    "task configure priority a str": Entry("priority", lambda e: _typed_task.configure(priority="high")),  # type: ignore[arg-type]
    "task configure priority out of range": Entry("priority", lambda e: _typed_task.configure(priority=2**63)),
    "task configure key empty": Entry("key", lambda e: _typed_task.configure(key="")),
    "task configure unique_for without a key": Entry(
        "unique_for", lambda e: _typed_task.configure(unique_for=timedelta(hours=1))
    ),
    "task configure debounce with a delay": Entry(
        "delay",
        lambda e: _typed_task.configure(unique_key="k", debounce=timedelta(seconds=5), delay=timedelta(seconds=1)),
    ),
    "task configure lane too long": Entry("lane", lambda e: _typed_task.configure(lane="l" * 513)),
    "task configure after a str": Entry("after", lambda e: _typed_task.configure(after="parent")),
    "task configure after_policy unknown": Entry("after_policy", lambda e: _typed_task.configure(after_policy="maybe")),
    "task configure run_at naive": Entry(
        "run_at", lambda e: _typed_task.configure(run_at=datetime.datetime(2030, 1, 1))
    ),
    "task configure retry not a policy": Entry("retry", lambda e: _typed_task.configure(retry=3)),  # type: ignore[arg-type]
    "task configure timeout negative": Entry("timeout", lambda e: _typed_task.configure(timeout=timedelta(seconds=-1))),
    "task configure max_recoveries negative": Entry(
        "max_recoveries", lambda e: _typed_task.configure(max_recoveries=-1)
    ),
    "task configure delay zero": Entry("delay", lambda e: _typed_task.configure(delay=timedelta(0))),
    "task configure delay and run_at": Entry(
        "delay",
        lambda e: _typed_task.configure(delay=timedelta(seconds=5), run_at=datetime.datetime(2030, 1, 1, tzinfo=UTC)),
        says="cannot be combined with run_at",
    ),
    "task job of a delayed task": Entry(
        "delay", lambda e: _typed_task.configure(delay=timedelta(seconds=5)).job(job_id="t", count=1)
    ),
    "task enqueue to an unknown parent": Entry(
        "after", lambda e: _task_enqueue(e, _typed_task.configure(after=["nobody"]), count=1)
    ),
    "task dataclass field of another type": Entry(
        "invoice.number",
        lambda e: _task_enqueue(e, _invoice_task, invoice=_Invoice("7", [])),  # type: ignore[arg-type]
        says="takes 'invoice.number' as int, got str '7'",
    ),
    "task dataclass nested field of another type": Entry(
        "invoice.lines[1].quantity",
        lambda e: _task_enqueue(
            e,
            _invoice_task,
            invoice={"number": 1, "lines": [{"sku": "a", "quantity": 1}, {"sku": "b", "quantity": "2"}]},
        ),
    ),
    "task dataclass unknown field": Entry(
        "invoice.totl", lambda e: _task_enqueue(e, _invoice_task, invoice={"number": 1, "lines": [], "totl": 3})
    ),
    "task dataclass missing field": Entry(
        "invoice.lines", lambda e: _task_enqueue(e, _invoice_task, invoice={"number": 1}), says="missing"
    ),
    "task pydantic field invalid": Entry(
        "customer.email",
        lambda e: _task_enqueue(e, _invoice_task, invoice=_Invoice(1, []), customer={"name": "Ada", "email": 7}),
    ),
    "task pydantic field missing": Entry(
        "customer.name",
        lambda e: _task_enqueue(e, _invoice_task, invoice=_Invoice(1, []), customer={"email": "a@example.com"}),
        says="Field required",
    ),
}

#: Entries expected to fail: {entry: reason}. Empty: every known bug is fixed.
XFAIL: dict[str, str] = {}
#: Entries failing on one dialect only: {(entry, dialect): reason}.
XFAIL_ON: dict[tuple[str, str], str] = {}


def _params() -> list[Any]:
    params = []
    for name, entry in REFUSED.items():
        marks = [pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else []
        params.append(pytest.param(name, entry, id=name, marks=marks))
    return params


@pytest.fixture(scope="module", params=WITH_MARIADB)
def seeded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One seeded database per dialect for the whole table (entries write
    nothing, and each compares its own before and after)."""
    if request.param == "sqlite":
        engine = create_engine(f"sqlite:///{tmp_path_factory.mktemp('bad-input') / 'watchdog.db'}")
        metadata.create_all(engine)
        _seed(engine)
        yield engine
        engine.dispose()
        return
    if request.param == "mariadb":
        with mysql_database(request.getfixturevalue("mysql_server"), "watchdog_bad_input") as url:
            engine = create_engine(url)
            try:
                metadata.create_all(engine)
                _seed(engine)
                yield engine
            finally:
                engine.dispose()
        return
    server: URL = request.getfixturevalue("postgres_server")
    name = f"watchdog_bad_input_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(server.set(database=name))
    try:
        metadata.create_all(engine)
        _seed(engine)
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.mark.parametrize("name, entry", _params())
def test_refused_with_a_clear_error_and_nothing_written(
    seeded: Engine, name: str, entry: Entry, request: pytest.FixtureRequest
) -> None:
    engine = seeded
    reason = XFAIL_ON.get((name, engine.dialect.name))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    before = dump_jobs(engine)
    assert {r["state"] for r in before} == {"queued", "running", "settled", "delayed"}
    pauses_before = _pauses(engine)
    assert [p[0] for p in pauses_before] == ["seed-paused"]
    limits_before = Watchdog(engine).limits()
    assert [limits.queue for limits in limits_before] == ["seed-limited"]
    with pytest.raises(entry.error) as caught:
        entry.call(engine)
    message = str(caught.value)
    assert entry.field in message, f"the message does not name {entry.field!r}: {message!r}"
    if entry.says is not None:
        assert entry.says in message, f"the message does not say {entry.says!r}: {message!r}"
    if isinstance(caught.value, InvalidJob):
        assert caught.value.field == entry.field, caught.value.field
    if isinstance(caught.value, WatchdogError) and not isinstance(caught.value, EnqueueConflict):
        assert caught.value.code.value == "invalid_input", caught.value.code
    assert dump_jobs(engine) == before, "the database changed"
    assert _pauses(engine) == pauses_before, "the pauses changed"
    assert Watchdog(engine).limits() == limits_before, "the limits changed"
    with engine.connect() as conn:
        assert conn.execute(select(workers_table)).all() == [], "a worker row was written"
        assert conn.execute(select(schedules_table)).all() == [], "a schedule row was written"
        assert conn.execute(select(job_signals_table)).all() == [], "a signal was kept"
        assert conn.execute(select(job_steps_table)).all() == [], "a step was recorded"


@pytest.mark.dialect_specific
@pytest.mark.parametrize("keys", [[NOT_A_KEY], [FERNET_KEY, SHORT_KEY], [NOT_A_KEY.encode()]], ids=stable_repr)
def test_a_refused_encryption_key_is_never_quoted(keys: list[Any]) -> None:
    with pytest.raises(InvalidJob) as refused:
        EncryptedJSON(keys)
    for key in keys:
        shown = key.decode() if isinstance(key, bytes) else key
        assert shown not in str(refused.value) and shown not in repr(refused.value)


def test_a_hand_written_worker_row_with_odd_queues_reads_as_it_is_and_never_stops_stats(engine: Engine) -> None:
    """Queues that are not a JSON array (written by hand) are shown as the
    text they are; workers() and stats() still answer."""
    for worker_id, queues in (("not-json", "q1,q2"), ("object", '{"q": 1}'), ("list", '["q", 7]')):
        worker_row(worker_id=worker_id, queues=queues, process_queues=queues, started_at=0, last_seen=0)(engine)
    shown = {w.worker_id: w.queues for w in Watchdog(engine).workers()}
    assert shown == {"not-json": ("q1,q2",), "object": ('{"q": 1}',), "list": ("q", "7")}
    # Its process queues (revision w0018) read the same way: each queue says where it runs.
    executors = {w.worker_id: w.executors for w in Watchdog(engine).workers()}
    assert executors == {
        "not-json": {"q1,q2": "process"},
        "object": {'{"q": 1}': "process"},
        "list": {"q": "process", "7": "process"},
    }
    assert all(w.gone for w in Watchdog(engine).workers())  # last seen at the epoch
    assert Watchdog(engine).stats().queue("q").workers == 0


def _pauses(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(pauses_table).order_by(pauses_table.c.queue_name)).all())


async def _async_enqueue_in_transaction(aengine: Any, delay: Any) -> Any:
    async with aengine.begin() as conn:
        return await async_enqueue(conn, Job("x", "q"), delay=delay)


async def test_async_api_refuses_bad_input_too(engine: Engine) -> None:
    _seed(engine)
    before = dump_jobs(engine)
    aengine = make_async_engine(engine)
    try:
        awd = AsyncWatchdog(aengine)
        calls: list[tuple[Callable[[], Awaitable[object]], str]] = [
            (lambda: awd.cancel(1, "c"), "job_id"),  # type: ignore[arg-type]
            (lambda: awd.read_settled(0), "limit"),
            (lambda: awd.fail_lane("q", ""), "reason"),
            (lambda: awd.enqueue(Job("x", "q", payload=math.nan)), "payload"),
            (lambda: awd.enqueue(Job("x", "q"), delay=timedelta(0)), "delay"),
            (lambda: awd.enqueue([Job("x", "q"), Job("y", "q", run_at=LATER)], delay=timedelta(seconds=1)), "delay"),
            (lambda: _async_enqueue_in_transaction(aengine, delay=timedelta(seconds=-1)), "delay"),
            (lambda: _async_enqueue_in_transaction(aengine, delay=5), "delay"),
            (lambda: awd.prune(older_than=timedelta(seconds=-1)), "older_than"),
            (lambda: awd.prune(older_than=timedelta(0), outcomes=[]), "outcomes"),
            (lambda: awd.prune(older_than=timedelta(0), batch=10_001), "batch"),
            (lambda: awd.prune(older_than=timedelta(0), include_undated=None), "include_undated"),  # type: ignore[arg-type]
            (lambda: awd.list_jobs(limit=1001), "limit"),
            (lambda: awd.list_jobs(state="gone"), "state"),
            (lambda: awd.pause("q\x00"), "queue"),
            (lambda: awd.pause("q", reason="r" * (PAUSE_REASON_MAX_LENGTH + 1)), "reason"),
            (lambda: awd.resume("q\ud800"), "queue"),
            (lambda: awd.rerun("seed-running", rerun_id="r1"), "job_id"),
            (lambda: awd.rerun("seed-settled", rerun_id=""), "rerun_id"),
        ]
        for call, field in calls:
            with pytest.raises(WatchdogError) as caught:
                await call()
            assert field in str(caught.value)
        with pytest.raises(TypeError, match="AsyncSession"):
            await async_enqueue("nope", Job("x", "q"))  # type: ignore[call-overload]
    finally:
        await aengine.dispose()
    assert dump_jobs(engine) == before


async def test_async_enqueue_of_a_non_job_is_a_type_error(engine: Engine, request: pytest.FixtureRequest) -> None:
    _seed(engine)
    before = dump_jobs(engine)
    aengine = make_async_engine(engine)
    try:
        with pytest.raises(TypeError, match="Job"):
            await AsyncWatchdog(aengine).enqueue([{"job_id": "x", "queue": "q"}])  # type: ignore[list-item]
    finally:
        await aengine.dispose()
    assert dump_jobs(engine) == before


# -- valid input that looks dangerous -----------------------------------------------

NASTY = [
    "'; DROP TABLE watchdog_jobs; --",
    'double "quoted"',
    "back\\slash\\",
    "%s %(job_id)s %% {0} {}",
    "? :name $1 @p",
    "line\nbreak\ttab\rreturn",
    " padded ",
    "NULL",
    "\x01\x1f\x7f",
    "\u202eright-to-left",
    "\x1b]0;retitled\x07\x1b[2J\u061c\u180e\x9b",  # terminal escapes: stored exactly, shown escaped
    "é" * 256,
    "😀" * 256,
    "x" * 256,
]


@pytest.mark.dialect_specific
@pytest.mark.parametrize("text", NASTY, ids=[f"id{i}" for i in range(len(NASTY))])
def test_dangerous_looking_valid_ids_round_trip(engine: Engine, text: str) -> None:
    lane = (text * 2)[:512]
    payload = {text: text, "nul": "a\x00b", "quotes": "'\"`", "big": 2**62, "tiny": -1.5e-300, "deep": [[[]]]}
    wd = Watchdog(engine)
    first = wd.enqueue(Job(text, text, lane=lane, payload=payload, priority=2**63 - 1, max_recoveries=2**31 - 1))
    assert first.status.value == "queued"
    assert (
        wd.enqueue(
            Job(text, text, lane=lane, payload=payload, priority=2**63 - 1, max_recoveries=2**31 - 1)
        ).status.value
        == "duplicate"
    )
    got = present(wd.read(text))
    assert (got.job_id, got.queue, got.lane, got.payload, got.priority, got.max_recoveries) == (
        text,
        text,
        lane,
        payload,
        2**63 - 1,
        2**31 - 1,
    )
    assert present(wd.read_queue_head(text)).job_id == text
    assert wd.cancel(text, text).status is CancelStatus.RECORDED
    assert wd.cancel(text, text).status is CancelStatus.REPLAYED
    assert present(wd.read(text)).cancellation_id == text
    # A handler on that queue: the claim finds it cancelled, the settle keeps it exact.
    settled = Runner(engine, {text: handler}).run_until_idle()
    assert [(j.job_id, j.outcome) for j in settled] == [(text, Outcome.CANCELLED)]
    assert wd.read_settled(1)[0].job_id == text
    assert wd.fail_lane(lane, text).settled == 0


@pytest.mark.dialect_specific
def test_limits_are_inclusive(engine: Engine) -> None:
    """The documented limits are accepted exactly at the edge."""
    wd = Watchdog(engine)
    edge = [
        Job("heavy", "q", payload=HEAVY),
        Job("deep", "q", payload=nested(PAYLOAD_MAX_DEPTH)),
        Job("deep-objects", "q", payload=nested_objects(PAYLOAD_MAX_DEPTH)),
        Job("lowest", "q", priority=-(2**63)),
        Job("highest", "q", priority=2**63 - 1),
    ]
    wd.enqueue(edge)
    assert present(wd.read("heavy")).payload == HEAVY
    assert present(wd.read("deep")).payload == nested(PAYLOAD_MAX_DEPTH)
    assert present(wd.read("deep-objects")).payload == nested_objects(PAYLOAD_MAX_DEPTH)
    assert present(wd.read_queue_head("q")).job_id == "highest"
    assert present(wd.read("lowest")).priority == -(2**63)
    assert wd.read_settled(256) == [] and wd.read_settled(1) == []


@pytest.mark.dialect_specific
def test_failure_reasons_are_bounded_and_nul_free(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("long", "q"), Job("nul", "q")])
    reasons = {"long": "r" * (FAILURE_REASON_MAX_LENGTH * 3), "nul": "before\x00after"}
    Runner(engine, {"q": lambda job: Decision.failed(reasons[job.job_id])}).run_until_idle()
    assert len(present(present(wd.read("long")).failure_reason)) == FAILURE_REASON_MAX_LENGTH
    assert "\x00" not in present(present(wd.read("nul")).failure_reason)


def test_a_bare_outcome_from_a_handler_fails_the_job_clearly(engine: Engine) -> None:
    # Any other value is the job's result (tests/integration/test_results.py);
    # an Outcome (a str enum) is a decision meant, and refused as one.
    Watchdog(engine).enqueue(Job("j", "q"))
    (settled,) = Runner(engine, {"q": lambda job: Outcome.COMPLETED}).run_until_idle()
    assert settled.outcome is Outcome.FAILED and settled.result is None
    assert settled.failure_reason is not None
    assert "not a Decision" in settled.failure_reason and "Outcome.COMPLETED" in settled.failure_reason


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (process_handlers.returns_unencodable, "handler returned lock, which cannot be sent from its process"),
        (process_handlers.returns_nan, "the handler's result: "),
    ],
    ids=["unencodable", "not-json"],
)
def test_a_value_a_handler_returns_from_its_process_that_cannot_be_kept_fails_the_job_clearly(
    engine: Engine, tmp_path: Any, fn: Any, says: str
) -> None:
    """The process executor: what the handler returned crosses a pipe; a
    value that cannot (a lock), or that no JSON result can hold, fails the job
    saying so -- and the runner and its child go on to the next job."""
    Watchdog(engine).enqueue([Job("j", "q", payload={"dir": str(tmp_path), "value": [1]}), Job("k", "ok")])
    worker = Runner(engine, {"q": fn, "ok": process_handlers.done}, executor=ProcessExecutor(processes=1))
    settled = {job.job_id: job for job in worker.run_until_idle()}
    assert settled["j"].outcome is Outcome.FAILED
    assert settled["j"].failure_reason is not None and settled["j"].failure_reason.startswith(says)
    assert settled["k"].outcome is Outcome.COMPLETED


# -- stored values the library cannot decode ----------------------------------------
#
# The docs let producers write rows themselves: anything a column (and its
# CHECK) accepts may be there. A value the library cannot decode reads as
# unknown (listed in JobView.undecodable) and never stops a claim, a settle,
# a recovery or a read of the other jobs.

DEEP = "[" * 1500 + "]" * 1500  # within trace_context's 4,096-character CHECK; a RecursionError to decode
NAN_POLICY = '{"backoff_ms":1000,"factor":NaN,"jitter":0.1,"max_backoff_ms":2000}'
OUT_OF_BOUNDS_POLICY = '{"backoff_ms":1000,"factor":1e9,"jitter":0.1,"max_backoff_ms":2000}'
FAR = 2**62  # milliseconds: past year 9999 by far


@dataclass(frozen=True)
class Stored:
    """``column`` set to ``value`` by hand; it reads as ``field`` = ``unknown``."""

    column: str
    value: Any
    field: str
    unknown: Any = None
    #: The column of a settled job (settled_at's CHECK), not of a queued one.
    settled: bool = False


STORED = {
    "payload-deep": Stored("payload_json", DEEP, "payload"),
    "payload-deeper-than-the-limit": Stored("payload_json", "[" * 65 + "]" * 65, "payload"),
    "payload-not-json": Stored("payload_json", "{'a': 1}", "payload"),
    "payload-nan": Stored("payload_json", '{"a": NaN}', "payload"),
    "payload-huge-int": Stored("payload_json", "9" * 5000, "payload"),
    "payload-empty": Stored("payload_json", "", "payload"),
    "trace-context-deep": Stored("trace_context", DEEP, "trace_context"),
    "trace-context-not-an-object": Stored("trace_context", "[1, 2]", "trace_context"),
    "trace-context-not-json": Stored("trace_context", "traceparent=00-ab", "trace_context"),
    "failure-history-deep": Stored("failure_history", DEEP, "failure_history", ()),
    "failure-history-not-json": Stored("failure_history", "{", "failure_history", ()),
    "failure-history-wrong-shape": Stored("failure_history", '[{"at": "yesterday"}]', "failure_history", ()),
    "failure-history-far-time": Stored(
        "failure_history", f'[{{"at": {FAR}, "attempt": 1, "reason": "r"}}]', "failure_history", ()
    ),
    "retry-policy-deep": Stored("retry_policy", DEEP, "retry", RetryPolicy(max_attempts=3)),
    "retry-policy-nan": Stored("retry_policy", NAN_POLICY, "retry", RetryPolicy(max_attempts=3)),
    "retry-policy-out-of-bounds": Stored("retry_policy", OUT_OF_BOUNDS_POLICY, "retry", RetryPolicy(max_attempts=3)),
    "retry-policy-wrong-shape": Stored("retry_policy", "[]", "retry", RetryPolicy(max_attempts=3)),
    "timeout-far": Stored("timeout_ms", FAR, "timeout"),
    "run-at-far": Stored("run_at", FAR, "run_at"),
    "run-at-before-year-1": Stored("run_at", -FAR, "run_at"),
    "ready-at-far-past": Stored("ready_at", -FAR, "ready_at"),
    "enqueued-at-far": Stored("enqueued_at", FAR, "enqueued_at"),
    "started-at-far": Stored("started_at", FAR, "started_at"),
    "settled-at-far": Stored("settled_at", FAR, "settled_at", settled=True),
}


def _poison(engine: Engine, job_id: str, stored: Stored) -> None:
    """Write ``stored`` into the job's row as a producer may."""
    values: dict[str, Any] = {stored.column: stored.value}
    if stored.column == "retry_policy":
        values["max_attempts"] = 3
    with engine.begin() as conn:
        conn.execute(jobs_table.update().where(jobs_table.c.job_id == job_id).values(**values))


def _settle_by_hand(engine: Engine, job_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            jobs_table.update().where(jobs_table.c.job_id == job_id).values(state="settled", outcome="completed")
        )


@pytest.mark.dialect_specific
@pytest.mark.parametrize("name", list(STORED))
def test_an_undecodable_stored_value_reads_as_unknown_and_never_stops_the_other_jobs(engine: Engine, name: str) -> None:
    stored = STORED[name]
    Watchdog(engine).enqueue(
        [Job("poisoned", "q", payload={"n": 0}), *(Job(f"other-{i}", "q", payload={"n": i}) for i in range(1, 4))]
    )
    Watchdog(engine).enqueue(Job("elsewhere", "other-queue"))
    if stored.settled:
        _settle_by_hand(engine, "poisoned")
    _poison(engine, "poisoned", stored)
    watchdog = Watchdog(engine)

    job = watchdog.read("poisoned")
    assert job is not None
    [unknown] = job.undecodable
    assert (unknown.field, unknown.column) == (stored.field, stored.column)
    assert unknown.reason and len(unknown.reason) <= 200
    if stored.field == "payload":
        assert job.payload is unknown
        assert stored.column in str(unknown)
    else:
        assert getattr(job, stored.field) == stored.unknown
        assert job.payload == {"n": 0}
    assert {j.job_id for j in watchdog.list_jobs()} == {"poisoned", "other-1", "other-2", "other-3", "elsewhere"}
    watchdog.stats()

    ran: list[str] = []
    done = Runner(engine, {"q": lambda j: ran.append(j.job_id), "other-queue": lambda j: None}).run_until_idle()
    others = {"other-1", "other-2", "other-3", "elsewhere"}
    assert others <= {j.job_id for j in done}
    assert others - {"elsewhere"} <= set(ran)
    after = watchdog.read("poisoned")
    assert after is not None and after.state is JobState.SETTLED
    if stored.settled:
        return
    if stored.field == "payload":  # never handed to a handler: failed at once, not retried
        assert "poisoned" not in ran
        assert after.outcome is Outcome.FAILED
        assert after.failure_reason is not None and after.failure_reason.startswith("payload could not be decoded")
    else:
        assert "poisoned" in ran and after.outcome is Outcome.COMPLETED


@pytest.mark.dialect_specific
def test_a_job_with_an_undecodable_payload_cannot_be_rerun_and_nothing_is_written(engine: Engine) -> None:
    Watchdog(engine).enqueue(Job("poisoned", "q"))
    _settle_by_hand(engine, "poisoned")
    _poison(engine, "poisoned", STORED["payload-deep"])
    before = dump_jobs(engine)
    with pytest.raises(InvalidJob) as caught:
        Watchdog(engine).rerun("poisoned", rerun_id="again")
    assert caught.value.field == "job_id" and "payload_json is undecodable" in str(caught.value)
    assert dump_jobs(engine) == before


@pytest.mark.dialect_specific
def test_a_served_runner_with_poisoned_rows_runs_every_other_job(engine: Engine, runners: RunnerDriver) -> None:
    Watchdog(engine).enqueue(
        [Job("bad-trace", "q"), Job("bad-payload", "q"), *(Job(f"j{i}", "other") for i in range(20))]
    )
    _poison(engine, "bad-trace", STORED["trace-context-deep"])
    _poison(engine, "bad-payload", STORED["payload-deep"])
    worker = runners.runner(
        {"q": lambda job: None, "other": lambda job: None}, concurrency=4, poll_interval=timedelta(milliseconds=50)
    )
    watchdog = Watchdog(engine)
    with worker.serving():
        wait_until(
            lambda: all(j.state.value == "settled" for j in watchdog.list_jobs()),
            timeout=30,
            what="every job to settle",
        )
    outcomes = {j.job_id: j.outcome for j in watchdog.list_jobs()}
    assert outcomes.pop("bad-payload") is Outcome.FAILED
    assert set(outcomes.values()) == {Outcome.COMPLETED} and len(outcomes) == 21


@pytest.mark.dialect_specific
def test_recovery_takes_a_poisoned_expired_claim_and_the_others_beside_it(engine: Engine) -> None:
    Watchdog(engine).enqueue([Job("bad", "q", max_recoveries=1), Job("good", "q", max_recoveries=1)])
    _poison(engine, "bad", STORED["trace-context-deep"])
    _poison(engine, "bad", STORED["failure-history-deep"])
    with engine.begin() as conn:  # both claimed by a runner that vanished: their leases ended long ago
        for job_id in ("bad", "good"):
            conn.execute(
                jobs_table.update()
                .where(jobs_table.c.job_id == job_id)
                .values(state="running", claim_token=f"claim_{job_id}", lease_until=1)
            )
    done = Runner(engine, {"q": lambda job: None}).run_until_idle()
    assert sorted((j.job_id, j.outcome, j.recovery_count) for j in done) == [
        ("bad", Outcome.COMPLETED, 1),
        ("good", Outcome.COMPLETED, 1),
    ]


# -- text a producer stored that the library cannot read (SQLite) --------------------
#
# SQLite keeps whatever bytes a producer writes into a text column, UTF-8 or
# not; pysqlite fails the whole fetch on one that is not. On the library's own
# connections such text reads as unknown (U+FFFD for the bytes, the column
# listed in JobView.undecodable), and a claim fails such a job by its key
# ("stored value unreadable: <column>") instead of stopping. PostgreSQL
# refuses text that is not valid in the database's encoding, and so does
# MariaDB in its default strict mode (error 1366, "Incorrect string value").

NOT_UTF8 = "CAST(x'62ff64' AS TEXT)"  # b'b\xffd'
#: The same bytes as the databases that refuse them are given them.
REFUSED_NOT_UTF8 = {
    "postgresql": "convert_from('\\x62ff64'::bytea, 'UTF8')",
    "mysql": "x'62ff64'",
    "mariadb": "x'62ff64'",
}
#: Text columns a producer may write, with what the job needs beside it.
TEXT_COLUMNS = {
    "job_id": {},
    "queue_name": {},
    "lane": {},
    "payload_json": {},
    "cancellation_id": {},
    "failure_reason": {},
    "failure_detail": {},
    "retry_policy": {"max_attempts": "3"},
    "failure_history": {},
    "rerun_of": {},
    "trace_context": {},
}


def _poison_text(engine: Engine, column: str, value: str) -> None:
    extra = "".join(f", {name} = {sql_value}" for name, sql_value in TEXT_COLUMNS[column].items())
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE watchdog_jobs SET {column} = {value}{extra} WHERE job_id = 'poisoned'"))


@pytest.mark.parametrize("column", list(TEXT_COLUMNS))
def test_text_that_is_not_utf8_reads_as_unknown_and_never_stops_the_other_jobs(engine: Engine, column: str) -> None:
    Watchdog(engine).enqueue(
        [Job("poisoned", "q", payload={"n": 0}), *(Job(f"other-{i}", "q", payload={"n": i}) for i in range(1, 4))]
    )
    Watchdog(engine).enqueue(Job("elsewhere", "other-queue"))
    if engine.dialect.name in REFUSED_NOT_UTF8:  # the database refuses the bytes
        with pytest.raises(DBAPIError):
            _poison_text(engine, column, REFUSED_NOT_UTF8[engine.dialect.name])
        return
    _poison_text(engine, column, NOT_UTF8)
    watchdog = Watchdog(engine)
    [poisoned] = [job for job in watchdog.list_jobs() if job.sequence == 1]
    assert [u.column for u in poisoned.undecodable] == [column]
    assert len(watchdog.list_jobs()) == 5
    if column != "job_id":
        read = watchdog.read("poisoned")
        assert read is not None and [u.column for u in read.undecodable] == [column]
    if column == "payload_json":
        assert isinstance(poisoned.payload, Undecodable)
    watchdog.stats()

    ran: list[str] = []
    done = Runner(engine, {"q": lambda j: ran.append(j.job_id), "other-queue": lambda j: None}).run_until_idle()
    others = {"other-1", "other-2", "other-3", "elsewhere"}
    assert others <= {j.job_id for j in done}
    assert {"other-1", "other-2", "other-3"} <= set(ran)
    [after] = [job for job in watchdog.list_jobs() if job.sequence == 1]
    assert "poisoned" not in ran  # never handed to a handler
    if column == "queue_name":  # in no queue a runner serves: still waiting
        assert after.state is JobState.QUEUED
    elif column == "cancellation_id":  # a cancellation was recorded: the claim settles it so
        assert after.outcome is Outcome.CANCELLED
    else:
        assert after.outcome is Outcome.FAILED
        assert after.failure_reason == f"stored value unreadable: {column}"
    assert all(j.state is JobState.SETTLED for j in watchdog.list_jobs() if j.job_id in others)


async def test_text_that_is_not_utf8_never_stops_the_async_api_either(engine: Engine) -> None:
    Watchdog(engine).enqueue([Job("poisoned", "q"), Job("other", "q")])
    if engine.dialect.name in REFUSED_NOT_UTF8:
        with pytest.raises(DBAPIError):
            _poison_text(engine, "payload_json", REFUSED_NOT_UTF8[engine.dialect.name])
        return
    _poison_text(engine, "job_id", NOT_UTF8)
    async_engine = make_async_engine(engine)
    try:
        watchdog = AsyncWatchdog(async_engine)
        assert len(await watchdog.list_jobs()) == 2
        done = await AsyncRunner(async_engine, {"q": lambda job: None}).run_until_idle()
        assert {j.job_id for j in done} >= {"other"}
        jobs = {j.sequence: j for j in await watchdog.list_jobs()}
        assert jobs[1].failure_reason == "stored value unreadable: job_id"
        assert jobs[2].outcome is Outcome.COMPLETED
    finally:
        await async_engine.dispose()


def test_the_tolerant_read_is_the_librarys_own_the_applications_connection_is_unchanged(engine: Engine) -> None:
    """The text factory is set only while the library runs on a connection it
    checked out: the same pooled connection, used by the application, still
    reads text as pysqlite does."""
    Watchdog(engine).enqueue(Job("poisoned", "q"))
    if engine.dialect.name in REFUSED_NOT_UTF8:
        return  # no such text can be stored there (the tests above)
    _poison_text(engine, "failure_reason", NOT_UTF8)
    assert Watchdog(engine).list_jobs()[0].undecodable
    with engine.connect() as conn:
        assert conn.connection.driver_connection.text_factory is str  # type: ignore[union-attr]
        with pytest.raises(DBAPIError, match="Could not decode to UTF-8"):
            conn.execute(text("SELECT failure_reason FROM watchdog_jobs")).all()


@pytest.mark.parametrize("column", ["job_id", "payload_json", "lane", "failure_reason"])
def test_a_blob_in_a_text_column_is_refused_on_sqlite(engine: Engine, column: str) -> None:
    """SQLite's stored-type CHECK (w0010) refuses a BLOB in a text column; on
    PostgreSQL the bytes arrive as the column's own type, text."""
    Watchdog(engine).enqueue([Job("poisoned", "q"), Job("other", "q")])
    if engine.dialect.name == "sqlite":
        with pytest.raises(IntegrityError, match=f"{column}_stored_type"), engine.begin() as conn:
            conn.execute(text(f"UPDATE watchdog_jobs SET {column} = x'7b7d' WHERE job_id = 'poisoned'"))
    else:
        with engine.begin() as conn:
            conn.execute(jobs_table.update().where(jobs_table.c.job_id == "poisoned").values({column: b"{}"}))
    done = Runner(engine, {"q": lambda job: None}).run_until_idle()
    assert "other" in {j.job_id for j in done}
    assert all(isinstance(j.job_id, str) for j in Watchdog(engine).list_jobs())


# == revision w0012: results, progress, dependencies ==================================
#
# Each refusal names the field and writes nothing; the full behaviour is in
# tests/integration/test_results.py, test_progress.py and test_dependencies.py.


@pytest.mark.parametrize(
    ("returned", "words"),
    [
        ("x" * (1024 * 1024 + 1), "must be at most 1048576 bytes of JSON"),
        ({"when": datetime.datetime(2025, 1, 1)}, "datetime is not a JSON type"),
        ({1: "int key"}, "object keys must be str"),
    ],
    ids=["too-large", "not-json", "int-key"],
)
def test_a_result_that_cannot_be_kept_fails_the_job_and_stores_none_of_it(
    engine: Engine, returned: Any, words: str
) -> None:
    Watchdog(engine).enqueue(Job("j", "q"))
    (settled,) = Runner(engine, {"q": lambda job: returned}).run_until_idle()
    assert settled.outcome is Outcome.FAILED and settled.result is None
    assert present(settled.failure_reason).startswith("the handler's result: ") and words in present(
        settled.failure_reason
    )


@pytest.mark.parametrize(
    ("jobs", "words"),
    [
        (lambda: [Job("c", "q", after=["unknown"])], "no such job"),
        (lambda: [Job("c", "q", after=["cancelled"])], "already ended cancelled"),
        # A cycle needs a job naming one enqueued after it: refused by that order.
        (lambda: [Job("c1", "q", after=["c2"]), Job("c2", "q", after=["c1"])], "comes later in this call"),
    ],
    ids=["unknown-parent", "cancelled-parent", "cycle"],
)
def test_after_naming_what_cannot_be_waited_for_is_refused_before_anything_is_written(
    engine: Engine, jobs: Callable[[], list[Job]], words: str
) -> None:
    wd = Watchdog(engine)
    wd.enqueue(Job("cancelled", "q"))
    wd.cancel("cancelled", "c-1")
    Runner(engine, {"q": lambda job: None}).run_until_idle()
    before = dump_jobs(engine)
    with pytest.raises(InvalidJob, match=words) as refused:
        wd.enqueue(jobs())
    assert refused.value.field == "after" and dump_jobs(engine) == before
    with pytest.raises(InvalidJob, match="cannot wait for itself"):
        Job("self", "q", after=["self"])


def test_progress_out_of_range_or_without_a_claim_writes_nothing(engine: Engine) -> None:
    from sqlalchemy_watchdog import ProgressStatus

    wd = Watchdog(engine)
    wd.enqueue(Job("j", "q"))
    answers: list[object] = []

    def handle(job: Any) -> None:
        for fraction in (1.01, -0.5, math.nan):
            with pytest.raises(InvalidJob, match="fraction"):
                job.progress(fraction)
        wd.fail_lane(job.lane, "gone")  # the claim is lost
        answers.append(job.progress(0.5))

    Runner(engine, {"q": handle}).run_until_idle()
    assert answers == [ProgressStatus.LOST]
    assert present(wd.read("j")).progress is None
