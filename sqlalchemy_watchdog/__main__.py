"""``python -m sqlalchemy_watchdog``: the ``sqlalchemy-watchdog`` command."""

from .cli import main

raise SystemExit(main())
