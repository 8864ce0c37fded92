"""Create watchdog_jobs.

Revision ID: w0001_watchdog_jobs
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

# The wake-up trigger as this revision created it (w0007 replaced its
# function); frozen here, as a revision's SQL must be.
NOTIFY_FUNCTION_SQL = """\
CREATE OR REPLACE FUNCTION watchdog_jobs_notify_queued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('watchdog_jobs', 'queued');
    RETURN NULL;
END
$$"""
NOTIFY_TRIGGER_SQL = (
    "CREATE TRIGGER watchdog_jobs_queued AFTER INSERT ON watchdog_jobs "
    "FOR EACH STATEMENT EXECUTE FUNCTION watchdog_jobs_notify_queued()"
)
DROP_NOTIFY_FUNCTION_SQL = "DROP FUNCTION IF EXISTS watchdog_jobs_notify_queued()"

revision = "w0001_watchdog_jobs"
down_revision = None
branch_labels = ("watchdog",)
depends_on = None

LIVE = "state IN ('queued', 'running')"


def _partial(where: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}


# Names are final (op.f): an environment whose target_metadata carries a
# naming convention must not prefix them again.


# -- MariaDB and MySQL ------------------------------------------------------------
#
# The backend came with revision w0021 as the newest: no MariaDB or MySQL database
# holds an older revision. On them this revision makes the whole schema of w0021 at
# once -- every table, CHECK and index, and the two dependency triggers those servers
# allow (see Backend.trigger_names) -- and w0002 to w0021 change nothing there
# (made_whole); downgrading to base drops it all. Frozen here, as a revision's SQL
# must be: what metadata.create_all made on MariaDB at w0021, with the dialect's
# binary collation in place of {collation}.

#: The binary collation of the text key columns, by dialect (backends.mysql).
MYSQL_COLLATIONS = {"mariadb": "utf8mb4_nopad_bin", "mysql": "utf8mb4_bin"}
#: The tables of w0021, in the order they are dropped.
MYSQL_TABLES = (
    "watchdog_job_steps",
    "watchdog_unique_keys",
    "watchdog_limit_claims",
    "watchdog_limits",
    "watchdog_schedules",
    "watchdog_workers",
    "watchdog_queue_pauses",
    "watchdog_job_edges",
    "watchdog_jobs",
)
#: The dependency triggers of w0021 on these servers.
MYSQL_TRIGGERS = ("watchdog_jobs_child_pruned", "watchdog_job_edges_counted")

MYSQL_SCHEMA: tuple[str, ...] = (
    (
        "CREATE TABLE watchdog_jobs (\n"
        "\tsequence BIGINT NOT NULL AUTO_INCREMENT, \n"
        "\tjob_id VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\tqueue_name VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\tlane VARCHAR(513) COLLATE {collation} NOT NULL, \n"
        "\tpriority BIGINT NOT NULL, \n"
        "\tpayload_json TEXT NOT NULL, \n"
        "\trecovery_max INTEGER, \n"
        "\tstate VARCHAR(33) COLLATE {collation} NOT NULL, \n"
        "\toutcome VARCHAR(33) COLLATE {collation}, \n"
        "\tclaim_token TEXT, \n"
        "\trecovery_count INTEGER NOT NULL DEFAULT 0, \n"
        "\tcancellation_id VARCHAR(257) COLLATE {collation}, \n"
        "\tfailure_reason TEXT, \n"
        "\tfailure_detail TEXT, \n"
        "\tlease_until BIGINT, \n"
        "\trun_at BIGINT, \n"
        "\tready_at BIGINT, \n"
        "\tattempt INTEGER NOT NULL DEFAULT 1, \n"
        "\tmax_attempts INTEGER, \n"
        "\tretry_policy TEXT, \n"
        "\ttimeout_ms BIGINT, \n"
        "\tsnoozes INTEGER NOT NULL DEFAULT 0, \n"
        "\tfailure_history TEXT, \n"
        "\tenqueued_at BIGINT, \n"
        "\tstarted_at BIGINT, \n"
        "\tsettled_at BIGINT, \n"
        "\trerun_of VARCHAR(257) COLLATE {collation}, \n"
        "\ttrace_context TEXT, \n"
        "\tlimit_key VARCHAR(257) COLLATE {collation}, \n"
        "\tresult_json TEXT, \n"
        "\tprogress FLOAT, \n"
        "\tprogress_note TEXT, \n"
        "\twaiting_on INTEGER, \n"
        "\tafter_policy TEXT, \n"
        "\twatched INTEGER, \n"
        "\tunstarted INTEGER, \n"
        "\tCONSTRAINT pk_watchdog_jobs PRIMARY KEY (sequence), \n"
        "\tCONSTRAINT ck_watchdog_jobs_job_id_length CHECK (CHAR_LENGTH(job_id) BETWEEN 1 AND 256), \n"
        "\tCONSTRAINT ck_watchdog_jobs_queue_name_length CHECK (CHAR_LENGTH(queue_name) BETWEEN 1 AND "
        "256), \n"
        "\tCONSTRAINT ck_watchdog_jobs_lane_length CHECK (CHAR_LENGTH(lane) BETWEEN 1 AND 512), \n"
        "\tCONSTRAINT ck_watchdog_jobs_cancellation_id_length CHECK (cancellation_id IS NULL OR "
        "CHAR_LENGTH(cancellation_id) BETWEEN 1 AND 256), \n"
        "\tCONSTRAINT ck_watchdog_jobs_state_known CHECK (state IN ('delayed', 'queued', 'running', "
        "'settled', 'waiting')), \n"
        "\tCONSTRAINT ck_watchdog_jobs_outcome_known CHECK (outcome IS NULL OR outcome IN ('completed', "
        "'failed', 'cancelled', 'outcome_unknown', 'interrupted')), \n"
        "\tCONSTRAINT ck_watchdog_jobs_recovery_max_nonnegative CHECK (recovery_max IS NULL OR "
        "recovery_max >= 0), \n"
        "\tCONSTRAINT ck_watchdog_jobs_recovery_count_nonnegative CHECK (recovery_count >= 0), \n"
        "\tCONSTRAINT ck_watchdog_jobs_state_grammar CHECK ((state = 'delayed' AND outcome IS NULL AND "
        "claim_token IS NULL AND lease_until IS NULL AND ready_at IS NOT NULL) OR (state = 'queued' AND "
        "outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL) OR (state = 'running' AND "
        "outcome IS NULL AND claim_token IS NOT NULL AND lease_until IS NOT NULL) OR (state = 'settled' "
        "AND outcome IS NOT NULL AND lease_until IS NULL) OR (state = 'waiting' AND outcome IS NULL AND "
        "claim_token IS NULL AND lease_until IS NULL AND waiting_on > 0)), \n"
        "\tCONSTRAINT ck_watchdog_jobs_max_attempts_range CHECK (max_attempts IS NULL OR max_attempts "
        "BETWEEN 1 AND 1000), \n"
        "\tCONSTRAINT ck_watchdog_jobs_attempt_bounds CHECK (attempt >= 1 AND (max_attempts IS NULL OR "
        "attempt <= max_attempts)), \n"
        "\tCONSTRAINT ck_watchdog_jobs_snoozes_nonnegative CHECK (snoozes >= 0), \n"
        "\tCONSTRAINT ck_watchdog_jobs_timeout_positive CHECK (timeout_ms IS NULL OR timeout_ms > 0), \n"
        "\tCONSTRAINT ck_watchdog_jobs_settled_at_settled CHECK (settled_at IS NULL OR state = "
        "'settled'), \n"
        "\tCONSTRAINT ck_watchdog_jobs_rerun_of_length CHECK (rerun_of IS NULL OR CHAR_LENGTH(rerun_of) "
        "BETWEEN 1 AND 256), \n"
        "\tCONSTRAINT ck_watchdog_jobs_trace_context_length CHECK (trace_context IS NULL OR "
        "CHAR_LENGTH(trace_context) BETWEEN 2 AND 4096), \n"
        "\tCONSTRAINT ck_watchdog_jobs_limit_key_length CHECK (limit_key IS NULL OR "
        "CHAR_LENGTH(limit_key) BETWEEN 1 AND 256), \n"
        "\tCONSTRAINT ck_watchdog_jobs_result_completed CHECK (result_json IS NULL OR (state = 'settled' "
        "AND outcome = 'completed')), \n"
        "\tCONSTRAINT ck_watchdog_jobs_progress_range CHECK (progress IS NULL OR (progress >= 0 AND "
        "progress <= 1)), \n"
        "\tCONSTRAINT ck_watchdog_jobs_waiting_on_state CHECK (waiting_on IS NULL OR (waiting_on > 0 AND "
        "state = 'waiting') OR (waiting_on = 0 AND state = 'settled')), \n"
        "\tCONSTRAINT ck_watchdog_jobs_after_policy_known CHECK (after_policy IS NULL OR after_policy IN "
        "('completed', 'any_outcome')), \n"
        "\tCONSTRAINT ck_watchdog_jobs_progress_note_length CHECK (progress_note IS NULL OR "
        "CHAR_LENGTH(progress_note) <= 500), \n"
        "\tCONSTRAINT ck_watchdog_jobs_watched_flag CHECK (watched IS NULL OR watched = 1), \n"
        "\tCONSTRAINT ck_watchdog_jobs_unstarted_flag CHECK (unstarted IS NULL OR unstarted = 1), \n"
        "\tCONSTRAINT ck_watchdog_jobs_unstarted_running CHECK (unstarted IS NULL OR state = 'running'), \n"
        "\tCONSTRAINT uq_watchdog_jobs_job_id UNIQUE (job_id)\n)"
    ),
    "CREATE INDEX ix_watchdog_jobs_delayed ON watchdog_jobs (ready_at, sequence)",
    ("CREATE INDEX ix_watchdog_jobs_keyed_queued ON watchdog_jobs (queue_name, limit_key, priority DESC, sequence)"),
    "CREATE INDEX ix_watchdog_jobs_keyed_running ON watchdog_jobs (queue_name, limit_key)",
    "CREATE INDEX ix_watchdog_jobs_lane_history ON watchdog_jobs (lane, sequence)",
    "CREATE INDEX ix_watchdog_jobs_lease ON watchdog_jobs (lease_until, sequence)",
    "CREATE INDEX ix_watchdog_jobs_live_lane ON watchdog_jobs (lane, state DESC, sequence)",
    (
        "CREATE INDEX ix_watchdog_jobs_live_queue ON watchdog_jobs (queue_name, state, priority DESC, "
        "sequence, ready_at, enqueued_at)"
    ),
    "CREATE INDEX ix_watchdog_jobs_rerun_of ON watchdog_jobs (rerun_of)",
    "CREATE INDEX ix_watchdog_jobs_settled ON watchdog_jobs (outcome, settled_at, sequence)",
    "CREATE INDEX ix_watchdog_jobs_untold ON watchdog_jobs (sequence)",
    "CREATE INDEX ix_watchdog_jobs_waiting ON watchdog_jobs (lane(255), queue_name, sequence)",
    "CREATE UNIQUE INDEX uq_watchdog_jobs_cancellation_id ON watchdog_jobs (cancellation_id)",
    (
        "CREATE TABLE watchdog_job_edges (\n"
        "\tchild VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\tparent VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\toutcome TEXT, \n"
        "\tCONSTRAINT pk_watchdog_job_edges PRIMARY KEY (child, parent), \n"
        "\tCONSTRAINT ck_watchdog_job_edges_child_length CHECK (CHAR_LENGTH(child) BETWEEN 1 AND 256), \n"
        "\tCONSTRAINT ck_watchdog_job_edges_parent_length CHECK (CHAR_LENGTH(parent) BETWEEN 1 AND 256), \n"
        "\tCONSTRAINT ck_watchdog_job_edges_outcome_known CHECK (outcome IS NULL OR outcome IN "
        "('completed', 'failed', 'cancelled', 'outcome_unknown', 'interrupted', 'purged')), \n"
        "\tCONSTRAINT ck_watchdog_job_edges_not_itself CHECK (child <> parent)\n)"
    ),
    "CREATE INDEX ix_watchdog_job_edges_parent ON watchdog_job_edges (parent, child)",
    (
        "CREATE TABLE watchdog_queue_pauses (\n"
        "\tqueue_name VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\treason TEXT, \n"
        "\tpaused_at BIGINT NOT NULL, \n"
        "\tCONSTRAINT pk_watchdog_queue_pauses PRIMARY KEY (queue_name), \n"
        "\tCONSTRAINT ck_watchdog_queue_pauses_queue_name_length CHECK (CHAR_LENGTH(queue_name) BETWEEN 1 "
        "AND 256), \n"
        "\tCONSTRAINT ck_watchdog_queue_pauses_reason_length CHECK (reason IS NULL OR CHAR_LENGTH(reason) "
        "<= 2000)\n)"
    ),
    (
        "CREATE TABLE watchdog_workers (\n"
        "\tworker_id VARCHAR(65) COLLATE {collation} NOT NULL, \n"
        "\thost TEXT NOT NULL, \n"
        "\tpid INTEGER NOT NULL, \n"
        "\tqueues TEXT NOT NULL, \n"
        "\tconcurrency INTEGER NOT NULL, \n"
        "\twakeups TEXT NOT NULL, \n"
        "\tversion TEXT NOT NULL, \n"
        "\theartbeat_ms BIGINT NOT NULL, \n"
        "\tstarted_at BIGINT NOT NULL, \n"
        "\tlast_seen BIGINT NOT NULL, \n"
        "\trunning INTEGER NOT NULL DEFAULT 0, \n"
        "\tclaim_ahead INTEGER NOT NULL DEFAULT 0, \n"
        "\tprocess_queues TEXT NOT NULL DEFAULT '[]', \n"
        "\tCONSTRAINT pk_watchdog_workers PRIMARY KEY (worker_id), \n"
        "\tCONSTRAINT ck_watchdog_workers_worker_id_length CHECK (CHAR_LENGTH(worker_id) BETWEEN 1 AND "
        "64), \n"
        "\tCONSTRAINT ck_watchdog_workers_host_length CHECK (CHAR_LENGTH(host) BETWEEN 1 AND 255), \n"
        "\tCONSTRAINT ck_watchdog_workers_pid_nonnegative CHECK (pid >= 0), \n"
        "\tCONSTRAINT ck_watchdog_workers_queues_length CHECK (CHAR_LENGTH(queues) BETWEEN 2 AND 65536), \n"
        "\tCONSTRAINT ck_watchdog_workers_concurrency_positive CHECK (concurrency >= 1), \n"
        "\tCONSTRAINT ck_watchdog_workers_wakeups_length CHECK (CHAR_LENGTH(wakeups) BETWEEN 1 AND 1000), "
        "\n\tCONSTRAINT ck_watchdog_workers_version_length CHECK (CHAR_LENGTH(version) BETWEEN 1 AND 64), \n\t"
        "CONSTRAINT ck_watchdog_workers_heartbeat_positive CHECK (heartbeat_ms > 0), \n"
        "\tCONSTRAINT ck_watchdog_workers_seen_after_start CHECK (last_seen >= started_at), \n"
        "\tCONSTRAINT ck_watchdog_workers_running_nonnegative CHECK (running >= 0), \n"
        "\tCONSTRAINT ck_watchdog_workers_claim_ahead_nonnegative CHECK (claim_ahead >= 0), \n"
        "\tCONSTRAINT ck_watchdog_workers_process_queues_length CHECK (CHAR_LENGTH(process_queues) "
        "BETWEEN 2 AND 65536)\n)"
    ),
    (
        "CREATE TABLE watchdog_schedules (\n"
        "\tname VARCHAR(201) COLLATE {collation} NOT NULL, \n"
        "\tfingerprint VARCHAR(65) COLLATE {collation} NOT NULL, \n"
        "\tcron TEXT NOT NULL, \n"
        "\ttimezone TEXT NOT NULL, \n"
        "\tqueue_name TEXT NOT NULL, \n"
        "\tnext_slot BIGINT, \n"
        "\tlast_enqueued BIGINT, \n"
        "\trecorded_by TEXT NOT NULL, \n"
        "\tlast_seen BIGINT NOT NULL, \n"
        "\tCONSTRAINT pk_watchdog_schedules PRIMARY KEY (name, fingerprint), \n"
        "\tCONSTRAINT ck_watchdog_schedules_name_length CHECK (CHAR_LENGTH(name) BETWEEN 1 AND 200), \n"
        "\tCONSTRAINT ck_watchdog_schedules_fingerprint_length CHECK (CHAR_LENGTH(fingerprint) BETWEEN 1 "
        "AND 64), \n"
        "\tCONSTRAINT ck_watchdog_schedules_cron_length CHECK (CHAR_LENGTH(cron) BETWEEN 1 AND 500), \n"
        "\tCONSTRAINT ck_watchdog_schedules_timezone_length CHECK (CHAR_LENGTH(timezone) BETWEEN 1 AND "
        "255), \n"
        "\tCONSTRAINT ck_watchdog_schedules_queue_name_length CHECK (CHAR_LENGTH(queue_name) BETWEEN 1 "
        "AND 256), \n"
        "\tCONSTRAINT ck_watchdog_schedules_recorded_by_length CHECK (CHAR_LENGTH(recorded_by) BETWEEN 1 "
        "AND 64)\n)"
    ),
    (
        "CREATE TABLE watchdog_limits (\n"
        "\tqueue_name VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\tconcurrency INTEGER, \n"
        "\tconcurrency_per_key INTEGER, \n"
        "\trate_count INTEGER, \n"
        "\trate_period_ms BIGINT, \n"
        "\trate_per_key_count INTEGER, \n"
        "\trate_per_key_period_ms BIGINT, \n"
        "\tcursor_key VARCHAR(257) COLLATE {collation}, \n"
        "\tupdated_at BIGINT NOT NULL, \n"
        "\tCONSTRAINT pk_watchdog_limits PRIMARY KEY (queue_name), \n"
        "\tCONSTRAINT ck_watchdog_limits_queue_name_length CHECK (CHAR_LENGTH(queue_name) BETWEEN 1 AND "
        "256), \n"
        "\tCONSTRAINT ck_watchdog_limits_concurrency_range CHECK (concurrency IS NULL OR concurrency "
        "BETWEEN 1 AND 1000000), \n"
        "\tCONSTRAINT ck_watchdog_limits_concurrency_per_key_range CHECK (concurrency_per_key IS NULL OR "
        "concurrency_per_key BETWEEN 1 AND 1000000), \n"
        "\tCONSTRAINT ck_watchdog_limits_rate_count_range CHECK (rate_count IS NULL OR rate_count BETWEEN "
        "1 AND 1000000), \n"
        "\tCONSTRAINT ck_watchdog_limits_rate_period_range CHECK (rate_period_ms IS NULL OR "
        "rate_period_ms BETWEEN 1 AND 86400000), \n"
        "\tCONSTRAINT ck_watchdog_limits_rate_complete CHECK ((rate_count IS NULL) = (rate_period_ms IS "
        "NULL)), \n"
        "\tCONSTRAINT ck_watchdog_limits_rate_per_key_count_range CHECK (rate_per_key_count IS NULL OR "
        "rate_per_key_count BETWEEN 1 AND 1000000), \n"
        "\tCONSTRAINT ck_watchdog_limits_rate_per_key_period_range CHECK (rate_per_key_period_ms IS NULL "
        "OR rate_per_key_period_ms BETWEEN 1 AND 86400000), \n"
        "\tCONSTRAINT ck_watchdog_limits_rate_per_key_complete CHECK ((rate_per_key_count IS NULL) = "
        "(rate_per_key_period_ms IS NULL)), \n"
        "\tCONSTRAINT ck_watchdog_limits_some_limit CHECK (concurrency IS NOT NULL OR concurrency_per_key "
        "IS NOT NULL OR rate_count IS NOT NULL OR rate_per_key_count IS NOT NULL), \n"
        "\tCONSTRAINT ck_watchdog_limits_cursor_key_length CHECK (cursor_key IS NULL OR "
        "CHAR_LENGTH(cursor_key) BETWEEN 1 AND 256)\n)"
    ),
    (
        "CREATE TABLE watchdog_limit_claims (\n"
        "\tid BIGINT NOT NULL AUTO_INCREMENT, \n"
        "\tqueue_name VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\tclaimed_at BIGINT NOT NULL, \n"
        "\tjobs INTEGER NOT NULL, \n"
        "\tlimit_key VARCHAR(257) COLLATE {collation}, \n"
        "\tCONSTRAINT pk_watchdog_limit_claims PRIMARY KEY (id), \n"
        "\tCONSTRAINT ck_watchdog_limit_claims_queue_name_length CHECK (CHAR_LENGTH(queue_name) BETWEEN 1 "
        "AND 256), \n"
        "\tCONSTRAINT ck_watchdog_limit_claims_jobs_positive CHECK (jobs >= 1), \n"
        "\tCONSTRAINT ck_watchdog_limit_claims_limit_key_length CHECK (limit_key IS NULL OR "
        "CHAR_LENGTH(limit_key) BETWEEN 1 AND 256)\n)"
    ),
    ("CREATE INDEX ix_watchdog_limit_claims_keyed ON watchdog_limit_claims (queue_name, limit_key, claimed_at)"),
    ("CREATE INDEX ix_watchdog_limit_claims_queue_name_claimed_at ON watchdog_limit_claims (queue_name, claimed_at)"),
    (
        "CREATE TABLE watchdog_unique_keys (\n"
        "\tunique_key VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\tjob_id VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\tkind TEXT NOT NULL, \n"
        "\tstates TEXT NOT NULL, \n"
        "\tsince_ms BIGINT NOT NULL, \n"
        "\tuntil_ms BIGINT NOT NULL, \n"
        "\tduplicates INTEGER NOT NULL DEFAULT 0, \n"
        "\treplacements INTEGER NOT NULL DEFAULT 0, \n"
        "\tCONSTRAINT pk_watchdog_unique_keys PRIMARY KEY (unique_key), \n"
        "\tCONSTRAINT ck_watchdog_unique_keys_unique_key_length CHECK (CHAR_LENGTH(unique_key) BETWEEN 1 "
        "AND 256), \n"
        "\tCONSTRAINT ck_watchdog_unique_keys_job_id_length CHECK (CHAR_LENGTH(job_id) BETWEEN 1 AND "
        "256), \n"
        "\tCONSTRAINT ck_watchdog_unique_keys_kind_known CHECK (kind IN ('unique_for', 'debounce', "
        "'throttle')), \n"
        "\tCONSTRAINT ck_watchdog_unique_keys_states_known CHECK (states IN ('waiting', 'unsettled', "
        "'any')), \n"
        "\tCONSTRAINT ck_watchdog_unique_keys_window_order CHECK (until_ms > since_ms), \n"
        "\tCONSTRAINT ck_watchdog_unique_keys_duplicates_nonnegative CHECK (duplicates >= 0), \n"
        "\tCONSTRAINT ck_watchdog_unique_keys_replacements_nonnegative CHECK (replacements >= 0)\n)"
    ),
    "CREATE INDEX ix_watchdog_unique_keys_job_id ON watchdog_unique_keys (job_id)",
    "CREATE INDEX ix_watchdog_unique_keys_until_ms ON watchdog_unique_keys (until_ms)",
    (
        "CREATE TABLE watchdog_job_steps (\n"
        "\tjob_sequence BIGINT NOT NULL, \n"
        "\tname VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\tjob_id VARCHAR(257) COLLATE {collation} NOT NULL, \n"
        "\tkind TEXT NOT NULL, \n"
        "\tresult_json TEXT, \n"
        "\twake_at BIGINT, \n"
        "\tattempt INTEGER NOT NULL, \n"
        "\trecorded_at BIGINT NOT NULL, \n"
        "\tCONSTRAINT pk_watchdog_job_steps PRIMARY KEY (job_sequence, name), \n"
        "\tCONSTRAINT ck_watchdog_job_steps_job_id_length CHECK (CHAR_LENGTH(job_id) BETWEEN 1 AND 256), \n"
        "\tCONSTRAINT ck_watchdog_job_steps_name_length CHECK (CHAR_LENGTH(name) BETWEEN 1 AND 256), \n"
        "\tCONSTRAINT ck_watchdog_job_steps_kind_known CHECK (kind IN ('step', 'sleep')), \n"
        "\tCONSTRAINT ck_watchdog_job_steps_sleep_has_wake_at CHECK ((kind = 'sleep') = (wake_at IS NOT "
        "NULL)), \n\tCONSTRAINT ck_watchdog_job_steps_attempt_positive CHECK (attempt >= 1)\n)"
    ),
    "SET @watchdog_sql_mode = @@SESSION.sql_mode",
    "SET SESSION sql_mode = CONCAT(@@SESSION.sql_mode, ',PIPES_AS_CONCAT')",
    (
        "CREATE TRIGGER watchdog_jobs_child_pruned AFTER DELETE ON watchdog_jobs FOR EACH ROW BEGIN IF "
        "OLD.after_policy IS NOT NULL THEN DELETE FROM watchdog_job_edges WHERE child = OLD.job_id; END "
        "IF; END"
    ),
    (
        "CREATE TRIGGER watchdog_job_edges_counted AFTER UPDATE ON watchdog_job_edges FOR EACH ROW BEGIN "
        "IF OLD.outcome IS NULL AND NEW.outcome IS NOT NULL THEN UPDATE watchdog_jobs SET\n"
        "    state = CASE\n"
        "        WHEN NEW.outcome <> 'completed' AND after_policy = 'completed' THEN 'settled'\n"
        "        WHEN waiting_on > 1 THEN 'waiting'\n"
        "        WHEN ready_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000) "
        "THEN 'delayed'\n"
        "        ELSE 'queued' END,\n"
        "    outcome = CASE WHEN NEW.outcome <> 'completed' AND after_policy = 'completed' THEN "
        "'cancelled' END,\n"
        "    failure_reason = CASE WHEN NEW.outcome <> 'completed' AND after_policy = 'completed'\n"
        "        THEN 'parent ' || NEW.parent || ' ended ' || NEW.outcome ELSE failure_reason END,\n"
        "    settled_at = CASE WHEN NEW.outcome <> 'completed' AND after_policy = 'completed' THEN "
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000) END,\n"
        "    waiting_on = CASE\n"
        "        WHEN NEW.outcome <> 'completed' AND after_policy = 'completed' THEN 0\n"
        "        WHEN waiting_on > 1 THEN waiting_on - 1 END\n"
        "WHERE job_id = NEW.child AND state = 'waiting'; END IF; END"
    ),
    "SET SESSION sql_mode = @watchdog_sql_mode",
)


def made_whole(bind: Any) -> bool:
    """Whether this revision made the schema of w0021 at once on ``bind``'s
    database (MariaDB and MySQL): then w0002 to w0021 change nothing there."""
    return bind.dialect.name in MYSQL_COLLATIONS


def _upgrade_whole(bind: Any) -> None:
    collation = MYSQL_COLLATIONS[bind.dialect.name]
    for statement in MYSQL_SCHEMA:
        # As the driver's own text: no bind parameters to parse (the triggers hold colons).
        bind.exec_driver_sql(statement.replace("{collation}", collation))


def _downgrade_whole(bind: Any) -> None:
    for trigger in MYSQL_TRIGGERS:
        bind.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trigger}")
    for table in MYSQL_TABLES:
        bind.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")


def upgrade() -> None:
    if made_whole(op.get_bind()):
        _upgrade_whole(op.get_bind())
        return
    op.create_table(
        "watchdog_jobs",
        sa.Column(
            "sequence",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("queue_name", sa.Text(), nullable=False),
        sa.Column("lane", sa.Text(), nullable=False),
        sa.Column("priority", sa.BigInteger(), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("recovery_max", sa.Integer(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("claim_token", sa.Text(), nullable=True),
        sa.Column("recovery_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("cancellation_id", sa.Text(), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("lease_until", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("sequence", name=op.f("pk_watchdog_jobs")),
        sa.UniqueConstraint("job_id", name=op.f("uq_watchdog_jobs_job_id")),
        sa.UniqueConstraint("cancellation_id", name=op.f("uq_watchdog_jobs_cancellation_id")),
        sa.CheckConstraint("length(job_id) BETWEEN 1 AND 256", name=op.f("ck_watchdog_jobs_job_id_length")),
        sa.CheckConstraint("length(queue_name) BETWEEN 1 AND 256", name=op.f("ck_watchdog_jobs_queue_name_length")),
        sa.CheckConstraint("length(lane) BETWEEN 1 AND 512", name=op.f("ck_watchdog_jobs_lane_length")),
        sa.CheckConstraint(
            "cancellation_id IS NULL OR length(cancellation_id) BETWEEN 1 AND 256",
            name=op.f("ck_watchdog_jobs_cancellation_id_length"),
        ),
        sa.CheckConstraint("state IN ('queued', 'running', 'settled')", name=op.f("ck_watchdog_jobs_state_known")),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('completed', 'failed', 'cancelled', 'outcome_unknown', 'interrupted')",
            name=op.f("ck_watchdog_jobs_outcome_known"),
        ),
        sa.CheckConstraint(
            "recovery_max IS NULL OR recovery_max >= 0",
            name=op.f("ck_watchdog_jobs_recovery_max_nonnegative"),
        ),
        sa.CheckConstraint("recovery_count >= 0", name=op.f("ck_watchdog_jobs_recovery_count_nonnegative")),
        sa.CheckConstraint(
            "(state = 'queued' AND outcome IS NULL AND claim_token IS NULL AND lease_until IS NULL)"
            " OR (state = 'running' AND outcome IS NULL AND claim_token IS NOT NULL"
            " AND lease_until IS NOT NULL)"
            " OR (state = 'settled' AND outcome IS NOT NULL AND lease_until IS NULL)",
            name=op.f("ck_watchdog_jobs_state_grammar"),
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(
        op.f("ix_watchdog_jobs_ready"),
        "watchdog_jobs",
        [sa.column("priority").desc(), "sequence"],
        **_partial("state = 'queued'"),
    )
    op.create_index(
        op.f("ix_watchdog_jobs_lease"),
        "watchdog_jobs",
        ["lease_until", "sequence"],
        **_partial("state = 'running'"),
    )
    op.create_index(
        op.f("ix_watchdog_jobs_live_lane"),
        "watchdog_jobs",
        ["lane", sa.column("state").desc(), "sequence"],
        **_partial(LIVE),
    )
    op.create_index(
        op.f("ix_watchdog_jobs_live_queue"),
        "watchdog_jobs",
        ["queue_name", "state", sa.column("priority").desc(), "sequence"],
        **_partial(LIVE),
    )

    if op.get_bind().dialect.name == "postgresql":
        # Wake idle runners when an INSERT into the table commits.
        op.execute(NOTIFY_FUNCTION_SQL)
        op.execute(NOTIFY_TRIGGER_SQL)


def downgrade() -> None:
    if made_whole(op.get_bind()):
        _downgrade_whole(op.get_bind())
        return
    op.drop_table("watchdog_jobs")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(DROP_NOTIFY_FUNCTION_SQL)
