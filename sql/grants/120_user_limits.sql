-- Privileges for the per-user limits (sql/procedures/195_user_limits.sql). Re-applied after
-- 010_roles.sql, which revokes first. The operator's functions (set_user_limits,
-- user_limits_list) are run by the owner (`sftq admin`), as set_cap is.

GRANT EXECUTE ON FUNCTION
    sftq.api_lease_take(bytea, uuid, text, integer),
    sftq.api_leases_renew(uuid[], integer),
    sftq.api_leases_release(uuid[]),
    sftq.api_rate_take(bytea)
TO sftq_api;
