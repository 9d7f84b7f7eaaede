-- Privileges for the deployment's provider budget (sql/procedures/190_provider_budget.sql).
-- jobs-api (pre-flight, validate, cancels) and the tick both draw on it. The functions are
-- SECURITY DEFINER (owned by sftq_definer, 090_security.sql): neither role gets rights on
-- the tables. (sftq.provider_backoff_until, granted to the tick in 100_preflight.sql, now
-- reads the shared hold as well.)
-- Re-applied after 010_roles.sql, which revokes first.

GRANT EXECUTE ON FUNCTION
    sftq.provider_budget_take(text, text, bytea, integer, float8, float8, jsonb, jsonb, integer,
                              timestamptz),
    sftq.provider_budget_hold(float8, jsonb, jsonb, timestamptz),
    sftq.provider_budget_flush(jsonb, jsonb, timestamptz),
    sftq.provider_lookups_get(text[], float8, timestamptz)
TO sftq_api, sftq_scheduler;

GRANT EXECUTE ON FUNCTION sftq.provider_budget_usage(integer, timestamptz) TO sftq_scheduler;
