"""The gateways: how a store operation reaches the database.

A store operation is a sync function ``fn(conn, *args, **kwargs)`` declared
with :func:`store.operation <sqlalchemy_watchdog.store.operation>` (its
transaction shape as data). :class:`SyncGateway` over an ``Engine`` and
:class:`AsyncGateway` over an ``AsyncEngine`` own everything around it:
checking out a connection (or reusing the one the calling thread or task
holds), autocommit where the backend is self-committing, the transaction
the shape asks for (:func:`store.transact_as
<sqlalchemy_watchdog.store.transact_as>`), and retrying transient failures
with backoff. :class:`~sqlalchemy_watchdog.Watchdog`,
:class:`~sqlalchemy_watchdog.asyncio.AsyncWatchdog`, the runners, the
testing helpers and the dashboard are thin over them.

``run(fn, ...)`` runs an operation as declared; ``read(fn, ...)`` runs it
as a look (never the write lock up front, whatever its shape: what the
clients' reads and dry runs use). Both refuse an undeclared function
(TypeError): a forgotten declaration would otherwise run a multi-statement
operation in autocommit. ``perform(mode, what, fn, ...)`` is the primitive
with the mode chosen by the caller; an undeclared function there runs as a
write (the test suite's ad-hoc functions).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import store

T = TypeVar("T")
P = ParamSpec("P")

__all__ = ["AsyncGateway", "AsyncOperations", "SyncGateway"]


class SyncGateway:
    """Store operations over a sync ``Engine``, retried on transient failures."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: Whether the operations run in autocommit (where their shape allows).
        self.autocommit = store.self_committing(engine.dialect.name)
        self.writing = store.TxMode(autocommit=self.autocommit)
        self.reading = store.TxMode(write=False, autocommit=self.autocommit)
        #: Per thread: whether it holds a connection across calls, and which.
        self._held = threading.local()

    def run(self, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(conn, *args, **kwargs)`` as its declaration says."""
        store.declared(fn)
        return self.perform(self.writing, fn.__name__, fn, *args, **kwargs)

    def read(self, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(conn, *args, **kwargs)`` as a look: no write lock taken up front."""
        store.declared(fn)
        return self.perform(self.reading, fn.__name__, fn, *args, **kwargs)

    def perform(
        self,
        mode: store.TxMode,
        what: str,
        fn: Callable[Concatenate[Connection, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``fn(conn, *args, **kwargs)`` in ``mode``, retried; ``what`` names it in errors."""
        held = self._held
        if not getattr(held, "holding", False):

            def work() -> T:
                with self.engine.connect() as conn:
                    return store.transact_as(conn, mode, fn, *args, **kwargs)

            return store.retrying(work, what=what)

        def work_held() -> T:
            conn = held.conn
            if conn is None or conn.closed or conn.invalidated:
                conn = held.conn = self.engine.connect()
                if self.autocommit:
                    conn.execution_options(isolation_level="AUTOCOMMIT")
            try:
                return store.transact_as(conn, mode, fn, *args, **kwargs)
            except DBAPIError:
                # Whatever failed, the next attempt starts on a fresh connection.
                held.conn = None
                conn.close()
                raise

        return store.retrying(work_held, what=what)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Within this block, the calling thread's calls reuse one connection
        (a checkout, an isolation-level change and a check-in less per call);
        other threads check one out per call."""
        held = self._held
        held.holding, held.conn = True, None
        try:
            yield
        finally:
            conn, held.holding, held.conn = held.conn, False, None
            if conn is not None:
                conn.close()


class AsyncOperations(Protocol):
    """What :class:`~sqlalchemy_watchdog.asyncio.AsyncWatchdog` is thin over:
    an :class:`AsyncGateway`, or (the dashboard over a sync engine) a
    :class:`SyncGateway` run in a thread pool."""

    async def run(self, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...

    async def read(self, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...


class AsyncGateway:
    """Store operations over an ``AsyncEngine`` (each runs through
    ``AsyncConnection.run_sync``), retried on transient failures."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.autocommit = store.self_committing(engine.dialect.name)
        self.writing = store.TxMode(autocommit=self.autocommit)
        self.reading = store.TxMode(write=False, autocommit=self.autocommit)
        #: The tasks that keep one connection across calls, and theirs.
        self._held: dict[asyncio.Task[Any], AsyncConnection | None] = {}

    async def run(self, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(conn, *args, **kwargs)`` as its declaration says."""
        store.declared(fn)
        return await self.perform(self.writing, fn.__name__, fn, *args, **kwargs)

    async def read(self, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(conn, *args, **kwargs)`` as a look: no write lock taken up front."""
        store.declared(fn)
        return await self.perform(self.reading, fn.__name__, fn, *args, **kwargs)

    async def perform(
        self,
        mode: store.TxMode,
        what: str,
        fn: Callable[Concatenate[Connection, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``fn(conn, *args, **kwargs)`` in ``mode``, retried; ``what`` names it in errors."""

        def work(sync: Connection) -> T:
            return store.transact_as(sync, mode, fn, *args, **kwargs)

        backoff = store.Backoff()
        task = asyncio.current_task()
        if task not in self._held:
            while True:
                try:
                    async with self.engine.connect() as conn:
                        return await conn.run_sync(work)
                except (DBAPIError, OSError) as error:
                    # OSError: asyncpg's connect raises a refused or reset connection
                    # as it is (SQLAlchemy does not wrap it), e.g. during a failover.
                    await asyncio.sleep(backoff.delay_after(error, what))
        while True:
            held = self._held[task]
            try:
                if held is None or held.closed or held.invalidated:
                    held = self._held[task] = await self.engine.connect()
                    if self.autocommit:
                        await held.execution_options(isolation_level="AUTOCOMMIT")
                return await held.run_sync(work)
            except (DBAPIError, OSError) as error:
                # Whatever failed, the next attempt starts on a fresh connection.
                self._held[task] = None
                if held is not None:
                    await held.close()
                await asyncio.sleep(backoff.delay_after(error, what))

    @contextlib.asynccontextmanager
    async def holding(self) -> AsyncIterator[None]:
        """Within this block, the current task's calls reuse one connection;
        other tasks check one out per call."""
        task = asyncio.current_task()
        assert task is not None
        self._held[task] = None
        try:
            yield
        finally:
            conn = self._held.pop(task, None)
            if conn is not None:
                await conn.close()
