"""What the library needs of a database connection, and how it finds out.

Internal module (:func:`follow_failover` is re-exported by the package).

* **Failover.** A primary that was demoted (``read-only transaction``,
  SQLSTATE 25006), a server in recovery or shutting down (class 57P) and
  every connection exception (class 08) mean the connection points at the
  wrong server or at none: :func:`follow_failover` makes SQLAlchemy treat
  them as a disconnect, so the connection (and the rest of the pool, which
  points at the same server) is replaced and the operation retried; with a
  multi-host URL and ``target_session_attrs=read-write`` the new
  connections reach the new primary.
* **Prepared statements behind a pooler.** :func:`prepared_statement_failure`
  turns the driver's error of a prepared statement that a transaction-mode
  pooler lost into :class:`~sqlalchemy_watchdog.errors.PreparedStatementsRefused`,
  which names the engine setting to use; :func:`follow_failover` has such a
  connection replaced, since its driver's cache of prepared statements and
  its server session no longer agree (and in autocommit nothing else would
  ever make them agree again).
* **One server session, proven.** LISTEN and the waiting lock (a session
  advisory lock) are only correct on a connection that stays one server
  session. Behind a pooler in transaction mode each transaction may run on
  another server session: a LISTEN lands on an arbitrary one and its
  notifications are lost, a session lock stays with a pooled server session.
  :func:`prove_session` (and :func:`prove_session_async`) checks a
  connection before a runner listens on it: ``pg_backend_pid()`` is the
  same across two autocommit statements, the server is a primary, and a
  NOTIFY sent from *another* connection -- of the runner's own engine, so
  that a ``listen_engine`` on another database or server fails too --
  reaches it. A
  pooler fails the last check whichever server sessions it hands out: the
  other connection either runs on the listening server session (the
  notification then goes to that other client) or on another one (the
  notification reaches a server session the pooler holds idle, not the
  listening client).
"""

from __future__ import annotations

import asyncio
import secrets
import select
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine

from .backends import known_backend
from .errors import PreparedStatementsRefused, redacted

__all__ = [
    "FAILOVER_SQLSTATES",
    "sqlstate_of",
    "is_failover_error",
    "follow_failover",
    "prepared_statement_failure",
    "SessionProof",
    "prove_session",
    "prove_session_async",
    "PROOF_TIMEOUT_S",
]

#: SQLSTATEs after which a connection is replaced, not reused: the server is
#: no longer a writable primary, or is going away.
FAILOVER_SQLSTATES = frozenset(
    {
        "25006",  # read_only_sql_transaction: a demoted primary, a standby
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now: starting up, in recovery
        "57P04",  # database_dropped
    }
)


def sqlstate_of(error: BaseException | None) -> str | None:
    """The SQLSTATE of a driver error, or of the driver error a SQLAlchemy
    error wraps (psycopg: ``sqlstate``; psycopg2: ``pgcode``; asyncpg through
    SQLAlchemy's adapter: both)."""
    seen = 0
    while error is not None and seen < 4:
        for attribute in ("sqlstate", "pgcode"):
            value = getattr(error, attribute, None)
            if isinstance(value, str) and value:
                return value
        orig = getattr(error, "orig", None)
        error = orig if isinstance(orig, BaseException) else error.__cause__
        seen += 1
    return None


def is_failover_error(error: BaseException | None) -> bool:
    """Whether ``error`` means the connection's server is not (or no longer)
    a writable primary, or is going away: replace the connection, retry."""
    sqlstate = sqlstate_of(error)
    if sqlstate is None:
        return False
    return sqlstate in FAILOVER_SQLSTATES or sqlstate.startswith("08")


def _mark_failover(context: ExceptionContext) -> None:
    if context.is_disconnect:
        return
    error = context.original_exception
    if is_failover_error(error):
        context.is_disconnect = True
    elif sqlstate_of(error) in _PREPARED_SQLSTATES:
        # The driver's prepared statements and its server session's disagree
        # (a transaction-mode pooler, or a DEALLOCATE / DISCARD ALL the driver
        # missed). In autocommit -- the store's mode on PostgreSQL -- no
        # rollback ever clears psycopg's cache, so the connection would fail
        # the same way for ever: replace it (it alone; the error still
        # reaches the caller, as PreparedStatementsRefused from the store).
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = False


def follow_failover(engine: Engine | AsyncEngine) -> None:
    """Make ``engine`` replace connections that reach a server which is no
    longer a writable primary, or is going away (SQLSTATE 25006, class 57P,
    class 08), as it replaces a dropped connection: the error reaches the
    caller as a disconnect (``DBAPIError.connection_invalidated``), and the
    pool's connections opened before it are replaced on their next checkout.
    A connection whose prepared statements its server session no longer has,
    or has already (SQLSTATE 26000, 42P05), is replaced too, alone.

    Runners and :class:`~sqlalchemy_watchdog.Watchdog` call it on their own
    engine; call it on your application's engine so that its sessions follow
    a failover too. Idempotent; a no-op on SQLite.
    """
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    backend = known_backend(sync_engine.dialect)
    if backend is None or not backend.fails_over:
        return
    if not event.contains(sync_engine, "handle_error", _mark_failover):
        event.listen(sync_engine, "handle_error", _mark_failover)


#: SQLSTATEs of a prepared statement the server session does not have, or
#: has already: what a transaction-mode pooler without prepared-statement
#: support does to a driver that prepares.
_PREPARED_SQLSTATES = frozenset({"26000", "42P05"})


def _driver_of(error: BaseException) -> str:
    orig = getattr(error, "orig", None)
    module = type(orig if isinstance(orig, BaseException) else error).__module__
    if "asyncpg" in module:
        return "asyncpg"
    if module.startswith("psycopg2"):
        return "psycopg2"
    return "psycopg" if module.startswith("psycopg") else module.split(".")[0]


def prepared_statement_failure(error: BaseException) -> PreparedStatementsRefused | None:
    """The library's error for ``error`` when it is a prepared statement
    lost or doubled behind a pooler (SQLSTATE 26000 or 42P05, or a protocol
    violation naming a prepared statement), else None."""
    sqlstate = sqlstate_of(error)
    if sqlstate not in _PREPARED_SQLSTATES and sqlstate != "08P01":
        return None
    description = redacted(error)
    if sqlstate == "08P01" and "prepared statement" not in description:
        return None
    return PreparedStatementsRefused(_driver_of(error), description)


# -- proving one server session ------------------------------------------------------

#: How long a proof waits for its own notification.
PROOF_TIMEOUT_S = 2.0

_PID_SQL = "SELECT pg_backend_pid(), pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'"


@dataclass(frozen=True)
class SessionProof:
    """What :func:`prove_session` found: ``proven``, else ``reason`` says why not."""

    proven: bool
    reason: str = ""
    #: The check itself failed (an error, not a verdict on the session).
    failed: bool = False


def _channel() -> str:
    return f"watchdog_probe_{secrets.token_hex(6)}"


def _verdict(
    before: tuple[Any, Any], after: tuple[Any, Any], delivered: bool, elsewhere: str | None = None
) -> SessionProof:
    if before[1] or after[1]:
        return SessionProof(False, "the server is read-only (a standby or a fenced primary, not the primary)")
    if before[0] != after[0]:
        return SessionProof(
            False,
            f"pg_backend_pid() changed between two statements ({before[0]} -> {after[0]}): "
            "each statement ran on another server session (a connection pooler in transaction mode?)",
        )
    if not delivered and elsewhere is not None:
        return SessionProof(
            False,
            f"a NOTIFY sent through the runner's engine did not reach the listen_engine's connection within "
            f"{PROOF_TIMEOUT_S:g}s: the listen_engine is not on the runner's database ({elsewhere}); its "
            "URL must name the same server and database as the runner's engine",
        )
    if not delivered:
        return SessionProof(
            False,
            f"a NOTIFY sent from another connection did not reach the listening connection within "
            f"{PROOF_TIMEOUT_S:g}s: it is not one server session (a connection pooler in transaction mode?)",
        )
    return SessionProof(True)


def _notify_sql(channel: str) -> Any:
    return text("SELECT pg_notify(:channel, 'probe')").bindparams(channel=channel)


def _databases_sql() -> Any:
    return text("SELECT current_database(), inet_server_port()")


def _elsewhere(listening: tuple[Any, Any], sending: tuple[Any, Any]) -> str:
    """Where the two sessions are, in words, for a listen_engine that heard nothing."""
    return (
        f"it listens in database {listening[0]!r}, port {listening[1]}; "
        f"the runner's engine reaches {sending[0]!r}, port {sending[1]}"
    )


def _notify_with_retry(notify_engine: Engine, channel: str) -> tuple[Any, Any]:
    """Send the probe through a pooled connection of ``notify_engine`` (once
    more on a fresh one when the pooled one turned out dead: after a lost
    connection the pool may hold others the server ended too); returns the
    sender's database and port."""
    from sqlalchemy.exc import DBAPIError

    for attempt in (1, 2):
        try:
            with notify_engine.connect() as other:
                other = other.execution_options(isolation_level="AUTOCOMMIT")
                where = other.execute(_databases_sql()).one()
                other.execute(_notify_sql(channel))
                return (where[0], where[1])
        except DBAPIError as error:
            if attempt == 2 or not error.connection_invalidated:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def prove_session(engine: Engine, driver_conn: Any, notify_engine: Engine | None = None) -> SessionProof:
    """Prove that ``driver_conn`` (an autocommit psycopg 3 or psycopg2
    connection of ``engine``, detached from its pool) is one server session
    of a primary; the NOTIFY comes from another connection, of
    ``notify_engine`` (the runner's own engine; default ``engine``)."""
    channel = _channel()
    driver = engine.dialect.driver
    notify_engine = engine if notify_engine is None else notify_engine

    def row(statement: str) -> tuple[Any, Any]:
        if driver == "psycopg2":
            with driver_conn.cursor() as cursor:
                cursor.execute(statement)
                fetched = cursor.fetchone()
        else:
            fetched = driver_conn.execute(statement).fetchone()
        return (fetched[0], fetched[1]) if fetched is not None and len(fetched) > 1 else (None, None)

    def run(statement: str) -> None:
        if driver == "psycopg2":
            with driver_conn.cursor() as cursor:
                cursor.execute(statement)
        else:
            driver_conn.execute(statement)

    before = row(_PID_SQL)
    run(f"LISTEN {channel}")
    sender = _notify_with_retry(notify_engine, channel)
    delivered = _wait_sync(driver_conn, driver, channel)
    after = row(_PID_SQL)
    run(f"UNLISTEN {channel}")
    elsewhere = None
    if not delivered and notify_engine is not engine:
        elsewhere = _elsewhere(row("SELECT current_database(), inet_server_port()"), sender)
    return _verdict(before, after, delivered, elsewhere)


def _wait_sync(driver_conn: Any, driver: str, channel: str) -> bool:
    deadline = time.monotonic() + PROOF_TIMEOUT_S
    if driver == "psycopg2":
        while True:
            driver_conn.poll()
            while driver_conn.notifies:
                if driver_conn.notifies.pop(0).channel == channel:
                    return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            select.select([driver_conn], [], [], remaining)
    while (remaining := deadline - time.monotonic()) > 0:
        for note in driver_conn.notifies(timeout=remaining, stop_after=1):
            if note.channel == channel:
                return True
    return False


async def prove_session_async(
    engine: AsyncEngine, driver_conn: Any, notify_engine: AsyncEngine | None = None
) -> SessionProof:
    """:func:`prove_session` for an ``AsyncEngine`` (asyncpg, async psycopg)."""
    from sqlalchemy.exc import DBAPIError

    channel = _channel()
    notify_sql = _notify_sql(channel)
    sender_engine = engine if notify_engine is None else notify_engine
    sender: list[tuple[Any, Any]] = []

    async def send() -> None:
        for attempt in (1, 2):  # as _notify_with_retry
            try:
                async with sender_engine.connect() as other:
                    other = await other.execution_options(isolation_level="AUTOCOMMIT")
                    where = (await other.execute(_databases_sql())).one()
                    await other.execute(notify_sql)
                    sender.append((where[0], where[1]))
                    return
            except DBAPIError as error:
                if attempt == 2 or not error.connection_invalidated:
                    raise

    def elsewhere(delivered: bool, listening: tuple[Any, Any]) -> str | None:
        if delivered or sender_engine is engine or not sender:
            return None
        return _elsewhere(listening, sender[0])

    if engine.dialect.driver == "asyncpg":
        arrived = asyncio.Event()

        def deliver(connection: Any, pid: int, name: str, payload: str) -> None:
            arrived.set()

        record = await driver_conn.fetchrow(_PID_SQL)
        before = (record[0], record[1])
        await driver_conn.add_listener(channel, deliver)
        try:
            await send()
            try:
                await asyncio.wait_for(arrived.wait(), PROOF_TIMEOUT_S)
            except TimeoutError:
                pass
            record = await driver_conn.fetchrow(_PID_SQL)
            after = (record[0], record[1])
            where = await driver_conn.fetchrow("SELECT current_database(), inet_server_port()")
        finally:
            await driver_conn.remove_listener(channel, deliver)
        return _verdict(before, after, arrived.is_set(), elsewhere(arrived.is_set(), (where[0], where[1])))

    async def row() -> tuple[Any, Any]:
        fetched = await (await driver_conn.execute(_PID_SQL)).fetchone()
        return (fetched[0], fetched[1])

    before = await row()
    await driver_conn.execute(f"LISTEN {channel}")
    await send()
    delivered = False
    deadline = time.monotonic() + PROOF_TIMEOUT_S
    while not delivered and (remaining := deadline - time.monotonic()) > 0:
        async for note in driver_conn.notifies(timeout=remaining, stop_after=1):
            delivered = delivered or note.channel == channel
    after = await row()
    await driver_conn.execute(f"UNLISTEN {channel}")
    where = await (await driver_conn.execute("SELECT current_database(), inet_server_port()")).fetchone()
    return _verdict(before, after, delivered, elsewhere(delivered, (where[0], where[1])))
