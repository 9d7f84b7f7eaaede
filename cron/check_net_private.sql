-- Fails (and says why) unless pg_net's schema is closed to everyone but the owners of the
-- queue's requests, and each of them can still queue its POST. Run after schedule_tick.sql
-- and schedule_webhooks.sql, in the same database (infra/deploy.sh cron does):
--
--   psql "$SUPABASE_DB_URL" -X -v ON_ERROR_STOP=1 -f cron/check_net_private.sql
--
-- The owners: the roles that own the pg_cron jobs sftq-scheduler-tick and
-- sftq-webhooks-deliver (pg_cron runs a job as its owner), and the owners of the pokes
-- (sftq_cron._webhook_poke and the admission wake-up sftq_cron._tick_poke, SECURITY
-- DEFINER); with none of them, the role running this check.
-- Who must not reach net: PUBLIC, anon, authenticated, and every other login role except
-- superusers and Supabase's own service roles (supabase_*), whether the right was granted
-- to it or comes through a role it belongs to. The same roles must not be able to use the
-- poke's schema or the poke itself (with both, a role could hang the poke on a table of its
-- own and have the database send requests).
--
-- It also fails on a poke an older schedule_webhooks.sql left in schema sftq: every migrate
-- hands the SECURITY DEFINER functions of sftq to sftq_definer, which has no pg_net and no
-- Vault, so that poke no longer sends anything.

DO $$
DECLARE
    v_owners name[] := '{}';
    v_owner  name;
    v_post   regprocedure := to_regprocedure('net.http_post(text, jsonb, jsonb, jsonb, integer)');
    v_open   text[];
BEGIN
    IF to_regnamespace('net') IS NULL THEN
        RAISE EXCEPTION 'schema net does not exist: is pg_net enabled in this database?';
    END IF;
    IF to_regclass('cron.job') IS NOT NULL THEN
        EXECUTE 'SELECT coalesce(array_agg(DISTINCT username::name), ''{}'') FROM cron.job '
                'WHERE jobname = ANY($1)' INTO v_owners
          USING ARRAY['sftq-scheduler-tick', 'sftq-scheduler-tick-offset',
                      'sftq-scheduler-reconcile', 'sftq-webhooks-deliver'];
    END IF;
    IF to_regprocedure('sftq._webhook_poke()') IS NOT NULL THEN
        RAISE EXCEPTION 'sftq._webhook_poke() is left from an older cron/schedule_webhooks.sql, and it is owned by %: every migrate hands the SECURITY DEFINER functions of schema sftq to sftq_definer, which can reach neither pg_net nor Vault, so this poke sends nothing (webhooks wait for the 5-second cron job)',
                        (SELECT proowner::regrole FROM pg_proc
                          WHERE oid = to_regprocedure('sftq._webhook_poke()'))
            USING HINT = 'Run cron/schedule_webhooks.sql again as the jobs'' owner (infra/deploy.sh cron does): it moves the poke to schema sftq_cron, which migrations never touch.';
    END IF;
    FOR v_owner IN
        SELECT r.rolname FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
         WHERE p.oid IN (to_regprocedure('sftq_cron._webhook_poke()'),
                         to_regprocedure('sftq_cron._tick_poke()'))
    LOOP
        IF v_owner <> ALL (v_owners) THEN
            v_owners := array_append(v_owners, v_owner);
        END IF;
    END LOOP;
    IF cardinality(v_owners) = 0 THEN
        v_owners := ARRAY[current_user];
    END IF;
    WITH probe AS (
        SELECT r.oid, r.rolname::text AS who FROM pg_roles r
         WHERE r.rolname <> ALL (v_owners) AND NOT r.rolsuper AND r.rolname NOT LIKE 'supabase%'
           AND (r.rolcanlogin OR r.rolname IN ('anon', 'authenticated'))
    ), rel AS (
        SELECT c.oid, c.oid::regclass::text AS name, c.relkind, c.relacl FROM pg_class c
         WHERE c.relnamespace = 'net'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
    ), fn AS (
        SELECT p.oid, p.oid::regprocedure::text AS name, p.proacl FROM pg_proc p
         WHERE p.pronamespace = 'net'::regnamespace
        UNION ALL
        SELECT p.oid, p.oid::regprocedure::text, p.proacl FROM pg_proc p
         WHERE p.oid IN (to_regprocedure('sftq_cron._webhook_poke()'),
                         to_regprocedure('sftq_cron._tick_poke()'))
    ), nsp AS (
        SELECT n.oid, n.nspname::text AS name, n.nspacl FROM pg_namespace n
         WHERE n.nspname = 'sftq_cron'
    )
    SELECT array_agg(line ORDER BY line) INTO v_open FROM (
        SELECT format('PUBLIC has %s on %s', a.privilege_type, rel.name) AS line
          FROM rel, aclexplode(rel.relacl) a WHERE a.grantee = 0
        UNION ALL
        SELECT format('PUBLIC can execute %s', fn.name) FROM fn
         WHERE fn.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(fn.proacl) a WHERE a.grantee = 0)
        UNION ALL
        SELECT format('%s can %s %s', probe.who, lower(priv), rel.name)
          FROM probe, rel, unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) priv
         WHERE rel.relkind <> 'S' AND has_table_privilege(probe.oid, rel.oid, priv)
        UNION ALL
        SELECT format('%s can execute %s', probe.who, fn.name)
          FROM probe, fn WHERE has_function_privilege(probe.oid, fn.oid, 'EXECUTE')
        UNION ALL
        SELECT format('PUBLIC has %s on schema %s', a.privilege_type, nsp.name)
          FROM nsp, aclexplode(nsp.nspacl) a WHERE a.grantee = 0
        UNION ALL
        SELECT format('%s can use schema %s', probe.who, nsp.name)
          FROM probe, nsp WHERE has_schema_privilege(probe.oid, nsp.oid, 'USAGE')
    ) found;
    IF v_open IS NOT NULL THEN
        RAISE EXCEPTION 'pg_net is open to roles other than the owner of the queue''s requests (%): the queued requests, and the power to make the database send requests, are theirs',
                        array_to_string(v_owners, ', ')
            USING DETAIL = array_to_string(v_open, E'\n'),
                  HINT = 'Run cron/schedule_tick.sql (and schedule_webhooks.sql) again as the jobs'' owner; if these grants belong to another role (e.g. supabase_admin), ask the project''s administrator to revoke them.';
    END IF;
    FOREACH v_owner IN ARRAY v_owners LOOP
        IF v_post IS NULL OR NOT has_function_privilege(v_owner, v_post, 'EXECUTE')
           OR NOT has_schema_privilege(v_owner, 'net', 'USAGE')
           OR (NOT (SELECT prosecdef FROM pg_proc WHERE oid = v_post)
               AND NOT has_table_privilege(v_owner, 'net.http_request_queue', 'INSERT')) THEN
            RAISE EXCEPTION 'the owner % of the queue''s requests can no longer queue its POST with net.http_post', v_owner
                USING HINT = 'Schedule the tick and the webhooks as one role: the last schedule script run closes pg_net to every other login.';
        END IF;
    END LOOP;
END
$$;
