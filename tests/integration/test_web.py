"""The web dashboard (``sqlalchemy_watchdog.web``) through Starlette's TestClient,
on SQLite and PostgreSQL, its pages on MariaDB too: pages, each action's result in the library's words,
CSRF, ``read_only``, ``authorize``, escaping, mounting, the sync and async
engines, the ``throughput()`` read behind the chart, and the ``dashboard``
command. The real-browser tests are in ``test_web_browser.py``.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient

from sqlalchemy_watchdog import (
    Decision,
    Job,
    JobState,
    Outcome,
    Rate,
    RetryPolicy,
    Runner,
    RunningJob,
    Watchdog,
    store,
)
from sqlalchemy_watchdog.asyncio import AsyncWatchdog
from sqlalchemy_watchdog.cli import main
from sqlalchemy_watchdog.jobs import THROUGHPUT_MINUTES
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.web import ACTIONS, create_app
from tests.conftest import WITH_MARIADB, make_async_engine
from tests.helpers import present

# The dialect does not matter here but where a test says dialect_specific: the PostgreSQL copy
# runs under CI=true or WATCHDOG_ALL_DIALECTS=1 (tests/conftest.py).
pytestmark = pytest.mark.dialect_neutral

#: The tests of the pages (the overview and its fragment, the job lists, a
#: lane, a job, the workers) run on MariaDB too, with WATCHDOG_TEST_MYSQL_URL:
#: their reads are each dialect's own SQL. The actions' tests stay on SQLite and
#: PostgreSQL (each action is a store operation the conformance suite runs on
#: MariaDB). The test of 100 KB payloads runs there too: the payload columns
#: are LONGTEXT (revision w0023).
ALSO_ON_MARIADB = pytest.mark.parametrize("dialect", WITH_MARIADB)

ROOT = Path(__file__).resolve().parents[2]

#: Untrusted text: markup that would run if it reached the page unescaped.
SCRIPT = "<script>window.__xss=1</script>"
IMG = "<img src=x onerror=window.__xss=2>"
CONTROL = "\x07bell\x1b[31m\u202egpj.exe\u061c\u180e"


def token_of(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match is not None, "the page has no action form"
    return match.group(1)


def status_of(page: str) -> str:
    match = re.search(r'id="result-status" data-status="([^"]+)"', page)
    assert match is not None, f"no result on the page: {page[:2000]}"
    return html.unescape(match.group(1))


class Dashboard:
    """A TestClient on the dashboard, with its CSRF token at hand."""

    def __init__(self, client: TestClient, prefix: str = "") -> None:
        self.client = client
        self.prefix = prefix
        page = client.get(prefix + "/")
        assert page.status_code == 200, page.text
        self.token = token_of(page.text) if "csrf_token" in page.text else ""

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(self.prefix + path, params=params)

    def post(self, action: str, *, token: str | None = None, **fields: str) -> Any:
        data = {"csrf_token": self.token if token is None else token, **fields}
        return self.client.post(f"{self.prefix}/actions/{action}", data=data)


@pytest.fixture
def watchdog(engine: Engine) -> Watchdog:
    return Watchdog(engine)


@pytest.fixture
def dashboard(engine: Engine, watchdog: Watchdog) -> Iterator[Dashboard]:
    # A queue with something to show, so the overview has action forms.
    watchdog.enqueue(Job("seed", "seed-queue"))
    with TestClient(create_app(engine)) as client:
        yield Dashboard(client)


def settle(engine: Engine, handlers: dict[str, Any]) -> None:
    Runner(engine, handlers).run_until_idle()


# -- pages ---------------------------------------------------------------------------


@ALSO_ON_MARIADB
def test_a_job_whose_stored_payload_is_undecodable_is_shown_as_unknown(
    engine: Engine, watchdog: Watchdog, dashboard: Dashboard
) -> None:
    watchdog.enqueue(Job("poisoned", "emails"))
    with engine.begin() as conn:  # a producer's own UPDATE
        conn.execute(
            jobs_table.update()
            .where(jobs_table.c.job_id == "poisoned")
            .values(payload_json="[" * 1500 + "]" * 1500, trace_context="[" * 1500 + "]" * 1500)
        )
    page = dashboard.get("/job", job_id="poisoned")
    assert page.status_code == 200
    assert "&lt;undecodable payload_json: RecursionError" in page.text
    assert dashboard.get("/jobs", queue="emails").status_code == 200
    assert dashboard.get("/").status_code == 200


@ALSO_ON_MARIADB
def test_pages_show_queues_jobs_and_a_job(engine: Engine, watchdog: Watchdog, dashboard: Dashboard) -> None:
    watchdog.enqueue(
        [Job(f"order-{n}", "emails", lane=f"customer:{n % 2}", payload={"order_id": n}) for n in range(6)]
        + [Job("report-1", "reports")]
    )
    settle(
        engine,
        {"emails": lambda job: Decision.failed("smtp down", retry=False) if job.payload["order_id"] < 2 else None},
    )
    watchdog.pause("reports", reason="month end")

    overview = dashboard.get("/")
    assert overview.status_code == 200
    assert overview.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")
    page = overview.text
    assert "4 completed" in page and "2 failed" in page  # settled in the last hour, by outcome
    assert "month end" in page and 'class="badge paused"' in page
    assert "<svg" in page and "Jobs settled per minute over the last hour: 4 completed, 2 failed" in page
    assert dashboard.get("/overview.fragment").text.count("<table") == 1  # the swappable part alone

    listed = dashboard.get("/jobs", queue="emails", outcome="failed").text
    assert "order-0" in listed and "order-1" in listed and "order-2" not in listed
    assert dashboard.get("/jobs", prefix="order-5").text.count('href="/job?job_id=') == 1
    lane = dashboard.get("/lane", lane="customer:1").text
    assert "order-1" in lane and "order-3" in lane and "order-2" not in lane

    job = dashboard.get("/job", job_id="order-0").text
    assert "smtp down" in job and "attempt 1 failed" in job and "enqueued" in job
    assert "&#34;order_id&#34;: 0" in job  # the payload, pretty-printed JSON
    assert dashboard.get("/job", job_id="nope").status_code == 404


@ALSO_ON_MARIADB
def test_the_workers_page_shows_live_and_gone_workers_and_disputed_schedules(
    engine: Engine, dashboard: Dashboard
) -> None:
    from sqlalchemy import text

    from sqlalchemy_watchdog import store

    assert "No worker is registered" in dashboard.get("/workers").text
    with engine.begin() as conn:
        for worker_id, host in (("w-live", "web-1"), ("w-dead", "<b>evil</b>")):
            registration = store.WorkerRegistration(
                worker_id, host, 42, ("emails", "pdf"), 4, "listen", "0.1.0", 10_000, claim_ahead=16,
                process_queues=("pdf",),
            )  # fmt: skip
            store.register_worker(conn, registration, running=19)
        conn.execute(
            text(
                "UPDATE watchdog_workers SET last_seen = last_seen - 600000, started_at = started_at - 600000 WHERE worker_id = 'w-dead'"
            )
        )
        store.record_schedules(
            conn,
            [
                store.ScheduleRecord("report", "f-1", "0 * * * *", "UTC", "reports", None, None),
                store.ScheduleRecord("report", "f-2", "30 * * * *", "UTC", "reports", None, None),
                store.ScheduleRecord("nightly", "f-3", "0 3 * * *", "Europe/Paris", "reports", None, None),
            ],
            "w-live",
        )
    page = dashboard.get("/workers")
    assert page.status_code == 200
    text_ = page.text
    assert "1 live, 1 gone" in text_ and 'class="badge gone">gone</span>' in text_
    assert "web-1" in text_ and "&lt;b&gt;evil&lt;/b&gt;" in text_ and "<b>evil</b>" not in text_
    # It holds 19 jobs on 4 slots: the page says it may claim 16 ahead, and that running counts them.
    assert '<td class="num">19</td>\n<td class="num">4</td>\n<td class="num">16</td>' in text_
    assert "claim ahead</abbr>" in text_ and "at most <em>concurrency</em> + <em>claim ahead</em>" in text_
    # Its pdf handlers run in child processes, its emails handlers in its own process.
    assert (
        '<a href="/jobs?queue=emails">emails</a>, <a href="/jobs?queue=pdf">pdf</a> '
        '<span class="badge" title="its handlers run in child processes of the worker">process</span></td>'
    ) in text_
    assert text_.count(">process</span>") == 2 and "A queue marked <em>process</em> runs its handlers" in text_
    assert "Deploys disagree about the definition of <strong>report</strong>" in text_
    assert text_.count(">disputed</span>") == 2 and "Europe/Paris" in text_
    assert 'href="/workers" aria-current="page">Workers</a>' in text_  # in the nav


@ALSO_ON_MARIADB
def test_a_gone_worker_shows_no_running_count(engine: Engine, dashboard: Dashboard) -> None:
    """A worker past its expiry holds nothing any more (its jobs are recovered
    when their leases end): its last count is not shown as if it ran them."""
    from sqlalchemy import text

    with engine.begin() as conn:
        for worker_id in ("w-live", "w-dead"):
            registration = store.WorkerRegistration(worker_id, "web-1", 42, ("emails",), 4, "listen", "0.1.0", 10_000)
            store.register_worker(conn, registration, running=3)
        conn.execute(
            text(
                "UPDATE watchdog_workers SET last_seen = last_seen - 600000, started_at = started_at - 600000"
                " WHERE worker_id = 'w-dead'"
            )
        )
    rows = {
        row.split("</th>")[0].rsplit(">", 1)[-1]: row
        for row in dashboard.get("/workers").text.split("<tr")
        if 'scope="row"' in row
    }
    assert '<td class="num">3</td>' in rows["w-live"]
    assert '<td class="num">3</td>' not in rows["w-dead"] and 'class="badge gone">gone</span>' in rows["w-dead"]


@ALSO_ON_MARIADB
def test_the_timeline_shows_the_claims_before_the_last(
    engine: Engine, watchdog: Watchdog, dashboard: Dashboard
) -> None:
    """A job recovered once, then failed once and completed: its timeline
    says the two claims before the last -- not only the last start."""
    policy = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=1), jitter=0)
    watchdog.enqueue(Job("twice", "tq", max_recoveries=2, retry=policy))
    with engine.begin() as conn:  # its first worker died: the lease ends
        store.claim(conn, queues=["tq"], limit=1, lease_ms=60_000)
        conn.exec_driver_sql("UPDATE watchdog_jobs SET lease_until = 0 WHERE job_id = 'twice'")

    def flaky(job: RunningJob) -> None:
        if job.attempt == 1:
            raise RuntimeError("smtp said no")

    runner = Runner(engine, {"tq": flaky})
    for _ in range(200):
        runner.run_until_idle()
        if present(watchdog.read("twice")).state is JobState.SETTLED:
            break
        time.sleep(0.02)
    job = present(watchdog.read("twice"))
    assert (job.outcome, job.attempt, job.recovery_count) == (Outcome.COMPLETED, 2, 1)
    page = html.unescape(dashboard.get("/job", job_id="twice").text)
    assert "attempt 1 failed" in page and "attempt 2 started" in page
    assert (
        'before the last start <strong>earlier claims</strong>: <span class="reason">2 earlier claims: '
        "1 failed attempt, 1 recovery (its execution vanished and it was requeued; when is not stored)</span>"
    ) in page


@ALSO_ON_MARIADB
def test_the_overview_flags_a_queue_with_ready_jobs_and_no_live_worker(
    engine: Engine, watchdog: Watchdog, dashboard: Dashboard
) -> None:
    from sqlalchemy_watchdog import store

    with engine.begin() as conn:
        registration = store.WorkerRegistration("w-1", "web-1", 42, ("served",), 4, "listen", "0.1.0", 10_000)
        store.register_worker(conn, registration)
    watchdog.enqueue([Job("s-1", "served"), Job("o-1", "orphaned")])
    page = dashboard.get("/").text
    assert re.search(r'role="alert">Ready jobs wait and no live worker serves .*orphaned.*seed-queue', page), page
    assert "served</a>," not in page.split('role="alert">')[1].split("</p>")[0]
    assert page.count('class="badge gone">no live worker</span>') == 2
    assert 'aria-label="1 live workers serve served"' in page


@ALSO_ON_MARIADB
def test_the_job_page_lists_the_jobs_durable_steps(engine: Engine, watchdog: Watchdog, dashboard: Dashboard) -> None:
    watchdog.enqueue(Job("booking", "emails"))

    def book(job: RunningJob) -> None:
        job.step("reserve", lambda: "12C")
        # The listing orders steps by their time on the database clock, in
        # milliseconds (within one millisecond by name: docs/howto/durable-steps.md).
        time.sleep(0.005)
        job.step("charge", lambda: "ch_1")

    Runner(engine, {"emails": book}).run_until_idle()
    page = dashboard.get("/job", job_id="booking").text
    assert page.index("reserve</span> step, attempt 1") < page.index("charge</span> step, attempt 1")


@ALSO_ON_MARIADB
def test_the_job_page_lists_a_jobs_wait_with_how_it_stands_its_signals_and_undos(
    engine: Engine, watchdog: Watchdog, dashboard: Dashboard
) -> None:
    watchdog.enqueue([Job("post", "emails"), Job("saga", "emails")])

    def handle(job: RunningJob) -> None:
        if job.job_id == "post":
            job.wait_for("approved", timeout=timedelta(hours=1))
            return
        job.step("reserve", lambda: "12C", undo=lambda seat: None)
        raise RuntimeError("fails for good")

    runner = Runner(engine, {"emails": handle})
    runner.run_until_idle()
    page = dashboard.get("/job", job_id="post").text
    assert "approved</span> wait for the signal: waiting until " in page
    watchdog.signal("post", "approved", "yes")
    page = dashboard.get("/job", job_id="post").text
    assert "approved</span> wait for the signal: signalled at " in page
    assert 'id="f-signals"' in page and "approved</span> kept at " in page
    page = dashboard.get("/job", job_id="saga").text
    assert page.index("reserve</span> step, attempt 1") < page.index("undo:reserve</span> undo, attempt 1")


@ALSO_ON_MARIADB
def test_the_job_page_says_what_applies_and_the_reason_in_plain_words(
    engine: Engine, watchdog: Watchdog, dashboard: Dashboard
) -> None:
    watchdog.enqueue(
        [
            Job("own", "emails", retry=RetryPolicy(max_attempts=4), timeout=timedelta(seconds=30)),
            Job("runners", "emails"),
            Job("budgeted", "emails", max_recoveries=3),
        ]
    )
    watchdog.pause("emails", reason="smtp maintenance")
    own = dashboard.get("/job", job_id="own").text
    assert '<dd id="f-attempt">1 of 4</dd>' in own
    assert "unique key" not in own
    watchdog.enqueue(Job("held", "emails", unique_key="export:7", debounce=timedelta(minutes=5)))
    replaced = watchdog.enqueue(Job("later", "emails", unique_key="export:7", debounce=timedelta(minutes=5)))
    assert (replaced.job_id, replaced.status.value) == ("held", "replaced")
    held = dashboard.get("/job", job_id="held").text
    assert "&#39;export:7&#39; (debounce: starts" in held and "1 replaced its payload" in held
    assert '<dd id="f-timeout">30s (the job&#39;s own)</dd>' in own
    assert "paused since" in own and "smtp maintenance" in own
    runners = dashboard.get("/job", job_id="runners").text
    assert "1 (of its handler&#39;s or runner&#39;s maximum, not known here)" in runners
    assert (
        "its handler&#39;s or the runner&#39;s timeout (@handler(queue, timeout=...) or Runner(timeout=...)" in runners
    )
    assert '<dd id="f-recoveries">0 (of its handler&#39;s or runner&#39;s budget, not known here;' in runners
    assert '<dd id="f-recoveries">0 of 3 (the job&#39;s own)</dd>' in dashboard.get("/job", job_id="budgeted").text

    watchdog.resume("emails")
    watchdog.enqueue(Job("lost", "lost-q"))
    with engine.begin() as conn:
        store.claim(conn, queues=["lost-q"], limit=1, lease_ms=60_000)
        conn.exec_driver_sql("UPDATE watchdog_jobs SET lease_until = 0 WHERE job_id = 'lost'")
    settle(engine, {"lost-q": lambda job: None})  # the runner recovers it: interrupted
    lost = dashboard.get("/job", job_id="lost").text
    assert '<p class="plain-reason">worker died or lost its lease (no recovery budget' in lost
    assert "Execution disappeared without a recovery policy" in lost  # the stored text, below
    assert "not paused" in lost


@ALSO_ON_MARIADB
def test_job_and_lane_lists_show_the_newest_first_and_page_both_ways(watchdog: Watchdog, dashboard: Dashboard) -> None:
    watchdog.enqueue([Job(f"bulk-{n:03d}", "bulk", lane="lane-b") for n in range(60)])
    for path, query in (("/jobs", {"queue": "bulk"}), ("/lane", {"lane": "lane-b"})):
        first = dashboard.get(path, **query, limit="25").text
        ids = list(dict.fromkeys(re.findall(r"bulk-\d{3}", first)))
        assert ids == [f"bulk-{n:03d}" for n in range(59, 34, -1)]  # the newest 25, newest first
        assert 'rel="prev"' not in first
        before = re.search(r'rel="next" href="[^"]*before=(\d+)', first)
        assert before is not None
        second = dashboard.get(path, **query, limit="25", before=before.group(1)).text
        assert re.findall(r"bulk-\d{3}", second)[0] == "bulk-034"
        older = re.search(r'rel="next" href="[^"]*before=(\d+)', second)
        assert older is not None
        last = dashboard.get(path, **query, limit="25", before=older.group(1)).text
        assert list(dict.fromkeys(re.findall(r"bulk-\d{3}", last))) == [f"bulk-{n:03d}" for n in range(9, -1, -1)]
        assert 'rel="next"' not in last
        # And back up: the page newer than the last is the second again.
        newer = re.search(r'rel="prev" href="[^"]*after=(\d+)', last)
        assert newer is not None
        back = dashboard.get(path, **query, limit="25", after=newer.group(1)).text
        assert list(dict.fromkeys(re.findall(r"bulk-\d{3}", back))) == [f"bulk-{n:03d}" for n in range(34, 9, -1)]
        top = re.search(r'rel="prev" href="[^"]*after=(\d+)', back)
        assert top is not None
        assert re.findall(r"bulk-\d{3}", dashboard.get(path, **query, limit="25", after=top.group(1)).text)[0] == (
            "bulk-059"
        )


def test_bulk_rerun_and_cancel_confirm_with_the_count_then_act_once(
    engine: Engine, watchdog: Watchdog, dashboard: Dashboard
) -> None:
    watchdog.enqueue([Job(f"bulk-{n}", "bulk") for n in range(4)])
    settle(engine, {"bulk": lambda job: Decision.failed("down", retry=False) if job.job_id != "bulk-3" else None})
    watchdog.enqueue([Job("live-1", "bulk"), Job("live-2", "bulk", lane="team")])

    listed = dashboard.get("/jobs", queue="bulk", outcome="failed").text
    assert "Rerun every matching settled job" in listed
    assert "Cancel every matching live job" not in listed  # live jobs have no outcome
    fields = {"enc.queue": "bulk", "enc.outcome": "failed", "rerun_id": "fix-1"}
    confirm = dashboard.post("bulk-rerun", **fields)
    assert confirm.status_code == 200 and 'data-count="3"' in confirm.text
    assert watchdog.read("bulk-0~rerun~fix-1") is None  # asked, not done
    done = dashboard.post("bulk-rerun", **fields, confirm="yes")
    assert done.status_code == 200 and 'data-status="rerun 3"' in done.text
    assert [present(watchdog.read(f"bulk-{n}")).reruns for n in range(3)] == [
        (f"bulk-{n}~rerun~fix-1",) for n in range(3)
    ]
    again = dashboard.post("bulk-rerun", **fields, confirm="yes")  # a second click, a reload
    assert 'data-status="rerun 0"' in again.text and "3 already rerun" in again.text

    assert "Cancel every matching live job" in dashboard.get("/jobs", lane="team").text
    confirm = dashboard.post("bulk-cancel", **{"enc.lane": "team", "enc.cancellation_id": "stop-1"})
    assert 'data-count="1"' in confirm.text
    done = dashboard.post("bulk-cancel", **{"enc.lane": "team", "enc.cancellation_id": "stop-1", "confirm": "yes"})
    assert 'data-status="cancelled 1"' in done.text
    assert present(watchdog.read("live-2")).cancellation_id == "stop-1~live-2"
    assert present(watchdog.read("live-1")).cancellation_id is None


@pytest.mark.parametrize(
    ("action", "fields", "names"),
    [
        ("bulk-rerun", {"rerun_id": "r"}, "filter"),
        ("bulk-rerun", {"queue": "bulk", "outcome": "lost", "rerun_id": "r"}, "outcome"),
        ("bulk-rerun", {"queue": "bulk", "settled_within": "2y", "rerun_id": "r"}, "settled_within"),
        ("bulk-rerun", {"queue": "bulk"}, "rerun_id"),
        ("bulk-cancel", {"cancellation_id": "c"}, "filter"),
    ],
)
def test_a_bad_bulk_form_is_refused_naming_the_field_and_changes_nothing(
    watchdog: Watchdog, dashboard: Dashboard, action: str, fields: dict[str, str], names: str
) -> None:
    watchdog.enqueue(Job("bulk-live", "bulk"))
    # Asked (the confirmation page) or confirmed: refused either way (a form
    # field the page checks: 400; an argument the library refuses: 409).
    for confirm, statuses in (({}, {400}), ({"confirm": "yes"}, {400, 409})):
        response = dashboard.post(action, **fields, **confirm)
        assert response.status_code in statuses and names in response.text, response.text
    assert present(watchdog.read("bulk-live")).cancellation_id is None
    assert watchdog.list_jobs(job_id_prefix="bulk-live~") == []


@pytest.mark.parametrize(
    ("query", "status", "names"),
    [
        ({"state": "bogus"}, 400, "state"),
        ({"outcome": "won"}, 400, "outcome"),
        ({"limit": "7"}, 400, "limit"),
        ({"after": "x"}, 400, "after"),
        ({"before": "0"}, 400, "before"),
        ({"before": "5", "after": "2"}, 400, "before"),
    ],
)
def test_bad_filters_are_refused_naming_the_field(
    dashboard: Dashboard, query: dict[str, str], status: int, names: str
) -> None:
    response = dashboard.get("/jobs", **query)
    assert response.status_code == status
    assert f"{names}" in response.text


def test_missing_subjects(dashboard: Dashboard) -> None:
    assert dashboard.get("/job").status_code == 400
    assert dashboard.get("/lane").status_code == 400
    assert dashboard.post("explode").status_code == 404


# -- actions ----------------------------------------------------------------------------


def test_cancel_confirms_first_then_reports_the_library_result(
    engine: Engine, watchdog: Watchdog, dashboard: Dashboard
) -> None:
    watchdog.enqueue([Job("a", "q"), Job("b", "q")])
    asking = dashboard.post("cancel", job_id="a", cancellation_id="web-1")
    assert asking.status_code == 200 and "Yes, cancel" in asking.text
    assert present(watchdog.read("a")).cancellation_id is None  # nothing done before the confirmation
    assert token_of(asking.text) == dashboard.token

    assert status_of(dashboard.post("cancel", job_id="a", cancellation_id="web-1", confirm="yes").text) == "recorded"
    assert present(watchdog.read("a")).cancellation_id == "web-1"
    # A double click sends the same form again: one cancellation.
    assert status_of(dashboard.post("cancel", job_id="a", cancellation_id="web-1", confirm="yes").text) == "replayed"
    assert status_of(dashboard.post("cancel", job_id="a", cancellation_id="web-2", confirm="yes").text) == "conflict"
    assert status_of(dashboard.post("cancel", job_id="zz", cancellation_id="web-3", confirm="yes").text) == "missing"
    settle(engine, {"q": lambda job: None})
    assert present(watchdog.read("a")).outcome is Outcome.CANCELLED
    assert present(watchdog.read("b")).outcome is Outcome.COMPLETED


def test_pause_resume_purge_fail_lane_rerun(engine: Engine, watchdog: Watchdog, dashboard: Dashboard) -> None:
    watchdog.enqueue([Job(f"p{n}", "pq") for n in range(3)] + [Job(f"l{n}", "lq", lane="bad-lane") for n in range(2)])

    assert status_of(dashboard.post("pause", queue="pq", reason="maintenance").text) == "paused"
    assert status_of(dashboard.post("pause", queue="pq").text) == "already_paused"
    assert present(watchdog.stats().queue("pq").pause).reason == "maintenance"
    assert Runner(engine, {"pq": lambda job: None}).run_until_idle() == []  # paused: nothing claimed
    assert status_of(dashboard.post("resume", queue="pq").text) == "resumed"
    assert status_of(dashboard.post("resume", queue="pq").text) == "not_paused"

    assert "Yes, purge" in dashboard.post("purge", queue="pq").text
    assert watchdog.stats().queue("pq").queued == 3
    assert status_of(dashboard.post("purge", queue="pq", confirm="yes").text) == "deleted 3"
    assert status_of(dashboard.post("purge", queue="pq", confirm="yes").text) == "deleted 0"

    assert "Yes, fail lane" in dashboard.post("fail-lane", lane="bad-lane", reason="vendor gone").text
    assert present(watchdog.read("l0")).state is JobState.QUEUED
    done = dashboard.post("fail-lane", lane="bad-lane", reason="vendor gone", confirm="yes")
    assert status_of(done.text) == "settled 2"
    assert (
        present(watchdog.read("l1")).outcome is Outcome.FAILED
        and present(watchdog.read("l1")).failure_reason == "vendor gone"
    )

    rerun = dashboard.post("rerun", job_id="l0", rerun_id="ticket-7")
    assert status_of(rerun.text) == "queued" and "l0~rerun~ticket-7" in rerun.text
    assert status_of(dashboard.post("rerun", job_id="l0", rerun_id="ticket-7").text) == "duplicate"
    assert present(watchdog.read("l0")).reruns == ("l0~rerun~ticket-7",)
    refused = dashboard.post("rerun", job_id="l0~rerun~ticket-7", rerun_id="again")
    assert refused.status_code == 409 and status_of(refused.text) == "refused"
    assert "only a settled job can be rerun" in html.unescape(refused.text)


@ALSO_ON_MARIADB
def test_limits_are_shown_set_and_cleared_by_form(engine: Engine, watchdog: Watchdog, dashboard: Dashboard) -> None:
    assert "No queue has limits" in dashboard.get("/").text
    watchdog.enqueue([Job(f"e{n}", "exports", key=f"customer-{n % 2}") for n in range(4)])
    done = dashboard.post("set-limits", queue="exports", concurrency="1", concurrency_per_key="1", rate="100/minute")
    assert status_of(done.text) == "set" and "at most 1 running" in done.text
    (limits,) = watchdog.limits()
    assert (limits.queue, limits.concurrency, limits.concurrency_per_key, str(limits.rate)) == (
        "exports",
        1,
        1,
        "100/m",
    )
    with store.write_transaction(engine) as conn:
        store.claim(conn, queues=["exports"], limit=4, lease_ms=60_000)
    page = dashboard.get("/").text
    assert "3 held back by limits" in page and 'aria-labelledby="limits-h"' in page
    assert "100/m (1)" in page  # the rate, and the claims counted in its window
    job = dashboard.get("/job", job_id="e3").text
    assert "customer-1" in job and "concurrency limit leaves no room now" in job
    refused = dashboard.post("set-limits", queue="exports", concurrency="0")
    assert status_of(refused.text) == "refused" and "concurrency" in refused.text
    refused = dashboard.post("set-limits", queue="exports", rate="many/minute")
    assert status_of(refused.text) == "refused" and "rate" in refused.text
    refused = dashboard.post("set-limits", queue="exports", rate_per_key="0/minute")
    assert status_of(refused.text) == "refused" and "rate_per_key" in refused.text
    assert watchdog.limits() == (limits,)  # nothing written
    done = dashboard.post("set-limits", queue="per-key", rate_per_key="10/minute")
    assert status_of(done.text) == "set" and "at most 10 started per key per 0:01:00" in done.text
    assert "10/m (0)" in dashboard.get("/").text  # the per-key rate, and its busiest key's claims in the window
    assert [limits.rate_per_key for limits in watchdog.limits()] == [
        limits.rate_per_key,
        Rate(10, timedelta(minutes=1)),
    ]
    assert watchdog.clear_limits("per-key")
    assert status_of(dashboard.post("clear-limits", queue="exports").text) == "cleared"
    assert status_of(dashboard.post("clear-limits", queue="exports").text) == "not_limited"
    assert watchdog.limits() == ()


def test_an_action_without_its_fields_is_a_bad_request(watchdog: Watchdog, dashboard: Dashboard) -> None:
    response = dashboard.post("cancel", job_id="seed")
    assert response.status_code == 400 and "cancellation_id" in response.text
    assert present(watchdog.read("seed")).cancellation_id is None


# -- CSRF, read_only, authorize ----------------------------------------------------------------


def test_csrf_token_is_required_and_must_match_the_cookie(engine: Engine, watchdog: Watchdog) -> None:
    watchdog.enqueue(Job("victim", "q"))
    app = create_app(engine, secret="s" * 32)
    with TestClient(app) as client:
        dashboard = Dashboard(client)
        fields = {"job_id": "victim", "cancellation_id": "csrf", "confirm": "yes"}
        assert dashboard.post("cancel", token="", **fields).status_code == 403
        assert dashboard.post("cancel", token=dashboard.token[:-1] + "x", **fields).status_code == 403
        # A request from another site carries no cookie (SameSite=Strict) but may know a token.
        with TestClient(app) as stranger:
            refused = stranger.post("/actions/cancel", data={"csrf_token": dashboard.token, **fields})
            assert refused.status_code == 403 and "security token" in refused.text
        # A forged cookie needs the secret.
        with TestClient(app, cookies={"watchdog_csrf": "forged.0000"}) as forger:
            assert forger.post("/actions/cancel", data={"csrf_token": "forged", **fields}).status_code == 403
        # Not a form at all.
        assert client.post("/actions/cancel", json={"csrf_token": dashboard.token, **fields}).status_code == 403
        assert present(watchdog.read("victim")).cancellation_id is None
        assert status_of(dashboard.post("cancel", **fields).text) == "recorded"
    # The token is bound to the secret: another process (another secret) refuses it.
    with TestClient(create_app(engine, secret="t" * 32), cookies=client.cookies) as other:
        assert other.post("/actions/pause", data={"csrf_token": dashboard.token, "queue": "q"}).status_code == 403


def test_the_csrf_cookie_is_http_only_strict_and_scoped(engine: Engine) -> None:
    parent = Starlette(routes=[Mount("/ops/watchdog", create_app(engine))])
    with TestClient(parent) as client:
        cookie = client.get("/ops/watchdog/").headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ops/watchdog" in cookie


def test_read_only_hides_and_refuses_every_action(engine: Engine, watchdog: Watchdog) -> None:
    watchdog.enqueue([Job("ro-1", "q"), Job("ro-2", "q", lane="l")])
    with TestClient(create_app(engine, read_only=True)) as client:
        pages = [client.get(path).text for path in ("/", "/jobs", "/job?job_id=ro-1", "/lane?lane=l")]
        for page in pages:
            assert "/actions/" not in page and 'method="post"' not in page
        assert "read-only" in pages[0]
        # Even with a valid token (from a writable twin on the same secret) every POST is refused.
        with TestClient(create_app(engine, secret="k" * 32)) as twin:
            token = token_of(twin.get("/").text)
            cookies = twin.cookies
        with TestClient(create_app(engine, read_only=True, secret="k" * 32), cookies=cookies) as ro:
            for action, fields in [
                ("cancel", {"job_id": "ro-1", "cancellation_id": "x", "confirm": "yes"}),
                ("pause", {"queue": "q"}),
                ("purge", {"queue": "q", "confirm": "yes"}),
                ("fail-lane", {"lane": "l", "reason": "r", "confirm": "yes"}),
                ("resume", {"queue": "q"}),
                ("rerun", {"job_id": "ro-1", "rerun_id": "r"}),
            ]:
                response = ro.post(f"/actions/{action}", data={"csrf_token": token, **fields})
                assert response.status_code == 403 and "read-only" in response.text, action
    assert watchdog.stats().queue("q").queued == 2 and not watchdog.stats().queue("q").paused
    assert present(watchdog.read("ro-1")).cancellation_id is None


def test_authorize_decides_per_action(engine: Engine, watchdog: Watchdog) -> None:
    watchdog.enqueue(Job("auth-1", "q"))
    asked: list[tuple[str, str]] = []

    async def authorize(request: Request, action: str) -> bool:  # a coroutine function works too
        asked.append((request.headers.get("x-user", ""), action))
        return action in ("view", "pause") or request.headers.get("x-user") == "admin"

    with TestClient(create_app(engine, authorize=authorize)) as client:
        dashboard = Dashboard(client)
        page = client.get("/job", params={"job_id": "auth-1"}).text
        assert "Cancel job" not in page
        overview = client.get("/").text
        assert "Pause</button>" in overview and "Purge" not in overview
        refused = dashboard.post("cancel", job_id="auth-1", cancellation_id="c", confirm="yes")
        assert refused.status_code == 403 and "You may not cancel" in refused.text
        assert present(watchdog.read("auth-1")).cancellation_id is None
        assert status_of(dashboard.post("pause", queue="q").text) == "paused"
        admin = client.post(
            "/actions/cancel",
            data={"csrf_token": dashboard.token, "job_id": "auth-1", "cancellation_id": "c", "confirm": "yes"},
            headers={"x-user": "admin"},
        )
        assert status_of(admin.text) == "recorded"
    assert {action for _, action in asked} >= {"view", *ACTIONS}


def test_authorize_can_refuse_viewing(engine: Engine) -> None:
    with TestClient(create_app(engine, authorize=lambda request, action: False)) as client:
        for path in ("/", "/overview.fragment", "/jobs", "/job?job_id=x", "/lane?lane=x"):
            response = client.get(path)
            assert response.status_code == 403 and "You may not view" in response.text, path


def test_a_visitor_authorize_refuses_gets_no_csrf_cookie_or_token(engine: Engine, watchdog: Watchdog) -> None:
    watchdog.enqueue(Job("seed", "q"))
    with TestClient(create_app(engine, authorize=lambda request, action: False)) as client:
        for path in ("/", "/jobs", "/no-such-page", "/static/dashboard.css"):
            response = client.get(path)
            assert response.status_code == 403, path
            assert "set-cookie" not in response.headers and "csrf_token" not in response.text, path
        refused = client.post("/actions/pause", data={"csrf_token": "x", "queue": "q"})
        assert refused.status_code == 403 and "set-cookie" not in refused.headers
        assert not client.cookies
    assert not watchdog.stats().queue("q").paused


def _by_header(request: Request, action: str) -> bool:
    """Anyone may look; only the operator may act."""
    return action == "view" or request.headers.get("x-user") == "operator"


def test_a_csrf_pair_minted_for_one_identity_is_refused_for_another(engine: Engine, watchdog: Watchdog) -> None:
    """The sibling-subdomain attack: a visitor (who may only look) takes a
    cookie and token of her own, plants the cookie in the operator's browser
    (same-site: SameSite=Strict does not stop it) and posts her token with
    the operator's authorization. The token is bound to who got it."""
    watchdog.enqueue(Job("seed", "q"))
    app = create_app(engine, authorize=_by_header, identify=lambda request: request.headers.get("x-user"))
    with TestClient(app, headers={"x-user": "mallory"}) as mallory:
        page = mallory.get("/")
        assert page.status_code == 200 and "Pause</button>" not in page.text
        planted = mallory.cookies["watchdog_csrf"]
        # The strongest visitor: one who also knows her session's form token (a
        # page with a form she may use shows it).
        token = app_token(app, planted, "mallory")
    with TestClient(app, headers={"x-user": "operator"}, cookies={"watchdog_csrf": planted}) as victim:
        forged = victim.post("/actions/pause", data={"csrf_token": token, "queue": "q"})
        assert forged.status_code == 403 and "security token" in forged.text
        assert not watchdog.stats().queue("q").paused
        # The operator's own page and form work.
        operator = Dashboard(victim)
        assert status_of(operator.post("pause", queue="q").text) == "paused"


def app_token(app: Any, cookie: str, identity: str) -> str:
    """The form token the dashboard would issue for ``cookie`` and ``identity``
    (what a visitor with the cookie could compute from her own page)."""
    csrf = _find_csrf(app)
    nonce = csrf.nonce_of(cookie)
    assert nonce is not None
    return str(csrf.form_token(nonce, identity))


def _find_csrf(app: Any) -> Any:
    for route in app.routes:
        endpoint = getattr(route, "endpoint", None)
        pages = getattr(endpoint, "__self__", None)
        if pages is not None:
            return pages.s.csrf
    raise AssertionError("no dashboard route")


def test_the_default_identity_is_the_authenticated_user_of_the_scope(engine: Engine, watchdog: Watchdog) -> None:
    from starlette.authentication import SimpleUser
    from starlette.types import ASGIApp, Receive, Scope, Send

    class Users:
        """What Starlette's AuthenticationMiddleware does: the user in the scope."""

        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                name = dict(scope["headers"]).get(b"x-user", b"").decode()
                scope["user"] = SimpleUser(name)
            await self.app(scope, receive, send)

    watchdog.enqueue(Job("seed", "q"))
    parent = Starlette(routes=[Mount("/wd", create_app(engine, authorize=_by_header))])
    parent.add_middleware(Users)
    with TestClient(parent, headers={"x-user": "mallory"}) as mallory:
        assert mallory.get("/wd/").status_code == 200
        planted = mallory.cookies["watchdog_csrf"]
        mounted = parent.routes[0]
        assert isinstance(mounted, Mount)
        token = app_token(mounted.app, planted, "display_name:mallory")
    with TestClient(parent, headers={"x-user": "operator"}, cookies={"watchdog_csrf": planted}) as victim:
        forged = victim.post("/wd/actions/pause", data={"csrf_token": token, "queue": "q"})
        assert forged.status_code == 403 and not watchdog.stats().queue("q").paused
        operator = Dashboard(victim, prefix="/wd")
        assert status_of(operator.post("pause", queue="q").text) == "paused"


def test_a_post_from_another_origin_is_refused(engine: Engine, watchdog: Watchdog) -> None:
    watchdog.enqueue(Job("seed", "q"))
    with TestClient(create_app(engine)) as client:
        dashboard = Dashboard(client)
        for headers in (
            {"origin": "https://evil.example.com"},
            {"origin": "null"},
            {"sec-fetch-site": "same-site", "origin": "https://evil.example.com"},
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "same-site", "origin": "http://testserver"},  # a forged Origin does not win
        ):
            response = client.post(
                "/actions/pause", data={"csrf_token": dashboard.token, "queue": "q"}, headers=headers
            )
            assert response.status_code == 403, headers
            assert "another" in response.text or "opaque" in response.text, headers
            assert not watchdog.stats().queue("q").paused, headers
        # The dashboard's own form, from a browser: same origin.
        same = client.post(
            "/actions/pause",
            data={"csrf_token": dashboard.token, "queue": "q"},
            headers={"origin": "http://testserver", "sec-fetch-site": "same-origin"},
        )
        assert status_of(same.text) == "paused"
        # Behind a proxy that rewrites Host, the browser's host is in X-Forwarded-Host.
        proxied = client.post(
            "/actions/resume",
            data={"csrf_token": dashboard.token, "queue": "q"},
            headers={
                "origin": "https://ops.example.com",
                "host": "127.0.0.1:8000",
                "x-forwarded-host": "ops.example.com",
            },
        )
        assert status_of(proxied.text) == "resumed"


def test_over_https_the_csrf_cookie_has_the_host_prefix(engine: Engine, watchdog: Watchdog) -> None:
    watchdog.enqueue(Job("seed", "q"))
    with TestClient(create_app(engine), base_url="https://testserver") as client:
        cookie = client.get("/").headers["set-cookie"]
        assert cookie.startswith("__Host-watchdog_csrf=") and "Path=/;" in cookie and "Secure" in cookie
        # A cookie of the plain name (what a sibling site could plant) is not read over https.
        dashboard = Dashboard(client)
        plain_cookie = client.cookies.get("__Host-watchdog_csrf")
        assert plain_cookie is not None
        client.cookies.delete("__Host-watchdog_csrf")
        client.cookies.set("watchdog_csrf", plain_cookie)
        assert dashboard.post("pause", queue="q").status_code == 403


def test_static_files_and_starlettes_own_answers_carry_the_headers_and_ask_authorize(engine: Engine) -> None:
    def authorize(request: Request, action: str) -> bool:
        return request.headers.get("x-user") == "ops"

    with TestClient(create_app(engine, authorize=authorize)) as client:
        responses = {
            "static": client.get("/static/dashboard.css", headers={"x-user": "ops"}),
            "404": client.get("/no-such-page", headers={"x-user": "ops"}),
            "405": client.get("/actions/pause", headers={"x-user": "ops"}),
            "static refused": client.get("/static/dashboard.css"),
            "404 refused": client.get("/no-such-page"),
        }
    assert [r.status_code for r in responses.values()] == [200, 404, 405, 403, 403]
    for name, response in responses.items():
        assert "default-src 'none'" in response.headers.get("content-security-policy", ""), name
        assert response.headers.get("x-frame-options") == "DENY", name
        assert response.headers.get("x-content-type-options") == "nosniff", name
    assert "POST" in responses["405"].headers["allow"]
    assert "no such page" in responses["404"].text


@pytest.mark.parametrize(
    "base_path", ["//evil.example", "http://x", "/ops\\evil", "\\\\evil", "/ops\x07", "/ops\u202e", "/a b", "/a?b", 5]
)
def test_base_path_must_be_a_path_of_this_site(engine: Engine, base_path: Any) -> None:
    with pytest.raises(ValueError, match="base_path"):
        create_app(engine, base_path=base_path)


# -- untrusted data stays data ------------------------------------------------------------------


@ALSO_ON_MARIADB
def test_untrusted_text_is_escaped_everywhere(engine: Engine, watchdog: Watchdog) -> None:
    nasty_id = f"{SCRIPT}{IMG}{CONTROL}"
    watchdog.enqueue(Job(nasty_id, f"q{SCRIPT}", lane=f"lane{IMG}{CONTROL}", payload={SCRIPT: [IMG, CONTROL]}))
    settle(engine, {f"q{SCRIPT}": lambda job: Decision.failed(f"{SCRIPT}{IMG}{CONTROL}", retry=False)})
    watchdog.pause(f"q{SCRIPT}", reason=IMG)
    with TestClient(create_app(engine)) as client:
        pages = {
            path: client.get(path, params=params).text
            for path, params in [
                ("/", {}),
                ("/jobs", {}),
                ("/job", {"job_id": nasty_id}),
                ("/lane", {"lane": f"lane{IMG}{CONTROL}"}),
            ]
        }
        token = token_of(pages["/"])
        pages["confirm"] = client.post("/actions/purge", data={"csrf_token": token, "queue": f"q{SCRIPT}"}).text
        pages["result"] = client.post(
            "/actions/rerun", data={"csrf_token": token, "job_id": nasty_id, "rerun_id": IMG}
        ).text
    for name, page in pages.items():
        assert SCRIPT not in page and "<img src=x" not in page, name
        for raw in ("\x07", "\x1b", "\u202e", "\u061c", "\u180e"):
            assert raw not in page, (name, hex(ord(raw)))
        assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page or "&lt;img src=x" in page, name
    # Control characters are shown as escapes, visibly marked.
    assert '<span class="ctl" title="U+0007">\\x07</span>' in pages["/job"]
    assert '<span class="ctl" title="U+202E">\\u202e</span>' in pages["/lane"]
    assert '<span class="ctl" title="U+061C">\\u061c</span>' in pages["/job"]
    assert '<span class="ctl" title="U+180E">\\u180e</span>' in pages["/job"]


# -- sync or async, mounted anywhere --------------------------------------------------------------


@pytest.mark.dialect_specific
@ALSO_ON_MARIADB
def test_an_async_engine_serves_the_same_pages_and_actions(engine: Engine) -> None:
    async def prepare() -> None:
        async_engine = make_async_engine(engine)
        try:
            await AsyncWatchdog(async_engine).enqueue([Job("async-1", "aq"), Job("async-2", "aq")])
            assert (await AsyncWatchdog(async_engine).throughput()).queues == {}
        finally:
            await async_engine.dispose()

    asyncio.run(prepare())
    app_engine = make_async_engine(engine)
    with TestClient(create_app(app_engine)) as client:  # the app's calls run on the client's event loop
        dashboard = Dashboard(client)
        assert "async-1" in dashboard.get("/jobs", queue="aq").text
        assert status_of(dashboard.post("pause", queue="aq").text) == "paused"
        cancelled = dashboard.post("cancel", job_id="async-2", cancellation_id="c", confirm="yes")
        assert status_of(cancelled.text) == "recorded"
        assert "paused since" in dashboard.get("/job", job_id="async-1").text  # explain, awaited
        confirm = dashboard.post("bulk-cancel", queue="aq", cancellation_id="bulk")
        assert 'data-count="2"' in confirm.text
        bulk = dashboard.post("bulk-cancel", queue="aq", cancellation_id="bulk", confirm="yes")
        assert status_of(bulk.text) == "cancelled 1"  # async-2 was cancelled already: skipped
        assert client.portal is not None
        client.portal.call(app_engine.dispose)
    watchdog = Watchdog(engine)
    assert watchdog.stats().queue("aq").paused and present(watchdog.read("async-2")).cancellation_id == "c"
    assert present(watchdog.read("async-1")).cancellation_id == "bulk~async-1"


def test_mounted_under_a_path_of_a_fastapi_app(engine: Engine, watchdog: Watchdog) -> None:
    from fastapi import FastAPI

    watchdog.enqueue(Job("mounted-1", "mq"))
    app = FastAPI()
    app.mount("/ops/watchdog", create_app(engine))
    with TestClient(app) as client:
        dashboard = Dashboard(client, prefix="/ops/watchdog")
        overview = dashboard.get("/").text
        links = re.findall(r'(?:href|action|src)="([^"#]+)"', overview)
        assert links and all(link.startswith("/ops/watchdog/") for link in links), links
        assert client.get("/ops/watchdog/static/dashboard.js").status_code == 200
        assert status_of(dashboard.post("pause", queue="mq").text) == "paused"
    # Behind a proxy that strips the prefix, base_path names what the browser sees.
    with TestClient(create_app(engine, base_path="/proxied/wd/")) as client:
        links = re.findall(r'(?:href|action|src)="([^"#]+)"', client.get("/").text)
        assert all(link.startswith("/proxied/wd/") for link in links), links


def test_create_app_refuses_bad_arguments(engine: Engine) -> None:
    with pytest.raises(TypeError, match="Engine or an AsyncEngine"):
        create_app("sqlite://")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="read_only"):
        create_app(engine, read_only="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="authorize"):
        create_app(engine, authorize="admin")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="base_path"):
        create_app(engine, base_path="watchdog")
    with pytest.raises(ValueError, match="secret"):
        create_app(engine, secret="short")
    with pytest.raises(ValueError, match="refresh_seconds"):
        create_app(engine, refresh_seconds=-1)


# -- the chart's read ---------------------------------------------------------------------------


@ALSO_ON_MARIADB
def test_throughput_counts_settled_jobs_per_minute(engine: Engine, watchdog: Watchdog) -> None:
    assert watchdog.throughput().queues == {}
    watchdog.enqueue([Job(f"t{n}", "ok" if n % 3 else "bad") for n in range(9)])
    settle(engine, {"ok": lambda job: None, "bad": lambda job: Decision.failed("no", retry=False)})
    watchdog.enqueue(Job("still-queued", "ok"))
    throughput = watchdog.throughput()
    assert set(throughput.queues) == {"ok", "bad"}
    ok = throughput.queues["ok"][Outcome.COMPLETED]
    assert len(ok) == THROUGHPUT_MINUTES and sum(ok) == 6 and ok[-1] == 6  # all in the last minute
    assert throughput.queues["bad"] == {Outcome.FAILED: (0,) * (THROUGHPUT_MINUTES - 1) + (3,)}
    total = throughput.per_minute()
    assert (sum(total[Outcome.COMPLETED]), sum(total[Outcome.FAILED])) == (6, 3)
    assert throughput.per_minute("bad") == {Outcome.FAILED: throughput.queues["bad"][Outcome.FAILED]}
    hour = {q.queue: dict(q.settled_last_hour) for q in watchdog.stats().queues}
    assert hour == {"ok": {Outcome.COMPLETED: 6}, "bad": {Outcome.FAILED: 3}}  # agrees with stats()


# -- import boundaries and the command ----------------------------------------------------------------


def test_core_never_imports_the_web_package_and_a_missing_extra_says_what_to_install() -> None:
    check = (
        "import sys\n"
        "import sqlalchemy_watchdog, sqlalchemy_watchdog.cli, sqlalchemy_watchdog.asyncio\n"
        "assert 'sqlalchemy_watchdog.web' not in sys.modules and 'starlette' not in sys.modules\n"
        "sys.modules['starlette'] = None\n"
        "try:\n"
        "    import sqlalchemy_watchdog.web\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'sqlalchemy-watchdog[web]'" in out.stdout


def test_dashboard_command_refuses_a_host_that_is_not_loopback(db_url: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = db_url.render_as_string(hide_password=False)
    assert main(["--url", url, "dashboard", "--host", "0.0.0.0"]) == 2
    assert "binds to 127.0.0.1 only" in capsys.readouterr().err


def test_dashboard_command_serves_on_loopback_and_says_so(tmp_path: Path) -> None:
    database = tmp_path / "dash.db"
    url = f"sqlite:///{database}"
    cli = [sys.executable, "-m", "sqlalchemy_watchdog.cli", "--url", url]
    assert subprocess.run([*cli, "upgrade"], capture_output=True, timeout=60).returncode == 0
    Watchdog(__import__("sqlalchemy").create_engine(url)).enqueue(Job("served-1", "served"))
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [*cli, "dashboard", "--port", str(port), "--read-only"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert server.stdout is not None
        said = server.stdout.readline() + server.stdout.readline()
        assert f"http://127.0.0.1:{port}/ (read-only" in said and "binds to 127.0.0.1 only" in said
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/jobs", timeout=5) as response:
                    page = response.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert "served-1" in page and "/actions/" not in page
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0


def test_the_confirmation_page_posts_what_it_shows(engine: Engine, watchdog: Watchdog, dashboard: Dashboard) -> None:
    """The confirmation page's own form (not a hand-made one) runs the action."""
    watchdog.enqueue(Job("confirm-me", "cq"))
    page = dashboard.post("cancel", job_id="confirm-me", cancellation_id="from-form").text
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page))
    assert fields.pop("csrf_token") == dashboard.token
    done = dashboard.client.post(
        "/actions/cancel",
        data={"csrf_token": dashboard.token, **{name: html.unescape(value) for name, value in fields.items()}},
    )
    assert status_of(done.text) == "recorded" and present(watchdog.read("confirm-me")).cancellation_id == "from-form"


@ALSO_ON_MARIADB
def test_the_job_lists_do_not_read_payloads(engine: Engine, watchdog: Watchdog) -> None:
    from sqlalchemy import event

    watchdog.enqueue([Job(f"big-{n}", "q", lane="l", payload="x" * 100_000) for n in range(3)])
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        with TestClient(create_app(engine)) as client:
            for path, params in (("/jobs", {}), ("/lane", {"lane": "l"})):
                statements.clear()
                page = client.get(path, params=params)
                assert page.status_code == 200 and "big-2" in page.text
                lists = [s for s in statements if "watchdog_jobs" in s and "ORDER BY" in s and "sequence >" in s]
                assert lists and all(
                    "payload_json" not in s.split("FROM")[0].replace("AS payload_json", "") for s in lists
                )
            statements.clear()
            assert "x" * 1000 in client.get("/job", params={"job_id": "big-1"}).text  # a job's page shows it
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert [job.payload for job in watchdog.list_jobs(with_payload=False)] == [None, None, None]
    assert [len(job.payload) for job in watchdog.list_jobs()] == [100_000] * 3


@ALSO_ON_MARIADB
def test_the_job_page_shows_a_completed_jobs_result_escaped(
    engine: Engine, watchdog: Watchdog, dashboard: Dashboard
) -> None:
    watchdog.enqueue([Job("priced", "q"), Job("plain", "q"), Job("broken", "q")])

    def handle(job: Any) -> Any:
        if job.job_id == "broken":
            return Decision.failed("no")
        return {"total": 42, "note": SCRIPT} if job.job_id == "priced" else None

    settle(engine, {"q": handle})
    priced = dashboard.get("/job", job_id="priced").text
    assert '<h2 id="result-h">Result</h2>' in priced
    assert "&#34;total&#34;: 42" in priced or "&quot;total&quot;: 42" in priced
    assert SCRIPT not in priced
    assert "None: the handler returned no value." in dashboard.get("/job", job_id="plain").text
    assert 'id="result-h"' not in dashboard.get("/job", job_id="broken").text
    assert '<dd id="f-progress">none reported</dd>' in priced
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE watchdog_jobs SET progress = 0.425, progress_note = 'step <3>' WHERE job_id = 'plain'"
        )
    plain = dashboard.get("/job", job_id="plain").text
    assert '<progress max="1" value="0.425">42.5%</progress> 42.5%: step &lt;3&gt;</dd>' in plain


@ALSO_ON_MARIADB
def test_the_job_page_shows_a_workflows_parents_dependents_and_progress(
    engine: Engine, watchdog: Watchdog, dashboard: Dashboard
) -> None:
    from sqlalchemy_watchdog import group

    watchdog.enqueue(group([Job("part-1", "parts"), Job("part-2", "parts")]).then(Job("report", "reports")))
    Runner(engine, {"parts": lambda job: None}, queues=["parts"]).tick()  # one part done
    report = dashboard.get("/job", job_id="report").text
    assert '<dd id="f-parents">1 of 2 settled: ' in report
    assert "part-1</a> (completed)" in report and "part-2</a> (not settled)" in report
    part = dashboard.get("/job", job_id="part-2").text
    assert '<dd id="f-dependents"><a href=' in part and "report</a>" in part
