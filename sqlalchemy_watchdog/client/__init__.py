"""The client side: transactional enqueue, and :class:`Watchdog` for reads and commands.

* :mod:`~sqlalchemy_watchdog.client.operations` -- every operation of the
  two facades, declared once (name, parameters, docstring, the store
  functions it runs and how);
* :mod:`~sqlalchemy_watchdog.client.sync` -- :func:`enqueue`,
  :func:`enqueue_select` and :class:`Watchdog` over an ``Engine``;
* :mod:`~sqlalchemy_watchdog.client.asyncio` -- their asyncio twins
  (re-exported by :mod:`sqlalchemy_watchdog.asyncio`).

This package exports what the module ``sqlalchemy_watchdog.client`` always did.
"""

from __future__ import annotations

from .sync import EVENT_QUEUED, EVENT_STOP, Watchdog, enqueue, enqueue_select, replace_job, signal_job

__all__ = ["enqueue", "enqueue_select", "replace_job", "signal_job", "Watchdog", "EVENT_QUEUED", "EVENT_STOP"]
