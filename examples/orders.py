"""Orders and their confirmation jobs, committed together.

    python3 dev.py example                      # SQLite file watchdog.db here
    python3 dev.py example --url postgresql+psycopg://user@host/db --verbose

Each run starts from a clean state: it drops and recreates its own tables
(``orders`` and ``watchdog_jobs``) on that database. In a real application
the ``watchdog_jobs`` table comes from Alembic (see the README).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from sqlalchemy import Engine, String, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sqlalchemy_watchdog
from sqlalchemy_watchdog import (
    Decision,
    EnqueueConflict,
    Job,
    Runner,
    RunningJob,
    Watchdog,
    enqueue,
)

# -- the application's own model, on its own declarative Base ---------------------------


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    amount_cents: Mapped[int]
    card: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20), default="placed")


def confirmation(order: Order, *, express: bool = False) -> Job:
    """The job that charges and confirms an order. Its job_id is the idempotency
    key: placing the same order twice must not confirm it twice."""
    return Job(
        f"confirm-order-{order.id}",
        "confirmations",
        lane=f"customer:{order.customer}",  # a failure domain: fail_lane() stops them all
        priority=10 if express else 0,  # higher runs first
        payload={"order_id": order.id, "amount_cents": order.amount_cents, "card": order.card},
        max_recoveries=3,  # requeue up to 3 times if a worker dies mid-job
    )


# -- the handler a Runner calls for each job of the "confirmations" queue ----------------


def confirmation_handler(engine: Engine) -> Callable[[RunningJob], Decision | None]:
    def confirm_order(job: RunningJob) -> Decision | None:
        """Return None (completed) or a Decision; an exception settles it failed."""
        order_id = job.payload["order_id"]
        if job.payload["card"] == "declined":
            status, decision = "declined", Decision.failed("payment declined by the card issuer")
        elif job.payload["amount_cents"] <= 0:
            raise ValueError(f"order {order_id} has a non-positive amount")  # order stays "placed"
        else:
            status, decision = "confirmed", None
        # A handler may write the application's own tables; the job settles after it returns.
        with Session(engine) as session, session.begin():
            session.get_one(Order, order_id).status = status
        return decision

    return confirm_order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="sqlite:///watchdog.db", help="default: %(default)s")
    parser.add_argument("--verbose", action="store_true", help="log every claim and settlement")
    args = parser.parse_args()
    # The table printed at the end is this example's output; --verbose adds the
    # library's log (a line per claim and settlement, loggers sqlalchemy_watchdog.*).
    level = logging.INFO if args.verbose else logging.ERROR
    logging.basicConfig(level=level, format="  log: %(name)s: %(message)s")

    engine = create_engine(args.url)
    # A clean state on every run: drop and recreate this example's tables.
    for metadata in (Base.metadata, sqlalchemy_watchdog.metadata):
        metadata.drop_all(engine)
        metadata.create_all(engine)

    # 1. Place five orders and enqueue their confirmations in ONE commit: either
    #    the orders and their jobs are all durable, or none of them is.
    print("1. placing orders 1001-1005 with their confirmation jobs in one commit")
    with Session(engine) as session:
        orders = [
            Order(id=1001, customer="ada", amount_cents=2500, card="visa"),
            Order(id=1002, customer="bob", amount_cents=4000, card="declined"),
            Order(id=1003, customer="cy", amount_cents=9900, card="visa"),
            Order(id=1004, customer="dee", amount_cents=1200, card="visa"),
            Order(id=1005, customer="eve", amount_cents=0, card="visa"),
        ]
        session.add_all(orders)
        jobs = [confirmation(o, express=o.id == 1003) for o in orders]
        for result in enqueue(session, jobs):  # one INSERT for all five jobs
            print(f"   {result.job_id}: {result.status.value}")
        session.commit()

    # 2. A client retries the request for order 1001: the identical job is a duplicate.
    print("2. replaying order 1001's confirmation unchanged")
    with Session(engine) as session:
        order = session.get_one(Order, 1001)
        result = enqueue(session, confirmation(order))
        session.commit()
        print(f"   {result.job_id}: {result.status.value} (nothing was added)")

    # 3. A buggy client reuses job_id "confirm-order-1001" for another amount,
    #    in the same transaction as a new order 1006. The enqueue raises and
    #    rolls the transaction back: order 1006 cannot commit without its job.
    print("3. a conflicting replay of confirm-order-1001 beside a new order 1006")
    with Session(engine) as session:
        session.add(Order(id=1006, customer="fay", amount_cents=777, card="visa"))
        session.flush()  # order 1006 is now written inside this transaction
        payload = {"order_id": 1001, "amount_cents": 9999, "card": "visa"}  # not 2500
        conflicting = Job("confirm-order-1001", "confirmations", lane="customer:ada", payload=payload, max_recoveries=3)
        try:
            enqueue(session, conflicting)
        except EnqueueConflict as error:
            print(f"   EnqueueConflict: {error}")
        session.commit()  # commit anyway: there is nothing left to commit
    with Session(engine) as session:
        count = session.scalar(select(func.count()).select_from(Order).where(Order.id == 1006))
        print(f"   order 1006 rows after commit: {count}")
        assert count == 0

    # 4. Customer dee cancels before any worker ran her job. Any process may
    #    do this; the job is settled "cancelled" when a runner claims it.
    with Session(engine) as session, session.begin():
        session.get_one(Order, 1004).status = "cancelled"
    watchdog = Watchdog(engine)
    cancel = watchdog.cancel("confirm-order-1004", "customer-cancel-1004")
    print(f"4. cancelling confirm-order-1004: {cancel.status.value}")

    # 5. A runner drains the queue. A deployed worker calls runner.run_forever()
    #    (or `sqlalchemy-watchdog run`); run_until_idle() processes what is
    #    ready and returns, which suits scripts and tests.
    #    Express order 1003 (priority 10) goes first, then admission order.
    runner = Runner(engine, {"confirmations": confirmation_handler(engine)})
    settled = runner.run_until_idle()
    print(f"5. the runner settled, in this order: {', '.join(job.job_id for job in settled)}")

    # 6. What happened, read back through the Watchdog client (any process can).
    print("6. the jobs, as stored:\n")
    rows = [("job_id", "queue", "state", "outcome", "failure_reason")]
    for job in watchdog.read_settled(limit=100):
        outcome = job.outcome.value if job.outcome else ""
        rows.append((job.job_id, job.queue, job.state.value, outcome, job.failure_reason or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print(("   " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4]).rstrip())
    with Session(engine) as session:
        placed = session.scalars(select(Order).order_by(Order.id))
        statuses = ", ".join(f"{order.id}={order.status}" for order in placed)
    print(f"\n   orders: {statuses}")
    engine.dispose()


if __name__ == "__main__":
    main()
