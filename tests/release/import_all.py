"""Import every module of the installed sqlalchemy_watchdog, from outside any checkout.

Run by ``python3 dev.py release-check`` with the python of an environment
that installed the package (``python import_all.py [SOURCE_TREE ...]``):
exits non-zero naming the module that did not import, or when the package
was imported from one of the given source trees instead of the install.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import sysconfig
from pathlib import Path


def installed_package_root() -> Path:
    """Where ``sqlalchemy_watchdog`` was imported from; an error unless that
    is this interpreter's site-packages."""
    import sqlalchemy_watchdog

    root = Path(sqlalchemy_watchdog.__file__).resolve().parent
    site = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    if root.parent not in site:
        raise SystemExit(f"sqlalchemy_watchdog was imported from {root}, not from this environment's {sorted(site)}")
    return root


def every_module() -> list[str]:
    """The dotted names of every module and package of the installed package."""
    import sqlalchemy_watchdog

    names = ["sqlalchemy_watchdog"]
    for info in pkgutil.walk_packages(sqlalchemy_watchdog.__path__, "sqlalchemy_watchdog."):
        names.append(info.name)
    # A ``__main__`` module (``python -m sqlalchemy_watchdog``) runs the command
    # when imported; the modules it runs are imported like the rest.
    return [name for name in names if not name.endswith(".__main__")]


def import_every_module() -> list[str]:
    """Import each of :func:`every_module`; their names. Raises at the first
    module that does not import, naming it."""
    names = every_module()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:
            raise SystemExit(f"{name} does not import: {type(error).__name__}: {error}") from error
    return names


def main(trees: list[str]) -> int:
    root = installed_package_root()
    for tree in trees:
        if root.is_relative_to(Path(tree).resolve()):
            raise SystemExit(f"sqlalchemy_watchdog was imported from the source tree {tree}")
    names = import_every_module()
    print(f"{len(names)} modules of sqlalchemy_watchdog import from {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
