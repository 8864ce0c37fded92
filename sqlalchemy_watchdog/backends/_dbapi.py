"""What every backend shares: a hot statement's text run on the DBAPI cursor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection


def execute_plain(conn: Connection, text: str, args: Any) -> list[Sequence[Any]]:
    """``text`` (in the driver's own paramstyle, ``args`` to match) run on a
    plain DBAPI cursor of ``conn``'s connection, its rows fetched; a driver
    error takes SQLAlchemy's own path (wrapped as ``DBAPIError``, the
    connection invalidated on a disconnect, the cursor closed otherwise).
    The caller has begun the transaction (see ``store.views.execute_rows``)."""
    dbapi_connection = conn.connection.dbapi_connection
    assert dbapi_connection is not None
    cursor = None
    try:
        cursor = dbapi_connection.cursor()
        cursor.execute(text, args)
        # Every hot statement has RETURNING (and cursor.description would
        # build a column object per column per execute).
        rows: list[Sequence[Any]] = list(cursor.fetchall())
        cursor.close()
    except conn.dialect.loaded_dbapi.Error as error:
        conn._handle_dbapi_exception(error, text, args, cursor, None)
    return rows
