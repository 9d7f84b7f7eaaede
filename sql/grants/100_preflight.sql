-- Privileges for the pre-flight against Fireworks' resources (sql/procedures/180_preflight.sql).
-- Re-applied after 010_roles.sql, which revokes first.

GRANT EXECUTE ON FUNCTION
    sftq.api_record_preflight(bytea, uuid, text, jsonb, jsonb)
TO sftq_api;

GRANT EXECUTE ON FUNCTION
    sftq.preflight_work(integer, interval, timestamptz),
    sftq.record_preflight(uuid, text, jsonb, jsonb, timestamptz),
    sftq.fail_preflight(uuid, jsonb, text, jsonb, timestamptz),
    sftq.provider_backoff_until(timestamptz)
TO sftq_scheduler;
