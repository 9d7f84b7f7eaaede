-- Stop delivering webhooks from the database: removes the pg_cron job and the pg_net poke
-- trigger made by schedule_webhooks.sql. Safe to run when they do not exist. Deliveries keep
-- accumulating in the outbox (nothing is lost) until a deliverer runs again, for example
-- `sftq deliver`. The Vault secret stays; delete it with:
-- DELETE FROM vault.secrets WHERE name = 'sftq_webhooks_url';
--
--   psql "$SUPABASE_DB_URL" -v ON_ERROR_STOP=1 -f cron/unschedule_webhooks.sql

BEGIN;
DROP TRIGGER IF EXISTS webhook_deliveries_poke ON sftq.webhook_deliveries;
DROP FUNCTION IF EXISTS sftq._webhook_poke();
SELECT count(cron.unschedule(jobid)) AS jobs_removed FROM cron.job
 WHERE jobname = 'sftq-webhooks-deliver';
COMMIT;
