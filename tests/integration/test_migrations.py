"""Alembic: the repository's own environment, and an application's environment
that includes sqlalchemy_watchdog's revisions through ``version_locations``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import CheckConstraint, Engine, MetaData, UniqueConstraint, create_engine, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError

import sqlalchemy_watchdog
from sqlalchemy_watchdog import Decision, Job, JobState, Outcome, Rate, RetryPolicy, Runner, Watchdog, enqueue, store
from sqlalchemy_watchdog.backends import backend_of
from tests.conftest import DIALECTS
from tests.helpers import HEAD_REVISION, check_names, index_names

REPO = Path(__file__).resolve().parents[2]
ALEMBIC_INI = REPO / "alembic.ini"
ALEMBIC = [sys.executable, "-m", "alembic"]


def repo_config() -> Config:
    """The repository's alembic.ini (its env.py leaves pytest's logging alone)."""
    config = Config(str(ALEMBIC_INI))
    config.attributes["configure_logger"] = False
    return config


def run(engine: Engine, operation: Any, *args: Any) -> None:
    """Run an Alembic command of the repository's environment on ``engine``."""
    config = repo_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        operation(config, *args)


def tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def differences(engine: Engine, target: MetaData | list[MetaData]) -> list[Any]:
    # compare_metadata takes a list of MetaData too, as Alembic's own target_metadata does.
    with engine.connect() as conn:
        found: list[Any] = compare_metadata(MigrationContext.configure(conn), target)  # type: ignore[arg-type]
        return found


def schema_names(engine: Engine) -> dict[str, set[Any]]:
    """Names of watchdog_jobs' constraints and indexes as the database reports them."""
    inspector = inspect(engine)
    return {
        "check": check_names(engine),
        "unique": {c["name"] for c in inspector.get_unique_constraints("watchdog_jobs")},
        "index": index_names(engine),
        **{f"check {table}": check_names(engine, table) for table in OTHER_TABLES if inspector.has_table(table)},
    }


#: The tables of revision w0009, whose CHECK constraints are compared by name too.
OTHER_TABLES = ("watchdog_workers", "watchdog_schedules", "watchdog_limits", "watchdog_limit_claims")


def model_names(dialect: str) -> dict[str, set[Any]]:
    """The names the model gives on ``dialect`` (the stored-type CHECKs of
    w0010 are SQLite's only).

    On MariaDB/MySQL an index cannot be partial: the model's unique index
    ``uq_watchdog_jobs_cancellation_id`` (partial elsewhere) is a whole
    ``UNIQUE KEY`` there, which is the unique constraint itself -- the
    inspector reports it among the unique constraints, and ``index_names``
    leaves it out with the other unique keys. So there it is named under
    ``unique``, not ``index`` (``create_all`` makes exactly that: the
    physical schemas are compared in
    test_upgrade_head_on_mariadb_makes_what_create_all_makes_...)."""
    table = sqlalchemy_watchdog.metadata.tables["watchdog_jobs"]
    unique_keys = dialect in ("mysql", "mariadb")
    return {
        "check": {
            c.name
            for c in table.constraints
            if isinstance(c, CheckConstraint) and (dialect == "sqlite" or not str(c.name).endswith("_stored_type"))
        },
        "unique": {c.name for c in table.constraints if isinstance(c, UniqueConstraint)}
        | {i.name for i in table.indexes if unique_keys and i.unique},
        "index": {i.name for i in table.indexes if isinstance(i.name, str) and not (unique_keys and i.unique)},
        **{
            f"check {name}": {
                c.name for c in sqlalchemy_watchdog.metadata.tables[name].constraints if isinstance(c, CheckConstraint)
            }
            for name in OTHER_TABLES
        },
    }


# -- the repository's own environment ------------------------------------------------


#: The package's newest revision.
HEAD = HEAD_REVISION

#: The dialects whose schema went through the revisions w0002..w0021 one by
#: one (PostgreSQL, SQLite): the per-revision tests (test_w0002_... to
#: test_w0019_...) run on these. On MariaDB/MySQL, w0001 makes the schema of
#: w0021 at once and w0002..w0021 change nothing (docs/howto/mariadb.md,
#: "Schema revisions"), so the tables those tests write by hand at an older
#: revision never exist there; what holds there instead is proved by
#: test_w0002_to_w0021_change_nothing_on_mariadb_and_jobs_written_after_w0001_reach_head.
HISTORY_DIALECTS = [dialect for dialect in DIALECTS if dialect != "mariadb"]
W0001 = "w0001_watchdog_jobs"


def test_upgrade_head_creates_the_jobs_table(empty_engine: Engine) -> None:
    run(empty_engine, command.upgrade, "head")
    assert "watchdog_jobs" in tables(empty_engine)
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == HEAD


def test_migrated_table_takes_jobs(empty_engine: Engine) -> None:
    run(empty_engine, command.upgrade, "head")
    with empty_engine.begin() as conn:
        enqueue(conn, Job("job-1", "emails", payload={"to": "a@example.com"}))
    job = Watchdog(empty_engine).read("job-1")
    assert job is not None and job.state is JobState.QUEUED and job.sequence >= 1


def test_downgrade_base_removes_the_jobs_table(empty_engine: Engine) -> None:
    run(empty_engine, command.upgrade, "head")
    run(empty_engine, command.downgrade, "base")
    assert "watchdog_jobs" not in tables(empty_engine)


def test_upgrade_downgrade_upgrade_works(empty_engine: Engine) -> None:
    run(empty_engine, command.upgrade, "head")
    with empty_engine.begin() as conn:
        enqueue(conn, Job("before", "q"))
    run(empty_engine, command.downgrade, "base")
    run(empty_engine, command.upgrade, "head")
    with empty_engine.begin() as conn:
        enqueue(conn, Job("after", "q"))
    watchdog = Watchdog(empty_engine)
    assert watchdog.read("before") is None
    assert watchdog.read("after") is not None
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []


def test_migrated_schema_equals_the_model(empty_engine: Engine) -> None:
    run(empty_engine, command.upgrade, "head")
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []


def test_migrated_constraint_names_equal_the_models(empty_engine: Engine) -> None:
    # compare_metadata ignores CHECK constraints, so compare their names directly:
    # a later migration must be able to drop or alter them by their model name.
    run(empty_engine, command.upgrade, "head")
    assert schema_names(empty_engine) == model_names(empty_engine.dialect.name)


def _mysql_schema(engine: Engine) -> dict[str, str]:
    """Every table's ``SHOW CREATE TABLE`` (its lines, in any order) and every
    trigger's event, timing, body and sql_mode in ``engine``'s MariaDB
    database: the schema as the server holds it."""
    with engine.connect() as conn:
        # Each table's lines sorted: the server lists indexes in the order they were made.
        found = {
            f"table {name}": "\n".join(
                sorted(str(conn.exec_driver_sql(f"SHOW CREATE TABLE `{name}`").one()[1]).splitlines())
            )
            for name in conn.exec_driver_sql("SHOW TABLES").scalars()
            if name != "alembic_version"
        }
        triggers = conn.exec_driver_sql(
            "SELECT trigger_name, event_manipulation, event_object_table, action_timing, action_statement, sql_mode"
            " FROM information_schema.triggers WHERE trigger_schema = DATABASE()"
        )
        return found | {f"trigger {row[0]}": repr(tuple(row[1:])) for row in triggers}


@pytest.mark.parametrize("dialect", ["mariadb"])
def test_upgrade_head_on_mariadb_makes_what_create_all_makes_and_downgrading_to_base_drops_it(
    empty_engine: Engine, mysql_server: URL
) -> None:
    from tests.conftest import mysql_database

    run(empty_engine, command.upgrade, "head")
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == HEAD
    with mysql_database(mysql_server, "watchdog_model") as url:
        model = create_engine(url)
        try:
            sqlalchemy_watchdog.metadata.create_all(model)
            expected = _mysql_schema(model)
        finally:
            model.dispose()
    assert _mysql_schema(empty_engine) == expected
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []
    # The CHECKs, unique keys and indexes by the model's names.
    assert schema_names(empty_engine) == model_names(empty_engine.dialect.name)
    # It takes jobs, and a dependent is released by its parent's settlement.
    with empty_engine.begin() as conn:
        enqueue(conn, [Job("parent", "q"), Job("child", "q", after=["parent"])])
    watchdog = Watchdog(empty_engine)
    ran = Runner(empty_engine, {"q": lambda job: Decision.completed()}).run_until_idle()
    assert [job.job_id for job in ran] == ["parent", "child"]
    assert watchdog.read("child").outcome is Outcome.COMPLETED  # type: ignore[union-attr]
    run(empty_engine, command.downgrade, "base")
    assert not any(key.startswith(("table watchdog", "trigger")) for key in _mysql_schema(empty_engine))
    run(empty_engine, command.upgrade, "head")
    assert _mysql_schema(empty_engine) == expected


def _mysql_rows(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table but alembic_version in ``engine``'s MariaDB database, by table."""
    with engine.connect() as conn:
        names = [name for name in conn.exec_driver_sql("SHOW TABLES").scalars() if name != "alembic_version"]
        return {
            name: sorted((tuple(row) for row in conn.exec_driver_sql(f"SELECT * FROM `{name}`")), key=repr)
            for name in names
        }


def _version(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one())


@pytest.mark.parametrize("dialect", ["mariadb"])
def test_w0002_to_w0021_change_nothing_on_mariadb_and_jobs_written_after_w0001_reach_head(
    empty_engine: Engine,
) -> None:
    """MariaDB's counterpart of the per-revision tests (HISTORY_DIALECTS):
    w0001 makes the schema of w0021 at once, so each of w0002..w0021, up one
    at a time and down again, leaves the schema (tables, CHECKs, indexes,
    triggers) and every row as they were; jobs enqueued at w0001 reach head
    and run there, a dependent released by its parent; and going down from
    head to w0021 gives back the schema w0001 made."""
    engine = empty_engine
    script = ScriptDirectory.from_config(repo_config())
    steps = [revision.revision for revision in reversed(list(script.walk_revisions(W0001, W0021)))]
    assert [revision[:5] for revision in steps] == [f"w{n:04d}" for n in range(1, 22)]

    run(engine, command.upgrade, W0001)
    watchdog = Watchdog(engine)
    with engine.begin() as conn:
        enqueue(
            conn,
            [
                Job("parent", "q", payload={"n": 1}),
                Job("child", "q", after=["parent"]),
                Job("keyed", "q", key="tenant-1"),
                Job("once", "q", unique_key="daily", unique_for=timedelta(hours=1)),
            ],
        )
        enqueue(conn, Job("later", "q"), delay=timedelta(hours=1))
    watchdog.set_limits("q", concurrency=4)
    # Taken after the writes: SHOW CREATE TABLE shows the sequence counter (AUTO_INCREMENT) too.
    made = _mysql_schema(engine)
    assert {"table watchdog_jobs", "table watchdog_job_steps", "trigger watchdog_job_edges_counted"} <= set(made)
    rows = _mysql_rows(engine)
    assert {table: len(found) for table, found in rows.items() if found} == {
        "watchdog_jobs": 5,
        "watchdog_job_edges": 1,
        "watchdog_unique_keys": 1,
        "watchdog_limits": 1,
    }

    for revision in steps[1:]:
        run(engine, command.upgrade, revision)
        assert _version(engine) == revision
        assert _mysql_schema(engine) == made, revision
        assert _mysql_rows(engine) == rows, revision
    for revision in reversed(steps[:-1]):
        run(engine, command.downgrade, revision)
        assert _version(engine) == revision
        assert _mysql_schema(engine) == made, revision
        assert _mysql_rows(engine) == rows, revision

    run(engine, command.upgrade, "head")
    assert _version(engine) == HEAD
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    at_head = _mysql_rows(engine)
    assert {table: at_head[table] for table in rows} == rows
    assert watchdog.read("parent").payload == {"n": 1}  # type: ignore[union-attr]
    ran = [job.job_id for job in Runner(engine, {"q": lambda job: Decision.completed()}).run_until_idle()]
    assert sorted(ran) == ["child", "keyed", "once", "parent"] and ran.index("parent") < ran.index("child")
    assert all(watchdog.read(job_id).outcome is Outcome.COMPLETED for job_id in ran)  # type: ignore[union-attr]
    assert watchdog.read("later").state is JobState.DELAYED  # type: ignore[union-attr]

    run(engine, command.downgrade, W0021)
    assert _mysql_schema(engine) == made


def triggers_and_functions(engine: Engine) -> dict[str, str]:
    """Our triggers (and, on PostgreSQL, our trigger functions) by name, each
    with its definition as the database reports it (on MariaDB/MySQL, which
    has no trigger functions: its event, table, timing, body and sql_mode)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"))
            return {str(name): str(sql) for name, sql in rows}
        if engine.dialect.name in ("mysql", "mariadb"):
            rows = conn.execute(
                text(
                    "SELECT trigger_name, event_manipulation, event_object_table, action_timing,"
                    " action_statement, sql_mode FROM information_schema.triggers"
                    " WHERE trigger_schema = DATABASE() AND event_object_table LIKE 'watchdog%'"
                )
            )
            return {f"trigger {row[0]}": repr(tuple(str(value) for value in row[1:])) for row in rows}
        triggers = conn.execute(
            text(
                "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal"
                " AND tgrelid IN (to_regclass('watchdog_jobs'), to_regclass('watchdog_job_edges'))"
            )
        )
        found = {f"trigger {name}": str(definition) for name, definition in triggers}
        functions = conn.execute(
            text("SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE proname LIKE 'watchdog%'")
        )
        return found | {f"function {name}": str(definition) for name, definition in functions}


def _notify_function(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT pg_get_functiondef('watchdog_jobs_notify_queued'::regproc)")).scalar_one())


@pytest.mark.parametrize("dialect", ["postgresql"])  # SQLite has no trigger function
def test_head_notifies_only_while_a_runner_waits_and_the_downgrade_always_notifies(empty_engine: Engine) -> None:
    """w0007's trigger function is the model's (create_all), and going down
    to w0006 restores the one that notifies on every enqueue."""
    run(empty_engine, command.upgrade, "head")
    migrated = _notify_function(empty_engine)
    assert "pg_try_advisory_xact_lock_shared" in migrated
    run(empty_engine, command.downgrade, "w0006_index_review")
    assert "pg_try_advisory_xact_lock_shared" not in _notify_function(empty_engine)
    assert "pg_notify('watchdog_jobs', 'queued')" in _notify_function(empty_engine)
    run(empty_engine, command.downgrade, "base")
    sqlalchemy_watchdog.metadata.create_all(empty_engine)
    assert _notify_function(empty_engine) == migrated


def test_migration_creates_and_drops_the_same_triggers_as_the_model(empty_engine: Engine) -> None:
    # Triggers are invisible to compare_metadata too: the same names and the
    # same definitions (a WHEN clause or a function body that drifted from the
    # model's would change what a settlement does on a migrated database).
    sqlalchemy_watchdog.metadata.create_all(empty_engine)
    created = triggers_and_functions(empty_engine)
    # The dialect's dependency triggers are there to compare (MariaDB has the edges' two only).
    assert {f"trigger {name}" for name in backend_of(empty_engine.dialect).trigger_names} <= {
        key if key.startswith(("trigger ", "function ")) else f"trigger {key}" for key in created
    }
    sqlalchemy_watchdog.metadata.drop_all(empty_engine)
    assert triggers_and_functions(empty_engine) == {}
    run(empty_engine, command.upgrade, "head")
    assert triggers_and_functions(empty_engine) == created
    run(empty_engine, command.downgrade, "base")
    assert triggers_and_functions(empty_engine) == {}


def _drop_the_jobs_table_by_hand(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE watchdog_jobs"))
    assert "watchdog_jobs" not in tables(engine)


def _dependencies_still_work(engine: Engine) -> None:
    """The restored table's triggers: a dependent runs once its parent completes."""
    with engine.begin() as conn:
        enqueue(conn, [Job("parent", "q"), Job("child", "q", after=["parent"])])
    ran = [job.job_id for job in Runner(engine, {"q": lambda job: None}).run_until_idle()]
    assert ran == ["parent", "child"]


def test_a_jobs_table_dropped_by_hand_is_restored_by_create_all_and_by_upgrade(
    empty_engine: Engine, db_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    """``DROP TABLE watchdog_jobs`` leaves its domains (PostgreSQL) and the edges'
    trigger behind: ``create_all`` makes them afresh instead of failing on
    ``DuplicateObject`` or skipping the jobs' dependency triggers; so does
    ``sqlalchemy-watchdog upgrade``, though alembic_version says head; and the
    CLI's error for the missing table says so."""
    from sqlalchemy_watchdog.cli import main

    url = db_url.render_as_string(hide_password=False)
    assert main(["--url", url, "upgrade"]) == 0
    made = triggers_and_functions(empty_engine)
    _drop_the_jobs_table_by_hand(empty_engine)
    capsys.readouterr()
    assert main(["--url", url, "stats"]) != 0
    assert "restores a table dropped by hand" in capsys.readouterr().err
    assert main(["--url", url, "upgrade"]) == 0
    assert "watchdog_jobs" in tables(empty_engine)
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(empty_engine) == model_names(empty_engine.dialect.name)
    assert triggers_and_functions(empty_engine) == made
    _dependencies_still_work(empty_engine)

    _drop_the_jobs_table_by_hand(empty_engine)
    sqlalchemy_watchdog.metadata.create_all(empty_engine)
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(empty_engine) == model_names(empty_engine.dialect.name)
    assert triggers_and_functions(empty_engine) == made
    _dependencies_still_work(empty_engine)


def test_a_jobs_table_dropped_by_hand_at_an_older_revision_is_refused_with_what_to_do(
    empty_engine: Engine, db_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    from sqlalchemy_watchdog.cli import main

    run(empty_engine, command.upgrade, "w0015_rate_per_key")
    _drop_the_jobs_table_by_hand(empty_engine)
    capsys.readouterr()
    assert main(["--url", db_url.render_as_string(hide_password=False), "upgrade"]) != 0
    err = capsys.readouterr().err
    assert "dropped by hand" in err and "DELETE FROM alembic_version" in err, err


def test_alembic_cli_upgrade_head_from_the_repository_root_uses_watchdog_database_url(
    db_url: URL, empty_engine: Engine
) -> None:
    env = {**os.environ, "WATCHDOG_DATABASE_URL": db_url.render_as_string(hide_password=False)}
    result = subprocess.run([*ALEMBIC, "upgrade", "head"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "watchdog_jobs" in tables(empty_engine)
    run(empty_engine, command.check)  # raises AutogenerateDiffsDetected on any drift


def test_alembic_defaults_to_watchdog_db_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WATCHDOG_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    command.upgrade(repo_config(), "head")
    engine = create_engine(f"sqlite:///{tmp_path / 'watchdog.db'}")
    try:
        assert "watchdog_jobs" in tables(engine)
    finally:
        engine.dispose()


# -- an application's own environment (the README recipe) ----------------------------

APP_ALEMBIC_INI = """\
[alembic]
script_location = %(here)s/migrations
path_separator = space
version_locations = %(here)s/migrations/versions sqlalchemy_watchdog:migrations/versions
sqlalchemy.url = {url}
"""

APP_MODELS = """\
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String(40), unique=True)
"""

APP_ENV = """\
from alembic import context
from sqlalchemy import engine_from_config, pool

import sqlalchemy_watchdog
from myapp.models import Base

config = context.config

# Both: autogenerate then knows watchdog_jobs and never proposes to drop it.
target_metadata = [Base.metadata, sqlalchemy_watchdog.metadata]

connectable = engine_from_config(
    config.get_section(config.config_ini_section, {}),
    prefix="sqlalchemy.",
    poolclass=pool.NullPool,
)
with connectable.connect() as connection:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
"""

APP_REVISION = '''\
"""Create orders."""

import sqlalchemy as sa
from alembic import op

revision = "a0001_orders"
down_revision = None
branch_labels = ("app",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("reference", sa.String(length=40), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("reference"),
    )


def downgrade() -> None:
    op.drop_table("orders")
'''


@pytest.fixture
def app_env(tmp_path: Path, db_url: URL, empty_engine: Engine) -> Path:
    """A throwaway application with its own Alembic environment and ``orders`` table."""
    root = tmp_path / "app"
    (root / "myapp").mkdir(parents=True)
    (root / "myapp" / "__init__.py").write_text("")
    (root / "myapp" / "models.py").write_text(APP_MODELS)
    (root / "migrations" / "versions").mkdir(parents=True)
    (root / "migrations" / "env.py").write_text(APP_ENV)
    (root / "migrations" / "versions" / "a0001_orders.py").write_text(APP_REVISION)
    url = db_url.render_as_string(hide_password=False).replace("%", "%%")
    (root / "alembic.ini").write_text(APP_ALEMBIC_INI.format(url=url))
    return root


@pytest.fixture
def app_alembic(app_env: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run an Alembic command in the application's environment, as its CLI would."""
    monkeypatch.syspath_prepend(str(app_env))
    monkeypatch.delenv("WATCHDOG_DATABASE_URL", raising=False)
    for name in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
        monkeypatch.delitem(sys.modules, name)

    def alembic(operation: Any, *args: Any) -> None:
        operation(Config(str(app_env / "alembic.ini")), *args)

    yield alembic
    for name in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
        del sys.modules[name]


def app_metadata(root: Path) -> MetaData:
    spec = importlib.util.spec_from_file_location(f"app_models_{id(root)}", root / "myapp" / "models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found: MetaData = module.Base.metadata
    return found


def test_application_upgrade_heads_creates_its_table_and_the_jobs_table(app_alembic: Any, empty_engine: Engine) -> None:
    app_alembic(command.upgrade, "heads")
    assert {"orders", "watchdog_jobs"} <= tables(empty_engine)
    with empty_engine.connect() as conn:
        versions = set(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())
    assert versions == {"a0001_orders", HEAD}
    assert schema_names(empty_engine) == model_names(empty_engine.dialect.name)
    with empty_engine.begin() as conn:
        conn.execute(text("INSERT INTO orders (id, reference) VALUES (1, 'A-1')"))
        enqueue(conn, Job("confirm-A-1", "emails"))
    assert Watchdog(empty_engine).read("confirm-A-1") is not None


def test_application_autogenerate_finds_no_difference_and_keeps_the_jobs_table(
    app_alembic: Any, app_env: Path, empty_engine: Engine
) -> None:
    app_alembic(command.upgrade, "heads")
    app_alembic(command.check)  # `alembic check`: raises AutogenerateDiffsDetected on any drift

    app = app_metadata(app_env)
    assert differences(empty_engine, [app, sqlalchemy_watchdog.metadata]) == []
    # Without sqlalchemy_watchdog.metadata in target_metadata, autogenerate would
    # propose to drop our table: that is what listing it prevents.
    dropped = [d[1].name for d in differences(empty_engine, app) if d[0] == "remove_table"]
    assert "watchdog_jobs" in dropped


def test_application_can_upgrade_and_downgrade_the_watchdog_branch_alone(
    app_alembic: Any, empty_engine: Engine
) -> None:
    app_alembic(command.upgrade, "watchdog@head")
    assert "watchdog_jobs" in tables(empty_engine)
    assert "orders" not in tables(empty_engine)
    app_alembic(command.downgrade, "watchdog@base")
    assert "watchdog_jobs" not in tables(empty_engine)


@pytest.mark.parametrize("dialect", ["sqlite"])  # the in-process tests above cover both dialects
def test_application_cli_upgrade_heads_creates_both_tables(app_env: Path, empty_engine: Engine) -> None:
    env = {**os.environ, "PYTHONPATH": str(app_env)}
    env.pop("WATCHDOG_DATABASE_URL", None)
    result = subprocess.run([*ALEMBIC, "upgrade", "heads"], cwd=app_env, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {"orders", "watchdog_jobs"} <= tables(empty_engine)


def _jobs_in_every_state(engine: Engine) -> dict[str, tuple[str, str | None, str | None]]:
    """Queued, running and settled (completed, failed) jobs, written as w0001's
    schema stores them (today's statements read a column w0001 lacks)."""
    rows = [
        ("waiting", "queued", None, None, None, None),
        ("running", "running", None, "claim_x.1", 4_102_444_800_000, None),
        ("done", "settled", "completed", "claim_x.2", None, None),
        ("broken", "settled", "failed", "claim_x.3", None, "no"),
    ]
    with engine.begin() as conn:
        for job_id, state, outcome, token, lease, reason in rows:
            conn.execute(
                text(
                    "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state,"
                    " outcome, claim_token, lease_until, failure_reason, recovery_count)"
                    " VALUES (:job_id, 'q', :job_id, 0, 'null', :state, :outcome, :token, :lease, :reason, 0)"
                ),
                dict(job_id=job_id, state=state, outcome=outcome, token=token, lease=lease, reason=reason),
            )
    return {job_id: (state, outcome, reason) for job_id, state, outcome, _, _, reason in rows}


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0002_upgrades_and_downgrades_a_table_holding_jobs_in_every_state(empty_engine: Engine) -> None:
    """Rows keep their meaning both ways; rows from before the upgrade have no
    recorded traceback (NULL)."""
    run(empty_engine, command.upgrade, "w0001_watchdog_jobs")
    before = _jobs_in_every_state(empty_engine)
    assert {state for state, _, _ in before.values()} == {"queued", "running", "settled"}
    run(empty_engine, command.upgrade, "head")
    watchdog = Watchdog(empty_engine)
    for job_id, (state, outcome, reason) in before.items():
        job = watchdog.read(job_id)
        assert job is not None and (job.state.value, job.outcome and job.outcome.value, job.failure_reason) == (
            state,
            outcome,
            reason,
        )
        assert job.failure_detail is None
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []
    run(empty_engine, command.downgrade, "w0001_watchdog_jobs")
    with empty_engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id, state, outcome, failure_reason FROM watchdog_jobs"))
        assert {row.job_id: (row.state, row.outcome, row.failure_reason) for row in rows} == before
        assert "failure_detail" not in {c["name"] for c in inspect(conn).get_columns("watchdog_jobs")}


# -- w0004: operations (timestamps, reruns, pauses) ------------------------------------------

_W0004_COLUMNS = {"enqueued_at", "started_at", "settled_at", "rerun_of"}
_W0004_INDEXES = {"ix_watchdog_jobs_settled", "ix_watchdog_jobs_rerun_of"}


def _w0003_jobs_in_every_state(engine: Engine) -> dict[str, tuple[str, str | None, int]]:
    """Delayed, queued, running and settled jobs (every outcome) and a job
    retried once, written as w0003's schema stores them."""
    far = 4_102_444_800_000
    history = '[{"at": 1700000000000, "attempt": 1, "reason": "flaky"}]'
    rows = [
        # job_id, state, outcome, claim_token, lease_until, ready_at, attempt, max_attempts, history, cancellation
        ("later", "delayed", None, None, None, far, 1, None, None, None),
        ("waiting", "queued", None, None, None, None, 1, None, None, None),
        ("retried", "queued", None, None, None, 1_700_000_001_000, 2, 3, history, None),
        ("running", "running", None, "claim_x.4", far, None, 1, None, None, None),
        ("done", "settled", "completed", "claim_x.5", None, None, 1, None, None, None),
        ("broken", "settled", "failed", "claim_x.6", None, None, 2, 2, history, None),
        ("stopped", "settled", "cancelled", None, None, None, 1, None, None, "stop-it"),
        ("lost", "settled", "interrupted", "claim_x.8", None, None, 1, None, None, None),
        ("unsure", "settled", "outcome_unknown", "claim_x.9", None, None, 1, None, None, None),
    ]
    with engine.begin() as conn:
        for job_id, state, outcome, token, lease, ready, attempt, max_attempts, failures, cancellation in rows:
            conn.execute(
                text(
                    "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, outcome,"
                    " claim_token, lease_until, recovery_count, cancellation_id, ready_at, attempt, max_attempts,"
                    " failure_history, snoozes)"
                    " VALUES (:job_id, 'q', :job_id, 0, '{\"n\": 1}', :state, :outcome, :token, :lease, 0,"
                    " :cancellation, :ready, :attempt, :max_attempts, :failures, 0)"
                ),
                dict(
                    job_id=job_id,
                    state=state,
                    outcome=outcome,
                    token=token,
                    lease=lease,
                    cancellation=cancellation,
                    ready=ready,
                    attempt=attempt,
                    max_attempts=max_attempts,
                    failures=failures,
                ),
            )
    return {job_id: (state, outcome, attempt) for job_id, state, outcome, _, _, _, attempt, _, _, _ in rows}


def _w0004_rows(engine: Engine) -> dict[str, tuple[str, str | None, int]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id, state, outcome, attempt FROM watchdog_jobs"))
        return {row.job_id: (row.state, row.outcome, row.attempt) for row in rows}


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0004_upgrades_and_downgrades_a_table_holding_jobs_in_every_state(empty_engine: Engine) -> None:
    """Rows keep their meaning both ways; rows from before the upgrade have no
    recorded times (NULL); the downgrade drops the new columns, indexes and
    the pauses table, and keeps every row."""
    from datetime import timedelta

    from sqlalchemy_watchdog import Decision, PauseStatus
    from sqlalchemy_watchdog import store as watchdog_store

    run(empty_engine, command.upgrade, "w0003_time_and_retries")
    before = _w0003_jobs_in_every_state(empty_engine)
    assert {state for state, _, _ in before.values()} == {"delayed", "queued", "running", "settled"}
    run(empty_engine, command.upgrade, "head")
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []
    watchdog = Watchdog(empty_engine)
    for job_id, (state, outcome, attempt) in before.items():
        job = watchdog.read(job_id)
        assert job is not None
        assert (job.state.value, job.outcome and job.outcome.value, job.attempt) == (state, outcome, attempt)
        assert (job.enqueued_at, job.started_at, job.settled_at, job.rerun_of, job.reruns) == (None,) * 4 + ((),)
    retried = watchdog.read("retried")
    assert (
        retried is not None and retried.max_attempts == 3 and [f.reason for f in retried.failure_history] == ["flaky"]
    )
    assert [job.job_id for job in watchdog.list_jobs()] == list(before)
    stats = watchdog.stats().queue("q")
    assert (stats.delayed, stats.queued, stats.running, stats.settled_last_hour) == (1, 2, 1, {})
    # Undated settled jobs stay unless asked for.
    assert watchdog.prune(older_than=timedelta(0)) == 0
    # The upgraded table works: a claim and a settle record their times; pauses and reruns work.
    with watchdog_store.write_transaction(empty_engine) as conn:
        [claim] = watchdog_store.claim(conn, queues=["q"], limit=1, lease_ms=60_000).claimed
    with watchdog_store.write_transaction(empty_engine) as conn:
        watchdog_store.settle(conn, job_id=claim.job.job_id, claim_token=claim.token, decision=Decision.completed())
    assert claim.job.job_id == "waiting"
    waiting = watchdog.read("waiting")
    assert waiting is not None and waiting.started_at is not None and waiting.settled_at is not None
    assert watchdog.rerun("done", rerun_id="again").job_id == "done~rerun~again"
    assert watchdog.pause("q", reason="migrating") is PauseStatus.PAUSED

    run(empty_engine, command.downgrade, "w0003_time_and_retries")
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "w0003_time_and_retries"
        columns = {c["name"] for c in inspect(conn).get_columns("watchdog_jobs")}
        indexes = {i["name"] for i in inspect(conn).get_indexes("watchdog_jobs")}
    assert "watchdog_queue_pauses" not in tables(empty_engine)
    assert not columns & _W0004_COLUMNS and {"attempt", "ready_at", "failure_history"} <= columns
    assert not indexes & _W0004_INDEXES
    after = {**before, "waiting": ("settled", "completed", 1), "done~rerun~again": ("queued", None, 1)}
    assert _w0004_rows(empty_engine) == after

    # And up again: the same rows, the times they had are gone, the pause too.
    run(empty_engine, command.upgrade, "head")
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []
    assert _w0004_rows(empty_engine) == after
    waiting = watchdog.read("waiting")
    assert waiting is not None and (waiting.started_at, waiting.settled_at) == (None, None)
    assert watchdog.stats().queue("q").pause is None


# -- w0005: trace context ------------------------------------------------------------


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0005_adds_and_drops_the_trace_context_keeping_every_row(empty_engine: Engine) -> None:
    """Rows from before the upgrade have no trace context; a job enqueued
    with one keeps it; the downgrade drops the column and its CHECK and
    keeps every row, and the upgrade after it works again."""
    from sqlalchemy_watchdog import store as watchdog_store

    run(empty_engine, command.upgrade, "w0003_time_and_retries")
    before = _w0003_jobs_in_every_state(empty_engine)
    run(empty_engine, command.upgrade, "w0004_operations")
    run(empty_engine, command.upgrade, "head")
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []
    watchdog = Watchdog(empty_engine)
    assert all(job.trace_context is None for job in watchdog.list_jobs())
    carrier = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    with empty_engine.begin() as conn:
        watchdog_store.enqueue(conn, [Job("traced", "q")])
        conn.execute(text("UPDATE watchdog_jobs SET trace_context = :c WHERE job_id = 'traced'"), {"c": carrier})
    traced = watchdog.read("traced")
    assert traced is not None and traced.trace_context == json.loads(carrier)
    with pytest.raises(IntegrityError), empty_engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET trace_context = :c WHERE job_id = 'traced'"), {"c": "x" * 4097})

    run(empty_engine, command.downgrade, "w0004_operations")
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "w0004_operations"
        assert "trace_context" not in {c["name"] for c in inspect(conn).get_columns("watchdog_jobs")}
    assert _w0004_rows(empty_engine) == {**before, "traced": ("queued", None, 1)}

    run(empty_engine, command.upgrade, "head")
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []
    traced = watchdog.read("traced")
    assert traced is not None and traced.trace_context is None


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0006_drops_the_queued_since_index_on_sqlite_only(empty_engine: Engine) -> None:
    run(empty_engine, command.upgrade, "w0005_trace_context")
    assert "ix_watchdog_jobs_queued_since" in index_names(empty_engine)
    run(empty_engine, command.upgrade, "w0006_index_review")
    kept = empty_engine.dialect.name == "postgresql"
    assert ("ix_watchdog_jobs_queued_since" in index_names(empty_engine)) is kept
    run(empty_engine, command.downgrade, "w0005_trace_context")
    assert "ix_watchdog_jobs_queued_since" in index_names(empty_engine)


# -- w0003: time and failure policy ----------------------------------------------------

W0002 = "w0002_failure_detail"
W0002_COLUMNS = [
    "sequence", "job_id", "queue_name", "lane", "priority", "payload_json", "recovery_max", "state", "outcome",
    "claim_token", "recovery_count", "cancellation_id", "failure_reason", "lease_until", "failure_detail",
]  # fmt: skip
YEAR_2100_MS = 4_102_444_800_000


def _w0002_jobs(engine: Engine) -> dict[str, dict[str, Any]]:
    """Jobs in every state w0002 knows, written as its schema stores them:
    those of :func:`_jobs_in_every_state`, plus a queued and a running job
    with a recorded cancellation, a failure with its traceback, and the
    other outcomes; the last one, ``deleted-top``, holds the highest
    sequence. Returns every row, every column, by job_id."""
    _jobs_in_every_state(engine)
    common = {"queue_name": "q", "priority": 0, "payload_json": "null", "recovery_max": None, "outcome": None,
              "claim_token": None, "recovery_count": 0, "cancellation_id": None, "failure_reason": None,
              "lease_until": None, "failure_detail": None}  # fmt: skip
    rows: list[dict[str, Any]] = [
        {"job_id": "waiting-with-policy", "state": "queued", "priority": 3, "payload_json": '{"n":1}',
         "recovery_max": 2},
        {"job_id": "cancel-requested", "state": "queued", "cancellation_id": "c-1"},
        {"job_id": "running-recovered", "state": "running", "claim_token": "claim_y.3", "lease_until": YEAR_2100_MS,
         "recovery_count": 1, "recovery_max": 3},
        {"job_id": "running-cancelled", "state": "running", "claim_token": "claim_y.4", "lease_until": YEAR_2100_MS,
         "cancellation_id": "c-2"},
        {"job_id": "failed-with-detail", "state": "settled", "outcome": "failed", "claim_token": "claim_y.6",
         "failure_reason": "ValueError: no", "failure_detail": "Traceback (most recent call last):\n  ..."},
        {"job_id": "cancelled", "state": "settled", "outcome": "cancelled", "cancellation_id": "c-3"},
        {"job_id": "unknown", "state": "settled", "outcome": "outcome_unknown", "claim_token": "claim_y.8",
         "failure_reason": "bank did not answer"},
        {"job_id": "interrupted", "state": "settled", "outcome": "interrupted", "claim_token": "claim_y.9",
         "failure_reason": "Restart recovery budget exhausted (2 recoveries)", "recovery_count": 2,
         "recovery_max": 2},
        {"job_id": "deleted-top", "state": "queued"},
    ]  # fmt: skip
    with engine.begin() as conn:
        for row in rows:
            values = {**common, "lane": row["job_id"], **row}
            names = ", ".join(values)
            conn.execute(
                text(f"INSERT INTO watchdog_jobs ({names}) VALUES ({', '.join(':' + n for n in values)})"), values
            )
    return _rows_by_id(engine, W0002_COLUMNS)


def _rows_by_id(engine: Engine, columns: list[str]) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {', '.join(columns)} FROM watchdog_jobs ORDER BY sequence")).mappings()
        return {row["job_id"]: dict(row) for row in rows}


def _raw_insert_w0002(engine: Engine, job_id: str) -> int:
    """A queued job written as w0002's schema stores it; its sequence."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, recovery_count)"
                " VALUES (:job_id, 'q', 'q', 0, 'null', 'queued', 0)"
            ),
            {"job_id": job_id},
        )
        return int(
            conn.execute(text("SELECT sequence FROM watchdog_jobs WHERE job_id = :j"), {"j": job_id}).scalar_one()
        )


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0003_upgrades_and_downgrades_a_table_holding_jobs_in_every_state(empty_engine: Engine) -> None:
    """Upgrading keeps every row's meaning (first attempt, no snoozes, no
    policy or history) and the sequence counter; jobs delayed, retried and
    snoozed on head become queued on the way down, and nothing else changes."""
    engine = empty_engine
    run(engine, command.upgrade, W0002)
    before = _w0002_jobs(engine)
    # The rows really cover every state and outcome, cancellations and a traceback.
    assert {row["state"] for row in before.values()} == {"queued", "running", "settled"}
    assert {row["outcome"] for row in before.values()} == {None, *(outcome.value for outcome in Outcome)}
    assert {row["state"] for row in before.values() if row["cancellation_id"]} == {"queued", "running", "settled"}
    assert any(row["failure_detail"] for row in before.values())
    top = before.pop("deleted-top")["sequence"]
    assert top == max(row["sequence"] for row in before.values()) + 1
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM watchdog_jobs WHERE job_id = 'deleted-top'"))

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    new_columns = ["attempt", "snoozes", "run_at", "ready_at", "max_attempts", "retry_policy", "timeout_ms",
                   "failure_history"]  # fmt: skip
    upgraded = _rows_by_id(engine, W0002_COLUMNS + new_columns)
    assert set(upgraded) == set(before)
    for job_id, row in before.items():
        assert {c: upgraded[job_id][c] for c in W0002_COLUMNS} == row, job_id
        assert {c: upgraded[job_id][c] for c in new_columns} == {
            "attempt": 1, "snoozes": 0, "run_at": None, "ready_at": None, "max_attempts": None,
            "retry_policy": None, "timeout_ms": None, "failure_history": None,
        }, job_id  # fmt: skip
    watchdog = Watchdog(engine)
    for job_id, row in before.items():
        job = watchdog.read(job_id)
        assert job is not None
        assert (job.state.value, job.outcome and job.outcome.value, job.failure_reason, job.cancellation_id) == (
            row["state"],
            row["outcome"],
            row["failure_reason"],
            row["cancellation_id"],
        ), job_id
        assert (job.attempt, job.snoozes, job.retry, job.timeout, job.failure_history) == (1, 0, None, None, ())
    # The sequence goes on above the old maximum, even the deleted one's.
    with engine.begin() as conn:
        enqueue(conn, Job("after-upgrade", "later"))
    after_upgrade = watchdog.read("after-upgrade")
    assert after_upgrade is not None and after_upgrade.sequence > top
    # A migrated running job is still held by its claim: its exact token (only) renews it.
    with store.write_transaction(engine) as conn:
        renewed = store.renew(conn, [("running", "claim_x.1"), ("running-recovered", "wrong")], lease_ms=60_000)
    assert renewed == {"running"}
    before["running"]["lease_until"] = _rows_by_id(engine, ["job_id", "lease_until"])["running"]["lease_until"]

    # On head: jobs delayed, scheduled, retried and snoozed, and one with a policy of its own.
    with engine.begin() as conn:
        enqueue(conn, Job("delayed", "later"), delay=timedelta(hours=1))
        enqueue(conn, Job("scheduled", "later", run_at=datetime(2999, 1, 1, tzinfo=UTC)))
        enqueue(conn, Job("with-policy", "later", retry=RetryPolicy(max_attempts=3), timeout=timedelta(seconds=9)))
        enqueue(conn, [Job("retried", "r", retry=RetryPolicy(max_attempts=3)), Job("snoozed", "r")])
    with store.write_transaction(engine) as conn:
        claims = store.claim(conn, queues=["r"], limit=2, lease_ms=60_000).claimed
        by_id = {c.job.job_id: c for c in claims}
        retried, snoozed = store.settle_many(
            conn,
            [
                store.SettleRequest("retried", by_id["retried"].token, Decision.failed("boom"),
                                    requeue_after_ms=3_600_000),
                store.SettleRequest("snoozed", by_id["snoozed"].token, Decision.snooze(timedelta(hours=1))),
            ],
        )  # fmt: skip
    assert retried.job is not None and (retried.job.state, retried.job.attempt) == (JobState.DELAYED, 2)
    assert snoozed.job is not None and (snoozed.job.state, snoozed.job.snoozes) == (JobState.DELAYED, 1)
    head = _rows_by_id(engine, W0002_COLUMNS)
    made_on_head = {"delayed", "scheduled", "retried", "snoozed"}
    assert {job_id for job_id, row in head.items() if row["state"] == "delayed"} == made_on_head

    run(engine, command.downgrade, W0002)
    with engine.connect() as conn:
        assert {c["name"] for c in inspect(conn).get_columns("watchdog_jobs")} == set(W0002_COLUMNS)
    down = _rows_by_id(engine, W0002_COLUMNS)
    assert set(down) == set(head)
    for job_id, row in head.items():
        expected = {**row, "state": "queued"} if job_id in made_on_head else row
        assert down[job_id] == expected, job_id
    for job_id, row in before.items():
        assert down[job_id] == row, job_id
    # w0002's grammar is back (no delayed state), and its table still takes jobs above the old maximum.
    assert _raw_insert_w0002(engine, "after-downgrade") > max(row["sequence"] for row in down.values())
    with pytest.raises(IntegrityError):
        with engine.begin() as conn:
            conn.execute(text("UPDATE watchdog_jobs SET state = 'delayed' WHERE job_id = 'delayed'"))
    # And up again: the same schema as the model, the same rows.
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    again = _rows_by_id(engine, W0002_COLUMNS)
    assert {job_id: row for job_id, row in again.items() if job_id != "after-downgrade"} == down


@pytest.mark.parametrize("dialect", ["sqlite"])  # the table is rebuilt on SQLite only
def test_w0003_keeps_the_sequence_counter_of_a_table_whose_jobs_were_all_deleted(empty_engine: Engine) -> None:
    run(empty_engine, command.upgrade, W0002)
    top = max(_raw_insert_w0002(empty_engine, f"j{i}") for i in range(3))
    with empty_engine.begin() as conn:
        conn.execute(text("DELETE FROM watchdog_jobs"))
    run(empty_engine, command.upgrade, "head")
    with empty_engine.begin() as conn:
        enqueue(conn, Job("new", "q"))
    job = Watchdog(empty_engine).read("new")
    assert job is not None and job.sequence > top
    with empty_engine.begin() as conn:
        conn.execute(text("DELETE FROM watchdog_jobs"))
    run(empty_engine, command.downgrade, W0002)
    assert _raw_insert_w0002(empty_engine, "after-downgrade") > job.sequence


# -- w0008: fewer index entries ---------------------------------------------------------

W0007 = "w0007_notify_when_waiting"


#: Columns of revisions after w0010, left out of the earlier revisions'
#: round trips (their own test covers them: test_w0012_...).
LATER_COLUMNS = frozenset(
    {"limit_key", "result_json", "progress", "progress_note", "waiting_on", "after_policy", "watched", "unstarted"}
)


def _all_rows(engine: Engine) -> dict[str, dict[str, Any]]:
    """Every row by job_id, without w0011's ``limit_key`` (NULL on every row
    from before it: test_w0011 checks that)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM watchdog_jobs ORDER BY sequence")).mappings()
        return {row["job_id"]: {key: value for key, value in row.items() if key not in LATER_COLUMNS} for row in rows}


def _insert_queued(conn: Any, job_id: str) -> None:
    """A queued job written by SQL, as any revision since w0003 takes it."""
    conn.execute(
        text(
            "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state)"
            " VALUES (:j, 'q', 'q', 0, 'null', 'queued')"
        ),
        {"j": job_id},
    )


def _cancellation_rule_holds(engine: Engine) -> None:
    """Two jobs may not share a cancellation id; any number may have none."""
    with pytest.raises(IntegrityError):
        with engine.begin() as conn:
            conn.execute(text("UPDATE watchdog_jobs SET cancellation_id = 'c-1' WHERE job_id = 'cancelled'"))
    with engine.begin() as conn:
        for i in range(3):  # by SQL: the library's enqueue writes head's columns
            _insert_queued(conn, f"no-cancellation-{i}")
        conn.execute(text("DELETE FROM watchdog_jobs WHERE job_id LIKE 'no-cancellation-%'"))


def _insert_plain(conn: Any, job_id: str) -> None:
    """A queued job with no cancellation id, in any revision's table."""
    conn.execute(
        text(
            "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state)"
            " VALUES (:job, 'q', 'q', 0, 'null', 'queued')"
        ),
        {"job": job_id},
    )


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0008_keeps_every_row_the_sequence_counter_and_the_cancellation_rule_both_ways(
    empty_engine: Engine,
) -> None:
    """On SQLite the table is rebuilt (its UNIQUE constraint cannot be dropped
    in place); on PostgreSQL the indexes are swapped. Either way every row and
    column survives, a deleted top sequence is not reused, and cancellation
    ids stay unique."""
    engine = empty_engine
    run(engine, command.upgrade, W0007)
    _w0002_jobs(engine)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE watchdog_jobs SET enqueued_at = 5, ready_at = 7, attempt = 1, rerun_of = 'waiting',"
                " trace_context = '{\"traceparent\":\"x\"}' WHERE job_id = 'waiting-with-policy'"
            )
        )
    before = _all_rows(engine)
    top = before.pop("deleted-top")["sequence"]
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM watchdog_jobs WHERE job_id = 'deleted-top'"))

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    assert _all_rows(engine) == before
    _cancellation_rule_holds(engine)
    with engine.begin() as conn:
        enqueue(conn, Job("after-upgrade", "q"))
    upgraded = Watchdog(engine).read("after-upgrade")
    assert upgraded is not None and upgraded.sequence > top
    # The lanes of the old rows are their job ids (own lanes): fail_lane still finds them.
    failure = Watchdog(engine).fail_lane("waiting-with-policy", reason="gone")
    assert [job.job_id for job in failure.jobs] == ["waiting-with-policy"]

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM watchdog_jobs WHERE job_id IN ('after-upgrade', 'waiting-with-policy')"))
    del before["waiting-with-policy"]
    run(engine, command.downgrade, W0007)
    assert _all_rows(engine) == before
    _cancellation_rule_holds(engine)
    assert "uq_watchdog_jobs_cancellation_id" in {
        c["name"] for c in inspect(engine).get_unique_constraints("watchdog_jobs")
    }
    if engine.dialect.name == "postgresql":
        assert "ix_watchdog_jobs_queued_since" in index_names(engine)
    with engine.begin() as conn:
        _insert_queued(conn, "after-downgrade")
    # Read by SQL: the library reads head's columns, which w0007 lacks.
    down = _all_rows(engine)["after-downgrade"]
    assert down["sequence"] > upgraded.sequence

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)


# -- w0009: workers and schedules -------------------------------------------------------

W0008 = "w0008_fewer_index_entries"


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0009_creates_and_drops_the_workers_and_schedules_tables_leaving_every_job(empty_engine: Engine) -> None:
    """Up: both tables exist with the model's constraints and take rows (a
    worker's CHECKs refuse an impossible one); the jobs are untouched. Down:
    both are gone, every job still there; up again works."""
    engine = empty_engine
    run(engine, command.upgrade, W0008)
    _w0002_jobs(engine)
    before = _all_rows(engine)
    run(engine, command.upgrade, "head")
    assert {"watchdog_workers", "watchdog_schedules"} <= tables(engine)
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    assert _all_rows(engine) == before
    worker = (
        "INSERT INTO watchdog_workers (worker_id, host, pid, queues, concurrency, wakeups, version,"
        " heartbeat_ms, started_at, last_seen, running) VALUES ('w-1', 'host', 1, '[\"q\"]', :concurrency,"
        " 'poll', '0.1.0', 10000, 5, 6, 0)"
    )
    with engine.begin() as conn:
        conn.execute(text(worker), {"concurrency": 4})
        conn.execute(
            text(
                "INSERT INTO watchdog_schedules (name, fingerprint, cron, timezone, queue_name, next_slot,"
                " last_enqueued, recorded_by, last_seen) VALUES ('nightly', 'f', '0 3 * * *', 'UTC', 'q', 9, 8,"
                " 'w-1', 6)"
            )
        )
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text(worker.replace("'w-1'", "'w-2'")), {"concurrency": 0})
    assert Watchdog(engine).workers()[0].worker_id == "w-1"

    run(engine, command.downgrade, W0008)
    assert not {"watchdog_workers", "watchdog_schedules"} & tables(engine)
    assert _all_rows(engine) == before
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert _all_rows(engine) == before


# -- w0010: stored types (SQLite), job_id COLLATE "C" (PostgreSQL) ----------------------

W0009 = "w0009_workers_and_schedules"
#: Rows a producer wrote with a value of the wrong type (SQLite keeps them):
#: {job_id: (state, column, SQL value)}.
BAD_ROWS = {
    "bad-priority": ("queued", "priority", "'abc'"),
    "bad-attempt": ("queued", "attempt", "x'01'"),
    "bad-lease": ("running", "lease_until", "'soon'"),
    "bad-ready": ("delayed", "ready_at", "1.5"),
    "bad-settled-at": ("settled", "settled_at", "'yesterday'"),
    "blob-payload": ("queued", "payload_json", "x'7b7d'"),
    "blob-reason": ("settled", "failure_reason", "x'626164'"),
}


def _bad_rows(engine: Engine) -> None:
    """The rows of :data:`BAD_ROWS`, each a good job first, then one column overwritten by hand."""
    with engine.begin() as conn:
        for job_id, (state, column, value) in BAD_ROWS.items():
            live = {
                "queued": "NULL, NULL, NULL, NULL",
                "delayed": "NULL, NULL, NULL, 5",
                "running": f"NULL, 'claim_{job_id}', {YEAR_2100_MS}, NULL",
                "settled": f"'completed', 'claim_{job_id}', NULL, NULL",
            }[state]
            conn.execute(
                text(
                    "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, outcome,"
                    f" claim_token, lease_until, ready_at, recovery_count, attempt, snoozes, settled_at)"
                    f" VALUES ('{job_id}', 'q', 'q', 0, 'null', '{state}', {live}, 0, 1, 0,"
                    f" {'7' if state == 'settled' else 'NULL'})"
                )
            )
            conn.execute(text(f"UPDATE watchdog_jobs SET {column} = {value} WHERE job_id = '{job_id}'"))


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0010_repairs_wrongly_typed_rows_adds_the_checks_and_downgrades_to_the_previous_table(
    empty_engine: Engine,
) -> None:
    """SQLite: rows of every state keep every column; each row holding a value
    of the wrong type is repaired (a live one settled ``failed`` with the
    columns named), the CHECKs refuse such a write afterwards, the sequence
    counter holds; down: the CHECKs are gone, every row as it was upgraded.
    PostgreSQL: ``job_id`` is ``COLLATE "C"`` and back."""
    engine = empty_engine
    run(engine, command.upgrade, W0009)
    _w0002_jobs(engine)
    if engine.dialect.name == "sqlite":
        _bad_rows(engine)
    before = _all_rows(engine)
    good = {job_id: row for job_id, row in before.items() if job_id not in BAD_ROWS}
    top = max(row["sequence"] for row in before.values())

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    after = _all_rows(engine)
    assert {job_id: after[job_id] for job_id in good} == good
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            collation = conn.execute(
                text(
                    "SELECT collation_name FROM information_schema.columns"
                    " WHERE table_name = 'watchdog_jobs' AND column_name = 'job_id'"
                )
            ).scalar()
        assert collation == "C"
        # The store reads a prefix as a range of the unique index under any database collation.
        backend_of("postgresql").forget()
        with engine.connect() as conn:
            assert store.sorts_by_code_point(conn)
    else:
        for job_id, (state, column, _) in BAD_ROWS.items():
            row = after[job_id]
            if column in ("payload_json", "failure_reason"):  # a BLOB became the same bytes as TEXT
                assert row["state"] == state and row["outcome"] == before[job_id]["outcome"]
                with engine.connect() as conn:
                    kind = conn.execute(
                        text(f"SELECT typeof({column}) FROM watchdog_jobs WHERE job_id = :j"), {"j": job_id}
                    )
                    assert kind.scalar_one() == "text"
                continue
            assert row[column] == {"priority": 0, "attempt": 1}.get(column), (job_id, row[column])
            assert row["state"] == "settled"
            if state == "settled":  # kept its outcome
                assert row["outcome"] == "completed" and row["failure_reason"] is None
            else:
                assert row["outcome"] == "failed" and row["failure_reason"] == f"stored value unreadable: {column}"
                assert row["lease_until"] is None and row["settled_at"] is not None
        with pytest.raises(IntegrityError, match="priority_stored_type"), engine.begin() as conn:
            conn.execute(text("UPDATE watchdog_jobs SET priority = 'abc' WHERE job_id = 'waiting-with-policy'"))
        with pytest.raises(IntegrityError, match="job_id_stored_type"), engine.begin() as conn:
            conn.execute(text("UPDATE watchdog_jobs SET job_id = x'6a' WHERE job_id = 'waiting-with-policy'"))
    # The store serves the upgraded table, the repaired rows and the others.
    watchdog = Watchdog(engine)
    assert {job.job_id for job in watchdog.list_jobs(limit=1000)} == set(after)
    with engine.begin() as conn:
        enqueue(conn, Job("after-upgrade", "q"))
    upgraded = watchdog.read("after-upgrade")
    assert upgraded is not None and upgraded.sequence > top

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM watchdog_jobs WHERE job_id = 'after-upgrade'"))
    run(engine, command.downgrade, W0009)
    assert _all_rows(engine) == after
    names = schema_names(engine)["check"]
    assert not {name for name in names if name.endswith("_stored_type")}
    # The index by lane over the history is w0010's (SQLite's rebuild must not recreate it).
    assert "ix_watchdog_jobs_lane_history" not in index_names(engine)
    if engine.dialect.name == "postgresql":
        backend_of("postgresql").forget()
        with engine.connect() as conn:
            assert (
                conn.execute(
                    text(
                        "SELECT collation_name FROM information_schema.columns"
                        " WHERE table_name = 'watchdog_jobs' AND column_name = 'job_id'"
                    )
                ).scalar()
                is None
            )
    else:  # the previous table takes a wrongly typed value again
        with engine.begin() as conn:
            conn.execute(text("UPDATE watchdog_jobs SET priority = 'abc' WHERE job_id = 'waiting-with-policy'"))
            conn.execute(text("UPDATE watchdog_jobs SET priority = 3 WHERE job_id = 'waiting-with-policy'"))
    with engine.begin() as conn:
        _insert_queued(conn, "after-downgrade")
    # Read by SQL: the library reads head's columns, which w0009 lacks.
    down = _all_rows(engine)["after-downgrade"]
    assert down["sequence"] > upgraded.sequence
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)


# -- w0011: flow control ------------------------------------------------------------------

W0010 = "w0010_stored_types_and_ranges"
W0012 = "w0012_results_and_dependencies"


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0011_adds_keys_and_limits_keeping_every_row_and_downgrades(empty_engine: Engine) -> None:
    """Up: every job keeps its row and has no key; a key and limits can be
    stored. Down: the tables and the column are gone, every row as it was."""
    engine = empty_engine
    run(engine, command.upgrade, W0010)
    with engine.begin() as conn:
        for i in range(5):
            _insert_plain(conn, f"job-{i}")
    before = _all_rows(engine)
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert _all_rows(engine) == before
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE limit_key IS NULL")).scalar_one() == 5
    watchdog = Watchdog(engine)
    watchdog.enqueue(Job("keyed", "q", key="tenant-1"))
    watchdog.set_limits("q", concurrency=2)
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_limits SET concurrency = 0"))
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_limits SET rate_count = 5"))  # a rate needs its period
    run(engine, command.downgrade, W0010)
    assert {"watchdog_limits", "watchdog_limit_claims"}.isdisjoint(tables(engine))
    with engine.connect() as conn:
        columns = conn.execute(text("SELECT * FROM watchdog_jobs")).keys()
    assert "limit_key" not in columns
    assert set(_all_rows(engine)) == {*before, "keyed"}


# -- w0012: results ------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0012_adds_results_keeping_every_row_and_drops_them_on_the_way_down(empty_engine: Engine) -> None:
    """Rows from before have no result; the column's CHECK keeps a result
    to completed jobs; on PostgreSQL the settle notification is the model's;
    the downgrade drops the column (and the trigger) and keeps every row."""
    engine = empty_engine
    run(engine, command.upgrade, W0010)
    _w0002_jobs(engine)
    before = _all_rows(engine)
    run(engine, command.upgrade, W0012)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            at_w0012 = conn.execute(
                text("SELECT pg_get_functiondef('watchdog_jobs_notify_settled'::regproc)")
            ).scalar_one()
        assert "pg_try_advisory_lock(1463899203, 1381190740)" in at_w0012
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    assert _all_rows(engine) == before
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE result_json IS NOT NULL")).scalar() == 0
    completed = [job_id for job_id, row in before.items() if row["outcome"] == "completed"]
    live = [job_id for job_id, row in before.items() if row["state"] != "settled"]
    assert completed and live
    with engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET result_json = '[1]' WHERE job_id = :j"), {"j": completed[0]})
    assert Watchdog(engine).result(completed[0]).value == [1]
    with pytest.raises(IntegrityError, match="result_completed"), engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET result_json = '[1]' WHERE job_id = :j"), {"j": live[0]})
    if engine.dialect.name == "sqlite":
        with pytest.raises(IntegrityError, match="result_json_stored_type"), engine.begin() as conn:
            conn.execute(text("UPDATE watchdog_jobs SET result_json = x'31' WHERE job_id = :j"), {"j": completed[0]})

    run(engine, command.downgrade, W0010)
    with engine.connect() as conn:
        assert "result_json" not in {c["name"] for c in inspect(conn).get_columns("watchdog_jobs")}
    assert _all_rows(engine) == before
    assert not {name for name in triggers_and_functions(engine) if "settled" in name}
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []


# -- w0013: settle watch -------------------------------------------------------------------


def _edge_rows(engine: Engine) -> None:
    """At w0012: a queued parent with a waiting child (an uncounted edge), a
    settled parent with a counted one, and a queued job nobody waits for."""
    with engine.begin() as conn:
        for job_id, state, outcome in (
            ("parent", "queued", None),
            ("done-parent", "settled", "completed"),
            ("alone", "queued", None),
        ):
            conn.execute(
                text(
                    "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, outcome)"
                    " VALUES (:j, 'q', :j, 0, 'null', :s, :o)"
                ),
                {"j": job_id, "s": state, "o": outcome},
            )
        conn.execute(
            text(
                "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, waiting_on,"
                " after_policy) VALUES ('child', 'q', 'child', 0, 'null', 'waiting', 1, 'completed')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO watchdog_job_edges (child, parent, outcome)"
                " VALUES ('child', 'parent', NULL), ('child', 'done-parent', 'completed')"
            )
        )


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0013_watches_the_parents_that_are_waited_for_and_they_still_release_their_dependents(
    empty_engine: Engine,
) -> None:
    """The upgrade marks exactly the live parents of uncounted edges; a
    marked parent's settlement releases its child on the migrated database;
    the downgrade restores w0012's triggers (an unmarked settle counts
    edges again) and drops the column, keeping every row."""
    engine = empty_engine
    run(engine, command.upgrade, W0012)
    at_w0012 = triggers_and_functions(engine)
    _edge_rows(engine)
    before = _all_rows(engine)
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert _all_rows(engine) == before
    with engine.connect() as conn:
        watched = {row[0]: row[1] for row in conn.execute(text("SELECT job_id, watched FROM watchdog_jobs"))}
    assert watched == {"parent": 1, "done-parent": None, "alone": None, "child": None}
    with pytest.raises(IntegrityError, match="watched_flag"), engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_jobs SET watched = 2 WHERE job_id = 'alone'"))
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE watchdog_jobs SET state = 'settled', outcome = 'completed', settled_at = 1"
                " WHERE job_id = 'parent'"
            )
        )
    child = Watchdog(engine).read("child")
    assert child is not None and child.state is JobState.QUEUED

    run(engine, command.downgrade, W0012)
    assert triggers_and_functions(engine) == at_w0012
    with engine.connect() as conn:
        assert "watched" not in {c["name"] for c in inspect(conn).get_columns("watchdog_jobs")}
    # w0012's trigger counts any parent's settlement again.
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, waiting_on,"
                " after_policy) VALUES ('child-2', 'q', 'child-2', 0, 'null', 'waiting', 1, 'completed')"
            )
        )
        conn.execute(text("INSERT INTO watchdog_job_edges (child, parent, outcome) VALUES ('child-2', 'alone', NULL)"))
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE watchdog_jobs SET state = 'settled', outcome = 'completed', settled_at = 1"
                " WHERE job_id = 'alone'"
            )
        )
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM watchdog_jobs WHERE job_id = 'child-2'")).scalar_one() == "queued"


# -- w0014: the edges of deleted jobs ---------------------------------------------------------

W0013 = "w0013_settle_watch"


def trigger_definitions(engine: Engine) -> dict[str, str]:
    """Every trigger of the two job tables (and on PostgreSQL our functions) by name, as the database prints it."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"))
            return {str(name): str(sql) for name, sql in rows}
        triggers = conn.execute(
            text("SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal")
        ).all()
        functions = conn.execute(
            text("SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE proname LIKE 'watchdog%'")
        ).all()
        return {f"trigger {name}": str(sql) for name, sql in triggers} | {
            f"function {name}": str(sql) for name, sql in functions
        }


def _edges(engine: Engine) -> set[tuple[str, str, str | None]]:
    with engine.connect() as conn:
        return {(c, p, o) for c, p, o in conn.execute(text("SELECT child, parent, outcome FROM watchdog_job_edges"))}


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0014_deletes_a_purged_childs_edges_and_orphans_of_before(empty_engine: Engine) -> None:
    """At w0013 a purged queued child left its edges behind; the upgrade
    deletes those orphans and adds the index of waiting jobs, and from then
    on a purge takes a child's edges with it and a purged waiting job tells
    its dependents. The migrated triggers are the model's, text for text;
    the downgrade restores w0013's."""
    engine = empty_engine
    sqlalchemy_watchdog.metadata.create_all(engine)
    model = trigger_definitions(engine)
    sqlalchemy_watchdog.metadata.drop_all(engine)
    run(engine, command.upgrade, W0013)
    at_w0013 = trigger_definitions(engine)
    wd = Watchdog(engine)
    wd.enqueue([Job("p", "parents"), Job("held", "held", after=["p"])])
    wd.enqueue(Job("done", "done"))
    with engine.begin() as conn:  # by hand: the package's settle writes a column of w0019
        conn.execute(
            text(
                "UPDATE watchdog_jobs SET state = 'settled', outcome = 'completed', settled_at = 1 WHERE job_id = 'done'"
            )
        )
    wd.enqueue(Job("released", "children", after=["done"]))  # queued at once: its parent completed
    assert wd.purge("children") == 1
    assert _edges(engine) == {("held", "p", None), ("released", "done", "completed")}

    run(engine, command.upgrade, "head")
    assert trigger_definitions(engine) == model
    assert differences(engine, sqlalchemy_watchdog.metadata) == []  # the index of waiting jobs
    assert _edges(engine) == {("held", "p", None)}  # its child still exists (waiting)
    wd.enqueue([Job("released-2", "children", after=["done"]), Job("grandchild", "x", after=["held"])])
    assert wd.purge("children") == 1
    assert wd.purge("held") == 1  # a waiting job: deleted, and its dependent told
    assert _edges(engine) == {("grandchild", "held", "purged")}
    grandchild = wd.read("grandchild")
    assert grandchild is not None and grandchild.failure_reason == "parent held ended purged"

    run(engine, command.downgrade, W0013)
    assert trigger_definitions(engine) == at_w0013
    wd.enqueue(Job("released-3", "children", after=["done"]))
    assert wd.purge("children") == 1
    assert _edges(engine) == {("grandchild", "held", "purged"), ("released-3", "done", "completed")}  # w0013's again
    run(engine, command.upgrade, "head")
    assert trigger_definitions(engine) == model and _edges(engine) == {("grandchild", "held", "purged")}


# -- w0015: per-key rates --------------------------------------------------------------------

W0014 = "w0014_waiting_jobs"


def _limits_rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        query = "SELECT queue_name, concurrency, concurrency_per_key, rate_count, rate_period_ms, cursor_key"
        return [tuple(row) for row in conn.execute(text(f"{query} FROM watchdog_limits ORDER BY queue_name"))]


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0015_adds_per_key_rates_keeping_every_limit_and_logged_claim_and_downgrades(empty_engine: Engine) -> None:
    """Up: every queue keeps its limits, cursor and rate log, with no per-key
    rate; the new columns are CHECKed (both or neither, in range) and a queue
    may be limited by a per-key rate alone. Down: such a queue's limits go
    (w0014 cannot hold them), every other row stays as it was."""
    engine = empty_engine
    run(engine, command.upgrade, W0014)
    with engine.begin() as conn:  # by hand: the package's statements write w0015's columns
        conn.execute(
            text(
                "INSERT INTO watchdog_limits (queue_name, concurrency, concurrency_per_key, cursor_key, updated_at)"
                " VALUES ('exports', 3, 1, 'tenant-7', 1)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO watchdog_limits (queue_name, rate_count, rate_period_ms, updated_at)"
                " VALUES ('api', 100, 60000, 1)"
            )
        )
        conn.execute(text("INSERT INTO watchdog_limit_claims (queue_name, claimed_at, jobs) VALUES ('api', 5, 2)"))
    before = _limits_rows(engine)

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    assert _limits_rows(engine) == before
    assert [limits.rate_per_key for limits in Watchdog(engine).limits()] == [None, None]
    with engine.connect() as conn:
        logged = conn.execute(text("SELECT queue_name, claimed_at, jobs, limit_key FROM watchdog_limit_claims"))
        assert [tuple(row) for row in logged] == [("api", 5, 2, None)]
    wd = Watchdog(engine)
    wd.set_limits("per-customer", rate_per_key=Rate(10, timedelta(seconds=30)))
    for bad in (
        "rate_per_key_count = 5, rate_per_key_period_ms = NULL",  # a rate needs its period
        "rate_per_key_count = 0, rate_per_key_period_ms = 1000",
        "rate_per_key_count = 1000001, rate_per_key_period_ms = 1000",
        "rate_per_key_count = 5, rate_per_key_period_ms = 0",
        "rate_per_key_count = 5, rate_per_key_period_ms = 86400001",
        "rate_per_key_count = NULL, rate_per_key_period_ms = NULL",  # no limit left at all
    ):
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(text(f"UPDATE watchdog_limits SET {bad} WHERE queue_name = 'per-customer'"))
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(
            text("INSERT INTO watchdog_limit_claims (queue_name, claimed_at, jobs, limit_key) VALUES ('api', 6, 1, '')")
        )

    run(engine, command.downgrade, W0014)
    assert _limits_rows(engine) == before  # the per-key-only queue is unlimited again
    with engine.connect() as conn:
        assert "limit_key" not in list(conn.execute(text("SELECT * FROM watchdog_limit_claims")).keys())
        assert "rate_per_key_count" not in list(conn.execute(text("SELECT * FROM watchdog_limits")).keys())
    with pytest.raises(IntegrityError), engine.begin() as conn:  # w0014's some_limit again
        conn.execute(text("UPDATE watchdog_limits SET concurrency = NULL, concurrency_per_key = NULL"))
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []


W0015 = "w0015_rate_per_key"
#: One-column values each refused by exactly one CHECK, on the settled ``failed`` job "broken".
ONE_COLUMN_BREAKS = [
    ("job_id = ''", "ck_watchdog_jobs_job_id_length"),
    ("lane = ''", "ck_watchdog_jobs_lane_length"),
    (f"queue_name = '{'q' * 257}'", "ck_watchdog_jobs_queue_name_length"),
    ("outcome = 'maybe'", "ck_watchdog_jobs_outcome_known"),
    ("recovery_count = -1", "ck_watchdog_jobs_recovery_count_nonnegative"),
    ("max_attempts = 1001", "ck_watchdog_jobs_max_attempts_range"),
    ("timeout_ms = 0", "ck_watchdog_jobs_timeout_positive"),
    ("progress = 2", "ck_watchdog_jobs_progress_range"),
    ("watched = 2", "ck_watchdog_jobs_watched_flag"),
]


def _job_rows(engine: Engine) -> list[tuple[Any, ...]]:
    """Every row, every column but those of revisions after w0016 (w0019's
    ``unstarted``: NULL on every row from before it, its own test checks it)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM watchdog_jobs ORDER BY sequence"))
        keep = [i for i, name in enumerate(rows.keys()) if name != "unstarted"]
        return [tuple(row[i] for i in keep) for row in rows]


def _triggers(engine: Engine) -> list[tuple[Any, ...]]:
    """The table's triggers: SQLite's as written; PostgreSQL's name, events,
    function and columns (its printed WHEN casts the columns of a domain)."""
    if engine.dialect.name == "sqlite":
        query = "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'watchdog_jobs' ORDER BY name"
    else:
        query = (
            "SELECT tgname, tgtype, tgfoid::regproc::text, tgattr::text, tgqual IS NULL FROM pg_trigger"
            " WHERE tgrelid = 'watchdog_jobs'::regclass AND NOT tgisinternal ORDER BY tgname"
        )
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(query))]


def _refuses_each_break(engine: Engine) -> None:
    for change, constraint in ONE_COLUMN_BREAKS:
        with pytest.raises(IntegrityError) as refused, engine.begin() as conn:
            conn.execute(text(f"UPDATE watchdog_jobs SET {change} WHERE job_id = 'broken'"))
        assert constraint in str(refused.value), change


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0016_moves_the_one_column_checks_into_domains_keeping_every_row_and_trigger_and_downgrades(
    empty_engine: Engine,
) -> None:
    """Up (PostgreSQL): the 18 one-column CHECKs are their columns' domains'
    under the same names, the 5 that relate columns stay the table's; every
    row, trigger and index is as it was, and each broken value is refused
    naming its CHECK. Down: the table's CHECKs again, no domain left. SQLite
    is unchanged both ways."""
    engine = empty_engine
    run(engine, command.upgrade, W0015)
    _jobs_in_every_state(engine)
    with engine.begin() as conn:  # every column that gets a domain, set
        conn.execute(
            text(
                "INSERT INTO watchdog_jobs (job_id, queue_name, lane, priority, payload_json, state, outcome,"
                " recovery_count, recovery_max, cancellation_id, attempt, max_attempts, timeout_ms, snoozes,"
                " rerun_of, trace_context, limit_key, result_json, progress, progress_note, after_policy, watched)"
                " VALUES ('full', 'q', 'l', 0, '{}', 'settled', 'completed', 1, 2, 'c-1', 2, 3, 1000, 1,"
                " 'done', '{}', 'tenant-7', '1', 0.5, 'half', 'any_outcome', 1)"
            )
        )
    rows, triggers, indexes = _job_rows(engine), _triggers(engine), index_names(engine)
    _refuses_each_break(engine)

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    assert (_job_rows(engine), _triggers(engine), index_names(engine)) == (rows, triggers, indexes)
    _refuses_each_break(engine)
    relating = {
        "ck_watchdog_jobs_unstarted_running",  # w0019's, at head
        "ck_watchdog_jobs_state_grammar",
        "ck_watchdog_jobs_attempt_bounds",
        "ck_watchdog_jobs_settled_at_settled",
        "ck_watchdog_jobs_result_completed",
        "ck_watchdog_jobs_waiting_on_state",
    }
    table_checks = {c["name"] for c in inspect(engine).get_check_constraints("watchdog_jobs")}
    if engine.dialect.name == "postgresql":
        assert table_checks == relating
        with engine.connect() as conn:
            collations = conn.execute(
                text(
                    "SELECT a.attname, c.collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation"
                    " WHERE a.attrelid = 'watchdog_jobs'::regclass AND a.attname IN ('job_id', 'limit_key')"
                )
            )
            assert dict(collations.all()) == {"job_id": "C", "limit_key": "C"}  # one range per prefix, as before
    else:
        assert relating < table_checks and len(check_names(engine)) == len(table_checks)
    wd = Watchdog(engine)
    wd.enqueue(Job("after-upgrade", "q"))
    job = wd.read("after-upgrade")
    assert job is not None and job.state is JobState.QUEUED

    run(engine, command.downgrade, W0015)
    assert _job_rows(engine)[: len(rows)] == rows
    assert (_triggers(engine), index_names(engine)) == (triggers, indexes)
    _refuses_each_break(engine)
    assert {c["name"] for c in inspect(engine).get_check_constraints("watchdog_jobs")} == check_names(engine)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            domains = conn.execute(
                text("SELECT count(*) FROM pg_type WHERE typtype = 'd' AND typname LIKE 'watchdog%'")
            )
            assert domains.scalar_one() == 0
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []


# -- w0018: workers' process queues -------------------------------------------------------------

W0017 = "w0017_worker_claim_ahead"


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0018_adds_the_workers_process_queues_keeping_every_worker_and_downgrades(empty_engine: Engine) -> None:
    """Up: a worker registered before reads no process queue until its next
    heartbeat, which writes them; a value out of bounds is refused by its
    CHECK. Down: the column goes, every worker stays."""
    engine = empty_engine
    run(engine, command.upgrade, W0017)
    with engine.begin() as conn:  # by hand: the package's statement writes w0018's column
        conn.execute(
            text(
                "INSERT INTO watchdog_workers (worker_id, host, pid, queues, concurrency, wakeups, version,"
                " heartbeat_ms, started_at, last_seen, running, claim_ahead)"
                " VALUES ('w-old', 'host-1', 42, '[\"emails\",\"pdf\"]', 4, 'listen', '0.1.0', 10000, 1000, 2000,"
                " 3, 2)"
            )
        )
    columns = "worker_id, host, pid, queues, concurrency, wakeups, version, heartbeat_ms, started_at, running"

    def rows() -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(f"SELECT {columns}, claim_ahead FROM watchdog_workers"))]

    before = rows()

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    assert rows() == before
    [old] = Watchdog(engine).workers()
    assert (old.worker_id, old.process_queues, old.executors) == ("w-old", (), {"emails": "thread", "pdf": "thread"})
    registration = store.WorkerRegistration(
        "w-old", "host-1", 42, ("emails", "pdf"), 4, "listen", "0.1.0", 10_000, 2, process_queues=("pdf",)
    )
    with engine.begin() as conn:  # its next heartbeat
        store.register_worker(conn, registration, running=3)
    assert [w.executors for w in Watchdog(engine).workers()] == [{"emails": "thread", "pdf": "process"}]
    with pytest.raises(IntegrityError) as refused, engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_workers SET process_queues = ''"))
    assert "ck_watchdog_workers_process_queues_length" in str(refused.value)

    run(engine, command.downgrade, W0017)
    assert rows() == before
    with engine.connect() as conn:
        assert "process_queues" not in list(conn.execute(text("SELECT * FROM watchdog_workers")).keys())
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []


# -- w0019: jobs claimed ahead, their handler not started -------------------------------------

W0018 = "w0018_worker_process_queues"


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0019_adds_the_unstarted_mark_keeping_every_job_and_downgrades(empty_engine: Engine) -> None:
    """Up: every job stays as it was, unmarked; a claim ahead marks its jobs
    and recovery requeues a marked one uncounted; the CHECKs refuse a mark
    other than 1 and one on a job that is not running. Down: the column (and
    on PostgreSQL its domain) goes, every job stays; up again matches the model."""
    engine = empty_engine
    run(engine, command.upgrade, W0018)
    Watchdog(engine).enqueue([Job("queued", "q"), Job("running", "r"), Job("settled", "s")])
    with engine.begin() as conn:  # by hand: the package's claim and settle are w0019's
        conn.execute(
            text(
                "UPDATE watchdog_jobs SET state = 'running', claim_token = 't.1', lease_until = 1 WHERE job_id = 'running'"
            )
        )
        conn.execute(
            text(
                "UPDATE watchdog_jobs SET state = 'settled', outcome = 'completed', settled_at = 1 WHERE job_id = 'settled'"
            )
        )
    rows = _job_rows(engine)

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    assert _job_rows(engine) == rows
    with engine.connect() as conn:
        assert set(conn.execute(text("SELECT unstarted FROM watchdog_jobs")).scalars()) == {None}
    with engine.begin() as conn:
        enqueue(conn, [Job("ahead", "fresh-queue", max_recoveries=0)])
    with store.write_transaction(engine) as conn:
        (claim,) = store.claim(conn, queues=["fresh-queue"], limit=1, lease_ms=60_000, ahead=True).claimed
        store.release(conn, [("ahead", claim.token)])
    with store.write_transaction(engine) as conn:
        (expired,) = [c for c in store.expired_claims(conn, limit=64) if c.job.job_id == "ahead"]
        recovery = store.reconcile(conn, expired)
    assert recovery.unstarted and recovery.job is not None
    assert (recovery.job.state, recovery.job.recovery_count) == (JobState.QUEUED, 0)
    for change, constraint in (("unstarted = 2", "unstarted_flag"), ("unstarted = 1", "unstarted_running")):
        with pytest.raises(IntegrityError) as refused, engine.begin() as conn:
            conn.execute(text(f"UPDATE watchdog_jobs SET {change} WHERE job_id = 'ahead'"))
        assert f"ck_watchdog_jobs_{constraint}" in str(refused.value), change

    run(engine, command.downgrade, W0018)
    with engine.connect() as conn:
        assert "unstarted" not in list(conn.execute(text("SELECT * FROM watchdog_jobs")).keys())
        if engine.dialect.name == "postgresql":
            assert conn.execute(text("SELECT 1 FROM pg_type WHERE typname = 'watchdog_jobs_unstarted'")).first() is None
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []


# -- w0017: workers' claim ahead ---------------------------------------------------------------

W0016 = "w0016_column_domains"


@pytest.mark.parametrize("dialect", HISTORY_DIALECTS)
def test_w0017_adds_the_workers_claim_ahead_keeping_every_worker_and_downgrades(empty_engine: Engine) -> None:
    """Up: a worker registered before reads 0 until its next heartbeat, which
    writes its claim ahead; a negative one is refused by its CHECK. Down: the
    column goes, every worker stays."""
    engine = empty_engine
    run(engine, command.upgrade, W0016)
    with engine.begin() as conn:  # by hand: the package's statement writes w0017's column
        conn.execute(
            text(
                "INSERT INTO watchdog_workers (worker_id, host, pid, queues, concurrency, wakeups, version,"
                " heartbeat_ms, started_at, last_seen, running)"
                " VALUES ('w-old', 'host-1', 42, '[\"emails\"]', 4, 'listen', '0.1.0', 10000, 1000, 2000, 3)"
            )
        )
    columns = "worker_id, host, pid, queues, concurrency, wakeups, version, heartbeat_ms, started_at, running"

    def rows() -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(f"SELECT {columns} FROM watchdog_workers"))]

    before = rows()

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    assert rows() == before
    [old] = Watchdog(engine).workers()
    assert (old.worker_id, old.running, old.claim_ahead) == ("w-old", 3, 0)
    registration = store.WorkerRegistration("w-old", "host-1", 42, ("emails",), 4, "listen", "0.1.0", 10_000, 16)
    with engine.begin() as conn:  # its next heartbeat
        store.register_worker(conn, registration, running=3)
    assert [w.claim_ahead for w in Watchdog(engine).workers()] == [16]
    with pytest.raises(IntegrityError) as refused, engine.begin() as conn:
        conn.execute(text("UPDATE watchdog_workers SET claim_ahead = -1"))
    assert "ck_watchdog_workers_claim_ahead_nonnegative" in str(refused.value)

    run(engine, command.downgrade, W0016)
    assert rows() == before
    with engine.connect() as conn:
        assert "claim_ahead" not in list(conn.execute(text("SELECT * FROM watchdog_workers")).keys())
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []


W0021 = "w0021_job_steps"
_STEP_ROWS = (
    "SELECT job_sequence, name, job_id, kind, result_json, wake_at, attempt, recorded_at FROM watchdog_job_steps"
)


def test_w0022_adds_signals_and_the_wait_and_undo_kinds_keeping_every_step_and_downgrades(
    empty_engine: Engine,
) -> None:
    """Up: every recorded step and sleep stays as it was (SQLite copies them
    into the table made afresh), waits and undos are accepted, and the new
    CHECKs refuse a wait without its timeout or an undo with a result. Down:
    the signals and the wait and undo rows go, the steps and sleeps stay."""
    engine = empty_engine
    run(engine, command.upgrade, W0021)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO watchdog_job_steps (job_sequence, name, job_id, kind, result_json, wake_at, attempt,"
                " recorded_at) VALUES (7, 'reserve', 'j', 'step', '12', NULL, 1, 5),"
                " (7, 'sleep#0', 'j', 'sleep', NULL, 99, 1, 6)"
            )
        )
    with engine.connect() as conn:
        before = sorted(tuple(row) for row in conn.execute(text(_STEP_ROWS)))

    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    assert schema_names(engine) == model_names(engine.dialect.name)
    with engine.begin() as conn:
        assert sorted(tuple(row) for row in conn.execute(text(_STEP_ROWS))) == before
        conn.execute(
            text(
                "INSERT INTO watchdog_job_steps (job_sequence, name, job_id, kind, result_json, wake_at, attempt,"
                " recorded_at) VALUES (7, 'approved', 'j', 'wait', NULL, 100, 1, 7),"
                " (7, 'undo:reserve', 'j', 'undo', NULL, NULL, 1, 8)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO watchdog_job_signals (job_sequence, name, job_id, payload_json, sent_at)"
                " VALUES (7, 'approved', 'j', '1', 9)"
            )
        )
    for bad in (
        "(7, 'w', 'j', 'wait', NULL, NULL, 1, 1)",  # a wait has its timeout
        "(7, 'u', 'j', 'undo', '1', NULL, 1, 1)",  # only a step keeps a result
        "(7, 'k', 'j', 'kill', NULL, NULL, 1, 1)",
    ):
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(text(f"INSERT INTO watchdog_job_steps VALUES {bad}"))
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text("INSERT INTO watchdog_job_signals VALUES (7, '', 'j', '1', 9)"))

    run(engine, command.downgrade, W0021)
    with engine.connect() as conn:
        assert sorted(tuple(row) for row in conn.execute(text(_STEP_ROWS))) == before
        assert "watchdog_job_signals" not in inspect(conn).get_table_names()
    with pytest.raises(IntegrityError), engine.begin() as conn:  # w0021's kinds again
        conn.execute(text("INSERT INTO watchdog_job_steps VALUES (7, 'w', 'j', 'wait', NULL, 100, 1, 1)"))
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []


W0022 = "w0022_job_signals"

#: The columns revision w0023 makes LONGTEXT on MariaDB/MySQL, by table.
_LONG_COLUMNS = {
    ("watchdog_jobs", "payload_json"),
    ("watchdog_jobs", "result_json"),
    ("watchdog_job_steps", "result_json"),
    ("watchdog_job_signals", "payload_json"),
    ("watchdog_workers", "queues"),
    ("watchdog_workers", "process_queues"),
}


def _long_column_types(engine: Engine) -> set[tuple[str, str, str]]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = DATABASE() AND data_type IN ('text', 'longtext')"
        )
        return {(str(t), str(c), str(d)) for t, c, d in rows if (str(t), str(c)) in _LONG_COLUMNS}


@pytest.mark.parametrize("dialect", ["mariadb"])
def test_w0023_makes_the_payload_and_result_columns_longtext_on_mariadb_and_never_downgrades_a_long_one_short(
    empty_engine: Engine,
) -> None:
    """Up: the jobs kept stay as they were, the six columns are LONGTEXT and
    a 200 KB payload is kept whole. Down: refused while a value is longer
    than TEXT holds (nothing changed), else TEXT again."""
    engine = empty_engine
    run(engine, command.upgrade, W0022)
    assert {kind for _, _, kind in _long_column_types(engine)} == {"text"}
    with engine.begin() as conn:
        enqueue(conn, Job("short", "q", payload={"n": 1}))

    run(engine, command.upgrade, "head")
    assert _long_column_types(engine) == {(t, c, "longtext") for t, c in _LONG_COLUMNS}
    assert differences(engine, sqlalchemy_watchdog.metadata) == []
    watchdog = Watchdog(engine)
    assert watchdog.read("short").payload == {"n": 1}  # type: ignore[union-attr]
    long_payload = {"text": "x" * 200_000}
    with engine.begin() as conn:
        enqueue(conn, [Job("long", "q", payload=long_payload), Job("other", "q")])
    assert watchdog.read("long").payload == long_payload  # type: ignore[union-attr]

    with pytest.raises(RuntimeError, match="watchdog_jobs hold a payload_json longer than TEXT"):
        run(engine, command.downgrade, W0022)
    assert _long_column_types(engine) == {(t, c, "longtext") for t, c in _LONG_COLUMNS}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == HEAD
    assert watchdog.read("long").payload == long_payload  # type: ignore[union-attr]

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM watchdog_jobs WHERE job_id = 'long'"))
    run(engine, command.downgrade, W0022)
    assert {kind for _, _, kind in _long_column_types(engine)} == {"text"}
    assert watchdog.read("short").payload == {"n": 1}  # type: ignore[union-attr]
    run(engine, command.upgrade, "head")
    assert differences(engine, sqlalchemy_watchdog.metadata) == []


#: MariaDB's TEXT holds 65,535 bytes: its w0023 is the test above.
@pytest.mark.parametrize("dialect", [dialect for dialect in DIALECTS if dialect != "mariadb"])
def test_w0023_changes_nothing_on_postgresql_and_sqlite_where_text_holds_any_length(empty_engine: Engine) -> None:
    run(empty_engine, command.upgrade, "head")
    long_payload = {"text": "é" * 50_000 + "x" * 100_000}
    with empty_engine.begin() as conn:
        enqueue(conn, [Job("long", "q", payload=long_payload), Job("other", "q")])
    run(empty_engine, command.downgrade, W0022)
    assert Watchdog(empty_engine).read("long").payload == long_payload  # type: ignore[union-attr]
    run(empty_engine, command.upgrade, "head")
    assert differences(empty_engine, sqlalchemy_watchdog.metadata) == []
    assert Watchdog(empty_engine).read("long").payload == long_payload  # type: ignore[union-attr]
