"""A handler module whose import takes :data:`IMPORT_S` seconds (a module
that loads a model or a large dependency at import), for the process
executor's test that a child's import of it does not count against its first
job's timeout. Imported only by that test: the import is slow on purpose."""

from __future__ import annotations

import time

from sqlalchemy_watchdog import RunningJob

#: How long importing this module takes.
IMPORT_S = 1.5

time.sleep(IMPORT_S)


def done(job: RunningJob) -> None:
    """Completes at once."""
    return None
