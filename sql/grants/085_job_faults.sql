-- Privileges for per-job fault isolation (sql/procedures/185_job_faults.sql): the tick's
-- only. Re-applied after 010_roles.sql, which revokes first, and before 090_security.sql,
-- which gives each role that holds a right on a table the row-level security policy it
-- needs: a table right granted after it would meet RLS with no policy (every row refused).

GRANT SELECT, INSERT, UPDATE, DELETE ON sftq.job_faults TO sftq_scheduler;

GRANT EXECUTE ON FUNCTION
    sftq.record_job_fault(uuid, bigint, text, text, text, integer, timestamptz),
    sftq.faulted_jobs(),
    sftq.clear_job_faults(uuid[])
TO sftq_scheduler;
