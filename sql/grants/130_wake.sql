-- Privileges for event-driven admission (sql/procedures/210_wake.sql). Re-applied after
-- 010_roles.sql, which revokes first. The functions are SECURITY DEFINER: callers need
-- EXECUTE only, never a right on sftq.admission_wake.

GRANT EXECUTE ON FUNCTION
    sftq.admission_wake_take(),
    sftq.admission_wake_state(),
    sftq.request_admission_wake(text)
TO sftq_scheduler;
