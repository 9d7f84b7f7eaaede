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
                       -- The key folded to lower-case letters and digits (apiKey, api_key and
                       -- API-KEY read alike). Secret: a name that contains apikey, secret,
                       -- password, passphrase, credential, privatekey, accesskey or
                       -- authorization; a name that ends in "token" (token, accessToken,
                       -- hf_token); or exactly auth, bearer, pat. Not the token counts:
                       -- maxOutputTokens, maxTokens, tokenizer end otherwise.
                       CASE WHEN regexp_replace(lower(e.key), '[^a-z0-9]', '', 'g')
                                 ~ '(apikey|secret|passw|passphrase|credential|privatekey|accesskey|authorization|token$|^auth$|^bearer$|^pat$)'
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
    'Replaces with "[REDACTED]" the value of every key, at any depth, that names a secret: folded to lower-case letters and digits, the name contains apikey, secret, passw, passphrase, credential, privatekey, accesskey or authorization, or ends in token, or is auth, bearer or pat (covers wandbConfig.apiKey, awsS3Config.credentialsSecret, accessToken, hf_token). Token counts such as maxOutputTokens, maxTokens and the tokenizer name are shown as sent.';
