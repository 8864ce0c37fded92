"""sqlalchemy_watchdog's Alembic revisions (branch label ``watchdog``).

Include them in your own Alembic environment by adding
``sqlalchemy_watchdog:migrations/versions`` to ``version_locations``, and
guard that environment with :func:`refuse_revisions_in_package` (see the
README, "Using it from your own Alembic environment").
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["BRANCH_LABEL", "VERSIONS_DIR", "refuse_revisions_in_package"]

#: The directory holding the revisions, for programmatic Alembic configs.
VERSIONS_DIR = Path(__file__).parent / "versions"
#: The branch label of these revisions: ``alembic upgrade watchdog@head``.
BRANCH_LABEL = "watchdog"


def _in_package(path: str | os.PathLike[str] | None) -> bool:
    if path is None:
        return False
    try:
        return Path(path).resolve() == VERSIONS_DIR.resolve()
    except OSError:
        return False


def refuse_revisions_in_package(context: Any, revision: Any, directives: Iterable[Any]) -> None:
    """Alembic ``process_revision_directives`` hook: refuse to write a new
    revision into the installed package's ``versions`` directory.

    With ``sqlalchemy_watchdog:migrations/versions`` in ``version_locations``,
    Alembic writes a revision without ``--version-path`` next to the revision
    it is based on. Based on the ``watchdog`` branch (a plain ``alembic
    revision`` while that branch is your database's only head, or ``--head
    watchdog@head``), that is inside the installed package, where an upgrade
    of the package silently deletes it. This hook stops such a command with
    an ``alembic.util.CommandError`` that says what to pass instead.

    Pass it to both ``context.configure(...)`` calls of your ``env.py``
    (``process_revision_directives=refuse_revisions_in_package``) and set
    ``revision_environment = true`` in ``alembic.ini``, so that ``env.py``
    (and with it this hook) also runs for ``alembic revision`` without
    ``--autogenerate``.
    """
    from alembic.util import CommandError

    script_directory = getattr(context, "script", None)
    for directive in directives:
        version_path = getattr(directive, "version_path", None)
        if version_path is not None:
            if _in_package(version_path):
                raise CommandError(_refusal(f"--version-path {version_path}"))
            continue
        if script_directory is None:
            continue
        head = getattr(directive, "head", None) or "head"
        try:
            bases = script_directory.revision_map.get_revisions(head)
        except Exception:
            continue  # Alembic reports an unknown or ambiguous head itself.
        for base in bases:
            path = getattr(base, "path", None)
            if path is not None and _in_package(Path(path).parent):
                raise CommandError(_refusal(f"it would be based on {base.revision} ({head})"))


def _refusal(why: str) -> str:
    return (
        "sqlalchemy_watchdog: refusing to write a new revision into the installed package's "
        f"migrations directory {VERSIONS_DIR} ({why}); a package upgrade would delete it. "
        "Start your own branch with `alembic revision -m MESSAGE --head base --branch-label app "
        "--version-path <your versions directory>`, then base later revisions on it with "
        "`--head app@head` (or `--head <your head revision>`); check that version_locations "
        "lists your own versions directory."
    )
