"""The whole loop in one place: a FastAPI app that writes an order and enqueues
its job in one transaction, the dashboard mounted under /watchdog, and a
worker started with the CLI. Needs the ``web`` extra and FastAPI::

    pip install 'sqlalchemy-watchdog[web]' fastapi
    cd examples
    export WATCHDOG_DATABASE_URL=sqlite:///shop.db       # or postgresql+psycopg://...
    sqlalchemy-watchdog upgrade                           # the watchdog_jobs table
    uvicorn fastapi_app:app --port 8000                   # the web app (creates its orders table)
    sqlalchemy-watchdog run fastapi_app                   # the worker, in another terminal

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"customer": "ada", "amount_cents": 1990}'
    curl localhost:8000/orders/1                          # "confirmed" once the worker ran it
    open http://localhost:8000/watchdog/                  # the dashboard

``sqlalchemy-watchdog run fastapi_app`` imports this module for its
``@handler`` (the FastAPI app is built, not served) and runs a ``Runner``.
``tests/integration/test_example_app.py`` runs all of it with real processes.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_watchdog import Decision, Job, RunningJob, enqueue, handler
from sqlalchemy_watchdog.web import create_app

engine = create_engine(os.environ.get("WATCHDOG_DATABASE_URL", "sqlite:///watchdog.db"))


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    amount_cents: Mapped[int]
    status: Mapped[str] = mapped_column(String(20), default="placed")


class NewOrder(BaseModel):
    customer: str = Field(min_length=1, max_length=100)
    amount_cents: int


def may_operate(request: Request, action: str) -> bool:
    """Who may do what on the dashboard. Here: anyone may look, and only
    requests from this machine may act. Put your own authentication here
    (a session user, a role, a header set by your proxy)."""
    if action == "view":
        return True
    return request.client is not None and request.client.host in ("127.0.0.1", "::1")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    Base.metadata.create_all(engine)  # the app's own table; watchdog_jobs comes from `upgrade`
    yield
    engine.dispose()


app = FastAPI(title="shop", lifespan=lifespan)
app.mount("/watchdog", create_app(engine, authorize=may_operate))


@app.post("/orders", status_code=201)
def place_order(new: NewOrder) -> dict[str, Any]:
    """Write the order and enqueue its confirmation in ONE transaction: both
    commit, or neither does."""
    with Session(engine) as session, session.begin():
        order = Order(customer=new.customer, amount_cents=new.amount_cents)
        session.add(order)
        session.flush()  # the order's id, for the job
        order_id = order.id
        job_id = f"confirm-order-{order_id}"
        enqueue(session, Job(job_id, "confirmations", lane=f"customer:{new.customer}", payload={"order_id": order_id}))
    return {"id": order_id, "status": "placed", "job_id": job_id}


@app.get("/orders/{order_id}")
def read_order(order_id: int) -> dict[str, Any]:
    with Session(engine) as session:
        order = session.get(Order, order_id)
        if order is None:
            raise HTTPException(404, f"no order {order_id}")
        return {"id": order.id, "customer": order.customer, "status": order.status}


@handler("confirmations")
def confirm_order(job: RunningJob) -> Decision | None:
    """Run by the worker (``sqlalchemy-watchdog run fastapi_app``)."""
    with Session(engine) as session, session.begin():
        order = session.get_one(Order, job.payload["order_id"])
        if order.amount_cents <= 0:
            order.status = "rejected"
            return Decision.failed(f"order {order.id} has a non-positive amount", retry=False)
        order.status = "confirmed"
    return None
