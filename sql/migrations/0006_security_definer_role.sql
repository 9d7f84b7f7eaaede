-- 0006: a dedicated owner for the SECURITY DEFINER functions. Until now they ran with the
-- rights of whoever migrated (a superuser on a self-hosted PostgreSQL): a mistake in one
-- of them would have handed that power to any caller. sftq_definer cannot log in and owns
-- nothing but those functions; sql/grants/090_security.sql hands it their ownership and the
-- table rights they use, on every migrate, so functions added later are covered too.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sftq_definer') THEN
        CREATE ROLE sftq_definer NOLOGIN NOINHERIT;
    END IF;
END
$$;
