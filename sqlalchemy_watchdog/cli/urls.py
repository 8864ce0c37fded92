"""The database of a command: its URL (``--url``, the environment, the
default), the password masked wherever a URL is shown, the engine, and the
refusal of a database without the ``watchdog_jobs`` table."""

from __future__ import annotations

import os
import re
from typing import Any

from sqlalchemy import Engine, create_engine, make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError

from ..backends import known_backend
from ..migrations import has_jobs_table
from .exits import CommandFailed, UsageError

#: The environment variable naming the database when ``--url`` is not given
#: (documented as ``sqlalchemy_watchdog.cli.URL_ENV``).
URL_ENV = "WATCHDOG_DATABASE_URL"
#: The database when neither ``--url`` nor :data:`URL_ENV` is given.
DEFAULT_URL = "sqlite:///watchdog.db"

#: The message for a database without the table (every command but upgrade).
NO_TABLE = (
    "no watchdog_jobs table: run `sqlalchemy-watchdog upgrade` first "
    "(it also restores a table dropped by hand; with your own Alembic environment, metadata.create_all)"
)


def database_url(value: str | None) -> URL:
    """The URL to use: ``value``, else ``$WATCHDOG_DATABASE_URL``, else the default.

    A bare ``postgresql://`` URL gets the psycopg 3 driver (psycopg2 is not a
    dependency of this package).
    """
    raw = value or os.environ.get(URL_ENV) or DEFAULT_URL
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError, TypeError) as error:
        # The message may quote the URL: mask its password in both.
        reason = mask_password(str(error).splitlines()[0] if str(error) else type(error).__name__, raw)
        raise UsageError(f"invalid database URL {mask_password(raw, raw)!r}: {reason}") from None
    if url.port is not None and not 0 < url.port < 65536:
        raise UsageError(f"invalid database URL {shown(url)!r}: port {url.port} is not 1-65535")
    backend = known_backend(url.get_backend_name())
    return url if backend is None else backend.with_default_driver(url)


def mask_password(text: str, raw: str) -> str:
    """``text`` with the password of URL ``raw`` (``scheme://user:PASSWORD@``) masked."""
    match = re.match(r"[^:/?#]+://[^:/@?#]*:([^@/?#]*)@", raw)
    if match is None or not match.group(1):
        return text
    return text.replace(match.group(1), "***")


def shown(url: URL) -> str:
    """``url`` as the command shows it: its password masked."""
    return url.render_as_string(hide_password=True)


def open_engine(url: URL) -> Engine:
    """A sync engine on ``url``; an unknown dialect or driver is a usage error.

    ``?prepare_threshold=none`` (or a number) in a psycopg URL becomes
    psycopg's ``prepare_threshold`` connection argument: ``none`` is the
    setting for a connection pooler in transaction mode (see the deployment
    guide), which a URL cannot otherwise express.
    """
    connect_args: dict[str, Any] = {}
    threshold = url.query.get("prepare_threshold")
    if threshold is not None and url.get_driver_name() == "psycopg":
        value = threshold if isinstance(threshold, str) else threshold[-1]
        if value.lower() in ("none", "null", ""):
            connect_args["prepare_threshold"] = None
        elif value.isdigit():
            connect_args["prepare_threshold"] = int(value)
        else:
            raise UsageError(f"prepare_threshold in the URL must be 'none' or a whole number, not {value!r}")
        url = url.difference_update_query(["prepare_threshold"])
    try:
        return create_engine(url, connect_args=connect_args)
    except (ArgumentError, ValueError, TypeError) as error:  # includes NoSuchModuleError
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(f"cannot use {shown(url)}: {reason}") from None


def require_table(engine: Engine) -> None:
    """Fail clearly (and without creating an empty SQLite file) when the
    database has no ``watchdog_jobs`` table yet."""
    _require_file(engine.url)
    if not has_jobs_table(engine):
        raise CommandFailed(f"{NO_TABLE} (database: {shown(engine.url)})")


async def require_table_async(engine: Any) -> None:
    """:func:`require_table` for an ``AsyncEngine``."""
    _require_file(engine.url)
    async with engine.connect() as conn:
        present = await conn.run_sync(has_jobs_table)
    if not present:
        raise CommandFailed(f"{NO_TABLE} (database: {shown(engine.url)})")


def _require_file(url: URL) -> None:
    """Refuse a URL whose database connecting would create (a SQLite file that does not exist)."""
    backend = known_backend(url.get_backend_name())
    missing = None if backend is None else backend.missing_database(url)
    if missing is not None:
        raise CommandFailed(f"{NO_TABLE} ({missing})")
