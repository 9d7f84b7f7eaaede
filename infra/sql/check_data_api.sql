-- Fails (and says why) if Supabase's Data API could reach the queue: run by
-- `infra/deploy.sh db` after the migrations, or by hand:
--
--   psql "$SUPABASE_DB_URL" -X -v ON_ERROR_STOP=1 -f infra/sql/check_data_api.sql
--
-- PostgREST serves a schema to the roles anon and authenticated. The migrations revoke
-- everything on sftq from them and from PUBLIC (sql/grants/090_security.sql) and turn on
-- row-level security with no policy for them; this checks that it held: no USAGE on the
-- schema, no right on any table, sequence or function of it, RLS on every table, and sftq
-- not named in an in-database PostgREST setting (pgrst.db_schemas). The project setting
-- (Settings > API > Exposed schemas) is checked through the Management API by deploy.sh.

DO $$
DECLARE
    v_found  text[];
BEGIN
    WITH who AS (
        SELECT r.oid, r.rolname::text AS name FROM pg_roles r
         WHERE r.rolname IN ('anon', 'authenticated')
        UNION ALL
        SELECT 0::oid, 'PUBLIC'
    )
    SELECT array_agg(line ORDER BY line) INTO v_found FROM (
        SELECT format('%s can use schema sftq', who.name) AS line
          FROM who
         WHERE (who.oid <> 0 AND has_schema_privilege(who.oid, 'sftq', 'USAGE'))
            OR (who.oid = 0 AND EXISTS (SELECT 1 FROM pg_namespace n, aclexplode(n.nspacl) a
                                         WHERE n.nspname = 'sftq' AND a.grantee = 0))
        UNION ALL
        SELECT format('%s has %s on %s', who.name, a.privilege_type, c.oid::regclass)
          FROM who, pg_class c, aclexplode(c.relacl) a
         WHERE c.relnamespace = 'sftq'::regnamespace AND a.grantee = who.oid
        UNION ALL
        SELECT format('%s can execute %s', who.name, p.oid::regprocedure)
          FROM who, pg_proc p
         WHERE p.pronamespace = 'sftq'::regnamespace
           AND ((p.proacl IS NULL AND who.oid = 0)
                OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = who.oid))
        UNION ALL
        SELECT format('table %s has no row-level security', c.oid::regclass)
          FROM pg_class c
         WHERE c.relnamespace = 'sftq'::regnamespace AND c.relkind IN ('r', 'p')
           AND NOT c.relrowsecurity
        UNION ALL
        SELECT format('%s is set for role %s: sftq is among the Data API''s exposed schemas',
                      s.setting, r.rolname)
          FROM pg_db_role_setting d JOIN pg_roles r ON r.oid = d.setrole,
               unnest(d.setconfig) AS s(setting)
         WHERE s.setting LIKE 'pgrst.db\_schemas=%'
           AND 'sftq' = ANY (string_to_array(replace(split_part(s.setting, '=', 2), ' ', ''), ','))
    ) found;
    IF v_found IS NOT NULL THEN
        RAISE EXCEPTION 'Supabase''s Data API could reach schema sftq'
            USING DETAIL = array_to_string(v_found, E'\n'),
                  HINT = 'Run `sftq db migrate` (its grants revoke these), keep sftq out of Settings > API > Exposed schemas, and find who granted them.';
    END IF;
END
$$;
