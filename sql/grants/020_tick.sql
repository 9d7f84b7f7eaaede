-- Privileges for what the tick's issues added (retry, queue timeout, bounded submission,
-- provider progress, the usage reading, the room check before a retried create).
-- Re-applied after 010_roles.sql, which revokes first.

GRANT EXECUTE ON FUNCTION
    sftq.api_submit(bytea, text, jsonb, text, integer, text, integer, integer),
    sftq.api_retry_job(bytea, uuid, text, integer)
TO sftq_api;

GRANT EXECUTE ON FUNCTION
    sftq.normalize_provider_state(text),
    sftq.map_provider_state(text),
    sftq.failure_class_for(text, text, text),
    sftq._jobs_failure_class(),
    sftq.record_submit_failure(uuid, text, boolean, integer, double precision, double precision,
                               timestamptz),
    sftq.record_submit_skipped(uuid, text, timestamptz),
    sftq.give_up_submission(uuid, timestamptz),
    sftq.observe_provider_job(uuid, jsonb, timestamptz),
    sftq.record_usage_reading(numeric, numeric, interval, timestamptz),
    sftq.creates_that_fit(integer, numeric, interval, timestamptz),
    sftq.provider_health(),
    sftq.expire_queued(timestamptz, integer)
TO sftq_scheduler;
