"""Enqueue intent beyond a job's identity: uniqueness windows, debounce, throttle.

A ``job_id`` makes a job unique forever. These options of :class:`~.types.Job`
make an enqueue depend on the other jobs enqueued with the same
``unique_key`` for a while (docs/howto/uniqueness.md):

- ``unique_for=period``: a second enqueue with the key within ``period`` of
  the first (by the database clock) is a ``duplicate`` of it, while the
  first is in one of ``unique_states`` (``any`` by default: settled too).
- ``debounce=window``: enqueueing again while a job with the key still waits
  replaces its payload and moves its start to now + ``window`` (never past
  ``max_wait`` after the first enqueue).
- ``throttle=period``: at most one job per key per ``period``; an extra
  enqueue is dropped (a ``duplicate``) or, with ``throttle_excess="delay"``,
  delayed to the next period (one job waits there; more are duplicates).

The options are intent, not identity: a replay of a stored ``job_id`` is
judged by its contents as always, whatever its uniqueness options say.
Each option is checked here, so bad input is refused before any SQL runs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from ..errors import InvalidJob
from .validation import check_duration, check_text

__all__ = [
    "UNIQUE_KEY_MAX_LENGTH",
    "UNIQUE_WINDOW_MAX",
    "ThrottleExcess",
    "UniqueIntent",
    "UniqueKeyHold",
    "UniqueKind",
    "UniqueStates",
    "check_unique",
]

E = TypeVar("E", bound=enum.Enum)

#: The longest ``unique_key`` accepted, in characters (a CHECK of ``watchdog_unique_keys`` holds it too).
UNIQUE_KEY_MAX_LENGTH = 256
#: The longest ``unique_for``, ``debounce``, ``max_wait`` or ``throttle`` accepted (a year).
UNIQUE_WINDOW_MAX = timedelta(days=366)


class UniqueKind(str, enum.Enum):
    """Which option holds a key (``watchdog_unique_keys.kind``)."""

    UNIQUE_FOR = "unique_for"
    DEBOUNCE = "debounce"
    THROTTLE = "throttle"


class UniqueStates(str, enum.Enum):
    """While the first job is in which states ``unique_for`` makes a later
    enqueue with its key a duplicate (within the period, always)."""

    #: Delayed, queued or waiting for parents: once a runner claims it, the
    #: key is free again.
    WAITING = "waiting"
    #: Also while it runs: free once it settles.
    UNSETTLED = "unsettled"
    #: Whatever its state, settled included: the whole period (the default).
    ANY = "any"


class ThrottleExcess(str, enum.Enum):
    """What ``throttle`` does with an enqueue beyond one per period."""

    #: It is a ``duplicate`` of the period's job; nothing is written.
    DROP = "drop"
    #: It waits for the next period (``delayed`` until then); while one
    #: waits there, further enqueues are duplicates of it.
    DELAY = "delay"


@dataclass(frozen=True, slots=True)
class UniqueIntent:
    """A job's uniqueness options, checked, as the store applies them."""

    kind: UniqueKind
    key: str
    #: The period (``unique_for``, ``throttle``) or the window (``debounce``), in ms.
    window_ms: int
    states: UniqueStates = UniqueStates.ANY
    #: ``debounce``'s ``max_wait`` in ms (None: no bound).
    max_wait_ms: int | None = None
    excess: ThrottleExcess = ThrottleExcess.DROP


def _ms(value: timedelta) -> int:
    return value // timedelta(milliseconds=1)


def _window(field_name: str, value: object) -> timedelta:
    checked = check_duration(field_name, value)
    if checked > UNIQUE_WINDOW_MAX:
        raise InvalidJob(field_name, f"must be at most {UNIQUE_WINDOW_MAX}, got {checked}")
    return checked


def check_unique(
    *,
    unique_key: object,
    unique_for: object,
    unique_states: object,
    debounce: object,
    max_wait: object,
    throttle: object,
    throttle_excess: object,
    has_run_at: bool,
    has_parents: bool,
) -> tuple[UniqueIntent | None, UniqueStates | None, ThrottleExcess | None]:
    """The job's :class:`UniqueIntent` (None: it has none) and its
    ``unique_states`` and ``throttle_excess`` as enums, or
    :class:`~sqlalchemy_watchdog.InvalidJob` naming the first field that is
    wrong."""
    chosen = [
        name
        for name, value in (("unique_for", unique_for), ("debounce", debounce), ("throttle", throttle))
        if value is not None
    ]
    if len(chosen) > 1:
        raise InvalidJob(chosen[1], f"cannot be combined with {chosen[0]}: a key is held one way")
    states = _enum("unique_states", UniqueStates, unique_states)
    excess = _enum("throttle_excess", ThrottleExcess, throttle_excess)
    if states is not None and unique_for is None:
        raise InvalidJob("unique_states", "applies to unique_for only")
    if max_wait is not None and debounce is None:
        raise InvalidJob("max_wait", "applies to debounce only")
    if excess is not None and throttle is None:
        raise InvalidJob("throttle_excess", "applies to throttle only")
    if not chosen:
        if unique_key is not None:
            raise InvalidJob("unique_key", "needs unique_for, debounce or throttle to say how long it holds")
        return None, None, None
    if unique_key is None:
        raise InvalidJob(chosen[0], "needs a unique_key")
    key = check_text("unique_key", unique_key, UNIQUE_KEY_MAX_LENGTH)
    if unique_for is not None:
        period = _window("unique_for", unique_for)
        intent = UniqueIntent(UniqueKind.UNIQUE_FOR, key, _ms(period), states or UniqueStates.ANY)
        return intent, states, excess
    if has_run_at:
        raise InvalidJob("run_at", f"cannot be combined with {chosen[0]}, which decides when the job starts")
    if has_parents:
        raise InvalidJob("after", f"cannot be combined with {chosen[0]}: its parents decide when the job starts")
    if debounce is not None:
        window = _window("debounce", debounce)
        bound: int | None = None
        if max_wait is not None:
            longest = _window("max_wait", max_wait)
            if longest < window:
                raise InvalidJob("max_wait", f"must be at least debounce ({window}), got {longest}")
            bound = _ms(longest)
        return UniqueIntent(UniqueKind.DEBOUNCE, key, _ms(window), UniqueStates.WAITING, bound), states, excess
    assert throttle is not None
    period = _window("throttle", throttle)
    intent = UniqueIntent(UniqueKind.THROTTLE, key, _ms(period), UniqueStates.ANY, None, excess or ThrottleExcess.DROP)
    return intent, states, excess


def _enum(field_name: str, kind: type[E], value: object) -> E | None:
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        allowed = [member.value for member in kind]
        raise InvalidJob(field_name, f"must be one of {allowed}, got {value!r}") from None


@dataclass(frozen=True, slots=True)
class UniqueKeyHold:
    """A ``unique_key`` a job holds, as ``show`` and the dashboard explain
    it (:attr:`~sqlalchemy_watchdog.JobExplanation.unique_keys`)."""

    unique_key: str
    kind: UniqueKind
    #: While the job is in which states the key holds (``unique_for``).
    states: UniqueStates
    #: The holder's window, by the database clock; a debounce's ``until``
    #: is the job's planned start.
    since: datetime
    until: datetime
    #: Later enqueues with the key that were duplicates of this job.
    duplicates: int
    #: Later enqueues that replaced its payload (``debounce``).
    replacements: int

    @property
    def text(self) -> str:
        """One line for ``show``: the key, how it holds and what it absorbed."""
        span = f"{self.since:%Y-%m-%d %H:%M:%S} to {self.until:%Y-%m-%d %H:%M:%S} UTC"
        if self.kind is UniqueKind.DEBOUNCE:
            how = f"debounce: starts {self.until:%Y-%m-%d %H:%M:%S} UTC unless replaced again"
        elif self.kind is UniqueKind.THROTTLE:
            how = f"throttle: one job per period, this one's {span}"
        else:
            states = {
                UniqueStates.ANY: "whatever its state",
                UniqueStates.UNSETTLED: "until it settles",
                UniqueStates.WAITING: "until a runner claims it",
            }[self.states]
            how = f"unique_for {span}, {states}"
        return (
            f"{self.unique_key!r} ({how}); {self.duplicates} later enqueue(s) were duplicates of it, "
            f"{self.replacements} replaced its payload"
        )
