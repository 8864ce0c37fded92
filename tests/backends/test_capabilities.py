"""Backend conformance: every capability a :class:`~sqlalchemy_watchdog.backends.Backend`
declares holds against the real database, on SQLite (a real file), PostgreSQL
and MariaDB alike. A new dialect's backend passes this suite first; where a
capability does not exist on a backend (a flag says so, e.g.
``writes_return_rows``), its test asserts what the store does there instead.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    create_engine,
    func,
    inspect,
    literal_column,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.pool import NullPool

from sqlalchemy_watchdog import Job, metadata, store
from sqlalchemy_watchdog.backends import BACKENDS, Backend, backend_of, backend_of_error
from sqlalchemy_watchdog.backends.triggers import TRIGGER_NAMES
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.store import maintenance_sql, sql
from sqlalchemy_watchdog.store.dependencies import tell
from sqlalchemy_watchdog.store.enqueue import _UNIQUE_COLUMNS
from tests.conftest import WITH_MARIADB


def _backend(engine: Engine) -> Backend:
    return backend_of(engine.dialect)


@pytest.fixture(params=WITH_MARIADB)
def dialect(request: pytest.FixtureRequest) -> str:
    """Every dialect with a backend, MariaDB included (WATCHDOG_TEST_MYSQL_URL)."""
    name: str = request.param
    return name


def test_backend_of_finds_each_dialect_and_refuses_others(engine: Engine) -> None:
    backend = _backend(engine)
    assert backend is BACKENDS[engine.dialect.name]
    with engine.connect() as conn:
        assert backend_of(conn) is backend
    assert backend_of(engine.dialect.name) is backend
    with pytest.raises(NotImplementedError, match="not oracle"):
        backend_of("oracle")


def test_the_clock_is_the_database_clock_in_epoch_milliseconds(engine: Engine) -> None:
    before = int(time.time() * 1000)
    with engine.connect() as conn:
        clock = conn.execute(select(sql.db_clock_ms())).scalar_one()
        now = select(sql.effective_now(bindparam("now", type_=BigInteger())))
        later = conn.execute(now, {"now": clock + 60_000}).scalar_one()
        earlier = conn.execute(now, {"now": 0}).scalar_one()
    after = int(time.time() * 1000)
    assert before - 2_000 <= clock <= after + 2_000
    assert later == clock + 60_000  # the later of the two: the argument
    assert before - 2_000 <= earlier <= after + 2_000  # the later of the two: the clock


def test_insert_on_conflict_does_nothing_and_returns_only_new_rows(engine: Engine) -> None:
    """Where writes return rows; else (``writes_return_rows`` False: MariaDB)
    the dialect has no such statement, and what the store does instead --
    a plain INSERT whose duplicate key fails that statement alone -- holds."""
    backend = _backend(engine)
    key = Column("key", backend.bounded_text(16) or Text, primary_key=True)
    table = Table("conformance_rows", MetaData(), key, Column("n", Integer))
    table.metadata.create_all(engine)
    insert: Any = backend.insert(table)  # the dialect's own Insert, with on_conflict_do_nothing
    if not backend.writes_return_rows:
        assert not hasattr(insert, "on_conflict_do_nothing")
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"key": "a", "n": 1}])
            with pytest.raises(IntegrityError, match="Duplicate entry"):
                conn.execute(table.insert().values(key="a", n=2))
            conn.execute(table.insert().values(key="b", n=3))  # the transaction goes on: only the statement failed
        with engine.connect() as conn:
            assert conn.execute(select(table.c.key, table.c.n).order_by(table.c.key)).all() == [("a", 1), ("b", 3)]
        return
    stmt = insert.on_conflict_do_nothing(index_elements=["key"]).returning(table.c.key)
    with engine.begin() as conn:
        assert conn.execute(stmt, [{"key": "a", "n": 1}]).scalars().all() == ["a"]
        assert conn.execute(stmt.values(key="a", n=2)).scalars().all() == []
        assert conn.execute(select(table.c.n)).scalars().all() == [1]


def _stored_row(engine: Engine) -> dict[str, object]:
    with engine.connect() as conn:
        store.transact(conn, store.enqueue, [Job("dup", "q")])
        row = conn.execute(select(jobs_table)).mappings().one()
    return {name: value for name, value in row.items() if name != "sequence"}


def test_a_real_duplicate_and_a_real_null_are_parsed(engine: Engine) -> None:
    row = _stored_row(engine)
    errors: list[IntegrityError] = []
    for values in (row, {**row, "job_id": "other", "queue_name": None}):
        with engine.connect() as conn, pytest.raises(IntegrityError) as caught:
            with conn.begin():
                conn.execute(jobs_table.insert().values(**values))
        errors.append(caught.value)
    duplicate, null = errors
    backend = _backend(engine)
    assert backend_of_error(duplicate) is backend
    assert backend.violation(duplicate, jobs_table.name, _UNIQUE_COLUMNS) == ("unique", "job_id")
    assert backend.violation(null, jobs_table.name, _UNIQUE_COLUMNS) == ("not_null", "queue_name")
    assert store.violation(duplicate) == ("unique", "job_id")
    assert backend.violation(duplicate, "another_table", _UNIQUE_COLUMNS) is None


def test_a_missing_table_is_not_transient(engine: Engine) -> None:
    with engine.connect() as conn, pytest.raises(DBAPIError) as caught:
        conn.execute(text("SELECT * FROM no_such_table"))
    assert backend_of_error(caught.value) is _backend(engine)
    assert not store.is_transient(caught.value)


def _contention(engine: Engine) -> DBAPIError:
    """A real lock conflict: another connection holds what this one needs."""
    if engine.dialect.name == "sqlite":
        quick = create_engine(engine.url, connect_args={"timeout": 0})
        with engine.connect() as holder, quick.connect() as waiter:
            holder.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                with pytest.raises(DBAPIError) as caught:
                    waiter.exec_driver_sql("BEGIN IMMEDIATE")
            finally:
                holder.rollback()
        quick.dispose()
        return caught.value
    _stored_row(engine)
    with engine.connect() as holder, engine.connect() as waiter:
        with holder.begin():
            holder.execute(text("SELECT 1 FROM watchdog_jobs WHERE job_id = 'dup' FOR UPDATE"))
            with pytest.raises(DBAPIError) as caught, waiter.begin():
                if engine.dialect.name in ("mysql", "mariadb"):  # 1205, after 1 s
                    waiter.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
                else:
                    waiter.execute(text("SET LOCAL lock_timeout = '50ms'"))
                waiter.execute(text("UPDATE watchdog_jobs SET priority = 1 WHERE job_id = 'dup'"))
    return caught.value


def test_a_real_lock_conflict_is_transient(engine: Engine) -> None:
    error = _contention(engine)
    assert backend_of_error(error) is _backend(engine)
    assert _backend(engine).is_transient(error)
    assert store.is_transient(error)


@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"])
def test_a_terminated_connection_is_transient(engine: Engine) -> None:
    """(SQLite has no server to lose: its only transient failure is contention.)"""
    with engine.connect() as victim, engine.connect() as killer:
        if engine.dialect.name == "postgresql":
            pid = victim.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        else:  # KILL CONNECTION: MariaDB's 1927, or the lost connection (2013)
            pid = victim.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
            killer.exec_driver_sql(f"KILL CONNECTION {int(pid)}")
        killer.commit()
        with pytest.raises(DBAPIError) as caught:
            victim.exec_driver_sql("SELECT 1")
    assert store.is_transient(caught.value)


def test_a_failed_statement_aborts_the_transaction_where_the_backend_says(engine: Engine) -> None:
    with engine.connect() as conn, conn.begin():
        with pytest.raises(DBAPIError):
            conn.execute(text("SELECT * FROM no_such_table"))
        try:
            conn.execute(text("SELECT 1")).scalar_one()
            aborted = False
        except DBAPIError:
            aborted = True
    assert aborted is _backend(engine).aborts_on_error


def _writer_waits(engine: Engine, hold: float) -> float:
    """How long a second writer's begin_write waited behind a first one's."""
    backend = _backend(engine)
    first_has_lock = threading.Event()
    release = threading.Event()

    def first() -> None:
        with engine.connect() as conn, conn.begin():
            backend.begin_write(conn)
            first_has_lock.set()
            release.wait(5)

    thread = threading.Thread(target=first)
    thread.start()
    assert first_has_lock.wait(5)
    threading.Timer(hold, release.set).start()
    began = time.monotonic()
    with engine.connect() as conn, conn.begin():
        backend.begin_write(conn)
        waited = time.monotonic() - began
    thread.join(5)
    return waited


def test_begin_write_serialises_writers_only_where_the_backend_locks_up_front(engine: Engine) -> None:
    waited = _writer_waits(engine, 0.3)
    if _backend(engine).name == "sqlite":
        assert waited >= 0.25  # BEGIN IMMEDIATE: the second writer waits for the first
    else:
        assert waited < 0.25  # row locks only: nothing taken up front


@pytest.fixture(params=["wal", "delete"])
def journal_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    engine = create_engine(f"sqlite:///{tmp_path / 'journal.db'}")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"PRAGMA journal_mode={request.param}")
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        conn.commit()
    yield engine
    engine.dispose()


def _journal(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()


def test_sqlite_reads_beside_the_writer_exactly_in_wal_mode(journal_engine: Engine) -> None:
    """The look-before-lock rule: where the backend says reads run beside the
    writer, an open read does not stop a writer from committing; elsewhere
    it does (so there reads take the write lock instead of peeking)."""
    path = journal_engine.url.database
    assert path is not None
    with journal_engine.connect() as conn:
        beside = backend_of(conn).reads_beside_writer(conn)
    assert beside is (_journal(journal_engine) == "wal")
    reader = sqlite3.connect(path, timeout=0, isolation_level=None)
    writer = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM t").fetchone()  # an open read transaction
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO t VALUES (1)")
        try:
            writer.execute("COMMIT")
            committed = True
        except sqlite3.OperationalError as error:
            assert "locked" in str(error)
            committed = False
            writer.execute("ROLLBACK")
    finally:
        reader.close()
        writer.close()
    assert committed is beside


def test_reads_beside_writer_on_each_dialect_default(engine: Engine) -> None:
    """PostgreSQL never peeks (row locks: a claim skips locked rows instead);
    SQLite's default rollback journal does not either."""
    with engine.connect() as conn:
        expected = engine.dialect.name == "sqlite" and _journal(engine) == "wal"
        assert _backend(engine).reads_beside_writer(conn) is expected


def test_job_id_order_is_code_point_order_where_the_backend_says_so(engine: Engine) -> None:
    ids = ["a", "B", "~x", "é", "Z", "0", "ä"]
    with engine.connect() as conn:
        store.transact(conn, store.enqueue, [Job(job_id, "q") for job_id in ids])
        ordered = conn.execute(select(jobs_table.c.job_id).order_by(jobs_table.c.job_id)).scalars().all()
        says = store.sorts_by_code_point(conn)
    if says:
        assert ordered == sorted(ids)  # Python sorts str by code point
    if engine.dialect.name == "sqlite":
        assert says


def test_wake_ups_are_delivered_where_the_backend_notifies(engine: Engine) -> None:
    backend = _backend(engine)
    if not backend.notifies:
        with engine.connect() as conn, pytest.raises(DBAPIError):
            conn.execute(text("NOTIFY watchdog_conformance"))
        return
    import psycopg

    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN watchdog_conformance")
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_notify('watchdog_conformance', 'hello')"))
            conn.commit()
        received = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert received == ["hello"]


def test_advisory_transaction_locks_exclude_a_second_taker_where_the_backend_has_them(engine: Engine) -> None:
    if not _backend(engine).advisory_xact_lock:
        with engine.connect() as conn, pytest.raises(DBAPIError):
            conn.execute(maintenance_sql.try_advisory_xact_lock(), {"key": 42})
        return
    with engine.connect() as first, engine.connect() as second:
        with first.begin():
            assert first.execute(maintenance_sql.try_advisory_xact_lock(), {"key": 42}).scalar()
            with second.begin():
                assert not second.execute(maintenance_sql.try_advisory_xact_lock(), {"key": 42}).scalar()
        with second.begin():
            assert second.execute(maintenance_sql.try_advisory_xact_lock(), {"key": 42}).scalar()  # released at commit


def test_pruning_skips_while_another_transaction_prunes(engine: Engine) -> None:
    """What the advisory lock is for: prune_retention returns None while
    another transaction holds the prune lock (SQLite: the write lock
    serialises instead, so there is no such moment)."""
    ages = {"completed": timedelta(days=1)}
    if not _backend(engine).advisory_xact_lock:
        with engine.connect() as conn:
            assert store.transact(conn, store.prune_retention, ages, 10) == 0  # never skips
        return
    with engine.connect() as holder, holder.begin():
        holder.execute(maintenance_sql.try_advisory_xact_lock(), {"key": store.PRUNE_LOCK_KEY})
        with engine.connect() as conn:
            assert store.transact(conn, store.prune_retention, ages, 10) is None


# -- statement variants ---------------------------------------------------------------


def _numbers(engine: Engine) -> Table:
    table = Table(
        "conformance_numbers", MetaData(), Column("sequence", Integer, primary_key=True), Column("state", Text)
    )
    table.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"sequence": n, "state": "queued"} for n in range(1, 6)])
    return table


def test_json_rows_yield_every_row_in_order_with_typed_fields(engine: Engine) -> None:
    backend = _backend(engine)
    fields = (("name", Text()), ("n", BigInteger()))
    # Not counted; counted by a parameter (rows_params sends the count); the count written in the text.
    for limit in (None, bindparam("rows_count", type_=Integer()), sql.batch_size("rows_count")):
        source, columns, order = backend.json_rows("rows", fields, limit=limit)
        query = select(columns["name"], columns["n"]).select_from(source).order_by(order)
        params = sql.rows_params(_backend(engine), "rows", fields, [("a", 1), ("b", 2**40), ("c",)])
        with engine.connect() as conn:
            assert [tuple(row) for row in conn.execute(query, params)] == [("a", 1), ("b", 2**40), ("c", None)]


def _taken(conn: Any, table: Table) -> set[int]:
    return set(conn.execute(select(table.c.sequence).where(table.c.state == "taken")).scalars())


def test_a_write_targets_exactly_the_picked_rows(engine: Engine) -> None:
    """The write returns the rows it reached; where writes return no rows
    (``writes_return_rows`` False: MariaDB, whose pick is read from a derived
    table -- an UPDATE may not read its own table otherwise, error 1093) the
    transaction reads them back."""
    backend = _backend(engine)
    table = _numbers(engine)
    pick = select(table.c.sequence).where(table.c.state == "queued").order_by(table.c.sequence.desc()).limit(2)
    for as_array in (False, True):
        target = backend.picked(table.c.sequence, pick, "pick", as_array=as_array, recheck=table.c.state == "queued")
        write = table.update().where(target).values(state="taken")
        with engine.begin() as conn:
            backend.begin_write(conn)
            if backend.writes_return_rows:
                done = set(conn.execute(write.returning(table.c.sequence)).scalars())
            else:
                before = _taken(conn, table)
                assert conn.execute(write).rowcount == 2
                done = _taken(conn, table) - before
            assert sorted(done) == ([4, 5] if not as_array else [2, 3])
    union = backend.union_picked(
        ((select(table.c.sequence, table.c.state).where(table.c.sequence == 1), "one"),
         (select(table.c.sequence, table.c.state).where(table.c.sequence == 5), "five"))
    )  # fmt: skip
    with engine.begin() as conn:
        assert sorted(conn.execute(select(union.c.sequence)).scalars()) == [1, 5]


def test_a_write_reaches_the_rows_a_pick_locked_by_their_address(engine: Engine) -> None:
    """``row_address``: where the backend names one, a pick returns it as ``row``
    and the write reaches those rows by it; where it names none, the jobs' key
    is the row's address already (SQLite: ``sequence`` is the rowid; InnoDB:
    the table is stored in its primary key's order -- the clustered index --
    so a write by ``sequence`` finds its rows in the table itself)."""
    backend = _backend(engine)
    if backend.row_address is None:
        with engine.connect() as conn:
            store.transact(conn, store.enqueue, [Job("a", "q"), Job("b", "q")])
            if engine.dialect.name == "sqlite":
                pairs = conn.execute(select(literal_column("rowid"), jobs_table.c.sequence)).all()
                assert pairs and all(rowid == sequence for rowid, sequence in pairs)
                return
            stored_by = conn.exec_driver_sql(
                "SELECT engine FROM information_schema.tables"
                " WHERE table_schema = DATABASE() AND table_name = 'watchdog_jobs'"
            ).scalar_one()
            primary = inspect(conn).get_pk_constraint("watchdog_jobs")["constrained_columns"]
        assert (stored_by, primary) == ("InnoDB", ["sequence"])  # InnoDB's clustered index is the primary key
        return
    table = _numbers(engine)
    address: Any = literal_column(f"{table.name}.{backend.row_address}").label("row")
    pick = backend.skip_locked(
        select(table.c.sequence, address).where(table.c.state == "queued").order_by(table.c.sequence).limit(2)
    )
    target = backend.picked(table.c.sequence, pick, "pick", skip_locked=False, as_array=True)
    with engine.begin() as conn:
        done = conn.execute(table.update().where(target).values(state="taken").returning(table.c.sequence))
        assert sorted(done.scalars()) == [1, 2]
    with engine.connect() as conn:
        assert sorted(conn.execute(select(table.c.sequence).where(table.c.state == "taken")).scalars()) == [1, 2]


def test_a_locking_statement_counts_what_the_lock_protects_where_the_backend_locks_before_reading(
    engine: Engine,
) -> None:
    """``locks_before_reading``: a writer that waited for another writer's
    lock counts, in the statement that locks, the rows the other committed
    (SQLite: the write lock is held before the statement reads); else
    (PostgreSQL) the statement that waited for a row lock reads with the
    snapshot it began with, and misses them -- why the limited claim there
    reads what the lock protects in a later statement. That later statement
    counts them on every backend. (MariaDB at READ COMMITTED happened to count
    them in the locking statement too -- InnoDB opened its read view after the
    wait -- but nothing documents that order, so its flag is False and the
    store reads them in the later statement there as well.)"""
    backend = _backend(engine)
    table = _numbers(engine)
    holding, done = threading.Event(), threading.Event()

    def other_writer() -> None:
        with engine.connect() as conn, conn.begin():
            backend.begin_write(conn)
            conn.execute(table.update().where(table.c.sequence == 1).values(state="held"))
            conn.execute(table.insert().values(sequence=6, state="queued"))
            holding.set()
            done.wait(0.3)

    thread = threading.Thread(target=other_writer)
    thread.start()
    try:
        assert holding.wait(5)
        counted = select(func.count()).select_from(table).scalar_subquery()
        query = backend.locked(select(table.c.sequence, counted.label("rows")).where(table.c.sequence == 1))
        with engine.connect() as conn, conn.begin():
            backend.begin_write(conn)
            _sequence, rows = conn.execute(query).one()
            later = conn.execute(select(func.count()).select_from(table)).scalar_one()
    finally:
        done.set()
        thread.join(5)
    assert later == 6
    if backend.locks_before_reading:
        assert rows == 6
    elif engine.dialect.name == "postgresql":
        assert rows == 5


def test_a_pick_skips_rows_another_transaction_holds_where_rows_lock(engine: Engine) -> None:
    backend = _backend(engine)
    table = _numbers(engine)
    pick = backend.skip_locked(select(table.c.sequence).order_by(table.c.sequence).limit(2))
    if engine.dialect.name == "sqlite":
        # No row locks: the write lock (begin_write) serialises the writers instead.
        assert (
            pick.compile(engine).string
            == select(table.c.sequence).order_by(table.c.sequence).limit(2).compile(engine).string
        )
        return
    # PostgreSQL, MariaDB: FOR UPDATE SKIP LOCKED.
    with engine.connect() as holder, engine.connect() as other:
        with holder.begin():
            backend.begin_write(holder)
            holder.execute(select(table.c.sequence).where(table.c.sequence == 1).with_for_update())
            with other.begin():
                backend.begin_write(other)
                assert list(other.execute(pick).scalars()) == [2, 3]


def test_a_share_locked_read_holds_its_rows_against_a_delete_where_rows_lock(engine: Engine) -> None:
    backend = _backend(engine)
    table = _numbers(engine)
    query = backend.share_locked(select(table.c.sequence).where(table.c.sequence == 1), table)
    if engine.dialect.name == "sqlite":  # the write lock is held already
        assert (
            query.compile(engine).string == select(table.c.sequence).where(table.c.sequence == 1).compile(engine).string
        )
        return
    # PostgreSQL FOR KEY SHARE, MariaDB LOCK IN SHARE MODE: the delete waits, until its lock timeout.
    innodb = engine.dialect.name != "postgresql"
    with engine.connect() as reader, engine.connect() as deleter:
        with reader.begin():
            backend.begin_write(reader)
            assert list(reader.execute(query).scalars()) == [1]
            with deleter.begin():
                if innodb:  # whole seconds: 1205 after 1 s
                    deleter.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
                else:
                    deleter.exec_driver_sql("SET LOCAL lock_timeout = '200ms'")
                with pytest.raises(DBAPIError, match="Lock wait timeout" if innodb else "lock timeout"):
                    deleter.execute(table.delete().where(table.c.sequence == 1))


# -- the schema's dialect DDL, the URLs, the hot statements' fast path ----------------


def _triggers(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql(_backend(engine).count_triggers_sql()).scalar_one())


def test_the_dependency_triggers_are_made_counted_and_dropped_by_the_backends_ddl(engine: Engine) -> None:
    backend = _backend(engine)
    made = len(backend.trigger_names)
    assert made == (4 if backend.triggers_tell_dependents else 2)
    assert _triggers(engine) == made  # create_all made them
    with engine.begin() as conn:
        for statement in backend.drop_trigger_sql():
            conn.exec_driver_sql(statement)
    assert _triggers(engine) == 0
    with engine.begin() as conn:
        for statement in [*backend.drop_trigger_sql(), *backend.trigger_sql()]:  # dropping none is no error
            conn.exec_driver_sql(statement)
    assert _triggers(engine) == made
    # They run: a parent's settlement releases its child -- in the settling
    # statement's own triggers, or (MariaDB) once the store told the edges.
    enqueue = store.enqueue
    with engine.begin() as conn:
        enqueue(conn, [Job("parent", "q"), Job("child", "q", after=["parent"])])
    with engine.begin() as conn:
        conn.execute(
            jobs_table.update()
            .where(jobs_table.c.job_id == "parent")
            .values(state="settled", outcome="completed", settled_at=1)
        )
        if not backend.triggers_tell_dependents:
            tell(conn, [("parent", "completed")])
        state = conn.execute(select(jobs_table.c.state).where(jobs_table.c.job_id == "child")).scalar_one()
    assert state == "queued"


def test_a_domain_refuses_what_its_check_refuses_where_the_backend_has_domains(engine: Engine) -> None:
    backend = _backend(engine)
    statements = backend.domain_sql("conformance_positive", "BIGINT", "ck_conformance_positive", "{c} > 0")
    if not backend.column_domains:
        assert statements == [] and backend.drop_domain_sql("conformance_positive") == []
        return
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
        conn.exec_driver_sql("CREATE TABLE conformance_domains (n conformance_positive)")
        conn.exec_driver_sql("INSERT INTO conformance_domains VALUES (1)")
    with pytest.raises(IntegrityError, match="ck_conformance_positive"), engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO conformance_domains VALUES (-1)")
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE conformance_domains")
        for statement in backend.drop_domain_sql("conformance_positive"):
            conn.exec_driver_sql(statement)
        count = conn.exec_driver_sql("SELECT count(*) FROM pg_type WHERE typname = 'conformance_positive'")
        assert count.scalar_one() == 0


def test_the_url_rules_give_urls_the_driver_accepts(engine: Engine, tmp_path: Path) -> None:
    backend = _backend(engine)
    url = engine.url
    assert backend.sync_url(url) == url  # already sync
    assert backend.with_default_driver(url) == url  # names its driver already
    bare = url.set(drivername=url.get_backend_name())
    assert backend.with_default_driver(bare).get_dialect().driver == url.get_dialect().driver
    assert backend.sync_url(bare).get_dialect().driver == url.get_dialect().driver
    assert backend.unshareable(url) is None
    assert backend.missing_database(url) is None
    if backend.has_schemas or backend.has_databases:
        return
    # A file database (SQLite): in memory it is one connection's, and a missing file is said.
    assert backend.unshareable(url.set(database=":memory:")) is not None
    missing = url.set(database=str(tmp_path / "absent.db"))
    assert backend.missing_database(missing) == f"there is no SQLite database at {tmp_path / 'absent.db'}"


def test_hot_statement_text_runs_on_the_backends_cursor_and_errors_take_sqlalchemys_path(engine: Engine) -> None:
    backend = _backend(engine)
    placeholder = "?" if engine.dialect.paramstyle == "qmark" else "%(n)s"
    args: Any = (41,) if placeholder == "?" else {"n": 41}
    with engine.connect() as conn:
        conn.begin()
        assert [tuple(row) for row in backend.execute_rows(conn, f"SELECT {placeholder} + 1", args)] == [(42,)]
        if engine.dialect.driver == "psycopg":
            native = backend.execute_rows(conn, "SELECT $1::bigint + 1", (41,), native=True)
            assert [tuple(row) for row in native] == [(42,)]
        with pytest.raises(DBAPIError):
            backend.execute_rows(conn, "SELECT n FROM conformance_no_such_table", ())


def test_an_installation_in_a_second_schema_gets_its_own_dependency_triggers(engine: Engine) -> None:
    """Two installations in one PostgreSQL database (a schema each, as the
    pytest plugin gives each test): the second's ``create_all`` makes the
    triggers on its own tables, though triggers of the same names exist on
    the first's; and making or dropping them leaves the first's alone."""
    backend = _backend(engine)
    if not backend.has_schemas:
        pytest.skip(f"{backend.name} has one schema per database")
    schema = "watchdog_second_install"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    # Only its own schema on the path, as the pytest plugin sets it.
    second = create_engine(engine.url.update_query_dict({"options": f"-csearch_path={schema}"}), poolclass=NullPool)
    try:
        metadata.create_all(second)
        assert _triggers_in(engine, schema) == 4
        assert _triggers_in(engine, "public") == 4
        with second.begin() as conn:
            store.enqueue(conn, [Job("parent", "q"), Job("child", "q", after=["parent"])])
        with second.begin() as conn:
            conn.execute(
                jobs_table.update()
                .where(jobs_table.c.job_id == "parent")
                .values(state="settled", outcome="completed", settled_at=1)
            )
            child = conn.execute(select(jobs_table.c.state).where(jobs_table.c.job_id == "child")).scalar_one()
        assert child == "queued"  # the second installation's own trigger released it
        metadata.drop_all(second)
        assert _triggers_in(engine, schema) == 0
        assert _triggers_in(engine, "public") == 4  # the first installation keeps its triggers
    finally:
        second.dispose()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _triggers_in(engine: Engine, schema: str) -> int:
    """How many dependency triggers sit on tables of ``schema``."""
    with engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %(schema)s AND t.tgname = ANY(%(names)s)",
                {"schema": schema, "names": list(TRIGGER_NAMES)},
            ).scalar_one()
        )
