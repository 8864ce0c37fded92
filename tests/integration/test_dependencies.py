"""Dependencies: Job(after=[...]) waits in the state ``waiting`` until every
parent settled, then is released in the same transaction as the last
parent's settlement -- or cancelled, naming the parent that did not complete;
on both dialects."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from sqlalchemy_watchdog import (
    Decision,
    EnqueueConflict,
    InvalidJob,
    Job,
    JobState,
    Outcome,
    Runner,
    RunningJob,
    Watchdog,
    enqueue,
    store,
)
from tests.helpers import present


def states(wd: Watchdog, *job_ids: str) -> dict[str, tuple[str, str | None]]:
    found = {}
    for job_id in job_ids:
        job = present(wd.read(job_id))
        found[job_id] = (job.state.value, None if job.outcome is None else job.outcome.value)
    return found


def count(engine: Engine, table: str = "watchdog_jobs") -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_a_chain_runs_in_order_each_link_released_by_the_last_parents_settlement(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("a", "q"), Job("b", "q", after=["a"]), Job("c", "q", after=["b"])])
    assert states(wd, "a", "b", "c") == {"a": ("queued", None), "b": ("waiting", None), "c": ("waiting", None)}
    assert present(wd.read("b")).waiting_on == 1
    ran: list[str] = []

    def handle(job: RunningJob) -> Any:
        ran.append(job.job_id)
        return job.job_id.upper()

    runner = Runner(engine, {"q": handle})
    runner.tick()
    # The settle of a released b in the same transaction: b is queued now, c still waits.
    assert states(wd, "b", "c") == {"b": ("queued", None), "c": ("waiting", None)}
    runner.run_until_idle()
    assert ran == ["a", "b", "c"]
    assert states(wd, "a", "b", "c") == {k: ("settled", "completed") for k in "abc"}
    b = present(wd.read("b"))
    assert b.parents == (("a", "completed"),) and b.dependents == ("c",) and b.waiting_on is None


def test_a_fan_in_waits_for_every_parent_and_reads_their_results(engine: Engine) -> None:
    wd = Watchdog(engine)
    parents = [Job(f"p{i}", "work", payload=i) for i in range(5)]
    wd.enqueue([*parents, Job("sum", "callbacks", after=[p.job_id for p in parents])])
    Runner(engine, {"work": lambda job: job.payload * 10}).tick()  # one parent done
    assert present(wd.read("sum")).waiting_on == 4
    Runner(engine, {"work": lambda job: job.payload * 10}).run_until_idle()
    assert present(wd.read("sum")).state is JobState.QUEUED

    def total(job: RunningJob) -> Any:
        results = job.parent_results()
        assert [r.job_id for r in results] == [f"p{i}" for i in range(5)]
        assert all(r.outcome is Outcome.COMPLETED for r in results)
        return sum(r.result for r in results)

    Runner(engine, {"callbacks": total}).run_until_idle()
    assert wd.result("sum").value == 100


def test_a_parent_that_does_not_complete_cancels_its_dependents_hop_by_hop(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(
        [
            Job("parent", "q"),
            Job("child", "q", after=["parent"]),
            Job("grandchild", "q", after=["child"]),
            Job("tolerant", "q", after=["parent"], after_policy="any_outcome"),
        ]
    )
    ran: list[str] = []

    def handle(job: RunningJob) -> Any:
        ran.append(job.job_id)
        return Decision.failed("broken", retry=False) if job.job_id == "parent" else None

    runner = Runner(engine, {"q": handle})
    runner.tick()
    child = present(wd.read("child"))
    # In the parent's settle transaction: the child is cancelled, naming the parent.
    assert child.outcome is Outcome.CANCELLED and child.failure_reason == "parent parent ended failed"
    assert present(wd.read("tolerant")).state is JobState.QUEUED
    # The grandchild hears of it from a runner's pass (one hop per transaction).
    assert present(wd.read("grandchild")).state is JobState.WAITING
    runner.run_until_idle()
    grandchild = present(wd.read("grandchild"))
    assert grandchild.outcome is Outcome.CANCELLED and grandchild.failure_reason == "parent child ended cancelled"
    assert ran == ["parent", "tolerant"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM watchdog_jobs WHERE waiting_on = 0")).scalar() == 0


def test_cancel_of_a_waiting_job_settles_it_and_its_dependents_follow(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("p", "q"), Job("w", "q", after=["p"]), Job("ww", "q", after=["w"])])
    assert wd.cancel("w", "stop-w").status.value == "recorded"
    assert states(wd, "w") == {"w": ("settled", "cancelled")}
    Runner(engine, {"q": lambda job: None}).run_until_idle()
    assert states(wd, "p", "w", "ww") == {
        "p": ("settled", "completed"),
        "w": ("settled", "cancelled"),
        "ww": ("settled", "cancelled"),
    }


def test_purge_fail_lane_and_recovery_settle_a_parent_for_its_dependents(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(
        [
            Job("purged", "gone"),
            Job("after-purge", "q", after=["purged"]),
            Job("laned", "q", lane="broken-lane"),
            Job("after-lane", "q", after=["laned"]),
        ]
    )
    assert wd.purge("gone") == 1
    assert present(wd.read("after-purge")).failure_reason == "parent purged ended purged"
    wd.fail_lane("broken-lane", "down")
    assert present(wd.read("after-lane")).failure_reason == "parent laned ended failed"

    wd.enqueue([Job("vanishes", "v"), Job("after-vanish", "q", after=["vanishes"])])
    with engine.begin() as conn:
        store.claim(conn, queues=["v"], limit=1, lease_ms=60_000)
        conn.execute(text("UPDATE watchdog_jobs SET lease_until = 0 WHERE job_id = 'vanishes'"))
    Runner(engine, {"v": lambda job: None}, queues=["v"]).tick()  # recovery: interrupted (no budget)
    assert present(wd.read("after-vanish")).failure_reason == "parent vanishes ended interrupted"


def test_a_rerun_of_a_parent_does_not_release_settled_dependents_again(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("p", "q"), Job("c", "q", after=["p"])])
    ran: list[str] = []
    Runner(engine, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()
    wd.rerun("p", rerun_id="again")
    Runner(engine, {"q": lambda job: ran.append(job.job_id)}).run_until_idle()
    assert ran == ["p", "c", "p~rerun~again"]
    assert states(wd, "c") == {"c": ("settled", "completed")}


def test_prune_never_removes_a_parent_a_live_job_waits_on(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("done", "fast"), Job("slow", "slow"), Job("child", "q", after=["done", "slow"])])
    Runner(engine, {"fast": lambda job: "kept for the child"}, queues=["fast"]).run_until_idle()
    time.sleep(0.01)
    assert wd.prune(older_than=timedelta(milliseconds=1)) == 0  # the child still waits for it
    Runner(engine, {"slow": lambda job: None, "q": lambda job: None}).run_until_idle()
    assert states(wd, "child") == {"child": ("settled", "completed")}
    time.sleep(0.01)
    assert wd.prune(older_than=timedelta(milliseconds=1)) == 3
    assert count(engine, "watchdog_job_edges") == 0


def test_parents_must_exist_or_come_first_and_bad_after_writes_nothing(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(Job("cancelled", "q"))
    wd.cancel("cancelled", "c-1")
    Runner(engine, {"q": lambda job: None}).run_until_idle()
    before = count(engine)
    cases = [
        ([Job("x", "q", after=["nobody"])], "no such job"),
        ([Job("x", "q", after=["y"]), Job("y", "q")], "comes later in this call"),
        ([Job("x", "q", after=["cancelled"])], "already ended cancelled"),
    ]
    for jobs, words in cases:
        with pytest.raises(InvalidJob, match=words) as error:
            with engine.begin() as conn:
                enqueue(conn, jobs)
        assert error.value.field == "after"
        assert count(engine) == before and count(engine, "watchdog_job_edges") == 0
    with pytest.raises(InvalidJob, match="cannot wait for itself"):
        Job("x", "q", after=["x"])
    with pytest.raises(InvalidJob, match="after_policy"):
        Job("x", "q", after=["cancelled"], after_policy="sometimes")
    # any_outcome takes a parent however it ended: it runs at once.
    wd.enqueue(Job("x", "q", after=["cancelled"], after_policy="any_outcome"))
    assert present(wd.read("x")).state is JobState.QUEUED


def test_a_replayed_child_is_a_duplicate_and_adds_no_edges(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("p", "q"), Job("q2", "q"), Job("c", "q", after=["p", "q2"])])
    again = wd.enqueue([Job("c", "q", after=["q2", "p"])])  # the same parents, in another order
    assert again[0].status.value == "duplicate"
    assert present(wd.read("c")).parents == (("p", None), ("q2", None))


def test_replaying_a_workflow_after_a_step_failed_is_a_duplicate_not_a_refusal(engine: Engine) -> None:
    """An identical replay is a no-op whatever happened since: the parent
    that failed (which a new dependent could not name) does not turn the
    replay of its stored dependents into an error; a job not stored yet
    that names it is still refused, and nothing is written then."""
    wd = Watchdog(engine)
    workflow = [Job("fetch", "q"), Job("publish", "q", after=["fetch"]), Job("notify", "q", after=["publish"])]
    wd.enqueue(workflow)
    Runner(engine, {"q": lambda job: Decision.failed("upstream down")}).run_until_idle()
    assert states(wd, "fetch", "publish", "notify")["fetch"] == ("settled", "failed")
    again = wd.enqueue(workflow)
    assert [result.status.value for result in again] == ["duplicate"] * 3
    before = count(engine)
    with pytest.raises(InvalidJob, match="already ended failed"):
        wd.enqueue([*workflow, Job("audit", "q", after=["fetch"])])
    assert count(engine) == before


@pytest.mark.parametrize(
    ("replay", "field"),
    [
        (Job("c", "q", after=["p"]), "after"),  # fewer parents
        (Job("c", "q", after=["p", "q2", "q3"]), "after"),  # more parents
        (Job("c", "q", after=["p", "q3"]), "after"),  # another parent
        (Job("c", "q"), None),  # no parents at all (the statement refuses it)
        (Job("c", "q", after=["p", "q2"], after_policy="any_outcome"), None),  # another policy
        (Job("plain", "q", after=["p"]), None),  # parents for a job stored without any
    ],
    ids=["fewer", "more", "other", "none", "policy", "added"],
)
def test_a_replay_with_other_parents_or_policy_is_a_conflict_and_writes_nothing(
    engine: Engine, replay: Job, field: str | None
) -> None:
    """``after`` and ``after_policy`` are part of a job's identity: a replay
    that differs in either is an EnqueueConflict, like any other field, and
    the caller's transaction (here with a new job beside it) is rolled back."""
    wd = Watchdog(engine)
    wd.enqueue([Job("p", "q"), Job("q2", "q"), Job("q3", "q"), Job("plain", "q"), Job("c", "q", after=["p", "q2"])])
    jobs, edges = count(engine), count(engine, "watchdog_job_edges")
    with pytest.raises(EnqueueConflict) as error:
        with engine.begin() as conn:
            enqueue(conn, [Job("beside", "q"), replay])
    assert error.value.job_id == replay.job_id and error.value.field == field
    if field is not None:
        assert "a different after" in str(error.value)
    assert (count(engine), count(engine, "watchdog_job_edges")) == (jobs, edges)
    assert wd.read("beside") is None
    assert present(wd.read("c")).parents == (("p", None), ("q2", None))
    # Within one call too.
    with pytest.raises(EnqueueConflict) as error:
        wd.enqueue([Job("new", "q", after=["p"]), Job("new", "q", after=["q2"])])
    assert error.value.field == "after" and wd.read("new") is None


def test_a_deleted_child_takes_its_edges_with_it_whatever_its_state(engine: Engine) -> None:
    """A purged queued child (its parent completed) leaves no edge naming it;
    nor does a pruned one; the parent's edges to children that still exist stay."""
    wd = Watchdog(engine)
    wd.enqueue([Job("p", "parents"), Job("kept", "kept", after=["p"])])
    Runner(engine, {"parents": lambda job: None}, queues=["parents"]).run_until_idle()
    wd.enqueue(
        [
            Job("purged", "children", after=["p"]),
            Job("delayed", "children", after=["p"], run_at=datetime.now(UTC) + timedelta(hours=1)),
        ]
    )
    assert count(engine, "watchdog_job_edges") == 3
    assert wd.purge("children") == 2
    with engine.connect() as conn:
        assert conn.execute(text("SELECT child, parent FROM watchdog_job_edges")).all() == [("kept", "p")]
    assert present(wd.read("p")).dependents == ("kept",)


# -- operations and waiting jobs (revision w0014) ---------------------------------------


def test_stats_and_listing_count_waiting_jobs_in_their_own_field(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("p", "q"), Job("w1", "q", after=["p"]), Job("w2", "other", after=["p"])])
    by_queue = {queue.queue: queue for queue in wd.stats().queues}
    assert (by_queue["q"].queued, by_queue["q"].waiting) == (1, 1)
    assert (by_queue["other"].queued, by_queue["other"].delayed, by_queue["other"].waiting) == (0, 0, 1)
    assert [job.job_id for job in wd.list_jobs(state="waiting")] == ["w1", "w2"]
    assert [job.job_id for job in wd.list_jobs(state="waiting", queue="other")] == ["w2"]
    Runner(engine, {"q": lambda job: None, "other": lambda job: None}).run_until_idle()
    assert all(queue.waiting == 0 for queue in wd.stats().queues)


def test_purge_deletes_the_queues_waiting_jobs_and_tells_their_dependents(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(
        [
            Job("p", "gone"),
            Job("w", "gone", after=["p"]),  # waits for a job of the same queue
            Job("elsewhere", "kept", after=["w"]),
            Job("any", "kept", after=["w"], after_policy="any_outcome"),
        ]
    )
    assert wd.purge("gone") == 2
    assert wd.read("p") is None and wd.read("w") is None
    assert states(wd, "elsewhere", "any") == {"elsewhere": ("settled", "cancelled"), "any": ("queued", None)}
    assert present(wd.read("elsewhere")).failure_reason == "parent w ended purged"
    with engine.connect() as conn:
        edges = conn.execute(text("SELECT child, parent, outcome FROM watchdog_job_edges ORDER BY child")).all()
    assert edges == [("any", "w", "purged"), ("elsewhere", "w", "purged")]


def test_purging_a_chain_within_one_queue_tells_the_dependents_outside_it(engine: Engine) -> None:
    """A purge deletes every link of a chain in its queue; SQLite's delete
    also removes a link its own trigger just cancelled (no re-check), and
    that link still tells its dependents: the same answer on both dialects."""
    wd = Watchdog(engine)
    wd.enqueue(
        [
            Job("w0", "gone"),
            Job("w1", "gone", after=["w0"]),
            Job("w2", "gone", after=["w1"]),
            Job("w3", "gone", after=["w2"]),
            Job("outside", "kept", after=["w3"]),
            Job("outside-2", "kept", after=["w2"]),
        ]
    )
    assert wd.purge("gone") == 4
    assert [job.job_id for job in wd.list_jobs()] == ["outside", "outside-2"]
    assert present(wd.read("outside")).failure_reason == "parent w3 ended purged"
    assert present(wd.read("outside-2")).failure_reason == "parent w2 ended purged"
    with engine.connect() as conn:
        edges = conn.execute(text("SELECT child, parent, outcome FROM watchdog_job_edges ORDER BY child")).all()
    assert edges == [("outside", "w3", "purged"), ("outside-2", "w2", "purged")]


def test_fail_lane_settles_the_lanes_waiting_jobs_after_its_live_ones(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue(
        [
            Job("p", "q"),
            Job("live", "q", lane="printer"),
            *(Job(f"w{i}", "q", lane="printer", after=["p"]) for i in range(3)),
            Job("w-other-lane", "q", after=["p"]),
            Job("after-w0", "next", after=["w0"]),
        ]
    )
    failures = []
    with engine.begin() as conn:
        while True:
            failure = store.fail_lane(conn, "printer", "jammed", batch=2)
            failures.append([job.job_id for job in failure.jobs])
            if not failure.more:
                break
    assert failures == [["live", "w0"], ["w1", "w2"]]
    assert states(wd, "w0", "w1", "w-other-lane") == {
        "w0": ("settled", "failed"),
        "w1": ("settled", "failed"),
        "w-other-lane": ("waiting", None),
    }
    assert present(wd.read("w0")).failure_reason == "jammed"
    Runner(engine, {"q": lambda job: None}, queues=["q"]).run_until_idle()  # its pass tells w0's dependents
    assert present(wd.read("after-w0")).failure_reason == "parent w0 ended failed"
    assert states(wd, "w-other-lane") == {"w-other-lane": ("settled", "completed")}
    assert wd.fail_lane("printer", "jammed").jobs == ()


@pytest.mark.parametrize("only_if_queued", [False, True])
def test_cancel_many_cancels_waiting_jobs_in_admission_order(engine: Engine, only_if_queued: bool) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("p", "parents"), Job("a", "q"), Job("w1", "q", after=["p"]), Job("b", "q")])
    wd.enqueue([Job("w2", "q", after=["p"]), Job("child", "other", after=["w2"])])
    result = wd.cancel_many(cancellation_id="bulk", queue="q", batch=3, only_if_queued=only_if_queued)
    assert result.done == ("a", "w1", "b", "w2")
    assert states(wd, "w1", "w2") == {"w1": ("settled", "cancelled"), "w2": ("settled", "cancelled")}
    Runner(engine, {"q": lambda job: None, "parents": lambda job: None}).run_until_idle()
    assert present(wd.read("child")).failure_reason == "parent w2 ended cancelled"
    assert states(wd, "p") == {"p": ("settled", "completed")}


def test_pause_rerun_and_recovery_leave_waiting_jobs_to_their_parents(engine: Engine) -> None:
    wd = Watchdog(engine)
    wd.enqueue([Job("p", "parents"), Job("c", "paused", after=["p"])])
    wd.pause("paused")
    with pytest.raises(InvalidJob, match="is waiting; only a settled job can be rerun"):
        wd.rerun("c", rerun_id="r")
    Runner(engine, {"parents": lambda job: None, "paused": lambda job: None}).run_until_idle()
    assert states(wd, "c") == {"c": ("queued", None)}  # released, and waits for the resume
    wd.resume("paused")
    Runner(engine, {"paused": lambda job: None}).run_until_idle()
    wd.rerun("c", rerun_id="again")
    copy = present(wd.read("c~rerun~again"))
    assert copy.state is JobState.QUEUED and copy.parents == ()  # a rerun runs at once, without parents
