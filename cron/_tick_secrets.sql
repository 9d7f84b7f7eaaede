-- Included (\ir) by schedule_tick.sql and schedule_tick_pgcron14.sql, inside their
-- transaction; not run on its own.
--
-- Checks the psql variables tick_url and tick_secret, then stores them in Supabase Vault as
-- the secrets sftq_tick_url and sftq_tick_secret (created the first time, updated after).
-- The cron command reads them back from vault.decrypted_secrets each time it fires, so the
-- secret never sits in cron.job.command, and rotating it is one more run of the script.

\if :{?tick_url}
\else
DO $$ BEGIN RAISE EXCEPTION 'psql variable tick_url is not set'
    USING HINT = 'psql ... -v tick_url=https://<project-ref>.supabase.co/functions/v1/scheduler-tick'; END $$;
\endif
\if :{?tick_secret}
\else
DO $$ BEGIN RAISE EXCEPTION 'psql variable tick_secret is not set'
    USING HINT = 'psql ... -v tick_secret="$SFTQ_TICK_SECRET" (the same value the function has)'; END $$;
\endif

-- psql variables are not expanded inside a DO block, so hand the values over through
-- transaction-local settings (gone at commit); \gset keeps them off the screen.
SELECT set_config('sftq_cron.tick_url', :'tick_url', true) IS NOT NULL AS url,
       set_config('sftq_cron.tick_secret', :'tick_secret', true) IS NOT NULL AS secret
\gset sftq_cron_
DO $$
DECLARE
    v_url     text := current_setting('sftq_cron.tick_url');
    v_secret  text := current_setting('sftq_cron.tick_secret');
    v_item    record;
    v_id      uuid;
BEGIN
    IF v_url !~ '^https?://[^[:space:]]+$' THEN
        RAISE EXCEPTION 'tick_url must be an http(s) URL';
    END IF;
    IF length(v_secret) < 16 THEN
        RAISE EXCEPTION 'tick_secret must be at least 16 characters';
    END IF;
    FOR v_item IN
        SELECT * FROM (VALUES
            ('sftq_tick_url', v_url, 'finetune-queue: URL of the scheduler-tick function'),
            ('sftq_tick_secret', v_secret,
             'finetune-queue: bearer secret of the scheduler-tick function (SFTQ_TICK_SECRET)')
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
SELECT set_config('sftq_cron.tick_url', '', true) IS NOT NULL AS url,
       set_config('sftq_cron.tick_secret', '', true) IS NOT NULL AS secret
\gset sftq_cron_
