"""A recovery loop run in separate processes by the two-recoverers race test.

``recover_all(url)`` reconciles every expired claim it can
find until none is left and returns ``{job_id: status}`` of the recoveries
this process won.
"""

from __future__ import annotations

from sqlalchemy import create_engine

from sqlalchemy_watchdog import store


def recover_all(url: str) -> dict[str, str]:
    engine = create_engine(url)
    won: dict[str, str] = {}
    try:
        while True:
            with engine.connect() as conn:
                expired = store.transact_as(conn, store.READ, store.expired_claims, limit=25)
            if not expired:
                return won
            for claim in expired:

                def work(claim: store.Claim = claim) -> store.Recovery:
                    with engine.connect() as conn:
                        return store.transact(conn, store.reconcile, claim)

                recovery = store.retrying(work, what="reconcile", attempts=20)
                if recovery.status != "lost_race":
                    assert claim.job.job_id not in won, f"won {claim.job.job_id} twice"
                    won[claim.job.job_id] = recovery.status
    finally:
        engine.dispose()
