-- Privileges for pipelines and run limits (sql/procedures/200_pipelines.sql,
-- 205_run_limits.sql). Re-applied after 010_roles.sql, which revokes first.

GRANT EXECUTE ON FUNCTION
    sftq.api_submit_job(bytea, text, jsonb, text, integer, text, integer, integer, text[], integer)
TO sftq_api;

-- The tick runs as itself: a job it ends moves the jobs that run after it on (the state
-- machine's hooks), and it sweeps the running jobs for their run limits.
GRANT SELECT ON sftq.job_dependencies TO sftq_scheduler;
GRANT EXECUTE ON FUNCTION
    sftq._pipeline_lock_dependents(uuid),
    sftq._pipeline_dependency_ended(sftq.jobs, timestamptz),
    sftq._pipeline_reset_head(bigint),
    sftq._first_unmet(uuid[]),
    sftq._cancel_reason_detail(sftq.jobs, jsonb),
    sftq._cancel_reason_error(sftq.jobs),
    sftq.progress_since(sftq.jobs),
    sftq.is_stalled(sftq.jobs),
    sftq.run_limits(integer, integer, timestamptz, integer),
    sftq.stalled_jobs()
TO sftq_scheduler;
