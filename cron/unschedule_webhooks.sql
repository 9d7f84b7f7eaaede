-- Stop delivering webhooks from the database: removes the pg_cron job, the pg_net poke
-- trigger and the poke's schema sftq_cron made by schedule_webhooks.sql (and a poke an older
-- version left in sftq). Safe to run when they do not exist. Deliveries keep accumulating in
-- the outbox (nothing is lost) until a deliverer runs again, for example `sftq deliver`. The
-- Vault secret stays; delete it with:
-- DELETE FROM vault.secrets WHERE name = 'sftq_webhooks_url';
--
--   psql "$SUPABASE_DB_URL" -v ON_ERROR_STOP=1 -f cron/unschedule_webhooks.sql

BEGIN;
DROP TRIGGER IF EXISTS webhook_deliveries_poke ON sftq.webhook_deliveries;
DO $$ BEGIN
    IF to_regprocedure('sftq._webhook_poke()') IS NOT NULL THEN
        DROP FUNCTION sftq._webhook_poke();
    END IF;
    IF to_regnamespace('sftq_cron') IS NOT NULL THEN
        DROP FUNCTION IF EXISTS sftq_cron._webhook_poke();
        -- Only the poke belongs there; whatever else someone put in it is left alone.
        BEGIN
            DROP SCHEMA sftq_cron;
        EXCEPTION WHEN dependent_objects_still_exist THEN
            RAISE NOTICE 'schema sftq_cron is kept: it holds objects other than the poke';
        END;
    END IF;
END $$;
SELECT count(cron.unschedule(jobid)) AS jobs_removed FROM cron.job
 WHERE jobname = 'sftq-webhooks-deliver';
COMMIT;
