"""The opt-in payload codec: richer values in, canonical JSON stored."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import re
import uuid
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from sqlalchemy_watchdog import (
    EncryptedJSON,
    EnqueueStatus,
    InvalidJob,
    Job,
    Outcome,
    PayloadCodec,
    Runner,
    RunningJob,
    TaggedJSON,
    Watchdog,
    task,
)
from sqlalchemy_watchdog.cli import main as cli_main
from sqlalchemy_watchdog.codecs import is_encrypted
from sqlalchemy_watchdog.core.handlers import HandlerRegistry
from sqlalchemy_watchdog.web import create_app
from tests.helpers import present, stable_repr
from tests.runner_kinds import RunnerDriver

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


# -- EncryptedJSON: payloads and results the database cannot read ------------------------

#: Fixed keys (Fernet.generate_key() makes such): the old one, and the one put first after it.
OLD_KEY = base64.urlsafe_b64encode(b"o" * 32).decode("ascii")
NEW_KEY = base64.urlsafe_b64encode(b"n" * 32).decode("ascii")
OTHER_KEY = base64.urlsafe_b64encode(b"x" * 32).decode("ascii")
SECRET = "4111-1111-1111-1111"
SECRET_PAYLOAD = {"card": SECRET, "amount": Decimal("19.90"), "at": datetime.datetime(2025, 3, 1, tzinfo=UTC)}


def encrypted(*keys: str) -> EncryptedJSON:
    return EncryptedJSON(list(keys), inner=TaggedJSON())


def raw_columns(engine: Engine, job_id: str) -> tuple[str, str | None]:
    """``payload_json`` and ``result_json`` as the database holds them."""
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT payload_json, result_json FROM watchdog_jobs WHERE job_id = :job_id"), {"job_id": job_id}
        ).one()
    return row[0], row[1]


def test_an_encrypted_job_round_trips_through_a_runner_and_the_row_holds_no_plaintext(
    engine: Engine, runners: RunnerDriver
) -> None:
    codec = encrypted(NEW_KEY)
    seen: list[Any] = []

    def charge(job: RunningJob) -> Any:
        seen.append(job.payload)
        return {"receipt": SECRET[::-1], "charged": job.payload["amount"]}

    watchdog = Watchdog(engine)
    assert (
        watchdog.enqueue(Job("charge-1", "charges", codec=codec, payload=SECRET_PAYLOAD)).status is EnqueueStatus.QUEUED
    )
    runners.runner({"charges": charge}, codec=codec).run_until_idle()
    assert seen == [SECRET_PAYLOAD]
    assert watchdog.result("charge-1", codec=codec).unwrap() == {"receipt": SECRET[::-1], "charged": Decimal("19.90")}
    payload_json, result_json = raw_columns(engine, "charge-1")
    assert result_json is not None
    for stored in (payload_json, result_json):
        assert is_encrypted(json.loads(stored)), stored
        for plain in (SECRET, SECRET[::-1], "19.90", "card", "receipt", NEW_KEY):
            assert plain not in stored
    # A standard Fernet token: cryptography's own Fernet opens it.
    token = json.loads(payload_json)["$encrypted"]
    assert json.loads(Fernet(NEW_KEY).decrypt(token))["card"] == SECRET


def test_a_task_with_the_encrypting_codec_carries_its_arguments_and_result_encrypted(engine: Engine) -> None:
    registry = HandlerRegistry()

    @task("billing", codec=encrypted(NEW_KEY), registry=registry)
    def invoice(card: str, amount: Decimal) -> dict[str, object]:
        return {"receipt": card[::-1], "amount": amount * 2}

    with Session(engine) as session:
        invoice.enqueue(session, card=SECRET, amount=Decimal("9.95"), job_id="inv-1")
        session.commit()
    Runner(engine, registry.handlers()).run_until_idle()
    assert invoice.result(Watchdog(engine), "inv-1").unwrap() == {"receipt": SECRET[::-1], "amount": Decimal("19.90")}
    payload_json, result_json = raw_columns(engine, "inv-1")
    assert result_json is not None
    for stored in (payload_json, result_json):
        assert is_encrypted(json.loads(stored)) and SECRET not in stored and SECRET[::-1] not in stored


def test_an_identical_replay_of_an_encrypted_job_is_a_duplicate(engine: Engine) -> None:
    """Encryption is deterministic under one key: enqueueing the same job
    again (a retry after a lost commit) stays a no-op, not a conflict."""
    watchdog = Watchdog(engine)
    first = Job("charge-1", "charges", codec=encrypted(NEW_KEY, OLD_KEY), payload=SECRET_PAYLOAD)
    again = Job("charge-1", "charges", codec=encrypted(NEW_KEY), payload=dict(SECRET_PAYLOAD))
    assert first.payload_json == again.payload_json
    assert watchdog.enqueue(first).status is EnqueueStatus.QUEUED
    assert watchdog.enqueue(again).status is EnqueueStatus.DUPLICATE
    other = Job("charge-2", "charges", codec=encrypted(NEW_KEY), payload={**SECRET_PAYLOAD, "card": "other"})
    assert other.payload_json != first.payload_json


def test_a_job_enqueued_under_an_old_key_runs_after_a_new_key_is_put_first(
    engine: Engine, runners: RunnerDriver
) -> None:
    watchdog = Watchdog(engine)
    watchdog.enqueue(Job("charge-1", "charges", codec=encrypted(OLD_KEY), payload=SECRET_PAYLOAD))
    rotated = encrypted(NEW_KEY, OLD_KEY)
    seen: list[Any] = []

    def report(job: RunningJob) -> str:
        seen.append(job.payload)
        return "done"

    runners.runner({"charges": report}, codec=rotated).run_until_idle()
    assert seen == [SECRET_PAYLOAD]
    # The result is encrypted with the newest key: the new key alone reads it.
    assert watchdog.result("charge-1", codec=encrypted(NEW_KEY)).unwrap() == "done"
    with pytest.raises(ValueError, match="EncryptedJSON cannot decrypt"):
        encrypted(OLD_KEY).decode(json.loads(raw_columns(engine, "charge-1")[1] or "null"))


def test_reencrypt_moves_a_stored_value_to_the_newest_key() -> None:
    stored = encrypted(OLD_KEY).encode(SECRET_PAYLOAD)
    moved = encrypted(NEW_KEY, OLD_KEY).reencrypt(stored)
    assert is_encrypted(moved) and moved != stored
    assert encrypted(NEW_KEY).decode(moved) == SECRET_PAYLOAD
    assert moved == encrypted(NEW_KEY).encode(SECRET_PAYLOAD)  # as a replay under the new key encodes it


@pytest.mark.parametrize("damage", ["wrong key", "tampered token", "not encrypted"])
def test_a_payload_the_runner_cannot_decrypt_fails_the_job_with_a_reason_naming_the_codec(
    engine: Engine, runners: RunnerDriver, damage: str
) -> None:
    watchdog = Watchdog(engine)
    job = Job("charge-1", "charges", codec=encrypted(OLD_KEY), payload=SECRET_PAYLOAD)
    if damage == "tampered token":
        token = job.payload["$encrypted"]
        middle = len(token) // 2
        flipped = "A" if token[middle] != "A" else "B"
        job = Job("charge-1", "charges", payload={"$encrypted": token[:middle] + flipped + token[middle + 1 :]})
    elif damage == "not encrypted":
        job = Job("charge-1", "charges", codec=TaggedJSON(), payload=SECRET_PAYLOAD)
    watchdog.enqueue(job)
    ran: list[Any] = []
    keys = (NEW_KEY, OTHER_KEY) if damage == "wrong key" else (OLD_KEY,)
    runners.runner({"charges": ran.append}, codec=encrypted(*keys)).run_until_idle()
    assert ran == []
    failed = present(watchdog.read("charge-1"))
    assert failed.outcome is Outcome.FAILED and failed.attempt == 1
    reason = failed.failure_reason or ""
    assert reason.startswith("payload could not be decoded: ValueError: EncryptedJSON"), reason
    if damage == "not encrypted":
        assert "not encrypted" in reason
    else:
        assert "none of its" in reason and "opens the token" in reason
    for text_kept in (reason, failed.failure_detail or ""):
        for secret in (SECRET, "19.90", OLD_KEY, NEW_KEY, OTHER_KEY):
            assert secret not in text_kept


def test_a_result_the_inner_codec_refuses_fails_the_job_without_quoting_the_value(
    engine: Engine, runners: RunnerDriver
) -> None:
    """The refusal of a result is a failure reason, stored in the clear: it
    names the inner codec and the error's type, not the message that quotes
    the value (TaggedJSON's names the naive datetime)."""
    codec = encrypted(NEW_KEY)
    watchdog = Watchdog(engine)
    watchdog.enqueue(Job("charge-1", "charges", codec=codec, payload=SECRET_PAYLOAD))
    naive = datetime.datetime(2031, 7, 9, 4, 5, 6)
    runners.runner({"charges": lambda job: {"at": naive}}, codec=codec).run_until_idle()
    failed = present(watchdog.read("charge-1"))
    assert failed.outcome is Outcome.FAILED and failed.result is None
    assert failed.failure_reason == (
        "the handler's result: EncryptedJSON's inner codec TaggedJSON refused the value "
        "(InvalidJob; message not shown: it may quote the value)"
    )
    assert "2031" not in (failed.failure_detail or "")


def test_an_inner_codec_that_fails_after_decryption_does_not_quote_the_value() -> None:
    codec = EncryptedJSON([NEW_KEY], inner=TaggedJSON())
    stored = EncryptedJSON([NEW_KEY]).encode({"$decimal": SECRET})  # decrypts to a tag TaggedJSON refuses
    with pytest.raises(ValueError) as refused:
        codec.decode(stored)
    assert "inner codec TaggedJSON" in str(refused.value) and SECRET not in str(refused.value)


def test_the_codecs_repr_names_no_key() -> None:
    codec = encrypted(NEW_KEY, OLD_KEY)
    assert repr(codec) == "EncryptedJSON(<2 keys>, inner=TaggedJSON())"
    assert isinstance(codec, PayloadCodec)


def _encrypted_job(engine: Engine) -> None:
    """charge-1 settled with an encrypted payload and result."""
    codec = encrypted(NEW_KEY)
    Watchdog(engine).enqueue(Job("charge-1", "charges", codec=codec, payload=SECRET_PAYLOAD))
    Runner(engine, {"charges": lambda job: {"receipt": SECRET}}, codec=codec).run_until_idle()
    assert present(Watchdog(engine).read("charge-1")).outcome is Outcome.COMPLETED


def test_the_dashboard_shows_encrypted_payloads_and_results_as_encrypted(engine: Engine) -> None:
    _encrypted_job(engine)
    token = present(Watchdog(engine).read("charge-1")).payload["$encrypted"]
    with TestClient(create_app(engine)) as client:
        page = client.get("/job", params={"job_id": "charge-1"})
    assert page.status_code == 200
    assert '<pre class="payload">[encrypted]</pre>' in page.text
    assert '<pre class="result">[encrypted]</pre>' in page.text
    assert SECRET not in page.text and token[:40] not in page.text


def test_the_cli_shows_encrypted_payloads_and_results_as_encrypted(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    _encrypted_job(engine)
    token = present(Watchdog(engine).read("charge-1")).payload["$encrypted"]
    url = engine.url.render_as_string(hide_password=False)
    outputs: dict[str, str] = {}
    for command in (["show", "charge-1"], ["show", "charge-1", "--json"], ["ls", "--json"]):
        capsys.readouterr()
        assert cli_main(["--url", url, *command]) == 0
        outputs[" ".join(command)] = capsys.readouterr().out
    for shown in outputs.values():
        assert SECRET not in shown and token[:40] not in shown
    assert re.search(r"^payload +\[encrypted\]$", outputs["show charge-1"], re.MULTILINE)
    assert re.search(r"^result +\[encrypted\]$", outputs["show charge-1"], re.MULTILINE)
    shown_json = json.loads(outputs["show charge-1 --json"])
    assert (shown_json["payload"], shown_json["result"]) == ("[encrypted]", "[encrypted]")
    listed = [json.loads(line) for line in outputs["ls --json"].splitlines() if line.strip()]
    assert [row["payload"] for row in listed] == ["[encrypted]"]
