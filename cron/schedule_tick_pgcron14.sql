-- The same schedule for stock pg_cron 1.4 (e.g. Debian 12's postgresql-15-cron 1.4.2).
--
--   printf %s "$SFTQ_TICK_SECRET" | psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -v tick_url=https://<host>/functions/v1/scheduler-tick \
--        [-v half_minute=on] \
--        -f cron/schedule_tick_pgcron14.sql
--
-- pg_cron 1.4 takes cron syntax only: its finest schedule is once a minute ('30 seconds'
-- needs pg_cron >= 1.5). With -v half_minute=on a second job fires at the same minute
-- but sleeps 30 s first, so ticks come about every 30 s; that second job holds one pg_cron
-- connection for those 30 s each minute. Without it, running this again removes the
-- second job. Same needs as schedule_tick.sql: pg_net, supabase_vault and pgcrypto in this database
-- (the one named by cron.database_name). Where those are missing, run `sftq ticker`
-- instead. Remove with unschedule_tick.sql.

\set ON_ERROR_STOP on

BEGIN;
\ir _tick_secrets.sql
\ir _net_private.sql

SELECT cron.schedule(
    'sftq-scheduler-tick',
    '* * * * *',
    :'sftq_cron_command'
) AS jobid \gset sftq_cron_
\echo 'scheduled sftq-scheduler-tick: * * * * *'

\if :{?half_minute}
-- One command string runs as one transaction, so the request is queued after the sleep
-- and pg_net sends it when that transaction commits, 30 s into the minute.
SELECT cron.schedule(
    'sftq-scheduler-tick-offset',
    '* * * * *',
    'SELECT pg_sleep(30); ' || :'sftq_cron_command'
) AS jobid \gset sftq_cron_offset_
\echo 'scheduled sftq-scheduler-tick-offset: * * * * * (+30 s)'
\else
SELECT count(cron.unschedule(jobid)) AS removed FROM cron.job
 WHERE jobname = 'sftq-scheduler-tick-offset' \gset sftq_cron_offset_
\endif
COMMIT;
