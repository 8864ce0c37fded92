"""``python -m sqlalchemy_watchdog.cli``: the ``sqlalchemy-watchdog`` command."""

from . import main

raise SystemExit(main())
