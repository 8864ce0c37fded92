"""Dependencies under faults: concurrent settlements of two parents release
their child exactly once; a dependent never becomes claimable before its
parents' settlements commit; and a Hypothesis model of random dependency
graphs (release exactly once, never early, cancellation propagation hop by
hop, cancel of waiting jobs, reruns and prune)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import Decision, Job, JobState, Watchdog, metadata, store
from tests.faults.helpers import WorkerPool
from tests.helpers import present


def _claim(engine: Engine, queue: str) -> store.Claim:
    with store.write_transaction(engine) as conn:
        (claimed,) = store.claim(conn, queues=[queue], limit=1, lease_ms=600_000).claimed
    return claimed


@pytest.mark.dialect_specific
@pytest.mark.parametrize("order", ["p1 first", "p2 first"])
def test_two_parents_settling_at_once_release_their_child_exactly_once(engine: Engine, order: str) -> None:
    """The first settlement's transaction holds the child's row (its counter
    went from 2 to 1); the second settles meanwhile and its trigger waits for
    that row, then re-reads it and releases the child. Before the second
    commits, no claim can see the child."""
    wd = Watchdog(engine)
    wd.enqueue([Job("p1", "a"), Job("p2", "b"), Job("child", "c", after=["p1", "p2"])])
    first, second = (_claim(engine, "a"), _claim(engine, "b"))
    if order == "p2 first":
        first, second = second, first
    with engine.connect() as one:
        store.settle(one, job_id=first.job.job_id, claim_token=first.token, decision=Decision.completed())
        done = threading.Event()
        answer: list[store.Settlement] = []

        def settle_second() -> None:
            with engine.connect() as two:
                answer.append(
                    store.settle(two, job_id=second.job.job_id, claim_token=second.token, decision=Decision.completed())
                )
                if engine.dialect.name == "postgresql":
                    # Settled, not committed: the child is not claimable by anyone else yet
                    # (SQLite: the settling transaction holds the one write lock anyway).
                    with store.write_transaction(engine) as other:
                        assert store.claim(other, queues=["c"], limit=1, lease_ms=60_000).claimed == ()
                two.commit()
            done.set()

        thread = threading.Thread(target=settle_second)
        if engine.dialect.name == "postgresql":
            thread.start()
            time.sleep(0.3)
            assert not done.is_set(), "the second settlement waits for the first one's row lock"
            one.commit()
        else:  # SQLite: one writer at a time -- the first commits, then the second runs
            one.commit()
            thread.start()
        thread.join(30)
    assert done.is_set() and answer[0].status.value == "settled"
    child = present(wd.read("child"))
    assert child.state is JobState.QUEUED and child.waiting_on is None
    assert child.parents == (("p1", "completed"), ("p2", "completed"))
    claimed = _claim(engine, "c")
    assert claimed.job.job_id == "child"


# -- the model ------------------------------------------------------------------------


@dataclass
class Node:
    job_id: str
    parents: list[str]
    any_outcome: bool
    state: str = "waiting"
    outcome: str | None = None
    #: Parents whose settlement the database has counted for this job.
    told: set[str] = field(default_factory=set)
    runs: int = 0


class Model:
    """docs/design.md "Dependencies" in plain Python."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        #: Jobs settled while waiting whose dependents are not told yet.
        self.untold: list[str] = []

    def add(self, node: Node) -> None:
        self.nodes[node.job_id] = node
        for parent in node.parents:
            if self.nodes[parent].state == "settled" and parent not in self.untold:
                node.told.add(parent)
        self._judge(node)

    def _judge(self, node: Node) -> None:
        if node.state != "waiting":
            return
        for parent in node.told:
            outcome = self.nodes[parent].outcome
            if outcome != "completed" and not node.any_outcome:
                node.state, node.outcome = "settled", "cancelled"
                self.untold.append(node.job_id)
                return
        if node.told == set(node.parents):
            node.state = "queued"

    def settled(self, job_id: str, outcome: str, *, from_waiting: bool) -> None:
        node = self.nodes[job_id]
        node.state, node.outcome = "settled", outcome
        if from_waiting:
            self.untold.append(job_id)
        else:
            self.tell(job_id)

    def tell(self, job_id: str) -> None:
        for child in self.nodes.values():
            if job_id in child.parents and job_id not in child.told:
                child.told.add(job_id)
                self._judge(child)

    def propagate(self) -> None:
        """A runner's pass: every job settled while waiting tells its
        dependents (repeated until none is left, as run_until_idle does)."""
        while self.untold:
            batch, self.untold = self.untold, []
            for job_id in batch:
                self.tell(job_id)


STEPS = st.lists(
    st.tuples(st.sampled_from(["complete", "fail", "cancel", "propagate"]), st.integers(0, 7)),
    min_size=1,
    max_size=14,
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    graph=st.lists(
        st.tuples(st.lists(st.integers(0, 7), max_size=3), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    steps=STEPS,
)
def test_random_graphs_release_each_job_exactly_once_and_never_early(
    tmp_path_factory: pytest.TempPathFactory, graph: list[tuple[list[int], bool]], steps: list[tuple[str, int]]
) -> None:
    # The triggers' logic is the same text on both dialects; PostgreSQL's
    # concurrency is the test above's. A fresh SQLite file per example.
    path = tmp_path_factory.mktemp("deps") / "deps.db"
    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine)
    try:
        _run_model(engine, graph, steps)
    finally:
        engine.dispose()


def _run_model(engine: Engine, graph: list[tuple[list[int], bool]], steps: list[tuple[str, int]]) -> None:
    wd = Watchdog(engine)
    model = Model()
    jobs: list[Job] = []
    for index, (picks, any_outcome) in enumerate(graph):
        parents = sorted({f"j{p}" for p in picks if p < index})  # earlier jobs only: a DAG
        policy = "any_outcome" if any_outcome else "completed"
        jobs.append(Job(f"j{index}", "q", after=parents, after_policy=policy))
    wd.enqueue(jobs)  # one call: every parent comes first
    for job in jobs:
        node = Node(job.job_id, list(job.after), job.after_policy == "any_outcome")
        node.state = "queued" if not job.after else "waiting"
        model.add(node)
    _compare(wd, model)
    for action, pick in steps:
        ids = list(model.nodes)
        job_id = ids[pick % len(ids)]
        node = model.nodes[job_id]
        if action in ("complete", "fail"):
            with store.write_transaction(engine) as conn:
                batch = store.claim(conn, queues=["q"], limit=100, lease_ms=60_000)
            for claimed in batch.claimed:
                taken = model.nodes[claimed.job.job_id]
                assert taken.state == "queued", f"{taken.job_id} claimed while {taken.state}: released early"
                taken.runs += 1
                assert taken.runs == 1, f"{taken.job_id} ran twice"
                decision = Decision.completed() if action == "complete" else Decision.failed("no", retry=False)
                with store.write_transaction(engine) as conn:
                    store.settle(conn, job_id=taken.job_id, claim_token=claimed.token, decision=decision)
                model.settled(taken.job_id, "completed" if action == "complete" else "failed", from_waiting=False)
        elif action == "cancel":
            answer = wd.cancel(job_id, f"cancel-{job_id}")
            if node.state == "waiting":
                assert answer.status.value == "recorded"
                model.settled(job_id, "cancelled", from_waiting=True)
            elif node.state == "queued":
                assert answer.status.value == "recorded"
                with store.write_transaction(engine) as conn:  # the claim settles it cancelled
                    found = store.claim(conn, queues=["q"], limit=100, lease_ms=60_000)
                for claimed in found.claimed:  # others were claimable too: give them back as completed
                    other = model.nodes[claimed.job.job_id]
                    assert other.state == "queued"
                    other.runs += 1
                    with store.write_transaction(engine) as conn:
                        store.settle(
                            conn, job_id=other.job_id, claim_token=claimed.token, decision=Decision.completed()
                        )
                    model.settled(other.job_id, "completed", from_waiting=False)
                assert job_id in {j.job_id for j in found.cancelled}
                model.settled(job_id, "cancelled", from_waiting=False)
        else:
            while True:
                with store.write_transaction(engine) as conn:
                    if not store.propagate(conn):
                        break
            model.propagate()
        _compare(wd, model)
    # A runner's passes end every cascade; every job ran at most once.
    while True:
        with store.write_transaction(engine) as conn:
            if not store.propagate(conn):
                break
    model.propagate()
    _compare(wd, model)
    assert all(node.runs <= 1 for node in model.nodes.values())
    # Prune keeps every settled parent a live job still waits on.
    time.sleep(0.01)
    wd.prune(older_than=timedelta(milliseconds=1))
    for node in model.nodes.values():
        if node.state != "settled":
            for parent in node.parents:
                assert wd.read(parent) is not None, f"{parent} pruned while {node.job_id} waits"


def _compare(wd: Watchdog, model: Model) -> None:
    for job_id, node in model.nodes.items():
        job = present(wd.read(job_id))
        outcome = None if job.outcome is None else job.outcome.value
        assert (job.state.value, outcome) == (node.state, node.outcome), job_id
        if node.state == "waiting":
            assert job.waiting_on == len(set(node.parents) - node.told), job_id
        assert {p for p, counted in job.parents if counted is not None} == node.told, job_id
    with wd.engine.connect() as conn:
        untold = set(conn.execute(text("SELECT job_id FROM watchdog_jobs WHERE waiting_on = 0")).scalars())
    assert untold == set(model.untold)


# -- a worker killed while it settles the last parent ------------------------------------


@pytest.mark.parametrize("phase", ["before", pytest.param("after", marks=pytest.mark.slow)])
def test_sigkill_of_the_worker_settling_the_last_parent_releases_the_child_once(
    instrumented: Engine, db_url: URL, workers: WorkerPool, phase: str, runner_kind: str
) -> None:
    """The worker dies (SIGKILL) in the settle of the child's last parent,
    before its statement ran or after it ran but before it committed: the
    release was part of that transaction, so it happened exactly when the
    settlement did. Another worker recovers the parent, and the child runs
    once, after it."""
    import signal

    from tests.faults.helpers import assert_settled_exactly_once, audit_rows, enqueue_jobs, jobs_by_id, wait_until

    timing = {"lease": 3.0, "heartbeat": 0.5, "poll": 0.2, "asyncio": runner_kind == "async"}
    engine = instrumented
    enqueue_jobs(
        engine,
        [
            Job("first", "chaos", max_recoveries=2),
            Job("last", "chaos", max_recoveries=2),
            Job("child", "chaos", max_recoveries=2, after=["first", "last"]),
        ],
    )
    w1 = workers.start(db_url, "w1", kill_in_settle="last", kill_phase=phase, **timing)
    wait_until(lambda: not w1.alive, timeout=60, what="w1 to kill itself in the settle")
    assert w1.proc.returncode == -signal.SIGKILL, w1.log_text()
    rows = jobs_by_id(engine)
    if rows["last"]["state"] != "settled":  # the settlement did not commit: neither did the release
        assert rows["child"]["state"] == "waiting", rows["child"]
    workers.start(db_url, "w2", **timing)
    wait_until(
        lambda: all(r["state"] == "settled" for r in jobs_by_id(engine).values()),
        timeout=60,
        what="every job to settle",
    )
    settled = assert_settled_exactly_once(engine, ["first", "last", "child"])
    assert settled["child"]["outcome"] == "completed"
    (run,) = audit_rows(engine, "child")
    last_runs = audit_rows(engine, "last")
    assert run["started_ms"] >= max(r["ended_ms"] for r in last_runs if r["ended_ms"] is not None)
