"""The dashboard in a real browser: Debian's headless Chromium, driven by
Selenium through Debian's chromedriver, against the app served by uvicorn on
127.0.0.1 over a PostgreSQL database of this module.

One server and one browser serve the whole module. The server mounts three
dashboards on the same database: ``/rw`` (every action), ``/ro``
(``read_only=True``) and ``/deny`` (an ``authorize`` that allows viewing and
resuming only). Without Debian's chromium and chromium-driver these tests
skip, saying how to install them (``python3 dev.py test
--install-system-packages``); under ``CI=true`` they fail.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from starlette.applications import Starlette
from starlette.routing import Mount

from sqlalchemy_watchdog import Decision, Job, JobState, Runner, Watchdog, metadata
from sqlalchemy_watchdog.web import create_app
from tests.browser import headless_chromium
from tests.helpers import present

WAIT = 10.0

SCRIPT = "<script>window.__xss=1</script>"
IMG = "<img src=x onerror=window.__xss=2>"
CONTROL = "\x07\x1b[31m"

#: Every element a keyboard user must reach.
FOCUSABLE = "a[href], button, input:not([type=hidden]), select, textarea"

#: WCAG contrast of every visible text against its effective background.
CONTRAST_JS = """
function rgba(text) {
  const m = text.match(/rgba?\\(([^)]+)\\)/);
  if (!m) return null;
  const p = m[1].split(',').map(s => parseFloat(s));
  return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1};
}
function luminance(c) {
  const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b);
}
function background(el) {
  for (let node = el; node && node.nodeType === 1; node = node.parentElement) {
    const c = rgba(getComputedStyle(node).backgroundColor);
    if (c && c.a > 0.5) return c;
  }
  return {r: 255, g: 255, b: 255, a: 1};
}
const failures = [];
let checked = 0;
for (const el of document.querySelectorAll('body *')) {
  const own = Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim());
  if (!own) continue;
  const style = getComputedStyle(el);
  const box = el.getBoundingClientRect();
  if (style.visibility === 'hidden' || style.display === 'none' || box.width < 2 || box.height < 2) continue;
  const isSvg = el instanceof SVGElement;
  const fg = rgba(isSvg ? style.fill : style.color);
  const bg = background(isSvg ? el.closest('svg').parentElement : el);
  const l1 = luminance(fg), l2 = luminance(bg);
  const ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
  checked += 1;
  if (ratio < 4.5) failures.push(el.tagName + ' "' + el.textContent.trim().slice(0, 30) + '" ' + ratio.toFixed(2));
}
return [checked, failures];
"""


def free_socket() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="module")
def database(postgres_server: URL) -> Iterator[URL]:
    """A PostgreSQL database of this module, with the tables."""
    name = f"watchdog_web_{uuid.uuid4().hex[:10]}"
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = postgres_server.set(database=name)
    engine = create_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def engine(database: URL) -> Iterator[Engine]:
    engine = create_engine(database)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def base_url(engine: Engine) -> Iterator[str]:
    """The three dashboards served by uvicorn on 127.0.0.1, in a thread."""
    import uvicorn

    app = Starlette(
        routes=[
            Mount("/rw", create_app(engine, refresh_seconds=1)),
            Mount("/ro", create_app(engine, read_only=True)),
            Mount("/deny", create_app(engine, authorize=lambda request, action: action in ("view", "resume"))),
        ]
    )
    sock = free_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=WAIT)
        sock.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's), driven through Debian's chromedriver."""
    yield from headless_chromium()


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def by_css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def result_status(driver: Any) -> str:
    return str(wait_for(lambda: all_css(driver, "#result-status"), "a result page")[0].get_attribute("data-status"))


def submit_form(driver: Any, action: str, fields: dict[str, str], token: str) -> None:
    """Post a hand-made form from the page (what a crafted request would do)."""
    driver.execute_script(
        """
        const [action, fields] = arguments;
        const form = document.createElement('form');
        form.method = 'post';
        form.action = action;
        for (const [name, value] of Object.entries(fields)) {
          const input = document.createElement('input');
          input.type = 'hidden'; input.name = name; input.value = value;
          form.appendChild(input);
        }
        document.body.appendChild(form);
        form.submit();
        """,
        action,
        {**fields, "csrf_token": token},
    )


def test_overview_list_filter_and_job_page(browser: Any, base_url: str, engine: Engine) -> None:
    from selenium.webdriver.support.ui import Select

    watchdog = Watchdog(engine)
    watchdog.enqueue([Job(f"mail-{n}", "mail", payload={"to": f"user{n}@example.com"}) for n in range(4)])
    Runner(engine, {"mail": lambda job: Decision.failed("mailbox full", retry=False)}).run_until_idle(max_ticks=1)

    browser.get(f"{base_url}/rw/")
    assert "Queues" in browser.title or "Overview" in browser.title
    row = wait_for(lambda: [r for r in all_css(browser, "table.queues tbody tr") if "mail" in r.text], "the mail row")[
        0
    ]
    assert "1 failed" in row.text and "3" in row.text  # 3 queued
    assert by_css(browser, "svg.chart").get_attribute("aria-label").endswith("1 failed")

    by_css(browser, "header nav a[href='/rw/jobs']").click()
    by_css(browser, "#f-queue").send_keys("mail")
    Select(by_css(browser, "#f-state")).select_by_visible_text("queued")
    by_css(browser, "form.filters button[type=submit]").click()
    wait_for(lambda: "state=queued" in browser.current_url, "the filtered list")
    ids = [a.text for a in all_css(browser, "table.jobs td.id a")]
    assert ids == ["mail-3", "mail-2", "mail-1"]  # newest first

    by_css(browser, "table.jobs td.id a").click()
    wait_for(lambda: "Job mail-3" in by_css(browser, "h1").text, "the job page")
    assert '"to": "user3@example.com"' in by_css(browser, "pre.payload").text
    # What applies, and where from: this page's process knows no runner settings.
    assert by_css(browser, "#f-attempt").text == "1 (of its handler's or runner's maximum, not known here)"
    assert by_css(browser, "#f-timeout").text.startswith("its handler's or the runner's timeout (@handler(queue, ")
    assert by_css(browser, "#f-pause").text == "not paused"
    assert "enqueued" in by_css(browser, "ol.timeline").text


def test_lists_page_newest_first_both_ways(browser: Any, base_url: str, engine: Engine) -> None:
    Watchdog(engine).enqueue([Job(f"paged-{n:02d}", "paged", lane="paged-lane") for n in range(30)])
    for path in ("/rw/jobs?queue=paged&limit=25", "/rw/lane?lane=paged-lane&limit=25"):
        browser.get(base_url + path)
        ids = [a.text for a in all_css(browser, "table.jobs td.id a")]
        assert ids[:2] == ["paged-29", "paged-28"] and len(ids) == 25
        by_css(browser, "nav.pager a[rel=next]").click()
        wait_for(lambda: "before=" in browser.current_url, "the older page")
        assert [a.text for a in all_css(browser, "table.jobs td.id a")] == [f"paged-{n:02d}" for n in range(4, -1, -1)]
        assert all_css(browser, "nav.pager a[rel=next]") == []
        by_css(browser, "nav.pager a[rel=prev]").click()
        wait_for(lambda: "after=" in browser.current_url, "the newer page")
        assert by_css(browser, "table.jobs td.id a").text == "paged-29"


def test_bulk_rerun_confirms_the_count_then_reruns_once(browser: Any, base_url: str, engine: Engine) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    watchdog = Watchdog(engine)
    watchdog.enqueue([Job(f"batch-{n}", "batchq") for n in range(3)])
    Runner(engine, {"batchq": lambda job: Decision.failed("gateway down", retry=False)}).run_until_idle()
    browser.get(f"{base_url}/rw/jobs?queue=batchq&outcome=failed")
    by_css(browser, "#bulk-rerun-id").clear()
    by_css(browser, "#bulk-rerun-id").send_keys("after-outage")
    by_css(browser, "section.bulk form.action button.primary").click()
    count = wait_for(lambda: all_css(browser, "#bulk-count"), "the confirmation")[0]
    assert count.get_attribute("data-count") == "3" and "3 job(s)" in count.text
    assert present(watchdog.read("batch-0")).reruns == ()  # asked, not done
    ActionChains(browser).double_click(by_css(browser, "form.action button.danger")).perform()
    assert result_status(browser) in ("rerun 3", "rerun 0")  # a double click: the second answers "0 new"
    assert [present(watchdog.read(f"batch-{n}")).reruns for n in range(3)] == [
        (f"batch-{n}~rerun~after-outage",) for n in range(3)
    ]


def test_cancel_through_the_ui_with_a_double_click(browser: Any, base_url: str, engine: Engine) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    watchdog = Watchdog(engine)
    watchdog.enqueue(Job("to-cancel", "cancellable"))
    browser.get(f"{base_url}/rw/job?job_id=to-cancel")
    by_css(browser, "form.action button.danger").click()
    confirm = wait_for(lambda: all_css(browser, ".confirm"), "the confirmation")[0]
    assert "to-cancel" in confirm.text
    assert present(watchdog.read("to-cancel")).cancellation_id is None  # asked, not done
    ActionChains(browser).double_click(by_css(browser, "form.action button.danger")).perform()
    # One request: a second one would have answered "replayed".
    assert result_status(browser) == "recorded"
    row = watchdog.read("to-cancel")
    assert row is not None and row.cancellation_id is not None and row.cancellation_id.startswith("dashboard-")
    Runner(engine, {"cancellable": lambda job: None}).run_until_idle()
    assert present(present(watchdog.read("to-cancel")).outcome).value == "cancelled"


def test_pause_through_the_ui_stops_a_runner_claiming(browser: Any, base_url: str, engine: Engine) -> None:
    watchdog = Watchdog(engine)
    watchdog.enqueue(Job("held-1", "holdable"))
    browser.get(f"{base_url}/rw/")
    row = wait_for(
        lambda: [r for r in all_css(browser, "table.queues tbody tr") if r.text.startswith("holdable")], "the row"
    )[0]
    row.find_element("css selector", "input[name=reason]").send_keys("deploy in progress")
    row.find_element("css selector", "button[aria-label='Pause holdable']").click()
    assert result_status(browser) == "paused"
    assert present(watchdog.stats().queue("holdable").pause).reason == "deploy in progress"
    assert Runner(engine, {"holdable": lambda job: None}).run_until_idle() == []
    assert present(watchdog.read("held-1")).state is JobState.QUEUED

    browser.get(f"{base_url}/rw/")
    resume = wait_for(lambda: all_css(browser, "button[aria-label='Resume holdable']"), "the resume button")[0]
    resume.click()
    assert result_status(browser) == "resumed"
    [claimed] = Runner(engine, {"holdable": lambda job: None}).run_until_idle()
    assert claimed.job_id == "held-1"


def test_read_only_and_a_refusing_authorize(browser: Any, base_url: str, engine: Engine) -> None:
    watchdog = Watchdog(engine)
    watchdog.enqueue(Job("guarded-1", "guarded"))
    watchdog.pause("guarded", reason="for the test")

    browser.get(f"{base_url}/ro/")
    assert "read-only" in by_css(browser, "header").text
    assert all_css(browser, "form[method=post]") == []
    submit_form(browser, "/ro/actions/resume", {"enc.queue": "guarded"}, token="anything")
    wait_for(lambda: all_css(browser, "p.error"), "the refusal")
    assert "read-only" in by_css(browser, "p.error").text

    browser.get(f"{base_url}/deny/")
    buttons = [b.text for b in all_css(browser, "table.queues button")]
    assert "Resume" in buttons and "Pause" not in buttons and not any("Purge" in b for b in buttons)
    token = by_css(browser, "input[name=csrf_token]").get_attribute("value")
    submit_form(
        browser,
        "/deny/actions/cancel",
        {"enc.job_id": "guarded-1", "enc.cancellation_id": "sneaky", "confirm": "yes"},
        token=token,
    )
    wait_for(lambda: all_css(browser, "p.error"), "the refusal")
    assert "You may not cancel" in by_css(browser, "p.error").text
    assert present(watchdog.read("guarded-1")).cancellation_id is None
    assert watchdog.stats().queue("guarded").paused
    watchdog.resume("guarded")


def test_untrusted_data_stays_data(browser: Any, base_url: str, engine: Engine) -> None:
    nasty_id = f"{SCRIPT}{IMG}{CONTROL}id"
    lane = f"lane{SCRIPT}{IMG}"
    queue = f"q{IMG}"
    watchdog = Watchdog(engine)
    watchdog.enqueue(Job(nasty_id, queue, lane=lane, payload={"html": SCRIPT, "img": IMG, "ctl": CONTROL}))
    Runner(engine, {queue: lambda job: Decision.failed(f"{SCRIPT}{IMG}{CONTROL}", retry=False)}).run_until_idle()
    watchdog.enqueue(Job(f"{nasty_id}-live", queue, lane=lane))
    pages = {
        "overview": f"{base_url}/rw/",
        "list": f"{base_url}/rw/jobs",
        "job": f"{base_url}/rw/job?job_id=" + __import__("urllib.parse").parse.quote(nasty_id),
        "lane": f"{base_url}/rw/lane?lane=" + __import__("urllib.parse").parse.quote(lane),
    }
    for name, url in pages.items():
        browser.get(url)
        by_css(browser, "h1")
        assert browser.execute_script("return typeof window.__xss") == "undefined", name
        body = by_css(browser, "body").text
        assert IMG in body, name
    browser.get(pages["job"])
    assert by_css(browser, "h1 .id").text.startswith(SCRIPT + IMG)  # shown literally
    assert "\\x07\\x1b" in by_css(browser, "h1 .id").text  # the control characters as escapes
    assert SCRIPT in by_css(browser, "pre.reason").text and IMG in by_css(browser, "pre.payload").text
    # An action on such a job still names it exactly (hidden fields carry it percent-encoded).
    browser.find_element("css selector", "#rerun-id").clear()
    browser.find_element("css selector", "#rerun-id").send_keys("xss-rerun")
    browser.find_element("css selector", "form.action button.primary").click()
    assert result_status(browser) == "queued"
    assert present(watchdog.read(nasty_id)).reruns == (f"{nasty_id}~rerun~xss-rerun",)
    assert browser.execute_script("return typeof window.__xss") == "undefined"


def test_the_overview_refreshes_itself_without_a_reload(browser: Any, base_url: str, engine: Engine) -> None:
    browser.get(f"{base_url}/rw/")
    by_css(browser, "h1")
    browser.execute_script("window.__sameDocument = 42; document.activeElement.blur();")
    Watchdog(engine).enqueue(Job("late-1", "late-queue"))
    wait_for(lambda: "late-queue" in by_css(browser, "#overview").text, "the refreshed overview", timeout=8)
    assert browser.execute_script("return window.__sameDocument") == 42


def test_the_workers_page_shows_a_serving_runner_live_and_its_clean_shutdown(
    browser: Any, base_url: str, engine: Engine
) -> None:
    runner = Runner(engine, {"browser-workers": lambda job: None})
    serving = threading.Thread(target=runner.run_forever, kwargs={"install_signal_handlers": False}, daemon=True)
    serving.start()
    worker_id = runner.core.worker_id
    try:
        browser.get(f"{base_url}/rw/")
        by_css(browser, "header nav a[href='/rw/workers']").click()
        wait_for(lambda: by_css(browser, "h1").text == "Workers", "the workers page")

        def row() -> Any:
            rows = [r for r in all_css(browser, "table.workers tbody tr") if worker_id in r.text]
            if not rows:
                browser.refresh()
            return rows

        [shown] = wait_for(row, "the serving runner's row")
        assert "live" in shown.text and "browser-workers" in shown.text and "gone" not in shown.text
        assert by_css(browser, "header nav a[aria-current=page]").text == "Workers"
    finally:
        runner.stop()
        serving.join(30)
    browser.refresh()
    wait_for(lambda: worker_id not in by_css(browser, "main").text, "the row removed by the clean shutdown")


@pytest.mark.parametrize("page", ["overview", "job", "workers"])
def test_keyboard_reaches_everything_with_a_visible_focus_and_text_contrast(
    browser: Any, base_url: str, engine: Engine, page: str
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    watchdog = Watchdog(engine)
    if watchdog.read("keys-1") is None:
        watchdog.enqueue([Job("keys-1", "keys", payload={"n": 1}), Job("keys-2", "keys")])
        Runner(engine, {"keys": lambda job: Decision.failed("once", retry=False)}).run_until_idle(max_ticks=1)
    watchdog.pause("keys", reason="a Resume button too")
    if page == "workers":  # a live and a gone worker, a disputed schedule: every badge and warning shows
        from sqlalchemy_watchdog import store

        with engine.begin() as conn:
            for worker_id in ("keys-live", "keys-gone"):
                registration = store.WorkerRegistration(worker_id, "host", 1, ("keys",), 2, "poll", "0.1.0", 10_000)
                store.register_worker(conn, registration)
            conn.execute(
                text(
                    "UPDATE watchdog_workers SET last_seen = last_seen - 600000, started_at = started_at - 600000"
                    " WHERE worker_id = 'keys-gone'"
                )
            )
            store.record_schedules(
                conn,
                [
                    store.ScheduleRecord("keys-report", "f-1", "0 * * * *", "UTC", "keys", None, None),
                    store.ScheduleRecord("keys-report", "f-2", "30 * * * *", "UTC", "keys", None, None),
                ],
                "keys-live",
            )
    url = {
        "overview": f"{base_url}/rw/",
        "job": f"{base_url}/rw/job?job_id=keys-1",
        "workers": f"{base_url}/rw/workers",
    }[page]
    browser.get(url)
    by_css(browser, "h1")
    describe = (  # the focused element; marks it, so a second visit ends the round
        "const el = document.activeElement; const seen = el.__tabbed === true; el.__tabbed = true;"
        "return [el.tagName, el.getAttribute('href') || el.getAttribute('name') || '', el.textContent.trim().slice(0, 40),"
        " getComputedStyle(el).outlineStyle, parseFloat(getComputedStyle(el).outlineWidth), seen];"
    )
    # In one script: the overview refreshes itself, replacing its elements.
    wanted = {
        tuple(item)
        for item in browser.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]))"
            ".filter(el => el.classList.contains('skip') || el.getClientRects().length)"
            ".map(el => [el.tagName, el.getAttribute('href') || el.getAttribute('name') || '',"
            " el.textContent.trim().slice(0, 40)]);",
            FOCUSABLE,
        )
    }
    assert len(wanted) >= 4
    if page == "overview":  # every kind of action is among them
        assert {"Pause", "Resume", "Purge…"} <= {label for tag, _, label in wanted if tag == "BUTTON"}
    elif page == "workers":
        assert ("A", "/rw/workers", "Workers") in wanted
    else:
        assert ("BUTTON", "", "Cancel job…") in wanted or ("BUTTON", "", "Rerun") in wanted
    reached: set[tuple[str, str, str]] = set()

    def tab() -> None:
        ActionChains(browser).send_keys(Keys.TAB).perform()

    tab()
    for _ in range(200):
        tag, key, label, outline, width, seen = browser.execute_script(describe)
        if tag == "BODY" or seen:
            break
        reached.add((tag, key, label))
        assert outline != "none" and width >= 2, f"no visible focus on {tag} {key} {label!r}"
        tab()
    missing = wanted - reached
    assert not missing, f"not reachable with Tab: {sorted(missing)}"
    checked, failures = browser.execute_script(CONTRAST_JS)
    assert checked > 20 and failures == [], failures
    watchdog.resume("keys")
