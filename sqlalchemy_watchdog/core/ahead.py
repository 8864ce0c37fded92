"""Claiming ahead of short handlers: how many, and where those jobs wait.

Part of the runner core (see :mod:`sqlalchemy_watchdog.core`).

A runner claims and settles in batches over the slots that free up, and
each claim or settle statement costs the database about the same whatever
its rows. With handlers that return in a moment, a runner at
``concurrency`` 10 makes a claim for every ten jobs. Claiming a few more
than the free slots -- jobs that wait in the runner, under a renewed lease,
for the next slot -- makes the batches larger without running more
handlers at once (no more threads, no more connections of the pool).

The cost is that a job claimed ahead is not available to another runner
while it waits. So a runner claims ahead only as many jobs as its handlers
are expected to start within :data:`AHEAD_HORIZON_S` (from the recent
handlers' run time, :class:`RunTimes`), never more than its ``claim_ahead``
cap, and gives back (queued again, nothing counted) any job that waited
longer than :data:`AHEAD_WAIT_MAX_S` -- all its slots were taken by handlers
that run long after all. A give-back counts as a long run time, so the
runner stops claiming ahead until its handlers are short again.

A job claimed ahead is marked ``unstarted`` by its claim (revision w0019),
and its handler is called only once the runner recorded its start
(``store.start``: the mark cleared, in one statement for every job the
slots take at that moment, sent by the settler beside its batch). Recovery
requeues a job still marked -- its runner died before it started --
without counting a recovery, so a crash never settles ``interrupted`` a job
that never ran. That record costs each job claimed ahead one round trip
between the moment a slot takes it and its handler's call: for handlers
shorter than a few round trips, claiming nothing ahead is faster. So a
runner claims ahead only while its handlers' average run time is at least
:data:`AHEAD_MIN_ROUND_TRIPS` times the recent round trip of its claims and
starts (:meth:`RunTimes.ahead`); below that, each claim takes only the free
slots and nothing waits for a start record.

The process executor's ``prefetch`` is its own, fixed number: its children
wait for it, not the runner's threads. Its jobs beyond the idle children are
marked the same way, and the start of each is recorded when a free child is
about to take it (``Execution.child_may_take``), never while it waits -- so
they are never sent behind a busy child's running job either.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .execution import Execution

log = logging.getLogger("sqlalchemy_watchdog.runner")

#: How long, on average, a job claimed ahead may expect to wait for a slot:
#: a runner claims ahead at most ``concurrency * AHEAD_HORIZON_S / run time``
#: jobs, where run time is the recent handlers' average.
AHEAD_HORIZON_S = 0.010

#: How long a job claimed ahead waits for a slot before it is given back.
AHEAD_WAIT_MAX_S = 1.0

#: The weight of the newest run time in the running average.
RUN_TIME_WEIGHT = 0.2

#: A runner claims ahead only while its handlers run at least this many
#: round trips (of its claims and start records) on average: a job claimed
#: ahead waits one round trip for its start record once a slot takes it, so
#: with handlers of four round trips at least, that wait is at most a fifth
#: of a slot's time -- about what a slot that claims nothing ahead waits for
#: its next claim -- while the claims claiming ahead saves are still made.
#: Below it (handlers shorter than the database's answer) each claim takes
#: only the free slots, and the runner is as fast as with ``claim_ahead=0``.
AHEAD_MIN_ROUND_TRIPS = 4.0


class RunTimes:
    """The recent handlers' run time, an exponentially weighted average,
    and from it how many jobs to claim ahead (:meth:`ahead`).

    Unknown until the first handler returns: the first claim takes only the
    free slots. Thread-safe enough for its use: a float updated and read
    whole under the GIL (a lost update only weighs one run time less)."""

    __slots__ = ("average", "round_trip")

    def __init__(self) -> None:
        self.average: float | None = None
        #: The recent round trip of a claim or a start record (seconds), an
        #: exponentially weighted average; None until the first claim answered.
        self.round_trip: float | None = None

    def note_round_trip(self, seconds: float) -> None:
        """A claim or a start record took ``seconds`` from asking to answer."""
        seconds = max(0.0, seconds)
        average = self.round_trip
        self.round_trip = seconds if average is None else average + RUN_TIME_WEIGHT * (seconds - average)

    def note(self, seconds: float) -> None:
        """One handler ran for ``seconds``."""
        average = self.average
        seconds = max(0.0, seconds)
        self.average = seconds if average is None else average + RUN_TIME_WEIGHT * (seconds - average)

    def gave_back(self) -> None:
        """A job claimed ahead waited too long for a slot: count it as a run
        of :data:`AHEAD_WAIT_MAX_S`, which stops claiming ahead until enough
        short runs bring the average down again."""
        self.note(max(AHEAD_WAIT_MAX_S, self.average or 0.0))

    def ahead(self, concurrency: int, cap: int) -> int:
        """How many jobs to claim beyond ``concurrency``: as many as its
        handlers start within :data:`AHEAD_HORIZON_S` at the recent run
        time, at most ``cap``; none while the run time is unknown, or
        shorter than :data:`AHEAD_MIN_ROUND_TRIPS` round trips (each job
        claimed ahead waits one for its start record)."""
        average = self.average
        if cap <= 0 or average is None:
            return 0
        round_trip = self.round_trip
        if round_trip is not None and average < AHEAD_MIN_ROUND_TRIPS * round_trip:
            return 0
        budget = concurrency * AHEAD_HORIZON_S
        if average * cap <= budget:  # also a zero or denormal average, whose quotient overflows int()
            return cap
        return int(budget / average)

    def prefetch(self, cap: int, round_trip: float | None) -> int:
        """How many jobs a process executor claims ahead of its busy
        children: its ``prefetch`` (``cap``) while its handlers -- these run
        times -- run at least :data:`AHEAD_MIN_ROUND_TRIPS` round trips
        (``round_trip``, the runner's claims and start records), or while
        their run time is unknown (the first claims); none while they are
        shorter. Each job claimed ahead waits one round trip for its start
        record once a child frees up -- as long as a child that claims
        nothing ahead waits for its next claim -- so below that the claims
        ahead cost more (a statement per job) than they save."""
        average = self.average
        if cap <= 0:
            return 0
        if average is not None and round_trip is not None and average < AHEAD_MIN_ROUND_TRIPS * round_trip:
            return 0
        return cap


class Parking:
    """Where jobs claimed ahead wait for a slot: the driver's handler threads
    (or tasks) take them in claim order as they finish their own job.

    :meth:`offer` says whether an execution may run now (fewer than
    ``slots`` executions are running) or was parked; :meth:`next` is asked
    by a runner of executions that finished one: the next parked execution
    to run in its place, or None (its slot is free). :meth:`stale` takes
    out the executions parked longer than ``wait_s``, to give back.
    Thread-safe."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._running = 0
        self._parked: collections.deque[tuple[float, Execution]] = collections.deque()
        self._lock = threading.Lock()

    def offer(self, execution: Execution, now: float) -> bool:
        """True: run ``execution`` now (it takes a slot); False: it is parked."""
        with self._lock:
            if self._running < self.slots:
                self._running += 1
                return True
            self._parked.append((now, execution))
            return False

    def next(self) -> Execution | None:
        """A runner of executions finished one: the parked execution it runs
        next, or None -- its slot is free then."""
        with self._lock:
            if self._parked:
                return self._parked.popleft()[1]
            self._running -= 1
            return None

    def stale(self, now: float, wait_s: float) -> list[Execution]:
        """Take out the executions parked at or before ``now - wait_s``,
        marked to be given back."""
        taken: list[Execution] = []
        with self._lock:
            parked = self._parked
            while parked and parked[0][0] <= now - wait_s:
                taken.append(parked.popleft()[1])
        return _given_back(taken)

    def take_all(self) -> list[Execution]:
        """Take out every parked execution, marked to be given back (the
        runner is stopping)."""
        with self._lock:
            taken = [execution for _, execution in self._parked]
            self._parked.clear()
        return _given_back(taken)

    def due(self, wait_s: float) -> float | None:
        """When the oldest parked execution becomes stale (the clock of
        :meth:`offer`'s ``now``), or None if none is parked."""
        with self._lock:
            return self._parked[0][0] + wait_s if self._parked else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._parked)


def _given_back(executions: list[Execution]) -> list[Execution]:
    for execution in executions:
        execution.given_back = True
    return executions


def take_stale(parking: Parking, run_times: RunTimes, now: float) -> list[Execution]:
    """The rule both drivers follow each :data:`AHEAD_WAIT_MAX_S`: take out
    the jobs that waited that long for a slot, to give back, and stop
    claiming ahead until the handlers are short again."""
    stale = parking.stale(now, AHEAD_WAIT_MAX_S)
    if stale:
        log.info("%d job(s) claimed ahead waited %gs for a slot: given back", len(stale), AHEAD_WAIT_MAX_S)
        run_times.gave_back()
    return stale
