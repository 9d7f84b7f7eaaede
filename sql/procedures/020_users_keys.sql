-- Users, API keys and authentication.

CREATE OR REPLACE FUNCTION sftq.create_user(p_name text, p_max_running integer DEFAULT 1)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400',
            MESSAGE = 'user name must be 1-64 characters of letters, digits, _ . @ - and start with a letter or digit';
    END IF;
    INSERT INTO sftq.users (name, max_running) VALUES (p_name, p_max_running)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ423', MESSAGE = format('user %s already exists', p_name);
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION sftq.create_user(text, integer) IS 'Creates a user (cap default 1). Raises SQ423 if the name is taken. Locks nothing beyond the new row.';

CREATE OR REPLACE FUNCTION sftq._user_id(p_name text)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    SELECT id INTO v_id FROM sftq.users WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = format('user %s not found', p_name);
    END IF;
    RETURN v_id;
END
$$;

CREATE OR REPLACE FUNCTION sftq.issue_key(p_user_name text)
RETURNS TABLE (key text, prefix text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._user_id(p_user_name);
BEGIN
    -- 48 hex characters from two random UUIDs: about 180 bits of entropy.
    key := 'sftq_' || substr(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 1, 48);
    prefix := substr(key, 1, 13);
    INSERT INTO sftq.api_keys (user_id, key_hash, prefix)
    VALUES (v_user, sha256(convert_to(key, 'UTF8')), prefix);
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION sftq.issue_key(text) IS
    'Issues a new key for a user and returns it; only its SHA-256 and a 13-character prefix are stored, so this is the one time it can be seen.';

CREATE OR REPLACE FUNCTION sftq.revoke_key(p_prefix text, p_now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_matches integer;
BEGIN
    IF p_prefix IS NULL OR length(p_prefix) < 9 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'give at least the first 9 characters of the key (sftq_ and 4 more)';
    END IF;
    SELECT count(*) INTO v_matches FROM sftq.api_keys
     WHERE revoked_at IS NULL AND (prefix LIKE p_prefix || '%' OR p_prefix LIKE prefix || '%');
    IF v_matches = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = format('no active key starts with %s', p_prefix);
    ELSIF v_matches > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ409', MESSAGE = format('%s active keys start with %s; give a longer prefix', v_matches, p_prefix);
    END IF;
    UPDATE sftq.api_keys SET revoked_at = p_now
     WHERE revoked_at IS NULL AND (prefix LIKE p_prefix || '%' OR p_prefix LIKE prefix || '%');
    RETURN 1;
END
$$;
COMMENT ON FUNCTION sftq.revoke_key(text, timestamptz) IS 'Revokes the one active key whose prefix matches (a full key works too). Refuses an ambiguous prefix.';

CREATE OR REPLACE FUNCTION sftq.authenticate(p_key_hash bytea, p_now timestamptz DEFAULT now())
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key_id bigint;
    v_user   bigint;
    v_last   timestamptz;
BEGIN
    -- An equality lookup on the hash: how long it takes does not depend on how much
    -- of a presented key matches a real one.
    SELECT k.id, k.user_id, k.last_used_at INTO v_key_id, v_user, v_last
      FROM sftq.api_keys k JOIN sftq.users u ON u.id = k.user_id
     WHERE k.key_hash = p_key_hash AND k.revoked_at IS NULL AND u.disabled_at IS NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- Touch last_used_at at most once a minute: a write per request would cost every call.
    -- Not at all in a read-only transaction: the analytics function may run on a replica.
    IF (v_last IS NULL OR v_last < p_now - interval '1 minute')
       AND NOT current_setting('transaction_read_only')::boolean THEN
        UPDATE sftq.api_keys SET last_used_at = p_now WHERE id = v_key_id;
    END IF;
    RETURN v_user;
END
$$;
COMMENT ON FUNCTION sftq.authenticate(bytea, timestamptz) IS
    'The user behind an active key of an enabled user, or NULL. Updates last_used_at at most once a minute (row lock on that key only), and never in a read-only transaction (a replica).';

CREATE OR REPLACE FUNCTION sftq.authenticate_many(p_key_hashes bytea[], p_now timestamptz DEFAULT now())
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_users  bigint[];
    v_stale  bigint[];
BEGIN
    -- sftq.authenticate for a batch (group commit): the same rules, one lookup for all keys,
    -- the answer in the order given (NULL where a key is not an active key of an enabled user).
    SELECT array_agg(k.user_id ORDER BY t.ord),
           array_agg(k.id) FILTER (WHERE k.last_used_at IS NULL
                                      OR k.last_used_at < p_now - interval '1 minute')
      INTO v_users, v_stale
      FROM unnest(p_key_hashes) WITH ORDINALITY AS t(h, ord)
      LEFT JOIN LATERAL (
            SELECT k.id, k.user_id, k.last_used_at
              FROM sftq.api_keys k JOIN sftq.users u ON u.id = k.user_id
             WHERE k.key_hash = t.h AND k.revoked_at IS NULL AND u.disabled_at IS NULL) k ON true;
    -- The touch is best effort: a key another transaction is touching right now is skipped,
    -- so a batch never waits on (or deadlocks over) key rows.
    IF v_stale IS NOT NULL AND NOT current_setting('transaction_read_only')::boolean THEN
        UPDATE sftq.api_keys k SET last_used_at = p_now
         WHERE k.id IN (SELECT l.id FROM sftq.api_keys l WHERE l.id = ANY (v_stale)
                         FOR NO KEY UPDATE SKIP LOCKED);
    END IF;
    RETURN v_users;
END
$$;
COMMENT ON FUNCTION sftq.authenticate_many(bytea[], timestamptz) IS
    'sftq.authenticate for several keys at once: the user behind each, in the order given (NULL for a missing, unknown or revoked key, or a disabled user), with last_used_at touched as authenticate does (at most once a minute, never in a read-only transaction). Locking contract: the rows of the keys it touches, with SKIP LOCKED: it never waits for a key row.';

CREATE OR REPLACE FUNCTION sftq._auth(p_key_hash bytea)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq.authenticate(p_key_hash);
BEGIN
    IF v_user IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ401', MESSAGE = 'missing, unknown or revoked API key';
    END IF;
    RETURN v_user;
END
$$;

CREATE OR REPLACE FUNCTION sftq.set_cap(p_user_name text, p_max_running integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_max_running IS NULL OR p_max_running < 0 OR p_max_running > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'cap must be between 0 and 1000';
    END IF;
    PERFORM sftq._gate();
    UPDATE sftq.users SET max_running = p_max_running WHERE name = p_user_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = format('user %s not found', p_user_name);
    END IF;
END
$$;
COMMENT ON FUNCTION sftq.set_cap(text, integer) IS 'Sets a user''s cap on running jobs. Takes the admission gate (shared), then the user row.';

CREATE OR REPLACE FUNCTION sftq.set_user_disabled(p_user_name text, p_disabled boolean, p_now timestamptz DEFAULT now())
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM sftq._gate();
    UPDATE sftq.users SET disabled_at = CASE WHEN p_disabled THEN COALESCE(disabled_at, p_now) END
     WHERE name = p_user_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = format('user %s not found', p_user_name);
    END IF;
END
$$;
COMMENT ON FUNCTION sftq.set_user_disabled(text, boolean, timestamptz) IS
    'Disables (keys refused, queued jobs not admitted) or re-enables a user. Takes the admission gate (shared), then the user row.';

CREATE OR REPLACE FUNCTION sftq.list_users()
RETURNS TABLE (name text, created_at timestamptz, disabled_at timestamptz, max_running integer,
               running integer, queued integer, active_keys bigint, last_used_at timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT u.name, u.created_at, u.disabled_at, u.max_running, u.running_count, u.queued_count,
           count(k.id) FILTER (WHERE k.revoked_at IS NULL), max(k.last_used_at)
      FROM sftq.users u LEFT JOIN sftq.api_keys k ON k.user_id = u.id
     GROUP BY u.id
     ORDER BY u.name
$$;
COMMENT ON FUNCTION sftq.list_users() IS 'Users with their cap, running and queued counts and active keys. Reads only.';
