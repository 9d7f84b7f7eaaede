-- 0002: a role for the scheduler-tick function, so it need not connect as the owner.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sftq_scheduler') THEN
        CREATE ROLE sftq_scheduler NOLOGIN;
    END IF;
END
$$;
