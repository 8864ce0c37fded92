"""Shared fixtures: every store-level test runs on SQLite and on PostgreSQL.

PostgreSQL comes from ``WATCHDOG_TEST_POSTGRES_URL`` (any database on the
server; the run creates and drops a throwaway database of its own), else
from testcontainers when a Docker engine answers, else its tests skip with
the reason. Under ``CI=true`` an unreachable PostgreSQL fails the run.

Slow fault tests (marker ``slow``) run when ``CI=true`` or
``WATCHDOG_SLOW_TESTS=1``.

Where the dialect does not matter, one copy is enough for a day's work: the
PostgreSQL copy of a test marked ``dialect_neutral`` (on the test, its class
or its module) is deselected by default and runs when ``CI=true`` or
``WATCHDOG_ALL_DIALECTS=1``. A test marked ``dialect_specific`` always runs
on both, even inside a ``dialect_neutral`` module. The dialect matters -- and
a test is not marked neutral -- where it is about locking and concurrent
claims, LISTEN/NOTIFY and wake-ups, query plans, poolers and failover,
migrations and DDL, the SQL a dialect gets of its own (store/*sql.py), the
database clock, or how a value is stored and read back.

Likewise where the runner's driver does not matter: the ``AsyncRunner`` copy
(runner kind ``async`` or ``async-process``) of a test marked
``driver_neutral`` is deselected by default and runs under the same two
settings. A module is marked so where what it tests lies below the driver
(the process executor's pool and children), and the ``Runner`` copy stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sqlalchemy_watchdog import metadata
from tests.runner_kinds import RunnerDriver
from tests.runner_kinds import async_url as async_url

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: tests/release is the smoke suite of an installed wheel: `python3 dev.py
#: release-check` runs it (WATCHDOG_RELEASE_CHECK=1) against a fresh
#: environment outside the checkout; the suite of the checkout leaves it out.
collect_ignore = [] if os.environ.get("WATCHDOG_RELEASE_CHECK") == "1" else ["release"]
RUN_SLOW = IN_CI or os.environ.get("WATCHDOG_SLOW_TESTS") == "1"
#: Run the PostgreSQL copy of the ``dialect_neutral`` tests too.
ALL_DIALECTS = IN_CI or os.environ.get("WATCHDOG_ALL_DIALECTS") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xfail_kind(kind, reason): strict xfail for one runner kind (sync/async) only")


def pytest_report_header(config: pytest.Config) -> str:
    if ALL_DIALECTS:
        return (
            f"dialects: {', '.join(DIALECTS)}; every test on each of its dialects (CI=true or WATCHDOG_ALL_DIALECTS=1)"
        )
    return (
        "dialects: dialect_neutral tests on SQLite only, driver_neutral ones under Runner only "
        "(WATCHDOG_ALL_DIALECTS=1 or CI=true runs their PostgreSQL and AsyncRunner copies)"
    )


def _on_postgresql(item: pytest.Item) -> bool:
    """Whether ``item`` is the PostgreSQL copy of its test: its ``dialect``
    is ``postgresql``, or that of another fixture made once per dialect
    (``params=DIALECTS``, as the bad-input table's module-scoped database)."""
    params = getattr(item, "callspec", None)
    if params is None:
        return False
    if params.params.get("dialect") == "postgresql":
        return True
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(
        value == "postgresql" and name in definitions and list(definitions[name][-1].params or ()) == DIALECTS
        for name, value in params.params.items()
    )


#: The runner kinds of the AsyncRunner, whose copy of a ``driver_neutral`` test is a CI copy.
ASYNC_KINDS = ("async", "async-process")


def _neutral_async_copy(item: pytest.Item) -> bool:
    """The ``AsyncRunner`` copy of a ``driver_neutral`` test."""
    params = getattr(item, "callspec", None)
    if params is None or params.params.get("runner_kind") not in ASYNC_KINDS:
        return False
    return item.get_closest_marker("driver_neutral") is not None


def _day_copy_left_out(item: pytest.Item) -> bool:
    """A copy a day's run leaves to CI (the module's docstring)."""
    return _neutral_postgres_copy(item) or _neutral_async_copy(item)


def _neutral_postgres_copy(item: pytest.Item) -> bool:
    """The PostgreSQL copy of a ``dialect_neutral`` test, not ``dialect_specific``."""
    if not _on_postgresql(item):
        return False
    return (
        item.get_closest_marker("dialect_neutral") is not None and item.get_closest_marker("dialect_specific") is None
    )


def xfail_kind(kind: str, reason: str) -> pytest.MarkDecorator:
    """Mark a conformance test as a known, strict failure of one runner kind
    (``sync`` or ``async``): the test still runs for both, and the mark goes
    once that runner is fixed (strict: an unexpected pass fails the run)."""
    return pytest.mark.xfail_kind(kind, reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not ALL_DIALECTS:
        deselected = [item for item in items if _day_copy_left_out(item)]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if not _day_copy_left_out(item)]
    for item in items:
        params = getattr(item, "callspec", None)
        kind = params.params.get("runner_kind") if params is not None else None
        for mark in item.iter_markers("xfail_kind"):
            if kind == mark.args[0]:
                item.add_marker(pytest.mark.xfail(strict=True, reason=f"{kind}: {mark.args[1]}"))
    if RUN_SLOW:
        return
    skip = pytest.mark.skip(reason="slow test: set WATCHDOG_SLOW_TESTS=1 (CI runs it)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


#: A fixture made once for several tests (the docs build, the plan databases, the browser).
WIDER_SCOPE = re.compile(r"""scope\s*=\s*["'](module|class|package)["']""")


@functools.cache
def _keeps_together(root: Path, path: str) -> bool:
    """Whether the test file ``path`` (relative to ``root``), or a conftest.py
    above it, defines a fixture of a scope wider than a test."""
    file = root / path
    sources = [file, *(parent / "conftest.py" for parent in file.parents if parent.is_relative_to(root))]
    return any(WIDER_SCOPE.search(source.read_text(encoding="utf-8")) for source in sources if source.is_file())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (dev.py): every test is a unit of work of its own,
    handed to whichever worker is free, but a file that defines (or whose
    conftest.py defines) a module-, class- or package-scoped fixture goes to
    one worker whole, so that fixture is made once.

    pytest-xdist's own loadgroup reads ``xdist_group`` marks into node ids,
    which pytest 9 no longer lets it rewrite: the grouping is done here, on
    the node ids alone, where the controller decides."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

    root = config.rootpath

    class ModuleOrTest(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # an xdist_group mark, should xdist read it again
                scope: str = super()._split_scope(nodeid)
                return scope
            path = nodeid.split("::", 1)[0]
            return path if _keeps_together(root, path) else nodeid

    return ModuleOrTest(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests on a fresh event loop (no plugin needed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True


# -- PostgreSQL ---------------------------------------------------------------


def _psycopg(url: URL) -> URL:
    return url.set(drivername="postgresql+psycopg")


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[URL]:
    """A URL of a PostgreSQL server where this run may create databases."""
    configured = os.environ.get("WATCHDOG_TEST_POSTGRES_URL")
    if configured:
        url = _psycopg(make_url(configured))
        try:
            engine = create_engine(url)
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            engine.dispose()
        except Exception as error:
            message = f"WATCHDOG_TEST_POSTGRES_URL={configured} is unreachable: {error}"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        yield url
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver="psycopg") as container:
            yield _psycopg(make_url(container.get_connection_url()))
        return
    message = (
        "no PostgreSQL: set WATCHDOG_TEST_POSTGRES_URL "
        "(e.g. postgresql+psycopg://postgres@127.0.0.1:5432/postgres) or run a Docker engine"
    )
    if IN_CI:
        pytest.fail(message + " -- CI=true requires the PostgreSQL tests to run")
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: URL) -> Iterator[URL]:
    """A throwaway database of this test run, dropped at the end."""
    name = f"watchdog_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield postgres_server.set(database=name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# -- MariaDB / MySQL ----------------------------------------------------------


@pytest.fixture(scope="session")
def mysql_server() -> Iterator[URL]:
    """A URL of a MariaDB (or MySQL) server where this run may create
    databases: ``WATCHDOG_TEST_MYSQL_URL`` (e.g.
    ``mysql+pymysql://root@127.0.0.1:3306/test``), else the tests skip with
    the reason; under ``CI=true`` a missing or unreachable server fails the run."""
    configured = os.environ.get("WATCHDOG_TEST_MYSQL_URL")
    if not configured:
        message = "no MariaDB: set WATCHDOG_TEST_MYSQL_URL (e.g. mysql+pymysql://root@127.0.0.1:3306/test)"
        if IN_CI:
            pytest.fail(message + " -- CI=true requires the MariaDB tests to run")
        pytest.skip(message)
    url = make_url(configured)
    if "+" not in url.drivername:
        url = url.set(drivername=f"{url.get_backend_name()}+pymysql")
    try:
        engine = create_engine(url)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as error:
        message = f"WATCHDOG_TEST_MYSQL_URL={configured} is unreachable: {error}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    yield url


@contextlib.contextmanager
def mysql_database(server: URL, prefix: str) -> Iterator[URL]:
    """A database of its own on the MariaDB server (a MySQL schema is a
    database), dropped afterwards."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}`"))
    try:
        yield server.set(database=name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


@pytest.fixture(scope="session")
def mysql_url(mysql_server: URL) -> Iterator[URL]:
    """A throwaway database of this test run on the MariaDB server."""
    with mysql_database(mysql_server, "watchdog_test") as url:
        yield url


def _reset_mysql(url: URL) -> None:
    engine = create_engine(url.set(database=None), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS `{url.database}`"))
        conn.execute(text(f"CREATE DATABASE `{url.database}`"))
    engine.dispose()


# -- programs of this interpreter, forked ---------------------------------------------


@pytest.fixture(scope="session")
def forks() -> Iterator[Any]:
    """A :class:`tests.forkrun.ForkServer` (one per xdist worker): programs of
    this Python -- the docs blocks, the Alembic recipe's commands, worker
    processes -- forked from an interpreter that imported the package once,
    each still a fresh process of its own; None where ``os.fork`` is not
    there (then they are subprocesses)."""
    from tests import forkrun

    if not forkrun.available():
        yield None
        return
    with forkrun.ForkServer(forkrun.server_env()) as server:
        yield server


# -- a connection pooler ------------------------------------------------------------


@pytest.fixture(scope="session")
def pgbouncer(postgres_server: URL) -> Iterator[Any]:
    """A PgBouncer of this run's own, in transaction mode, in front of the test
    PostgreSQL (tests/servers/pgbouncer.py); skipped with the reason where
    Debian's pgbouncer is not installed (CI installs it, and fails without)."""
    from tests.servers import pgbouncer

    if not pgbouncer.available():
        if IN_CI:
            pytest.fail(pgbouncer.MISSING + " -- CI=true requires the pooler tests to run")
        pytest.skip(pgbouncer.MISSING)
    with pgbouncer.PgBouncer(postgres_server) as bouncer:
        yield bouncer


# -- the two dialects -----------------------------------------------------------

#: The dialects every store test runs on: SQLite and PostgreSQL in a day's
#: run, MariaDB too under CI=true (its copies add a few minutes of the two
#: CPUs). ``WATCHDOG_TEST_DIALECTS`` (comma-separated: ``mariadb``,
#: ``sqlite,postgresql,mariadb``) chooses others, e.g. to run the suite on
#: MariaDB by hand.
DIALECTS = [
    d
    for d in os.environ.get(
        "WATCHDOG_TEST_DIALECTS", "sqlite,postgresql,mariadb" if IN_CI else "sqlite,postgresql"
    ).split(",")
    if d
]
#: The dialects of the tests MariaDB runs in a day's run as well: the
#: schema's (CHECK grammar), the conformance suite, the bad-input table, the
#: unique-key races and the other tests that use it.
WITH_MARIADB = [*DIALECTS, *([] if "mariadb" in DIALECTS else ["mariadb"])]


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def db_url(dialect: str, request: pytest.FixtureRequest, tmp_path: Path) -> URL:
    """A URL of an empty database of the test's dialect (sync driver)."""
    if dialect == "sqlite":
        return make_url(f"sqlite:///{tmp_path / 'watchdog.db'}")
    url: URL = request.getfixturevalue("mysql_url" if dialect == "mariadb" else "postgres_url")
    return url


def _reset_postgres(url: URL) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture
def empty_engine(db_url: URL) -> Iterator[Engine]:
    """An engine on an empty database (no tables)."""
    if db_url.get_backend_name() == "postgresql":
        _reset_postgres(db_url)
    if db_url.get_backend_name() in ("mysql", "mariadb"):
        _reset_mysql(db_url)
    engine = create_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def engine(db_url: URL, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine on a database holding the watchdog tables, empty.

    Made the cheap way, the same tables either way: on SQLite a copy of a
    file ``create_all`` made once per test process (:func:`_sqlite_template`;
    ``create_all`` took about 90 ms a test on a busy machine); on PostgreSQL
    and MariaDB the schema of the run's database (one per test process) is
    kept from test to test while it is still the one ``create_all`` made
    (:func:`_schema_kept`: no test dropped, added or altered a table, an
    index, a constraint, a trigger, a function or a type), its tables
    emptied in milliseconds -- dropping the schema and creating it again took
    about a third of a second a test on PostgreSQL, a second on MariaDB."""
    backend = db_url.get_backend_name()
    if backend == "sqlite":
        database = db_url.database
        assert database is not None
        template = _sqlite_template(Path(database).parent.parent)
        shutil.copyfile(template, database)
        engine = create_engine(db_url)
        yield engine
        engine.dispose()
        return
    engine = create_engine(db_url)
    if not _schema_kept(engine):
        engine.dispose()
        if backend == "postgresql":
            _reset_postgres(db_url)
        else:
            _reset_mysql(db_url)
        engine = create_engine(db_url)
        metadata.create_all(engine)
        with engine.connect() as conn:
            _SCHEMAS[db_url.render_as_string()] = tuple(conn.exec_driver_sql(_schema_query(engine)).one())
    yield engine
    engine.dispose()


#: The file ``create_all`` made, per test process (its first test's tmp_path parent).
_SQLITE_TEMPLATE: list[Path] = []


def _sqlite_template(tmp_root: Path) -> Path:
    """A SQLite file holding the watchdog tables, empty, made once per test
    process (in ``tmp_root``, pytest's directory of this process's temporary
    paths): what ``create_all`` makes, copied for each test."""
    if not _SQLITE_TEMPLATE or not _SQLITE_TEMPLATE[0].exists():
        path = tmp_root / f"watchdog-template-{os.getpid()}.db"
        path.unlink(missing_ok=True)
        engine = create_engine(f"sqlite:///{path}")
        metadata.create_all(engine)
        engine.dispose()
        _SQLITE_TEMPLATE[:] = [path]
    return _SQLITE_TEMPLATE[0]


#: Per PostgreSQL or MariaDB database: its schema's shape once ``create_all``
#: had run there (:func:`_schema_query`).
_SCHEMAS: dict[str, tuple[Any, ...]] = {}

#: The shape of a PostgreSQL database's ``public`` schema: its relations
#: (tables, indexes, sequences, views) with their columns, definitions and
#: storage parameters, its constraints, triggers (and whether each is
#: enabled), functions and types; and which other schemas exist.
_POSTGRES_SCHEMA = (
    "SELECT"
    " (SELECT md5(string_agg(c.relname || ':' || c.relkind::text || ':' || coalesce(array_to_string(c.reloptions, ','), '')"
    "   || ':' || coalesce(pg_get_indexdef(c.oid), ''), ',' ORDER BY c.relname))"
    "  FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace),"
    " (SELECT md5(string_agg(c.relname || '.' || a.attname || ':' || format_type(a.atttypid, a.atttypmod)"
    "   || ':' || a.attnotnull::text || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), ''), ',' ORDER BY c.relname, a.attnum))"
    "  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
    "  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
    "  WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped),"
    " (SELECT md5(string_agg(conname || ':' || pg_get_constraintdef(oid), ',' ORDER BY conname, oid))"
    "  FROM pg_constraint WHERE connamespace = 'public'::regnamespace),"
    " (SELECT md5(string_agg(t.tgname || ':' || t.tgenabled::text || ':' || pg_get_triggerdef(t.oid), ',' ORDER BY t.tgname))"
    "  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'public'::regnamespace),"
    " (SELECT md5(string_agg(p.proname || ':' || md5(p.prosrc), ',' ORDER BY p.proname))"
    "  FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace),"
    " (SELECT md5(string_agg(t.typname, ',' ORDER BY t.typname)) FROM pg_type t"
    "  WHERE t.typnamespace = 'public'::regnamespace),"
    " (SELECT string_agg(nspname, ',' ORDER BY nspname) FROM pg_namespace"
    "  WHERE nspname !~ '^pg_' AND nspname <> 'information_schema')"
)

#: Every sequence of ``public`` back at its start (after the tables are emptied).
_POSTGRES_RESTART = (
    "SELECT count(setval(c.oid::regclass, 1, false)) FROM pg_class c"
    " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'"
)


def _schema_query(engine: Engine) -> str:
    return _POSTGRES_SCHEMA if engine.dialect.name == "postgresql" else _MYSQL_SCHEMA


def _schema_kept(engine: Engine) -> bool:
    """Whether ``engine``'s database still has the schema ``create_all`` made
    there (no test dropped, added or altered a table, an index, a
    constraint, a trigger, a function or a type); then its tables are
    emptied (and on PostgreSQL its sequences restarted), in one transaction."""
    expected = _SCHEMAS.get(engine.url.render_as_string())
    if expected is None:
        return False
    with engine.begin() as conn:
        if tuple(conn.exec_driver_sql(_schema_query(engine)).one()) != expected:
            return False
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(_POSTGRES_RESTART)
    return True


#: The shape of the connected database's schema: its tables, and how many
#: columns, index columns, CHECKs and triggers it has.
_MYSQL_SCHEMA = (
    "SELECT (SELECT GROUP_CONCAT(table_name ORDER BY table_name) FROM information_schema.tables"
    " WHERE table_schema = DATABASE()),"
    " (SELECT count(*) FROM information_schema.columns WHERE table_schema = DATABASE()),"
    " (SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE()),"
    " (SELECT count(*) FROM information_schema.check_constraints WHERE constraint_schema = DATABASE()),"
    " (SELECT count(*) FROM information_schema.triggers WHERE trigger_schema = DATABASE())"
)


def make_async_engine(engine: Engine) -> AsyncEngine:
    """An AsyncEngine (aiosqlite / aiomysql / async psycopg) on ``engine``'s database.

    Create it inside the async test (an engine belongs to one event loop) and
    ``await dispose()`` it at the end.
    """
    return create_async_engine(async_url(engine.url))


def prepared_claims(conn: Any) -> int:
    """How many claim statements ``conn`` (PostgreSQL, a sync ``Connection`` or
    the one ``AsyncConnection.run_sync`` passes) has prepared on the server;
    commits."""
    count = conn.exec_driver_sql(
        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'WITH ready%%'"
    ).scalar_one()
    conn.commit()
    return int(count)


# -- the two runner kinds ---------------------------------------------------------


@pytest.fixture(params=["sync", "async"])
def runner_kind(request: pytest.FixtureRequest) -> str:
    """``sync`` (``Runner``) or ``async`` (``AsyncRunner``): a test taking it
    runs once per kind (and once per dialect when it takes ``engine``)."""
    kind: str = request.param
    return kind


@pytest.fixture
def runners(runner_kind: str, engine: Engine) -> Iterator[RunnerDriver]:
    """A :class:`~tests.runner_kinds.RunnerDriver` of the test's runner kind on
    ``engine``'s database: ``runners.runner(handlers, **settings)`` builds a
    runner with the public keyword arguments of ``Runner``; the runner's
    ``tick()``, ``run_until_idle()`` and ``serving()`` block the test the same
    way for both kinds. Everything it built is stopped and disposed of at
    the end."""
    driver = RunnerDriver(runner_kind, engine.url)
    try:
        yield driver
    finally:
        driver.close()
