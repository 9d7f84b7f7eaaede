-- Deliver webhooks from Supabase: a pg_net "poke" right after every commit that wrote
-- deliveries, and a pg_cron job every 5 seconds that catches up (retries, a lost poke).
-- Both POST to the webhook-deliver function (functions/webhook_deliver.py), which claims
-- what is due, delivers it and records each attempt (docs/webhooks.md).
--
--   printf %s "$SFTQ_TICK_SECRET" | psql "$SUPABASE_DB_URL" -v ON_ERROR_STOP=1 \
--        -v deliver_url="$SUPABASE_URL/functions/v1/webhook-deliver" \
--        -f cron/schedule_webhooks.sql
--
-- Optional: -v deliver_schedule='10 seconds' (any pg_cron schedule; default '5 seconds';
-- pg_cron 1.4 has no seconds: use '* * * * *' there), -v poke=off (no trigger: cron only).
--
-- webhook-deliver checks the same secret as scheduler-tick (SFTQ_TICK_SECRET), the same
-- way: this script takes it on standard input and stores it in Vault as sftq_tick_secret,
-- the entry schedule_tick.sql keeps (one secret to rotate), beside the URL
-- (sftq_webhooks_url). Neither the job nor the poke ever sends the secret: each request
-- carries a token minted from it when the request is queued,
--   Authorization: Bearer v1.<unix seconds>.<hex HMAC-SHA256 of the seconds, keyed by the secret>
-- which the function accepts for two minutes (_tick_secrets.sql). The script also closes
-- pg_net's schema to every role but the one running it (_net_private.sql), as the tick's
-- does; run it as the same role as schedule_tick.sql, then cron/check_net_private.sql.
-- Running it again replaces the job, the trigger, the URL and the secret. Needs pg_cron,
-- pg_net, supabase_vault and pgcrypto in this database. Remove the job and the trigger with
-- cron/unschedule_webhooks.sql.
--
-- The poke's function lives in schema sftq_cron, which this script creates and which
-- belongs to the role running it (the jobs' owner), not in sftq. The poke must run as a role
-- that can read Vault and call pg_net, and after _net_private.sql only the jobs' owner can.
-- Every SECURITY DEFINER function of sftq is handed to sftq_definer on each migrate
-- (sql/grants/090_security.sql), a role that must never reach pg_net: a poke kept in sftq
-- would stop working after the next migrate. Nobody else gets any right on sftq_cron: a
-- trigger needs none from the writers that fire it. An older version of this script kept
-- the poke in sftq as sftq._webhook_poke(); running this one moves it.
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
    USING HINT = 'psql ... -v deliver_url=https://<project-ref>.supabase.co/functions/v1/webhook-deliver'; END $$;
\endif
DO $$ BEGIN
    IF to_regclass('sftq.webhook_deliveries') IS NULL THEN
        RAISE EXCEPTION 'sftq.webhook_deliveries does not exist in this database'
            USING HINT = 'migrate it first (infra/deploy.sh db, or sftq db migrate)';
    END IF;
END $$;
\set sftq_cron_url :deliver_url
\set sftq_cron_url_secret sftq_webhooks_url
\set sftq_cron_url_description 'finetune-queue: URL of the webhook-deliver function'

BEGIN;
\ir _tick_secrets.sql
\ir _net_private.sql

-- Fires only when something is due (one probe of the due index), so an idle queue costs no
-- function invocations.
SELECT cron.schedule(
    'sftq-webhooks-deliver',
    :'deliver_schedule',
    :'sftq_cron_command' || $where$
     WHERE EXISTS (SELECT 1 FROM sftq.webhook_deliveries
                    WHERE state = 'pending' AND next_attempt_at <= now())$where$
) AS jobid \gset sftq_cron_

-- The poke's schema: the cron wiring's own, this role's, closed to everyone else.
DO $$ BEGIN
    IF to_regnamespace('sftq_cron') IS NULL THEN
        CREATE SCHEMA sftq_cron;
    ELSIF (SELECT nspowner FROM pg_namespace WHERE nspname = 'sftq_cron')
          <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'schema sftq_cron belongs to %, not to %, who runs this script',
                        (SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'sftq_cron'),
                        current_user
            USING HINT = 'Run the cron scripts as the role that owns the jobs (postgres on Supabase), or hand the schema over: ALTER SCHEMA sftq_cron OWNER TO <that role>.';
    END IF;
END $$;
COMMENT ON SCHEMA sftq_cron IS
    'finetune-queue''s cron wiring (cron/schedule_webhooks.sql): the webhook poke, owned by the pg_cron jobs'' owner, which alone may use pg_net. Not touched by sftq db migrate; nothing here for other roles.';

-- The poke mints its token the way the job does (the expression from _tick_secrets.sql,
-- which names pgcrypto's schema), so the function is written out here and run with \gexec.
SELECT format($def$
CREATE OR REPLACE FUNCTION sftq_cron._webhook_poke()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $body$
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
                    'Authorization', %s),
                body := '{}'::jsonb,
                timeout_milliseconds := 25000);
        END IF;
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'sftq: webhook poke not sent (%%); the cron job will deliver', SQLERRM;
    END;
    RETURN NULL;
END
$body$
$def$, :'sftq_cron_authorization') \gexec
COMMENT ON FUNCTION sftq_cron._webhook_poke() IS
    'AFTER INSERT (statement) trigger on sftq.webhook_deliveries, installed by cron/schedule_webhooks.sql: queues one pg_net POST to the webhook-deliver function per transaction, with a two-minute token minted from Vault (never the secret), sent by pg_net after the commit. Runs as the pg_cron jobs'' owner (SECURITY DEFINER, fixed search_path, no arguments). Never fails the transaction. Locking contract: none.';
-- Nothing for anyone but this role, whatever was granted before: firing a trigger needs no
-- right on its function, and with USAGE and EXECUTE a role could hang the poke on a table
-- of its own.
REVOKE ALL ON FUNCTION sftq_cron._webhook_poke() FROM PUBLIC;
DO $$
DECLARE
    v_sql  text;
BEGIN
    FOR v_sql IN
        SELECT format('REVOKE ALL ON SCHEMA sftq_cron FROM %s', g.name)
          FROM (SELECT DISTINCT CASE a.grantee WHEN 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS name
                  FROM pg_namespace n, aclexplode(n.nspacl) a
                 WHERE n.nspname = 'sftq_cron' AND a.grantee <> n.nspowner) g
        UNION ALL
        SELECT format('REVOKE ALL ON FUNCTION sftq_cron._webhook_poke() FROM %s', g.name)
          FROM (SELECT DISTINCT quote_ident(pg_get_userbyid(a.grantee)) AS name
                  FROM pg_proc p, aclexplode(p.proacl) a
                 WHERE p.oid = 'sftq_cron._webhook_poke()'::regprocedure
                   AND a.grantee NOT IN (0, p.proowner)) g
    LOOP
        EXECUTE v_sql;
    END LOOP;
END $$;

\if :poke
CREATE OR REPLACE TRIGGER webhook_deliveries_poke
    AFTER INSERT ON sftq.webhook_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION sftq_cron._webhook_poke();
\else
DROP TRIGGER IF EXISTS webhook_deliveries_poke ON sftq.webhook_deliveries;
\endif
-- The poke an older version of this script kept in sftq: the trigger no longer uses it.
DO $$ BEGIN
    IF to_regprocedure('sftq._webhook_poke()') IS NOT NULL THEN
        DROP FUNCTION sftq._webhook_poke();
        RAISE NOTICE 'the webhook poke moved from schema sftq to sftq_cron';
    END IF;
END $$;
COMMIT;
\echo 'scheduled sftq-webhooks-deliver:' :'deliver_schedule' '(poke after commit:' :'poke' ')'
