"""A model of the waiting lock: no committed job waits for a poll while a runner is free.

``sqlalchemy_watchdog.wakeups`` makes the INSERT trigger notify only while a
runner waits (see its module docstring). This Hypothesis state machine
drives the real :class:`~sqlalchemy_watchdog.wakeups.Waiting` of each
simulated runner -- through the real ``_Wakeups`` (``act_async``,
``dispatch``, ``connected``, ``step_down``) and the real
:func:`~sqlalchemy_watchdog.core.loop.loop_pass` -- against a small
pure-Python stand-in for the database:

* the advisory lock with PostgreSQL's semantics: session-level and
  transaction-level holds, exclusive and shared; a try never waits; a
  session's own holds never conflict with each other; ``pg_advisory_unlock_all``
  releases the session-level ones, a transaction's end its own, a session's
  end all of them;
* the module's SQL is *interpreted*, not re-implemented: the trigger's body,
  WAIT_SQL's CASE, STOP_WAITING_SQL and LISTEN are parsed from the module's
  strings (the ``pg_locks`` WHERE clause is evaluated over the simulated
  rows), so a change to them changes what the model does -- or fails loudly
  when the model cannot read it. A statement runs one step at a time:
  WAIT_SQL's try and its look at ``pg_locks`` are separate moments, and a
  notification is delivered when its transaction commits;
* producer transactions (begin; INSERT, which fires the statement trigger;
  commit: the jobs become visible and the notifications reach every
  listening session, in commit order; rollback); claims see only committed
  jobs; a runner has N slots, and its handlers finish whenever they like;
* each runner's loop (``Runner._loop`` around ``loop_pass``: the wake-up
  event is cleared before a pass, the pass claims, then says busy or idle)
  and its listener (``Listener._serve_psycopg``: act, drain, select on
  kicks, notifications and the timeout, then drain again), each moving
  one step at a time. A scheduler seeded by Hypothesis picks, at every
  step, which of the runnable actors (loops, listeners, the server's
  statements, producers, handlers) moves next; Hypothesis picks the rest
  (runners and their slots, how busy the producers are, faults, stops,
  the clock);
* faults: the server ends a listener's session; a listener's connection
  breaks (its session lingers at the server, holding what it held, until
  the server reaps it); runners stop (the loop first, then the listener,
  which steps down);
* a simulated monotonic clock (``wakeups.time`` is patched) that only the
  machine advances.

Checked after every step: whenever the system is quiescent (no pass,
statement, kick, notification or due timer pending anywhere) and a
committed job is unclaimed while a running runner has a free slot, that
runner is OPEN and looks again within ``Waiting.RETRY_S``, or it is
COVERED by a session that crashed (died without handing over), which the
design leaves to the poll; anything else is a lost wake-up. Also: a runner
that believes it is the sentinel holds the lock (so there is at most one);
at quiescence the lock's holder is an idle runner that knows it is the
sentinel (a busy runner lets it go); a stopping runner never closes its
session holding the lock; W is held shared only by open enqueueing
transactions; WAIT_SQL answers 'open' only while nobody holds W
exclusively (a covered runner waits rather than polls every RETRY_S); the
trigger notifies iff some session holds W exclusively when it runs; and
the system always becomes quiescent without outside help (no livelock).

psycopg2's listener is modelled as the thread's: it differs only in that
notifications libpq read during a statement wait in ``conn.notifies``
until the next select returns (a kick or at most 0.5 s later), a latency
this model does not measure.

The listeners of the async runners differ in two ways the thread's does
not have: asyncpg runs its notification callbacks whenever the listening
task awaits -- also between a statement's evaluation and the
``Waiting.ran`` of its answer -- and cancelling the task on stop may land
while a statement is in flight. The machine draws runners of all three
flavors; each of the two found a defect (now fixed), pinned below as
regression tests with their minimal sequences.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
from collections.abc import Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from random import Random
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sqlalchemy_watchdog import store, wakeups
from sqlalchemy_watchdog.core.clock import Clock
from sqlalchemy_watchdog.core.loop import loop_pass
from sqlalchemy_watchdog.core.settings import RunnerOptions, RunnerSettings
from sqlalchemy_watchdog.core.state import RunnerCore
from sqlalchemy_watchdog.core.steps import Spawn, StoreCall
from sqlalchemy_watchdog.wakeups import (
    _LISTEN_SQL,
    NOTIFY_FUNCTION_SQL,
    NOTIFY_TRIGGER_SQL,
    STOP_WAITING_SQL,
    WAIT_SQL,
    WAITING_LOCK,
    Waiting,
    _Wakeups,
)

#: The runners' poll interval: the safety net a lost wake-up falls back to.
POLL = 2.0
#: How soon an OPEN runner must look again (read once: a change to it at run time is a change to check).
RETRY_S = Waiting.RETRY_S
#: Runners running at once, and started in all (stopped ones are replaced).
MAX_RUNNERS, MAX_STARTED = 3, 5
PRODUCERS = 2


# -- the clock ---------------------------------------------------------------------


class _Clock:
    """``time`` as the listener code sees it (``wakeups.time``): the machine's clock."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now


CLOCK = _Clock()


@pytest.fixture(autouse=True)
def simulated_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wakeups, "time", CLOCK)


# -- the module's SQL, parsed --------------------------------------------------------


class NotModelled(AssertionError):
    """The module's SQL has a shape this model cannot evaluate: the model needs updating."""


class Violation(AssertionError):
    """A guarantee of the waiting lock does not hold."""


class LostWakeUp(Violation):
    """A committed job waits for a poll although a runner is free."""


class NoHandover(Violation):
    """A runner that stopped closed its session still holding the lock."""


DB_OID = 16_384
EXCLUSIVE, SHARED = "ExclusiveLock", "ShareLock"
_DATABASE_OID_SQL = "(SELECT oid FROM pg_database WHERE datname = current_database())"


def _normal(sql: str) -> str:
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


def _literal(text: str) -> int | str:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"'[^']*'", text):
        return text[1:-1]
    raise NotModelled(f"not a literal the model knows: {text!r}")


@dataclass(frozen=True)
class Call:
    """A function call with literal arguments, e.g. ``pg_try_advisory_lock(1, 2)``."""

    name: str
    args: tuple[int | str, ...]


def _call(text: str) -> Call:
    match = re.fullmatch(r"(\w+)\(([^()]*)\)", text.strip())
    if match is None:
        raise NotModelled(f"not a function call the model knows: {text!r}")
    args = tuple(_literal(arg.strip()) for arg in match[2].split(",") if arg.strip())
    return Call(match[1], args)


@dataclass(frozen=True)
class Exists:
    """``EXISTS (SELECT FROM pg_locks WHERE <column = value AND ...>)``."""

    terms: tuple[tuple[str, Any], ...]


def _where(text: str) -> tuple[tuple[str, Any], ...]:
    terms: list[tuple[str, Any]] = []
    for term in text.split(" AND "):
        if re.fullmatch(r"\w+", term):
            terms.append((term, True))  # a boolean column
            continue
        match = re.fullmatch(r"(\w+) = (.+)", term)
        if match is None:
            raise NotModelled(f"not a pg_locks condition the model knows: {term!r}")
        value = DB_OID if match[2] == _DATABASE_OID_SQL else _literal(match[2])
        terms.append((match[1], value))
    return tuple(terms)


def _condition(text: str) -> Call | Exists:
    match = re.fullmatch(r"EXISTS \( SELECT FROM pg_locks WHERE (.*) \)", text)
    return Exists(_where(match[1])) if match else _call(text)


@dataclass(frozen=True)
class Case:
    """``SELECT CASE WHEN <condition> THEN '<answer>' ... ELSE '<answer>' END``."""

    branches: tuple[tuple[Call | Exists, str], ...]
    otherwise: str


def _parse_case(sql: str) -> Case:
    text = _normal(sql)
    match = re.fullmatch(r"SELECT CASE (.*) ELSE '(\w+)' END", text)
    if match is None:
        raise NotModelled(f"WAIT_SQL is no longer one CASE: {text}")
    branch = r"WHEN (.*?) THEN '(\w+)' ?"
    if re.sub(branch, "", match[1]) != "":
        raise NotModelled(f"WAIT_SQL has a branch the model cannot read: {match[1]}")
    branches = tuple((_condition(cond), answer) for cond, answer in re.findall(branch, match[1]))
    return Case(branches, match[2])


def _parse_select(sql: str) -> tuple[Call, ...]:
    match = re.fullmatch(r"SELECT (\w+\([^()]*\)(?:, \w+\([^()]*\))*)", _normal(sql))
    if match is None:
        raise NotModelled(f"not a SELECT of function calls: {sql}")
    return tuple(_call(text) for text in re.findall(r"\w+\([^()]*\)", match[1]))


@dataclass(frozen=True)
class Trigger:
    """The statement trigger's body: ``IF [NOT] <test> THEN PERFORM <then>; END IF``."""

    negated: bool
    test: Call
    then: Call


def _parse_trigger() -> Trigger:
    trigger = re.fullmatch(
        r"CREATE TRIGGER \w+ AFTER INSERT ON watchdog_jobs FOR EACH STATEMENT EXECUTE FUNCTION (\w+)\(\)",
        _normal(NOTIFY_TRIGGER_SQL),
    )
    function = re.fullmatch(
        r"CREATE OR REPLACE FUNCTION (\w+)\(\) RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN "
        r"IF (NOT )?(\w+\([^()]*\)) THEN PERFORM (\w+\([^()]*\)); END IF; RETURN NULL; END \$\$",
        _normal(NOTIFY_FUNCTION_SQL),
    )
    if trigger is None or function is None or trigger[1] != function[1]:
        raise NotModelled("the INSERT trigger is no longer one statement trigger running IF ... THEN PERFORM")
    return Trigger(function[2] is not None, _call(function[3]), _call(function[4]))


def _parse_listen() -> str:
    match = re.fullmatch(r"LISTEN (\w+)", _LISTEN_SQL)
    if match is None:
        raise NotModelled(f"not a LISTEN: {_LISTEN_SQL}")
    return match[1]


WAIT = _parse_case(WAIT_SQL)
STOP_WAITING = _parse_select(STOP_WAITING_SQL)
TRIGGER = _parse_trigger()
LISTENS_ON = _parse_listen()

#: The try-lock functions: name -> (transaction-level, mode).
_TRY_LOCKS = {
    "pg_try_advisory_lock": (False, EXCLUSIVE),
    "pg_try_advisory_lock_shared": (False, SHARED),
    "pg_try_advisory_xact_lock": (True, EXCLUSIVE),
    "pg_try_advisory_xact_lock_shared": (True, SHARED),
}


# -- the database ----------------------------------------------------------------------


@dataclass(eq=False)
class Session:
    """A server session (backend). ``connected``: its client still has it;
    a session whose client is gone but which is ``alive`` lingers (an orphan)."""

    sid: int
    owner: str
    alive: bool = True
    connected: bool = True
    channels: set[str] = field(default_factory=set)
    inbox: list[str] = field(default_factory=list)
    running: Statement | None = None


@dataclass(eq=False)
class Txn:
    session: Session
    notifies: dict[tuple[str, str], None] = field(default_factory=dict)  # folded, in order
    jobs: list[int] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class Hold:
    session: Session
    txn: Txn | None  # None: a session-level hold
    mode: str


class Statement:
    """A statement the server runs for a listener's session (autocommit),
    one step per :meth:`step`; ``answer`` is its first column."""

    def __init__(self, sql: str, session: Session, steps: Generator[None, None, Any]) -> None:
        self.sql = sql
        self.name = "WAIT_SQL" if sql == WAIT_SQL else "STOP_WAITING_SQL"
        self.session = session
        self.steps = steps
        self.done = False
        self.failed = False
        self.answer: Any = None
        #: The sessions WAIT_SQL's look at pg_locks matched (who covers it).
        self.seen: set[int] = set()
        #: Who else held W exclusively when the last branch WAIT_SQL evaluated was.
        self.held_by_others: list[int] = []

    def step(self) -> None:
        if not self.session.alive:
            self.done = self.failed = True
            return
        try:
            next(self.steps)
        except StopIteration as end:
            self.done = True
            self.answer = end.value


class Database:
    """What the server does: the advisory locks, transactions, notifications,
    the jobs table (only what claims see) and the sessions."""

    def __init__(self) -> None:
        self.holds: dict[tuple[int, int], list[Hold]] = {}
        self.sessions: list[Session] = []
        #: Committed, unclaimed jobs, in admission order.
        self.ready: list[int] = []
        #: Sessions that ended, or lost their client, without closing: crashes.
        self.crashed: set[int] = set()

    def connect(self, owner: str) -> Session:
        session = Session(len(self.sessions) + 1, owner)
        self.sessions.append(session)
        return session

    # -- the lock manager (try-only: a request that conflicts fails at once)

    def _key(self, call: Call) -> tuple[int, int]:
        if len(call.args) != 2 or not all(isinstance(a, int) for a in call.args):
            raise NotModelled(f"only the two-key advisory locks are modelled: {call}")
        return (int(call.args[0]), int(call.args[1]))

    def try_lock(self, session: Session, txn: Txn | None, key: tuple[int, int], mode: str) -> bool:
        holds = self.holds.setdefault(key, [])
        if any(h.session is not session and EXCLUSIVE in (mode, h.mode) for h in holds):
            return False
        holds.append(Hold(session, txn, mode))
        return True

    def _release(self, keep: Callable[[Hold], bool]) -> None:
        for key, holds in self.holds.items():
            self.holds[key] = [h for h in holds if keep(h)]

    def exclusive_holders(self, key: tuple[int, int] = WAITING_LOCK) -> list[Session]:
        holders: list[Session] = []
        for hold in self.holds.get(key, []):
            if hold.mode == EXCLUSIVE and hold.session not in holders:
                holders.append(hold.session)
        return holders

    def shared_holders(self, key: tuple[int, int] = WAITING_LOCK) -> list[Session]:
        return [h.session for h in self.holds.get(key, []) if h.mode == SHARED]

    def pg_locks(self) -> Iterator[dict[str, Any]]:
        for (classid, objid), holds in self.holds.items():
            for hold in holds:
                yield dict(
                    locktype="advisory",
                    database=DB_OID,
                    classid=classid,
                    objid=objid,
                    objsubid=2,  # the two-key form
                    mode=hold.mode,
                    granted=True,  # a try never waits
                    pid=hold.session.sid,
                )

    def exists(self, exists: Exists) -> list[dict[str, Any]]:
        rows = []
        for row in self.pg_locks():
            for column, _ in exists.terms:
                if column not in row:
                    raise NotModelled(f"pg_locks.{column} is not modelled")
            if all(row[column] == value for column, value in exists.terms):
                rows.append(row)
        return rows

    def call(self, call: Call, session: Session, txn: Txn) -> Any:
        if call.name in _TRY_LOCKS:
            xact, mode = _TRY_LOCKS[call.name]
            return self.try_lock(session, txn if xact else None, self._key(call), mode)
        if call.name == "pg_advisory_unlock_all" and not call.args:
            self._release(lambda h: not (h.session is session and h.txn is None))
            return None
        if call.name == "pg_notify" and len(call.args) == 2:
            channel, payload = call.args
            txn.notifies[(str(channel), str(payload))] = None
            return None
        raise NotModelled(f"{call.name} is not modelled")

    # -- transactions

    def end(self, txn: Txn, commit: bool) -> None:
        self._release(lambda h: h.txn is not txn)
        if not commit:
            return
        self.ready.extend(txn.jobs)
        for channel, payload in txn.notifies:
            for session in self.sessions:
                if session.alive and channel in session.channels:
                    session.inbox.append(payload)

    def end_session(self, session: Session, crashed: bool) -> None:
        """The backend exits: what it was running is aborted, and every
        lock it held is released."""
        if not session.alive:
            return
        session.alive = False
        session.inbox.clear()
        if session.running is not None and not session.running.done:
            session.running.steps.close()  # its transaction ends without commit (see _run_*)
            session.running.done = session.running.failed = True
        self._release(lambda h: h.session is not session)
        if crashed:
            self.crashed.add(session.sid)

    # -- the statements, as the module's SQL says

    def run_wait(self, session: Session) -> Statement:
        statement = Statement(WAIT_SQL, session, self._run_case(session, WAIT))
        return statement

    def _run_case(self, session: Session, case: Case) -> Generator[None, None, str]:
        """A CASE is evaluated branch by branch: each WHEN is one moment,
        and other sessions move between them."""
        txn = Txn(session)
        committed = False
        try:
            answer = case.otherwise
            for condition, result in case.branches:
                if isinstance(condition, Exists):
                    rows = self.exists(condition)
                    assert session.running is not None
                    session.running.seen = {row["pid"] for row in rows}
                    true = bool(rows)
                else:
                    true = bool(self.call(condition, session, txn))
                assert session.running is not None
                session.running.held_by_others = [s.sid for s in self.exclusive_holders() if s is not session]
                yield
                if true:
                    answer = result
                    break
            self.end(txn, commit=True)
            committed = True
            return answer
        finally:
            if not committed:
                self.end(txn, commit=False)

    def run_select(self, session: Session, calls: tuple[Call, ...]) -> Generator[None, None, Any]:
        """A SELECT of function calls: they run together; its notifications
        go out when the statement's transaction commits, a moment later."""
        txn = Txn(session)
        committed = False
        try:
            values = [self.call(call, session, txn) for call in calls]
            yield
            self.end(txn, commit=True)
            committed = True
            return values[0]
        finally:
            if not committed:
                self.end(txn, commit=False)

    def fire_trigger(self, txn: Txn) -> bool:
        """The INSERT's statement trigger, run in the enqueuing transaction;
        whether it notified."""
        value = bool(self.call(TRIGGER.test, txn.session, txn))
        if value != TRIGGER.negated:
            self.call(TRIGGER.then, txn.session, txn)
            return TRIGGER.then.name == "pg_notify"
        return False


# -- the runners -------------------------------------------------------------------------


@dataclass(frozen=True)
class Flavor:
    """How a runner's listener interleaves with the rest (see the module docstring)."""

    name: str
    #: asyncpg: notification callbacks run whenever the listening task awaits.
    dispatch_while_awaiting: bool
    #: The async runners cancel the listening task on stop, at whatever it awaits.
    cancelled_on_stop: bool
    #: The longest the listener waits for a notification (the ``longest`` of ``timeout``).
    longest: float
    #: False: a runner with no listener at all -- ``wakeups="poll"``, or
    #: ``"auto"`` whose session failed the proof (behind a pooler): it never
    #: LISTENs, never takes the waiting lock, and finds work by its poll.
    listens: bool = True


THREAD = Flavor("thread", dispatch_while_awaiting=False, cancelled_on_stop=False, longest=0.5)
PSYCOPG_ASYNC = Flavor("psycopg-async", dispatch_while_awaiting=False, cancelled_on_stop=True, longest=1.0)
ASYNCPG = Flavor("asyncpg", dispatch_while_awaiting=True, cancelled_on_stop=True, longest=1.0)
POLLING = Flavor("polling", dispatch_while_awaiting=False, cancelled_on_stop=False, longest=0.5, listens=False)


class _Ask:
    """What ``act_async`` awaits: the listener's ``run(statement)``; the
    machine answers it when the server has run the statement."""

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def __await__(self) -> Generator[_Ask, Any, Any]:
        answer = yield self
        return answer


def _ask(sql: str) -> _Ask:
    return _Ask(sql)


class _Core(RunnerCore):
    """The real :class:`~sqlalchemy_watchdog.core.state.RunnerCore` of one
    simulated runner, on the model's clock -- so the stand-in cannot drift
    from what ``loop_pass`` reads. Only two things differ: no recovery or
    promotion is ever due (their statements are not modelled; no schedules,
    no summary, not registered among the workers), and a claim is a job
    number that takes one of the runner's slots until its handler finishes
    (``SimRunner.running``) instead of an execution."""

    def __init__(self, runner: SimRunner) -> None:
        options: RunnerOptions = {
            "concurrency": runner.slots,
            "lease": timedelta(seconds=60),
            "poll_interval": timedelta(seconds=POLL),
            "summary_every": None,
        }
        super().__init__(
            RunnerSettings.build({"q": lambda job: None}, options, default_poll_interval=timedelta(seconds=POLL)),
            Clock(monotonic=CLOCK.monotonic),
            store,
        )
        self.runner = runner
        # As the runners do: no Waiting where nothing listens.
        self.waiting = runner.waiting if runner.flavor.listens else None
        # Recovery, promotion and telling dependents (w0012) are not modelled here.
        self.recovery_due = self.promotion_due = self.propagation_due = math.inf

    def free_slots(self) -> int:
        return self.runner.slots - self.runner.running

    def admit(self, claim: Any, asked_at: float) -> Any:
        self.runner.running += 1
        return claim


class SimRunner:
    """One runner: its loop (``loop``), its listener (``phase``) and the
    real ``Waiting`` and ``_Wakeups`` they share."""

    def __init__(self, name: str, slots: int, flavor: Flavor) -> None:
        self.name = name
        self.slots = slots
        self.flavor = flavor
        self.running = 0  # handlers holding a slot
        self.waiting = Waiting(POLL, kick=self._kick)
        self.wakeups = _Wakeups(self._jobs_arrived, lambda: None, self.waiting)
        self.core = _Core(self)
        # the loop: ready | waiting | claiming | claimed | stopped
        self.loop = "ready"
        self.wake = False  # Runner._wake
        self.timer = 0.0  # when the loop's wait times out
        self.pass_: Generator[Any, Any, float] | None = None
        self.limit = 0
        self.batch: Any = None
        # the listener: down | top | act | drain | select | stepping_down | stopped
        self.phase = "down" if flavor.listens else "stopped"
        self.kicked = False  # a byte in the kick socket / kicked.set()
        self.session: Session | None = None
        self.act: Coroutine[Any, Any, None] | None = None
        self.request: Statement | None = None
        self.drain_next = "select"
        self.select_until = 0.0
        self.stop_requested = False
        #: The sessions WAIT_SQL found holding the lock when it last answered 'covered'.
        self.covered_by: set[int] = set()

    def _kick(self) -> None:
        self.kicked = True

    def _jobs_arrived(self) -> None:
        self.wake = True

    def free(self) -> int:
        return self.slots - self.running

    def describe(self) -> str:
        w = self.waiting
        return (
            f"{self.name}[{self.flavor.name}] loop={self.loop} wake={self.wake} slots={self.running}/{self.slots} "
            f"listener={self.phase} kicked={self.kicked} session={self.session.sid if self.session else None} "
            f"waiting={w.state}{' idle' if w._idle else ' busy'} covered_by={sorted(self.covered_by)}"
        )


@dataclass
class Producer:
    session: Session
    txn: Txn | None = None


# -- the machine --------------------------------------------------------------------------


class WaitingLockMachine(RuleBasedStateMachine):
    """Runners, producers and the server, one step at a time."""

    #: The listener flavors runners are drawn from (polling: none at all).
    FLAVORS: tuple[Flavor, ...] = (THREAD, PSYCOPG_ASYNC, ASYNCPG, POLLING)

    def __init__(self) -> None:
        super().__init__()
        CLOCK.now = 1_000.0
        self.db = Database()
        self.runners: list[SimRunner] = []
        self.producers = [Producer(self.db.connect(f"p{i}")) for i in range(PRODUCERS)]
        self.next_job = 1
        self.trace: list[str] = []
        self.load = 0.1

    # -- reporting

    def log(self, line: str) -> None:
        self.trace.append(f"t={CLOCK.now - 1_000.0:.3f} {line}")

    def fail(self, message: str, kind: type[Violation] = Violation) -> None:
        state = "\n  ".join(r.describe() for r in self.runners)
        holders = [s.sid for s in self.db.exclusive_holders()]
        raise kind(
            f"{message}\n  ready jobs: {self.db.ready}; W held exclusively by {holders}, shared by "
            f"{[s.sid for s in self.db.shared_holders()]}; crashed sessions: {sorted(self.db.crashed)}\n  {state}\n"
            "trace:\n  " + "\n  ".join(self.trace[-120:])
        )

    # -- the runners' and the server's own steps

    def actions(self) -> list[tuple[str, Callable[[], None]]]:
        """Every step some thread (a loop, a listener, the server running a
        statement) can take now, with no new outside event."""
        found: list[tuple[str, Callable[[], None]]] = []
        for r in self.runners:
            found += self._loop_actions(r) + self._listener_actions(r)
        for session in self.db.sessions:
            statement = session.running
            if session.alive and statement is not None and not statement.done:
                whose = (
                    f"{session.owner}'s session" if session.connected else f"{session.owner}'s orphan s{session.sid}"
                )
                found.append((f"server: a step of {statement.name} for {whose}", self._server_step(session)))
        return found

    def _loop_actions(self, r: SimRunner) -> list[tuple[str, Callable[[], None]]]:
        if r.loop == "ready" or (r.loop == "waiting" and (r.wake or CLOCK.now >= r.timer)):
            return [(f"{r.name} loop: starts a pass", lambda: self._start_pass(r))]
        if r.loop == "claiming":
            return [(f"{r.name}: its claim runs (limit {r.limit})", lambda: self._claim(r))]
        if r.loop == "claimed":
            return [(f"{r.name} loop: gets its claim", lambda: self._advance_pass(r, r.batch))]
        return []

    def _listener_actions(self, r: SimRunner) -> list[tuple[str, Callable[[], None]]]:
        if not r.flavor.listens:
            return []
        found: list[tuple[str, Callable[[], None]]] = []
        flavor = r.flavor
        session = r.session
        if r.loop == "stopped" and not r.stop_requested:
            found.append((f"{r.name}: shutdown stops its listener", lambda: self._stop_listener(r)))
        if r.phase == "down":
            if r.stop_requested:
                found.append((f"{r.name} listener: exits", lambda: self._exit(r)))
            else:
                found.append((f"{r.name} listener: connects and LISTENs", lambda: self._connect(r)))
        elif r.phase == "top":
            found.append((f"{r.name} listener: acts", lambda: self._top(r)))
        elif r.phase in ("act", "stepping_down") and r.request is not None and r.request.done:
            found.append((f"{r.name} listener: gets the answer to {r.request.name}", lambda: self._answer(r)))
        elif r.phase == "drain" and session is not None and not session.inbox:
            found.append((f"{r.name} listener: drained", lambda: self._drained(r)))
        elif r.phase == "select" and session is not None:
            readable = bool(session.inbox) and not flavor.dispatch_while_awaiting
            if r.kicked or readable or not session.alive or CLOCK.now >= r.select_until:
                found.append((f"{r.name} listener: wakes", lambda: self._wakes(r)))
        dispatching = r.phase == "drain" or (flavor.dispatch_while_awaiting and r.phase in ("act", "select"))
        if session is not None and session.inbox and dispatching:
            found.append((f"{r.name} listener: dispatches {session.inbox[0]!r}", lambda: self._dispatch(r)))
        if flavor.cancelled_on_stop and r.stop_requested and r.phase in ("act", "select"):
            found.append((f"{r.name} listener: cancelled", lambda: self._cancelled(r)))
        return found

    def _server_step(self, session: Session) -> Callable[[], None]:
        def step() -> None:
            statement = session.running
            assert statement is not None
            statement.step()
            if statement.done and statement.answer == Waiting.OPEN and statement.held_by_others:
                self.fail(
                    f"WAIT_SQL answered 'open' while s{statement.held_by_others} held W exclusively: "
                    "a covered runner would look again every RETRY_S instead of waiting for a notification"
                )
            if statement.done and not session.connected:
                session.running = None  # an orphan's answer goes nowhere

        return step

    def run(self, label: str, action: Callable[[], None]) -> None:
        self.log(label)
        action()

    # the loop (Runner._loop)

    def _start_pass(self, r: SimRunner) -> None:
        r.wake = False  # cleared before the pass looks at anything
        r.pass_ = loop_pass(r.core)
        self._advance_pass(r, None)

    def _advance_pass(self, r: SimRunner, value: Any) -> None:
        assert r.pass_ is not None
        try:
            step = r.pass_.send(value)
            while isinstance(step, Spawn):
                step = r.pass_.send(None)
        except StopIteration as end:
            r.pass_ = None
            wait = float(end.value)
            if wait > 0:
                r.loop, r.timer = "waiting", CLOCK.now + wait
            else:
                r.loop = "ready"
            return
        if not (isinstance(step, StoreCall) and step.fn is store.claim):
            raise NotModelled(f"loop_pass asked for a step the model does not know: {step}")
        r.loop, r.limit = "claiming", int(step.kwargs["limit"])

    def _claim(self, r: SimRunner) -> None:
        """The claim statement: it sees committed jobs only."""
        taken, self.db.ready = self.db.ready[: r.limit], self.db.ready[r.limit :]
        r.batch = SimpleNamespace(claimed=tuple(taken), cancelled=(), held_back=False)
        r.loop = "claimed"
        self.log(f"  {r.name} claimed {list(taken)}")

    # the listener (Listener._serve_psycopg; listen_async for the async flavors)

    def _connect(self, r: SimRunner) -> None:
        r.session = self.db.connect(r.name)
        r.session.channels.add(LISTENS_ON)
        r.wakeups.connected()
        r.phase = "top"

    def _top(self, r: SimRunner) -> None:
        if r.stop_requested and not r.flavor.cancelled_on_stop:
            self._step_down(r)  # `while not self._stop.is_set()` ends
            return
        if r.flavor.cancelled_on_stop:
            r.kicked = False  # kicked.clear() before acting
        r.act = r.wakeups.act_async(_ask)
        self._resume(r, None)

    def _resume(self, r: SimRunner, answer: Any) -> None:
        assert r.act is not None and r.session is not None
        try:
            asked = r.act.send(answer)
        except StopIteration:
            r.act = r.request = None
            if r.flavor.dispatch_while_awaiting:
                self._select(r)
            else:
                r.phase, r.drain_next = "drain", "select"
            return
        assert isinstance(asked, _Ask)
        r.request = self._send(r.session, asked.sql)
        r.phase = "act"

    def _send(self, session: Session, sql: str) -> Statement:
        if sql == WAIT_SQL:
            statement = self.db.run_wait(session)
        elif sql == STOP_WAITING_SQL:
            statement = Statement(sql, session, self.db.run_select(session, STOP_WAITING))
        else:
            raise NotModelled(f"the listener ran a statement the model does not know: {sql}")
        if not session.alive:
            statement.done = statement.failed = True  # the connection is dead: it fails at once
        session.running = statement
        return statement

    def _answer(self, r: SimRunner) -> None:
        statement, session = r.request, r.session
        assert statement is not None and session is not None
        session.running = None
        if r.phase == "stepping_down":
            r.request = None
            self._close(r)  # step_down ignores the outcome; the connection closes
            return
        if statement.failed:
            self._down(r, ConnectionError("the server closed the connection"))
            return
        if statement.sql == WAIT_SQL and statement.answer == Waiting.COVERED:
            r.covered_by = set(statement.seen)
        self.log(f"  {r.name}: {statement.name} answered {statement.answer!r}")
        self._resume(r, statement.answer)

    def _dispatch(self, r: SimRunner) -> None:
        assert r.session is not None
        r.wakeups.dispatch(r.session.inbox.pop(0))

    def _drained(self, r: SimRunner) -> None:
        if r.drain_next == "select":
            self._select(r)
        else:
            r.phase = "top"

    def _select(self, r: SimRunner) -> None:
        r.phase = "select"
        r.select_until = CLOCK.now + r.wakeups.timeout(r.flavor.longest)

    def _wakes(self, r: SimRunner) -> None:
        assert r.session is not None
        if not r.flavor.cancelled_on_stop:
            r.kicked = False  # the kick socket drained
        if not r.session.alive:
            self._down(r, None)  # EOF: the connection was closed
        elif r.flavor.dispatch_while_awaiting:
            r.phase = "top"
        else:
            r.phase, r.drain_next = "drain", "top"

    def _down(self, r: SimRunner, error: BaseException | None) -> None:
        """The listener lost its connection: whatever it awaited fails, and it reconnects."""
        if r.act is not None:
            try:
                r.act.throw(error or ConnectionError("connection lost"))
            except ConnectionError:
                pass
            r.act = None
        r.request = None
        if r.session is not None:
            r.session.connected = False
        r.phase = "down"

    def _step_down(self, r: SimRunner) -> None:
        asked: list[str] = []
        r.wakeups.step_down(asked.append)
        assert r.session is not None
        if asked:
            assert asked == [STOP_WAITING_SQL]
            running = r.session.running
            if running is not None and not running.done:
                # A stop cancelled it (async runners): the driver cancels the
                # statement and then runs the next one (psycopg and asyncpg
                # both do). The server aborts it: a session lock it took or
                # let go stays so, its notifications are dropped.
                running.steps.close()
                running.done = running.failed = True
                self.log(f"  {r.name}: the cancelled {running.name} is aborted")
            r.session.running = None
            r.request = self._send(r.session, STOP_WAITING_SQL)
            r.phase = "stepping_down"
        else:
            self._close(r)  # nothing to let go

    def _cancelled(self, r: SimRunner) -> None:
        """task.cancel() lands at the listener's await: ``ran`` never sees
        an answer still on its way, and step_down decides on what it knew."""
        if r.act is not None:
            try:
                r.act.throw(asyncio.CancelledError())
            except asyncio.CancelledError:
                pass
            r.act = None
        if r.request is not None and r.request.done:
            assert r.session is not None
            r.session.running = None
        r.request = None
        self._step_down(r)

    def _close(self, r: SimRunner) -> None:
        """The listener closes its connection: the server ends its session."""
        session = r.session
        assert session is not None
        r.phase = "stopped"
        if not (session.alive and session.connected):
            return
        holding = session in self.db.exclusive_holders()
        self.db.end_session(session, crashed=False)
        session.connected = False
        if holding:
            self.fail(
                f"{r.name} stopped and closed its session still holding the waiting lock: no handover, "
                "covered runners wait for their poll",
                NoHandover,
            )

    def _stop_listener(self, r: SimRunner) -> None:
        """Listener.stop(): set and kick (the async runners cancel its task)."""
        r.stop_requested = True
        r.kicked = True

    def _exit(self, r: SimRunner) -> None:
        r.phase = "stopped"

    # -- the rules

    def _start_runner(self, slots: int, flavor: Flavor) -> None:
        r = SimRunner(f"r{len(self.runners)}", slots, flavor)
        self.runners.append(r)
        self.log(f"{r.name} starts ({slots} slot(s), {flavor.name} listener)")

    def _live(self) -> list[SimRunner]:
        return [r for r in self.runners if r.loop != "stopped"]

    @initialize(
        data=st.data(),
        slots=st.lists(st.integers(1, 2), min_size=1, max_size=MAX_RUNNERS),
        load=st.sampled_from([0.1, 0.03, 0.3]),
    )
    def start(self, data: st.DataObject, slots: list[int], load: float) -> None:
        """Runners start: loop ready for its first pass, listener not yet
        connected. ``load``: how often a step is a producer's (a few jobs
        now and then -- the runners mostly wait -- or a backlog)."""
        self.load = load
        for n in slots:
            self._start_runner(n, data.draw(st.sampled_from(self.FLAVORS)))

    @precondition(lambda self: len(self._live()) < MAX_RUNNERS and len(self.runners) < MAX_STARTED)
    @rule(data=st.data(), slots=st.integers(1, 2))
    def another_runner_starts(self, data: st.DataObject, slots: int) -> None:
        """A runner joins later: its first pass and its listener's connect
        find whatever was committed before it (no notification needed)."""
        self._start_runner(slots, data.draw(st.sampled_from(self.FLAVORS)))

    def _step(self, actions: list[tuple[str, Callable[[], None]]], random: Random) -> None:
        self.run(*random.choice(actions))
        self.check()

    @rule(random=st.randoms(use_true_random=True), steps=st.integers(1, 40))
    def everyone_moves(self, random: Random, steps: int) -> None:
        """Up to ``steps`` steps, each of one actor picked at random among
        all that can move: loops, listeners, the server's statements; the
        producers (begin, INSERT, COMMIT, ROLLBACK: a step in ``load``) and
        the handlers (finish: as often). The checks run after every step."""
        for _ in range(steps):
            inside, producers, handlers = self.actions(), self.producer_actions(), self.handler_actions()
            weights = [1.0 if inside else 0.0, self.load if producers else 0.0, self.load if handlers else 0.0]
            if not any(weights):
                return
            if not inside:  # quiescent: something from outside happens
                weights[1:] = [1.0 if producers else 0.0, 1.0 if handlers else 0.0]
            (chosen,) = random.choices([inside, producers, handlers], weights)
            self._step(chosen, random)

    @rule(random=st.randoms(use_true_random=True))
    def runners_settle(self, random: Random) -> None:
        """The runners and the server run, in a random order, with no new
        outside event and no time passing, until nothing is pending: the
        system is quiescent (and the checks look at it)."""
        for _ in range(2_000):
            actions = self.actions()
            if not actions:
                return
            self._step(actions, random)
        self.fail("no quiescence after 2,000 steps without an outside event: a livelock")

    @rule(dt=st.sampled_from([RETRY_S, POLL, 0.3, 0.001, 0.02, 0.5, POLL / 2]))
    def clock_advances(self, dt: float) -> None:
        """Time passes: loop polls, OPEN and COVERED retries and the
        listeners' select timeouts fall due."""
        CLOCK.now += dt
        self.log(f"clock +{dt}")

    # producers and handlers: outside events that the scheduler interleaves

    def outside_actions(self) -> list[tuple[str, Callable[[], None]]]:
        """What the producers and handlers can do now."""
        return self.producer_actions() + self.handler_actions()

    def producer_actions(self) -> list[tuple[str, Callable[[], None]]]:
        found: list[tuple[str, Callable[[], None]]] = []
        for p in self.producers:
            name = p.session.owner
            if p.txn is None:
                found.append((f"{name}: BEGIN", functools.partial(self._begin, p)))
                found.append((f"{name}: enqueues in a transaction of its own", functools.partial(self._enqueue, p)))
            else:
                found.append((f"{name}: INSERT", functools.partial(self._insert, p)))
                found.append((f"{name}: COMMIT", functools.partial(self._end, p, commit=True)))
                if p.txn.jobs:
                    found.append((f"{name}: ROLLBACK", functools.partial(self._end, p, commit=False)))
        return found

    def handler_actions(self) -> list[tuple[str, Callable[[], None]]]:
        found: list[tuple[str, Callable[[], None]]] = []
        for r in self.runners:
            if r.running:
                found.append((f"{r.name}: a handler finishes", functools.partial(self._handler_finishes, r)))
        return found

    def _begin(self, p: Producer) -> None:
        """A producer opens a transaction (it will enqueue in it)."""
        p.txn = Txn(p.session)

    def _insert(self, p: Producer) -> None:
        """An INSERT fires the statement trigger: it notifies iff a session
        holds W exclusively (checked here), else its transaction holds W
        shared until it ends."""
        assert p.txn is not None
        job, self.next_job = self.next_job, self.next_job + 1
        p.txn.jobs.append(job)
        waiting_before = bool(self.db.exclusive_holders())
        notified = self.db.fire_trigger(p.txn)
        self.log(f"  job {job}: the trigger {'notifies' if notified else 'does not notify'}")
        if notified != waiting_before:
            self.fail(
                f"the trigger {'notified' if notified else 'did not notify'} while W was "
                f"{'held' if waiting_before else 'not held'} exclusively"
            )

    def _end(self, p: Producer, commit: bool) -> None:
        """COMMIT: its jobs become visible to claims, its shared hold ends and
        its notification reaches every listening session. ROLLBACK: only
        the hold ends."""
        assert p.txn is not None
        self.log(f"  {p.txn.jobs} {'committed' if commit else 'rolled back'}")
        self.db.end(p.txn, commit)
        p.txn = None

    def _enqueue(self, p: Producer) -> None:
        """An enqueue in a transaction of its own: BEGIN, INSERT, COMMIT at once."""
        self._begin(p)
        self._insert(p)
        self._end(p, commit=True)

    def _handler_finishes(self, r: SimRunner) -> None:
        """A handler returns: its slot is free and the loop is woken."""
        r.running -= 1
        r.wake = True

    # the runners' lives and the faults

    @precondition(lambda self: len(self._live()) > 1 and any(r.loop in ("ready", "waiting") for r in self.runners))
    @rule(data=st.data())
    def runner_stops(self, data: st.DataObject) -> None:
        """Runner.stop(): the loop ends after its pass (handlers may still
        run); then shutdown stops the listener (an action of its own, see
        ``_stop_listener``), which steps down and hands over."""
        r = data.draw(st.sampled_from([r for r in self.runners if r.loop in ("ready", "waiting")]))
        r.loop = "stopped"
        self.log(f"{r.name}: its loop stops")

    def _listening(self) -> list[SimRunner]:
        return [
            r
            for r in self.runners
            if r.session is not None and r.session.alive and r.session.connected and r.phase not in ("down", "stopped")
        ]

    @precondition(lambda self: bool(self._listening()) or any(s.alive and not s.connected for s in self.db.sessions))
    @rule(
        data=st.data(),
        fault=st.sampled_from(["the server ends a session", "a connection breaks", "the server reaps an orphan"]),
    )
    def a_fault(self, data: st.DataObject, fault: str) -> None:
        """The server ends a listener's session (pg_terminate_backend, a
        restart): its locks go at once, with no handover, and the listener
        finds out at its next read. Or a listener's connection breaks: it
        reconnects, while its old session lingers at the server -- holding
        what it held, running what it ran -- until the server reaps it."""
        orphans = [s for s in self.db.sessions if s.alive and not s.connected]
        if fault == "the server reaps an orphan" or not self._listening():
            if not orphans:
                return
            session = data.draw(st.sampled_from(orphans))
            self.log(f"server reaps s{session.sid}")
            self.db.end_session(session, crashed=True)
            return
        r = data.draw(st.sampled_from(self._listening()))
        assert r.session is not None
        if fault == "the server ends a session":
            self.log(f"server ends {r.name}'s session s{r.session.sid}")
            self.db.end_session(r.session, crashed=True)
            return
        self.log(f"{r.name}'s connection to s{r.session.sid} breaks")
        self.db.crashed.add(r.session.sid)
        if r.phase == "stepping_down":
            r.session.connected = False
            r.request, r.phase = None, "stopped"  # step_down suppresses the error
        else:
            self._down(r, ConnectionError("connection broken"))

    # -- the invariants

    def quiescent(self) -> bool:
        """Nothing pending that does not need a new outside event or the
        clock: no pass, statement, kick, notification or due timer."""
        if self.actions():
            return False
        for r in self.runners:
            if r.loop not in ("waiting", "stopped") or r.phase not in ("select", "stopped"):
                return False
            if r.phase == "select" and r.session is not None and r.session.inbox:
                return False
        return True

    def check(self) -> None:
        """Every check, after each step of a rule that takes many."""
        self.a_runner_that_believes_it_is_the_sentinel_holds_the_lock()
        self.w_is_held_shared_only_by_open_enqueueing_transactions()
        self.at_quiescence_the_holder_is_an_idle_runner_that_knows_it()
        self.no_lost_wake_up()
        self.a_polling_runner_holds_no_session_state()

    @invariant()
    def w_is_held_shared_only_by_open_enqueueing_transactions(self) -> None:
        """The trigger's shared hold lasts until its transaction ends, not
        longer (else no runner could ever wait again)."""
        open_txns = [p.txn for p in self.producers if p.txn is not None]
        for hold in self.db.holds.get(WAITING_LOCK, []):
            if hold.mode == SHARED and not any(hold.txn is txn for txn in open_txns):
                self.fail(f"s{hold.session.sid} holds W shared outside an open enqueueing transaction")

    @invariant()
    def a_runner_that_believes_it_is_the_sentinel_holds_the_lock(self) -> None:
        """At most one sentinel: the lock has at most one exclusive holder,
        and every runner whose Waiting says SENTINEL (outside its own
        STOP_WAITING_SQL) is that holder."""
        holders = self.db.exclusive_holders()
        if len(holders) > 1:
            self.fail(f"W is held exclusively by {len(holders)} sessions")
        for r in self._listening():
            stepping_down = r.request is not None and r.request.sql == STOP_WAITING_SQL
            if r.waiting.state == Waiting.SENTINEL and not stepping_down and holders != [r.session]:
                self.fail(f"{r.name} believes it is the sentinel but W is held by {[s.sid for s in holders]}")

    @invariant()
    def at_quiescence_the_holder_is_an_idle_runner_that_knows_it(self) -> None:
        """A busy runner lets the lock go (its listener runs
        STOP_WAITING_SQL), and no runner holds it without knowing: once
        quiescent, the holder of W (if its client still has it) is idle and
        in state SENTINEL."""
        if not self.quiescent():
            return
        for r in self._listening():
            if r.session in self.db.exclusive_holders() and not (
                r.waiting._idle and r.waiting.state == Waiting.SENTINEL
            ):
                self.fail(f"{r.name} holds W but is {r.waiting.state} and {'idle' if r.waiting._idle else 'busy'}")

    @invariant()
    def no_lost_wake_up(self) -> None:
        """The guarantee: once quiescent, a committed unclaimed job and a
        running runner with a free slot mean that runner is OPEN and looks
        again within RETRY_S, or is COVERED by a crashed session (no
        handover) and looks again within its poll interval."""
        if not self.quiescent():
            return
        if not self.db.ready:
            return
        for r in self.runners:
            if r.loop == "stopped" or r.free() <= 0:
                continue
            if not r.flavor.listens:
                # Nothing can wake it: it must look again within its poll.
                if r.loop == "waiting" and r.timer - CLOCK.now <= POLL:
                    continue
                self.fail(f"{r.name} polls, has a free slot, and will not look within {POLL}s", LostWakeUp)
            state = r.waiting.state
            due_in = r.waiting.timeout(CLOCK.now, math.inf)
            if state == Waiting.OPEN and due_in <= RETRY_S:
                continue
            if state == Waiting.COVERED and r.covered_by & self.db.crashed and due_in <= POLL:
                continue
            self.fail(
                f"lost wake-up: jobs {self.db.ready} are committed and unclaimed, {r.name} has a free slot, "
                f"and nothing but its poll will look for them (state {state}, acts in {due_in}s)",
                LostWakeUp,
            )

    @invariant()
    def a_polling_runner_holds_no_session_state(self) -> None:
        """A runner without a listener has no session of its own: it never
        LISTENs and never holds W, so a pooler's server session is never
        left holding its lock; its Waiting is never asked."""
        for r in self.runners:
            if not r.flavor.listens and (r.session is not None or r.waiting.state != Waiting.OFF):
                self.fail(f"{r.name} polls but has session {r.session} and waiting state {r.waiting.state}")


# -- running it ---------------------------------------------------------------------------


MODEL = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_no_wake_up_is_lost() -> None:
    """Runners with the thread listener (psycopg 3 and psycopg2), the async
    psycopg one and asyncpg's, and polling runners (no listener: behind a
    pooler, or ``wakeups="poll"``), side by side: no lost wake-up, whatever
    the interleaving; a polling runner holds no session state and looks
    within its poll."""
    run_state_machine_as_test(WaitingLockMachine, settings=MODEL)


def test_the_model_reads_the_modules_sql() -> None:
    """The SQL the machine interprets is the module's: the trigger tries W
    shared for its transaction and notifies 'queued' when it cannot;
    WAIT_SQL tries W exclusively for its session, then looks for an
    exclusive holder; STOP_WAITING_SQL unlocks and notifies 'handover'."""
    keys = WAITING_LOCK
    modelled = Trigger(True, Call("pg_try_advisory_xact_lock_shared", keys), Call("pg_notify", (LISTENS_ON, "queued")))
    assert modelled == TRIGGER
    assert [answer for _, answer in WAIT.branches] + [WAIT.otherwise] == [
        Waiting.SENTINEL,
        Waiting.COVERED,
        Waiting.OPEN,
    ]
    assert WAIT.branches[0][0] == Call("pg_try_advisory_lock", keys)
    assert dict(WAIT.branches[1][0].terms) == dict(  # type: ignore[union-attr]
        locktype="advisory", objsubid=2, classid=keys[0], objid=keys[1], mode=EXCLUSIVE, granted=True, database=DB_OID
    )
    handover = (Call("pg_advisory_unlock_all", ()), Call("pg_notify", (LISTENS_ON, "handover")))
    assert handover == STOP_WAITING


# -- what the machine found, pinned ---------------------------------------------------------


def _replay(machine: WaitingLockMachine, *labels: str) -> None:
    """Run the named steps in this order (each must be possible then), with the checks after each."""
    for label in labels:
        actions = dict(machine.actions() + machine.outside_actions())
        assert label in actions, f"{label!r} is not possible now; possible: {sorted(actions)}"
        machine.run(label, actions[label])
        machine.check()


def _settle(machine: WaitingLockMachine) -> None:
    machine.runners_settle(Random(0))


def _two_runners(flavor: Flavor) -> WaitingLockMachine:
    """r0 the sentinel, r1 started but not yet connected; one slot each."""
    machine = WaitingLockMachine()
    machine._start_runner(1, flavor)
    _settle(machine)
    assert machine.runners[0].waiting.state == Waiting.SENTINEL
    machine._start_runner(1, flavor)
    _replay(machine, "r1 loop: starts a pass", "r1: its claim runs (limit 1)", "r1 loop: gets its claim")
    return machine


def test_asyncpg_a_handover_that_overtakes_the_covered_answer_is_not_lost() -> None:
    """asyncpg runs listener callbacks (loop.call_soon) as soon as it parses a
    NotificationResponse -- which the server sends before the statement's
    ReadyForQuery when it arrived during the statement's transaction. So a
    covered runner's 'handover' can be dispatched between WAIT_SQL's look at
    pg_locks and ``Waiting.ran``. Found by this machine: handed_over() saw
    OFF and did nothing, then ran() recorded COVERED under a sentinel that
    was gone, and the next enqueue (W free: no NOTIFY) waited for the poll.
    Now a handover seen while WAIT_SQL is out makes a 'covered' answer try
    again at once."""
    machine = _two_runners(ASYNCPG)
    _replay(
        machine,
        "r1 listener: connects and LISTENs",
        "r1 listener: acts",  # WAIT_SQL: r1 is idle
        "server: a step of WAIT_SQL for r1's session",  # pg_try_advisory_lock: r0 holds it
        "server: a step of WAIT_SQL for r1's session",  # pg_locks: r0 holds it -> 'covered'
        "server: a step of WAIT_SQL for r1's session",  # commit; the answer is on its way
    )
    _replay(
        machine,
        "p0: enqueues in a transaction of its own",  # job 1: notifies (r0 holds W)
        "r0 listener: dispatches 'queued'",
        "r0 loop: starts a pass",
        "r0: its claim runs (limit 1)",
        "r0 loop: gets its claim",  # its one slot is full: busy()
        "r0 listener: wakes",
        "r0 listener: acts",  # STOP_WAITING_SQL
        "server: a step of STOP_WAITING_SQL for r0's session",  # pg_advisory_unlock_all
        "server: a step of STOP_WAITING_SQL for r0's session",  # commit: 'handover' goes out
        "r1 listener: dispatches 'queued'",
        "r1 listener: dispatches 'handover'",  # before the answer: state is OFF, ignored
        "r1 listener: gets the answer to WAIT_SQL",  # COVERED, by nobody
    )
    _settle(machine)
    _replay(machine, "p0: enqueues in a transaction of its own")  # job 2
    _settle(machine)  # r1 took over (it tried again), so job 2 is claimed without a poll
    assert machine.runners[1].waiting.state != Waiting.COVERED


def test_async_a_stop_that_cancels_a_wait_sql_in_flight_still_hands_over() -> None:
    """The async runners cancel the listening task on stop. Landing while
    WAIT_SQL's answer 'sentinel' is on its way, ``ran`` never records it.
    Found by this machine: step_down_async saw OFF, ran no STOP_WAITING_SQL,
    and the session was closed holding W -- a crash as far as covered runners
    know. Now a listener whose WAIT_SQL is unanswered steps down too (both
    async drivers run a statement after a cancelled one)."""
    machine = WaitingLockMachine()
    machine._start_runner(1, PSYCOPG_ASYNC)
    _replay(
        machine,
        "r0 listener: connects and LISTENs",
        "r0 loop: starts a pass",
        "r0: its claim runs (limit 1)",
        "r0 loop: gets its claim",  # nothing: idle()
        "r0 listener: acts",  # WAIT_SQL
        "server: a step of WAIT_SQL for r0's session",  # pg_try_advisory_lock: taken
        "server: a step of WAIT_SQL for r0's session",  # commit; 'sentinel' on its way
    )
    machine.runners[0].loop = "stopped"  # Runner.stop(): the loop ends
    _replay(machine, "r0: shutdown stops its listener", "r0 listener: cancelled")  # steps down before it closes
