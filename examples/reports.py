"""CPU-bound handlers for the process executor (docs/howto/executors.md).

The process executor runs a handler in a child process and finds it there
by its module path: it must be a function defined at the top level of an
importable module -- like these -- not in the script being run, not a
lambda, not a nested function.
"""

from __future__ import annotations

from sqlalchemy_watchdog import Decision, RunningJob, handler


def count_primes(upto: int) -> int:
    """Pure-Python work: the primes below ``upto``, counted the slow way."""
    return sum(1 for n in range(2, upto) if all(n % d for d in range(2, int(n**0.5) + 1)))


@handler("reports")
def render_report(job: RunningJob) -> Decision | None:
    """Holds one core while it runs; a long report checks its stop between steps."""
    total = 0
    for step in range(job.payload.get("steps", 1)):
        if job.stop_requested.is_set():
            return Decision.retry(f"stopped at step {step}")
        total += count_primes(job.payload["upto"])
    job.log.info("report ready: %d primes", total)
    return None
