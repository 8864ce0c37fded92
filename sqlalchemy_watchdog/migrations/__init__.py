"""sqlalchemy_watchdog's Alembic revisions (branch label ``watchdog``).

Include them in your own Alembic environment by adding
``sqlalchemy_watchdog:migrations/versions`` to ``version_locations``.
"""

from pathlib import Path

#: The directory holding the revisions, for programmatic Alembic configs.
VERSIONS_DIR = Path(__file__).parent / "versions"
#: The branch label of these revisions: ``alembic upgrade watchdog@head``.
BRANCH_LABEL = "watchdog"
