"""Flow control: a drain of a limited queue beside the same drain unlimited."""

from __future__ import annotations

from typing import Any

from benchmarks import harness as h
from sqlalchemy_watchdog import Job, Watchdog

#: Keys of the keyed variants' jobs (job i has key k<i mod KEYS>).
KEYS = 100


class KeyedWatchdog(h.Watchdog):
    """The watchdog subject whose prefilled jobs carry one of :data:`KEYS` keys."""

    @staticmethod
    def jobs(tag: str, n: int) -> list[Any]:
        return [Job(f"{tag}-{i}", h.QUEUE, payload={"i": i}, key=f"k{i % KEYS}") for i in range(n)]


#: row -> (keyed jobs, set_limits keywords; None: no limits)
VARIANTS: dict[str, tuple[bool, dict[str, Any] | None]] = {
    "unlimited": (False, None),
    "unlimited, keyed jobs": (True, None),
    "concurrency 16": (False, {"concurrency": 16}),
    "concurrency 1,000 (never reached)": (False, {"concurrency": 1000}),
    f"concurrency 16, 1 per key ({KEYS} keys)": (True, {"concurrency": 16, "concurrency_per_key": 1}),
}


@h.scenario("limits", per_repeat=True, options=h.JOBS)
def limits(bench: h.Bench, r: int) -> None:
    """Jobs/s of one worker process at concurrency 16 draining a limited queue, beside the same queue unlimited."""
    for dialect in bench.dialects():
        pg = dialect == "postgresql"
        table = f"limits: drain at concurrency 16 (jobs/s), {'PostgreSQL' if pg else 'SQLite'}"
        bench.table(table)
        n = bench.opt("jobs", (2000 if pg else 300) if bench.quick else (10_000 if pg else 1000))
        target = bench.target("watchdog", dialect)
        for row, (keyed, limited) in VARIANTS.items():
            subject = KeyedWatchdog() if keyed else h.Watchdog()
            tag = f"l{r}-{row.split()[0]}{len(row)}"

            def drain(
                subject: h.Watchdog = subject,
                limited: dict[str, Any] | None = limited,
                tag: str = tag,
                target: h.Target = target,
                n: int = n,
            ) -> float:
                subject.reset(target)
                with h.disposed(h.engine(target)) as eng:
                    client = Watchdog(eng)
                    client.clear_limits(h.QUEUE)
                    if limited is not None:
                        client.set_limits(h.QUEUE, **limited)
                children = bench.workers("watchdog", target, tag, 1, concurrency=16)
                try:
                    return h.drain_idle(subject, target, n, tag, 1, children)
                finally:
                    h.stop_all(children)

            bench.measure(table, row, "watchdog", drain, timeout=120 + n / 20)
