"""The runner drivers: :class:`~sqlalchemy_watchdog.Runner` (``sync``: threads
and an ``Engine``) and :class:`~sqlalchemy_watchdog.asyncio.AsyncRunner`
(``asyncio``: tasks and an ``AsyncEngine``) perform the steps of
:mod:`sqlalchemy_watchdog.core`, each its own way; what they share --
building their settings from the options, the wake-up decision, the
started line, the refusal of a second loop -- is in ``base``.

Imported by their public modules, :mod:`sqlalchemy_watchdog.runner` and
:mod:`sqlalchemy_watchdog.asyncio`.
"""
