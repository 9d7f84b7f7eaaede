-- Stop firing the scheduler tick: removes the job(s) made by schedule_tick.sql or
-- schedule_tick_pgcron14.sql (the periodic tick, its half-minute companion, the reconcile
-- job) and the admission wake-up (trigger and sftq_cron._tick_poke). Safe to run when none
-- exist. The Vault secrets stay; delete
-- them with: DELETE FROM vault.secrets WHERE name IN ('sftq_tick_url', 'sftq_tick_secret');
--
--   psql "$SUPABASE_DB_URL" -v ON_ERROR_STOP=1 -f cron/unschedule_tick.sql

BEGIN;
DO $$ BEGIN
    IF to_regclass('sftq.admission_wake') IS NOT NULL THEN
        DROP TRIGGER IF EXISTS admission_wake_poke ON sftq.admission_wake;
    END IF;
    IF to_regnamespace('sftq_cron') IS NOT NULL THEN
        DROP FUNCTION IF EXISTS sftq_cron._tick_poke();
        -- The webhook poke may still live there: the schema goes only when empty.
        BEGIN
            DROP SCHEMA sftq_cron;
        EXCEPTION WHEN dependent_objects_still_exist THEN
            NULL;
        END;
    END IF;
END $$;
SELECT count(cron.unschedule(jobid)) AS jobs_removed FROM cron.job
 WHERE jobname IN ('sftq-scheduler-tick', 'sftq-scheduler-tick-offset',
                   'sftq-scheduler-reconcile');
COMMIT;
