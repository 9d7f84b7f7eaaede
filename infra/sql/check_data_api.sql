-- Fails (and says why) if Supabase's Data API could reach the queue: run by
-- `infra/deploy.sh db` after the migrations, or by hand:
--
--   psql "$SUPABASE_DB_URL" -X -v ON_ERROR_STOP=1 -f infra/sql/check_data_api.sql
--
-- PostgREST serves a schema to the roles anon and authenticated. The migrations revoke
-- everything on sftq and sftq_migrations from them and from PUBLIC
-- (sql/grants/090_security.sql) and turn on row-level security with no policy for them; this
-- checks that it held: no USAGE on either schema, no right on any table, sequence or function
-- of them, RLS on every table of sftq, and neither schema named in an in-database PostgREST
-- setting (pgrst.db_schemas, set on a role for every database or for this one). Each line of
-- the error says the statement that takes that one thing back. The project's setting
-- (Settings > API > Exposed schemas) lives outside the database: deploy.sh asks the
-- Management API for it when SUPABASE_ACCESS_TOKEN is set.

DO $$
DECLARE
    v_found  text[];
BEGIN
    WITH who AS (
        SELECT r.oid, quote_ident(r.rolname) AS name FROM pg_roles r
         WHERE r.rolname IN ('anon', 'authenticated')
        UNION ALL
        SELECT 0::oid, 'PUBLIC'
    ), nsp AS (
        SELECT n.oid, n.nspname::text AS name, n.nspacl FROM pg_namespace n
         WHERE n.nspname IN ('sftq', 'sftq_migrations')
    ), setting AS (
        -- What PostgREST would read here: settings for all databases and for this one.
        SELECT r.rolname, d.setdatabase, s.setting,
               ARRAY(SELECT x FROM unnest(l.schemas) x
                      WHERE x IN ('sftq', 'sftq_migrations')) AS hit,
               ARRAY(SELECT x FROM unnest(l.schemas) x
                      WHERE x NOT IN ('sftq', 'sftq_migrations', '')) AS rest
          FROM pg_db_role_setting d JOIN pg_roles r ON r.oid = d.setrole,
               unnest(d.setconfig) AS s(setting),
               LATERAL (SELECT string_to_array(replace(substr(s.setting, strpos(s.setting, '=') + 1),
                                                       ' ', ''), ',') AS schemas) l
         WHERE s.setting LIKE 'pgrst.db\_schemas=%'
           AND d.setdatabase IN (0, (SELECT oid FROM pg_database
                                      WHERE datname = current_database()))
    )
    SELECT array_agg(line ORDER BY line) INTO v_found FROM (
        SELECT format('%s can use schema %s (fix: REVOKE ALL ON SCHEMA %s FROM %s)',
                      who.name, nsp.name, nsp.name, who.name) AS line
          FROM who, nsp
         WHERE (who.oid <> 0 AND has_schema_privilege(who.oid, nsp.oid, 'USAGE'))
            OR (who.oid = 0 AND EXISTS (SELECT 1 FROM aclexplode(nsp.nspacl) a
                                         WHERE a.grantee = 0))
        UNION ALL
        SELECT format('%s has %s on %s (fix: REVOKE ALL ON %s FROM %s)',
                      who.name, a.privilege_type, c.oid::regclass, c.oid::regclass, who.name)
          FROM who, nsp, pg_class c, aclexplode(c.relacl) a
         WHERE c.relnamespace = nsp.oid AND a.grantee = who.oid
        UNION ALL
        SELECT format('%s can execute %s (fix: REVOKE ALL ON FUNCTION %s FROM %s)',
                      who.name, p.oid::regprocedure, p.oid::regprocedure, who.name)
          FROM who, nsp, pg_proc p
         WHERE p.pronamespace = nsp.oid
           AND ((p.proacl IS NULL AND who.oid = 0)
                OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = who.oid))
        UNION ALL
        SELECT format('table %s has no row-level security (fix: ALTER TABLE %s ENABLE ROW LEVEL SECURITY)',
                      c.oid::regclass, c.oid::regclass)
          FROM pg_class c
         WHERE c.relnamespace = 'sftq'::regnamespace AND c.relkind IN ('r', 'p')
           AND NOT c.relrowsecurity
        UNION ALL
        SELECT format('%s is set for role %s: %s among the Data API''s exposed schemas (fix: ALTER ROLE %I%s %s, then NOTIFY pgrst, ''reload config'')',
                      s.setting, s.rolname,
                      array_to_string(s.hit, ' and ')
                          || CASE WHEN cardinality(s.hit) > 1 THEN ' are' ELSE ' is' END,
                      s.rolname,
                      CASE WHEN s.setdatabase = 0 THEN ''
                           ELSE format(' IN DATABASE %I', current_database()) END,
                      CASE WHEN cardinality(s.rest) = 0 THEN 'RESET pgrst.db_schemas'
                           ELSE format('SET pgrst.db_schemas = %L', array_to_string(s.rest, ', '))
                      END)
          FROM setting s
         WHERE cardinality(s.hit) > 0
    ) found;
    IF v_found IS NOT NULL THEN
        RAISE EXCEPTION 'Supabase''s Data API could reach the queue (schema sftq): % thing(s) to fix, each listed below with the statement that fixes it',
                        cardinality(v_found)
            USING DETAIL = array_to_string(v_found, E'\n'),
                  HINT = 'For the rights and row-level security you may instead run sql/grants/090_security.sql again with psql (sftq db migrate re-runs it only when it applies something); it does not touch PostgREST''s settings. Keep sftq out of the exposed schemas (Settings > API on hosted Supabase), and find out who granted these.';
    END IF;
END
$$;
