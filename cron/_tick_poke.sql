-- Included (\ir) by schedule_tick.sql and schedule_tick_pgcron14.sql, inside their
-- transaction, after _tick_secrets.sql (it uses :sftq_cron_authorization); not run on its own.
--
-- The admission wake-up (docs/scheduling.md, How admission is woken): a trigger on
-- sftq.admission_wake that queues one pg_net POST {"wake": true} to scheduler-tick each time
-- the row's `pokes` goes up, which happens when a submit, a cancel or a job's end sets the
-- wake flag, and again when a tick releases its lease with a wake pending. pg_net sends it
-- after the commit, so the woken tick sees the change that woke it. A burst of submits sets
-- the flag once until a tick takes it: one POST, not one per submit. A POST that finds a tick
-- running answers "skipped", and that tick's end pokes again.
--
-- The poke's function lives in schema sftq_cron, like the webhook poke and for the same
-- reason (cron/README.md): it must run as the jobs' owner, the one role left with pg_net and
-- Vault, and migrations hand every SECURITY DEFINER function of sftq to sftq_definer.
--
-- psql variable wake: on (default) installs the trigger; off removes it (the 30-second job,
-- or `sftq ticker`, then admits alone). Skipped with a notice in a database without
-- sftq.admission_wake (not migrated yet, or a pg_cron database of its own): run the script
-- again there after `sftq db migrate`.

\if :{?wake}
\else
\set wake on
\endif

SELECT to_regclass('sftq.admission_wake') IS NOT NULL AS have_wake \gset sftq_cron_
\if :sftq_cron_have_wake
DO $$ BEGIN
    IF to_regnamespace('sftq_cron') IS NULL THEN
        CREATE SCHEMA sftq_cron;
    ELSIF (SELECT nspowner FROM pg_namespace WHERE nspname = 'sftq_cron')
          <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'schema sftq_cron belongs to %, not to %, who runs this script',
                        (SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'sftq_cron'),
                        current_user
            USING HINT = 'Run the cron scripts as the role that owns the jobs (postgres on Supabase), or hand the schema over: ALTER SCHEMA sftq_cron OWNER TO <that role>.';
    END IF;
END $$;

SELECT format($def$
CREATE OR REPLACE FUNCTION sftq_cron._tick_poke()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    v_url  text;
BEGIN
    -- A poke that cannot be sent must never fail the submit, cancel or tick that woke it:
    -- the periodic tick admits anyway, at most its interval later.
    BEGIN
        SELECT decrypted_secret INTO v_url FROM vault.decrypted_secrets
         WHERE name = 'sftq_tick_url';
        IF v_url IS NOT NULL THEN
            PERFORM net.http_post(
                url := v_url,
                headers := jsonb_build_object(
                    'Content-Type', 'application/json',
                    'Authorization', %s),
                body := '{"wake": true}'::jsonb,
                timeout_milliseconds := 25000);
        END IF;
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'sftq: admission wake-up not sent (%%); the periodic tick will admit', SQLERRM;
    END;
    RETURN NULL;
END
$body$
$def$, :'sftq_cron_authorization') \gexec
COMMENT ON FUNCTION sftq_cron._tick_poke() IS
    'AFTER UPDATE OF pokes trigger on sftq.admission_wake, installed by cron/schedule_tick.sql: queues one pg_net POST {"wake": true} to scheduler-tick with a two-minute token minted from Vault (never the secret), sent by pg_net after the commit that set the wake flag (or released the lease with one pending). Runs as the pg_cron jobs'' owner (SECURITY DEFINER, fixed search_path, no arguments). Never fails the transaction. Locking contract: none.';
REVOKE ALL ON FUNCTION sftq_cron._tick_poke() FROM PUBLIC;
DO $$
DECLARE
    v_sql  text;
BEGIN
    FOR v_sql IN
        SELECT format('REVOKE ALL ON SCHEMA sftq_cron FROM %s', g.name)
          FROM (SELECT DISTINCT CASE a.grantee WHEN 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS name
                  FROM pg_namespace n, aclexplode(n.nspacl) a
                 WHERE n.nspname = 'sftq_cron' AND a.grantee <> n.nspowner) g
        UNION ALL
        SELECT format('REVOKE ALL ON FUNCTION sftq_cron._tick_poke() FROM %s', g.name)
          FROM (SELECT DISTINCT quote_ident(pg_get_userbyid(a.grantee)) AS name
                  FROM pg_proc p, aclexplode(p.proacl) a
                 WHERE p.oid = 'sftq_cron._tick_poke()'::regprocedure
                   AND a.grantee NOT IN (0, p.proowner)) g
    LOOP
        EXECUTE v_sql;
    END LOOP;
END $$;

\if :wake
CREATE OR REPLACE TRIGGER admission_wake_poke
    AFTER UPDATE OF pokes ON sftq.admission_wake
    FOR EACH ROW WHEN (NEW.pokes IS DISTINCT FROM OLD.pokes)
    EXECUTE FUNCTION sftq_cron._tick_poke();
\echo 'admission wake-up: a pg_net POST to the tick after each commit that wakes admission'
\else
DROP TRIGGER IF EXISTS admission_wake_poke ON sftq.admission_wake;
\echo 'admission wake-up: off (wake=off); admission runs at the periodic tick'
\endif
\else
\echo 'admission wake-up: not installed, sftq.admission_wake does not exist in this database (migrate it, then run this script again)'
\endif
