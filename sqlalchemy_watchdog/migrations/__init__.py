"""sqlalchemy_watchdog's Alembic revisions (branch label ``watchdog``).

Include them in your own Alembic environment by adding
``sqlalchemy_watchdog:migrations/versions`` to ``version_locations``, and
guard that environment with :func:`refuse_revisions_in_package` (see the
README, "Using it from your own Alembic environment").

Without an Alembic environment of your own, :func:`apply_revisions` applies
them on a connection (what ``sqlalchemy-watchdog upgrade`` and the pytest
plugin's ``watchdog_engine`` run), and :func:`current_revisions` and
:func:`has_jobs_table` say where a database stands.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine

__all__ = [
    "BRANCH_LABEL",
    "VERSIONS_DIR",
    "apply_revisions",
    "current_revisions",
    "has_jobs_table",
    "refuse_revisions_in_package",
]

#: The directory holding the revisions, for programmatic Alembic configs.
VERSIONS_DIR = Path(__file__).parent / "versions"
#: The branch label of these revisions: ``alembic upgrade watchdog@head``.
BRANCH_LABEL = "watchdog"
#: The script directory Alembic reads the revisions through (this package).
_SCRIPT_DIR = Path(__file__).parent


def apply_revisions(conn: Connection, revision: str = "heads") -> None:
    """Apply the package's Alembic revisions up to ``revision`` on ``conn``
    (committed here), without an ``env.py``, recording them in the
    database's ``alembic_version`` table as ``alembic upgrade`` would. What
    ``sqlalchemy-watchdog upgrade`` runs; the pytest plugin's
    ``watchdog_engine`` too.

    A ``watchdog_jobs`` table dropped by hand while ``alembic_version``
    still records the latest revision is made again (with
    ``metadata.create_all``: the tables that are there are left as they
    are); dropped at an older revision, it is refused with what to do.

    :raises alembic.util.CommandError: e.g. the database holds revisions
        these do not know (an application's own Alembic environment), or
        the table is gone at an older revision.
    """
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    from ..model import metadata

    script = ScriptDirectory(str(_SCRIPT_DIR.resolve()), version_locations=[str(VERSIONS_DIR.resolve())])
    ours = {rev.revision for rev in script.walk_revisions()}
    heads = set(script.get_heads())
    was_in_transaction = conn.in_transaction()
    recorded = ours.intersection(current_revisions(conn))
    missing = bool(recorded) and not has_jobs_table(conn)
    if not was_in_transaction and conn.in_transaction():
        conn.rollback()  # only read: leave the connection as it came
    if missing and not recorded <= heads:
        raise CommandError(
            f"the watchdog_jobs table is missing but alembic_version records revision {', '.join(sorted(recorded))}: "
            "it was dropped by hand. Drop the other watchdog_* tables too, delete that row "
            f"(DELETE FROM alembic_version WHERE version_num IN ({', '.join(repr(r) for r in sorted(recorded))})), "
            "then upgrade again to make them all afresh"
        )

    def upgrade(rev: Any, context: Any) -> Any:
        return script._upgrade_revs(revision, rev)

    with EnvironmentContext(Config(), script, fn=upgrade, destination_rev=revision, as_sql=False) as env:
        env.configure(connection=conn, target_metadata=metadata)
        with env.begin_transaction():
            env.run_migrations()
    if conn.in_transaction():
        conn.commit()
    if missing:
        # At the latest revision the model is that revision's schema: create_all restores the
        # dropped table (its leftover domains and the dependency triggers are made afresh).
        metadata.create_all(conn)
        if conn.in_transaction():
            conn.commit()


def current_revisions(conn: Connection) -> list[str]:
    """The revisions the database's ``alembic_version`` table records, sorted
    (empty when there is none): what ``sqlalchemy-watchdog upgrade`` reports."""
    from alembic.runtime.migration import MigrationContext

    return sorted(MigrationContext.configure(conn).get_current_heads())


def has_jobs_table(bind: Engine | Connection) -> bool:
    """Whether the database has the ``watchdog_jobs`` table (any revision)."""
    from sqlalchemy import inspect

    from ..model import jobs_table

    return inspect(bind).has_table(jobs_table.name)


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
