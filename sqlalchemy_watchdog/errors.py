"""The exceptions raised by sqlalchemy_watchdog."""

from __future__ import annotations

import enum
import re
import traceback
from collections.abc import Iterator, Mapping
from typing import ClassVar

__all__ = [
    "ErrorCode",
    "WatchdogError",
    "InvalidJob",
    "EnqueueConflict",
    "PreparedStatementsRefused",
    "WakeupsUnavailable",
    "redacted",
    "safe_text",
    "redacted_detail",
]


class ErrorCode(str, enum.Enum):
    """Why an operation failed; carried by :class:`WatchdogError`."""

    STORE_UNAVAILABLE = "store_unavailable"
    CLAIM_UNAVAILABLE = "claim_unavailable"
    LIVENESS_UNAVAILABLE = "liveness_unavailable"
    EXECUTION_FAILED = "execution_failed"
    WAKE_UNAVAILABLE = "wake_unavailable"
    SETTLEMENT_REJECTED = "settlement_rejected"
    INVALID_INPUT = "invalid_input"
    ENQUEUE_CONFLICT = "enqueue_conflict"
    PREPARED_STATEMENTS = "prepared_statements"


class WatchdogError(Exception):
    """Base class of every error this library raises.

    :attr:`code` says which kind of failure it is (an :class:`ErrorCode`).
    """

    code: ErrorCode

    def __init__(self, code: ErrorCode | str, message: str | None = None) -> None:
        self.code = ErrorCode(code)
        super().__init__(message or self.code.value)


class InvalidJob(WatchdogError, ValueError):
    """Input refused before anything was written.

    :attr:`field` names the offending field (``job_id``, ``payload``, ...).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(ErrorCode.INVALID_INPUT, f"{field}: {message}")


class EnqueueConflict(WatchdogError):
    """A job with this ``job_id`` exists with different contents.

    The caller's transaction has been rolled back (on PostgreSQL the database
    has already aborted it), so none of its other writes can commit without
    the job they were meant to come with.
    """

    #: The field found to differ, when it is known (``after``: the job's
    #: parents); None when the database refused the replay without saying which.
    field: str | None

    def __init__(self, job_id: str, field: str | None = None) -> None:
        self.job_id = job_id
        self.field = field
        what = (
            "a different queue, lane, priority, payload, recovery policy or parents (after, after_policy)"
            if field is None
            else f"a different {field}"
        )
        super().__init__(
            ErrorCode.ENQUEUE_CONFLICT,
            f"job_id {job_id!r} is already enqueued with {what}; the transaction was rolled back",
        )


class PreparedStatementsRefused(WatchdogError):
    """The database connection refused a prepared statement: the engine
    prepares statements on a connection that is not one server session (a
    connection pooler in transaction mode, such as PgBouncer before 1.21 or
    without ``max_prepared_statements``). The message names the engine
    setting that fixes it for the driver in use (:attr:`driver`).
    """

    #: The driver of the engine that prepared the statement (``psycopg``, ``asyncpg``, ...).
    driver: str

    #: What to pass to ``create_engine``/``create_async_engine``, per driver.
    REMEDIES: ClassVar[Mapping[str, str]] = {
        "psycopg": 'connect_args={"prepare_threshold": None}',
        "asyncpg": (
            'connect_args={"statement_cache_size": 0, "prepared_statement_cache_size": 0, '
            '"prepared_statement_name_func": lambda: f"__asyncpg_{uuid.uuid4()}__"}'
        ),
    }

    def __init__(self, driver: str, cause: str) -> None:
        self.driver = driver
        remedy = self.REMEDIES.get(driver, "the driver's setting that turns server-side prepared statements off")
        super().__init__(
            ErrorCode.PREPARED_STATEMENTS,
            f"the database refused a prepared statement ({cause}): the {driver} engine prepares statements "
            "on a connection that is not one server session -- a pooler in transaction mode? "
            f"Create the engine with {remedy}, or let the pooler keep prepared statements "
            "(PgBouncer >= 1.21: max_prepared_statements). See the deployment guide.",
        )


class WakeupsUnavailable(WatchdogError):
    """A runner was asked for ``wakeups="listen"`` but its listening
    connection is not proven to be one PostgreSQL session (or the driver
    delivers no notifications). The message says what the proof found and
    what to set (``listen_engine`` with a direct URL, or ``wakeups="poll"``).
    """

    #: What the session proof found (or why nothing can listen).
    reason: str

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            ErrorCode.WAKE_UNAVAILABLE,
            f'wakeups="listen" needs a direct session to PostgreSQL: {reason}. Give the runner '
            "listen_engine=create_engine(<a direct URL, not through a transaction-mode pooler>) "
            '(CLI: --listen-url), or use wakeups="auto" or "poll".',
        )


#: The longest description :func:`redacted` returns.
REDACTED_MAX_LENGTH = 500


def redacted(error: BaseException) -> str:
    """A one-line description of a database error that is safe to log.

    It names the driver's exception type, the SQLSTATE and the constraint
    (when the driver reports them) and the database's primary message, and
    never anything that may hold data: no ``DETAIL`` (PostgreSQL's
    ``Failing row contains (...)`` carries the claim token and the payload),
    no SQL text, no bound parameters (SQLAlchemy's ``[parameters: ...]``,
    whatever ``hide_parameters`` says), and for data exceptions (SQLSTATE
    class 22, whose messages quote the offending input) not the value either.

    Works on SQLAlchemy's wrappers (``DBAPIError`` and kin: their driver
    error is described) and on bare driver or other exceptions alike::

        try:
            conn.execute(stmt, params)
        except DBAPIError as error:
            log.warning("claim failed: %s", redacted(error))
        # claim failed: CheckViolation (SQLSTATE 23514, constraint
        # ck_watchdog_jobs_state_grammar): new row for relation "watchdog_jobs"
        # violates check constraint "ck_watchdog_jobs_state_grammar"
    """
    orig = getattr(error, "orig", None)
    err = orig if isinstance(orig, BaseException) else error
    notes: list[str] = []
    sqlstate = getattr(err, "sqlstate", None)
    diag = getattr(err, "diag", None)
    primary: str | None = None
    if isinstance(sqlstate, str) and sqlstate:
        notes.append(f"SQLSTATE {sqlstate}")
    if diag is not None:  # psycopg: the server's fields, one by one
        constraint = getattr(diag, "constraint_name", None)
        if constraint:
            notes.append(f"constraint {constraint}")
        primary = getattr(diag, "message_primary", None)
    errorname = getattr(err, "sqlite_errorname", None)
    if isinstance(errorname, str) and errorname:
        notes.append(errorname)
    number, message = _numbered(err)
    if number is not None:  # the MySQL family's drivers: (error number, message)
        notes.append(f"error {number}")
        named = _CONSTRAINT_NAMED.search(message)
        if named:
            notes.append(f"constraint {named.group(1) or named.group(2)}")
        primary = _DUPLICATE_ENTRY.sub(r"Duplicate entry (value not shown) for key \1", message)
    if primary is None:
        if err is error and not isinstance(err, WatchdogError) and _is_sqlalchemy(err):
            # A SQLAlchemy error without a driver error: its first argument is
            # the message; str() would append the SQL and its parameters.
            primary = str(err.args[0]) if err.args else ""
        else:
            primary = str(err)
    primary = primary.strip().splitlines()[0] if primary.strip() else ""
    if isinstance(sqlstate, str) and sqlstate.startswith("22") and ":" in primary:
        primary = primary.split(":", 1)[0] + ": (value not shown)"
    head = type(err).__name__ + (f" ({', '.join(notes)})" if notes else "")
    text = f"{head}: {primary}" if primary else head
    if len(text) > REDACTED_MAX_LENGTH:
        text = text[: REDACTED_MAX_LENGTH - 1] + "…"
    return text


#: A CHECK violation's message in the MySQL family names its constraint
#: (MariaDB: ``CONSTRAINT `ck_...` failed for `db`.`table```; MySQL:
#: ``Check constraint 'ck_...' is violated.``).
_CONSTRAINT_NAMED = re.compile(r"^(?:CONSTRAINT `([^`]+)` failed|Check constraint '([^']+)' is violated)")
#: A duplicate key's message in the MySQL family quotes the row's value.
_DUPLICATE_ENTRY = re.compile(r"^Duplicate entry '.*' for key ('[^']*')$", re.DOTALL)


def _numbered(error: BaseException) -> tuple[int | None, str]:
    """A MySQL-family driver error's number and message (PyMySQL, aiomysql,
    mysqlclient raise ``(number, message)``); ``(None, "")`` for any other."""
    args: tuple[object, ...] = getattr(error, "args", ())
    if len(args) == 2 and type(args[0]) is int and isinstance(args[1], str):
        return args[0], args[1]
    return None, ""


def _is_sqlalchemy(error: BaseException) -> bool:
    return any(cls.__module__.startswith("sqlalchemy.") for cls in type(error).__mro__)


#: The modules of the database drivers whose exceptions may quote data.
_DRIVER_MODULES = (
    "psycopg",
    "psycopg2",
    "asyncpg",
    "sqlite3",
    "aiosqlite",
    "pg8000",
    "_sqlite3",
    "pymysql",
    "aiomysql",
    "asyncmy",
    "MySQLdb",
)


def is_database_error(error: BaseException) -> bool:
    """Whether ``error`` is SQLAlchemy's or a database driver's: its text
    may hold SQL, bound parameters or the values of a row."""
    if _is_sqlalchemy(error):
        return True
    for cls in type(error).__mro__:
        if cls.__module__.split(".")[0] in _DRIVER_MODULES:
            return True
    return any(hasattr(error, name) for name in ("sqlstate", "pgcode", "sqlite_errorname"))


def safe_text(error: BaseException) -> str:
    """``"<ExceptionType>: <message>"`` for a failure reason, without data a
    database error may carry: for SQLAlchemy's and the drivers' exceptions
    the message is :func:`redacted`'s (no SQL, no bound parameters, no
    ``DETAIL``), as with ``create_engine(..., hide_parameters=True)`` and
    more; any other exception's message is its own ``str()``."""
    if is_database_error(error):
        return f"{type(error).__name__}: {redacted(error)}"
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            current = current.__context__
        else:
            current = None


def redacted_detail(error: BaseException) -> str:
    """The traceback of ``error`` to keep with a failed job: what
    ``traceback.format_exception`` prints, except that each database
    error's line is :func:`safe_text`'s -- no SQL, bound parameters or
    driver details, whichever exception of the chain carries them."""
    chain = list(_chain(error))
    if not any(is_database_error(e) for e in chain):
        return "".join(traceback.format_exception(error))
    parts: list[str] = []
    previous: BaseException | None = None
    for exc in reversed(chain):
        if previous is not None:
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if exc.__cause__ is previous
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
        previous = exc
        if exc.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(traceback.format_tb(exc.__traceback__))
        if is_database_error(exc):
            module = type(exc).__module__
            name = type(exc).__qualname__ if module == "builtins" else f"{module}.{type(exc).__qualname__}"
            parts.append(f"{name}: {redacted(exc)}\n")
        else:
            parts.extend(traceback.format_exception_only(exc))
    return "".join(parts)
