-- Privileges, re-applied after procedures and views. Roles own nothing.
--   sftq_analyst: SELECT on the analyst views only.
--   sftq_api:     EXECUTE on the api_* entry points only (they are SECURITY DEFINER).
--   sftq_scheduler: the tick's procedures, and the table rights they use (they run as the
--                 caller); it cannot read key hashes.

REVOKE ALL ON ALL TABLES IN SCHEMA sftq FROM PUBLIC, sftq_analyst, sftq_api, sftq_scheduler;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA sftq FROM PUBLIC;
GRANT USAGE ON SCHEMA sftq TO sftq_analyst, sftq_api, sftq_scheduler;

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

GRANT SELECT, UPDATE ON sftq.jobs, sftq.users, sftq.scheduler_lease TO sftq_scheduler;
GRANT SELECT, INSERT, UPDATE ON sftq.job_events, sftq.scheduler_ticks TO sftq_scheduler;
GRANT EXECUTE ON FUNCTION
    sftq._gate(boolean), sftq._iso(timestamptz), sftq.is_legal_transition(text, text),
    sftq._jobs_guard(),
    sftq._event(uuid, timestamptz, text, text, text, jsonb, text, text),
    sftq._transition(uuid, text, timestamptz, text, text, jsonb, text),
    sftq._admit(integer, timestamptz, jsonb),
    sftq.admit(integer, timestamptz),
    sftq.admission_budget(integer, numeric, interval, timestamptz),
    sftq.admit_for_quota(integer, numeric, interval, timestamptz),
    sftq.preview_admission(integer, integer, timestamptz),
    sftq.scheduler_work(),
    sftq.record_submitted(uuid, text, text, boolean, timestamptz),
    sftq.record_submit_error(uuid, text, boolean, timestamptz),
    sftq.record_provider_state(uuid, text, text, timestamptz),
    sftq.complete_cancel(uuid, text, jsonb, timestamptz),
    sftq.provider_job_id(uuid),
    sftq.tick_begin(text, interval, timestamptz),
    sftq.tick_renew(bigint, interval),
    sftq.tick_finish(bigint, jsonb, timestamptz)
TO sftq_scheduler;
