-- Stop firing the scheduler tick: removes the job(s) made by schedule_tick.sql or
-- schedule_tick_pgcron14.sql. Safe to run when none exist. The Vault secrets stay; delete
-- them with: DELETE FROM vault.secrets WHERE name IN ('sftq_tick_url', 'sftq_tick_secret');
--
--   psql "$SUPABASE_DB_URL" -v ON_ERROR_STOP=1 -f cron/unschedule_tick.sql

SELECT count(cron.unschedule(jobid)) AS jobs_removed FROM cron.job
 WHERE jobname IN ('sftq-scheduler-tick', 'sftq-scheduler-tick-offset');
