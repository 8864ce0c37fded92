"""Workflows: chains and groups of jobs, built on ``Job(after=...)``.

``chain(a, b, c)`` makes ``b`` wait for ``a`` and ``c`` for ``b``;
``group([a, b]).then(callback)`` makes ``callback`` wait for every job of
the group. Either is an iterable of :class:`~sqlalchemy_watchdog.Job` in an
order where every parent comes first, so one ``enqueue(session, workflow)``
admits it whole, atomically, in the caller's transaction::

    enqueue(session, chain(fetch, group([resize_small, resize_large]).then(publish)))

Steps may be jobs or workflows themselves: a step waits for every *tail* of
the step before it (a job; a group's jobs; a chain's last step).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise

from .jobs import Job, check_parents, set_after

__all__ = ["Workflow", "chain", "group"]


@dataclass(frozen=True)
class Workflow:
    """Jobs with their ``after`` relations, in an order where parents come
    first; iterate it (or pass it to ``enqueue``) for the jobs.

    ``heads``: the job_ids a step put before this workflow must precede;
    ``tails``: the job_ids a step after it waits for.
    """

    jobs: tuple[Job, ...]
    heads: tuple[str, ...]
    tails: tuple[str, ...]

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def then(self, step: Step) -> Workflow:
        """This workflow, then ``step`` once every tail of it settled: ``chain(self, step)``."""
        return chain(self, step)

    @property
    def job_ids(self) -> tuple[str, ...]:
        """Every job of the workflow, in enqueue order."""
        return tuple(job.job_id for job in self.jobs)


#: A step of a chain or a group: a job, or a workflow.
Step = Job | Workflow


def _as_workflow(step: object) -> Workflow:
    if isinstance(step, Workflow):
        return step
    if isinstance(step, Job):
        return Workflow((step,), (step.job_id,), (step.job_id,))
    raise TypeError(f"a workflow step is a Job or a Workflow, not {type(step).__name__}")


def _after(job: Job, parents: Iterable[str]) -> Job:
    """``job`` also waiting for ``parents``: a copy (jobs are frozen) that
    keeps everything else of it -- its class (a ``Job`` subclass stays
    one), key, codec and stored payload -- with the parents checked as
    ``Job(after=...)`` checks them."""
    extra = tuple(parent for parent in parents if parent not in job.after)
    if not extra:
        return job
    merged = check_parents(job.job_id, (*job.after, *extra))
    copied = copy.copy(job)
    set_after(copied, merged)
    return copied


def chain(*steps: Step) -> Workflow:
    """``steps`` one after the other: each step's heads wait for the tails
    of the step before it. A step that fails (or is cancelled) cancels the
    rest, unless a job of it asked ``after_policy="any_outcome"``."""
    if not steps:
        raise ValueError("chain() needs at least one step")
    parts = [_as_workflow(step) for step in steps]
    jobs: list[Job] = list(parts[0].jobs)
    for before, part in pairwise(parts):
        heads = set(part.heads)
        jobs.extend(_after(job, before.tails) if job.job_id in heads else job for job in part.jobs)
    return Workflow(tuple(jobs), parts[0].heads, parts[-1].tails)


def group(steps: Iterable[Step]) -> Workflow:
    """``steps`` side by side (no relation between them); ``.then(callback)``
    makes ``callback`` wait for all of them -- a fan-in, whose callback
    reads their results with ``job.parent_results()``."""
    parts = [_as_workflow(step) for step in steps]
    if not parts:
        raise ValueError("group() needs at least one step")
    jobs = tuple(job for part in parts for job in part.jobs)
    heads = tuple(head for part in parts for head in part.heads)
    tails = tuple(tail for part in parts for tail in part.tails)
    return Workflow(jobs, heads, tails)
