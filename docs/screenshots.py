"""Take the dashboard screenshots the README shows (docs/dashboard-*.png).

    .venv/bin/python docs/screenshots.py            # needs /usr/bin/chromium and /usr/bin/chromedriver

Seeds a demo SQLite database in a temporary directory -- a few queues, jobs
run to each outcome, one with failed attempts, a paused queue -- serves the
dashboard with uvicorn on 127.0.0.1 and photographs the overview, a job
page and the workers page with Debian's headless Chromium. For the chart's sake the demo moves its
jobs' settled times back over the last hour with one UPDATE: a demo database
only, never do that to a real one.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from sqlalchemy import Engine, create_engine, text

from sqlalchemy_watchdog import Decision, Job, RetryPolicy, Runner, Schedule, Watchdog, __version__, metadata, store
from sqlalchemy_watchdog.schedules import fingerprint
from sqlalchemy_watchdog.web import create_app

DOCS = Path(__file__).resolve().parent


def seed(engine: Engine) -> None:
    metadata.create_all(engine)
    watchdog = Watchdog(engine)
    watchdog.enqueue(
        [Job(f"confirm-order-{n}", "emails", lane=f"customer:{n % 7}", payload={"order_id": n}) for n in range(180)]
        + [Job(f"charge-{n}", "payments", payload={"order_id": n, "amount_cents": 1990 + n}) for n in range(90)]
        + [
            Job(f"webhook-{n}", "webhooks", lane="partner:acme", payload={"event": "order.paid", "n": n})
            for n in range(40)
        ]
    )

    def charge(job: object) -> Decision | None:
        n = int(getattr(job, "payload")["order_id"])  # noqa: B009
        if n % 11 == 0:
            return Decision.failed("card declined by the issuer", retry=False)
        if n % 17 == 0:
            return Decision.outcome_unknown("bank timed out after the charge was sent")
        return None

    def webhook(job: object) -> Decision | None:
        n = int(getattr(job, "payload")["n"])  # noqa: B009
        return Decision.failed("HTTP 503 from partner", retry=False) if n % 5 == 0 else None

    runner = Runner(engine, {"emails": lambda job: None, "payments": charge, "webhooks": webhook})
    runner.run_until_idle(max_ticks=150 + 80 + 36)
    for n in range(3):
        watchdog.cancel(f"confirm-order-{170 + n}", f"support-{n}")
    runner.run_until_idle(max_ticks=3)
    # Spread the settled jobs over the last hour (demo only), so the chart shows an hour.
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE watchdog_jobs SET settled_at = settled_at - ((sequence * 104729) % 3480000), "
                "started_at = started_at - ((sequence * 104729) % 3480000) - 200, "
                "enqueued_at = enqueued_at - ((sequence * 104729) % 3480000) - 900 WHERE state = 'settled'"
            )
        )
    # One job with a history of failed attempts, for the job page.
    policy = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=5), jitter=0)
    watchdog.enqueue(
        Job(
            "sync-invoice-2024-118",
            "invoices",
            lane="tenant:northwind",
            payload={
                "invoice": "2024-118",
                "lines": [{"sku": "A-100", "qty": 3}, {"sku": "B-7", "qty": 1}],
                "customer": {"id": 4711, "name": "Northwind Traders"},
            },
            retry=policy,
            max_recoveries=2,
        )
    )
    reasons = iter(["ERP answered 502 Bad Gateway", "ERP answered 502 Bad Gateway", "ledger locked for closing"])
    invoices = Runner(engine, {"invoices": lambda job: Decision.failed(next(reasons))})
    deadline = time.monotonic() + 10
    while watchdog.read("sync-invoice-2024-118").state.value != "settled" and time.monotonic() < deadline:
        invoices.run_until_idle()
        time.sleep(0.02)
    watchdog.pause("webhooks", reason="partner maintenance until 18:00")
    # Two workers serving (demo rows, as runner processes would register them;
    # worker-2 holds jobs it claimed ahead of its 8 slots and runs its invoices
    # handlers in child processes), one that died an hour ago, and the
    # schedules they serve.
    with engine.begin() as conn:
        for worker_id, host, pid, queues, running in (
            ("3f9c2a7e51d84b6f9e0a1c2d3e4f5a6b", "worker-1", 4121, ("emails", "payments"), 3),
            ("8b1d6e4c2a9f4e7d8c6b5a4f3e2d1c0b", "worker-2", 4187, ("emails", "invoices", "webhooks"), 14),
            ("c0ffee00aa114b2c9d8e7f6a5b4c3d2e", "worker-3", 3902, ("payments",), 0),
        ):
            registration = store.WorkerRegistration(
                worker_id, host, pid, queues, 8, "listening (LISTEN/NOTIFY)", __version__, 10_000, claim_ahead=32,
                process_queues=("invoices",) if host == "worker-2" else (),
            )  # fmt: skip
            store.register_worker(conn, registration, running)
        conn.execute(
            text(
                "UPDATE watchdog_workers SET last_seen = last_seen - 3300000, started_at = started_at - 90000000"
                " WHERE host = 'worker-3'"
            )
        )
        conn.execute(text("UPDATE watchdog_workers SET started_at = started_at - 7200000 WHERE host <> 'worker-3'"))
        now = datetime.now(UTC)
        records = []
        for schedule in (
            Schedule("nightly-report", "30 2 * * *", "emails", timezone="Europe/Berlin"),
            Schedule("hourly-sync", "0 * * * *", "invoices"),
        ):
            upcoming, previous = schedule.next_slot(now), schedule.slots(now - timedelta(days=2), 60)
            latest = max(slot for slot in previous if slot <= now)
            records.append(
                store.ScheduleRecord(
                    schedule.name,
                    fingerprint(schedule),
                    schedule.cron,
                    schedule.timezone,
                    schedule.queue,
                    int(upcoming.timestamp() * 1000),
                    int(latest.timestamp() * 1000),
                )
            )
        store.record_schedules(conn, records, "3f9c2a7e51d84b6f9e0a1c2d3e4f5a6b")


def browser(width: int) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--window-size={width},900",
        f"--user-data-dir={tempfile.mkdtemp()}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DOCS, help="where the PNGs go (default: docs/)")
    parser.add_argument("--width", type=int, default=1240)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        engine = create_engine(f"sqlite:///{scratch}/demo.db")
        seed(engine)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(create_app(engine, refresh_seconds=0), log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        driver = browser(args.width)
        try:
            for name, path in (
                ("overview", "/"),
                ("job", "/job?job_id=sync-invoice-2024-118"),
                ("workers", "/workers"),
            ):
                driver.get(base + path)
                height = driver.execute_script("return document.documentElement.scrollHeight")
                driver.set_window_size(args.width, min(int(height) + 20, 2400))
                target = args.out / f"dashboard-{name}.png"
                driver.save_screenshot(str(target))
                print(f"wrote {target}")
        finally:
            driver.quit()
            server.should_exit = True
            thread.join(timeout=10)
            engine.dispose()


if __name__ == "__main__":
    main()
