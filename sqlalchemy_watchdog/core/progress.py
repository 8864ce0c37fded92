"""Progress of a running job: checked, rate-limited, written under its claim.

A handler calls ``job.progress(fraction, note=None)`` (``await
job.progress_async(...)`` in a coroutine handler). The value is checked
(a fraction in [0, 1], a note of at most :data:`PROGRESS_NOTE_MAX_LENGTH`
characters), then written at once if this job's last write began and ended at least
:data:`PROGRESS_INTERVAL_S` ago, else kept as *pending*: a later call
writes the newest value, and the settle of the attempt writes a pending one
with the job's settlement (the same statement). So a tight loop costs at
most one statement per second per job, and the last value reported is
never lost while the claim lives.

Each write is one ``UPDATE`` guarded by the job_id, the exact claim token,
``state = 'running'`` and a live lease by the database clock
(:func:`sqlalchemy_watchdog.store.claims_sql.progress`), like a renew: a job that
lost its claim writes nothing (:attr:`ProgressStatus.LOST`).
"""

from __future__ import annotations

import asyncio
import enum
import math
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import InvalidJob
from ..records import PROGRESS_NOTE_MAX_LENGTH as PROGRESS_NOTE_MAX_LENGTH

__all__ = [
    "PROGRESS_INTERVAL_S",
    "PROGRESS_NOTE_MAX_LENGTH",
    "ProgressStatus",
    "ProgressReporter",
    "check_progress",
]

#: At most one progress write per job per this many seconds.
PROGRESS_INTERVAL_S = 1.0

#: ``write(job_id, claim_token, fraction, note) -> whether the claim still held``.
SyncWrite = Callable[[str, str, float, "str | None"], bool]
AsyncWrite = Callable[[str, str, float, "str | None"], Coroutine[Any, Any, bool]]


class ProgressStatus(str, enum.Enum):
    """What ``job.progress(...)`` did."""

    #: Written now.
    WRITTEN = "written"
    #: Kept: written by a later report or with the job's settlement (rate limit).
    DEFERRED = "deferred"
    #: Not written: the job no longer holds its claim (lease lost, settled elsewhere).
    LOST = "lost"


def check_progress(fraction: object, note: object) -> tuple[float, str | None]:
    """``fraction`` as a float in [0, 1] and ``note`` (None or a str of at
    most :data:`PROGRESS_NOTE_MAX_LENGTH` characters, no NUL), or a clear
    :class:`~sqlalchemy_watchdog.InvalidJob` naming the argument."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise InvalidJob("fraction", f"must be a number from 0 to 1, not {type(fraction).__name__}")
    value = float(fraction)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InvalidJob("fraction", f"must be from 0 to 1, got {fraction!r}")
    if note is not None:
        if not isinstance(note, str):
            raise InvalidJob("note", f"must be a str or None, not {type(note).__name__}")
        if len(note) > PROGRESS_NOTE_MAX_LENGTH:
            raise InvalidJob("note", f"must be at most {PROGRESS_NOTE_MAX_LENGTH} characters, got {len(note)}")
        if "\x00" in note:
            raise InvalidJob("note", "must not contain NUL")
        try:
            note.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidJob("note", "must be valid Unicode (no lone surrogates)") from None
    return value, note


#: Guards every reporter's rate limit: a few instructions under it, and no
#: lock allocated per job (a reporter is made for every job claimed).
_DUE_LOCK = threading.Lock()


class ProgressReporter:
    """The progress of one execution: its rate limit, its pending value,
    and how it writes (``write`` from a thread, ``write_async`` on the
    runner's event loop; neither: every report is kept pending)."""

    __slots__ = (
        "_interval",
        "_last",
        "_loop",
        "_monotonic",
        "_write",
        "_write_async",
        "claim_token",
        "job_id",
        "pending",
        "read",
        "read_async",
        "steps",
    )  # fmt: skip

    def __init__(
        self,
        job_id: str,
        claim_token: str,
        write: SyncWrite | None = None,
        write_async: AsyncWrite | None = None,
        *,
        interval_s: float = PROGRESS_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
        read: Callable[[str], Any] | None = None,
        read_async: Callable[[str], Coroutine[Any, Any, Any]] | None = None,
        steps: Any = None,
    ) -> None:
        #: How the handler reads its parents' results (``job.parent_results()``).
        self.read = read
        #: Its durable steps (a :class:`~sqlalchemy_watchdog.core.durable.DurableSteps`), None outside a runner.
        self.steps = steps
        self.read_async = read_async
        self.job_id = job_id
        self.claim_token = claim_token
        self._write = write
        self._write_async = write_async
        self._interval = interval_s
        self._monotonic = monotonic
        self._last: float | None = None
        #: The newest value not written yet: (fraction, note).
        self.pending: tuple[float, str | None] | None = None
        # The AsyncRunner admits its jobs on its loop: a thread reporting uses
        # it. (Built for every job: the no-raise lookup, not get_running_loop.)
        self._loop: asyncio.AbstractEventLoop | None = asyncio._get_running_loop()

    def _due(self, value: tuple[float, str | None]) -> bool:
        """Whether to write ``value`` now; else it is kept pending."""
        with _DUE_LOCK:
            now = self._monotonic()
            if self._last is not None and now - self._last < self._interval:
                self.pending = value
                return False
            self._last = now
            self.pending = None
            return True

    def report(self, fraction: object, note: object = None) -> ProgressStatus:
        """Check and report from a thread (a sync handler)."""
        value = check_progress(fraction, note)
        if not self._due(value):
            return ProgressStatus.DEFERRED
        if self._write is not None:
            held = self._write(self.job_id, self.claim_token, *value)
        elif self._write_async is not None and self._loop is not None:
            try:
                if asyncio.get_running_loop() is self._loop:
                    raise TypeError("job.progress() blocks: in a coroutine handler, await job.progress_async()")
            except RuntimeError:
                pass  # a handler thread, as it should be
            future: Any = asyncio.run_coroutine_threadsafe(
                self._write_async(self.job_id, self.claim_token, *value), self._loop
            )
            held = future.result()
        else:
            self.pending = value
            return ProgressStatus.DEFERRED
        self._written()
        return ProgressStatus.WRITTEN if held else ProgressStatus.LOST

    def _written(self) -> None:
        """The interval counts from the end of a write too: a write that took
        longer than the interval (a busy database) is not followed at once by
        the next one."""
        with _DUE_LOCK:
            self._last = self._monotonic()

    async def report_async(self, fraction: object, note: object = None) -> ProgressStatus:
        """Check and report from a coroutine handler."""
        value = check_progress(fraction, note)
        if not self._due(value):
            return ProgressStatus.DEFERRED
        if self._write_async is not None:
            held = await self._write_async(self.job_id, self.claim_token, *value)
        elif self._write is not None:
            held = await asyncio.to_thread(self._write, self.job_id, self.claim_token, *value)
        else:
            self.pending = value
            return ProgressStatus.DEFERRED
        self._written()
        return ProgressStatus.WRITTEN if held else ProgressStatus.LOST
