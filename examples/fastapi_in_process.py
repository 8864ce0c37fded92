"""The runner inside a FastAPI application: an ``AsyncRunner`` started in the
lifespan with ``async with runner.running():``, the dashboard mounted under
/watchdog, no worker process. Needs the ``web`` extra, FastAPI and an async
driver::

    pip install 'sqlalchemy-watchdog[web]' fastapi uvicorn 'psycopg[binary]'
    cd examples
    export WATCHDOG_DATABASE_URL=postgresql+psycopg://app@localhost/app   # or sqlite+aiosqlite:///shop.db
    sqlalchemy-watchdog upgrade
    uvicorn fastapi_in_process:app --port 8000

uvicorn keeps its own SIGINT/SIGTERM handlers: on SIGTERM it stops taking
requests, drains them, then runs the lifespan's shutdown, which stops the
runner within its shutdown budget (grace 20 s + 2 s by default) and disposes
of the engine. ``tests/integration/test_in_process.py`` runs it with real processes.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import String
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlalchemy_watchdog import Job, RetryPolicy, RunningJob
from sqlalchemy_watchdog.asyncio import AsyncRunner, enqueue
from sqlalchemy_watchdog.web import create_app

CONCURRENCY = 10
# The pool serves the requests, the runner's 3 connections and a connection per
# running handler: 5 + 15 overflow leaves the requests 7 beyond the runner's 13.
# pool_pre_ping replaces a connection the server closed (a restart, a failover)
# before a request or a handler gets it.
engine = create_async_engine(
    os.environ.get("WATCHDOG_DATABASE_URL", "sqlite+aiosqlite:///watchdog.db"),
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


class NewOrder(BaseModel):
    customer: str = Field(min_length=1, max_length=100)
    work_ms: int = Field(default=0, ge=0, le=60_000)  # how long confirming it takes


async def confirm_order(job: RunningJob) -> None:
    """Runs in this process, as a task of the runner."""
    await asyncio.sleep(job.payload["work_ms"] / 1000)  # the work: a call to a payment provider, say
    async with AsyncSession(engine) as session, session.begin():
        order = await session.get_one(Order, job.payload["order_id"])
        order.status = "confirmed"


runner = AsyncRunner(
    engine,
    {"confirmations": confirm_order},
    concurrency=CONCURRENCY,
    # A cut database connection (a restart, pg_terminate_backend) is retried;
    # any other failure of the handler is final.
    retry=RetryPolicy(max_attempts=5, retry_on=(OperationalError,)),
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)  # the app's own table
    async with runner.running():
        yield
    await engine.dispose()
    print("shop: lifespan shutdown done, runner stopped, engine disposed", file=sys.stderr, flush=True)


app = FastAPI(title="shop", lifespan=lifespan)
app.mount("/watchdog", create_app(engine))


@app.post("/orders", status_code=201)
async def place_order(new: NewOrder) -> dict[str, Any]:
    """Write the order and enqueue its confirmation in ONE transaction."""
    async with AsyncSession(engine) as session, session.begin():
        order = Order(customer=new.customer)
        session.add(order)
        await session.flush()
        job = Job(f"confirm-order-{order.id}", "confirmations", payload={"order_id": order.id, "work_ms": new.work_ms})
        await enqueue(session, job)
        return {"id": order.id, "job_id": job.job_id}


@app.get("/orders/{order_id}")
async def read_order(order_id: int) -> dict[str, Any]:
    async with AsyncSession(engine) as session:
        order = await session.get(Order, order_id)
        if order is None:
            raise HTTPException(404, f"no order {order_id}")
        return {"id": order.id, "status": order.status}
