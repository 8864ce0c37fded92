"""Headless Chromium for the browser tests: Debian's ``chromium``, driven by
Selenium through Debian's ``chromedriver``; nothing is downloaded.

Without them a browser test skips, saying how to install them (``python3
dev.py test --install-system-packages``, which dev.py also does under
``CI=true``); under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI

BROWSER = Path("/usr/bin/chromium")
DRIVER = Path("/usr/bin/chromedriver")
#: The command that installs them, as dev.py prints it.
INSTALL_COMMAND = "python3 dev.py test --install-system-packages"


def require_browser() -> None:
    """Skip the test (fail it under CI=true) unless chromium and its driver are here."""
    if BROWSER.exists() and DRIVER.exists():
        return
    message = (
        f"{BROWSER} and {DRIVER} are needed (Debian's chromium and chromium-driver): "
        f"install them with `{INSTALL_COMMAND}`"
    )
    if IN_CI:
        pytest.fail(message + " -- CI=true requires the browser tests to run")
    pytest.skip(message)


def headless_chromium(window: str = "1280,1000") -> Iterator[Any]:
    """A headless Chromium WebDriver, quit afterwards (a fixture's body)."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(BROWSER)
    profile = tempfile.mkdtemp(prefix="watchdog-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--window-size={window}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
