-- 0023: pipelines of jobs (POST /jobs "after") and a bound on run time ("max_run_seconds",
-- stalled jobs) (issue 53, items 3 and 4). sql/procedures/200_pipelines.sql and
-- 205_run_limits.sql use them; docs/scheduling.md says how.
--
-- Every new column is NULL for a job that uses none of this, so a plain enqueue writes
-- nothing more than it did (adding a nullable column rewrites no row).

ALTER TABLE sftq.jobs
    ADD COLUMN after uuid[],
    ADD COLUMN waiting_on uuid,
    ADD COLUMN max_run_seconds integer CHECK (max_run_seconds BETWEEN 60 AND 2592000),
    ADD COLUMN cancel_reason text,
    ADD COLUMN progress_moved_at timestamptz,
    ADD COLUMN stalled_at timestamptz;
COMMENT ON COLUMN sftq.jobs.after IS
    'The jobs (the same owner''s, full ids, in the order given) that must all be SUCCESS before this one may be admitted (POST /jobs "after"); NULL for none.';
COMMENT ON COLUMN sftq.jobs.waiting_on IS
    'While QUEUED: the first job of "after" that is not SUCCESS yet, or NULL when every dependency is met. A job with waiting_on set is never its owner''s head (users.head_job_id), so admission never sees it and it blocks nobody.';
COMMENT ON COLUMN sftq.jobs.max_run_seconds IS
    'The caller''s bound on how long the job may run at the provider (from its submission); past it the tick stops it (cancel_reason run_timeout). NULL: the deployment''s SFTQ_MAX_RUN_SECONDS, if set.';
COMMENT ON COLUMN sftq.jobs.cancel_reason IS
    'Why a cancel was recorded by the queue itself rather than by the owner (run_timeout); NULL for a user''s cancel. The error the job ends with says so.';
COMMENT ON COLUMN sftq.jobs.progress_moved_at IS
    'When the provider''s progress of this job (jobProgress percent or epoch) last changed, as sftq.observe_provider_job saw it; NULL before the first.';
COMMENT ON COLUMN sftq.jobs.stalled_at IS
    'When the tick found the job''s provider progress unmoved for SFTQ_STALL_SECONDS and wrote its stalled event (once: never cleared). The job is stalled while it is PROGRESS and its progress has not moved since.';

-- The edges, for finding a job's dependents when it ends (one index probe per terminal
-- transition; the table holds a row per dependency only).
CREATE TABLE sftq.job_dependencies (
    job_id    uuid NOT NULL REFERENCES sftq.jobs (id),
    after_id  uuid NOT NULL REFERENCES sftq.jobs (id),
    PRIMARY KEY (job_id, after_id),
    CHECK (job_id <> after_id)
);
CREATE INDEX job_dependencies_after_idx ON sftq.job_dependencies (after_id);
COMMENT ON TABLE sftq.job_dependencies IS
    'One row per (job, a job it runs after): jobs.after as rows, indexed by the dependency so that its end finds its dependents.';

-- The tick's run-limit sweep reads the running jobs only (jobs_progress_idx covers them).
