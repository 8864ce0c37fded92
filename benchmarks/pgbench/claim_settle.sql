-- The raw-SQL ceiling of a batched claim + settle on sqlalchemy_watchdog's own
-- table, indexes and triggers: what a hand-written worker that does nothing but
-- these two transactions reaches (benchmarks/scenarios/ceiling.py runs it with
-- pgbench). One pgbench transaction = claim :batch queued jobs of queue 'bench'
-- in claim order, each under its own token, leased on the database clock
-- (committed), then settle exactly those completed (committed) -- the two
-- commits a runner makes per batch, without Python, the driver or the
-- library's guards (the settle matches the token only).
\set token random(1, 2000000000)
BEGIN;
WITH picked AS MATERIALIZED (
    SELECT sequence FROM watchdog_jobs
    WHERE queue_name = 'bench' AND state = 'queued'
    ORDER BY priority DESC, sequence
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE watchdog_jobs AS j SET
        state = 'running',
        claim_token = :token || '.' || j.sequence,
        started_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
        lease_until = (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 60000
    FROM picked
    WHERE j.sequence = picked.sequence
    RETURNING j.sequence
)
SELECT quote_literal(coalesce(array_agg(sequence), '{}')) AS ids FROM claimed \gset
COMMIT;
BEGIN;
UPDATE watchdog_jobs SET
    state = 'settled',
    outcome = 'completed',
    lease_until = NULL,
    settled_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE sequence = ANY (:ids::bigint[]) AND claim_token = :token || '.' || sequence;
COMMIT;
