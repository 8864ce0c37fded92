"""The backends the conformance suite runs against, and its ``db`` fixture.

A backend under test is one param of :func:`backend_database`, taken from
``tests.conftest.DIALECTS``: SQLite on a real file, PostgreSQL from
``WATCHDOG_TEST_POSTGRES_URL`` (tests/conftest.py). A new dialect's backend
joins by adding its name there and its database below (and in
``tests.conftest.db_url``, for ``test_capabilities.py``); it is done when
every test of ``tests/backends`` passes on it.

The per-operation files (``test_ops_*.py``) share one database per backend
and per test process, its schema created once; each test gets a new engine
on it with every table emptied. Emptying takes milliseconds where dropping
and creating the schema (the ``engine`` fixture) takes a second on a busy
PostgreSQL, which keeps the suite inside the default run's time budget.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.engine import URL

from sqlalchemy_watchdog import metadata
from tests.conftest import WITH_MARIADB, mysql_database


@contextlib.contextmanager
def _postgres_database(request: pytest.FixtureRequest) -> Iterator[URL]:
    """A database of its own on the test server (the ``engine`` fixture of
    other tests in this process drops and recreates ``public`` in theirs).
    Not a schema beside ``public``: ``create_all`` skips the dependency
    triggers when a trigger of theirs exists in any schema of the database."""
    server: URL = request.getfixturevalue("postgres_server")
    name = f"watchdog_ops_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


#: Issue 57, phase 1: what each operation file still needs on MariaDB from the
#: statement builders (phase 2). Every test of these files that takes the
#: MariaDB database is a strict xfail with this reason, so the suite says
#: exactly what remains, and a test that starts passing fails until its
#: mark goes (RUNS_ON_MARIADB).
NOT_YET_ON_MARIADB = {
    "test_ops_limits.py": "limits: the upsert of watchdog_limits (ON CONFLICT -> ON DUPLICATE KEY), "
    "the limited claim (and enqueue)",
    "test_ops_maintenance.py": "the jobs' pruning and retention: their picks and the unique keys' "
    "(IN (subquery LIMIT), error 1235) and DELETE ... RETURNING",
    "test_ops_dependencies.py": "enqueue with after=; the edge triggers cascade into watchdog_jobs from a "
    "trigger on it (MariaDB error 1442): propagation must leave the triggers",
    "test_ops_unique.py": "the unique keys' upsert (store/unique_sql.py: on_conflict_do_nothing -> "
    "INSERT IGNORE / ON DUPLICATE KEY) and RETURNING (and enqueue)",
    "test_ops_views.py": "the views' rows come from enqueue/claim/settle, which are phase 2",
}
#: The capabilities (test_capabilities.py) MariaDB does not meet yet, by test.
CAPABILITIES_NOT_YET = {
    "test_insert_on_conflict_does_nothing_and_returns_only_new_rows": "Backend.insert has no "
    "on_conflict_do_nothing: ON DUPLICATE KEY / INSERT IGNORE and no RETURNING (phase 2 decides the seam)",
    "test_a_write_targets_exactly_the_picked_rows": "UPDATE ... RETURNING; picked() is an IN over "
    "its own table (error 1093): a locking read, then a write by key",
    "test_a_write_reaches_the_rows_a_pick_locked_by_their_address": "needs json_rows / RETURNING",
    "test_a_pick_skips_rows_another_transaction_holds_where_rows_lock": "the test expects PostgreSQL's or "
    "SQLite's pick SQL; MariaDB's FOR UPDATE SKIP LOCKED is right, the test's dialect rule is phase 2",
    "test_the_dependency_triggers_are_made_counted_and_dropped_by_the_backends_ddl": "the edge triggers "
    "update watchdog_jobs from a trigger on it (error 1442); and enqueue",
    "test_a_locking_statement_counts_what_the_lock_protects_where_the_backend_locks_before_reading": "needs "
    "json_rows / RETURNING",
    "test_a_share_locked_read_holds_its_rows_against_a_delete_where_rows_lock": "the test expects "
    "PostgreSQL's FOR KEY SHARE or none; MariaDB's LOCK IN SHARE MODE is phase 2's to assert",
    "test_pruning_skips_while_another_transaction_prunes": "retention's pruning of the unique keys: "
    "IN (subquery with LIMIT), which MariaDB refuses (error 1235)",
    "test_the_url_rules_give_urls_the_driver_accepts": "has_schemas is False without a database file: "
    "the pytest plugin's per-test database on MariaDB is phase 2",
}
#: The operation tests that already pass on MariaDB.
RUNS_ON_MARIADB = {
    # Enqueue: a locking read of the stored rows, then an INSERT of the new ones.
    "test_enqueue_admits_every_new_job_queued_in_admission_order",
    "test_an_identical_replay_is_a_duplicate_and_writes_nothing",
    "test_a_replay_into_another_queue_is_a_conflict",
    "test_a_conflicting_replay_raises_and_its_whole_batch_writes_nothing",
    "test_one_job_twice_in_a_batch_is_admitted_once_and_a_conflicting_twin_refuses_the_batch",
    "test_enqueue_each_skips_a_conflicting_replay_and_admits_the_others",
    "test_an_enqueue_delay_keeps_the_job_delayed_and_unclaimable_until_the_database_clock_reaches_it",
    "test_enqueue_select_admits_one_job_per_row_in_the_callers_transaction",
    "test_a_replay_of_a_job_that_already_ran_is_still_a_duplicate",
    # Claim and promote: a SKIP LOCKED locking read in index order, an UPDATE by primary key.
    "test_a_claim_runs_the_job_under_a_fresh_secret_token_and_a_lease_from_the_database_clock",
    "test_a_claim_takes_at_most_its_limit_and_nothing_when_nothing_is_ready",
    "test_claim_order_is_priority_first_then_admission_order",
    "test_a_claim_takes_only_jobs_of_the_queues_it_names_best_first_across_them",
    "test_ready_counts_see_queued_jobs_of_the_named_queues_up_to_the_cap",
    "test_concurrent_claimers_never_take_the_same_job_and_together_take_every_job",
    "test_a_claim_beside_an_uncommitted_claim_takes_the_next_job_and_never_the_held_one",
    "test_a_job_cancelled_while_queued_is_settled_cancelled_by_the_claim_and_not_run",
    "test_fail_lane_settles_the_lanes_live_jobs_failed_and_leaves_other_lanes_claimable",
    "test_the_clients_fail_lane_settles_the_lane_in_batches_until_none_is_live",
    "test_a_delayed_job_is_claimed_only_after_promotion_once_due",
    "test_make_due_readies_only_the_named_queues_delayed_jobs",
    # Pauses: a locking read of the pause, then a plain INSERT; resume by row count.
    "test_pause_and_resume_report_what_they_changed_and_are_idempotent",
    "test_stats_count_each_queues_jobs_by_state_recent_outcomes_and_expired_leases",
    # Workers and schedules: ON DUPLICATE KEY UPDATE (Backend.upsert), pruned by Backend.among.
    "test_workers_register_refresh_show_and_leave",
    "test_recorded_schedules_are_listed_current_and_a_second_definition_is_disputed",
    # Maintenance and views over what enqueue, claim and settle now write.
    "test_purge_deletes_the_queues_jobs_that_have_not_started_and_nothing_else",
    "test_prune_deletes_only_settled_jobs_old_enough_of_the_named_outcomes",
    "test_a_rerun_enqueues_a_copy_of_a_settled_job_once",
    "test_a_bulk_cancel_acts_in_batches_on_the_selected_live_jobs_below_its_end",
    "test_a_bulk_rerun_copies_the_selected_settled_jobs_and_a_dry_run_writes_nothing",
    "test_read_returns_the_job_as_stored_and_read_claim_adds_its_current_token",
    "test_the_queue_head_is_its_running_job_else_the_next_one_a_claim_would_take",
    "test_read_settled_pages_settled_jobs_in_admission_order",
    "test_list_jobs_pages_by_sequence_both_ways_and_filters",
    "test_throughput_counts_the_last_hours_settlements_per_queue_and_outcome",
    "test_limits_without_any_limit_are_refused_and_write_nothing",
    "test_bad_combinations_are_refused_before_anything_is_written",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "mariadb" not in (
            callspec.params.get("backend_database"),
            callspec.params.get("dialect"),
        ):
            continue
        name: str = item.originalname  # type: ignore[attr-defined]
        reason = CAPABILITIES_NOT_YET.get(name) or NOT_YET_ON_MARIADB.get(item.path.name)
        if reason is not None and name not in RUNS_ON_MARIADB:
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"not yet on MariaDB: {reason}"))


@pytest.fixture(scope="session", params=WITH_MARIADB)
def backend_database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[URL]:
    """A database of the param's backend with the schema created (one per test process)."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = make_url(f"sqlite:///{tmp_path_factory.mktemp('backend') / 'watchdog.db'}")
        elif request.param == "mariadb":
            url = stack.enter_context(mysql_database(request.getfixturevalue("mysql_server"), "watchdog_ops"))
        else:
            url = stack.enter_context(_postgres_database(request))
        engine = create_engine(url)
        metadata.create_all(engine)
        engine.dispose()
        yield url


@pytest.fixture
def db(backend_database: URL) -> Iterator[Engine]:
    """A new engine on the backend's database, every watchdog table empty."""
    engine = create_engine(backend_database)
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    yield engine
    engine.dispose()
