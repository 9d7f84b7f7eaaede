-- Per-user limits on the shared parts (issue 52; tables in migration 0022): the request
-- rate, the QUEUED jobs and the long-lived connections one user may take. Each refusal is a
-- coded error that jobs-api answers as HTTP 429 (core/errors.py, docs/errors.md):
--   SQ429 rate_limited       over the request rate; detail: limit, window, remaining, reset,
--                            retry_after (the RateLimit and Retry-After headers)
--   SQ4QL queue_limit        over the user's QUEUED jobs limit; detail: limit, queued
--   SQ4SL too_many_streams   over the user's open streams and waits; detail: limit, open,
--                            retry_after

-- The rate is a bucket of rate_per_minute requests refilled evenly over a minute, kept as a
-- generic cell rate algorithm: one "theoretical arrival time" (tat) per user. A request may
-- pass when tat, moved on by one period (a minute / the rate), is no more than a minute
-- ahead of now; a refused request moves nothing.

CREATE OR REPLACE FUNCTION sftq.user_limits_take(
    p_user_ids       bigint[],
    p_queue          boolean DEFAULT true,
    p_now            timestamptz DEFAULT now(),
    OUT user_ids     bigint[],
    OUT err_states   text[],
    OUT err_messages text[],
    OUT err_details  text[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    -- Per distinct user of the batch, in user id order: rate, queue limit, QUEUED jobs,
    -- and what the bucket let through (NULL: no rate) and its tat after.
    v_uids     bigint[];
    v_rpm      integer[];
    v_maxq     integer[];
    v_queued   integer[];
    v_granted  integer[];
    v_tat      timestamptz[];
    v_seen     integer[];
    v_u        integer;
    v_rk       integer;
    v_after    timestamptz;
    i          integer;
BEGIN
    -- One statement (its plan kept: it runs in every POST /jobs transaction) reads each
    -- distinct user's limits and moves the buckets of those with a rate, in user id order
    -- (two batches never wait on each other in a cycle); a new bucket starts full. Then
    -- each request in the order given, in PL/pgSQL over arrays: the first `granted` of a
    -- user's requests pass the rate; of those, as many as its queue limit leaves room for
    -- pass the queue check.
    user_ids := p_user_ids;
    WITH lim AS (
        SELECT u.id AS uid, r.n, COALESCE(u.rate_per_minute, d.rate_per_minute) AS rpm,
               CASE WHEN p_queue THEN COALESCE(u.max_queued, d.max_queued) ELSE 0 END AS maxq,
               u.queued_count AS queued
          FROM (SELECT t.uid, count(*)::int AS n FROM unnest(p_user_ids) AS t(uid)
                 WHERE t.uid IS NOT NULL GROUP BY t.uid) r
          JOIN sftq.users u ON u.id = r.uid
         CROSS JOIN sftq.user_limit_defaults d
    ), took AS (
        -- Every user has a bucket (made with the user: sftq._user_rate_row); a plain UPDATE
        -- costs less than an upsert's speculative insertion. Rows in user id order.
        UPDATE sftq.user_rate b
           SET granted = LEAST(l.n, GREATEST(0, floor(
                   extract(epoch FROM p_now + interval '1 minute' - GREATEST(b.tat, p_now))
                   * l.rpm / 60.0))::int),
               tat = GREATEST(b.tat, p_now) + LEAST(l.n, GREATEST(0, floor(
                   extract(epoch FROM p_now + interval '1 minute' - GREATEST(b.tat, p_now))
                   * l.rpm / 60.0))::int) * (interval '1 minute' / l.rpm)
          FROM (SELECT * FROM lim WHERE lim.rpm > 0 ORDER BY lim.uid) l
         WHERE b.user_id = l.uid
        RETURNING b.user_id, b.granted, b.tat
    )
    SELECT array_agg(l.uid ORDER BY l.uid), array_agg(l.rpm ORDER BY l.uid),
           array_agg(l.maxq ORDER BY l.uid), array_agg(l.queued ORDER BY l.uid),
           array_agg(k.granted ORDER BY l.uid), array_agg(k.tat ORDER BY l.uid)
      INTO v_uids, v_rpm, v_maxq, v_queued, v_granted, v_tat
      FROM lim l LEFT JOIN took k ON k.user_id = l.uid;
    IF v_uids IS NULL THEN
        RETURN;  -- no known user here
    END IF;
    IF p_queue AND 0 < ANY (v_maxq) THEN
        -- Tells sftq._queue_limit_recheck, later in this transaction, that it has work.
        PERFORM pg_catalog.set_config('sftq.queue_limited', 'on', true);
    END IF;
    v_seen := array_fill(0, ARRAY[cardinality(v_uids)]);
    FOR i IN 1 .. cardinality(p_user_ids) LOOP
        CONTINUE WHEN p_user_ids[i] IS NULL;
        v_u := array_position(v_uids, p_user_ids[i]);
        CONTINUE WHEN v_u IS NULL;  -- not a user (any more): the enqueue answers that
        v_seen[v_u] := v_seen[v_u] + 1;
        v_rk := v_seen[v_u];
        IF v_rk > v_granted[v_u] THEN
            -- One more request fits when tat is no more than a minute minus a period ahead.
            v_after := v_tat[v_u] + interval '1 minute' / v_rpm[v_u] - interval '1 minute';
            user_ids[i] := NULL;
            err_states[i] := 'SQ429';
            err_messages[i] := format(
                'rate limit: this user may make %s requests a minute (POST /jobs, POST '
                '/jobs:validate, retries and MCP tool calls together); retry after %s s',
                v_rpm[v_u], sftq._seconds_until(v_after, p_now));
            err_details[i] := json_build_object(
                'limit', v_rpm[v_u], 'window', 60, 'remaining', 0,
                'reset', sftq._seconds_until(v_tat[v_u], p_now),
                'retry_after', sftq._seconds_until(v_after, p_now))::text;
        ELSIF v_maxq[v_u] > 0 AND v_queued[v_u] + v_rk > v_maxq[v_u] THEN
            user_ids[i] := NULL;
            err_states[i] := 'SQ4QL';
            err_messages[i] := format(
                'queue limit: this user may have at most %s QUEUED jobs at once and has %s; '
                'wait for some to start or end (or cancel some), then submit again',
                v_maxq[v_u], v_queued[v_u]);
            err_details[i] := json_build_object('limit', v_maxq[v_u],
                                                'queued', v_queued[v_u])::text;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sftq.user_limits_take(bigint[], boolean, timestamptz) IS
    'The per-user limits of a batch of requests (p_user_ids[i] NULL: unauthenticated, passed through): user_ids with NULL where request i is refused, and its err_state (SQ429 rate_limited, SQ4QL queue_limit, NULL when it passes), message and detail (JSON text). Counts every request of a known user against its rate (a refused one moves nothing); with p_queue, also refuses requests that would take the user past its QUEUED limit, as the queue stood when the statement began (sftq._queue_limit_recheck closes the race after the enqueue). Locking contract: inserts or updates the sftq.user_rate row of each user with a rate, in user id order, held to the end of the transaction: concurrent batches of one user queue up here. Taken before the admission gate (an exception to sftq._gate''s rule that is safe: no holder of the gate ever waits for a user_rate row).';

-- The same for a request that arrived alone (most POST /jobs at a moderate rate): plain
-- statements instead of the batch's aggregation over arrays, which cost a lone enqueue about
-- a third of its rate. The same checks, messages and details; tests/functions/test_user_limits.py
-- holds both paths to them.
CREATE OR REPLACE FUNCTION sftq._user_limit_one(
    p_user_id        bigint,
    p_queue          boolean DEFAULT true,
    p_now            timestamptz DEFAULT now(),
    OUT user_ids     bigint[],
    OUT err_states   text[],
    OUT err_messages text[],
    OUT err_details  text[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rpm      integer;
    v_maxq     integer;
    v_queued   integer;
    v_granted  integer;
    v_tat      timestamptz;
    v_after    timestamptz;
BEGIN
    user_ids := ARRAY[p_user_id];
    IF p_user_id IS NULL THEN
        RETURN;  -- not authenticated: the enqueue answers that
    END IF;
    SELECT COALESCE(u.rate_per_minute, d.rate_per_minute),
           CASE WHEN p_queue THEN COALESCE(u.max_queued, d.max_queued) ELSE 0 END,
           u.queued_count
      INTO v_rpm, v_maxq, v_queued
      FROM sftq.users u CROSS JOIN sftq.user_limit_defaults d
     WHERE u.id = p_user_id;
    IF NOT FOUND THEN
        RETURN;  -- not a user (any more): the enqueue answers that
    END IF;
    IF v_maxq > 0 THEN
        -- Tells sftq._queue_limit_recheck, later in this transaction, that it has work.
        PERFORM pg_catalog.set_config('sftq.queue_limited', 'on', true);
    END IF;
    IF v_rpm > 0 THEN
        UPDATE sftq.user_rate b
           SET granted = LEAST(1, GREATEST(0, floor(
                   extract(epoch FROM p_now + interval '1 minute' - GREATEST(b.tat, p_now))
                   * v_rpm / 60.0))::int),
               tat = GREATEST(b.tat, p_now) + LEAST(1, GREATEST(0, floor(
                   extract(epoch FROM p_now + interval '1 minute' - GREATEST(b.tat, p_now))
                   * v_rpm / 60.0))::int) * (interval '1 minute' / v_rpm)
         WHERE b.user_id = p_user_id
        RETURNING b.granted, b.tat INTO v_granted, v_tat;
        IF v_granted < 1 THEN
            v_after := v_tat + interval '1 minute' / v_rpm - interval '1 minute';
            user_ids := ARRAY[NULL::bigint];
            err_states := ARRAY['SQ429'];
            err_messages := ARRAY[format(
                'rate limit: this user may make %s requests a minute (POST /jobs, POST '
                '/jobs:validate, retries and MCP tool calls together); retry after %s s',
                v_rpm, sftq._seconds_until(v_after, p_now))];
            err_details := ARRAY[json_build_object(
                'limit', v_rpm, 'window', 60, 'remaining', 0,
                'reset', sftq._seconds_until(v_tat, p_now),
                'retry_after', sftq._seconds_until(v_after, p_now))::text];
            RETURN;
        END IF;
    END IF;
    IF v_maxq > 0 AND v_queued + 1 > v_maxq THEN
        user_ids := ARRAY[NULL::bigint];
        err_states := ARRAY['SQ4QL'];
        err_messages := ARRAY[format(
            'queue limit: this user may have at most %s QUEUED jobs at once and has %s; '
            'wait for some to start or end (or cancel some), then submit again',
            v_maxq, v_queued)];
        err_details := ARRAY[json_build_object('limit', v_maxq, 'queued', v_queued)::text];
    END IF;
END
$$;
COMMENT ON FUNCTION sftq._user_limit_one(bigint, boolean, timestamptz) IS
    'sftq.user_limits_take for a single request, in plain statements: the same answers (user_ids[1] NULL and the error when refused). Locking contract: updates the user''s sftq.user_rate row (when the user has a rate), held to the end of the transaction; reads the user row.';

-- Every user gets a bucket as they are created (the migration made those of the users before).
CREATE OR REPLACE FUNCTION sftq._user_rate_row()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO sftq.user_rate (user_id, tat, granted) VALUES (NEW.id, '-infinity', 0)
    ON CONFLICT (user_id) DO NOTHING;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._user_rate_row() IS
    'Trigger: a new user''s request-rate bucket (sftq.user_rate), full. Locking contract: inserts that one row.';
CREATE OR REPLACE TRIGGER users_rate_row AFTER INSERT ON sftq.users
    FOR EACH ROW EXECUTE FUNCTION sftq._user_rate_row();

-- Seconds from p_now until p_at, rounded up, at least 1: what Retry-After and the reset say.
CREATE OR REPLACE FUNCTION sftq._seconds_until(p_at timestamptz, p_now timestamptz)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT GREATEST(1, pg_catalog.ceil(pg_catalog.date_part('epoch', p_at - p_now))::integer)
$$;
COMMENT ON FUNCTION sftq._seconds_until(timestamptz, timestamptz) IS
    'Whole seconds from p_now until p_at, rounded up, at least 1 (Retry-After, RateLimit''s t). Inlined by the planner.';

CREATE OR REPLACE FUNCTION sftq.user_limits_check(p_user_id bigint, p_queue boolean,
                                                  p_now timestamptz DEFAULT now())
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v  record;
BEGIN
    SELECT * INTO v FROM sftq.user_limits_take(ARRAY[p_user_id], p_queue, p_now);
    IF v.err_states[1] IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v.err_states[1], MESSAGE = v.err_messages[1],
                              DETAIL = v.err_details[1];
    END IF;
END
$$;
COMMENT ON FUNCTION sftq.user_limits_check(bigint, boolean, timestamptz) IS
    'sftq.user_limits_take for one request, raising its refusal (SQ429, SQ4QL). Locking contract: as sftq.user_limits_take.';

-- The queue limit once more, after an enqueue counted its jobs: two transactions of one user
-- may both have passed sftq.user_limits_take against the same count. Called after the
-- enqueue's UPDATE of the owners' rows, which holds them (a concurrent enqueue of the same
-- user waits there and then sees this one's count): so the count read here is exact.
CREATE OR REPLACE FUNCTION sftq._queue_limit_recheck(p_owners bigint[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_max  integer;
BEGIN
    IF current_setting('sftq.queue_limited', true) IS DISTINCT FROM 'on' THEN
        RETURN;  -- sftq.user_limits_take saw no queue limit in this transaction
    END IF;
    SELECT COALESCE(u.max_queued, d.max_queued) INTO v_max
      FROM sftq.users u CROSS JOIN sftq.user_limit_defaults d
     WHERE u.id = ANY (p_owners) AND COALESCE(u.max_queued, d.max_queued) > 0
       AND u.queued_count > COALESCE(u.max_queued, d.max_queued)
     LIMIT 1;
    IF FOUND THEN
        -- The whole transaction is undone: the group commit then tries each request alone.
        RAISE EXCEPTION USING ERRCODE = 'SQ4QL',
            MESSAGE = format('queue limit: this user may have at most %s QUEUED jobs at once; '
                             'wait for some to start or end (or cancel some), then submit again',
                             v_max),
            DETAIL = json_build_object('limit', v_max)::text;
    END IF;
END
$$;
COMMENT ON FUNCTION sftq._queue_limit_recheck(bigint[]) IS
    'Raises SQ4QL when an owner now has more QUEUED jobs than its limit (a race of two enqueues that both passed sftq.user_limits_take). Does nothing unless sftq.user_limits_take saw a queue limit earlier in the transaction (the transaction-local setting sftq.queue_limited): an enqueue that did not go through the limits is not limited. Locking contract: reads the owners'' user rows, which the caller already holds (FOR NO KEY UPDATE by its counter update).';

-- Long-lived connections: a lease row per open stream or wait.
CREATE OR REPLACE FUNCTION sftq.user_lease_take(p_user_id bigint, p_lease uuid, p_kind text,
                                                p_ttl_seconds integer,
                                                p_now timestamptz DEFAULT now())
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_max   integer;
    v_open  integer;
BEGIN
    -- The user's rate row serialises the user's takes across processes (two streams opened
    -- at once must not both see one free slot).
    PERFORM 1 FROM sftq.user_rate b WHERE b.user_id = p_user_id FOR NO KEY UPDATE;
    SELECT COALESCE(u.max_streams, d.max_streams) INTO v_max
      FROM sftq.users u CROSS JOIN sftq.user_limit_defaults d WHERE u.id = p_user_id;
    DELETE FROM sftq.user_leases l WHERE l.user_id = p_user_id AND l.expires_at <= p_now;
    IF v_max > 0 THEN
        SELECT count(*) INTO v_open FROM sftq.user_leases l
         WHERE l.user_id = p_user_id AND l.expires_at > p_now;
        IF v_open >= v_max THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ4SL',
                MESSAGE = format('too many open streams: this user may hold %s SSE streams and '
                                 'MCP waits at once and holds %s; close one (or let one end), '
                                 'then try again', v_max, v_open),
                DETAIL = json_build_object('limit', v_max, 'open', v_open,
                                           'retry_after', 10)::text;
        END IF;
    END IF;
    INSERT INTO sftq.user_leases (id, user_id, kind, opened_at, expires_at)
    VALUES (p_lease, p_user_id, p_kind, p_now, p_now + make_interval(secs => p_ttl_seconds));
END
$$;
COMMENT ON FUNCTION sftq.user_lease_take(bigint, uuid, text, integer, timestamptz) IS
    'Records an open stream or wait of the user (a lease expiring after p_ttl_seconds unless renewed), or raises SQ4SL when the user already holds max_streams unexpired leases. Deletes the user''s expired leases. Locking contract: the user''s sftq.user_rate row (FOR NO KEY UPDATE), so takes of one user are serialised; then its lease rows.';

CREATE OR REPLACE FUNCTION sftq.api_lease_take(p_key_hash bytea, p_lease uuid, p_kind text,
                                               p_ttl_seconds integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._auth(p_key_hash);
BEGIN
    PERFORM sftq.user_lease_take(v_user, p_lease, p_kind, p_ttl_seconds);
    RETURN v_user;
END
$$;
COMMENT ON FUNCTION sftq.api_lease_take(bytea, uuid, text, integer) IS
    'Before a stream (GET /jobs/stream, GET /jobs/{id}/stream) or an MCP wait is held open: authenticates (SQ401), then sftq.user_lease_take (SQ4SL over the limit); answers the user id. Locking contract: as sftq.user_lease_take.';

CREATE OR REPLACE FUNCTION sftq.api_leases_renew(p_leases uuid[], p_ttl_seconds integer)
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH renewed AS (
        UPDATE sftq.user_leases l SET expires_at = now() + make_interval(secs => p_ttl_seconds)
         WHERE l.id = ANY (p_leases)
        RETURNING 1)
    SELECT count(*)::int FROM renewed
$$;
COMMENT ON FUNCTION sftq.api_leases_renew(uuid[], integer) IS
    'A process''s periodic refresh of the leases of the streams and waits it holds open; answers how many it still had. Locking contract: the named lease rows only.';

CREATE OR REPLACE FUNCTION sftq.api_leases_release(p_leases uuid[])
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM sftq.user_leases l WHERE l.id = ANY (p_leases)
$$;
COMMENT ON FUNCTION sftq.api_leases_release(uuid[]) IS
    'Frees the slots of streams and waits that ended. Locking contract: the named lease rows only.';

-- The request rate of the routes that are not an enqueue (POST /jobs:validate, MCP tool calls).
CREATE OR REPLACE FUNCTION sftq.api_rate_take(p_key_hash bytea)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM sftq.user_limits_check(sftq._auth(p_key_hash), false);
END
$$;
COMMENT ON FUNCTION sftq.api_rate_take(bytea) IS
    'POST /jobs:validate and each MCP tools/call: authenticates (SQ401), then counts one request against the user''s rate (SQ429 over it). Locking contract: as sftq.user_limits_take.';

-- The operator's side (`sftq admin set-limits`, `sftq admin list-users`).
CREATE OR REPLACE FUNCTION sftq.set_user_limits(p_user_name text, p_rate_per_minute integer,
                                                p_max_queued integer, p_max_streams integer,
                                                p_set_rate boolean, p_set_queued boolean,
                                                p_set_streams boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_rate_per_minute < 0 OR p_max_queued < 0 OR p_max_streams < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400',
            MESSAGE = 'limits are whole numbers of 0 or more (0: no limit)';
    END IF;
    IF p_user_name IS NULL THEN
        -- The defaults: never NULL (a default cannot fall back on anything).
        UPDATE sftq.user_limit_defaults d
           SET rate_per_minute = CASE WHEN p_set_rate THEN COALESCE(p_rate_per_minute, 600)
                                      ELSE d.rate_per_minute END,
               max_queued = CASE WHEN p_set_queued THEN COALESCE(p_max_queued, 0)
                                 ELSE d.max_queued END,
               max_streams = CASE WHEN p_set_streams THEN COALESCE(p_max_streams, 10)
                                  ELSE d.max_streams END;
        RETURN;
    END IF;
    UPDATE sftq.users u
       SET rate_per_minute = CASE WHEN p_set_rate THEN p_rate_per_minute ELSE u.rate_per_minute END,
           max_queued = CASE WHEN p_set_queued THEN p_max_queued ELSE u.max_queued END,
           max_streams = CASE WHEN p_set_streams THEN p_max_streams ELSE u.max_streams END
     WHERE u.name = p_user_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = format('user %s not found', p_user_name);
    END IF;
END
$$;
COMMENT ON FUNCTION sftq.set_user_limits(text, integer, integer, integer, boolean, boolean, boolean) IS
    'Sets a user''s limits (p_user_name) or the defaults (p_user_name NULL): each limit whose p_set_* is true takes its value (NULL: back to the default; for the defaults, back to the built-in one; 0: no limit). Takes effect at the user''s next request. Locking contract: the user row (or the defaults row) only; no gate (admission does not read these).';

CREATE OR REPLACE FUNCTION sftq.user_limits_list()
RETURNS TABLE (name text, rate_per_minute integer, max_queued integer, max_streams integer,
               rate_is_default boolean, queued_is_default boolean, streams_is_default boolean,
               open_streams integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT u.name, COALESCE(u.rate_per_minute, d.rate_per_minute),
           COALESCE(u.max_queued, d.max_queued), COALESCE(u.max_streams, d.max_streams),
           u.rate_per_minute IS NULL, u.max_queued IS NULL, u.max_streams IS NULL,
           (SELECT count(*)::int FROM sftq.user_leases l
             WHERE l.user_id = u.id AND l.expires_at > now())
      FROM sftq.users u CROSS JOIN sftq.user_limit_defaults d
    UNION ALL
    SELECT NULL, d.rate_per_minute, d.max_queued, d.max_streams, true, true, true, NULL
      FROM sftq.user_limit_defaults d
$$;
COMMENT ON FUNCTION sftq.user_limits_list() IS
    'Each user''s limits in effect (their own or the default; 0: none), whether each is the default, and their open streams and waits; plus one row with name NULL: the defaults. Reads only.';
