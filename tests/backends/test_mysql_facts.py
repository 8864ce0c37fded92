"""The MariaDB backend's own facts, on the real server (WATCHDOG_TEST_MYSQL_URL):
the isolation level of the queue's transactions, and the error numbers it
retries -- a real lock-wait timeout and a real deadlock, on a table of the
test's own (the store's statements are phase 2 of issue 57)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError

from sqlalchemy_watchdog import store
from sqlalchemy_watchdog.backends import MariaDB, MySQL, backend_of, backend_of_error
from tests.conftest import mysql_database


@pytest.fixture
def maria(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine on a database of its own, with a two-row table ``t``."""
    server: URL = request.getfixturevalue("mysql_server")
    with mysql_database(server, "watchdog_facts") as url:
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (id INT PRIMARY KEY, n INT NOT NULL, CHECK (n >= 0)) ENGINE=InnoDB"))
            conn.execute(text("INSERT INTO t VALUES (1, 0), (2, 0)"))
        yield engine
        engine.dispose()


def test_mysql_and_mariadb_urls_find_their_backends(maria: Engine) -> None:
    assert isinstance(backend_of("mysql"), MySQL)
    assert isinstance(backend_of("mariadb"), MariaDB)
    assert backend_of(maria.dialect).name == maria.dialect.name


def test_the_queues_transactions_run_at_read_committed(maria: Engine) -> None:
    with maria.connect() as conn:
        conn.begin()
        backend_of(conn).begin_write(conn)
        # The level of the transaction begun now (the session's stays REPEATABLE READ).
        conn.execute(text("UPDATE t SET n = n + 1 WHERE id = 1"))
        level = _current_trx_level(conn)
        conn.rollback()
    assert level == "READ COMMITTED"


def _level_of_a_transaction(conn: Connection) -> str:
    """The isolation level of the transaction ``conn`` runs, as InnoDB reports it."""
    conn.execute(text("UPDATE t SET n = n + 1 WHERE id = 1"))
    return _current_trx_level(conn)


def _current_trx_level(conn: Connection) -> str:
    """The isolation level of the transaction ``conn`` has open, as InnoDB
    reports it. ``information_schema.innodb_trx`` is a cache that InnoDB
    refreshes only when it was not read for 0.1 s, so a read right after
    another connection's can miss a transaction begun since: read again
    after that interval until this one shows (a few seconds at most)."""
    query = text(
        "SELECT trx_isolation_level FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = CONNECTION_ID()"
    )
    for _ in range(30):
        level = conn.execute(query).scalar_one_or_none()
        if level is not None:
            return str(level)
        time.sleep(0.15)
    raise AssertionError("the transaction never showed in information_schema.innodb_trx")


def test_a_store_transaction_begun_from_autocommit_runs_at_the_backends_level(maria: Engine) -> None:
    """``transact_as`` leaves autocommit for the backend's level (READ
    COMMITTED), not the connection's default (InnoDB's REPEATABLE READ),
    for reading work too (no ``begin_write``)."""
    with maria.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        level = store.transact_as(auto, store.TxMode(write=False), _level_of_a_transaction)
    assert level == "READ COMMITTED"


def test_a_lock_wait_timeout_is_transient(maria: Engine) -> None:
    with maria.connect() as holder, maria.connect() as waiter:
        holder.begin()
        holder.execute(text("SELECT n FROM t WHERE id = 1 FOR UPDATE"))
        waiter.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
        with pytest.raises(DBAPIError) as caught:
            waiter.execute(text("UPDATE t SET n = 1 WHERE id = 1"))
        holder.rollback()
    assert caught.value.orig.args[0] == 1205  # type: ignore[union-attr]
    assert backend_of_error(caught.value) is backend_of(maria.dialect)
    assert store.is_transient(caught.value)


def test_a_deadlock_is_transient(maria: Engine) -> None:
    errors: list[DBAPIError] = []
    both_hold = threading.Barrier(2, timeout=5)

    def cross(first: int, second: int) -> None:
        with maria.connect() as conn:
            conn.begin()
            conn.execute(text("UPDATE t SET n = n + 1 WHERE id = :id"), {"id": first})
            both_hold.wait()
            try:
                conn.execute(text("UPDATE t SET n = n + 1 WHERE id = :id"), {"id": second})
            except DBAPIError as error:
                errors.append(error)
            conn.rollback()

    threads = [threading.Thread(target=cross, args=pair) for pair in ((1, 2), (2, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [error.orig.args[0] for error in errors] == [1213]  # type: ignore[union-attr]
    assert store.is_transient(errors[0])


def test_an_auto_increment_deadlock_rolls_back_the_whole_transaction_and_is_transient(maria: Engine) -> None:
    """Error 1467: a transaction that holds a row lock on a unique key and
    then runs an INSERT ... SELECT (which takes InnoDB's table-wide AUTO-INC
    lock) behind another INSERT ... SELECT waiting for that row deadlocks on
    the AUTO-INC lock; InnoDB rolls its whole transaction back (the other
    goes through, its row no longer locked), like a deadlock's 1213 -- so
    the store runs its own transaction again, and a caller is told to."""
    with maria.begin() as conn:
        conn.execute(text("CREATE TABLE ai (id BIGINT AUTO_INCREMENT PRIMARY KEY, u VARCHAR(20) UNIQUE) ENGINE=InnoDB"))
    bulk = "INSERT INTO ai (u) SELECT :a FROM DUAL UNION ALL SELECT :b FROM DUAL"
    outcome: dict[str, object] = {}
    with maria.connect() as victim, maria.connect() as other:
        victim.begin()
        victim.execute(text("INSERT INTO ai (u) VALUES ('x')"))

        def waits_for_x() -> None:
            with other.begin():
                other.execute(text(bulk), {"a": "x", "b": "z"})
            outcome["other"] = "committed"

        thread = threading.Thread(target=waits_for_x)
        thread.start()
        time.sleep(0.5)  # the other insert holds the AUTO-INC lock and waits for 'x'
        with pytest.raises(DBAPIError) as caught:
            victim.execute(text(bulk), {"a": "y", "b": "w"})
        victim.rollback()
        thread.join(30)
    assert caught.value.orig.args[0] == 1467  # type: ignore[union-attr]
    assert outcome == {"other": "committed"}, "the victim's row lock on 'x' was released: rolled back"
    with maria.connect() as conn:
        assert sorted(conn.execute(text("SELECT u FROM ai")).scalars()) == ["x", "z"]
    assert store.is_transient(caught.value)


def test_a_check_violation_is_an_integrity_error_and_not_transient(maria: Engine) -> None:
    with maria.connect() as conn, pytest.raises(IntegrityError) as caught:
        conn.execute(text("UPDATE t SET n = -1 WHERE id = 1"))
    assert caught.value.orig.args[0] == 4025  # type: ignore[union-attr]
    assert not store.is_transient(caught.value)


async def test_the_async_driver_reads_the_clock_and_raises_the_same_errors(maria: Engine) -> None:
    """aiomysql: the same backend, the same error numbers and classes as PyMySQL."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(maria.url.set(drivername="mysql+aiomysql"))
    try:
        async with engine.connect() as conn:
            backend = backend_of(engine.dialect)
            assert backend is backend_of("mysql")
            clock = (await conn.execute(text(f"SELECT {backend.clock_ms_sql()}"))).scalar_one()
            assert abs(clock - int(time.time() * 1000)) < 2_000
            with pytest.raises(IntegrityError) as caught:
                await conn.execute(text("UPDATE t SET n = -1 WHERE id = 1"))
        assert caught.value.orig.args[0] == 4025  # type: ignore[union-attr]
        assert backend_of_error(caught.value) is backend
    finally:
        await engine.dispose()


def _refusing_url(maria: Engine, drivername: str) -> URL:
    """``maria``'s URL on a loopback port where nothing listens: a server
    that is down (restarting) refuses the connection."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    return maria.url.set(drivername=drivername, host="127.0.0.1", port=port)


def test_a_refused_connection_is_transient(maria: Engine) -> None:
    """A server being restarted refuses connections (CR_CONN_HOST_ERROR,
    2003): retried like a lost connection, not taken for a refused statement
    (it was, and a runner settled a completed job as failed)."""
    engine = create_engine(_refusing_url(maria, "mysql+pymysql"))
    try:
        with pytest.raises(DBAPIError) as caught, engine.connect():
            pass
    finally:
        engine.dispose()
    assert caught.value.orig.args[0] == 2003  # type: ignore[union-attr]
    assert backend_of_error(caught.value) is backend_of(maria.dialect)
    assert store.is_transient(caught.value)


async def test_a_refused_connection_is_transient_for_the_async_driver_too(maria: Engine) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(_refusing_url(maria, "mysql+aiomysql"))
    try:
        with pytest.raises(DBAPIError) as caught:
            async with engine.connect():
                pass
    finally:
        await engine.dispose()
    assert caught.value.orig.args[0] == 2003  # type: ignore[union-attr]
    assert store.is_transient(caught.value)


def test_a_statement_on_a_connection_killed_by_the_server_is_transient(maria: Engine) -> None:
    """``KILL CONNECTION`` of a session (an operator's, or the server's
    own): its next statement fails as a lost connection, retried."""
    with maria.connect() as victim, maria.connect() as killer:
        thread_id = victim.execute(text("SELECT CONNECTION_ID()")).scalar_one()
        victim.commit()
        killer.exec_driver_sql(f"KILL CONNECTION {int(thread_id)}")
        with pytest.raises(DBAPIError) as caught:
            victim.execute(text("SELECT 1"))
    assert caught.value.orig.args[0] in (2006, 2013, 1927)  # type: ignore[union-attr]
    assert store.is_transient(caught.value)
