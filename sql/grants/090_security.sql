-- Security hardening, re-applied after every migrate (after 010_roles.sql). Every part is a
-- loop over the catalog, so tables and functions other files add later are covered with no
-- edit here; each loop changes only what differs, so a re-run takes no lock it does not need.
--
-- 1. Every SECURITY DEFINER function of sftq is owned by sftq_definer (NOLOGIN, owns nothing
--    else), which gets the table rights those functions use: DML on the tables, never DDL.
-- 2. Row-level security is on for every table of sftq. The owner (the migrating role) is not
--    subject to it, and the analyst views run as their owner. Policies exist only for the
--    roles that read tables as themselves: sftq_definer (inside the api_* functions) and any
--    sftq_* group role granted rights on a table (sftq_scheduler: the tick runs as invoker).
--    Supabase's Data API roles anon and authenticated get no policy, hence no row.
-- 3. Nothing in sftq or sftq_migrations for PUBLIC, anon or authenticated.
-- 4. On a read replica, sftq_definer sees api_keys only while the replica has replayed a
--    commit of the primary within sftq.replica_max_lag (default 120 s): a revoked key stops
--    working on the replica within that bound, else the call fails with SQLSTATE 57P03 (the
--    functions answer 503). See docs/reliability.md (Security).

CREATE OR REPLACE FUNCTION sftq._replica_fresh()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_max  interval := coalesce(nullif(current_setting('sftq.replica_max_lag', true), '')::interval,
                                interval '120 seconds');
    v_lag  interval;
BEGIN
    IF NOT pg_is_in_recovery() THEN
        RETURN true;
    END IF;
    -- The commit time of the last transaction replayed: the primary writes at least every
    -- 30 s while the tick is scheduled (pg_cron's run log, the tick's own rows).
    v_lag := now() - pg_last_xact_replay_timestamp();
    IF v_lag IS NULL OR v_lag > v_max THEN
        RAISE EXCEPTION USING ERRCODE = '57P03',
            MESSAGE = format('this read replica has replayed nothing from the primary for %s (more than sftq.replica_max_lag, %s): it may still accept revoked keys, so it refuses to authenticate',
                             coalesce(date_trunc('second', v_lag)::text, 'ever'), v_max),
            HINT = 'Wait for the replica to catch up, or point the analytics function at the primary.';
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION sftq._replica_fresh() IS
    'True on the primary; on a replica, true while it has replayed a primary commit within sftq.replica_max_lag (default 120 s), else raises 57P03. Used by the api_keys policy of sftq_definer. Reads no table, takes no lock.';

DO $$
DECLARE
    v_rec     record;
    v_role    text;
    v_want    jsonb := '{}'::jsonb;   -- "table|policy" -> qual
    v_qual    text;
BEGIN
    -- A non-superuser migrator (Supabase's postgres) must belong to sftq_definer to hand it
    -- functions, and to replace them later (CREATE OR REPLACE needs the owner's rights).
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT pg_has_role(current_user, 'sftq_definer', 'MEMBER') THEN
        EXECUTE format('GRANT sftq_definer TO %I', current_user);
    END IF;

    -- 1. Ownership of the SECURITY DEFINER functions, and the rights they run with. A
    --    non-superuser may hand a function only to a role with CREATE on its schema: granted
    --    for the handover and revoked in the same transaction, so no one ever sees it.
    GRANT CREATE ON SCHEMA sftq TO sftq_definer;
    FOR v_rec IN
        SELECT p.oid::regprocedure AS fn
          FROM pg_proc p
         WHERE p.pronamespace = 'sftq'::regnamespace AND p.prosecdef
           AND p.proowner <> 'sftq_definer'::regrole
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO sftq_definer', v_rec.fn);
    END LOOP;
    REVOKE CREATE ON SCHEMA sftq FROM sftq_definer;
    GRANT USAGE ON SCHEMA sftq TO sftq_definer;
    FOR v_rec IN
        SELECT c.oid::regclass AS rel, c.relkind
          FROM pg_class c
         WHERE c.relnamespace = 'sftq'::regnamespace AND c.relkind IN ('r', 'p', 'S')
    LOOP
        IF v_rec.relkind = 'S' THEN
            EXECUTE format('GRANT USAGE, SELECT, UPDATE ON SEQUENCE %s TO sftq_definer', v_rec.rel);
        ELSE
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %s TO sftq_definer', v_rec.rel);
        END IF;
    END LOOP;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA sftq TO sftq_definer;

    -- 2. Row-level security and the policies that are needed.
    FOR v_rec IN
        SELECT c.oid::regclass AS rel
          FROM pg_class c
         WHERE c.relnamespace = 'sftq'::regnamespace AND c.relkind IN ('r', 'p')
           AND NOT c.relrowsecurity
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', v_rec.rel);
    END LOOP;

    FOR v_rec IN
        SELECT c.oid, c.oid::regclass::text AS rel, c.relname
          FROM pg_class c
         WHERE c.relnamespace = 'sftq'::regnamespace AND c.relkind IN ('r', 'p')
    LOOP
        v_want := v_want || jsonb_build_object(
            v_rec.rel || '|sftq_definer_rows',
            CASE WHEN v_rec.relname = 'api_keys'
                 THEN '(NOT pg_is_in_recovery()) OR sftq._replica_fresh()' ELSE 'true' END);
        FOR v_role IN
            SELECT DISTINCT r.rolname
              FROM aclexplode(coalesce((SELECT relacl FROM pg_class WHERE oid = v_rec.oid),
                                       '{}'::aclitem[])) a
              JOIN pg_roles r ON r.oid = a.grantee
             WHERE r.rolname LIKE 'sftq\_%' AND r.rolname <> 'sftq_definer' AND NOT r.rolcanlogin
               AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
        LOOP
            v_want := v_want || jsonb_build_object(v_rec.rel || '|' || v_role || '_rows', 'true');
        END LOOP;
    END LOOP;

    -- Drop our policies that are no longer wanted or have changed (others' stay untouched).
    FOR v_rec IN
        SELECT format('%I.%I', p.schemaname, p.tablename)::regclass::text AS rel, p.policyname,
               p.roles, p.qual, p.with_check
          FROM pg_policies p
         WHERE p.schemaname = 'sftq' AND p.policyname LIKE 'sftq\_%\_rows'
    LOOP
        -- pg_policies shows a qual as deparsed: (a) OR b comes back as ((a) OR b).
        v_qual := v_want ->> (v_rec.rel || '|' || v_rec.policyname);
        v_qual := CASE WHEN v_qual IS NULL OR v_qual = 'true' THEN v_qual ELSE '(' || v_qual || ')' END;
        IF v_qual IS NULL
           OR v_rec.roles <> ARRAY[left(v_rec.policyname, -5)]::name[]
           OR v_rec.with_check IS DISTINCT FROM 'true'
           OR v_rec.qual IS DISTINCT FROM v_qual THEN
            EXECUTE format('DROP POLICY %I ON %s', v_rec.policyname, v_rec.rel);
        ELSE
            v_want := v_want - (v_rec.rel || '|' || v_rec.policyname);  -- in place already
        END IF;
    END LOOP;
    FOR v_rec IN SELECT key, value #>> '{}' AS qual FROM jsonb_each(v_want) LOOP
        EXECUTE format('CREATE POLICY %I ON %s AS PERMISSIVE FOR ALL TO %I USING (%s) WITH CHECK (true)',
                       split_part(v_rec.key, '|', 2), split_part(v_rec.key, '|', 1),
                       left(split_part(v_rec.key, '|', 2), -5), v_rec.qual);
    END LOOP;

    -- 3. Nothing for PUBLIC or Supabase's Data API roles, wherever they exist.
    FOR v_role IN
        SELECT 'PUBLIC' UNION ALL
        SELECT quote_ident(rolname) FROM pg_roles WHERE rolname IN ('anon', 'authenticated')
    LOOP
        EXECUTE format('REVOKE ALL ON SCHEMA sftq, sftq_migrations FROM %s', v_role);
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA sftq, sftq_migrations FROM %s', v_role);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA sftq, sftq_migrations FROM %s', v_role);
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA sftq, sftq_migrations FROM %s', v_role);
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION sftq._replica_fresh() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sftq._replica_fresh() TO sftq_definer;
