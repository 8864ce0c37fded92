"""The smoke suite runs against an installed copy of the package, never a source tree.

``python3 dev.py release-check`` installs the built wheel into a fresh
environment outside the checkout and runs these tests there, from a copy of
the tests without the package. Run any other way (from the checkout, or with
the source tree importable), this refuses to start: a smoke test that
imported the source tree would prove nothing about the wheel.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.release.import_all import installed_package_root

#: Set by dev.py release-check: the wheel under test, the clean clone it was
#: built from, and the checkout the check was started in.
WHEEL = os.environ.get("WATCHDOG_RELEASE_WHEEL", "")
SOURCE = os.environ.get("WATCHDOG_RELEASE_SOURCE", "")
CHECKOUT = os.environ.get("WATCHDOG_RELEASE_CHECKOUT", "")


def pytest_configure(config: pytest.Config) -> None:
    if not (WHEEL and SOURCE):
        raise pytest.UsageError("tests/release runs against the installed wheel: run `python3 dev.py release-check`")
    root = installed_package_root()
    for tree in (SOURCE, CHECKOUT):
        if tree and root.is_relative_to(Path(tree).resolve()):
            raise pytest.UsageError(f"sqlalchemy_watchdog was imported from the source tree {tree}, not the install")


@pytest.fixture(scope="session")
def wheel() -> Path:
    """The built wheel that is installed in this environment."""
    return Path(WHEEL)


@pytest.fixture(scope="session")
def source() -> Path:
    """The clean copy of the checkout the wheel was built from (read, never imported)."""
    return Path(SOURCE)
