-- Included (\ir) by schedule_tick.sql, schedule_tick_pgcron14.sql and schedule_webhooks.sql,
-- inside their transaction; not run on its own. The including script sets three psql
-- variables first:
--   sftq_cron_url              the URL its job POSTs to (from -v tick_url / -v deliver_url)
--   sftq_cron_url_secret       the Vault name that URL is kept under
--   sftq_cron_url_description  that Vault entry's description
--
-- Stores the URL and the tick secret (read from psql's standard input) in Supabase Vault,
-- the secret as sftq_tick_secret (one secret for every cron-fired function: the tick and
-- webhook-deliver check the same one), created the first time and updated after. Then
-- builds, for the including script:
--   :sftq_cron_authorization  an SQL expression: 'Bearer ' || a fresh short-lived token
--   :sftq_cron_command        the job's command: a pg_net POST to the URL, with that header
--
-- The secret never appears in statement text or on a command line: it travels in COPY
-- data, which no log_statement or log_min_duration_statement setting records (a bound
-- parameter would be: log_statement=all logs "parameters: $1 = '...'"), and it reaches
-- Vault from a temporary table that is dropped at commit.
--
-- What is sent is not the secret but a token that the functions accept for two minutes:
--   Authorization: Bearer v1.<unix seconds>.<hex HMAC-SHA256 of the seconds, keyed by the secret>
-- minted from Vault each time a request is queued, so what waits in pg_net's request queue
-- is worth nothing for long. HMAC comes from pgcrypto, found wherever it is installed
-- (Supabase: schema extensions).

\if :{?tick_secret}
DO $$ BEGIN RAISE EXCEPTION 'the tick secret is not taken as a psql variable (it would sit on the command line)'
    USING HINT = 'pipe it on standard input: printf %s "$SFTQ_TICK_SECRET" | psql ... -f cron/<script>.sql'; END $$;
\endif

CREATE TEMPORARY TABLE _sftq_cron_input (value text) ON COMMIT DROP;
-- CSV with a delimiter and a quote character no secret contains: the line is taken as is.
\copy _sftq_cron_input (value) FROM pstdin WITH (FORMAT csv, DELIMITER E'\x01', QUOTE E'\x02')

-- psql variables are not expanded inside a DO block, so hand them over through
-- transaction-local settings (gone at commit); \gset keeps them off the screen.
SELECT set_config('sftq_cron.url', :'sftq_cron_url', true) IS NOT NULL AS url,
       set_config('sftq_cron.url_secret', :'sftq_cron_url_secret', true) IS NOT NULL AS name,
       set_config('sftq_cron.url_description', :'sftq_cron_url_description', true) IS NOT NULL
           AS description
\gset sftq_cron_set_
DO $$
DECLARE
    v_url     text := current_setting('sftq_cron.url');
    v_secret  text;
    v_item    record;
    v_id      uuid;
BEGIN
    IF (SELECT count(*) FROM _sftq_cron_input) <> 1 THEN
        RAISE EXCEPTION 'the tick secret is not set: expected it alone on standard input'
            USING HINT = 'printf %s "$SFTQ_TICK_SECRET" | psql ... -f cron/<script>.sql';
    END IF;
    SELECT value INTO v_secret FROM _sftq_cron_input;
    IF v_url !~ '^https?://[^[:space:]]+$' THEN
        RAISE EXCEPTION '% must be an http(s) URL',
            CASE current_setting('sftq_cron.url_secret') WHEN 'sftq_tick_url' THEN 'tick_url'
                 ELSE 'deliver_url' END;
    END IF;
    IF v_secret IS NULL THEN
        RAISE EXCEPTION 'the tick secret is not set: expected it alone on standard input';
    END IF;
    IF length(v_secret) < 32 THEN
        RAISE EXCEPTION 'the tick secret must be at least 32 characters (scheduler-tick and webhook-deliver refuse shorter ones)'
            USING HINT = 'generate one with: openssl rand -hex 32';
    END IF;
    FOR v_item IN
        SELECT * FROM (VALUES
            (current_setting('sftq_cron.url_secret'), v_url,
             current_setting('sftq_cron.url_description')),
            ('sftq_tick_secret', v_secret,
             'finetune-queue: key of the tokens of scheduler-tick and webhook-deliver (SFTQ_TICK_SECRET)')
        ) AS s(name, value, description)
    LOOP
        SELECT id INTO v_id FROM vault.secrets WHERE name = v_item.name;
        IF v_id IS NULL THEN
            PERFORM vault.create_secret(v_item.value, v_item.name, v_item.description);
        ELSE
            PERFORM vault.update_secret(v_id, v_item.value);
        END IF;
    END LOOP;
END
$$;
SELECT set_config('sftq_cron.url', '', true) IS NOT NULL AS url
\gset sftq_cron_set_

-- The header's value, as an expression evaluated when a request is queued. Nothing in it
-- is secret: it names the Vault entry and pgcrypto's schema.
SELECT CASE WHEN p.nspname IS NOT NULL THEN format(
    $expr$(SELECT 'Bearer v1.' || t.seconds || '.'
                   || encode(%1$I.hmac(t.seconds, s.decrypted_secret, 'sha256'), 'hex')
              FROM vault.decrypted_secrets s,
                   (SELECT floor(extract(epoch FROM clock_timestamp()))::bigint::text
                           AS seconds) t
             WHERE s.name = 'sftq_tick_secret')$expr$, p.nspname) END AS authorization
  FROM (SELECT (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
                 WHERE e.extname = 'pgcrypto') AS nspname) p
\gset sftq_cron_
\if :{?sftq_cron_authorization}
\else
DO $$ BEGIN RAISE EXCEPTION 'pgcrypto is not installed in this database (the jobs sign their tokens with hmac())'
    USING HINT = 'CREATE EXTENSION pgcrypto; (on Supabase it is installed in schema extensions)'; END $$;
\endif

SELECT format(
    $cmd$SELECT net.http_post(
        url := (SELECT decrypted_secret FROM vault.decrypted_secrets WHERE name = %1$L),
        headers := jsonb_build_object(
            'Content-Type', 'application/json',
            'Authorization', %2$s),
        body := '{}'::jsonb,
        timeout_milliseconds := 25000
    ) AS request_id$cmd$, :'sftq_cron_url_secret', :'sftq_cron_authorization') AS command
\gset sftq_cron_
