"""The columns of ``watchdog_jobs`` are declared once (``columns.JOB_COLUMNS``):
the selected columns, the view, the enqueue identity and JobView follow it."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from sqlalchemy_watchdog import Job, JobView, RetryPolicy, columns
from sqlalchemy_watchdog.columns import FILLED_ELSEWHERE, JOB_COLUMNS, NOT_READ, ReadAs, position
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.store import base, sql


def test_every_column_of_the_table_is_read_or_declared_not_read() -> None:
    read = [spec.column for spec in JOB_COLUMNS]
    assert len(read) == len(set(read)), "a column declared twice"
    assert set(read).isdisjoint(NOT_READ)
    assert set(read) | set(NOT_READ) == set(jobs_table.c.keys())


def test_every_jobview_field_is_filled_by_exactly_one_column_or_named_elsewhere() -> None:
    filled = [spec.field for spec in JOB_COLUMNS if spec.field is not None]
    assert len(filled) == len(set(filled)), "a JobView field filled by two columns"
    assert set(filled).isdisjoint(FILLED_ELSEWHERE)
    assert set(filled) | set(FILLED_ELSEWHERE) == {field.name for field in dataclasses.fields(JobView)}


def test_the_statements_select_the_declared_columns_in_order() -> None:
    assert tuple(column.key for column in sql.COLUMNS) == columns.column_names()
    assert [position(spec.column) for spec in JOB_COLUMNS] == list(range(len(JOB_COLUMNS)))


def test_the_enqueue_identity_is_the_declared_identity_columns_from_job_attributes() -> None:
    identity = [spec for spec in JOB_COLUMNS if spec.identity is not None]
    assert [name for name, _ in sql.IDENTITY_FIELDS] == [spec.column for spec in identity]
    job = Job("the-job", "the-queue", payload={"n": 1}, priority=3, key="k", retry=RetryPolicy(max_attempts=2))
    values = dict(zip((spec.column for spec in identity), base_values(job), strict=True))
    assert values["job_id"] == "the-job"
    assert values["queue_name"] == "the-queue"
    assert values["priority"] == 3
    assert values["limit_key"] == "k"
    assert values["max_attempts"] == 2
    assert values["payload_json"] == job.payload_json


def base_values(job: Job) -> tuple[object, ...]:
    """The enqueue's values of ``job`` (``store.enqueue`` the module: the
    package's ``store.enqueue`` is the operation)."""
    return importlib.import_module("sqlalchemy_watchdog.store.enqueue")._values(job)  # type: ignore[no-any-return]


def _row(**stored: object) -> tuple[object, ...]:
    defaults: dict[str, object] = {
        "sequence": 7, "job_id": "j", "queue_name": "q", "lane": "q", "priority": 0,
        "payload_json": '{"a":1}', "recovery_max": None, "state": "queued", "outcome": None,
        "claim_token": None, "recovery_count": 0, "cancellation_id": None, "failure_reason": None,
        "failure_detail": None, "lease_until": None, "run_at": None, "ready_at": None, "attempt": 1,
        "max_attempts": None, "retry_policy": None, "timeout_ms": None, "snoozes": 0,
        "failure_history": None, "enqueued_at": 1_700_000_000_000, "started_at": None,
        "settled_at": None, "rerun_of": None, "trace_context": None, "limit_key": None,
        "result_json": None, "progress": None, "progress_note": None, "waiting_on": None,
        "after_policy": None,
    }  # fmt: skip
    defaults.update(stored)
    return tuple(defaults[name] for name in columns.column_names())


def test_a_row_reads_into_its_view_by_the_declarations() -> None:
    job = base.view(_row(timeout_ms=1500, max_attempts=3, run_at=1_700_000_001_000, limit_key="k"))
    assert job.sequence == 7 and job.queue == "q" and job.payload == {"a": 1} and job.key == "k"
    assert job.timeout is not None and job.timeout.total_seconds() == 1.5
    assert job.retry is not None and job.retry.max_attempts == 3
    assert job.run_at is not None and job.run_at.timestamp() == 1_700_000_001
    assert job.undecodable == () and job.parents == () and job.held_by is None


@pytest.mark.parametrize(
    ("column", "stored", "field", "reads_as"),
    [
        ("payload_json", "{not json", "payload", "itself"),
        ("result_json", "[1,", "result", "itself"),
        ("failure_history", "nope", "failure_history", ()),
        ("trace_context", "{", "trace_context", None),
        ("retry_policy", "{", "retry", "default"),
    ],
)
def test_an_undecodable_value_reads_as_its_kind_says_and_is_listed(
    column: str, stored: str, field: str, reads_as: object
) -> None:
    spec = next(spec for spec in JOB_COLUMNS if spec.column == column)
    assert spec.read_as is not ReadAs.STORED
    job = base.view(_row(**{column: stored, "max_attempts": 4}))
    [unknown] = job.undecodable
    assert (unknown.field, unknown.column) == (field, column)
    value = getattr(job, field)
    if reads_as == "itself":
        assert value is unknown
    elif reads_as == "default":
        assert value is not None and value.max_attempts == 4
    else:
        assert value == reads_as
