"""The docs site, built from docs/ and opened in a real browser.

One Sphinx build per module, into a temporary directory, exactly as
``python3 dev.py docs`` builds it (warnings are errors, every reference is
checked) -- or, in a ``python3 dev.py test`` run outside CI, the build that
command has just made the same way (:data:`BUILT`); then Debian's headless Chromium opens the index, a how-to guide
and a reference page from those files and looks for what a reader would
see: the headings, a cross-reference rendered as a link that lands on its
target, highlighted code, and images that loaded. The browser tests skip
without chromium (see tests/browser.py); the build and the completeness of
the reference are checked without it.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dev
from tests.browser import headless_chromium
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The modules whose ``__all__`` the reference must document, name by name.
PUBLIC_MODULES = (
    "sqlalchemy_watchdog",
    "sqlalchemy_watchdog.asyncio",
    "sqlalchemy_watchdog.testing",
    "sqlalchemy_watchdog.pytest_plugin",
    "sqlalchemy_watchdog.web",
    "sqlalchemy_watchdog.otel",
    "sqlalchemy_watchdog.schedules",
    "sqlalchemy_watchdog.errors",
    "sqlalchemy_watchdog.codecs",
    "sqlalchemy_watchdog.cli",
    "sqlalchemy_watchdog.migrations",
)


#: Set by ``python3 dev.py test`` to the site it has just built (as ``dev.py
#: docs`` builds it, warnings as errors) before it runs pytest: the tests read
#: that build instead of making their own -- under CI (a fresh build of every
#: page), and outside it if it is newer than every source it was built from.
BUILT = "WATCHDOG_TEST_DOCS_HTML"


def _fresh_build() -> Path | None:
    """dev.py's build of this run (:data:`BUILT`), unless older than a source.
    Under CI, dev.py's build is a fresh one of every page (a clean clone),
    made minutes before: read as it is, not built a second time."""
    built = os.environ.get(BUILT)
    if not built:
        return None
    if IN_CI:
        return Path(built) if (Path(built) / "index.html").is_file() else None
    if dev.docs_outdated(Path(built)):  # an incremental build with nothing to read writes nothing
        return None
    return Path(built)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site (its html directory), as dev.py docs builds it."""
    reused = _fresh_build()
    if reused is not None:
        return reused
    out = tmp_path_factory.mktemp("docs") / "html"
    command = [
        sys.executable,
        "-m",
        "sphinx",
        "-b",
        "html",
        "-E",
        "-W",
        "--keep-going",
        "-n",
        "-q",
        str(DOCS),
        str(out),
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        pytest.fail(f"the docs build failed (exit {result.returncode}):\n{result.stderr[-6000:]}", pytrace=False)
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from headless_chromium()


def open_page(browser: Any, site: Path, page: str) -> None:
    browser.get((site / page).as_uri())
    assert browser.execute_script("return document.readyState") == "complete"


def loaded_images(browser: Any) -> list[str]:
    """The ``src`` of every image of the page's article that loaded."""
    images: list[str] = browser.execute_script(
        "return Array.from(document.querySelectorAll('article img'))"
        ".filter(img => img.complete && img.naturalWidth > 0).map(img => img.getAttribute('src'));"
    )
    return images


def test_the_reference_documents_every_public_name(site: Path) -> None:
    documented: set[str] = set()
    for page in (site / "reference").glob("*.html"):
        documented |= set(re.findall(r'<dt class="sig sig-object py" id="([^"]+)"', page.read_text()))
    package = importlib.import_module("sqlalchemy_watchdog")
    missing = []
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for member in getattr(module, "__all__", ()):
            # A name the package re-exports (errors, codecs, Schedule) is documented once, where
            # the package exports it.
            same = getattr(package, member, None) is getattr(module, member)
            if f"{name}.{member}" not in documented and not (same and f"sqlalchemy_watchdog.{member}" in documented):
                missing.append(f"{name}.{member}")
    assert not missing, f"public names missing from the reference: {missing}"


#: What autodoc shows for a constant it found no ``#:`` comment for: the
#: docstring of the constant's type (``int``, ``str``, ``dict``, ...).
BUILTIN_DOCSTRINGS = (
    "Convert a number or string to an integer",
    "Create a new string object",
    "dict() -&gt; new empty",
)


def test_every_documented_constant_says_what_it_is(site: Path) -> None:
    borrowed = []
    for page in sorted((site / "reference").glob("*.html")):
        text = page.read_text()
        for match in re.finditer(r'<dt class="sig sig-object py" id="([^"]+)"', text):
            entry = text[match.end() : text.find("</dd>", match.end())]
            if any(phrase in entry for phrase in BUILTIN_DOCSTRINGS):
                borrowed.append(f"{page.name}: {match.group(1)}")
    assert not borrowed, f"constants documented by their type's docstring (add a #: comment): {borrowed}"


def test_the_index_page_leads_to_every_part_of_the_site(site: Path, browser: Any) -> None:
    open_page(browser, site, "index.html")
    from selenium.webdriver.common.by import By

    assert browser.find_element(By.CSS_SELECTOR, "article h1").text.startswith("sqlalchemy-watchdog")
    article = browser.find_element(By.CSS_SELECTOR, "article")
    assert "exactly once" in article.text
    hrefs = [a.get_attribute("href") for a in article.find_elements(By.CSS_SELECTOR, "dt a")]
    for part in ("tutorial.html", "howto/index.html", "explanation/index.html", "reference/index.html"):
        assert any(href.endswith(part) for href in hrefs), part
    # The sidebar (furo's navigation) lists the how-to guides.
    sidebar = browser.find_element(By.CSS_SELECTOR, ".sidebar-tree")
    assert "Testing your code" in sidebar.get_attribute("textContent")


def test_a_how_to_guide_shows_its_screenshots_and_links_into_the_reference(site: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, site, "howto/dashboard.html")
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text.startswith("The dashboard")
    images = loaded_images(browser)
    assert any(src.endswith("dashboard-overview.png") for src in images), images
    assert any(src.endswith("dashboard-job.png") for src in images), images
    assert browser.find_elements(By.CSS_SELECTOR, "article div.highlight-python pre"), "highlighted code"
    # The {func} role became a link to the reference entry, and following it lands there.
    [link] = [
        a
        for a in browser.find_elements(By.CSS_SELECTOR, "article a.reference.internal")
        if a.get_attribute("href").endswith("reference/web.html#sqlalchemy_watchdog.web.create_app")
    ]
    assert link.text == "create_app()"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'});", link)
    link.click()
    target = browser.find_element(By.ID, "sqlalchemy_watchdog.web.create_app")
    assert "create_app" in target.text
    assert browser.current_url.endswith("reference/web.html#sqlalchemy_watchdog.web.create_app")


def test_the_performance_page_shows_the_benchmark_charts(site: Path, browser: Any) -> None:
    open_page(browser, site, "explanation/performance.html")
    images = loaded_images(browser)
    for chart in ("drain.png", "latency.png", "scaleout.png"):
        assert any(src.endswith(chart) for src in images), (chart, images)


def test_a_reference_page_renders_the_docstrings_and_their_roles(site: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, site, "reference/package.html")
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text.startswith("sqlalchemy_watchdog")
    entry = browser.find_element(By.ID, "sqlalchemy_watchdog.Watchdog")
    assert entry.is_displayed() and "class" in entry.text and "Watchdog" in entry.text
    description = entry.find_element(By.XPATH, "following-sibling::dd")
    assert "transaction" in description.text
    # Its methods are documented, each with an anchor of its own.
    assert browser.find_element(By.ID, "sqlalchemy_watchdog.Watchdog.cancel")
    # A docstring's :class: role rendered as a link to another entry that exists.
    links = [
        a.get_attribute("href")
        for a in browser.find_elements(By.CSS_SELECTOR, "dl.py.class dd a.reference.internal")
        if "#sqlalchemy_watchdog." in a.get_attribute("href")
    ]
    assert links, "no cross-references in the class descriptions"
    for href in sorted(set(links))[:20]:
        page, anchor = href.split("#", 1)
        if page.endswith("reference/package.html"):
            assert browser.find_elements(By.ID, anchor), href
