"""Wake-ups on PostgreSQL: the channel, its events, the trigger, the listeners.

Internal module. Idle runners LISTEN on :data:`CHANNEL`. A statement-level
INSERT trigger on ``watchdog_jobs`` sends :data:`EVENT_QUEUED` when an
enqueue commits (PostgreSQL folds identical notifications of one
transaction, and one trigger per statement costs no round trip on the
enqueue path); a cancellation or lane failure sends :data:`EVENT_STOP`, on
which a runner renews its claims at once and so finds the handlers to stop.

The listeners take their connection from the application's engine, so
whatever the engine does to connect -- ``connect_args``, a ``do_connect``
hook supplying an IAM token, a ``creator`` function, SSL settings -- holds
for them too. The connection is detached from the pool (it never returns
there in LISTEN state). psycopg 3, psycopg2 and asyncpg deliver
notifications; on another driver the runner polls (and says so in its log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from .errors import redacted

__all__ = [
    "CHANNEL",
    "EVENT_QUEUED",
    "EVENT_STOP",
    "NOTIFY_FUNCTION_SQL",
    "NOTIFY_TRIGGER_SQL",
    "DROP_NOTIFY_FUNCTION_SQL",
    "Listener",
    "listen_async",
    "listens",
]

log = logging.getLogger("sqlalchemy_watchdog.runner")

#: The LISTEN/NOTIFY channel of runners on PostgreSQL.
CHANNEL = "watchdog_jobs"
#: New work was committed (sent by the table's INSERT trigger).
EVENT_QUEUED = "queued"
#: A cancellation or lane failure was recorded: running handlers may have to stop.
EVENT_STOP = "stop"

NOTIFY_FUNCTION_SQL = f"""\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_queued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', '{EVENT_QUEUED}');
    RETURN NULL;
END
$$"""
NOTIFY_TRIGGER_SQL = (
    "CREATE TRIGGER watchdog_jobs_queued AFTER INSERT ON watchdog_jobs "
    "FOR EACH STATEMENT EXECUTE FUNCTION watchdog_jobs_notify_queued()"
)
DROP_NOTIFY_FUNCTION_SQL = "DROP FUNCTION IF EXISTS watchdog_jobs_notify_queued()"

_LISTEN_SQL = f"LISTEN {CHANNEL}"


#: The drivers whose connections deliver notifications to a listener.
LISTENING_DRIVERS = frozenset({"psycopg", "psycopg2", "asyncpg"})


def listens(dialect_name: str, driver: str) -> bool:
    """Whether a runner on this dialect and driver is woken by NOTIFY."""
    if dialect_name != "postgresql":
        return False
    if driver not in LISTENING_DRIVERS:
        log.debug("runner: the %s driver delivers no notifications here; polling instead", driver)
        return False
    return True


def _backoff(failures: int) -> float:
    return min(30.0, 0.25 * 2.0 ** min(failures, 7))


def _dispatch(payload: str, on_queued: Callable[[], None], on_stop: Callable[[], None]) -> None:
    if payload == EVENT_STOP:
        on_stop()
    elif payload == EVENT_QUEUED:
        on_queued()


class Listener:
    """A thread LISTENing on a connection of ``engine`` (psycopg 3):
    ``on_queued`` on new work, ``on_stop`` on a cancellation or lane failure.

    Whatever was committed while nobody listened (before the first LISTEN,
    or across a reconnect) is covered by calling ``on_queued`` once the
    LISTEN is in place.
    """

    def __init__(self, engine: Engine, on_queued: Callable[[], None], on_stop: Callable[[], None]) -> None:
        self.engine = engine
        self.on_queued = on_queued
        self.on_stop = on_stop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog-listener", daemon=True)

    @classmethod
    def start_for(
        cls, engine: Engine, on_queued: Callable[[], None], on_stop: Callable[[], None]
    ) -> Listener | None:
        """A started listener, or None where the engine cannot listen."""
        if not listens(engine.dialect.name, engine.dialect.driver):
            return None
        listener = cls(engine, on_queued, on_stop)
        listener._thread.start()
        return listener

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                raw = self.engine.raw_connection()
            except Exception as error:
                failures += 1
                log.warning("listener: cannot connect (%s); polling meanwhile", redacted(error))
                self._stop.wait(_backoff(failures))
                continue
            failures = 0
            driver_conn: Any = raw.driver_connection
            raw.detach()  # never pooled again: it LISTENs; closed below
            try:
                driver_conn.autocommit = True
                if self.engine.dialect.driver == "psycopg2":
                    self._serve_psycopg2(driver_conn)
                else:
                    driver_conn.execute(_LISTEN_SQL)
                    self.on_queued()
                    while not self._stop.is_set():
                        for note in driver_conn.notifies(timeout=0.5):
                            _dispatch(note.payload, self.on_queued, self.on_stop)
            except Exception as error:
                if not self._stop.is_set():
                    log.warning("listener: connection lost (%s); reconnecting", redacted(error))
                    self._stop.wait(0.5)
            finally:
                # Closed directly: the pool's close would first roll back, and
                # log an ERROR, on a connection the server already dropped.
                with contextlib.suppress(Exception):
                    driver_conn.close()


    def _serve_psycopg2(self, driver_conn: Any) -> None:
        with driver_conn.cursor() as cursor:
            cursor.execute(_LISTEN_SQL)
        self.on_queued()
        while not self._stop.is_set():
            if select.select([driver_conn], [], [], 0.5) == ([], [], []):
                continue
            driver_conn.poll()
            while driver_conn.notifies:
                _dispatch(driver_conn.notifies.pop(0).payload, self.on_queued, self.on_stop)


async def _serve_asyncpg(driver_conn: Any, on_queued: Callable[[], None], on_stop: Callable[[], None]) -> None:
    def deliver(connection: Any, pid: int, channel: str, payload: str) -> None:
        _dispatch(payload, on_queued, on_stop)

    await driver_conn.add_listener(CHANNEL, deliver)
    on_queued()
    while not driver_conn.is_closed():
        await asyncio.sleep(1.0)
    raise ConnectionError("the listening connection was closed")


async def listen_async(engine: AsyncEngine, on_queued: Callable[[], None], on_stop: Callable[[], None]) -> None:
    """:class:`Listener` for an ``AsyncEngine``, until cancelled."""
    failures = 0
    while True:
        try:
            raw = await engine.raw_connection()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            failures += 1
            log.warning("listener: cannot connect (%s); polling meanwhile", redacted(error))
            await asyncio.sleep(_backoff(failures))
            continue
        failures = 0
        driver_conn: Any = raw.driver_connection
        raw.detach()  # never pooled again: it LISTENs; closed below
        try:
            if engine.dialect.driver == "asyncpg":
                await _serve_asyncpg(driver_conn, on_queued, on_stop)
            else:
                await driver_conn.set_autocommit(True)
                await driver_conn.execute(_LISTEN_SQL)
                on_queued()
                async for note in driver_conn.notifies():
                    _dispatch(note.payload, on_queued, on_stop)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("listener: connection lost (%s); reconnecting", redacted(error))
            await asyncio.sleep(0.5)
        finally:
            # Closed directly (see Listener._run); asyncpg's terminate() never waits.
            with contextlib.suppress(Exception):
                if engine.dialect.driver == "asyncpg":
                    driver_conn.terminate()
                else:
                    await driver_conn.close()
