"""The worker: :class:`Runner` claims jobs, keeps their leases alive, runs
their handlers in threads and settles them with the exact claim.

::

    from sqlalchemy_watchdog import Runner, handler

    @handler("emails")
    def send_email(job):
        deliver(job.payload["to"])          # None -> settled "completed"

    Runner(engine).run_forever()            # until SIGINT/SIGTERM or stop()

The public home of :class:`Runner`, which lives with its asyncio twin in
``sqlalchemy_watchdog.drivers`` (the sync driver, ``drivers/sync.py``).
"""

from __future__ import annotations

from .drivers.sync import Runner

__all__ = ["Runner"]
