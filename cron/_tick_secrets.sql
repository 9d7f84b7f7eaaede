-- Included (\ir) by schedule_tick.sql and schedule_tick_pgcron14.sql, inside their
-- transaction; not run on its own.
--
-- Stores the tick URL (psql variable tick_url) and the tick secret (read from psql's
-- standard input) in Supabase Vault as sftq_tick_url and sftq_tick_secret, created the
-- first time and updated after. Then builds the job's command into :sftq_cron_command.
--
-- The secret never appears in statement text or on a command line: it travels in COPY
-- data, which no log_statement or log_min_duration_statement setting records (a bound
-- parameter would be: log_statement=all logs "parameters: $1 = '...'"), and it reaches
-- Vault from a temporary table that is dropped at commit.
--
-- The command the job runs reads both from Vault each time it fires, and sends not the
-- secret but a token that scheduler-tick accepts for two minutes:
--   Authorization: Bearer v1.<unix seconds>.<hex HMAC-SHA256 of the seconds, keyed by the secret>
-- so what waits in pg_net's request queue is worth nothing for long. HMAC comes from
-- pgcrypto, found wherever it is installed (Supabase: schema extensions).

\if :{?tick_url}
\else
DO $$ BEGIN RAISE EXCEPTION 'psql variable tick_url is not set'
    USING HINT = 'psql ... -v tick_url=https://<project-ref>.supabase.co/functions/v1/scheduler-tick'; END $$;
\endif
\if :{?tick_secret}
DO $$ BEGIN RAISE EXCEPTION 'the tick secret is not taken as a psql variable (it would sit on the command line)'
    USING HINT = 'pipe it on standard input: printf %s "$SFTQ_TICK_SECRET" | psql ... -f cron/schedule_tick.sql'; END $$;
\endif

CREATE TEMPORARY TABLE _sftq_cron_input (value text) ON COMMIT DROP;
-- CSV with a delimiter and a quote character no secret contains: the line is taken as is.
\copy _sftq_cron_input (value) FROM pstdin WITH (FORMAT csv, DELIMITER E'\x01', QUOTE E'\x02')

-- psql variables are not expanded inside a DO block, so hand the URL over through a
-- transaction-local setting (gone at commit); \gset keeps it off the screen.
SELECT set_config('sftq_cron.tick_url', :'tick_url', true) IS NOT NULL AS url
\gset sftq_cron_
DO $$
DECLARE
    v_url     text := current_setting('sftq_cron.tick_url');
    v_secret  text;
    v_item    record;
    v_id      uuid;
BEGIN
    IF (SELECT count(*) FROM _sftq_cron_input) <> 1 THEN
        RAISE EXCEPTION 'the tick secret is not set: expected it alone on standard input'
            USING HINT = 'printf %s "$SFTQ_TICK_SECRET" | psql ... -f cron/schedule_tick.sql';
    END IF;
    SELECT value INTO v_secret FROM _sftq_cron_input;
    IF v_url !~ '^https?://[^[:space:]]+$' THEN
        RAISE EXCEPTION 'tick_url must be an http(s) URL';
    END IF;
    IF v_secret IS NULL THEN
        RAISE EXCEPTION 'the tick secret is not set: expected it alone on standard input';
    END IF;
    IF length(v_secret) < 32 THEN
        RAISE EXCEPTION 'the tick secret must be at least 32 characters (scheduler-tick refuses shorter ones)'
            USING HINT = 'generate one with: openssl rand -hex 32';
    END IF;
    FOR v_item IN
        SELECT * FROM (VALUES
            ('sftq_tick_url', v_url, 'finetune-queue: URL of the scheduler-tick function'),
            ('sftq_tick_secret', v_secret,
             'finetune-queue: key of the scheduler-tick tokens (SFTQ_TICK_SECRET)')
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
SELECT set_config('sftq_cron.tick_url', '', true) IS NOT NULL AS url
\gset sftq_cron_

SELECT CASE WHEN p.nspname IS NOT NULL THEN format(
    $cmd$SELECT net.http_post(
        url := (SELECT decrypted_secret FROM vault.decrypted_secrets WHERE name = 'sftq_tick_url'),
        headers := jsonb_build_object(
            'Content-Type', 'application/json',
            'Authorization', (SELECT 'Bearer v1.' || t.seconds || '.'
                                     || encode(%1$I.hmac(t.seconds, s.decrypted_secret, 'sha256'), 'hex')
                                FROM vault.decrypted_secrets s,
                                     (SELECT floor(extract(epoch FROM clock_timestamp()))::bigint::text
                                             AS seconds) t
                               WHERE s.name = 'sftq_tick_secret')),
        body := '{}'::jsonb,
        timeout_milliseconds := 25000
    ) AS request_id$cmd$, p.nspname) END AS command
  FROM (SELECT (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
                 WHERE e.extname = 'pgcrypto') AS nspname) p
\gset sftq_cron_
\if :{?sftq_cron_command}
\else
DO $$ BEGIN RAISE EXCEPTION 'pgcrypto is not installed in this database (the job signs its tokens with hmac())'
    USING HINT = 'CREATE EXTENSION pgcrypto; (on Supabase it is installed in schema extensions)'; END $$;
\endif
