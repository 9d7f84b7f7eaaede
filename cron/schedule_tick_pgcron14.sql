-- The same schedule for stock pg_cron 1.4 (e.g. Debian 12's postgresql-15-cron 1.4.2).
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -v tick_url=https://<host>/functions/v1/scheduler-tick \
--        -v tick_secret="$SFTQ_TICK_SECRET" \
--        [-v half_minute=on] \
--        -f cron/schedule_tick_pgcron14.sql
--
-- pg_cron 1.4 takes cron syntax only: its finest schedule is once a minute ('30 seconds'
-- needs pg_cron >= 1.5). With -v half_minute=on a second job fires at the same minute
-- but sleeps 30 s first, so ticks come about every 30 s; that second job holds one pg_cron
-- connection for those 30 s each minute. Without it, running this again removes the
-- second job. Same needs as schedule_tick.sql: pg_net and supabase_vault in this database
-- (the one named by cron.database_name). Where those are missing, run `sftq ticker`
-- instead. Remove with unschedule_tick.sql.

\set ON_ERROR_STOP on

BEGIN;
\ir _tick_secrets.sql

SELECT cron.schedule(
    'sftq-scheduler-tick',
    '* * * * *',
    $cmd$
    SELECT net.http_post(
        url := (SELECT decrypted_secret FROM vault.decrypted_secrets WHERE name = 'sftq_tick_url'),
        headers := jsonb_build_object(
            'Content-Type', 'application/json',
            'Authorization', 'Bearer ' || (SELECT decrypted_secret FROM vault.decrypted_secrets
                                           WHERE name = 'sftq_tick_secret')),
        body := '{}'::jsonb,
        timeout_milliseconds := 25000
    ) AS request_id
    $cmd$
) AS jobid \gset sftq_cron_
\echo 'scheduled sftq-scheduler-tick: * * * * *'

\if :{?half_minute}
-- One command string runs as one transaction, so the request is queued after the sleep
-- and pg_net sends it when that transaction commits, 30 s into the minute.
SELECT cron.schedule(
    'sftq-scheduler-tick-offset',
    '* * * * *',
    $cmd$
    SELECT pg_sleep(30);
    SELECT net.http_post(
        url := (SELECT decrypted_secret FROM vault.decrypted_secrets WHERE name = 'sftq_tick_url'),
        headers := jsonb_build_object(
            'Content-Type', 'application/json',
            'Authorization', 'Bearer ' || (SELECT decrypted_secret FROM vault.decrypted_secrets
                                           WHERE name = 'sftq_tick_secret')),
        body := '{}'::jsonb,
        timeout_milliseconds := 25000
    ) AS request_id
    $cmd$
) AS jobid \gset sftq_cron_offset_
\echo 'scheduled sftq-scheduler-tick-offset: * * * * * (+30 s)'
\else
SELECT count(cron.unschedule(jobid)) AS removed FROM cron.job
 WHERE jobname = 'sftq-scheduler-tick-offset' \gset sftq_cron_offset_
\endif
COMMIT;
