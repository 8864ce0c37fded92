"""Dependencies (revision w0012): releasing a fan-in of 1,000 parents, a 10,000-job
chain's per-link latency, and claim + settle without dependencies beside them."""

from __future__ import annotations

import time

from benchmarks import harness as h
from sqlalchemy_watchdog import Decision, Job, Watchdog, store

SIZES = {
    "--parents": {"type": int, "help": "parents of the fan-in"},
    "--links": {"type": int, "help": "jobs in the chain"},
}


def _claim_settle_one(eng: object, queue: str) -> str | None:
    """Claim one job of ``queue`` and settle it completed, two transactions as a runner does."""
    with store.write_transaction(eng) as conn:  # type: ignore[arg-type]
        claimed = store.claim(conn, queues=[queue], limit=1, lease_ms=60_000).claimed
    if not claimed:
        return None
    (one,) = claimed
    with store.write_transaction(eng) as conn:  # type: ignore[arg-type]
        store.settle(conn, job_id=one.job.job_id, claim_token=one.token, decision=Decision.completed())
    return one.job.job_id


@h.scenario("dependencies", suite=True, options=SIZES)
def dependencies(bench: h.Bench) -> None:
    """Fan-in of 1,000 parents, a 10,000-job chain per link, and claim+settle without dependencies."""
    parents, links = bench.opt("parents", 1_000, 100), bench.opt("links", 10_000, 200)
    table = "dependencies, watchdog (in one process, store calls as a runner makes them)"
    for dialect in bench.dialects():
        target = bench.scratch(dialect, "deps")
        try:
            h.install_watchdog(target)
            with h.disposed(h.engine(target)) as eng:
                wd = Watchdog(eng)
                for r in range(bench.repeat):
                    # Claim + settle with no dependencies: the baseline of the two below.
                    wd.enqueue([Job(f"plain-{r}-{n}", f"plain-{r}") for n in range(links)])
                    started = time.perf_counter()
                    while _claim_settle_one(eng, f"plain-{r}"):
                        pass
                    plain = (time.perf_counter() - started) * 1000 / links
                    bench.record(table, "claim + settle, no dependencies (ms per job)", dialect, plain)

                    # A chain: each link released by the settle of the one before.
                    chain = [
                        Job(f"link-{r}-{n}", f"chain-{r}", after=[f"link-{r}-{n - 1}"] if n else None)
                        for n in range(links)
                    ]
                    wd.enqueue(chain)
                    started = time.perf_counter()
                    done = 0
                    while _claim_settle_one(eng, f"chain-{r}"):
                        done += 1
                    per_link = (time.perf_counter() - started) * 1000 / links
                    assert done == links, (done, links)
                    bench.record(table, f"chain of {links:,}: claim + settle per link (ms)", dialect, per_link)

                    # A fan-in: the last parent's settle releases the child.
                    fan = [Job(f"parent-{r}-{n}", f"fan-{r}") for n in range(parents)]
                    wd.enqueue([*fan, Job(f"child-{r}", f"child-{r}", after=[j.job_id for j in fan])])
                    with store.write_transaction(eng) as conn:
                        claimed = store.claim(conn, queues=[f"fan-{r}"], limit=parents, lease_ms=600_000).claimed
                    requests = [store.SettleRequest(c.job.job_id, c.token, Decision.completed()) for c in claimed]
                    started = time.perf_counter()
                    for start in range(0, len(requests), 100):  # a runner settles in batches
                        with store.write_transaction(eng) as conn:
                            store.settle_many(conn, requests[start : start + 100])
                    seconds = time.perf_counter() - started
                    child = wd.read(f"child-{r}")
                    assert child is not None and child.state.value == "queued", child
                    bench.record(table, f"fan-in of {parents:,}: settle every parent (ms)", dialect, seconds * 1000)
                    bench.log(
                        f"{dialect}: plain {plain:.2f} ms/job, chain {per_link:.2f} ms/link, fan-in {seconds:.2f}s"
                    )
        except Exception as error:
            bench.fail(f"{dialect} dependencies", error)
        finally:
            h.drop(target)
