"""The web dashboard: an ASGI application to watch and command the queue.

Install the extra, then mount the application anywhere in a Starlette or
FastAPI app (or serve it alone with ``sqlalchemy-watchdog dashboard``)::

    pip install 'sqlalchemy-watchdog[web]'

    from sqlalchemy_watchdog.web import create_app
    app.mount("/watchdog", create_app(engine, authorize=may_operate))

Pages are rendered on the server (Starlette + Jinja2); the one small script
it serves itself refreshes the overview and keeps a double click from
sending a form twice. Nothing is loaded from another origin. The core
package never imports this module.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        f"sqlalchemy_watchdog.web needs the web extra (missing: {error.name}): pip install 'sqlalchemy-watchdog[web]'",
        name=error.name,
    ) from error

from .app import create_app
from .security import ACTIONS, DESTRUCTIVE_ACTIONS, VIEW, Authorize, Identify, scope_user

__all__ = ["ACTIONS", "DESTRUCTIVE_ACTIONS", "VIEW", "Authorize", "Identify", "create_app", "scope_user"]
