"""Waiting for a job's result: polling, and on PostgreSQL LISTEN/NOTIFY.

Internal module: the public API is :meth:`Watchdog.result
<sqlalchemy_watchdog.Watchdog.result>` and :meth:`~sqlalchemy_watchdog.Watchdog.wait`
(and their :class:`~sqlalchemy_watchdog.asyncio.AsyncWatchdog` twins).

A waiter reads the job, and while it is not settled waits -- at most
``poll_interval`` -- for a sign that it may have settled, then reads it
again, until it is settled, unknown, or the timeout ends. The reads decide;
a sign only shortens the wait.

On PostgreSQL the sign is a notification on :data:`RESULT_CHANNEL` whose
payload is the job_id, sent by a row trigger on ``watchdog_jobs``
(:data:`NOTIFY_SETTLED_TRIGGER_SQL`) when a *watched* row becomes
``settled``, whichever statement settles it (a settle, a claim-time
cancellation, ``fail_lane``, recovery). A notifying transaction's commit
takes a database-wide lock (see :mod:`sqlalchemy_watchdog.wakeups`), and a
row trigger costs every settle, so only jobs someone waits for notify: a
waiter LISTENs, then marks the job ``watched`` (:data:`WATCH_SQL`, one
autocommitted UPDATE of a job not settled yet), then reads it. A settle
that committed before the mark is found by that read; one after it sees the
mark (the settle's UPDATE waits for the mark's row lock and re-reads the
row) and notifies. A job stays watched once marked: a later waiter's mark
changes nothing, and a job whose waiter left costs one needless
notification when it settles, never a missed one.

Listening needs one PostgreSQL session for the whole wait: a connection
that is not proven to be one (a transaction-mode pooler such as PgBouncer,
see docs/howto/deployment.md) or a driver that delivers no notifications
(anything but psycopg, psycopg2 and asyncpg) polls. SQLite always polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from .jobs import JobResult, ResultStatus, check_duration
from .wakeups import WakeupMode, connect_and_prove, connect_and_prove_async, polling_reason

__all__ = [
    "RESULT_CHANNEL",
    "WATCH_SQL",
    "NOTIFY_SETTLED_FUNCTION_SQL",
    "NOTIFY_SETTLED_TRIGGER_SQL",
    "DROP_NOTIFY_SETTLED_SQL",
    "wait_for",
    "wait_for_async",
]

log = logging.getLogger("sqlalchemy_watchdog.results")

#: The channel result waiters LISTEN on; each notification's payload is a job_id.
RESULT_CHANNEL = "watchdog_results"
NOTIFY_SETTLED_FUNCTION_SQL = f"""\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_settled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{RESULT_CHANNEL}', NEW.job_id);
    RETURN NULL;
END
$$"""
NOTIFY_SETTLED_TRIGGER_SQL = (
    "CREATE TRIGGER watchdog_jobs_settled AFTER UPDATE OF state ON watchdog_jobs FOR EACH ROW "
    "WHEN (NEW.state = 'settled' AND OLD.state <> 'settled' AND NEW.watched = 1) "
    "EXECUTE FUNCTION watchdog_jobs_notify_settled()"
)
DROP_NOTIFY_SETTLED_SQL = "DROP FUNCTION IF EXISTS watchdog_jobs_notify_settled() CASCADE"

#: A waiter's mark (revision w0013): the job's settlement notifies from now on.
WATCH_SQL = "UPDATE watchdog_jobs SET watched = 1 WHERE job_id = %s AND state <> 'settled' AND watched IS NULL"

#: The default ``poll_interval`` of a wait.
POLL_INTERVAL_S = 1.0


def check_wait(timeout: object, poll_interval: object) -> tuple[float, float]:
    """``timeout`` (zero or more) and ``poll_interval`` (positive) in seconds,
    or a clear error naming the argument."""
    limit = check_duration("timeout", timeout, low=timedelta(0)).total_seconds()
    poll = check_duration("poll_interval", poll_interval).total_seconds()
    return limit, poll


def _settled_or_gone(result: JobResult) -> bool:
    return result.status.final or result.status is ResultStatus.UNKNOWN


def _listening_reason(dialect_name: str, driver: str) -> str | None:
    return polling_reason(WakeupMode.AUTO, dialect_name, driver)


class _SyncListener:
    """A detached PostgreSQL session listening on :data:`RESULT_CHANNEL`
    that has marked the job it waits for watched."""

    def __init__(self, driver_conn: Any, driver: str) -> None:
        self.conn = driver_conn
        self.driver = driver

    @classmethod
    def open(cls, engine: Engine, job_id: str) -> _SyncListener | None:
        reason = _listening_reason(engine.dialect.name, engine.dialect.driver)
        if reason is not None:
            return None
        driver_conn, proof = connect_and_prove(engine)
        if driver_conn is None:
            if proof is not None:
                log.debug("wait: polling, the connection is not one PostgreSQL session (%s)", proof.reason)
            return None
        listener = cls(driver_conn, engine.dialect.driver)
        try:
            listener._run(f"LISTEN {RESULT_CHANNEL}")
            listener._run(WATCH_SQL, (job_id,))
        except Exception:
            listener.close()
            raise
        return listener

    def _run(self, statement: str, params: tuple[Any, ...] | None = None) -> None:
        if self.driver == "psycopg2":
            with self.conn.cursor() as cursor:
                cursor.execute(statement, params)
        else:
            self.conn.execute(statement, params)

    def wait(self, job_id: str, seconds: float) -> None:
        """Wait until ``job_id``'s notification comes or ``seconds`` pass."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.driver == "psycopg2":
                ready, _, _ = select.select([self.conn.fileno()], [], [], left)
                if ready:
                    self.conn.poll()
                payloads = [note.payload for note in self.conn.notifies]
                self.conn.notifies.clear()
            else:
                payloads = [note.payload for note in self.conn.notifies(timeout=left, stop_after=1)]
            if job_id in payloads:
                return

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()  # the LISTEN ends with the session


def wait_for(read: Callable[[], JobResult], engine: Engine, job_id: str, timeout_s: float, poll_s: float) -> JobResult:
    """Read ``job_id``'s result until it is final or unknown, or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    result = read()
    if _settled_or_gone(result) or timeout_s <= 0:
        return result if _settled_or_gone(result) else JobResult(job_id, ResultStatus.TIMED_OUT)
    listener = _SyncListener.open(engine, job_id)
    try:
        while True:
            result = read()  # again: after LISTEN and the mark, so no settle goes unseen
            if _settled_or_gone(result):
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                return JobResult(job_id, ResultStatus.TIMED_OUT)
            pause = min(poll_s, left)
            if listener is None:
                time.sleep(pause)
            else:
                listener.wait(job_id, pause)
    finally:
        if listener is not None:
            listener.close()


class _AsyncListener:
    """:class:`_SyncListener` on an ``AsyncEngine`` (psycopg or asyncpg)."""

    def __init__(self, engine: AsyncEngine, driver_conn: Any) -> None:
        self.engine = engine
        self.conn = driver_conn
        self.asyncpg = engine.dialect.driver == "asyncpg"
        self.seen: asyncio.Queue[str] = asyncio.Queue()

    @classmethod
    async def open(cls, engine: AsyncEngine, job_id: str) -> _AsyncListener | None:
        reason = _listening_reason(engine.dialect.name, engine.dialect.driver)
        if reason is not None:
            return None
        driver_conn, proof = await connect_and_prove_async(engine)
        if driver_conn is None:
            if proof is not None:
                log.debug("wait: polling, the connection is not one PostgreSQL session (%s)", proof.reason)
            return None
        listener = cls(engine, driver_conn)
        try:
            await listener.start(job_id)
        except BaseException:
            await listener.close()
            raise
        return listener

    async def start(self, job_id: str) -> None:
        if self.asyncpg:

            def deliver(connection: Any, pid: int, channel: str, payload: str) -> None:
                self.seen.put_nowait(payload)

            await self.conn.add_listener(RESULT_CHANNEL, deliver)
            await self.conn.execute(WATCH_SQL.replace("%s", "$1"), job_id)
        else:
            await self.conn.execute(f"LISTEN {RESULT_CHANNEL}")
            await self.conn.execute(WATCH_SQL, (job_id,))

    async def wait(self, job_id: str, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0:
            if self.asyncpg:
                try:
                    payload = await asyncio.wait_for(self.seen.get(), left)
                except TimeoutError:
                    return
                payloads = [payload]
            else:
                payloads = [note.payload async for note in self.conn.notifies(timeout=left, stop_after=1)]
            if job_id in payloads:
                return

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.asyncpg:
                self.conn.terminate()
            else:
                await self.conn.close()


async def wait_for_async(
    read: Callable[[], Awaitable[JobResult]], engine: AsyncEngine | None, job_id: str, timeout_s: float, poll_s: float
) -> JobResult:
    """:func:`wait_for` for the asyncio API (``engine`` None: poll)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    result = await read()
    if _settled_or_gone(result) or timeout_s <= 0:
        return result if _settled_or_gone(result) else JobResult(job_id, ResultStatus.TIMED_OUT)
    listener = None if engine is None else await _AsyncListener.open(engine, job_id)
    try:
        while True:
            result = await read()
            if _settled_or_gone(result):
                return result
            left = deadline - loop.time()
            if left <= 0:
                return JobResult(job_id, ResultStatus.TIMED_OUT)
            pause = min(poll_s, left)
            if listener is None:
                await asyncio.sleep(pause)
            else:
                await listener.wait(job_id, pause)
    finally:
        if listener is not None:
            await listener.close()
