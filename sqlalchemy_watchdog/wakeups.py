"""Wake-ups on PostgreSQL: the channel, its events, the trigger, the listeners.

Internal module. Idle runners LISTEN on :data:`CHANNEL`. A statement-level
INSERT trigger on ``watchdog_jobs`` sends :data:`EVENT_QUEUED` when an
enqueue commits -- but only while a runner waits for work (PostgreSQL folds
identical notifications of one transaction, and one trigger per statement
costs no round trip on the enqueue path); a cancellation or lane failure
sends :data:`EVENT_STOP`, on which a runner renews its claims at once and
so finds the handlers to stop.

Why only while a runner waits: PostgreSQL holds a database-wide lock from a
notifying transaction's pre-commit until its commit is flushed, so commits
that notify are flushed one at a time instead of together. Many producers
committing at once with nobody waiting (every runner busy, or none running)
pay that for nothing.

How, without ever missing a wake-up -- the *waiting lock*
(:data:`WAITING_LOCK`, a PostgreSQL advisory lock):

* The trigger takes the lock **shared**, for its transaction, if it can
  (``pg_try_advisory_xact_lock_shared``). If it can, no runner waits and it
  does not notify; the shared lock is held until that transaction ends. If
  it cannot, a runner waits, and it notifies.
* A runner whose claim came back short (nothing more to do) asks its
  listener to take the lock **exclusively**, for the listener's session
  (``pg_try_advisory_lock``), and then looks for work once more. Getting the
  exclusive lock proves that every transaction which enqueued without
  notifying has ended, so that last look sees their jobs; and from then on
  every enqueue notifies, until the runner lets the lock go. A failed try
  never waits (an enqueue is never held up by a runner).
* Only one session holds the lock exclusively: the *sentinel*. Any
  notification reaches every listener, so another idle runner is *covered*
  while a sentinel exists -- it takes its last look, and waits.
* A sentinel whose claim fills every free slot (a backlog: no wake-up is
  needed) lets the lock go and notifies :data:`EVENT_HANDOVER`, so covered
  runners look again and one of them takes over. The lock dies with the
  listener's session, so a runner that crashed holds nothing; covered
  runners look again every ``poll_interval``.
* When the try fails because enqueueing transactions are still open (no
  sentinel), the runner looks for work again every :data:`RETRY_S` until it
  gets the lock.

See ``docs/design.md`` ("Wake-ups") for the argument in full.

The listeners take their connection from the application's engine, so
whatever the engine does to connect -- ``connect_args``, a ``do_connect``
hook supplying an IAM token, a ``creator`` function, SSL settings -- holds
for them too. The connection is detached from the pool (it never returns
there in LISTEN state). psycopg 3, psycopg2 and asyncpg deliver
notifications; on another driver the runner polls (and says so in its log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.ext.asyncio import AsyncEngine

from .backends import BACKENDS
from .connections import SessionProof, prove_session, prove_session_async
from .errors import WakeupsUnavailable, redacted
from .wakeup_mode import WakeupMode as WakeupMode
from .wakeup_mode import check_wakeups as check_wakeups

__all__ = [
    "CHANNEL",
    "EVENT_QUEUED",
    "EVENT_STOP",
    "EVENT_HANDOVER",
    "WAITING_LOCK",
    "NOTIFY_FUNCTION_SQL",
    "NOTIFY_TRIGGER_SQL",
    "DROP_NOTIFY_FUNCTION_SQL",
    "WakeupMode",
    "WakeupStatus",
    "check_wakeups",
    "polling_reason",
    "decide",
    "connect_and_prove",
    "connect_and_prove_async",
    "Waiting",
    "Listener",
    "listen_async",
    "listens",
    "local_key",
    "wake_locally",
    "room_freed_locally",
    "room_freed_at_commit",
]

log = logging.getLogger("sqlalchemy_watchdog.runner")

#: The LISTEN/NOTIFY channel of runners on PostgreSQL.
CHANNEL = "watchdog_jobs"
#: New work was committed (sent by the table's INSERT trigger while a runner waits).
EVENT_QUEUED = "queued"
#: A cancellation or lane failure was recorded: running handlers may have to stop.
EVENT_STOP = "stop"
#: The sentinel stopped waiting: covered runners look for work and take over.
EVENT_HANDOVER = "handover"

#: The waiting lock: a two-key PostgreSQL advisory lock ("WATC", "NOTI").
#: Exclusive: held by the one waiting runner's listener session (the
#: sentinel). Shared: held by each enqueueing transaction that did not notify.
WAITING_LOCK = (0x5741_5443, 0x4E4F_5449)

_KEYS = f"{WAITING_LOCK[0]}, {WAITING_LOCK[1]}"

NOTIFY_FUNCTION_SQL = f"""\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_queued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Shared until this transaction ends: no runner can start waiting before
    -- then, so one that does looks for work after this commit. Taken only
    -- while no runner waits; while one does, notify it instead.
    IF NOT pg_try_advisory_xact_lock_shared({_KEYS}) THEN
        PERFORM pg_notify('{CHANNEL}', '{EVENT_QUEUED}');
    END IF;
    RETURN NULL;
END
$$"""
NOTIFY_TRIGGER_SQL = (
    "CREATE TRIGGER watchdog_jobs_queued AFTER INSERT ON watchdog_jobs "
    "FOR EACH STATEMENT EXECUTE FUNCTION watchdog_jobs_notify_queued()"
)
DROP_NOTIFY_FUNCTION_SQL = "DROP FUNCTION IF EXISTS watchdog_jobs_notify_queued()"

_LISTEN_SQL = f"LISTEN {CHANNEL}"

#: Become the sentinel if no enqueueing transaction is open and no other
#: runner waits; else say which of the two it is. One statement, autocommit.
WAIT_SQL = f"""\
SELECT CASE
    WHEN pg_try_advisory_lock({_KEYS}) THEN 'sentinel'
    WHEN EXISTS (
        SELECT FROM pg_locks
        WHERE locktype = 'advisory' AND objsubid = 2
          AND classid = {WAITING_LOCK[0]} AND objid = {WAITING_LOCK[1]}
          AND mode = 'ExclusiveLock' AND granted
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    ) THEN 'covered'
    ELSE 'open'
END"""
#: Stop waiting: let the lock go (this session holds no other advisory lock)
#: and tell covered runners to look again.
STOP_WAITING_SQL = f"SELECT pg_advisory_unlock_all(), pg_notify('{CHANNEL}', '{EVENT_HANDOVER}')"


#: The drivers whose connections deliver notifications to a listener.
LISTENING_DRIVERS = frozenset({"psycopg", "psycopg2", "asyncpg"})


# -- room freed in a limited queue, within one process ---------------------------

#: Wake-up callbacks of the runners of this process, by database (an engine's
#: URL): what SQLite has instead of NOTIFY, for room freed in a limited queue.
_LOCAL: dict[str, dict[int, Callable[[], None]]] = {}
_LOCAL_LOCK = threading.Lock()


def local_key(engine: Engine) -> str:
    """The key of ``engine``'s database among this process's wake-ups (its
    URL without driver or password: sync and async engines of one database agree)."""
    url = engine.url
    return f"{url.get_backend_name()}://{url.username or ''}@{url.host or ''}:{url.port or ''}/{url.database or ''}"


def wake_locally(key: str, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` (thread-safe, quick) when a job of a limited queue of
    database ``key`` settles in this process; returns the function that stops it."""
    token = id(callback)
    with _LOCAL_LOCK:
        _LOCAL.setdefault(key, {})[token] = callback

    def stop() -> None:
        with _LOCAL_LOCK:
            callbacks = _LOCAL.get(key)
            if callbacks is not None:
                callbacks.pop(token, None)
                if not callbacks:
                    del _LOCAL[key]

    return stop


def room_freed_locally(key: str) -> None:
    """Wake this process's runners of database ``key``: room freed in a limited queue."""
    with _LOCAL_LOCK:
        callbacks = list(_LOCAL.get(key, {}).values())
    for callback in callbacks:
        try:
            callback()
        except Exception:  # pragma: no cover - a wake-up callback only sets an event
            log.exception("a local wake-up failed")


#: The connections :func:`room_freed_at_commit` listens on (two listeners
#: each, for the connection's life), and the wake-up each owes at its commit.
_HOOKED: weakref.WeakSet[Connection] = weakref.WeakSet()
_OWED: weakref.WeakKeyDictionary[Connection, str] = weakref.WeakKeyDictionary()
_OWED_LOCK = threading.Lock()


def room_freed_at_commit(conn: Connection) -> None:
    """:func:`room_freed_locally` for ``conn``'s database once its transaction
    commits (at once outside one): a runner woken earlier could claim before
    the change is visible -- on MariaDB its read of the running jobs does not
    wait for this transaction, sees the settling job still running and is held
    back until its next poll (SQLite's claim waits for the write lock, so
    either order works there). A rollback owes nothing.

    Each connection gets its ``commit`` and ``rollback`` listeners once, not
    once per transaction: a runner keeps its connections for a long time, and
    SQLAlchemy keeps a spent ``once=True`` listener in the connection's list."""
    key = local_key(conn.engine)
    if not conn.in_transaction():
        room_freed_locally(key)
        return
    with _OWED_LOCK:
        hooked = conn in _HOOKED
        if not hooked:
            _HOOKED.add(conn)
        _OWED[conn] = key
    if not hooked:
        event.listen(conn, "commit", _committed)
        event.listen(conn, "rollback", _rolled_back)


def _committed(conn: Connection) -> None:
    with _OWED_LOCK:
        key = _OWED.pop(conn, None)
    if key is not None:
        room_freed_locally(key)


def _rolled_back(conn: Connection) -> None:
    with _OWED_LOCK:
        _OWED.pop(conn, None)


def _notifies(dialect_name: str) -> bool:
    """Whether the dialect's backend delivers LISTEN/NOTIFY wake-ups."""
    backend = BACKENDS.get(dialect_name)
    return backend is not None and backend.notifies


def listens_on(engine: Any, wakeups: WakeupMode = WakeupMode.AUTO) -> bool:
    """Whether a runner on ``engine`` (sync or async) that listens as
    ``wakeups`` says is woken by NOTIFY (what its default ``poll_interval``
    depends on: :func:`~sqlalchemy_watchdog.core.settings.default_poll_interval`)."""
    dialect = engine.dialect
    return wakeups is not WakeupMode.POLL and listens(dialect.name, dialect.driver)


def listens(dialect_name: str, driver: str) -> bool:
    """Whether a runner on this dialect and driver is woken by NOTIFY."""
    if not _notifies(dialect_name):
        return False
    if driver not in LISTENING_DRIVERS:
        log.debug("runner: the %s driver delivers no notifications here; polling instead", driver)
        return False
    return True


@dataclass(frozen=True)
class WakeupStatus:
    """The wake-ups in force for a runner: what was asked, whether it
    listens (LISTEN/NOTIFY on a proven session), and why not."""

    requested: WakeupMode
    listening: bool
    #: Why the runner polls instead ("" while it listens).
    reason: str = ""
    #: How often an idle runner looks for work without a wake-up, in seconds.
    poll_interval_s: float = 0.0

    def __str__(self) -> str:
        if self.listening:
            return f"listen (LISTEN/NOTIFY; backstop poll {self.poll_interval_s:g}s)"
        return f"poll every {self.poll_interval_s:g}s ({self.reason})"


def polling_reason(mode: WakeupMode, dialect_name: str, driver: str) -> str | None:
    """Why a runner polls without trying to listen, or None (try: prove the
    session first)."""
    if mode is WakeupMode.POLL:
        return 'wakeups="poll"'
    if not _notifies(dialect_name):
        return f"{dialect_name} has no LISTEN/NOTIFY"
    if driver not in LISTENING_DRIVERS:
        return f"the {driver} driver delivers no notifications"
    return None


def decide(mode: WakeupMode, reason: str, *, dialect_name: str, poll_interval_s: float) -> WakeupStatus:
    """The status of a runner that will not listen, for ``reason``: raises
    :class:`~sqlalchemy_watchdog.errors.WakeupsUnavailable` where
    ``wakeups="listen"`` was asked, and logs the one WARNING of ``"auto"`` on
    PostgreSQL (its session failed the proof, or its driver cannot listen);
    SQLite has nothing to listen with, and says so only in the start line."""
    if mode is WakeupMode.LISTEN:
        raise WakeupsUnavailable(reason)
    if mode is WakeupMode.AUTO and _notifies(dialect_name):
        log.warning(
            "runner: LISTEN/NOTIFY wake-ups are off: %s. Polling every %gs instead. For wake-ups within "
            "milliseconds give the runner listen_engine=create_engine(<a direct URL to the primary>) "
            '(CLI: --listen-url); to poll without this check, wakeups="poll"',
            reason,
            poll_interval_s,
        )
    return WakeupStatus(mode, False, reason, poll_interval_s)


def _autocommit_driver_connection(engine: Engine) -> Any:
    raw = engine.raw_connection()
    driver_conn: Any = raw.driver_connection
    raw.detach()  # never pooled again: it LISTENs; closed by its user
    try:
        driver_conn.autocommit = True
    except BaseException:
        with contextlib.suppress(Exception):
            driver_conn.close()
        raise
    return driver_conn


def connect_and_prove(
    engine: Engine, notify_engine: Engine | None = None, *, failures: int = 0
) -> tuple[Any, SessionProof | None]:
    """A detached autocommit driver connection of ``engine`` and its
    :func:`~sqlalchemy_watchdog.connections.prove_session` verdict (the
    NOTIFY sent through ``notify_engine``, the runner's own, default
    ``engine``); ``(None, None)`` when no connection could be made (the
    listener connects later). A connection that failed its proof is closed
    and returned as None. ``failures``: the listener's failed connections
    in a row before this one (only the first of an episode logs a WARNING)."""
    try:
        driver_conn = _autocommit_driver_connection(engine)
    except Exception as error:
        _log_cannot_connect(error, failures)
        return None, None
    try:
        proof = prove_session(engine, driver_conn, notify_engine)
    except Exception as error:
        proof = SessionProof(False, f"the session check failed: {redacted(error)}", failed=True)
    if not proof.proven:
        with contextlib.suppress(Exception):
            driver_conn.close()
        return None, proof
    return driver_conn, proof


async def _async_driver_connection(engine: AsyncEngine) -> Any:
    raw = await engine.raw_connection()
    driver_conn: Any = raw.driver_connection
    raw.detach()  # never pooled again: it LISTENs; closed by its user
    if engine.dialect.driver != "asyncpg":
        try:
            await driver_conn.set_autocommit(True)
        except BaseException:
            await _close_async(engine, driver_conn)
            raise
    return driver_conn


async def _close_async(engine: AsyncEngine, driver_conn: Any) -> None:
    # Closed directly (see Listener._run); asyncpg's terminate() never waits.
    with contextlib.suppress(Exception):
        if engine.dialect.driver == "asyncpg":
            driver_conn.terminate()
        else:
            await driver_conn.close()


async def connect_and_prove_async(
    engine: AsyncEngine, notify_engine: AsyncEngine | None = None, *, failures: int = 0
) -> tuple[Any, SessionProof | None]:
    """:func:`connect_and_prove` for an ``AsyncEngine``."""
    try:
        driver_conn = await _async_driver_connection(engine)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        _log_cannot_connect(error, failures)
        return None, None
    try:
        proof = await prove_session_async(engine, driver_conn, notify_engine)
    except asyncio.CancelledError:
        await _close_async(engine, driver_conn)
        raise
    except Exception as error:
        proof = SessionProof(False, f"the session check failed: {redacted(error)}", failed=True)
    if not proof.proven:
        await _close_async(engine, driver_conn)
        return None, proof
    return driver_conn, proof


#: Whether the listening session's server is still a writable primary.
WRITABLE_SQL = "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'"


class NotWritable(ConnectionError):
    """The listening session's server is no longer a writable primary."""


class _Health:
    """Every :attr:`EVERY_S`, a listener asks its server whether it is still
    a writable primary: a demoted or fenced primary that stays up keeps its
    sessions, and enqueues on the new primary would notify nobody. Not
    writable: the listener reconnects (a multi-host URL with
    ``target_session_attrs=read-write`` then reaches the new primary)."""

    EVERY_S = 5.0

    def __init__(self) -> None:
        self._next = time.monotonic() + self.EVERY_S

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.EVERY_S
        return True

    @staticmethod
    def verdict(writable: Any) -> None:
        if not writable:
            raise NotWritable("the server is no longer a writable primary (a failover?)")


def _backoff(failures: int) -> float:
    return min(30.0, 0.25 * 2.0 ** min(failures, 7))


def _episode_level(failures: int) -> int:
    """The level of a listener's failure to connect: WARNING for the first of
    an episode (``failures`` before it: 0), DEBUG for the retries after it --
    an outage of a minute is one line, not one per backoff; "listening
    again" closes the episode."""
    return logging.WARNING if failures == 0 else logging.DEBUG


def _log_cannot_connect(error: BaseException, failures: int) -> None:
    """No connection to listen on (see :func:`_episode_level`)."""
    log.log(
        _episode_level(failures),
        "listener: cannot connect (%s); polling meanwhile, trying again in %gs",
        redacted(error),
        _backoff(failures + 1),
    )


def _log_unproven(proof: SessionProof, failures: int) -> None:
    """A new listening connection (after a lost one) failed its proof: the
    runner polls until a later one passes, which "listening again" says
    (``failures``: the failed connections before this one, see
    :func:`_episode_level`)."""
    what = (
        "could not check the new listening connection"
        if proof.failed
        else "the new listening connection is not one PostgreSQL session"
    )
    log.log(
        _episode_level(failures),
        "listener: %s (%s); polling meanwhile, trying again in %gs",
        what,
        proof.reason,
        _backoff(failures + 1),
    )


class Waiting:
    """Whether a runner is announced as waiting for work: its listener's side
    of the waiting lock (see the module's docstring), shared by the runner's
    loop (:meth:`idle`, :meth:`busy`) and its listener (the rest).

    Thread-safe; the loop never waits on the database for it: :meth:`idle`
    and :meth:`busy` only record what the loop saw and ``kick`` the listener,
    which runs the statements on its own connection.
    """

    #: How soon a runner that could not take the lock (an enqueueing
    #: transaction was open) looks for work and tries again.
    RETRY_S = 0.05

    # states of the listener's session
    OFF = "off"  # holds nothing, has not tried since it was last told idle
    SENTINEL = "sentinel"  # holds the lock exclusively
    COVERED = "covered"  # another runner is the sentinel
    OPEN = "open"  # enqueueing transactions were open; try again soon

    def __init__(self, poll_interval_s: float, kick: Callable[[], None] = lambda: None) -> None:
        self.poll_interval_s = poll_interval_s
        self.kick = kick
        self._lock = threading.Lock()
        self._idle = False
        self.state = self.OFF
        self._due = 0.0
        #: A WAIT_SQL was sent and its answer is not recorded yet: the
        #: session may hold the lock already.
        self._asking = False
        #: A handover was dispatched since that WAIT_SQL was sent. asyncpg
        #: runs notification callbacks while a statement's answer is still on
        #: its way, so a 'covered' answer may name a sentinel already gone.
        self._handed_over = False

    # -- the loop's side

    def idle(self) -> None:
        """The runner's claim came back short: it waits for work."""
        self._want(True)

    def busy(self) -> None:
        """The runner's claim filled every free slot: no wake-up is needed."""
        self._want(False)

    def _want(self, idle: bool) -> None:
        with self._lock:
            if self._idle == idle:
                return
            self._idle = idle
        self.kick()

    # -- the listener's side

    def next_statement(self, now: float) -> str | None:
        """The statement the listener should run now, if any."""
        with self._lock:
            if self._idle:
                if self.state == self.OFF or (self.state in (self.COVERED, self.OPEN) and now >= self._due):
                    self._asking = True
                    self._handed_over = False
                    return WAIT_SQL
                return None
            if self.state == self.SENTINEL:
                return STOP_WAITING_SQL
            self.state = self.OFF
            return None

    def ran(self, statement: str, answer: Any, now: float) -> bool:
        """Record what ``statement`` answered; True when the runner must look
        for work now (after every try to wait: its last look)."""
        with self._lock:
            if statement == STOP_WAITING_SQL:
                self.state = self.OFF
                return False
            self._asking = False
            self.state = str(answer)
            if self.state == self.COVERED and self._handed_over:
                self.state = self.OFF  # covered by a sentinel that has handed over: try again now
            self._due = now + (self.RETRY_S if self.state == self.OPEN else self.poll_interval_s)
            return True

    def handed_over(self) -> None:
        """The sentinel stopped waiting: a covered runner tries to take over."""
        with self._lock:
            if self._asking:
                self._handed_over = True  # the answer on its way may be 'covered' by it
                return
            if self.state != self.COVERED:
                return
            self.state = self.OFF
        self.kick()

    def waits(self) -> bool:
        """Whether the runner is announced as waiting for work (its last
        claim came back short); a busy runner is told of no enqueue."""
        with self._lock:
            return self._idle

    def may_hold_lock(self) -> bool:
        """Whether the listener's session may hold the lock exclusively: it
        is the sentinel, or a WAIT_SQL's answer never came back (a stop
        cancelled it), so the session must step down before it goes."""
        with self._lock:
            return self.state == self.SENTINEL or self._asking

    def disconnected(self) -> None:
        """The listener's session ended, and the lock with it."""
        with self._lock:
            self.state = self.OFF
            self._asking = False

    def timeout(self, now: float, longest: float) -> float:
        """How long the listener may wait for a notification before it must act."""
        with self._lock:
            if self._idle and self.state in (self.COVERED, self.OPEN):
                return max(0.0, min(longest, self._due - now))
            return longest


class _Wakeups:
    """What a listener does with a notification and with the waiting lock's
    statements; the driver-specific loops below only move bytes."""

    def __init__(self, on_queued: Callable[[], None], on_stop: Callable[[], None], waiting: Waiting | None) -> None:
        self.on_queued = on_queued
        self.on_stop = on_stop
        self.waiting = waiting
        #: When the listening session was lost (monotonic), until LISTEN is in place again.
        self._lost_at: float | None = None

    def lost(self) -> None:
        """The listening session is gone: the runner polls until :meth:`connected`."""
        if self._lost_at is None:
            self._lost_at = time.monotonic()

    def dispatch(self, payload: str) -> None:
        if payload == EVENT_STOP:
            self.on_stop()
        elif payload == EVENT_QUEUED:
            self.on_queued()
        elif payload == EVENT_HANDOVER:
            if self.waiting is not None:
                self.waiting.handed_over()
            self.on_queued()

    def act(self, run: Callable[[str], Any]) -> None:
        """Run what the waiting lock needs now (sync drivers)."""
        if self.waiting is None:
            return
        while (statement := self.waiting.next_statement(time.monotonic())) is not None:
            if self.waiting.ran(statement, run(statement), time.monotonic()):
                self.on_queued()

    async def act_async(self, run: Callable[[str], Awaitable[Any]]) -> None:
        """:meth:`act` for the asyncio drivers."""
        if self.waiting is None:
            return
        while (statement := self.waiting.next_statement(time.monotonic())) is not None:
            if self.waiting.ran(statement, await run(statement), time.monotonic()):
                self.on_queued()

    def step_down(self, run: Callable[[str], Any]) -> None:
        """The listener stops: a sentinel lets the lock go and tells covered
        runners at once (else they would notice only at their next poll)."""
        if self.waiting is not None and self.waiting.may_hold_lock():
            with contextlib.suppress(Exception):  # the session's end lets the lock go anyway
                run(STOP_WAITING_SQL)

    async def step_down_async(self, run: Callable[[str], Awaitable[Any]]) -> None:
        """:meth:`step_down` for the asyncio drivers."""
        if self.waiting is not None and self.waiting.may_hold_lock():
            with contextlib.suppress(Exception):  # e.g. a connection the stop cancelled mid-statement
                await asyncio.wait_for(run(STOP_WAITING_SQL), 5)

    def timeout(self, longest: float) -> float:
        return longest if self.waiting is None else self.waiting.timeout(time.monotonic(), longest)

    def connected(self) -> None:
        """LISTEN is in place: whatever was committed while nobody listened
        (before the first LISTEN, or across a reconnect) is looked for now."""
        if self.waiting is not None:
            self.waiting.disconnected()
        if self._lost_at is not None:
            # The line that pairs with "connection lost": without it the last word in the
            # log would be that the runner polls, while it listens again.
            log.warning(
                "listener: listening again (LISTEN resumed %.1fs after the connection was lost)",
                time.monotonic() - self._lost_at,
            )
            self._lost_at = None
        self.on_queued()


class Listener:
    """A thread LISTENing on a connection of ``engine`` (psycopg 3 or
    psycopg2): ``on_queued`` on new work, ``on_stop`` on a cancellation or
    lane failure; and the holder of the runner's side of the waiting lock
    (``waiting``), whose ``kick`` it takes over.

    Whatever was committed while nobody listened (before the first LISTEN,
    or across a reconnect) is covered by calling ``on_queued`` once the
    LISTEN is in place.
    """

    def __init__(
        self,
        engine: Engine,
        on_queued: Callable[[], None],
        on_stop: Callable[[], None],
        waiting: Waiting | None = None,
        *,
        first: Any = None,
        prove: bool = True,
        notify_engine: Engine | None = None,
    ) -> None:
        self.engine = engine
        #: Whose NOTIFY a new connection's proof must receive: the runner's own engine.
        self._notify_engine = notify_engine
        #: New connections that failed in a row (the backoff's count).
        self._failures = 0
        self.wakeups = _Wakeups(on_queued, on_stop, waiting)
        #: A proven driver connection to serve first (see :func:`connect_and_prove`).
        self._first = first
        #: Whether every new connection is proven before it listens.
        self._prove = prove
        self._stop = threading.Event()
        self._kick_in, self._kick_out = socket.socketpair()
        self._kick_in.setblocking(False)
        self._kick_out.setblocking(False)
        if waiting is not None:
            waiting.kick = self._kick
        self._thread = threading.Thread(target=self._run, name="watchdog-listener", daemon=True)

    @classmethod
    def start_for(
        cls,
        engine: Engine,
        on_queued: Callable[[], None],
        on_stop: Callable[[], None],
        waiting: Waiting | None = None,
        *,
        first: Any = None,
        prove: bool = True,
        notify_engine: Engine | None = None,
    ) -> Listener | None:
        """A started listener, or None where the engine cannot listen."""
        if not listens(engine.dialect.name, engine.dialect.driver):
            return None
        listener = cls(engine, on_queued, on_stop, waiting, first=first, prove=prove, notify_engine=notify_engine)
        listener._thread.start()
        return listener

    def stop(self) -> None:
        self._stop.set()
        self._kick()
        self._thread.join(timeout=10)
        self._kick_in.close()
        self._kick_out.close()

    def _kick(self) -> None:
        with contextlib.suppress(OSError):  # full (a kick is pending anyway) or closed
            self._kick_in.send(b"\0")

    def _wait(self, fileno: int) -> bool:
        """Wait for the connection to have input, a kick, or the next due
        action; True when the connection has input."""
        kicks = self._kick_out.fileno()
        ready, _, _ = select.select([fileno, kicks], [], [], self.wakeups.timeout(0.5))
        if kicks in ready:
            with contextlib.suppress(OSError):
                while self._kick_out.recv(4096):
                    pass
        return fileno in ready

    def _connect(self) -> Any:
        """A connection to listen on: the proven first one, else a new one,
        proven unless told otherwise; None after a failure (logged)."""
        first, self._first = self._first, None
        if first is not None:
            return first
        if not self._prove:
            try:
                return _autocommit_driver_connection(self.engine)
            except Exception as error:
                _log_cannot_connect(error, self._failures)
                return None
        driver_conn, proof = connect_and_prove(self.engine, self._notify_engine, failures=self._failures)
        if proof is not None and not proof.proven:
            _log_unproven(proof, self._failures)
        return driver_conn

    def _run(self) -> None:
        while not self._stop.is_set():
            driver_conn = self._connect()
            if driver_conn is None:
                self._failures += 1
                self._stop.wait(_backoff(self._failures))
                continue
            self._failures = 0
            try:
                if self.engine.dialect.driver == "psycopg2":
                    self._serve_psycopg2(driver_conn)
                else:
                    self._serve_psycopg(driver_conn)
            except Exception as error:
                if not self._stop.is_set():
                    self.wakeups.lost()
                    log.warning("listener: connection lost (%s); polling until it listens again", redacted(error))
                    self._stop.wait(0.5)
            finally:
                # Closed directly: the pool's close would first roll back, and
                # log an ERROR, on a connection the server already dropped.
                with contextlib.suppress(Exception):
                    driver_conn.close()

    def _serve_psycopg(self, driver_conn: Any) -> None:
        driver_conn.execute(_LISTEN_SQL)
        self.wakeups.connected()

        def run(statement: str) -> Any:
            return driver_conn.execute(statement).fetchone()[0]

        health = _Health()
        while not self._stop.is_set():
            if health.due():
                health.verdict(run(WRITABLE_SQL))
            self.wakeups.act(run)
            # Notifications that came in while a statement ran wait in
            # psycopg's backlog, not on the socket: drained before waiting.
            for note in driver_conn.notifies(timeout=0):
                self.wakeups.dispatch(note.payload)
            if self._wait(driver_conn.fileno()):
                for note in driver_conn.notifies(timeout=0):
                    self.wakeups.dispatch(note.payload)
                if driver_conn.closed:
                    raise ConnectionError("the listening connection was closed")
        self.wakeups.step_down(run)

    def _serve_psycopg2(self, driver_conn: Any) -> None:
        with driver_conn.cursor() as cursor:
            cursor.execute(_LISTEN_SQL)
        self.wakeups.connected()

        def run(statement: str) -> Any:
            with driver_conn.cursor() as cursor:
                cursor.execute(statement)
                return cursor.fetchone()[0]

        health = _Health()
        while not self._stop.is_set():
            if health.due():
                health.verdict(run(WRITABLE_SQL))
            self.wakeups.act(run)
            if self._wait(driver_conn.fileno()):
                driver_conn.poll()
            while driver_conn.notifies:
                self.wakeups.dispatch(driver_conn.notifies.pop(0).payload)
        self.wakeups.step_down(run)


async def _serve_asyncpg(driver_conn: Any, wakeups: _Wakeups, kicked: asyncio.Event) -> None:
    def deliver(connection: Any, pid: int, channel: str, payload: str) -> None:
        wakeups.dispatch(payload)

    await driver_conn.add_listener(CHANNEL, deliver)
    wakeups.connected()
    health = _Health()
    try:
        while not driver_conn.is_closed():
            kicked.clear()
            if health.due():
                health.verdict(await driver_conn.fetchval(WRITABLE_SQL))
            await wakeups.act_async(driver_conn.fetchval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(kicked.wait(), wakeups.timeout(1.0))
    except asyncio.CancelledError:
        await wakeups.step_down_async(driver_conn.fetchval)
        raise
    raise ConnectionError("the listening connection was closed")


async def _serve_psycopg_async(driver_conn: Any, wakeups: _Wakeups, kicked: asyncio.Event) -> None:
    await driver_conn.execute(_LISTEN_SQL)
    wakeups.connected()

    async def run(statement: str) -> Any:
        return (await (await driver_conn.execute(statement)).fetchone())[0]

    try:
        await _listen_psycopg_async(driver_conn, wakeups, kicked, run)
    except asyncio.CancelledError:
        await wakeups.step_down_async(run)
        raise


async def _listen_psycopg_async(
    driver_conn: Any, wakeups: _Wakeups, kicked: asyncio.Event, run: Callable[[str], Awaitable[Any]]
) -> None:
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    health = _Health()
    while True:
        kicked.clear()
        if health.due():
            health.verdict(await run(WRITABLE_SQL))
        await wakeups.act_async(run)
        async for note in driver_conn.notifies(timeout=0):  # the backlog (see Listener)
            wakeups.dispatch(note.payload)
        # psycopg adds its own reader for the socket while it runs a
        # statement, so ours is only there while we wait.
        readable.clear()
        fileno = driver_conn.fileno()
        loop.add_reader(fileno, readable.set)
        try:
            waits = [asyncio.ensure_future(readable.wait()), asyncio.ensure_future(kicked.wait())]
            try:
                await asyncio.wait(waits, timeout=wakeups.timeout(1.0), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
        finally:
            loop.remove_reader(fileno)
        if readable.is_set():
            async for note in driver_conn.notifies(timeout=0):
                wakeups.dispatch(note.payload)
            if driver_conn.closed:
                raise ConnectionError("the listening connection was closed")


async def listen_async(
    engine: AsyncEngine,
    on_queued: Callable[[], None],
    on_stop: Callable[[], None],
    waiting: Waiting | None = None,
    *,
    first: Any = None,
    prove: bool = True,
    notify_engine: AsyncEngine | None = None,
) -> None:
    """:class:`Listener` for an ``AsyncEngine``, until cancelled: ``first``
    is a proven connection to serve first; every new one is proven first
    (unless ``prove`` is false), with a NOTIFY sent through
    ``notify_engine`` (the runner's own; default ``engine``)."""
    wakeups = _Wakeups(on_queued, on_stop, waiting)
    kicked = asyncio.Event()
    if waiting is not None:
        waiting.kick = kicked.set
    failures = 0
    while True:
        driver_conn, first = first, None
        if driver_conn is None:
            if prove:
                driver_conn, proof = await connect_and_prove_async(engine, notify_engine, failures=failures)
                if proof is not None and not proof.proven:
                    _log_unproven(proof, failures)
            else:
                try:
                    driver_conn = await _async_driver_connection(engine)
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    _log_cannot_connect(error, failures)
            if driver_conn is None:
                failures += 1
                await asyncio.sleep(_backoff(failures))
                continue
        failures = 0
        try:
            if engine.dialect.driver == "asyncpg":
                await _serve_asyncpg(driver_conn, wakeups, kicked)
            else:
                await _serve_psycopg_async(driver_conn, wakeups, kicked)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            wakeups.lost()
            log.warning("listener: connection lost (%s); polling until it listens again", redacted(error))
            await asyncio.sleep(0.5)
        finally:
            await _close_async(engine, driver_conn)
