-- Privileges for the dashboard's routes (sql/procedures/150_dashboard.sql). Runs after
-- 010_roles.sql, which revokes everything first. The entry points are SECURITY DEFINER: the
-- API's login role calls them and reads nothing else.

GRANT EXECUTE ON FUNCTION
    sftq.api_public_queue(bytea, integer, interval, interval),
    sftq.api_job_payload(bytea, uuid),
    sftq.api_job_history(bytea, integer),
    sftq.api_gpu_history(bytea, text)
TO sftq_api;
