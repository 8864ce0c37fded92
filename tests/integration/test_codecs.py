"""The opt-in payload codec: richer values in, canonical JSON stored."""

from __future__ import annotations

import dataclasses
import datetime
import json
import uuid
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine

from sqlalchemy_watchdog import EnqueueStatus, InvalidJob, Job, PayloadCodec, TaggedJSON, Watchdog
from tests.helpers import stable_repr

UTC = datetime.UTC
codec = TaggedJSON()


@dataclasses.dataclass
class Line:
    sku: str
    amount: Decimal


class PydanticLike:
    """Anything with ``model_dump`` is encoded as its dict (pydantic v2's API)."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    def model_dump(self) -> dict[str, Any]:
        return dict(self.fields)


VALUES: list[Any] = [
    datetime.datetime(2025, 3, 1, 9, 30, tzinfo=UTC),
    datetime.datetime(2025, 3, 1, 9, 30, 0, 123456, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
    datetime.date(2025, 3, 1),
    Decimal("19.90"),
    Decimal("-1E+3"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    {"nested": [Decimal("0.1"), {"when": datetime.date(2000, 1, 1)}]},
    {"$date": "not a tag: an application dict"},
    {"$dict": {"$uuid": 1}},
    [None, True, 1, 1.5, "s"],
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_tagged_json_round_trips_through_canonical_json(value: Any) -> None:
    job = Job("j", "q", codec=codec, payload=value)
    stored = json.loads(job.payload_json)
    assert stored == job.payload  # what the Job holds is the JSON form
    decoded = codec.decode(stored)
    assert decoded == value and type(decoded) is type(value)


def test_decoded_datetimes_keep_the_instant_and_the_offset() -> None:
    local = datetime.datetime(2025, 7, 1, 12, 0, tzinfo=ZoneInfo("Europe/Paris"))
    decoded = codec.decode(codec.encode(local))
    assert decoded == local and decoded.utcoffset() == datetime.timedelta(hours=2)


def test_dataclasses_and_models_encode_to_their_dict() -> None:
    payload = {"line": Line("ab-1", Decimal("2.50")), "customer": PydanticLike(id=uuid.UUID(int=7), vip=True)}
    job = Job("j", "q", codec=codec, payload=payload)
    assert codec.decode(job.payload) == {
        "line": {"sku": "ab-1", "amount": Decimal("2.50")},
        "customer": {"id": uuid.UUID(int=7), "vip": True},
    }


def test_tagged_json_is_a_payload_codec() -> None:
    assert isinstance(codec, PayloadCodec)


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (datetime.datetime(2025, 3, 1, 9, 30), "naive datetime"),
        ({"at": [datetime.datetime(2025, 3, 1)]}, "naive datetime"),
        (Decimal("NaN"), "non-finite"),
        (Decimal("-Infinity"), "non-finite"),
        ({1, 2}, "set"),
        (b"raw", "bytes"),
        (object(), "object"),
        (datetime.time(12, 0), "time"),
        ({"f": float("nan")}, "strict JSON"),  # the Job's own checks still apply
        ({1: "int key"}, "keys must be str"),
    ],
    ids=stable_repr,
)
def test_what_the_codec_refuses_is_invalid_payload(payload: Any, says: str) -> None:
    with pytest.raises(InvalidJob) as refused:
        Job("j", "q", codec=codec, payload=payload)
    assert refused.value.field == "payload" and says in str(refused.value)


def test_deep_or_cyclic_values_are_refused_without_recursion_errors() -> None:
    deep: Any = Decimal(1)
    for _ in range(100_000):
        deep = [deep]
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    for payload in (deep, cyclic):
        with pytest.raises(InvalidJob, match="payload: must nest at most 64 levels"):
            Job("j", "q", codec=codec, payload=payload)


def test_a_codec_that_is_not_one_or_that_fails_is_bad_input() -> None:
    with pytest.raises(InvalidJob) as refused:
        Job("j", "q", codec=json, payload=1)  # type: ignore[arg-type]
    assert refused.value.field == "codec"

    class Broken:
        def encode(self, value: Any) -> Any:
            raise TypeError("no thanks")

        def decode(self, value: Any) -> Any:
            return value

    with pytest.raises(InvalidJob, match="payload: Broken.encode failed: TypeError: no thanks"):
        Job("j", "q", codec=Broken(), payload=1)


def test_the_codec_is_not_part_of_the_jobs_identity(engine: Engine) -> None:
    """A job built with the codec and one built from the same JSON by hand
    are the same job: equal, and the second enqueue is a duplicate."""
    at = datetime.datetime(2025, 3, 1, 9, 30, tzinfo=UTC)
    with_codec = Job("j", "q", codec=codec, payload={"at": at, "n": Decimal("1.0")})
    by_hand = Job("j", "q", payload={"n": {"$decimal": "1.0"}, "at": {"$datetime": at.isoformat()}})
    assert with_codec == by_hand and with_codec.payload_json == by_hand.payload_json
    watchdog = Watchdog(engine)
    assert watchdog.enqueue(with_codec).status is EnqueueStatus.QUEUED
    assert watchdog.enqueue(by_hand).status is EnqueueStatus.DUPLICATE
    stored = watchdog.read("j")
    assert stored is not None and codec.decode(stored.payload) == {"at": at, "n": Decimal("1.0")}
