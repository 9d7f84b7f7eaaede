-- Fire the scheduler tick every 30 seconds from Supabase Cron (pg_cron >= 1.5) via pg_net.
--
--   printf %s "$SFTQ_TICK_SECRET" | psql "$SUPABASE_DB_URL" -v ON_ERROR_STOP=1 \
--        -v tick_url="$SUPABASE_URL/functions/v1/scheduler-tick" \
--        -f cron/schedule_tick.sql
--
-- Optional: -v tick_schedule='15 seconds' (any pg_cron schedule; default '30 seconds').
--           -v wake=off: no admission wake-up (default on: see below).
--           -v reconcile_schedule='20 seconds' (default '10 seconds'; 'off' removes the job).
--
-- Besides the periodic job it installs two things (docs/scheduling.md, How admission is
-- woken):
-- * the admission wake-up (_tick_poke.sql): a trigger on sftq.admission_wake that has pg_net
--   POST {"wake": true} to the tick right after a commit that submits, cancels or ends a job,
--   so admission runs within about a second; the periodic job stays the safety net;
-- * sftq-scheduler-reconcile: every 10 seconds, while some job runs at the provider, a POST
--   {"pass": "reconcile"} that reads the running jobs' states (one listing call per kind)
--   and admits in the same pass when one ended. scheduler-tick skips it when FIREWORKS_RPM
--   leaves the tick too few requests for that pace. An idle queue costs no invocation.
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

\if :{?reconcile_schedule}
\else
\set reconcile_schedule '10 seconds'
\endif
SELECT :'reconcile_schedule' <> 'off' AS reconcile_on \gset sftq_cron_

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
    :'tick_schedule',
    :'sftq_cron_command'
) AS jobid \gset sftq_cron_

\if :sftq_cron_reconcile_on
-- Fires only while a job runs at the provider (one probe of the PROGRESS index).
SELECT cron.schedule(
    'sftq-scheduler-reconcile',
    :'reconcile_schedule',
    replace(:'sftq_cron_command', 'body := ''{}''::jsonb', 'body := ''{"pass": "reconcile"}''::jsonb')
    || $where$
     WHERE EXISTS (SELECT 1 FROM sftq.jobs
                    WHERE state = 'PROGRESS' AND submitted_at IS NOT NULL)$where$
) AS jobid \gset sftq_cron_reconcile_
\else
SELECT count(cron.unschedule(jobid)) AS removed FROM cron.job
 WHERE jobname = 'sftq-scheduler-reconcile' \gset sftq_cron_reconcile_
\endif

\ir _tick_poke.sql
COMMIT;
\echo 'scheduled sftq-scheduler-tick:' :'tick_schedule'
\if :sftq_cron_reconcile_on
\echo 'scheduled sftq-scheduler-reconcile:' :'reconcile_schedule'
\endif
