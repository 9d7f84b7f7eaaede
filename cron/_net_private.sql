-- Included (\ir) by the schedule scripts, inside their transaction; not run on its own.
--
-- pg_net's scripts grant everything on the tables of schema net to PUBLIC, and Supabase
-- grants its http_* functions to anon and authenticated. The job's POST waits in
-- net.http_request_queue until pg_net's worker sends it: any login could read it there, or
-- insert rows of its own to make the database send requests anywhere. So everything on
-- schema net is revoked from PUBLIC, anon, authenticated and every other login role of the
-- project, and the job's owner (pg_cron runs a job as the role that scheduled it: this
-- one) keeps what queuing a request needs. Supabase's own service roles (supabase_*) and
-- superusers are left alone. Statements this role may not run (objects another role owns
-- without a grant option for it) only warn: check_net_private.sql then says what is left.

DO $$
DECLARE
    v_owner  name := current_user;
    v_role   text;
    v_sql    text;
BEGIN
    IF to_regnamespace('net') IS NULL THEN
        RAISE EXCEPTION 'schema net does not exist: enable the pg_net extension first';
    END IF;
    FOR v_role IN
        SELECT 'PUBLIC'
        UNION ALL
        SELECT quote_ident(r.rolname) FROM pg_roles r
         WHERE r.rolname <> v_owner AND NOT r.rolsuper AND r.rolname NOT LIKE 'supabase%'
           AND (r.rolcanlogin OR r.rolname IN ('anon', 'authenticated'))
    LOOP
        FOREACH v_sql IN ARRAY ARRAY[
            'REVOKE ALL ON ALL TABLES IN SCHEMA net FROM %s',
            'REVOKE ALL ON ALL SEQUENCES IN SCHEMA net FROM %s',
            'REVOKE ALL ON ALL FUNCTIONS IN SCHEMA net FROM %s',
            'REVOKE ALL ON SCHEMA net FROM %s']
        LOOP
            BEGIN
                EXECUTE format(v_sql, v_role);
            EXCEPTION WHEN insufficient_privilege THEN
                RAISE WARNING '%: %', format(v_sql, v_role), SQLERRM;
            END;
        END LOOP;
    END LOOP;
    FOREACH v_sql IN ARRAY ARRAY[
        'GRANT USAGE ON SCHEMA net TO %I',
        'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA net TO %I',
        'GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA net TO %I',
        'GRANT USAGE ON ALL SEQUENCES IN SCHEMA net TO %I']
    LOOP
        BEGIN
            EXECUTE format(v_sql, v_owner);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING '%: %', format(v_sql, v_owner), SQLERRM;
        END;
    END LOOP;
END
$$;
