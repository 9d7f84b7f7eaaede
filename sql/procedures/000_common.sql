-- Shared helpers: the admission gate, timestamp formatting, secret redaction.

-- The admission gate. Every procedure that changes who is eligible for admission
-- (enqueue, cancel, transitions, caps) takes it SHARED as its first lock; admit takes it
-- EXCLUSIVE. So admit sees a world that cannot change under it: no enqueue can commit an
-- earlier job, no cancel can move a head, no finish can free a user while it decides.
-- It is a transaction-scoped advisory lock, released at commit, so it works behind a
-- transaction-mode pooler (no session state). Shared holders never block each other.
CREATE OR REPLACE FUNCTION sftq._gate(p_exclusive boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- 0x5F7Q: an arbitrary constant key owned by this project.
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(7355608, 1);
    ELSE
        PERFORM pg_advisory_xact_lock_shared(7355608, 1);
    END IF;
END
$$;
COMMENT ON FUNCTION sftq._gate(boolean) IS
    'Locking contract: takes the transaction-scoped admission gate (shared, or exclusive for admit). Must be the first lock a transaction takes, so that waiting for it never holds row locks (no deadlock cycle through the gate).';

CREATE OR REPLACE FUNCTION sftq._iso(p_ts timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT to_char(p_ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;
COMMENT ON FUNCTION sftq._iso(timestamptz) IS 'ISO 8601 in UTC with a Z suffix, as every API response writes timestamps.';

CREATE OR REPLACE FUNCTION sftq.redact_secrets(p_value jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE jsonb_typeof(p_value)
        WHEN 'object' THEN COALESCE((
            SELECT jsonb_object_agg(
                       e.key,
                       CASE WHEN lower(e.key) ~ '(apikey|api_key|secret|token|password)'
                            THEN to_jsonb('[REDACTED]'::text)
                            ELSE sftq.redact_secrets(e.value) END)
              FROM jsonb_each(p_value) AS e), '{}'::jsonb)
        WHEN 'array' THEN COALESCE((
            SELECT jsonb_agg(sftq.redact_secrets(a.value) ORDER BY a.ord)
              FROM jsonb_array_elements(p_value) WITH ORDINALITY AS a(value, ord)), '[]'::jsonb)
        ELSE p_value
    END
$$;
COMMENT ON FUNCTION sftq.redact_secrets(jsonb) IS
    'Replaces the value of every key whose name contains apikey, secret, token or password (any case, any depth; covers wandbConfig.apiKey and awsS3Config.credentialsSecret) with "[REDACTED]". It over-redacts count fields such as maxOutputTokens on purpose: a hidden number costs less than a leaked secret.';
