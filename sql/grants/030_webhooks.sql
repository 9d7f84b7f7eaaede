-- Webhooks' privileges, applied after 010_roles.sql (which revokes first).
--   sftq_api:       the api_webhook_* entry points (SECURITY DEFINER), nothing else.
--   sftq_scheduler: the deliverers' three procedures (SECURITY DEFINER): the delivery
--                   function runs with the scheduler's connection.
--   sftq_analyst:   nothing. The webhook tables hold users' URLs (which may carry tokens)
--                   and sealed signing secrets; no analyst view shows them.
-- The outbox trigger runs as its owner (SECURITY DEFINER), so the roles that write job
-- events need no rights on the webhook tables.

REVOKE ALL ON sftq.webhook_endpoints, sftq.webhook_deliveries, sftq.webhook_attempts
    FROM PUBLIC, sftq_analyst, sftq_api, sftq_scheduler;
REVOKE ALL ON FUNCTION
    sftq._webhook_outbox(),
    sftq.webhook_create(bigint, uuid, text, text[], text, text, timestamptz),
    sftq.webhook_get(bigint, uuid),
    sftq.webhook_delete(bigint, uuid),
    sftq.webhook_send_test(bigint, uuid, timestamptz),
    sftq._webhook_disable(uuid, text, timestamptz),
    sftq.webhook_claim(integer, integer, interval, timestamptz),
    sftq.webhook_record_attempt(bigint, uuid, integer, text, integer, timestamptz, timestamptz),
    sftq.webhook_prune(timestamptz, integer),
    sftq.webhook_deliveries_json(uuid, integer)
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    sftq.api_webhook_precheck(bytea),
    sftq.api_webhook_create(bytea, uuid, text, text[], text, text),
    sftq.api_webhook_list(bytea),
    sftq.api_webhook_get(bytea, uuid),
    sftq.api_webhook_delete(bytea, uuid),
    sftq.api_webhook_test(bytea, uuid),
    sftq.api_webhook_deliveries(bytea, uuid, integer)
TO sftq_api;

GRANT EXECUTE ON FUNCTION
    sftq.webhook_claim(integer, integer, interval, timestamptz),
    sftq.webhook_record_attempt(bigint, uuid, integer, text, integer, timestamptz, timestamptz),
    sftq.webhook_prune(timestamptz, integer)
TO sftq_scheduler;
