"""Transactions, locks and retries: how a store operation runs on a connection.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Concatenate, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..backends import backend_of, backend_of_error
from ..connections import prepared_statement_failure
from ..errors import ErrorCode, WatchdogError, redacted
from .base import (
    P,
    T,
)
from .operation import UNDECLARED, Shape, operation_of

log = logging.getLogger("sqlalchemy_watchdog.store")


# -- transactions ------------------------------------------------------------


def _prepares_per_statement(conn: Connection) -> bool:
    """Whether ``conn`` is asyncpg with its prepared-statement cache off --
    the setting for a pooler in transaction mode. asyncpg prepares every
    statement and executes it in a second round trip; outside a transaction
    the pooler may send the two to different server sessions, so there the
    store's operations keep their BEGIN/COMMIT."""
    if conn.dialect.driver != "asyncpg":
        return False
    dbapi_connection = conn.connection.dbapi_connection
    return getattr(dbapi_connection, "_prepared_statement_cache", True) is None


def reads_beside_writer(conn: Connection) -> bool:
    """The look-before-lock rule: whether ``conn`` is SQLite in WAL mode, where
    reads never block the writer (the backend decides).

    With a rollback journal they do: a committing writer must wait (sleeping
    in the busy handler) until every reader's shared lock is gone, so there
    the store's reads keep taking the write lock, which serialises them with
    the writers instead. The journal mode is read once per pooled connection.
    """
    return backend_of(conn).reads_beside_writer(conn)


def begin_write(conn: Connection) -> None:
    """Take the backend's write lock at the start of the transaction:
    ``BEGIN IMMEDIATE`` on SQLite (see :meth:`backends.SQLite.begin_write
    <sqlalchemy_watchdog.backends.SQLite.begin_write>`), nothing on PostgreSQL."""
    backend_of(conn).begin_write(conn)


def _in_transaction(conn: Connection) -> bool:
    """Whether the DBAPI connection already runs a transaction of its own."""
    return bool(getattr(conn.connection.dbapi_connection, "in_transaction", False))


@dataclass(frozen=True)
class TxMode:
    """How :func:`transact_as` runs its function.

    ``write``: on SQLite, take the write lock first (:func:`begin_write`).
    ``autocommit``: run without BEGIN/COMMIT, for work whose one writing
    statement is atomic by itself (two round trips fewer).

    A value passed positionally, so that these options never collide with
    the keyword arguments of the store function being run.
    """

    write: bool = True
    autocommit: bool = False


#: A write transaction with BEGIN/COMMIT: what :func:`transact` runs.
WRITE = TxMode()
#: A reading transaction (no write lock taken up front on SQLite).
READ = TxMode(write=False)


def transact(conn: Connection, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn(conn, *args, **kwargs)`` in a write transaction of its own on
    ``conn`` (:func:`transact_as` with :data:`WRITE`)."""
    return transact_as(conn, WRITE, fn, *args, **kwargs)


def transact_as(
    conn: Connection,
    mode: TxMode,
    fn: Callable[Concatenate[Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run ``fn(conn, *args, **kwargs)`` in a transaction of its own on ``conn``
    (:func:`_transact_as`); on SQLite, text that is not UTF-8 reads as
    :class:`~sqlalchemy_watchdog.backends.UnreadableText` meanwhile
    (``Backend.reading_any_text``) instead of failing the whole statement:
    one row a producer wrote never stops the others."""
    with backend_of(conn).reading_any_text(conn):
        return _transact_as(conn, mode, fn, *args, **kwargs)


def _transact_as(
    conn: Connection,
    mode: TxMode,
    fn: Callable[Concatenate[Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run ``fn(conn, *args, **kwargs)`` in a transaction of its own on ``conn``,
    as ``fn``'s declaration (:func:`operation`) says; an undeclared ``fn``
    runs as :data:`UNDECLARED` (a write).

    ``mode.autocommit`` runs it without BEGIN/COMMIT where its shape allows
    (not a :attr:`Shape.TRANSACTION`, and ``autocommit_if`` says this call
    is one statement): two round trips fewer. On SQLite a ``mode.write``
    transaction takes the write lock first (:func:`begin_write`); in WAL
    mode (:func:`reads_beside_writer`) a :attr:`Shape.READ` operation does
    not, and an operation with a ``peek`` first looks, without the lock,
    whether there is anything to do at all.
    """
    declared_as = operation_of(fn) or UNDECLARED
    if (
        mode.autocommit
        and declared_as.shape is not Shape.TRANSACTION
        and (declared_as.autocommit_if is None or declared_as.autocommit_if(*args, **kwargs))
        and not _prepares_per_statement(conn)
    ):
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        return fn(conn, *args, **kwargs)
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        # Out of autocommit: at the level the backend's transactions run at
        # (MariaDB: READ COMMITTED), else the connection's default.
        level = backend_of(conn).isolation_level or conn.default_isolation_level
        conn = conn.execution_options(isolation_level=level)
    with conn.begin():
        lock_free_reads = reads_beside_writer(conn)
        if declared_as.peek is not None and lock_free_reads and not _in_transaction(conn):
            # Not when already in a transaction (e.g. an explicit BEGIN from
            # a "begin" event): a read before the first write would make it
            # a read-then-write transaction.
            found = declared_as.peek(conn, *args, **kwargs)
            if found is not None:
                # The peek answers for the operation: its result type is T.
                return cast(T, found)
        if mode.write and not (lock_free_reads and declared_as.shape is Shape.READ):
            begin_write(conn)
        return fn(conn, *args, **kwargs)


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A connection in a new write transaction, committed on success."""
    with engine.connect() as conn:
        with conn.begin():
            begin_write(conn)
            yield conn


def is_transient(error: BaseException) -> bool:
    """Whether retrying the whole transaction may succeed: a lost or refused
    connection (a bare ``OSError`` too: asyncpg's connect raises it as it
    is), a server going away or no longer writable (see
    :func:`~sqlalchemy_watchdog.connections.follow_failover`), contention."""
    if isinstance(error, OSError):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, DBAPIError):
        return backend_of_error(error).is_transient(error)
    return False


class Backoff:
    """Jittered exponential backoff over a bounded number of attempts.

    ``delay_after(error, what)`` returns how long to sleep before the next
    attempt, or raises ``WatchdogError(store_unavailable)`` when the error
    is not transient or the attempts are spent. Shared by the sync and the
    asyncio paths, which differ only in how they sleep.
    """

    def __init__(self, attempts: int = 8, base_delay: float = 0.02, max_delay: float = 1.0) -> None:
        self.attempts = attempts
        self.attempt = 0
        self.delay = base_delay
        self.max_delay = max_delay

    def delay_after(self, error: DBAPIError | OSError, what: str) -> float:
        self.attempt += 1
        refused = prepared_statement_failure(error)
        if refused is not None:
            raise refused from None
        if not is_transient(error) or self.attempt >= self.attempts:
            raise WatchdogError(ErrorCode.STORE_UNAVAILABLE, f"{what} failed: {redacted(error)}") from None
        log.debug("%s: transient failure (attempt %d): %s", what, self.attempt, redacted(error))
        delay = self.delay * (0.5 + random.random())
        self.delay = min(self.max_delay, self.delay * 2)
        return delay


def transient_failure(error: WatchdogError) -> bool:
    """Whether a store operation failed because the database was unreachable
    or contended (retried until the attempts ran out), rather than refusing
    the statement itself."""
    cause = error.__cause__ or error.__context__
    return isinstance(cause, BaseException) and is_transient(cause)


def retrying(work: Callable[[], T], *, what: str = "store operation", attempts: int = 8) -> T:
    """Run ``work`` (a whole transaction), retrying transient failures.

    "database is locked", a dropped connection, a serialization failure: each
    is retried with jittered backoff; after ``attempts`` the last one is
    raised as ``WatchdogError(store_unavailable)``.
    """
    backoff = Backoff(attempts)
    while True:
        try:
            return work()
        except DBAPIError as error:
            time.sleep(backoff.delay_after(error, what))
