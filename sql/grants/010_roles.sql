-- Privileges, re-applied after procedures and views. Roles own nothing.
--   sftq_analyst: SELECT on the analyst views only.
--   sftq_api:     EXECUTE on the api_* entry points only (they are SECURITY DEFINER).

REVOKE ALL ON ALL TABLES IN SCHEMA sftq FROM PUBLIC, sftq_analyst, sftq_api;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA sftq FROM PUBLIC;
GRANT USAGE ON SCHEMA sftq TO sftq_analyst, sftq_api;

GRANT SELECT ON sftq.analyst_jobs, sftq.analyst_job_events, sftq.analyst_ticks,
                sftq.analyst_users, sftq.analyst_queue, sftq.analyst_daily TO sftq_analyst;
GRANT EXECUTE ON FUNCTION sftq.redact_secrets(jsonb), sftq._iso(timestamptz) TO sftq_analyst;

GRANT EXECUTE ON FUNCTION
    sftq.api_enqueue(bytea, text, jsonb, text, integer, text),
    sftq.api_list_jobs(bytea, text, text, integer, text),
    sftq.api_get_job(bytea, uuid),
    sftq.api_cancel_job(bytea, uuid),
    sftq.api_complete_cancel(bytea, uuid),
    sftq.api_queue_context(bytea),
    sftq.api_summary(bytea),
    sftq.api_job_analytics(bytea, uuid),
    sftq.api_health()
TO sftq_api;
