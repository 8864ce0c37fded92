"""Durable steps, sleeps, waits and signals as values: what a job's attempts
finished (revision w0021), and the signals sent to it (revision w0022).

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

__all__ = [
    "COMPENSATION_MARK",
    "STEP_NAME_MAX_LENGTH",
    "UNDO_PREFIX",
    "JobSignal",
    "JobStep",
    "SignalResult",
    "SignalStatus",
    "StepKind",
    "check_step_name",
]

#: The longest step name accepted, in characters (a CHECK of ``watchdog_job_steps`` holds it too).
STEP_NAME_MAX_LENGTH = 256
#: What an undo's step name starts with: ``undo:<the step's name>`` (revision w0022).
UNDO_PREFIX = "undo:"
#: The step recovery records (kind ``undo``) when it requeues a job, its
#: recovery budget spent, for one run that compensates rather than settling
#: it ``interrupted`` (revision w0022): ``undo:`` and no step's name after it.
COMPENSATION_MARK = UNDO_PREFIX


class StepKind(str, enum.Enum):
    """What a recorded step is (``watchdog_job_steps.kind``)."""

    #: ``job.step(name, fn)``: ``fn`` returned; its result is kept.
    STEP = "step"
    #: ``job.sleep(...)``: the job sleeps until ``wake_at``.
    SLEEP = "sleep"
    #: ``job.wait_for(name, timeout)``: the job waits for signal ``name`` until
    #: ``wake_at`` (revision w0022). The step's name is the signal's.
    WAIT = "wait"
    #: The undo of step ``<name>`` finished, named ``undo:<name>`` (compensation, revision w0022).
    UNDO = "undo"


@dataclass(frozen=True, slots=True)
class JobStep:
    """A finished step of a job, as recorded (``Watchdog.steps``, ``show``)."""

    name: str
    kind: StepKind
    #: The step's result as stored (canonical JSON, after the runner's codec); None: ``None``.
    result_json: str | None
    #: A sleep's end, or a wait's timeout (database clock); None for a step or an undo.
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


@dataclass(frozen=True, slots=True)
class JobSignal:
    """A signal sent to a job (``Watchdog.signal``; revision w0022), as kept:
    the first one of its name; later ones of the same name change nothing."""

    name: str
    #: Its payload as stored (canonical JSON); ``"null"`` for None.
    payload_json: str
    #: When it was kept (database clock).
    sent_at: datetime

    @property
    def payload(self) -> Any:
        """The payload, JSON decoded."""
        return json.loads(self.payload_json)


class SignalStatus(str, enum.Enum):
    """What :meth:`Watchdog.signal <sqlalchemy_watchdog.Watchdog.signal>` did."""

    #: Kept: the first signal of this name for the job. A job waiting for it
    #: was made due now.
    DELIVERED = "delivered"
    #: A signal of this name was kept already, with the same payload: nothing changed.
    DUPLICATE = "duplicate"
    #: A signal of this name was kept already, with another payload: the
    #: first one stays (``SignalResult.payload_json`` is the kept one), nothing changed.
    CONFLICT = "conflict"
    #: The job is settled: nothing was kept (settled stays final).
    JOB_SETTLED = "job_settled"
    #: No such job (never enqueued, or pruned or purged): nothing was kept.
    NO_SUCH_JOB = "no_such_job"


@dataclass(frozen=True, slots=True)
class SignalResult:
    """What a signal did."""

    job_id: str
    name: str
    status: SignalStatus
    #: The payload kept for this name (canonical JSON): the one just sent when
    #: ``delivered``, the first one on ``duplicate`` and ``conflict``; None when nothing is kept.
    payload_json: str | None = None

    @property
    def kept(self) -> bool:
        """Whether the job has a signal of this name now (delivered, or a repeat of one)."""
        return self.payload_json is not None
