"""The runner inside a Flask application: a ``Runner`` in a thread of its own
with ``with runner.running():`` around the WSGI server. Needs Flask::

    pip install sqlalchemy-watchdog flask 'psycopg[binary]'
    cd examples
    export WATCHDOG_DATABASE_URL=postgresql+psycopg://app@localhost/app   # or sqlite:///shop.db
    sqlalchemy-watchdog upgrade
    python flask_in_process.py 8000

The server here is the standard library's threaded ``wsgiref`` server (no
dependency); with gunicorn, enter ``runner.running()`` in the
``post_worker_init`` hook and leave it in ``worker_exit`` (see the in-process
guide). The process owns its signals: SIGTERM stops the server, then the
``with`` block stops the runner within its shutdown budget.
``tests/integration/test_in_process.py`` runs it with real processes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from flask import Flask, request
from sqlalchemy import String, create_engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_watchdog import Job, RetryPolicy, Runner, RunningJob, enqueue

# 5 + 15 serves the runner's 3 connections, its 10 handler threads and the requests.
engine = create_engine(
    os.environ.get("WATCHDOG_DATABASE_URL", "sqlite:///watchdog.db"),
    pool_size=5,
    max_overflow=15,
    pool_pre_ping=True,
)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), default="placed")


def confirm_order(job: RunningJob) -> None:
    time.sleep(job.payload["work_ms"] / 1000)  # the work
    with Session(engine) as session, session.begin():
        session.get_one(Order, job.payload["order_id"]).status = "confirmed"


runner = Runner(
    engine,
    {"confirmations": confirm_order},
    retry=RetryPolicy(max_attempts=5, retry_on=(OperationalError,)),
)

app = Flask(__name__)


@app.post("/orders")
def place_order() -> tuple[dict[str, Any], int]:
    body = request.get_json()
    with Session(engine) as session, session.begin():
        order = Order(customer=body["customer"])
        session.add(order)
        session.flush()
        job = Job(
            f"confirm-order-{order.id}",
            "confirmations",
            payload={"order_id": order.id, "work_ms": int(body.get("work_ms", 0))},
        )
        enqueue(session, job)
        return {"id": order.id, "job_id": job.job_id}, 201


@app.get("/orders/<int:order_id>")
def read_order(order_id: int) -> tuple[dict[str, Any], int]:
    with Session(engine) as session:
        order = session.get(Order, order_id)
        if order is None:
            return {"error": f"no order {order_id}"}, 404
        return {"id": order.id, "status": order.status}, 200


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def main(port: int) -> None:
    Base.metadata.create_all(engine)
    with runner.running(), make_server("127.0.0.1", port, app, Server, QuietHandler) as server:
        # SIGTERM (the platform stopping the process) ends serve_forever; the
        # with block then stops the runner.
        signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
        server.serve_forever()
    engine.dispose()
    print("shop: server stopped, runner stopped, engine disposed", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8000)
