"""Periodic jobs: cron schedules that become delayed jobs, one per slot.

A :class:`Schedule` names a standard 5-field cron expression, evaluated in
an IANA time zone, and the job to enqueue at each of its *slots* (the
instants the expression matches). Every slot has a deterministic job id,
``schedule:<name>:<slot in UTC>``, so enqueueing a slot twice -- by two
runners, or by one runner planning again -- is an identical replay that
changes nothing.

:func:`plan` is all a runner needs: at ``now`` it returns each schedule's
latest missed slots (at most ``catch_up`` of them) and its next slot,
enqueued ahead as a delayed job so it starts on time, and the time to plan
again. It keeps no state: the database, through the job ids, remembers
what was enqueued.

Cron expressions are parsed and matched against local wall-clock times by
cronsim (the ``cron`` extra: ``pip install 'sqlalchemy-watchdog[cron]'``);
turning those times into instants -- the daylight-saving and other offset
changes of the zone, with Debian cron's rules -- is done here, the same way
whatever the instant a plan starts from; see :class:`Schedule`. Importing
this module does not need cronsim; building a schedule does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import InvalidJob
from .jobs import (
    LANE_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_MAX_LENGTH,
    Job,
    RetryPolicy,
    check_aware,
    check_duration,
    check_int,
    check_text,
    encode_payload,
)

if TYPE_CHECKING:
    from cronsim import CronSim

__all__ = [
    "SCHEDULE_NAME_MAX_LENGTH",
    "CRON_MAX_LENGTH",
    "CATCH_UP_MAX",
    "SLOTS_MAX",
    "JOB_ID_PREFIX",
    "Schedule",
    "plan",
    "check_schedules",
]

#: The longest schedule name: ``schedule:<name>:<20-character slot>`` stays
#: within a job id's 256 characters.
SCHEDULE_NAME_MAX_LENGTH = 200
#: The longest cron expression accepted.
CRON_MAX_LENGTH = 500
#: The most missed slots one schedule may catch up on.
CATCH_UP_MAX = 100
#: The most slots :meth:`Schedule.slots` returns in one call.
SLOTS_MAX = 10_000
#: Every schedule's job ids start with this.
JOB_ID_PREFIX = "schedule:"
#: The most recent slot a schedule's catch-up looks for is never before this
#: instant: a job's ``run_at`` cannot be earlier.
CATCH_UP_FLOOR = datetime(1970, 1, 1, tzinfo=UTC)

_NAME = re.compile(r"[A-Za-z0-9_.:\-]+")
_INSTALL_HINT = "pip install 'sqlalchemy-watchdog[cron]'"
_INT32_MAX = 2**31 - 1
_SECOND = timedelta(seconds=1)
_MINUTE = timedelta(minutes=1)


def _reading(instant: datetime, zone: ZoneInfo) -> datetime:
    """What a wall clock in ``zone`` shows at ``instant``, as a naive datetime."""
    return instant.astimezone(zone).replace(tzinfo=None)


def _cronsim() -> type[CronSim]:
    """cronsim's ``CronSim`` class, or an ImportError that says how to install it."""
    try:
        from cronsim import CronSim
    except ImportError as error:
        raise ImportError(f"cron schedules need the cronsim package: {_INSTALL_HINT}") from error
    return CronSim


@dataclass(frozen=True, slots=True)
class Schedule:
    """A periodic job: a cron expression in a time zone, and the job to run at
    each of its slots. Every field is checked when it is built; bad input
    raises :class:`~sqlalchemy_watchdog.InvalidJob` naming the field.

    :param name: identifies the schedule in its job ids: 1-200 ASCII letters,
        digits and ``_ - . :``. Names are unique among a runner's schedules.
        Renaming a schedule makes its slots new jobs.
    :param cron: a standard 5-field cron expression (minute, hour,
        day-of-month, month, day-of-week), as cronsim accepts it: ranges,
        lists, steps, ``JAN``-``DEC``, ``SUN``-``SAT``, ``L``, ``LW``,
        ``5L`` and ``MON#2`` included. A 6-field (seconds) expression and an
        expression that matches no time in the next 50 years are refused.
    :param queue: the queue of the jobs (1-256 characters).
    :param payload: the jobs' payload, strict JSON. It is encoded when the
        schedule is built: later changes to the object passed in change no
        job.
    :param timezone: the IANA time zone the expression is read in
        (``Europe/Berlin``), default ``UTC``.
    :param lane: the jobs' lane (default: the queue).
    :param priority: the jobs' priority.
    :param max_recoveries: the jobs' recovery budget (see
        :class:`~sqlalchemy_watchdog.Job`).
    :param retry: the jobs' :class:`~sqlalchemy_watchdog.RetryPolicy`.
    :param timeout: the jobs' per-attempt timeout.
    :param catch_up: 0-100, how many missed slots :func:`plan` enqueues
        after a time without any runner (the latest ones); 0 never runs a
        slot late that was not enqueued before.

    **Slots** are the instants the expression matches in the time zone,
    returned as aware UTC datetimes with whole minutes. Daylight-saving
    transitions follow cronsim, which follows Debian's cron:

    * an expression with a fixed minute and hour (neither field starts with
      ``*``: ``30 2 * * *``, ``0 1-5 * * *``) is given special care: a slot
      in the hour the clock skips runs at the first minute after the jump
      (``30 2 * * *`` runs at 03:00 on the day Berlin springs forward), and
      a slot in the hour the clock repeats runs once, at its first
      occurrence;
    * any other expression (``0 * * * *``, ``*/15 * * * *``, ``0 */2 * * *``)
      follows the wall clock: local times that do not exist have no slot,
      local times that happen twice have two.

    These rules hold in every IANA zone, whatever its offsets and the local
    time of its changes (Pacific/Chatham jumps at 02:45, Australia/Lord_Howe
    by half an hour).

    A schedule is a plain value: it can be built at import time, compared
    and printed. Its slots are computed forward from any instant, and are
    the same whichever instant they are computed from.
    """

    name: str
    cron: str
    queue: str
    _: KW_ONLY
    payload: Any = None
    timezone: str = "UTC"
    lane: str | None = None
    priority: int = 0
    max_recoveries: int | None = None
    retry: RetryPolicy | None = None
    timeout: timedelta | None = None
    catch_up: int = 1
    payload_json: str = field(init=False, repr=False, compare=False)
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidJob("name", f"must be a str, not {type(self.name).__name__}")
        if not 1 <= len(self.name) <= SCHEDULE_NAME_MAX_LENGTH:
            raise InvalidJob("name", f"must be 1 to {SCHEDULE_NAME_MAX_LENGTH} characters long, got {len(self.name)}")
        if _NAME.fullmatch(self.name) is None:
            raise InvalidJob(
                "name", f"may hold only ASCII letters, digits and _ - . : (it goes into job ids), got {self.name!r}"
            )
        check_text("queue", self.queue, QUEUE_MAX_LENGTH)
        if self.lane is not None:
            check_text("lane", self.lane, LANE_MAX_LENGTH)
        check_int("priority", self.priority, PRIORITY_MIN, PRIORITY_MAX)
        if self.max_recoveries is not None:
            check_int("max_recoveries", self.max_recoveries, 0, _INT32_MAX)
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise InvalidJob("retry", f"must be a RetryPolicy, not {type(self.retry).__name__}")
        if self.timeout is not None:
            check_duration("timeout", self.timeout)
        check_int("catch_up", self.catch_up, 0, CATCH_UP_MAX)
        object.__setattr__(self, "payload_json", encode_payload(self.payload))
        object.__setattr__(self, "_zone", _load_zone(self.timezone))
        _check_cron(self.cron, self._zone)

    # -- slots ------------------------------------------------------------------------

    def next_slot(self, after: datetime) -> datetime:
        """The first slot strictly after ``after`` (a timezone-aware datetime),
        as an aware UTC datetime.

        Raises :class:`~sqlalchemy_watchdog.InvalidJob` (``after``) for a naive
        datetime, and when there is no slot after it (none in the 50 years
        after it, or none before the year 9999).
        """
        after = check_aware("after", after)
        for slot in self._iterate(after):
            return slot
        raise InvalidJob("after", f"schedule {self.name!r} ({self.cron}) has no slot after {after.isoformat()}")

    def slots(self, after: datetime, count: int) -> list[datetime]:
        """The first ``count`` (0 to :data:`SLOTS_MAX`) slots strictly after
        ``after``, ascending, as aware UTC datetimes. Fewer when the
        schedule ends first (no slot within 50 years, or past the year 9999).
        """
        after = check_aware("after", after)
        check_int("count", count, 0, SLOTS_MAX)
        found: list[datetime] = []
        if count == 0:
            return found
        for slot in self._iterate(after):
            found.append(slot)
            if len(found) == count:
                break
        return found

    def job_id_for(self, slot: datetime) -> str:
        """The job id of ``slot`` (one of this schedule's slots):
        ``schedule:<name>:<slot in UTC as %Y-%m-%dT%H:%M:%SZ>``.

        The same slot always has the same id, whatever time zone ``slot`` is
        given in; two slots never share one. A time that is not a slot of
        this schedule is refused (``slot``).
        """
        return _job_id(self.name, self._check_slot(slot))

    def job_for(self, slot: datetime) -> Job:
        """The job of ``slot`` (one of this schedule's slots): its
        :meth:`job_id_for`, this schedule's queue, lane, priority, payload and
        recovery budget, and ``run_at=slot``, so it stays ``delayed`` until
        its time."""
        return self._job(self._check_slot(slot))

    # -- internals ----------------------------------------------------------------------

    def _check_slot(self, slot: object) -> datetime:
        slot = check_aware("slot", slot)
        utc = slot.astimezone(UTC)
        try:
            before = utc - _SECOND
        except OverflowError:
            before = None
        if before is None or next(self._iterate(before), None) != utc:
            raise InvalidJob(
                "slot", f"{slot.isoformat()} is not a slot of schedule {self.name!r} ({self.cron}, {self.timezone})"
            )
        return utc

    def _job(self, slot: datetime) -> Job:
        return Job(
            _job_id(self.name, slot),
            self.queue,
            lane=self.lane,
            priority=self.priority,
            payload=json.loads(self.payload_json),
            max_recoveries=self.max_recoveries,
            retry=self.retry,
            timeout=self.timeout,
            run_at=slot,
        )

    def _iterate(self, after: datetime) -> Iterator[datetime]:
        """The slots strictly after ``after`` (aware), ascending, in UTC.

        cronsim evaluates the expression on naive local wall-clock times
        only, where it is plain calendar arithmetic; each matching wall-clock
        time is then turned into instants here, by the rules of
        :class:`Schedule` (:meth:`_instants`). cronsim's own time-zone
        handling is not used: it depends on the instant it starts from (in
        Pacific/Chatham, whose clocks jump at 02:45, ``0 */2 * * *`` started
        at 03:46 local skips 04:00), while this sequence is one and the same
        whatever the start, in every zone.

        The wall-clock times are read from shortly before ``after``'s own:
        far enough back to include a repeated stretch ``after`` is in (whose
        second occurrences lie after it). Second occurrences come after
        later wall-clock times' first ones, so they wait in ``pending``
        until a later slot is due.
        """
        try:
            local = after.astimezone(self._zone)
            early, late = local.replace(fold=0).utcoffset(), local.replace(fold=1).utcoffset()
            back = max(early - late, timedelta(0)) if early is not None and late is not None else timedelta(0)
            start = local.replace(tzinfo=None, fold=0) - back - _SECOND
            walls = _cronsim()(self.cron, start)
        except OverflowError:  # the start is at the edge of datetime's range
            return
        fixed = self._fixed_time
        pending: list[datetime] = []  # second occurrences of repeated wall-clock times, ascending
        last = after
        while True:
            try:
                wall = next(walls)
                first, second = self._instants(wall, fixed)
            except (StopIteration, OverflowError):  # no match in 50 years; past the year 9999
                break
            if first is None:
                continue
            while pending and pending[0] < first:
                slot = pending.pop(0)
                if slot > last:
                    last = slot
                    yield slot
            if first > last:
                last = first
                yield first
            if second is not None:
                pending.append(second)
        for slot in pending:
            if slot > last:
                last = slot
                yield slot

    @property
    def _fixed_time(self) -> bool:
        """Whether the expression has a fixed minute and hour (neither field
        starts with ``*``): Debian cron's special care at transitions applies."""
        minute, hour = self.cron.split()[:2]
        return not minute.startswith("*") and not hour.startswith("*")

    def _instants(self, wall: datetime, fixed: bool) -> tuple[datetime | None, datetime | None]:
        """The slots of the naive local time ``wall`` (a match of the
        expression): its first occurrence and, for a wall-clock expression in
        a repeated stretch, its second one. A time the clock skips has no
        slot, or, for a fixed-time expression, the first whole minute after
        the jump; a fixed-time expression runs a repeated time once, first."""
        zone = self._zone
        first = wall.replace(tzinfo=zone).astimezone(UTC)
        if _reading(first, zone) != wall:  # the clock skips it
            if not fixed:
                return None, None
            probe = wall
            while True:
                probe += _MINUTE
                moved = probe.replace(tzinfo=zone).astimezone(UTC)
                if _reading(moved, zone) == probe:
                    return moved, None
        if fixed:
            return first, None
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        if second != first and _reading(second, zone) == wall:
            return first, second
        return first, None

    def _last_until(self, now: datetime, count: int, gap: timedelta) -> list[datetime]:
        """The last ``count`` slots at or before ``now``, ascending.

        cronsim only iterates forward, so this looks back in growing windows:
        ``(now - w, now]`` with ``w`` starting at ``gap * (count + 1)`` (``gap``
        being a guess of the distance between slots) and doubling, each round
        enumerating only the part not yet seen, until ``count`` slots are
        found or the window reaches :data:`CATCH_UP_FLOOR`. The work is
        bounded by the slots in the final window (at most about twice the
        span the answer needs) plus one cronsim search per round, so sparse
        schedules (yearly, ``0 0 29 2 *``) are as cheap as dense ones.
        """
        found: list[datetime] = []
        if count == 0 or now <= CATCH_UP_FLOOR:
            return found
        upper = now
        window = max(gap, timedelta(minutes=1)) * (count + 1)
        while True:
            try:
                lower = max(now - window, CATCH_UP_FLOOR)
            except OverflowError:
                lower = CATCH_UP_FLOOR
            segment: list[datetime] = []
            for slot in self._iterate(lower):
                if slot > upper:
                    break
                segment.append(slot)
            found[:0] = segment
            if len(found) >= count or lower == CATCH_UP_FLOOR:
                return found[-count:]
            upper = lower
            window *= 2


def _job_id(name: str, slot: datetime) -> str:
    return f"{JOB_ID_PREFIX}{name}:{slot.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def _load_zone(name: object) -> ZoneInfo:
    """The IANA zone ``name``, or :class:`InvalidJob` (``timezone``)."""
    if not isinstance(name, str):
        raise InvalidJob("timezone", f"must be an IANA time zone name (str), not {type(name).__name__}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as error:
        hint = " (on Windows, install the tzdata package)" if isinstance(error, ZoneInfoNotFoundError) else ""
        raise InvalidJob("timezone", f"unknown IANA time zone {name!r}{hint}") from None


def _check_cron(cron: object, zone: ZoneInfo) -> None:
    """Refuse anything but a 5-field expression cronsim accepts that has a slot
    in the next 50 years, with cronsim's own words."""
    if not isinstance(cron, str):
        raise InvalidJob("cron", f"must be a str, not {type(cron).__name__}")
    if len(cron) > CRON_MAX_LENGTH:
        raise InvalidJob("cron", f"must be at most {CRON_MAX_LENGTH} characters long, got {len(cron)}")
    fields = cron.split()
    if len(fields) != 5:
        raise InvalidJob(
            "cron",
            f"must have 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}: {cron!r}",
        )
    cron_sim = _cronsim()
    from cronsim import CronSimError

    now = datetime.now(UTC).astimezone(zone).replace(tzinfo=None)  # naive: as _iterate reads it
    try:
        iterator = cron_sim(cron, now)
    except Exception as error:  # CronSimError ("Bad minute", ...), or any other refusal
        reason = str(error) if isinstance(error, CronSimError) else f"{type(error).__name__}: {error}"
        raise InvalidJob("cron", f"{cron!r} is not a valid cron expression: {reason}") from None
    try:
        next(iterator)
    except (StopIteration, OverflowError):
        raise InvalidJob("cron", f"{cron!r} matches no time in the next 50 years") from None


def check_schedules(schedules: object) -> tuple[Schedule, ...]:
    """Validate a runner's ``schedules=`` argument and return it as a tuple.

    It must be an iterable of :class:`Schedule` (a list, a tuple, a
    generator; not a str, bytes or mapping) whose names are unique; None
    means no schedules. Anything else raises
    :class:`~sqlalchemy_watchdog.InvalidJob` (``schedules``).
    """
    if schedules is None:
        return ()
    if isinstance(schedules, Schedule):
        raise InvalidJob("schedules", "must be an iterable of Schedule, not one Schedule (wrap it in a list)")
    if isinstance(schedules, (str, bytes, Mapping)) or not isinstance(schedules, Iterable):
        raise InvalidJob("schedules", f"must be an iterable of Schedule, not {type(schedules).__name__}")
    checked = tuple(schedules)
    seen: set[str] = set()
    for index, schedule in enumerate(checked):
        if not isinstance(schedule, Schedule):
            raise InvalidJob("schedules", f"item {index} is a {type(schedule).__name__}, not a Schedule")
        if schedule.name in seen:
            raise InvalidJob("schedules", f"the name {schedule.name!r} is used by more than one schedule")
        seen.add(schedule.name)
    return checked


def fingerprint(schedule: Schedule) -> str:
    """A digest of the whole definition of ``schedule`` (not its name): two
    runners serving the same name with different definitions differ here."""
    retry = schedule.retry
    definition = [
        schedule.cron,
        schedule.timezone,
        schedule.queue,
        schedule.lane,
        schedule.priority,
        schedule.max_recoveries,
        None if retry is None else repr(retry),
        None if schedule.timeout is None else schedule.timeout.total_seconds(),
        schedule.catch_up,
        schedule.payload_json,
    ]
    return hashlib.sha256(json.dumps(definition).encode()).hexdigest()[:32]


def plan(schedules: Sequence[Schedule], now: datetime) -> tuple[list[Job], datetime | None]:
    """The jobs to enqueue at ``now`` and when to plan again.

    For each schedule:

    * its last ``catch_up`` slots at or before ``now`` -- bounded catch-up: a
      runner that was down enqueues at most that many missed slots, the
      latest ones (0: none);
    * its next slot after ``now``, enqueued ahead as a delayed job
      (``run_at`` = the slot), so it starts on time whatever the runner is
      doing then.

    Enqueue them all, every time (``enqueue`` with the list): a slot
    enqueued before (by this runner or any other) is an identical replay
    and changes nothing, so planning twice, or in many runners at once,
    leaves exactly one job per slot. The plan keeps no state; the first
    plan of a new schedule catches up too (``catch_up`` slots of the recent
    past run at once), and a slot enqueued ahead before an outage runs when
    a runner is back, besides the caught-up ones.

    Jobs come in a deterministic order: by slot, then by schedule name. The
    second value is the earliest next slot over all schedules (None without
    schedules): plan again then, at the latest. ``now`` must be
    timezone-aware; ``schedules`` is checked as :func:`check_schedules` does.
    """
    checked = check_schedules(schedules)
    now = check_aware("now", now).astimezone(UTC)
    planned: list[tuple[datetime, str, Job]] = []
    next_plan: datetime | None = None
    for schedule in checked:
        upcoming = schedule.slots(now, 2)
        gap = upcoming[1] - upcoming[0] if len(upcoming) == 2 else timedelta(days=1)
        slots = schedule._last_until(now, schedule.catch_up, gap)
        if upcoming:
            slots.append(upcoming[0])
            if next_plan is None or upcoming[0] < next_plan:
                next_plan = upcoming[0]
        planned.extend((slot, schedule.name, schedule._job(slot)) for slot in slots)
    planned.sort(key=lambda item: (item[0], item[1]))
    return [job for _, _, job in planned], next_plan
