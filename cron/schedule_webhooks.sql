-- Deliver webhooks from Supabase: a pg_net "poke" right after every commit that wrote
-- deliveries, and a pg_cron job every 5 seconds that catches up (retries, a lost poke).
-- Both POST to the webhook-deliver function (functions/webhook_deliver.py), which claims
-- what is due, delivers it and records each attempt (docs/webhooks.md).
--
--   psql "$SUPABASE_DB_URL" -v ON_ERROR_STOP=1 \
--        -v deliver_url="https://<region>-<project>.cloudfunctions.net/webhook-deliver" \
--        -f cron/schedule_webhooks.sql
--
-- Optional: -v deliver_schedule='10 seconds' (any pg_cron schedule; default '5 seconds';
-- pg_cron 1.4 has no seconds: use '* * * * *' there), -v poke=off (no trigger: cron only).
-- Run it after cron/schedule_tick.sql: the function checks the tick's bearer secret, read
-- here from the Vault secret sftq_tick_secret that script stores (one secret to rotate).
-- Running it again replaces the job, the trigger and the URL. Needs pg_cron, pg_net and
-- supabase_vault in this database. Remove everything with cron/unschedule_webhooks.sql.
--
-- Latency: the poke is queued in the committing transaction and pg_net sends it right after
-- the commit, so a delivery usually starts within a second (pg_net's worker loop plus a
-- warm function); the cron job bounds the worst case at its interval. Retries are due at
-- their scheduled time and picked up by the next cron run (up to 5 s late).

\set ON_ERROR_STOP on
\if :{?deliver_schedule}
\else
\set deliver_schedule '5 seconds'
\endif
\if :{?poke}
\else
\set poke on
\endif
\if :{?deliver_url}
\else
DO $$ BEGIN RAISE EXCEPTION 'psql variable deliver_url is not set'
    USING HINT = 'psql ... -v deliver_url=https://<host>/webhook-deliver'; END $$;
\endif

BEGIN;
SELECT set_config('sftq_cron.deliver_url', :'deliver_url', true) IS NOT NULL AS url \gset sftq_cron_
DO $$
DECLARE
    v_url  text := current_setting('sftq_cron.deliver_url');
    v_id   uuid;
BEGIN
    IF v_url !~ '^https?://[^[:space:]]+$' THEN
        RAISE EXCEPTION 'deliver_url must be an http(s) URL';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM vault.secrets WHERE name = 'sftq_tick_secret') THEN
        RAISE EXCEPTION 'the Vault secret sftq_tick_secret is missing'
            USING HINT = 'run cron/schedule_tick.sql first: the delivery function checks the same bearer secret';
    END IF;
    SELECT id INTO v_id FROM vault.secrets WHERE name = 'sftq_webhooks_url';
    IF v_id IS NULL THEN
        PERFORM vault.create_secret(v_url, 'sftq_webhooks_url',
                                    'finetune-queue: URL of the webhook-deliver function');
    ELSE
        PERFORM vault.update_secret(v_id, v_url);
    END IF;
END
$$;
SELECT set_config('sftq_cron.deliver_url', '', true) IS NOT NULL AS url \gset sftq_cron_

-- Fires only when something is due (one probe of the due index), so an idle queue costs no
-- function invocations.
SELECT cron.schedule(
    'sftq-webhooks-deliver',
    :'deliver_schedule',
    $cmd$
    SELECT net.http_post(
        url := (SELECT decrypted_secret FROM vault.decrypted_secrets WHERE name = 'sftq_webhooks_url'),
        headers := jsonb_build_object(
            'Content-Type', 'application/json',
            'Authorization', 'Bearer ' || (SELECT decrypted_secret FROM vault.decrypted_secrets
                                           WHERE name = 'sftq_tick_secret')),
        body := '{}'::jsonb,
        timeout_milliseconds := 25000
    ) AS request_id
    WHERE EXISTS (SELECT 1 FROM sftq.webhook_deliveries
                   WHERE state = 'pending' AND next_attempt_at <= now())
    $cmd$
) AS jobid \gset sftq_cron_

CREATE OR REPLACE FUNCTION sftq._webhook_poke()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_url  text;
BEGIN
    -- Once per transaction: an event written for three endpoints sends one request.
    IF current_setting('sftq.webhook_poked', true) = 'yes' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('sftq.webhook_poked', 'yes', true);
    -- A poke that cannot be sent must never fail the job transition that wrote the
    -- delivery: the cron job delivers it a few seconds later anyway.
    BEGIN
        SELECT decrypted_secret INTO v_url FROM vault.decrypted_secrets
         WHERE name = 'sftq_webhooks_url';
        IF v_url IS NOT NULL THEN
            PERFORM net.http_post(
                url := v_url,
                headers := jsonb_build_object(
                    'Content-Type', 'application/json',
                    'Authorization', 'Bearer ' || (SELECT decrypted_secret FROM vault.decrypted_secrets
                                                   WHERE name = 'sftq_tick_secret')),
                body := '{}'::jsonb,
                timeout_milliseconds := 25000);
        END IF;
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'sftq: webhook poke not sent (%); the cron job will deliver', SQLERRM;
    END;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._webhook_poke() IS
    'AFTER INSERT (statement) trigger on sftq.webhook_deliveries, installed by cron/schedule_webhooks.sql: queues one pg_net POST to the webhook-deliver function per transaction, sent by pg_net after the commit. Never fails the transaction. Locking contract: none.';
REVOKE ALL ON FUNCTION sftq._webhook_poke() FROM PUBLIC;

\if :poke
CREATE OR REPLACE TRIGGER webhook_deliveries_poke
    AFTER INSERT ON sftq.webhook_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION sftq._webhook_poke();
\else
DROP TRIGGER IF EXISTS webhook_deliveries_poke ON sftq.webhook_deliveries;
\endif
COMMIT;
\echo 'scheduled sftq-webhooks-deliver:' :'deliver_schedule' '(poke after commit:' :'poke' ')'
