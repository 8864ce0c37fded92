"""Cron schedules: slots, job ids, plan()'s bounded catch-up, daylight saving,
bad input, and plan()'s jobs on a real database (both dialects).

Only the last tests need a database; the rest are pure computations.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import zoneinfo
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select

from sqlalchemy_watchdog import EnqueueStatus, InvalidJob, Job, JobState, Schedule, Watchdog, enqueue
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.schedules import CATCH_UP_MAX, check_schedules, plan
from tests.helpers import present, read

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args).replace(tzinfo=UTC)  # type: ignore[arg-type]


def stamps(slots: list[datetime]) -> list[str]:
    """Slots as readable UTC strings (and a check that they are UTC)."""
    assert all(slot.tzinfo is UTC for slot in slots), slots
    return [f"{slot:%Y-%m-%d %H:%M}Z" for slot in slots]


def local(slots: list[datetime], zone: ZoneInfo) -> list[str]:
    """Slots as local wall-clock times with their UTC offsets."""
    return [slot.astimezone(zone).isoformat() for slot in slots]


# -- slots --------------------------------------------------------------------------------


def test_next_slot_is_strictly_after_and_in_utc() -> None:
    schedule = Schedule("quarter-hour", "*/15 * * * *", "q")
    assert schedule.next_slot(utc(2024, 5, 10, 10, 0)) == utc(2024, 5, 10, 10, 15)
    assert schedule.next_slot(utc(2024, 5, 10, 10, 14, 59)) == utc(2024, 5, 10, 10, 15)
    assert schedule.next_slot(datetime(2024, 5, 10, 10, 14, 59, 999999, tzinfo=UTC)) == utc(2024, 5, 10, 10, 15)
    assert schedule.next_slot(datetime(2024, 5, 10, 10, 15, 0, 1, tzinfo=UTC)) == utc(2024, 5, 10, 10, 30)
    # Any time zone in, UTC out: 12:00 in Berlin (summer) is 10:00Z.
    slot = schedule.next_slot(datetime(2024, 5, 10, 12, 0, tzinfo=BERLIN))
    assert slot == utc(2024, 5, 10, 10, 15) and slot.tzinfo is UTC


def test_slots_are_read_in_the_schedules_time_zone() -> None:
    daily = Schedule("daily", "0 9 * * MON-FRI", "q", timezone="America/New_York")
    slots = daily.slots(utc(2024, 5, 9, 0, 0), 3)  # from Thursday
    assert stamps(slots) == ["2024-05-09 13:00Z", "2024-05-10 13:00Z", "2024-05-13 13:00Z"]
    assert local(slots, NEW_YORK)[2] == "2024-05-13T09:00:00-04:00"  # Monday, after the weekend
    assert daily.slots(utc(2024, 5, 9), 0) == []
    assert daily.slots(utc(2024, 5, 9), 1) == [daily.next_slot(utc(2024, 5, 9))]


def test_cron_features_cronsim_offers() -> None:
    last_day = Schedule("month-end", "0 18 L * *", "q")
    assert stamps(last_day.slots(utc(2024, 1, 31, 18), 2)) == ["2024-02-29 18:00Z", "2024-03-31 18:00Z"]
    second_monday = Schedule("second-monday", "0 8 * * MON#2", "q")
    assert stamps(second_monday.slots(utc(2024, 1, 1), 2)) == ["2024-01-08 08:00Z", "2024-02-12 08:00Z"]
    lowercase = Schedule("jan", "0 0 1 jan *", "q")
    assert stamps(lowercase.slots(utc(2024, 6, 1), 1)) == ["2025-01-01 00:00Z"]


def test_sparse_schedules() -> None:
    yearly = Schedule("new-year", "0 0 1 1 *", "q", timezone="Europe/Berlin")
    assert stamps(yearly.slots(utc(2024, 5, 1), 2)) == ["2024-12-31 23:00Z", "2025-12-31 23:00Z"]
    leap_day = Schedule("leap-day", "0 12 29 2 *", "q")
    assert stamps(leap_day.slots(utc(2024, 3, 1), 2)) == ["2028-02-29 12:00Z", "2032-02-29 12:00Z"]
    # 2100 is no leap year: the next leap day after 2096 is in 2104.
    assert stamps(leap_day.slots(utc(2096, 3, 1), 1)) == ["2104-02-29 12:00Z"]


def test_the_slots_are_one_sequence_whatever_the_start() -> None:
    """next_slot(t) is the first slot after t of the sequence enumerated from
    any earlier instant -- across both daylight-saving transitions, for a
    fixed-time expression and for wall-clock ones."""
    for cron in ("30 2 * * *", "0 * * * *", "*/20 1-3 * * *", "0 1,2,3 * * *"):
        for zone, day in (
            ("Europe/Berlin", (2024, 3, 31)),
            ("Europe/Berlin", (2024, 10, 27)),
            ("America/New_York", (2024, 3, 10)),
            ("America/New_York", (2024, 11, 3)),
        ):
            schedule = Schedule("s", cron, "q", timezone=zone)
            start = datetime(*day, tzinfo=ZoneInfo(zone)) - timedelta(days=1)
            sequence = schedule.slots(start, 200)  # well beyond the 3 days swept below
            assert sequence == sorted(set(sequence)), (cron, zone)
            t = start
            while t < start + timedelta(days=3):
                expected = next(slot for slot in sequence if slot > t)
                assert schedule.next_slot(t) == expected, (cron, zone, t)
                t += timedelta(minutes=7, seconds=30)


# -- job ids and jobs -------------------------------------------------------------------------


def test_job_ids_are_deterministic_and_unique_per_instant() -> None:
    schedule = Schedule("report.daily", "0 3 * * *", "reports", timezone="Europe/Berlin")
    slot = schedule.next_slot(utc(2024, 5, 10))
    assert schedule.job_id_for(slot) == "schedule:report.daily:2024-05-10T01:00:00Z"
    # The same instant in any time zone has the same id.
    assert schedule.job_id_for(slot.astimezone(BERLIN)) == schedule.job_id_for(slot)
    assert schedule.job_id_for(slot.astimezone(timezone(timedelta(hours=-7)))) == schedule.job_id_for(slot)
    # An equal schedule built again gives the same ids; distinct slots, distinct ids.
    again = Schedule("report.daily", "0 3 * * *", "reports", timezone="Europe/Berlin")
    slots = schedule.slots(utc(2024, 1, 1), 400)
    ids = [schedule.job_id_for(s) for s in slots]
    assert ids == [again.job_id_for(s) for s in slots]
    assert len(set(ids)) == len(ids) == 400


def test_job_for_carries_the_schedules_fields_and_run_at() -> None:
    schedule = Schedule(
        "nightly",
        "15 2 * * *",
        "reports",
        payload={"kind": "nightly", "days": [1, 2]},
        timezone="Europe/Berlin",
        lane="reports:nightly",
        priority=7,
        max_recoveries=2,
    )
    slot = schedule.next_slot(utc(2024, 5, 10))
    job = schedule.job_for(slot)
    assert job == Job(
        "schedule:nightly:2024-05-10T00:15:00Z",
        "reports",
        lane="reports:nightly",
        priority=7,
        payload={"days": [1, 2], "kind": "nightly"},
        max_recoveries=2,
        run_at=slot,
    )
    assert job.run_at == utc(2024, 5, 10, 0, 15)
    assert Schedule("plain", "0 0 * * *", "q").job_for(utc(2024, 5, 10)).lane == "q"


def test_the_payload_is_frozen_when_the_schedule_is_built() -> None:
    payload: dict[str, Any] = {"to": ["ops"]}
    schedule = Schedule("s", "0 0 * * *", "q", payload=payload)
    payload["to"].append("everyone")
    assert schedule.job_for(utc(2024, 5, 10)).payload == {"to": ["ops"]}


def test_a_time_that_is_no_slot_is_refused() -> None:
    schedule = Schedule("s", "30 2 * * *", "q", timezone="Europe/Berlin")
    for not_a_slot in (
        utc(2024, 5, 10, 0, 31),  # a minute late
        datetime(2024, 5, 10, 0, 30, 0, 1, tzinfo=UTC),  # a microsecond late
        datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=BERLIN),  # the repeated 02:30 (the slot is the first)
    ):
        with pytest.raises(InvalidJob, match="^slot: .* is not a slot of schedule 's'") as caught:
            schedule.job_id_for(not_a_slot)
        assert caught.value.field == "slot"
        with pytest.raises(InvalidJob, match="^slot: "):
            schedule.job_for(not_a_slot)
    assert schedule.job_id_for(datetime(2024, 10, 27, 2, 30, fold=0, tzinfo=BERLIN)).endswith("2024-10-27T00:30:00Z")


# -- plan: bounded catch-up, next-plan time ----------------------------------------------------


def test_plan_after_three_days_down_enqueues_only_catch_up_missed_slots_and_the_next() -> None:
    now = utc(2024, 5, 13, 10, 30)  # the runner was down since 2024-05-10: 3 days of hourly slots missed
    for catch_up, missed in ((0, []), (1, ["10:00"]), (3, ["08:00", "09:00", "10:00"])):
        schedule = Schedule("hourly", "0 * * * *", "q", catch_up=catch_up)
        jobs, next_plan = plan([schedule], now)
        assert [job.job_id for job in jobs] == [
            *(f"schedule:hourly:2024-05-13T{hm}:00Z" for hm in missed),
            "schedule:hourly:2024-05-13T11:00:00Z",
        ], catch_up
        assert [job.run_at for job in jobs] == [
            *(datetime.fromisoformat(f"2024-05-13T{hm}:00+00:00") for hm in missed),
            utc(2024, 5, 13, 11),
        ]
        assert next_plan == utc(2024, 5, 13, 11)


def test_plan_default_catch_up_is_one() -> None:
    jobs, _ = plan([Schedule("hourly", "0 * * * *", "q")], utc(2024, 5, 13, 10, 30))
    assert [job.job_id for job in jobs] == [
        "schedule:hourly:2024-05-13T10:00:00Z",
        "schedule:hourly:2024-05-13T11:00:00Z",
    ]


def test_plan_counts_a_slot_at_now_as_due() -> None:
    jobs, next_plan = plan([Schedule("hourly", "0 * * * *", "q")], utc(2024, 5, 13, 10, 0))
    assert [job.run_at for job in jobs] == [utc(2024, 5, 13, 10), utc(2024, 5, 13, 11)]
    assert next_plan == utc(2024, 5, 13, 11)


def test_plan_catch_up_on_sparse_schedules() -> None:
    now = utc(2024, 5, 10, 12)
    yearly = Schedule("new-year", "0 0 1 1 *", "q", timezone="Europe/Berlin", catch_up=3)
    leap_day = Schedule("leap-day", "0 12 29 2 *", "q", catch_up=2)
    jobs, next_plan = plan([yearly, leap_day], now)
    assert [job.job_id for job in jobs] == [
        "schedule:leap-day:2020-02-29T12:00:00Z",
        "schedule:new-year:2021-12-31T23:00:00Z",
        "schedule:new-year:2022-12-31T23:00:00Z",
        "schedule:new-year:2023-12-31T23:00:00Z",
        "schedule:leap-day:2024-02-29T12:00:00Z",
        "schedule:new-year:2024-12-31T23:00:00Z",
        "schedule:leap-day:2028-02-29T12:00:00Z",
    ]
    assert next_plan == utc(2024, 12, 31, 23)
    # The most catch-up there is, on a schedule matching about once in 28 years:
    # every slot since 1970, found without walking 100 x 28 years.
    rare = Schedule("rare", "0 0 * 2 MON#5", "q", catch_up=CATCH_UP_MAX)
    jobs, next_plan = plan([rare], now)
    assert [job.run_at for job in jobs] == [utc(1988, 2, 29), utc(2016, 2, 29), utc(2044, 2, 29)]
    assert next_plan == utc(2044, 2, 29)


def test_plan_order_and_next_plan_time_over_many_schedules() -> None:
    now = utc(2024, 5, 10, 10, 7)
    schedules = [
        Schedule("b-quarter", "*/15 * * * *", "q"),
        Schedule("a-hourly", "0 * * * *", "q", catch_up=2),
        Schedule("c-daily", "0 6 * * *", "q", timezone="America/New_York"),
    ]
    jobs, next_plan = plan(schedules, now)
    assert [job.job_id for job in jobs] == [
        "schedule:a-hourly:2024-05-10T09:00:00Z",
        "schedule:a-hourly:2024-05-10T10:00:00Z",  # the same slot: by name
        "schedule:b-quarter:2024-05-10T10:00:00Z",
        "schedule:c-daily:2024-05-10T10:00:00Z",  # 06:00 EDT, seven minutes ago
        "schedule:b-quarter:2024-05-10T10:15:00Z",
        "schedule:a-hourly:2024-05-10T11:00:00Z",
        "schedule:c-daily:2024-05-11T10:00:00Z",
    ]
    assert next_plan == utc(2024, 5, 10, 10, 15)
    assert plan(list(reversed(schedules)), now) == (jobs, next_plan)
    assert plan([], now) == ([], None)
    assert plan((), now) == ([], None)


def test_planning_at_each_next_plan_time_enqueues_every_slot_exactly_once() -> None:
    """A runner that plans at the times plan() names covers the schedule's
    slots without a gap, across a daylight-saving change."""
    schedules = [
        Schedule("berlin-night", "30 2 * * *", "q", timezone="Europe/Berlin", catch_up=0),
        Schedule("half-hourly", "*/30 * * * *", "q", timezone="Europe/Berlin", catch_up=0),
    ]
    start, end = utc(2024, 10, 25), utc(2024, 10, 29)
    planned: dict[str, datetime] = {}
    now: datetime | None = start
    rounds = 0
    while now is not None and now < end:
        assert rounds < 1000, f"plan() does not move on: {now}"
        jobs, next_plan = plan(schedules, now)
        assert next_plan is not None and next_plan > now
        now = next_plan
        for job in jobs:
            assert job.run_at is not None and planned.setdefault(job.job_id, job.run_at) == job.run_at
        rounds += 1
    for schedule in schedules:
        expected = {schedule.job_id_for(s): s for s in schedule.slots(start, 1000) if s <= end}
        mine = {i: s for i, s in planned.items() if i.startswith(f"schedule:{schedule.name}:") and s <= end}
        assert mine == expected, schedule.name
    # One plan at the start and one at each half-hourly slot before the end:
    # every 30 real minutes (the repeated hour's two 02:00s are 30 minutes
    # apart too), so 4 days are 4 * 48 plans.
    assert rounds == 4 * 48


# -- daylight saving time ----------------------------------------------------------------------
#
# cronsim follows Debian's cron: an expression with a fixed minute and hour
# (neither field starts with '*') runs a slot that falls in the skipped hour
# when the clock jumps, and a slot in the repeated hour once (its first
# occurrence); other expressions follow the wall clock (no slot for local
# times that do not exist, two for local times that happen twice).


def test_berlin_spring_forward() -> None:
    # 2024-03-31: 02:00 CET jumps to 03:00 CEST.
    before = utc(2024, 3, 30, 12)
    night = Schedule("night", "30 2 * * *", "q", timezone="Europe/Berlin")
    assert local(night.slots(before, 3), BERLIN) == [
        "2024-03-31T03:00:00+02:00",  # 02:30 does not exist: it runs when the clock jumps
        "2024-04-01T02:30:00+02:00",
        "2024-04-02T02:30:00+02:00",
    ]
    hourly = Schedule("hourly", "0 * * * *", "q", timezone="Europe/Berlin")
    assert local(hourly.slots(utc(2024, 3, 30, 23, 30), 3), BERLIN) == [
        "2024-03-31T01:00:00+01:00",
        "2024-03-31T03:00:00+02:00",  # no 02:00 that day, and only one slot for 03:00
        "2024-03-31T04:00:00+02:00",
    ]
    two_hourly = Schedule("two-hourly", "0 */2 * * *", "q", timezone="Europe/Berlin")
    assert local(two_hourly.slots(utc(2024, 3, 30, 22, 30), 2), BERLIN) == [
        "2024-03-31T00:00:00+01:00",
        "2024-03-31T04:00:00+02:00",  # a step in the hour field follows the wall clock: 02:00 is skipped
    ]


def test_berlin_fall_back() -> None:
    # 2024-10-27: 03:00 CEST falls back to 02:00 CET; 02:00-03:00 happens twice.
    night = Schedule("night", "30 2 * * *", "q", timezone="Europe/Berlin")
    assert local(night.slots(utc(2024, 10, 26, 12), 2), BERLIN) == [
        "2024-10-27T02:30:00+02:00",  # once, at the first 02:30
        "2024-10-28T02:30:00+01:00",
    ]
    # Asked from inside the second pass of the hour, the next slot is the next day's.
    second_pass = datetime(2024, 10, 27, 2, 15, fold=1, tzinfo=BERLIN)
    assert night.next_slot(second_pass) == utc(2024, 10, 28, 1, 30)
    half_hourly = Schedule("half-hourly", "*/30 * * * *", "q", timezone="Europe/Berlin")
    assert local(half_hourly.slots(utc(2024, 10, 26, 23, 45), 5), BERLIN) == [
        "2024-10-27T02:00:00+02:00",
        "2024-10-27T02:30:00+02:00",
        "2024-10-27T02:00:00+01:00",  # the wall clock shows 02:00 and 02:30 twice: two slots each
        "2024-10-27T02:30:00+01:00",
        "2024-10-27T03:00:00+01:00",
    ]
    jobs, _ = plan([half_hourly], utc(2024, 10, 27, 0, 45))
    assert [job.job_id for job in jobs] == [
        "schedule:half-hourly:2024-10-27T00:30:00Z",
        "schedule:half-hourly:2024-10-27T01:00:00Z",  # distinct ids for the two local 02:00s
    ]


def test_new_york_transitions() -> None:
    # 2024-03-10: 02:00 EST jumps to 03:00 EDT; 2024-11-03: 02:00 EDT falls back to 01:00 EST.
    spring = Schedule("spring", "30 2 * * *", "q", timezone="America/New_York")
    assert local(spring.slots(utc(2024, 3, 9, 12), 2), NEW_YORK) == [
        "2024-03-10T03:00:00-04:00",
        "2024-03-11T02:30:00-04:00",
    ]
    fall = Schedule("fall", "30 1 * * *", "q", timezone="America/New_York")
    assert local(fall.slots(utc(2024, 11, 2, 12), 2), NEW_YORK) == [
        "2024-11-03T01:30:00-04:00",  # once, in daylight time
        "2024-11-04T01:30:00-05:00",
    ]
    every_hour_at_30 = Schedule("at-30", "30 * * * *", "q", timezone="America/New_York")
    assert local(every_hour_at_30.slots(utc(2024, 11, 3, 4, 45), 3), NEW_YORK) == [
        "2024-11-03T01:30:00-04:00",
        "2024-11-03T01:30:00-05:00",  # the repeated hour: two slots
        "2024-11-03T02:30:00-05:00",
    ]


# -- bad input ---------------------------------------------------------------------------------


GOOD: dict[str, Any] = {"name": "s", "cron": "0 * * * *", "queue": "q"}

BAD_SCHEDULES = [
    ({"name": ""}, "name", "1 to 200"),
    ({"name": "x" * 201}, "name", "1 to 200"),
    ({"name": "daily report"}, "name", "ASCII letters"),
    ({"name": "résumé"}, "name", "ASCII letters"),
    ({"name": "a/b"}, "name", "ASCII letters"),
    ({"name": "a\nb"}, "name", "ASCII letters"),
    ({"name": 7}, "name", "must be a str"),
    ({"cron": "61 * * * *"}, "cron", "Bad minute"),
    ({"cron": "0 24 * * *"}, "cron", "Bad hour"),
    ({"cron": "0 0 30 2 *"}, "cron", "Bad day-of-month"),
    ({"cron": "0 0 * 13 *"}, "cron", "Bad month"),
    ({"cron": "0 0 * * 8"}, "cron", "Bad day-of-week"),
    ({"cron": "0 0 * *"}, "cron", "5 fields"),
    ({"cron": "0 0 0 * * *"}, "cron", "5 fields"),  # seconds: not standard cron
    ({"cron": "@daily"}, "cron", "5 fields"),
    ({"cron": ""}, "cron", "5 fields"),
    ({"cron": "* * " + "1," * 300 + "1 * *"}, "cron", "at most 500"),
    ({"cron": "1 1 */100 * MON#4"}, "cron", "matches no time in the next 50 years"),
    ({"cron": None}, "cron", "must be a str"),
    ({"queue": ""}, "queue", "1 to 256"),
    ({"queue": None}, "queue", "must be a str"),
    ({"timezone": "Mars/Olympus"}, "timezone", "unknown IANA time zone 'Mars/Olympus'"),
    ({"timezone": "/etc/passwd"}, "timezone", "unknown IANA time zone"),
    ({"timezone": "../../etc"}, "timezone", "unknown IANA time zone"),
    ({"timezone": ""}, "timezone", "unknown IANA time zone"),
    ({"timezone": BERLIN}, "timezone", "not ZoneInfo"),
    ({"lane": ""}, "lane", "1 to 512"),
    ({"priority": 1.5}, "priority", "must be an int"),
    ({"priority": True}, "priority", "must be an int"),
    ({"priority": 2**63}, "priority", "between"),
    ({"max_recoveries": -1}, "max_recoveries", "between 0"),
    ({"catch_up": -1}, "catch_up", "between 0 and 100"),
    ({"catch_up": 101}, "catch_up", "between 0 and 100"),
    ({"catch_up": None}, "catch_up", "must be an int"),
    ({"payload": {"at": datetime(2024, 1, 1)}}, "payload", "not a JSON type"),
    ({"payload": float("nan")}, "payload", "not a JSON number"),
    ({"payload": {1: "x"}}, "payload", "keys must be str"),
]


@pytest.mark.parametrize(
    ("override", "field", "message"), BAD_SCHEDULES, ids=lambda v: repr(v)[:40] if isinstance(v, dict) else None
)
def test_bad_schedules_are_refused_naming_the_field(override: dict[str, Any], field: str, message: str) -> None:
    fields = {**GOOD, **override}
    with pytest.raises(InvalidJob) as caught:
        Schedule(fields.pop("name"), fields.pop("cron"), fields.pop("queue"), **fields)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert message in str(caught.value)


def test_bad_cron_message_quotes_the_expression_and_cronsims_reason() -> None:
    with pytest.raises(InvalidJob) as caught:
        Schedule("s", "*/0 * * * *", "q")
    assert str(caught.value) == "cron: '*/0 * * * *' is not a valid cron expression: Bad minute"


NAIVE = datetime(2024, 5, 10, 12, 0)


def test_bad_arguments_to_the_methods_name_the_field() -> None:
    schedule = Schedule("s", "0 * * * *", "q")
    cases: list[tuple[Any, str, str]] = [
        (lambda: schedule.next_slot(NAIVE), "after", "naive"),
        (lambda: schedule.next_slot("2024-05-10T12:00:00Z"), "after", "not str"),  # type: ignore[arg-type]
        (lambda: schedule.slots(NAIVE, 3), "after", "naive"),
        (lambda: schedule.slots(utc(2024, 5, 10), -1), "count", "between 0 and 10000"),
        (lambda: schedule.slots(utc(2024, 5, 10), 10_001), "count", "between 0 and 10000"),
        (lambda: schedule.slots(utc(2024, 5, 10), 2.0), "count", "must be an int"),  # type: ignore[arg-type]
        (lambda: schedule.job_id_for(NAIVE), "slot", "naive"),
        (lambda: schedule.job_id_for(datetime(2024, 5, 10).date()), "slot", "not date"),  # type: ignore[arg-type]
        (lambda: schedule.job_for(NAIVE), "slot", "naive"),
        (lambda: plan([schedule], NAIVE), "now", "naive"),
        (lambda: plan([schedule], None), "now", "not NoneType"),  # type: ignore[arg-type]
        (lambda: plan("s", utc(2024, 5, 10)), "schedules", "not str"),  # type: ignore[arg-type]
        (
            lambda: plan([schedule, Schedule("s", "0 0 * * *", "q")], utc(2024, 5, 10)),
            "schedules",
            "'s' is used by more than one",
        ),
    ]
    for call, field, message in cases:
        with pytest.raises(InvalidJob) as caught:
            call()
        assert caught.value.field == field, (field, message)
        assert message in str(caught.value), str(caught.value)


def test_next_slot_beyond_the_last_slot_is_refused() -> None:
    schedule = Schedule("s", "0 0 1 1 *", "q")
    with pytest.raises(InvalidJob, match=r"^after: schedule 's' \(0 0 1 1 \*\) has no slot after 9999-"):
        schedule.next_slot(datetime(9999, 6, 1, tzinfo=UTC))
    assert schedule.slots(datetime(9998, 6, 1, tzinfo=UTC), 5) == [utc(9999, 1, 1)]


def test_check_schedules() -> None:
    a, b = Schedule("a", "0 * * * *", "q"), Schedule("b", "0 * * * *", "q")
    assert check_schedules([a, b]) == (a, b)
    assert check_schedules(iter([a])) == (a,)
    assert check_schedules(()) == ()
    assert check_schedules(None) == ()
    for bad, message in (
        ("ab", "not str"),
        (b"ab", "not bytes"),
        ({"a": a}, "not dict"),
        (a, "not one Schedule"),
        (42, "not int"),
        ([a, "b"], "item 1 is a str"),
        ([a, Schedule("a", "0 0 * * *", "other")], "'a' is used by more than one schedule"),
    ):
        with pytest.raises(InvalidJob) as caught:
            check_schedules(bad)
        assert caught.value.field == "schedules"
        assert message in str(caught.value), str(caught.value)


def test_the_package_imports_without_cronsim_and_a_schedule_says_what_to_install() -> None:
    code = """
import sys
from datetime import UTC, datetime
sys.modules["cronsim"] = None  # as if it were not installed
import sqlalchemy_watchdog
from sqlalchemy_watchdog import Schedule
from sqlalchemy_watchdog.schedules import plan
assert plan([], datetime.now(UTC)) == ([], None)
try:
    Schedule("s", "0 * * * *", "q")
except ImportError as error:
    print(error)
else:
    raise SystemExit("built a Schedule without cronsim")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cron schedules need the cronsim package: pip install 'sqlalchemy-watchdog[cron]'"


def test_importing_the_package_does_not_import_cronsim() -> None:
    code = "import sys, sqlalchemy_watchdog; print('cronsim' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# -- on a real database --------------------------------------------------------------------------


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(jobs_table)).scalar_one())


def test_enqueueing_a_plan_twice_leaves_one_job_per_slot(engine: Engine) -> None:
    now = datetime.now(UTC)
    schedules = [
        Schedule("every-minute", "* * * * *", "q", catch_up=3, payload={"n": 1}),
        Schedule("hourly", "0 * * * *", "q", timezone="Europe/Berlin", priority=5),
        Schedule("yearly", "0 0 1 1 *", "q", catch_up=2, max_recoveries=1),
    ]
    jobs, next_plan = plan(schedules, now)
    assert len(jobs) == 4 + 2 + 3
    with engine.begin() as conn:
        first = enqueue(conn, jobs)
    assert {r.status for r in first} == {EnqueueStatus.QUEUED}
    # Another runner, or the same one planning again: identical replays, nothing new.
    again, _ = plan(schedules, now)
    with engine.begin() as conn:
        second = enqueue(conn, again)
    assert [r.status for r in second] == [EnqueueStatus.DUPLICATE] * len(jobs)
    assert _count(engine) == len(jobs)
    # Planning at the next-plan time adds only the slots not planned before:
    # the new next slot of each schedule whose slot came due then.
    assert next_plan is not None
    later, _ = plan(schedules, next_plan)
    results = Watchdog(engine).enqueue(later)
    new = [r.job_id for r in results if r.status is EnqueueStatus.QUEUED]
    assert new == [job.job_id for job in later if job.job_id not in {j.job_id for j in jobs}]
    assert f"schedule:every-minute:{next_plan + timedelta(minutes=1):%Y-%m-%dT%H:%M:%SZ}" in new
    assert _count(engine) == len(jobs) + len(new)
    # The slot that is due is queued (its run_at passed); the next one waits, delayed.
    due = read(engine, jobs[0].job_id)
    upcoming = read(engine, f"schedule:yearly:{schedules[2].next_slot(now):%Y-%m-%dT%H:%M:%SZ}")
    assert due.state is JobState.QUEUED
    assert upcoming.state is JobState.DELAYED
    assert upcoming.run_at == schedules[2].next_slot(now)
    assert (upcoming.max_recoveries, read(engine, jobs[-2].job_id).queue) == (1, "q")


def test_a_changed_schedule_conflicts_with_its_slots_already_enqueued(engine: Engine) -> None:
    """A slot keeps the contents it was enqueued with: planning it again from
    a schedule whose payload changed (a deploy) reuses the job id with other
    contents, which is an EnqueueConflict like any such replay -- whoever
    enqueues plans must expect it."""
    from sqlalchemy_watchdog import EnqueueConflict

    now = datetime.now(UTC)
    before = Schedule("report", "0 3 * * *", "q", payload={"v": 1}, catch_up=0)
    after = Schedule("report", "0 3 * * *", "q", payload={"v": 2}, catch_up=0)
    [job], _ = plan([before], now)
    Watchdog(engine).enqueue(job)
    [changed], _ = plan([after], now)
    assert changed.job_id == job.job_id
    with pytest.raises(EnqueueConflict):
        Watchdog(engine).enqueue(changed)
    assert read(engine, job.job_id).payload == {"v": 1}


# -- schedules given to runners ---------------------------------------------------------


def schedule_jobs(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(jobs_table.c.job_id, jobs_table.c.state, jobs_table.c.payload_json).where(
                jobs_table.c.job_id.like("schedule:%")
            )
        ).all()
    return {row.job_id: (row.state, row.payload_json) for row in rows}


def test_runners_given_the_same_schedule_leave_one_job_per_slot(engine: Engine, runners: Any) -> None:
    """Several runners (of the test's kind) enqueue the latest slot and the
    next one ahead: one job each, the latest run at once, the next delayed."""
    ran: list[str] = []
    every_minute = Schedule("tick", "* * * * *", "periodic", payload={"n": 1})
    workers = [
        runners.runner({"periodic": lambda job: ran.append(job.job_id)}, schedules=[every_minute]) for _ in range(3)
    ]
    before = datetime.now(UTC)
    for worker in workers:
        worker.run_until_idle()
    jobs = schedule_jobs(engine)
    latest = every_minute.slots(before - timedelta(minutes=1), 1)[0]
    assert len(jobs) in (2, 3), jobs  # 3 only when a minute turned during the test
    assert jobs[every_minute.job_id_for(latest)][0] in ("settled", "running", "queued")
    assert ran.count(every_minute.job_id_for(latest)) <= 1
    upcoming = [job_id for job_id, (state, _) in jobs.items() if state == "delayed"]
    assert len(upcoming) == 1 and present(read(engine, upcoming[0]).run_at) > before
    assert ran, "the latest slot did not run"
    assert len(ran) == len(set(ran)), "a slot ran twice"


def test_a_runner_keeps_a_slot_enqueued_with_other_contents(engine: Engine, runners: Any) -> None:
    """After a deploy that changed a schedule, its already enqueued next slot
    conflicts: the runner keeps it as it is, and goes on serving."""
    old = Schedule("report", "0 0 1 1 *", "periodic", payload={"v": 1}, catch_up=0)
    new = Schedule("report", "0 0 1 1 *", "periodic", payload={"v": 2}, catch_up=0)
    upcoming = old.next_slot(datetime.now(UTC))
    Watchdog(engine).enqueue(old.job_for(upcoming))
    worker = runners.runner({"periodic": lambda job: None, "other": lambda job: None}, schedules=[new])
    Watchdog(engine).enqueue(Job("other-1", "other"))
    settled = worker.run_until_idle()
    assert [job.job_id for job in settled] == ["other-1"]
    assert schedule_jobs(engine) == {old.job_id_for(upcoming): ("delayed", '{"v":1}')}


def test_a_runner_plans_its_schedules_by_its_own_clock(engine: Engine, runners: Any) -> None:
    """A runner given a clock (a test's fake one) plans by it, not by the
    machine's: the slots enqueued are those around the clock's time."""
    fake_now = utc(2031, 5, 17, 10, 20)
    hourly = Schedule("hourly", "0 * * * *", "periodic", catch_up=1)
    worker = runners.runner(
        {"other": lambda job: None}, schedules=[hourly], clock=lambda: int(fake_now.timestamp() * 1000)
    )
    Watchdog(engine).enqueue(Job("other-1", "other"))
    worker.run_until_idle()
    assert sorted(schedule_jobs(engine)) == [
        hourly.job_id_for(utc(2031, 5, 17, 10, 0)),  # the latest slot at the clock's time (catch_up=1)
        hourly.job_id_for(utc(2031, 5, 17, 11, 0)),  # and the next one, ahead
    ]


def test_a_runner_refuses_schedules_that_are_not_schedules(engine: Engine) -> None:
    from sqlalchemy_watchdog import Runner

    with pytest.raises(InvalidJob) as refused:
        Runner(engine, {"q": lambda job: None}, schedules=["* * * * *"])  # type: ignore[list-item]
    assert refused.value.field == "schedules"


# -- every IANA zone: slots do not depend on where they are computed from ---------------------------

#: Wall-clock expressions (steps, ranges, every minute of some hours) and fixed-time ones.
PROPERTY_CRONS = (
    "0 */2 * * *",
    "*/15 * * * *",
    "0 * * * *",
    "30 */3 * * *",
    "30 2 * * *",
    "0 1,2,3 * * *",
    "45 0-4 * * *",
    "0 0 * * *",
)
ONE_SECOND = timedelta(seconds=1)
#: The years whose transitions are checked.
FIRST_YEAR, LAST_YEAR = 1970, 2037


def _offset(zone: ZoneInfo, epoch: int) -> timedelta:
    offset = datetime.fromtimestamp(epoch, zone).utcoffset()
    assert offset is not None
    return offset


@functools.cache
def zone_transitions(name: str) -> tuple[datetime, ...]:
    """The instants (UTC, to the second) at which ``name``'s UTC offset
    changes between FIRST_YEAR and LAST_YEAR: offsets sampled every 3
    days (a change undone within 3 days may be missed), each change
    narrowed down by bisection."""
    zone = ZoneInfo(name)
    begin = int(datetime(FIRST_YEAR, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(LAST_YEAR + 1, 1, 1, tzinfo=UTC).timestamp())
    step = 3 * 86400
    found = []
    previous = _offset(zone, begin)
    for t in range(begin + step, end, step):
        offset = _offset(zone, t)
        if offset != previous:
            low, high = t - step, t  # offset(low) == previous != offset(high)
            while high - low > 1:
                middle = (low + high) // 2
                if _offset(zone, middle) == previous:
                    low = middle
                else:
                    high = middle
            found.append(datetime.fromtimestamp(high, UTC))
            previous = offset
    return tuple(found)


def _matches(cron: str, wall: datetime) -> bool:
    """An independent matcher for PROPERTY_CRONS (minute and hour fields; the rest ``*``)."""

    def field(text: str, value: int) -> bool:
        for part in text.split(","):
            if part.startswith("*/"):
                if value % int(part[2:]) == 0:
                    return True
            elif part == "*":
                return True
            elif "-" in part:
                low, high = map(int, part.split("-"))
                if low <= value <= high:
                    return True
            elif int(part) == value:
                return True
        return False

    minute, hour = cron.split()[:2]
    return wall.second == 0 and field(minute, wall.minute) and field(hour, wall.hour)


def oracle_slots(cron: str, zone: ZoneInfo, begin: datetime, end: datetime) -> list[datetime]:
    """The slots in ``(begin, end]`` by the rules of Schedule, by brute
    force: every instant at which the wall clock shows a matching whole
    minute (a fixed-time expression: the first such instant; a matching
    time the clock skips: the first whole minute after the jump)."""
    minute, hour = cron.split()[:2]
    fixed = not minute.startswith("*") and not hour.startswith("*")
    readings: dict[datetime, list[datetime]] = {}
    t = (begin - timedelta(days=1)).replace(second=0, microsecond=0)
    while t <= end + timedelta(days=1):
        # The instant near t whose reading is a whole minute (offsets may hold seconds).
        instant = t - timedelta(seconds=_offset(zone, int(t.timestamp())).seconds % 60)
        wall = instant.astimezone(zone).replace(tzinfo=None)
        if wall.second == 0 and _matches(cron, wall):
            readings.setdefault(wall, []).append(instant)
        t += timedelta(minutes=1)
    slots: set[datetime] = set()
    for instants in readings.values():
        slots.update(instants[:1] if fixed else instants)
    if fixed:
        wall = begin.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0) - timedelta(hours=12)
        last = end.astimezone(zone).replace(tzinfo=None) + timedelta(hours=12)
        while wall <= last:
            if _matches(cron, wall) and wall not in readings:
                slots.add(_first_minute_after_jump(zone, wall))
            wall += timedelta(minutes=1)
    return sorted(slot for slot in slots if begin < slot <= end)


def _first_minute_after_jump(zone: ZoneInfo, wall: datetime) -> datetime:
    """The instant of the first whole wall-clock minute after ``wall`` that exists."""
    probe = wall
    while True:
        probe += timedelta(minutes=1)
        instant = probe.replace(tzinfo=zone).astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == probe:
            return instant


def check_start_independence(name: str, cron: str, transition: datetime, starts: list[timedelta]) -> None:
    """From every start near ``transition``, the next slots are those of the
    one sequence enumerated from a day before it."""
    schedule = Schedule("s", cron, "q", timezone=name)
    anchor = transition - timedelta(days=1)
    sequence = schedule.slots(anchor, 160)  # 40 hours of the densest expression
    assert sequence == sorted(set(sequence)), (name, cron, transition)
    for shift in starts:
        start = transition + shift
        expected = [slot for slot in sequence if slot > start][:3]
        assert len(expected) == 3, (name, cron, transition, shift)
        assert schedule.slots(start, 3) == expected, (name, cron, transition.isoformat(), shift)


def test_the_chatham_slot_after_the_switch_is_kept_whenever_it_is_planned() -> None:
    """Pacific/Chatham's clocks jump from 02:45 (+12:45) to 03:45 (+13:45):
    04:00 local is a slot, planned before or after the jump (cronsim alone
    skips it when it starts after the jump)."""
    schedule = Schedule("chatham", "0 */2 * * *", "q", timezone="Pacific/Chatham")
    for start in (utc(2023, 9, 23, 13, 59), utc(2023, 9, 23, 14, 1), utc(2023, 9, 23, 14, 14)):
        assert stamps(schedule.slots(start, 2)) == ["2023-09-23 14:15Z", "2023-09-23 16:15Z"], start
    jobs, next_at = plan([schedule], utc(2023, 9, 23, 14, 1))
    assert next_at == utc(2023, 9, 23, 14, 15)
    assert schedule.job_id_for(utc(2023, 9, 23, 14, 15)) in [job.job_id for job in jobs]


@given(
    # Every zone; the two whose clocks jump off the hour or by half an hour more often.
    name=st.one_of(
        st.sampled_from(["Pacific/Chatham", "Australia/Lord_Howe"]),
        st.sampled_from(sorted(zoneinfo.available_timezones())),
    ),
    cron=st.sampled_from(PROPERTY_CRONS),
    pick=st.integers(min_value=0),
    shift=st.integers(min_value=-3 * 3600, max_value=5 * 3600),
)
@settings(max_examples=150, deadline=None)
def test_slots_are_the_same_whichever_instant_they_are_computed_from_in_every_zone(
    name: str, cron: str, pick: int, shift: int
) -> None:
    transitions = zone_transitions(name)
    assume(transitions)
    transition = transitions[pick % len(transitions)]
    check_start_independence(name, cron, transition, [timedelta(seconds=shift), -ONE_SECOND, ONE_SECOND])
    # And they are the right ones: those a brute-force reading of the wall clock finds.
    zone = ZoneInfo(name)
    begin, end = transition - timedelta(hours=6), transition + timedelta(hours=6)
    schedule = Schedule("s", cron, "q", timezone=name)
    found = [slot for slot in schedule.slots(begin, 60) if slot <= end]
    assert found == oracle_slots(cron, zone, begin, end), (name, cron, transition.isoformat())


@pytest.mark.slow  # every zone, every transition 1970-2037 (run by CI, or with WATCHDOG_SLOW_TESTS=1)
def test_slots_are_the_same_whichever_instant_they_are_computed_from_at_every_transition_of_every_zone() -> None:
    """Every kind of transition of every zone: transitions alike in their
    offsets before and after and their local time of day (the expressions
    here do not look at the date) are checked once."""
    seen: set[tuple[Any, ...]] = set()
    starts = [timedelta(minutes=m) for m in (-61, -1, 0, 1, 14, 16, 46, 61, 121)]
    for name in sorted(zoneinfo.available_timezones()):
        zone = ZoneInfo(name)
        for transition in zone_transitions(name):
            before = (transition - ONE_SECOND).astimezone(zone)
            kind = (before.utcoffset(), transition.astimezone(zone).utcoffset(), before.time())
            if kind in seen:
                continue
            seen.add(kind)
            for cron in ("0 */2 * * *", "30 2 * * *", "*/15 * * * *", "0 * * * *"):
                check_start_independence(name, cron, transition, starts)
