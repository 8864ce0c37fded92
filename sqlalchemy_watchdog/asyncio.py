"""The asyncio API: enqueue with an ``AsyncSession`` or ``AsyncConnection``,
:class:`AsyncWatchdog` over an ``AsyncEngine``, and :class:`AsyncRunner`.

Every call runs the same sync store code as the sync API, through
``AsyncSession.run_sync`` / ``AsyncConnection.run_sync`` -- the way
SQLAlchemy's own asyncio layer is built -- so both behave identically on
``postgresql+psycopg`` and ``sqlite+aiosqlite``.

The public home of the asyncio twins: the client's live in
``sqlalchemy_watchdog.client.asyncio``, the runner's in
``sqlalchemy_watchdog.drivers.asyncio``.
"""

from __future__ import annotations

from .client.asyncio import AsyncWatchdog, enqueue, enqueue_select, replace_job, signal_job
from .client.asyncio import run_store as run_store
from .client.asyncio import run_store_as as run_store_as
from .drivers.asyncio import AsyncRunner

__all__ = ["enqueue", "enqueue_select", "replace_job", "signal_job", "AsyncWatchdog", "AsyncRunner"]
