"""`Job` refuses bad input before any SQL runs, with an error naming the field."""

from __future__ import annotations

import dataclasses
import json
import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sqlalchemy_watchdog import InvalidJob, Job, WatchdogError
from sqlalchemy_watchdog.errors import ErrorCode
from sqlalchemy_watchdog.jobs import PAYLOAD_MAX_BYTES, PAYLOAD_MAX_DEPTH
from tests.helpers import stable_repr

MAX_LENGTHS = {"job_id": 256, "queue": 256, "lane": 512}


def job_with(field: str, value: Any) -> Job:
    fields: dict[str, Any] = {"job_id": "job-1", "queue": "emails"}
    fields[field] = value
    return Job(fields.pop("job_id"), fields.pop("queue"), **fields)


def refused(field: str, value: Any) -> InvalidJob:
    with pytest.raises(InvalidJob) as caught:
        job_with(field, value)
    return caught.value


# -- the error type ------------------------------------------------------------


def test_invalid_job_is_a_watchdog_error_and_a_value_error() -> None:
    assert issubclass(InvalidJob, WatchdogError)
    assert issubclass(InvalidJob, ValueError)
    error = refused("job_id", "")
    assert error.code is ErrorCode.INVALID_INPUT
    assert error.field == "job_id"
    assert str(error).startswith("job_id:")


# -- ids -----------------------------------------------------------------------


@pytest.mark.parametrize("field", sorted(MAX_LENGTHS))
def test_empty_id_is_refused_naming_the_field(field: str) -> None:
    error = refused(field, "")
    assert error.field == field
    assert field in str(error)


@pytest.mark.parametrize("field", sorted(MAX_LENGTHS))
def test_over_long_id_is_refused_naming_the_field(field: str) -> None:
    error = refused(field, "x" * (MAX_LENGTHS[field] + 1))
    assert error.field == field
    assert str(MAX_LENGTHS[field]) in str(error)


@pytest.mark.parametrize("field", sorted(MAX_LENGTHS))
def test_id_length_is_counted_in_characters_not_bytes(field: str) -> None:
    longest = "é" * MAX_LENGTHS[field]  # 2 bytes each in UTF-8
    assert getattr(job_with(field, longest), field) == longest
    emoji = "😀" * MAX_LENGTHS[field]  # 4 bytes each in UTF-8
    assert getattr(job_with(field, emoji), field) == emoji
    assert refused(field, emoji + "😀").field == field


@pytest.mark.parametrize("field", sorted(MAX_LENGTHS))
@pytest.mark.parametrize("value", [42, b"job-1", 1.5, ["a"]])
def test_non_str_id_is_refused_naming_the_field(field: str, value: Any) -> None:
    assert refused(field, value).field == field


@pytest.mark.parametrize("field", ["job_id", "queue"])
def test_none_job_id_or_queue_is_refused(field: str) -> None:
    assert refused(field, None).field == field


@pytest.mark.parametrize("field", sorted(MAX_LENGTHS))
def test_nul_character_in_id_is_refused(field: str) -> None:
    error = refused(field, "a\x00b")
    assert error.field == field
    assert "NUL" in str(error)


@pytest.mark.parametrize("field", sorted(MAX_LENGTHS))
def test_lone_surrogate_in_id_is_refused(field: str) -> None:
    assert refused(field, "a\ud800b").field == field


def test_lane_defaults_to_the_queue() -> None:
    assert Job("job-1", "emails").lane == "emails"
    assert Job("job-1", "emails", lane="team:7").lane == "team:7"
    assert Job("job-1", "emails") == Job("job-1", "emails", lane="emails")


_id_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=256)


@given(job_id=_id_text, queue=_id_text)
def test_any_text_id_within_its_length_is_accepted(job_id: str, queue: str) -> None:
    job = Job(job_id, queue, lane=queue + queue)
    assert (job.job_id, job.queue, job.lane) == (job_id, queue, queue + queue)


# -- priority and max_recoveries -------------------------------------------------


@pytest.mark.parametrize("value", [True, False, 1.0, 1.5, "1", None, 2**63, -(2**63) - 1])
def test_priority_must_be_a_signed_64_bit_int(value: Any) -> None:
    assert refused("priority", value).field == "priority"


@pytest.mark.parametrize("value", [-(2**63), -1, 0, 7, 2**63 - 1])
def test_priority_accepts_the_whole_signed_64_bit_range(value: int) -> None:
    assert job_with("priority", value).priority == value


@pytest.mark.parametrize("value", [-1, True, False, 1.0, "2", 2**31])
def test_max_recoveries_must_be_a_non_negative_int(value: Any) -> None:
    assert refused("max_recoveries", value).field == "max_recoveries"


@pytest.mark.parametrize("value", [None, 0, 3])
def test_max_recoveries_accepts_none_and_non_negative_ints(value: int | None) -> None:
    assert job_with("max_recoveries", value).max_recoveries == value


# -- payload -------------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize(
    "payload",
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        {"nested": [1, float("nan")]},
        b"bytes",
        bytearray(b"bytes"),
        {1, 2},
        frozenset({"a"}),
        {1: "int key"},
        {("tuple",): "key"},
        {"a": {None: 1}},
        Opaque(),
        [Opaque()],
        object(),
        range(3),
        "lone \ud800 surrogate",
    ],
    ids=stable_repr,
)
def test_payload_that_is_not_strict_json_is_refused(payload: Any) -> None:
    assert refused("payload", payload).field == "payload"


@pytest.mark.parametrize(
    "payload",
    [types.MappingProxyType({"a": 1}), 10**5000],
    ids=["mappingproxy", "int-too-long-to-print"],
)
def test_payload_that_json_cannot_encode_is_refused_as_invalid_job(payload: Any) -> None:
    # Not an arbitrary TypeError/ValueError from json.dumps: an InvalidJob naming the field.
    assert refused("payload", payload).field == "payload"


def test_payload_nested_too_deep_is_refused() -> None:
    deep: Any = "leaf"
    for _ in range(PAYLOAD_MAX_DEPTH + 1):
        deep = [deep]
    assert refused("payload", deep).field == "payload"


def test_payload_over_the_size_limit_is_refused() -> None:
    error = refused("payload", "x" * PAYLOAD_MAX_BYTES)
    assert error.field == "payload"
    assert str(PAYLOAD_MAX_BYTES) in str(error)


def test_nested_json_payload_is_accepted() -> None:
    payload = {
        "order": {"id": 7, "lines": [{"sku": "A", "qty": 2, "price": 9.5}], "gift": None},
        "flags": [True, False],
        "note": "ünïcødé 😀",
        "empty": {},
    }
    job = job_with("payload", payload)
    assert job.payload == payload
    assert json.loads(job.payload_json) == payload


def test_payload_text_does_not_depend_on_dict_key_order() -> None:
    a = job_with("payload", {"a": 1, "b": {"x": 1, "y": 2}})
    b = job_with("payload", {"b": {"y": 2, "x": 1}, "a": 1})
    assert a.payload_json == b.payload_json


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_any_strict_json_payload_round_trips_through_its_text(payload: Any) -> None:
    job = Job("job-1", "emails", payload=payload)
    assert json.loads(job.payload_json) == payload
    # The text is canonical: encoding the decoded payload again gives the same text.
    assert Job("job-1", "emails", payload=json.loads(job.payload_json)).payload_json == job.payload_json


@given(json_values)
def test_payload_text_is_the_standard_libraries_canonical_encoding(payload: Any) -> None:
    # The payload encoder reuses one C encoder object (jobs._one_shot_encoder);
    # its text must be exactly what json.dumps gives with the same options, or
    # a replay built by another release would no longer be identical.
    expected = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert Job("job-1", "emails", payload=payload).payload_json == expected


# -- the value itself ------------------------------------------------------------


def test_job_is_frozen() -> None:
    job = Job("job-1", "emails")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.queue = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.priority = 9  # type: ignore[misc]


def test_replace_builds_a_checked_job_with_the_defaults_of_a_new_one() -> None:
    job = Job("job-1", "emails", payload={"a": 1}, priority=3)
    moved = dataclasses.replace(job, queue="sms", lane=None)
    assert (moved.queue, moved.lane, moved.priority, moved.payload_json) == ("sms", "sms", 3, '{"a":1}')
    assert moved == Job("job-1", "sms", payload={"a": 1}, priority=3)
    with pytest.raises(InvalidJob) as raised:
        dataclasses.replace(job, priority=2**63)
    assert raised.value.field == "priority"


def test_every_field_of_a_job_is_set_when_it_is_built() -> None:
    job = Job("job-1", "emails")
    assert {f.name: getattr(job, f.name) for f in dataclasses.fields(job)} == {
        "job_id": "job-1", "queue": "emails", "lane": "emails", "priority": 0, "payload": None,
        "max_recoveries": None, "run_at": None, "retry": None, "timeout": None, "rerun_of": None,
        "key": None, "codec": None, "payload_json": "null", "after": (), "after_policy": "completed",
        "unique_key": None, "unique_for": None, "unique_states": None, "debounce": None, "max_wait": None,
        "throttle": None, "throttle_excess": None, "unique": None,
    }  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class TenantJob(Job):
    tenant: str = "none"


def test_a_dataclass_subclass_of_job_is_checked_and_encoded_like_a_job() -> None:
    job = TenantJob("job-1", "emails", payload={"b": 1, "a": 2}, tenant="acme")
    assert (job.tenant, job.lane, job.payload_json) == ("acme", "emails", '{"a":2,"b":1}')
    assert refused_subclass("queue", lambda: TenantJob("job-1", ""))
    assert refused_subclass("payload", lambda: TenantJob("job-1", "q", payload=float("nan")))


def refused_subclass(field: str, build: Any) -> bool:
    with pytest.raises(InvalidJob) as caught:
        build()
    return caught.value.field == field


def test_jobs_with_equal_fields_are_equal() -> None:
    a = Job("job-1", "emails", priority=2, payload=[1, 2])
    b = Job("job-1", "emails", priority=2, payload=[1, 2])
    assert a == b
    assert a != Job("job-1", "emails", priority=3, payload=[1, 2])


def test_a_built_view_is_a_frozen_jobview_equal_to_one_made_by_its_constructor() -> None:
    """store.view() makes a JobView per claimed job without its __init__
    (jobs.frozen_builder): what it returns is exactly a JobView, equal to and
    hashed like one made by the constructor, frozen, and copied, replaced and
    pickled like any other."""
    import pickle

    from sqlalchemy_watchdog import JobState, JobView
    from sqlalchemy_watchdog.jobs import frozen_builder

    names = tuple(f.name for f in dataclasses.fields(JobView))
    made = JobView(
        sequence=7, job_id="j", queue="q", lane="q", priority=0, payload=("n", 1), max_recoveries=3,
        state=JobState.QUEUED, outcome=None, failure_reason=None, recovery_count=0, cancellation_id=None,
    )  # fmt: skip
    built = frozen_builder(JobView, names)(*(getattr(made, name) for name in names))
    assert type(built) is JobView
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.job_id = "other"  # type: ignore[misc]
    assert dataclasses.replace(built, job_id="k").job_id == "k"
    assert pickle.loads(pickle.dumps(built)) == made
    with pytest.raises(TypeError, match="JobView has the fields"):
        frozen_builder(JobView, names[::-1])


def test_a_built_running_job_is_a_frozen_running_job() -> None:
    """The same for a dataclass without slots (the RunningJob a handler gets)."""
    from sqlalchemy_watchdog import RunningJob
    from sqlalchemy_watchdog.core.handlers import StopSignal
    from sqlalchemy_watchdog.jobs import frozen_builder

    names = tuple(f.name for f in dataclasses.fields(RunningJob))
    made = RunningJob("j", "q", "q", 0, {"n": 1}, 0, None, StopSignal(), attempt=2)
    built = frozen_builder(RunningJob, names)(*(getattr(made, name) for name in names))
    assert type(built) is RunningJob and built == made and vars(built) == vars(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.attempt = 3  # type: ignore[misc]
