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
--
-- The admission wake-up is installed as on Supabase (_tick_poke.sql; -v wake=off removes
-- it): pg_net POSTs {"wake": true} right after a commit that submits, cancels or ends a job,
-- so admission does not wait for the minute. Without pg_net there is no wake-up from the
-- database: run `sftq ticker` (it polls the wake flag) instead of these jobs. There is no
-- reconcile job here (pg_cron 1.4 cannot run one every 10 s): running jobs are read at each
-- tick, and `sftq ticker` adds the reconcile passes where it runs.

\set ON_ERROR_STOP on

\if :{?tick_url}
\else
DO $$ BEGIN RAISE EXCEPTION 'psql variable tick_url is not set'
    USING HINT = 'psql ... -v tick_url=https://<project-ref>.supabase.co/functions/v1/scheduler-tick'; END $$;
\endif
\set sftq_cron_url :tick_url
\set sftq_cron_url_secret sftq_tick_url
\set sftq_cron_url_description 'finetune-queue: URL of the scheduler-tick function'

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
-- A reconcile job left by schedule_tick.sql (seconds schedules) cannot run here.
SELECT count(cron.unschedule(jobid)) AS removed FROM cron.job
 WHERE jobname = 'sftq-scheduler-reconcile' \gset sftq_cron_reconcile_

\ir _tick_poke.sql
COMMIT;
