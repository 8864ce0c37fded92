"""Durable steps and sleeps as values: what a job's attempts finished (revision w0021).

See :meth:`RunningJob.step <sqlalchemy_watchdog.RunningJob.step>` and
docs/howto/durable-steps.md.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .validation import check_text

__all__ = ["STEP_NAME_MAX_LENGTH", "JobStep", "StepKind", "check_step_name"]

#: The longest step name accepted, in characters (a CHECK of ``watchdog_job_steps`` holds it too).
STEP_NAME_MAX_LENGTH = 256


class StepKind(str, enum.Enum):
    """What a recorded step is (``watchdog_job_steps.kind``)."""

    #: ``job.step(name, fn)``: ``fn`` returned; its result is kept.
    STEP = "step"
    #: ``job.sleep(...)``: the job sleeps until ``wake_at``.
    SLEEP = "sleep"


@dataclass(frozen=True, slots=True)
class JobStep:
    """A finished step of a job, as recorded (``Watchdog.steps``, ``show``)."""

    name: str
    kind: StepKind
    #: The step's result as stored (canonical JSON, after the runner's codec); None: ``None``.
    result_json: str | None
    #: A sleep's end (database clock); None for a step.
    wake_at: datetime | None
    #: The attempt that recorded it.
    attempt: int
    #: When it was recorded (database clock); None where it was not read back.
    recorded_at: datetime | None

    @property
    def result(self) -> Any:
        """The step's result as stored (JSON decoded, the codec not applied)."""
        return None if self.result_json is None else json.loads(self.result_json)


def check_step_name(name: object) -> str:
    """``name`` if it is a usable step name (1-256 characters, no NUL), else
    :class:`~sqlalchemy_watchdog.InvalidJob` naming ``name``."""
    return check_text("name", name, STEP_NAME_MAX_LENGTH)
