"""``dashboard``: serve the web dashboard (the ``web`` extra) on a loopback address."""

from __future__ import annotations

import argparse
import signal
from typing import TextIO

from sqlalchemy import Engine

from ..exits import CommandFailed
from ..urls import require_table, shown

#: What ``dashboard`` says at start: without ``authorize``, only this machine may reach it.
DASHBOARD_LOOPBACK_NOTE = (
    "no authorize function here: the dashboard binds to 127.0.0.1 only (loopback), so only this "
    "machine can reach it; anyone on it may run its actions"
)


def cmd_dashboard(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the web dashboard with uvicorn until SIGINT / SIGTERM.

    The command has no ``authorize`` function (it cannot know who is who),
    so it binds to a loopback address only (default 127.0.0.1) and says so:
    whoever can reach the port may view and, unless ``--read-only``, run the
    actions. To serve the dashboard to others, mount
    ``sqlalchemy_watchdog.web.create_app(engine, authorize=...)`` in your own
    ASGI application behind its authentication. Needs the ``web`` extra
    (``pip install 'sqlalchemy-watchdog[web]'``).
    """
    try:
        import uvicorn

        from ...web import create_app
    except ImportError as error:
        raise CommandFailed(
            f"the dashboard needs the web extra (missing: {error.name}): pip install 'sqlalchemy-watchdog[web]'"
        ) from None
    engine: Engine = args.engine
    require_table(engine)
    app = create_app(engine, read_only=args.read_only)
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    mode = " (read-only: no actions)" if args.read_only else ""
    print(f"serving the dashboard of {shown(engine.url)} at http://{shown_host}:{args.port}/{mode}", file=out)
    print(DASHBOARD_LOOPBACK_NOTE, file=out)
    out.flush()
    level = (args.log_level or "INFO").lower()
    # uvicorn shuts down on SIGINT / SIGTERM, then raises the signal again
    # for the handler it found: a quiet one here, so that a stop exits 0.
    quiet = {sig: signal.signal(sig, lambda signum, frame: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=level, server_header=False)
    finally:
        for sig, previous in quiet.items():
            signal.signal(sig, previous)
    return 0
