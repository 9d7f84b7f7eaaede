-- Fails (and says why) unless pg_net's schema is closed to everyone but the tick job's owner,
-- and that owner can still queue the job's POST. Run after schedule_tick.sql, in the same
-- database (infra/deploy.sh cron does):
--
--   psql "$SUPABASE_DB_URL" -X -v ON_ERROR_STOP=1 -f cron/check_net_private.sql
--
-- Who must not reach net: PUBLIC, anon, authenticated, and every login role other than the
-- job's owner, superusers and Supabase's own service roles (supabase_*), whether the right
-- was granted to it or comes through a role it belongs to.

DO $$
DECLARE
    v_owner  name;
    v_post   regprocedure := to_regprocedure('net.http_post(text, jsonb, jsonb, jsonb, integer)');
    v_open   text[];
BEGIN
    IF to_regnamespace('net') IS NULL THEN
        RAISE EXCEPTION 'schema net does not exist: is pg_net enabled in this database?';
    END IF;
    IF to_regclass('cron.job') IS NOT NULL THEN
        EXECUTE 'SELECT username FROM cron.job WHERE jobname = $1' INTO v_owner
          USING 'sftq-scheduler-tick';
    END IF;
    v_owner := coalesce(v_owner, current_user);
    WITH probe AS (
        SELECT r.oid, r.rolname::text AS who FROM pg_roles r
         WHERE r.rolname <> v_owner AND NOT r.rolsuper AND r.rolname NOT LIKE 'supabase%'
           AND (r.rolcanlogin OR r.rolname IN ('anon', 'authenticated'))
    ), rel AS (
        SELECT c.oid, c.oid::regclass::text AS name, c.relkind, c.relacl FROM pg_class c
         WHERE c.relnamespace = 'net'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
    ), fn AS (
        SELECT p.oid, p.oid::regprocedure::text AS name, p.proacl FROM pg_proc p
         WHERE p.pronamespace = 'net'::regnamespace
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
    ) found;
    IF v_open IS NOT NULL THEN
        RAISE EXCEPTION 'pg_net is open to roles other than the tick job''s owner (%): the queued request, and the power to make the database send requests, are theirs',
                        v_owner
            USING DETAIL = array_to_string(v_open, E'\n'),
                  HINT = 'Run cron/schedule_tick.sql again as the job''s owner; if these grants belong to another role (e.g. supabase_admin), ask the project''s administrator to revoke them.';
    END IF;
    IF v_post IS NULL OR NOT has_function_privilege(v_owner, v_post, 'EXECUTE')
       OR NOT has_schema_privilege(v_owner, 'net', 'USAGE')
       OR (NOT (SELECT prosecdef FROM pg_proc WHERE oid = v_post)
           AND NOT has_table_privilege(v_owner, 'net.http_request_queue', 'INSERT')) THEN
        RAISE EXCEPTION 'the tick job''s owner % can no longer queue its POST with net.http_post', v_owner;
    END IF;
END
$$;
