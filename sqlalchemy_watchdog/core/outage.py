"""Outage episodes: how a runner logs a database that stopped answering.

A transient failure (the database unreachable or contended: see
:func:`store.transient_failure <sqlalchemy_watchdog.store.transient_failure>`)
of one of the runner's periodic operations -- a settle, the heartbeat,
recovery, promotion, scheduling, a claim -- is no reason to page anyone as
long as it heals within the leases: the runner keeps its settles and
renewals and tries again. So the failures are logged per *episode*, not per
operation: one WARNING when the first operation fails, one INFO when an
operation succeeds again, and an ERROR only when the episode outlives the
lease (by then a claim this runner holds may truly be lost). A decision
that is lost (a settle given up because its lease surely ended) is logged
ERROR where it is given up (:func:`~.rules.settle.settle_batch`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..errors import WatchdogError

log = logging.getLogger("sqlalchemy_watchdog.runner")


class Outage:
    """The runner's view of whether the database answers, shared by its loop,
    heartbeat, settler and pruner (thread-safe; a lock only while an episode
    is on)."""

    def __init__(self, monotonic: Callable[[], float], lease_s: float) -> None:
        self._monotonic = monotonic
        self._lease_s = lease_s
        self._lock = threading.Lock()
        #: When the current episode began (monotonic); None: no episode.
        self._since: float | None = None
        #: What failed during the episode, in the order first seen.
        self._failed: list[str] = []
        #: Whether the episode's ERROR (it outlived the lease) was logged.
        self._outlived = False

    @property
    def ongoing(self) -> bool:
        """Whether an episode is on (some operation failed transiently and
        none has succeeded since)."""
        return self._since is not None

    def failed(
        self, what: str, error: WatchdogError | BaseException, waiting: str = "retrying while the leases last"
    ) -> None:
        """``what`` failed transiently (its retries spent); ``waiting`` says
        what the runner does meanwhile (e.g. ``"4 settle(s) waiting,
        retrying while their leases last"``).

        The first failure of an episode logs its one WARNING; a failure once
        the episode is older than the lease logs its one ERROR; every other
        is logged at DEBUG."""
        now = self._monotonic()
        with self._lock:
            first = self._since is None
            if first:
                self._since = now
                self._failed = []
                self._outlived = False
            assert self._since is not None
            if what not in self._failed:
                self._failed.append(what)
            age = now - self._since
            outlived = not self._outlived and age > self._lease_s
            if outlived:
                self._outlived = True
        keeps = f": {waiting}" if waiting else ""
        if first:
            log.warning("database unreachable (%s failed: %s)%s", what, error, keeps)
        elif outlived:
            log.error(
                "database unreachable for %.1fs, longer than the lease (%gs): claims of this runner may be lost"
                " (%s failed: %s)%s",
                age,
                self._lease_s,
                what,
                error,
                keeps,
            )
        else:
            log.debug("database still unreachable (%s failed: %s)%s", what, error, keeps)

    def succeeded(self, what: str = "") -> None:
        """An operation went through: the episode, if any, is over (one INFO)."""
        if self._since is None:  # the common case: no lock
            return
        now = self._monotonic()
        with self._lock:
            since, failed = self._since, self._failed
            if since is None:
                return
            self._since, self._failed, self._outlived = None, [], False
        log.info(
            "database reachable again after %.1fs%s (%s had failed meanwhile)",
            now - since,
            f" ({what} went through)" if what else "",
            ", ".join(failed),
        )
