"""The commands, one module per room: :mod:`.jobs` (one job or a selection
of jobs), :mod:`.queues` (queues and lanes), :mod:`.serving` (runners,
schedules, workers), :mod:`.upgrade` and :mod:`.dashboard`.

A command is a function ``cmd_NAME(args, out) -> int``: it calls the
library (a :class:`~sqlalchemy_watchdog.Watchdog` on ``args.engine``) and
prints what :mod:`..output` renders; it raises
:class:`~sqlalchemy_watchdog.cli.exits.CommandFailed` (exit 1) or
:class:`~sqlalchemy_watchdog.cli.exits.UsageError` (exit 2).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from sqlalchemy import Engine

from ...client import Watchdog
from ..output import json_line
from ..urls import require_table


def open_watchdog(args: argparse.Namespace) -> Watchdog:
    """A :class:`~sqlalchemy_watchdog.Watchdog` on the command's engine, once
    the database is known to have the table."""
    engine: Engine = args.engine
    require_table(engine)
    return Watchdog(engine)


def print_json(value: Any, out: TextIO) -> None:
    """Print ``value`` as one line of JSON."""
    print(json_line(value), file=out)
