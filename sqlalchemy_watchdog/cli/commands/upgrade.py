"""``upgrade``: apply the package's revisions (the only command that creates anything)."""

from __future__ import annotations

import argparse
from typing import TextIO

from ...migrations import apply_revisions, current_revisions
from ..exits import CommandFailed
from ..urls import open_engine, shown
from . import print_json


def cmd_upgrade(args: argparse.Namespace, out: TextIO) -> int:
    """Apply the package's Alembic revisions (branch ``watchdog``) up to ``args.revision``.

    Runs without an ``env.py``: the revisions shipped in
    ``sqlalchemy_watchdog/migrations/versions`` are applied on one connection,
    recorded in the database's ``alembic_version`` table as ``alembic
    upgrade`` would.
    """
    from alembic.util import CommandError

    engine = open_engine(args.url)
    try:
        try:
            with engine.connect() as conn:
                apply_revisions(conn, args.revision)
        except CommandError as error:
            raise CommandFailed(
                f"{error} (if this database's migrations are run by your application's own "
                "Alembic environment, run `alembic upgrade heads` there instead)"
            ) from None
        with engine.connect() as conn:
            heads = current_revisions(conn)
        if args.json:
            print_json({"url": shown(engine.url), "heads": heads}, out)
        else:
            print(f"{shown(engine.url)} is at revision {', '.join(heads) or '(none)'}", file=out)
        return 0
    finally:
        engine.dispose()
