-- Fire the scheduler tick every 30 seconds from Supabase Cron (pg_cron >= 1.5) via pg_net.
--
--   printf %s "$SFTQ_TICK_SECRET" | psql "$SUPABASE_DB_URL" -v ON_ERROR_STOP=1 \
--        -v tick_url="$SUPABASE_URL/functions/v1/scheduler-tick" \
--        -f cron/schedule_tick.sql
--
-- Optional: -v tick_schedule='15 seconds' (any pg_cron schedule; default '30 seconds').
-- Run it in the database that holds pg_cron (on Supabase: postgres). Running it again
-- replaces the job (same name) and updates the two Vault secrets: nothing is duplicated.
-- Needs the extensions pg_cron, pg_net, supabase_vault and pgcrypto. It also closes pg_net's
-- schema to every role but the job's owner (_net_private.sql); check that it took with
-- check_net_private.sql (infra/deploy.sh cron runs both). For pg_cron 1.4, which has no
-- seconds schedules, use schedule_tick_pgcron14.sql. Remove with unschedule_tick.sql.
--
-- The command only fires the request: pg_net sends it after the cron transaction commits
-- and the tick records its own outcome in sftq.scheduler_ticks. A tick fired while another
-- still runs answers "skipped" (the lease), so overlapping firings do no harm.

\set ON_ERROR_STOP on
\if :{?tick_schedule}
\else
\set tick_schedule '30 seconds'
\endif

BEGIN;
\ir _tick_secrets.sql
\ir _net_private.sql

SELECT cron.schedule(
    'sftq-scheduler-tick',
    :'tick_schedule',
    :'sftq_cron_command'
) AS jobid \gset sftq_cron_
COMMIT;
\echo 'scheduled sftq-scheduler-tick:' :'tick_schedule'
