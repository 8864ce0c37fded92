"""pytest fixtures for testing code that uses sqlalchemy_watchdog.

Installed with the package as a pytest plugin (entry point ``pytest11``,
name ``sqlalchemy_watchdog``), so there is nothing to add to your
``conftest.py``: ask for the fixtures. ``-p no:sqlalchemy_watchdog`` turns
the plugin off.

* ``watchdog_database_url`` -- the database the tests use, a
  ``sqlalchemy.engine.URL``: ``--watchdog-database-url URL``, else the
  environment variable ``WATCHDOG_TEST_DATABASE_URL``, else a fresh SQLite
  file in the test's ``tmp_path``.
* ``watchdog_engine`` -- a sync ``Engine`` on that database, with the
  ``watchdog_jobs`` table created by the package's own Alembic revisions
  (as ``sqlalchemy-watchdog upgrade`` does), fresh for every test. On
  PostgreSQL each test gets a schema of its own (the engine's connections
  put it first on their ``search_path``, so your own tables created on this
  engine land there too), dropped with everything in it afterwards; connect
  other engines with ``watchdog_engine.url`` to reach the same schema. On
  MariaDB and MySQL each test gets a database of its own on the server
  (``watchdog_engine.url`` names it), dropped afterwards. A
  SQLite URL names a file shared by every test: the watchdog tables are
  created in it before each test and dropped after (it must not hold a
  ``watchdog_jobs`` table to begin with); your own tables there are yours
  to clean up.
* ``watchdog_runner`` -- a :class:`~sqlalchemy_watchdog.testing.RunnerFactory`
  on ``watchdog_engine``: ``watchdog_runner(handlers, **settings)`` builds a
  ``Runner``; ``watchdog_runner.serve(handlers, **settings)`` runs one in a
  background thread. Every runner is stopped at the end of the test.

The helpers to assert on what was enqueued and to run the jobs are in
:mod:`sqlalchemy_watchdog.testing`.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import URL

    from .testing import RunnerFactory

__all__ = [
    "URL_ENV",
    "pytest_addoption",
    "watchdog_database_url",
    "watchdog_engine",
    "watchdog_runner",
]

#: The environment variable naming the test database when the option is not given.
URL_ENV = "WATCHDOG_TEST_DATABASE_URL"
_OPTION = "--watchdog-database-url"
T = TypeVar("T")
#: ``password=...`` of a libpq connection string, quoted or not.
_CONNINFO_PASSWORD = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)
#: The tables ``watchdog_engine`` creates (and drops again in a named SQLite file).
#: The edges table first: its trigger names watchdog_jobs, which SQLite will not drop before it.
_TABLES = (
    "watchdog_job_edges",
    "watchdog_jobs",
    "watchdog_queue_pauses",
    "watchdog_workers",
    "watchdog_schedules",
    "watchdog_limits",
    "watchdog_limit_claims",
    "watchdog_unique_keys",
    "watchdog_job_steps",
    "watchdog_job_signals",
    "alembic_version",
)

# The package is imported inside the fixtures, not here: pytest loads this
# module at start-up in every run of an environment where the package is
# installed, and a test suite that never asks for a fixture pays nothing.


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sqlalchemy_watchdog", "sqlalchemy_watchdog fixtures")
    group.addoption(
        _OPTION,
        dest="watchdog_database_url",
        default=None,
        metavar="URL",
        help=(
            f"database of the watchdog_engine fixture (default: ${URL_ENV}, else a fresh SQLite file per test); "
            "on PostgreSQL each test gets a schema of its own, on MariaDB/MySQL a database, dropped afterwards"
        ),
    )


def _sync_url(url: URL) -> URL:
    """``url`` with a sync driver: a bare ``postgresql://`` and the asyncio
    drivers mean psycopg 3 (a dependency of the package), aiosqlite means
    pysqlite (``Backend.sync_url``)."""
    from .backends import backend_of

    return backend_of(url.get_backend_name()).sync_url(url)


@pytest.fixture
def watchdog_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> URL:
    """The URL of the database ``watchdog_engine`` uses (see the module)."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    configured = request.config.getoption("watchdog_database_url") or os.environ.get(URL_ENV)
    if not configured:
        return make_url(f"sqlite:///{tmp_path / 'watchdog.db'}")
    source = _OPTION if request.config.getoption("watchdog_database_url") else URL_ENV
    try:
        url = make_url(configured)
    except ArgumentError as error:
        pytest.fail(f"{source}: {error}", pytrace=False)
    from .backends import known_backend

    backend = known_backend(url.get_backend_name())
    if backend is None:
        pytest.fail(
            f"{source}: sqlalchemy_watchdog runs on PostgreSQL, SQLite, MariaDB and MySQL, "
            f"not {url.get_backend_name()}",
            pytrace=False,
        )
    unshareable = backend.unshareable(url)
    if unshareable is not None:
        pytest.fail(f"{source}: {unshareable}", pytrace=False)
    return url


@pytest.fixture
def watchdog_engine(watchdog_database_url: URL) -> Iterator[Engine]:
    """An ``Engine`` on a database (PostgreSQL: a schema of its own) with
    the watchdog tables freshly migrated to the package's head revision."""
    from .backends import backend_of

    url = _sync_url(watchdog_database_url)
    backend = backend_of(url.get_backend_name())
    if backend.has_schemas:
        yield from _engine_in_schema(url)
    elif backend.has_databases:
        yield from _engine_in_database(url)
    else:
        yield from _engine_on_file(url)


def _connecting(url: URL, connect: Callable[[], T]) -> T:
    """``connect()``; if the database cannot be reached, fail the test with
    one line naming the host, the port, the user and the database -- never
    the password, and no traceback (whose frames would show the driver's
    connection string, ``password=`` included, in CI logs)."""
    try:
        return connect()
    except Exception as error:  # SQLAlchemy's DBAPIError, or a driver's own error
        reason = _without_password(url, error)
    pytest.fail(  # outside the except block: the driver's error is not chained either
        f"watchdog_engine: cannot connect to the test database {url.database or ''!r} at "
        f"{url.host or 'localhost'}:{url.port or 5432} as {url.username or '(default user)'!r}: {reason}",
        pytrace=False,
    )


def _without_password(url: URL, error: BaseException) -> str:
    """The driver's reason, on one line, with no password in it."""
    from .errors import redacted

    reason = " ".join(redacted(error).split())
    reason = _CONNINFO_PASSWORD.sub("password=***", reason)
    if url.password:
        reason = reason.replace(str(url.password), "***")
    return reason


def _migrated(url: URL) -> Engine:
    from sqlalchemy import create_engine

    from .migrations import apply_revisions

    engine = create_engine(url)
    try:
        with _connecting(url, engine.connect) as conn:
            apply_revisions(conn)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _engine_in_schema(url: URL) -> Iterator[Engine]:
    """An engine on a schema of its own (PostgreSQL), dropped afterwards."""
    from sqlalchemy import create_engine, text

    schema = f"watchdog_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    options = url.query.get("options")
    if isinstance(options, tuple):
        options = " ".join(options)
    # libpq's "options" (psycopg 3 and psycopg2, sync and async): every
    # connection of the engine -- the runner's LISTEN connection included --
    # and of any engine made from watchdog_engine.url starts in the schema.
    in_schema = url.update_query_dict({"options": f"{options or ''} -csearch_path={schema}".strip()})
    admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=_null_pool())
    try:
        with _connecting(url, admin.connect) as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        try:
            engine = _migrated(in_schema)
            try:
                yield engine
            finally:
                engine.dispose()
        finally:
            with admin.connect() as conn:
                # A connection the test left open in the schema fails the
                # teardown after 10 s instead of hanging the run. SET LOCAL,
                # in a transaction: no setting outlives it on a pooled session.
                conn.execution_options(isolation_level="READ COMMITTED")
                with conn.begin():
                    conn.execute(text("SET LOCAL lock_timeout = '10s'"))
                    conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        admin.dispose()


def _engine_in_database(url: URL) -> Iterator[Engine]:
    """An engine on a database of its own on the server (MariaDB/MySQL: a
    schema is a database), made next to the URL's and dropped afterwards."""
    from sqlalchemy import create_engine, text

    name = f"watchdog_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=_null_pool())
    quoted = admin.dialect.identifier_preparer.quote(name)
    try:
        with _connecting(url, admin.connect) as conn:
            conn.execute(text(f"CREATE DATABASE {quoted}"))
        try:
            engine = _migrated(url.set(database=name))
            try:
                yield engine
            finally:
                engine.dispose()
        finally:
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {quoted}"))
    finally:
        admin.dispose()


def _engine_on_file(url: URL) -> Iterator[Engine]:
    """An engine on a database file (SQLite), the tables it made dropped afterwards."""
    from sqlalchemy import inspect, text

    engine, preexisting = _created_sqlite(url)
    try:
        yield engine
    finally:
        try:
            present = set(inspect(engine).get_table_names())
            with engine.begin() as conn:
                for table in _TABLES:
                    if table in present and table not in preexisting:
                        conn.execute(text(f'DROP TABLE "{table}"'))
        finally:
            engine.dispose()


def _created_sqlite(url: URL) -> tuple[Engine, frozenset[str]]:
    """A SQLite engine on ``url`` with the tables migrated, and which of
    :data:`_TABLES` were there before; refuses a file that holds a
    ``watchdog_jobs`` table already."""
    from sqlalchemy import create_engine, inspect

    probe = create_engine(url, poolclass=_null_pool())
    try:
        present = set(_connecting(url, lambda: inspect(probe)).get_table_names())
    finally:
        probe.dispose()
    if "watchdog_jobs" in present:
        pytest.fail(
            f"watchdog_engine: {url.database} already holds a watchdog_jobs table (left by an interrupted run?); "
            "the fixture creates the table for each test and drops it afterwards: delete the file, or name "
            "another one",
            pytrace=False,
        )
    return _migrated(url), frozenset(present & set(_TABLES))


def _null_pool() -> type:
    from sqlalchemy.pool import NullPool

    return NullPool


@pytest.fixture
def watchdog_runner(watchdog_engine: Engine) -> Iterator[RunnerFactory]:
    """A :class:`~sqlalchemy_watchdog.testing.RunnerFactory` on
    ``watchdog_engine``; every runner it built is stopped at the end of the
    test (a served one that does not stop fails the teardown)."""
    from .testing import RunnerFactory

    factory = RunnerFactory(watchdog_engine)
    try:
        yield factory
    finally:
        factory.close()
