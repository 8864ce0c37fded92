"""Helpers for your own test suite: what did my code enqueue, and run it.

::

    from sqlalchemy_watchdog.testing import assert_enqueued, drain

    def test_placing_an_order_confirms_it(engine):
        with Session(engine) as session:
            place_order(session, order_id=42)          # your code: enqueue(session, ...)
            assert_enqueued(session, queue="emails", payload={"order_id": 42})
            session.commit()
        [job] = drain(engine, {"emails": send_confirmation})
        assert job.outcome is Outcome.COMPLETED

* :func:`enqueued_jobs`, :func:`assert_enqueued` and :func:`assert_not_enqueued`
  read the ``watchdog_jobs`` table through a ``Session`` (inside its
  uncommitted transaction, after flushing its pending objects), a
  ``Connection`` (inside its transaction) or an ``Engine`` (a connection of
  their own). They match jobs in every state: a job that already ran was
  enqueued too; pass ``state=`` to narrow.
* :func:`drain` runs the jobs with a :class:`~sqlalchemy_watchdog.Runner` until
  nothing is left to do and returns the settled jobs; ``advance_time=True``
  also plays delayed jobs (a future ``run_at``, an enqueue's ``delay``, a
  retry's backoff, a snooze) at once, without waiting, and goes on while
  jobs ``waiting`` for their parents can still be released.
* The ``*_async`` twins take an ``AsyncSession``, ``AsyncConnection`` or
  ``AsyncEngine``.
* :class:`RunnerFactory` is what the pytest plugin's ``watchdog_runner``
  fixture returns (see :mod:`sqlalchemy_watchdog.pytest_plugin`).

A payload is matched as a subset: ``payload={"order_id": 42}`` matches a job
whose payload is ``{"order_id": 42, "card": "visa"}``. Dicts are compared
key by key, recursively; lists and scalars must be equal (``True`` is not
``1``). :data:`ANY` (``unittest.mock.ANY``) matches anything, also inside a
payload: ``payload={"order_id": ANY}``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from unittest.mock import ANY

from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from . import store
from .asyncio import AsyncRunner
from .core.handlers import RunningJob
from .errors import InvalidJob
from .gateway import AsyncGateway, SyncGateway
from .jobs import JOB_ID_MAX_LENGTH, QUEUE_MAX_LENGTH, JobState, JobView, check_int, check_text
from .model import WatchdogJob
from .records import TickStatus
from .runner import Runner

__all__ = [
    "ANY",
    "enqueued_jobs",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "make_due",
    "enqueued_jobs_async",
    "assert_enqueued_async",
    "assert_not_enqueued_async",
    "drain_async",
    "make_due_async",
    "RunnerFactory",
]

#: Rows per read of :func:`enqueued_jobs` (the store's largest page).
_PAGE = store.LIST_LIMIT_MAX
#: Jobs listed in an assertion's message.
_SHOWN = 20
#: Characters of a payload shown in an assertion's message.
_PAYLOAD_SHOWN = 200

Target = Session | Connection | Engine
AsyncTarget = AsyncSession | AsyncConnection | AsyncEngine


# -- reading what was enqueued ----------------------------------------------------


@dataclass(frozen=True)
class _Filter:
    """What a read or an assertion looks for, checked once."""

    queue: str | None
    job_id: str | None
    state: JobState | None
    payload: Any  # ANY: any payload

    @classmethod
    def of(cls, queue: object, job_id: object, state: object, payload: Any = ANY) -> _Filter:
        return cls(
            None if queue is None else check_text("queue", queue, QUEUE_MAX_LENGTH),
            None if job_id is None else check_text("job_id", job_id, JOB_ID_MAX_LENGTH),
            None if state is None else _state(state),
            payload,
        )

    def matches(self, job: JobView) -> bool:
        return (
            (self.queue is None or job.queue == self.queue)
            and (self.job_id is None or job.job_id == self.job_id)
            and (self.state is None or job.state is self.state)
            and _contains(job.payload, self.payload)
        )

    def describe(self) -> str:
        parts = [f"{name}={value!r}" for name, value in (("queue", self.queue), ("job_id", self.job_id)) if value]
        if self.state is not None:
            parts.append(f"state={self.state.value!r}")
        if self.payload is not ANY:
            parts.append(f"payload containing {self.payload!r}")
        return ", ".join(parts) or "(any job)"


def _state(value: object) -> JobState:
    try:
        return JobState(value)
    except ValueError:
        known = ", ".join(state.value for state in JobState)
        raise InvalidJob("state", f"{value!r} is not a known JobState (known: {known})") from None


def _contains(actual: Any, expected: Any) -> bool:
    """Whether ``actual`` (a stored payload) contains ``expected``: dicts as
    subsets, recursively; anything else equal (see :func:`_equal`)."""
    if expected is ANY:
        return True
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and _contains(actual[key], value) for key, value in expected.items()
        )
    return _equal(actual, expected)


def _equal(actual: Any, expected: Any) -> bool:
    """JSON equality: tuples equal lists, a bool equals only a bool, ANY anything."""
    if expected is ANY:
        return True
    if isinstance(expected, Mapping):
        return (
            isinstance(actual, Mapping)
            and actual.keys() == expected.keys()
            and all(_equal(actual[key], value) for key, value in expected.items())
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_equal(a, e) for a, e in zip(actual, expected))
        )
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is type(expected) and actual == expected
    return bool(actual == expected)


def _read(conn: Connection, wanted: _Filter) -> list[JobView]:
    """The jobs ``wanted`` names by queue, job_id and state, in admission order."""
    if wanted.job_id is not None:
        job = store.read(conn, wanted.job_id)
        return [job] if job is not None and wanted.matches(job) else []
    jobs: list[JobView] = []
    after = 0
    while True:
        page = store.list_jobs(conn, queue=wanted.queue, state=wanted.state, limit=_PAGE, after_sequence=after)
        jobs.extend(page)
        if len(page) < _PAGE:
            return jobs
        after = page[-1].sequence


def _first_jobs(conn: Connection) -> list[JobView]:
    """The first jobs of the table, for a failure message (one more than shown)."""
    return store.list_jobs(conn, limit=_SHOWN + 1)


def _on_connection(target: Target, fn: Callable[[Connection], Any]) -> Any:
    """``fn(conn)`` on the connection ``target`` stands for: a Session's own
    (flushed first, inside its transaction), a Connection itself, or a new
    connection of an Engine."""
    if isinstance(target, Session):
        target.flush()  # the pending objects -- and jobs enqueued through them -- are visible
        return fn(target.connection(bind_arguments={"mapper": WatchdogJob}))
    if isinstance(target, Connection):
        return fn(target)
    if isinstance(target, Engine):
        with target.connect() as conn:
            return fn(conn)
    if isinstance(target, (AsyncSession, AsyncConnection, AsyncEngine)):
        raise TypeError(
            f"expected a Session, Connection or Engine, not {type(target).__name__}"
            " (use the *_async helpers of sqlalchemy_watchdog.testing)"
        )
    raise TypeError(f"expected a Session, Connection or Engine, not {type(target).__name__}")


async def _on_async_connection(target: AsyncTarget, fn: Callable[[Connection], Any]) -> Any:
    """:func:`_on_connection` for the asyncio types, through ``run_sync``."""
    if isinstance(target, AsyncSession):
        return await target.run_sync(lambda session: _on_connection(session, fn))
    if isinstance(target, AsyncConnection):
        return await target.run_sync(fn)
    if isinstance(target, AsyncEngine):
        async with target.connect() as conn:
            return await conn.run_sync(fn)
    raise TypeError(
        f"expected an AsyncSession, AsyncConnection or AsyncEngine, not {type(target).__name__}"
        + (" (use the helpers without _async)" if isinstance(target, (Session, Connection, Engine)) else "")
    )


def _listing(jobs: list[JobView], limit: int = _SHOWN) -> str:
    if not jobs:
        return "  (none)"
    lines = []
    for job in jobs[:limit]:
        state = job.state.value if job.outcome is None else f"{job.state.value} ({job.outcome.value})"
        payload = json.dumps(job.payload, sort_keys=True, ensure_ascii=False, default=str)
        if len(payload) > _PAYLOAD_SHOWN:
            payload = payload[: _PAYLOAD_SHOWN - 3] + "..."
        lines.append(f"  - {job.job_id}  queue={job.queue}  state={state}  payload={payload}")
    if len(jobs) > limit:
        lines.append("  - ... and more")
    return "\n".join(lines)


def _check_count(count: object) -> int | None:
    if count is None:
        return None
    return check_int("count", count, 0, 2**63 - 1)


@dataclass(frozen=True)
class _Found:
    """What an assertion read in one go: the matches, and the table's first jobs."""

    matches: list[JobView]
    first: list[JobView]


def _find(wanted: _Filter) -> Callable[[Connection], _Found]:
    def find(conn: Connection) -> _Found:
        matches = [job for job in _read(conn, wanted) if wanted.matches(job)]
        return _Found(matches, _first_jobs(conn))

    return find


def _judge_enqueued(found: _Found, wanted: _Filter, count: int | None) -> list[JobView]:
    __tracebackhide__ = True  # pytest: the failure is the caller's line
    matches = found.matches
    if (count is None and matches) or len(matches) == count:
        return matches
    expected = "a job" if count is None else f"{count} job(s)"
    found_text = f"found {len(matches)}:\n{_listing(matches)}" if matches else "found none"
    raise AssertionError(
        f"expected {expected} matching {wanted.describe()}; {found_text}\n"
        f"jobs enqueued (any queue, admission order):\n{_listing(found.first)}"
    )


def _judge_not_enqueued(found: _Found, wanted: _Filter) -> None:
    __tracebackhide__ = True
    if found.matches:
        raise AssertionError(
            f"expected no job matching {wanted.describe()}; found {len(found.matches)}:\n{_listing(found.matches)}"
        )


def enqueued_jobs(
    target: Target,
    *,
    queue: str | None = None,
    job_id: str | None = None,
    state: JobState | str | None = None,
) -> list[JobView]:
    """The jobs ``target`` sees, in admission order, of every state unless
    ``state`` is given (``"delayed"``, ``"queued"``, ``"running"``,
    ``"settled"`` or a :class:`~sqlalchemy_watchdog.JobState`).

    :param target: a ``Session`` (read inside its transaction, after a
        ``flush()``: jobs it enqueued but did not commit are there), a
        ``Connection`` (inside its transaction) or an ``Engine`` (a
        connection of its own: committed jobs only).
    :raises InvalidJob: a filter is malformed (naming it); nothing is read.
    """
    wanted = _Filter.of(queue, job_id, state)
    jobs: list[JobView] = _on_connection(target, lambda conn: _read(conn, wanted))
    return jobs


def assert_enqueued(
    target: Target,
    *,
    queue: str | None = None,
    job_id: str | None = None,
    payload: Any = ANY,
    state: JobState | str | None = None,
    count: int | None = None,
) -> list[JobView]:
    """Assert that ``target`` sees a job matching every filter given (exactly
    ``count`` of them when ``count`` is given); returns the matching jobs.

    ``payload`` matches a job whose payload contains it (see the module's
    docstring). On failure the ``AssertionError`` lists the matching jobs and
    the first jobs of the table -- job_id, queue, state and payload -- so the
    test output shows what *was* enqueued. ``target`` is as for
    :func:`enqueued_jobs`.
    """
    __tracebackhide__ = True
    wanted = _Filter.of(queue, job_id, state, payload)
    checked = _check_count(count)
    return _judge_enqueued(_on_connection(target, _find(wanted)), wanted, checked)


def assert_not_enqueued(
    target: Target,
    *,
    queue: str | None = None,
    job_id: str | None = None,
    payload: Any = ANY,
    state: JobState | str | None = None,
) -> None:
    """Assert that ``target`` sees no job matching every filter given (no
    filter: no job at all); the ``AssertionError`` lists those it found."""
    __tracebackhide__ = True
    wanted = _Filter.of(queue, job_id, state, payload)
    _judge_not_enqueued(_on_connection(target, _find(wanted)), wanted)


async def enqueued_jobs_async(
    target: AsyncTarget,
    *,
    queue: str | None = None,
    job_id: str | None = None,
    state: JobState | str | None = None,
) -> list[JobView]:
    """:func:`enqueued_jobs` for an ``AsyncSession`` (inside its
    transaction, flushed first), ``AsyncConnection`` or ``AsyncEngine``."""
    wanted = _Filter.of(queue, job_id, state)
    jobs: list[JobView] = await _on_async_connection(target, lambda conn: _read(conn, wanted))
    return jobs


async def assert_enqueued_async(
    target: AsyncTarget,
    *,
    queue: str | None = None,
    job_id: str | None = None,
    payload: Any = ANY,
    state: JobState | str | None = None,
    count: int | None = None,
) -> list[JobView]:
    """:func:`assert_enqueued` for the asyncio types."""
    __tracebackhide__ = True
    wanted = _Filter.of(queue, job_id, state, payload)
    checked = _check_count(count)
    return _judge_enqueued(await _on_async_connection(target, _find(wanted)), wanted, checked)


async def assert_not_enqueued_async(
    target: AsyncTarget,
    *,
    queue: str | None = None,
    job_id: str | None = None,
    payload: Any = ANY,
    state: JobState | str | None = None,
) -> None:
    """:func:`assert_not_enqueued` for the asyncio types."""
    __tracebackhide__ = True
    wanted = _Filter.of(queue, job_id, state, payload)
    _judge_not_enqueued(await _on_async_connection(target, _find(wanted)), wanted)


# -- running them -------------------------------------------------------------------


def _check_drain(advance_time: object, max_jobs: object) -> int:
    if not isinstance(advance_time, bool):
        raise InvalidJob("advance_time", f"must be a bool, not {type(advance_time).__name__}")
    return check_int("max_jobs", max_jobs, 1, 2**31 - 1)


def _queue_names(queues: Iterable[str] | None) -> list[str] | None:
    if queues is None:
        return None
    if isinstance(queues, str):
        raise InvalidJob("queues", "must be an iterable of queue names, not one string")
    return [check_text("queue", queue, QUEUE_MAX_LENGTH) for queue in queues]


def make_due(engine: Engine, *, queues: Iterable[str] | None = None) -> int:
    """FOR TESTS ONLY: make every delayed job of ``queues`` (None: of every
    queue) whose time has not come due now, by the database clock -- a
    future ``run_at``, an enqueue's ``delay``, a retry's backoff, a snooze --
    in a transaction of its own. A runner's next tick promotes them to
    ``queued``. Returns how many jobs were changed. (Their ``ready_at`` is
    rewritten: never run this on a production database.)
    """
    if not isinstance(engine, Engine):
        raise TypeError(f"make_due takes an Engine, not {type(engine).__name__} (use make_due_async)")
    names = _queue_names(queues)
    return SyncGateway(engine).run(store.make_due, names)


async def make_due_async(engine: AsyncEngine, *, queues: Iterable[str] | None = None) -> int:
    """:func:`make_due` on an ``AsyncEngine``."""
    if not isinstance(engine, AsyncEngine):
        raise TypeError(f"make_due_async takes an AsyncEngine, not {type(engine).__name__} (use make_due)")
    names = _queue_names(queues)
    return await AsyncGateway(engine).run(store.make_due, names)


#: Passes in a row in which a drain with ``advance_time`` finds nothing to
#: run while jobs of its queues still wait (each pass ticks, so a job that
#: came due is promoted by the next): then it raises, naming them.
DRAIN_IDLE_PASSES = 100

#: Seconds a drain with ``advance_time`` waits, at most, for parents that
#: are ``running`` elsewhere (another runner holds them) before it raises:
#: such a parent settles on its own, so the passes that wait for it pause
#: :data:`DRAIN_PARENT_POLL` seconds each and do not count towards
#: :data:`DRAIN_IDLE_PASSES`.
DRAIN_RUNNING_PARENT_WAIT = 30.0
#: Seconds between the passes of a drain that waits for a running parent.
DRAIN_PARENT_POLL = 0.01


@dataclass(frozen=True)
class _Left:
    """What a drain names of the jobs left, (job_id, why it has not run),
    and whether a parent they wait for is running elsewhere."""

    jobs: list[tuple[str, str]]
    parents_running: bool

    def __bool__(self) -> bool:
        return bool(self.jobs)


def _left(ready: list[tuple[str, str]], waiting: Mapping[str, list[tuple[str, str | None, str | None]]]) -> _Left:
    """The jobs a drain still waits for: those delayed or queued, else the
    ``waiting`` ones, each named with the parents it still waits for; and
    whether one of those parents is running (another runner holds it)."""
    if ready:
        return _Left(ready, False)
    named = [(job_id, "waiting for " + "; ".join(map(_parent, parents))) for job_id, parents in waiting.items()]
    running = any(state == JobState.RUNNING.value for parents in waiting.values() for _, _, state in parents)
    return _Left(named, running)


def _parent(parent: tuple[str, str | None, str | None]) -> str:
    job_id, queue, state = parent
    return f"{job_id}: gone" if queue is None else f"{job_id}: {state} in queue {queue!r}"


def _waiting(engine: Engine, queues: Iterable[str]) -> _Left:
    """Jobs of ``queues`` still waiting to run (delayed, or queued unpaused),
    else those waiting for their parents.

    The jobs waiting for parents are read first, the ready ones after, in
    two statements: a job that another runner's settle of its last parent
    releases (``waiting`` to ``queued``) between them is then seen in one
    of the two -- waiting if the release commits after the first read,
    queued if before the second. Read the other way round, a release
    between the reads hid the job from both and the drain ended without
    running it."""
    gateway = SyncGateway(engine)
    names = list(queues)
    waiting = gateway.perform(gateway.writing, "drain", store.waiting_for, names)
    return _left(gateway.perform(gateway.writing, "drain", store.waiting_jobs, names), waiting)


async def _waiting_async(engine: AsyncEngine, queues: Iterable[str]) -> _Left:
    """:func:`_waiting` on an ``AsyncEngine`` (the same order of reads)."""
    gateway = AsyncGateway(engine)
    names = list(queues)
    waiting = await gateway.run(store.waiting_for, names)
    return _left(await gateway.run(store.waiting_jobs, names), waiting)


class _IdlePasses:
    """The idle passes of one drain: :meth:`pause` says whether to go on
    (pausing first when a parent runs elsewhere) or raise."""

    def __init__(self) -> None:
        self.count = 0
        self.parents_running_since: float | None = None

    def reset(self) -> None:
        self.count, self.parents_running_since = 0, None

    def pause(self, left: _Left) -> float | None:
        """None: raise now; else seconds to sleep before the next pass."""
        if left.parents_running:
            now = time.monotonic()
            if self.parents_running_since is None:
                self.parents_running_since = now
            if now - self.parents_running_since < DRAIN_RUNNING_PARENT_WAIT:
                return DRAIN_PARENT_POLL
        self.count += 1
        return None if self.count >= DRAIN_IDLE_PASSES else 0.0


def _still_waiting(left: _Left) -> AssertionError:
    shown = ", ".join(f"{job_id} ({why})" for job_id, why in left.jobs)
    return AssertionError(
        f"drain(advance_time=True): jobs still wait to run after {DRAIN_IDLE_PASSES} passes that ran nothing: "
        f"{shown}{', ...' if len(left.jobs) >= 10 else ''}"
    )


def drain(
    engine: Engine,
    handlers: Mapping[str, Callable[[RunningJob], Any]] | None = None,
    *,
    queues: Iterable[str] | None = None,
    advance_time: bool = False,
    max_jobs: int = 10_000,
    **settings: Any,
) -> list[JobView]:
    """Run the jobs of ``queues`` until none is left to run now; returns the
    jobs settled meanwhile, in the order they settled.

    A :class:`~sqlalchemy_watchdog.Runner` on ``engine`` ticks in this
    thread as ``run_until_idle()`` does -- recovering disappeared claims,
    promoting delayed jobs whose time has come, running one job per tick --
    so a job retried with no wait (``Decision.retry(after=timedelta(0))``)
    runs again in the same drain, and a cancelled job settles ``cancelled``.

    :param handlers: ``{queue: handler}``; None: the handlers registered
        with :func:`~sqlalchemy_watchdog.handler`, as for ``Runner``.
    :param queues: the queues to run (default: every queue with a handler).
    :param advance_time: when nothing is ready, make the delayed jobs of
        those queues due at once (:func:`make_due`: a future ``run_at``, an
        enqueue's ``delay``, a retry's backoff, a snooze) and go on, until
        no job of those queues is delayed, ready (queued in a queue that is
        not paused) or ``waiting`` for its parents (``Job(after=[...])``) --
        a whole retry schedule, or a whole workflow whose steps wait for
        delayed parents, plays out without waiting. If jobs still wait after
        :data:`DRAIN_IDLE_PASSES` passes in a row that ran nothing, it raises
        ``AssertionError`` naming them, a waiting job with each parent it
        still waits for (its state and queue: a parent in a queue the drain
        does not run, or a paused one, never settles here). A parent that
        another runner is running settles on its own: the drain waits for
        it, up to :data:`DRAIN_RUNNING_PARENT_WAIT` seconds. False (the
        default): delayed jobs whose time has not come stay delayed, and so
        do the jobs waiting for them.
    :param max_jobs: stop after this many ticks that did something (a job
        settled, retried, snoozed or recovered), whatever is left -- a bound
        for a handler that snoozes forever.
    :param settings: further keyword arguments of ``Runner`` (``retry``,
        ``codec``, ``timeout``, ``max_recoveries``, ``clock``, ...).

    Commit the jobs first: the runner works on connections of its own.
    """
    budget = _check_drain(advance_time, max_jobs)
    runner = Runner(engine, handlers, queues=queues, **settings)
    settled: list[JobView] = []
    busy, idle = 0, _IdlePasses()
    while busy < budget:
        result = runner.tick()
        if result.status is TickStatus.IDLE:
            if not advance_time:
                break
            if make_due(engine, queues=runner.queues) > 0:
                continue
            # A delayed job may have come due between the tick and make_due
            # (which then changed nothing): the next tick promotes it.
            left = _waiting(engine, runner.queues)
            if not left:
                break
            if (pause := idle.pause(left)) is None:
                raise _still_waiting(left)
            time.sleep(pause)
            continue
        idle.reset()
        if result.status is TickStatus.LIVENESS_UNKNOWN:
            break
        busy += 1
        if result.job is not None and result.job.state is JobState.SETTLED:
            settled.append(result.job)
    return settled


async def drain_async(
    engine: AsyncEngine,
    handlers: Mapping[str, Callable[[RunningJob], Any]] | None = None,
    *,
    queues: Iterable[str] | None = None,
    advance_time: bool = False,
    max_jobs: int = 10_000,
    **settings: Any,
) -> list[JobView]:
    """:func:`drain` with an :class:`~sqlalchemy_watchdog.asyncio.AsyncRunner`
    on an ``AsyncEngine`` (coroutine handlers run on the running loop)."""
    budget = _check_drain(advance_time, max_jobs)
    runner = AsyncRunner(engine, handlers, queues=queues, **settings)
    settled: list[JobView] = []
    busy, idle = 0, _IdlePasses()
    while busy < budget:
        result = await runner.tick()
        if result.status is TickStatus.IDLE:
            if not advance_time:
                break
            if await make_due_async(engine, queues=runner.queues) > 0:
                continue
            left = await _waiting_async(engine, runner.queues)
            if not left:
                break
            if (pause := idle.pause(left)) is None:
                raise _still_waiting(left)
            await asyncio.sleep(pause)
            continue
        idle.reset()
        if result.status is TickStatus.LIVENESS_UNKNOWN:
            break
        busy += 1
        if result.job is not None and result.job.state is JobState.SETTLED:
            settled.append(result.job)
    return settled


# -- runners for the pytest plugin --------------------------------------------------


class RunnerFactory:
    """Builds :class:`~sqlalchemy_watchdog.Runner` objects on one engine and
    stops them all at :meth:`close` -- the pytest plugin's
    ``watchdog_runner`` fixture, closed at the end of the test.

    ``factory(handlers, **settings)`` builds a runner (the arguments of
    ``Runner``) for ``tick()`` / ``run_until_idle()`` in the test's thread;
    ``factory.serve(handlers, **settings)`` builds one and runs its
    ``run_forever()`` in a background thread, as a deployed worker would.
    """

    def __init__(self, engine: Engine) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(f"RunnerFactory takes an Engine, not {type(engine).__name__}")
        self.engine = engine
        self.runners: list[Runner] = []
        self._served: list[tuple[Runner, threading.Thread, list[BaseException]]] = []

    def __call__(self, handlers: Mapping[str, Callable[[RunningJob], Any]] | None = None, **settings: Any) -> Runner:
        """A new runner on the engine (``handlers`` None: the registered ones)."""
        runner = Runner(self.engine, handlers, **settings)
        self.runners.append(runner)
        return runner

    def serve(self, handlers: Mapping[str, Callable[[RunningJob], Any]] | None = None, **settings: Any) -> Runner:
        """A new runner serving in a background thread until :meth:`close`
        (or its own ``stop()``)."""
        runner = self(handlers, **settings)
        errors: list[BaseException] = []

        def serve() -> None:
            try:
                runner.run_forever(install_signal_handlers=False)
            except BaseException as error:  # reported by close()
                errors.append(error)

        thread = threading.Thread(target=serve, name=f"watchdog-test-runner-{len(self._served)}", daemon=True)
        self._served.append((runner, thread, errors))
        thread.start()
        return runner

    def close(self, timeout: float = 60.0) -> None:
        """Stop every runner and wait for the served ones to return.

        :raises AssertionError: a served runner did not stop within
            ``timeout`` seconds, or its ``run_forever()`` raised.
        """
        for runner in self.runners:
            runner.stop()
        problems: list[str] = []
        for runner, thread, errors in self._served:
            thread.join(timeout)
            if thread.is_alive():
                problems.append(f"a runner serving {', '.join(runner.queues)} did not stop within {timeout:.0f}s")
            problems.extend(f"a runner's run_forever() raised {error!r}" for error in errors)
        self._served.clear()
        self.runners.clear()
        if problems:
            raise AssertionError("; ".join(problems))
