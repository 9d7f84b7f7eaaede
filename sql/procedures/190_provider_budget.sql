-- One provider budget for the whole deployment (issue 52, item 2; table comments in
-- 0021_provider_budget.sql). functions/sftq_server/budget.py is the one caller: the provider
-- client asks sftq.provider_budget_take before every call, in one round trip that also
-- records what earlier calls of the process answered.
--
-- The window: a call is granted only while the calls granted in the current second and the
-- 61 before it stay under the share. Any 60 s of the provider's clock then sees at most
-- FIREWORKS_RPM of our calls, even when a request reaches it up to a second after its grant.

CREATE OR REPLACE FUNCTION sftq._provider_budget_record(
    p_counts   jsonb,
    p_lookups  jsonb,
    p_now      timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Calls by source, call and status: [{source, call, status, count}, ...]. The tick's own
    -- come with its record (sftq.tick_finish), never here.
    IF jsonb_typeof(p_counts) = 'array' AND jsonb_array_length(p_counts) > 0 THEN
        INSERT INTO sftq.metric_counts (name, labels, value)
        SELECT 'provider_requests_total',
               jsonb_build_object('source', r ->> 'source', 'call', r ->> 'call',
                                  'status', r ->> 'status'),
               (r ->> 'count')::float8
          FROM jsonb_array_elements(p_counts) r
         WHERE r ->> 'source' IN ('preflight', 'validate', 'mcp', 'cancel')
           AND r ->> 'call' IS NOT NULL AND r ->> 'status' IS NOT NULL
           AND (r ->> 'count') ~ '^[0-9]{1,9}$';
    END IF;
    -- What lookups learned: {name: [verdict, detail], ...}; the newest answer wins.
    IF jsonb_typeof(p_lookups) = 'object' THEN
        INSERT INTO sftq.provider_lookups AS l (name, verdict, detail, checked_at)
        SELECT e.key, e.value ->> 0, left(coalesce(e.value ->> 1, ''), 500), p_now
          FROM jsonb_each(p_lookups) e
         WHERE e.value ->> 0 IN ('missing', 'doubtful', 'ok') AND char_length(e.key) <= 200
        ON CONFLICT (name) DO UPDATE
           SET verdict = excluded.verdict, detail = excluded.detail,
               checked_at = excluded.checked_at
         WHERE l.checked_at <= excluded.checked_at;
    END IF;
END
$$;
COMMENT ON FUNCTION sftq._provider_budget_record(jsonb, jsonb, timestamptz) IS
    'Appends provider call counts (sources other than the tick) to sftq.metric_counts and upserts lookups into sftq.provider_lookups. Locking contract: appends never wait; an upsert locks one lookup row.';

CREATE OR REPLACE FUNCTION sftq.provider_budget_take(
    p_source          text,
    p_call            text,
    p_user            bytea,
    p_rpm             integer,
    p_tick_reserve    float8,
    p_user_share      float8,
    p_counts          jsonb DEFAULT NULL,
    p_lookups         jsonb DEFAULT NULL,
    p_window_seconds  integer DEFAULT 60,
    p_now             timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_class     text := CASE WHEN p_source IN ('tick', 'cancel') THEN 'tick' ELSE 'lookup' END;
    v_user      bytea := CASE WHEN v_class = 'lookup' THEN coalesce(p_user, '\x'::bytea)
                              ELSE '\x'::bytea END;
    v_sec       bigint := floor(extract(epoch FROM p_now))::bigint;
    v_from      bigint;
    v_hold      timestamptz;
    v_rpm       integer := greatest(coalesce(p_rpm, 1), 1);
    v_lookups   integer;
    v_per_user  integer;
    v_total     integer;
    v_lookup    integer;
    v_mine      integer;
    v_oldest    bigint;
    v_why       text;
BEGIN
    IF p_source IS NULL OR p_source NOT IN ('tick', 'preflight', 'validate', 'mcp', 'cancel') THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400',
            MESSAGE = 'source must be one of tick, preflight, validate, mcp, cancel';
    END IF;
    IF p_window_seconds IS NULL OR p_window_seconds < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'window must be at least 1 second';
    END IF;
    v_from := v_sec - p_window_seconds - 1;
    -- A user's share is the user's, however many keys they hold: the key's hash stands for
    -- its user (a hash no key has stays itself).
    IF v_class = 'lookup' AND v_user <> '\x'::bytea THEN
        SELECT coalesce((SELECT int8send(k.user_id) FROM sftq.api_keys k
                          WHERE k.key_hash = v_user), v_user)
          INTO v_user;
    END IF;
    PERFORM sftq._provider_budget_record(p_counts, p_lookups, p_now);

    -- Every take of every process queues here, for the few microseconds of its count.
    SELECT b.hold_until INTO v_hold FROM sftq.provider_budget b WHERE b.id FOR UPDATE;
    IF v_hold > p_now THEN
        IF v_class = 'lookup' THEN
            PERFORM sftq._provider_budget_record(jsonb_build_array(jsonb_build_object(
                'source', p_source, 'call', p_call, 'status', 'not_sent', 'count', 1)),
                NULL, p_now);
        END IF;
        RETURN jsonb_build_object('ok', false,
                                  'hold', extract(epoch FROM v_hold - p_now)::float8);
    END IF;

    DELETE FROM sftq.provider_budget_use u WHERE u.second < v_from;
    SELECT coalesce(sum(u.n), 0),
           coalesce(sum(u.n) FILTER (WHERE u.class = 'lookup'), 0),
           coalesce(sum(u.n) FILTER (WHERE u.class = 'lookup' AND u.user_key = v_user), 0)
      INTO v_total, v_lookup, v_mine
      FROM sftq.provider_budget_use u
     WHERE u.second >= v_from;

    -- The tick's reserve is never lent to lookups; a user may take a share of the rest.
    v_lookups := floor(v_rpm * (1 - least(greatest(coalesce(p_tick_reserve, 0.5), 0), 1)))::integer;
    v_per_user := CASE WHEN v_lookups < 1 THEN 0
                       ELSE greatest(1, floor(v_lookups * least(greatest(
                                coalesce(p_user_share, 1), 0), 1))::integer) END;
    v_why := CASE
        WHEN v_total >= v_rpm THEN format('all %s calls a minute (FIREWORKS_RPM) are taken', v_rpm)
        WHEN v_class = 'lookup' AND v_lookup >= v_lookups THEN
            format('the lookups'' share, %s calls a minute (FIREWORKS_RPM less '
                   'SFTQ_PROVIDER_TICK_RESERVE), is taken', v_lookups)
        WHEN v_class = 'lookup' AND v_mine >= v_per_user THEN
            format('your share of the lookups, %s calls a minute (SFTQ_PROVIDER_USER_SHARE), '
                   'is taken', v_per_user)
    END;
    IF v_why IS NOT NULL THEN
        -- A slot frees when the oldest second that counts against this share leaves.
        SELECT min(u.second) INTO v_oldest FROM sftq.provider_budget_use u
         WHERE u.second >= v_from
           AND (v_total >= v_rpm OR u.class = 'lookup')
           AND (v_total >= v_rpm OR v_lookup >= v_lookups OR u.user_key = v_user);
        IF v_class = 'lookup' THEN
            PERFORM sftq._provider_budget_record(jsonb_build_array(jsonb_build_object(
                'source', p_source, 'call', p_call, 'status', 'over_budget', 'count', 1)),
                NULL, p_now);
        END IF;
        RETURN jsonb_build_object(
            'ok', false, 'why', v_why,
            'wait', greatest(0.001, coalesce(v_oldest, v_sec) + p_window_seconds + 2
                                    - extract(epoch FROM p_now)::float8));
    END IF;

    INSERT INTO sftq.provider_budget_use AS u (second, class, user_key, n)
    VALUES (v_sec, v_class, v_user, 1)
    ON CONFLICT (second, class, user_key) DO UPDATE SET n = u.n + 1;
    RETURN jsonb_build_object('ok', true);
END
$$;
COMMENT ON FUNCTION sftq.provider_budget_take(text, text, bytea, integer, float8, float8, jsonb, jsonb, integer, timestamptz) IS
    'One provider call''s slot: {"ok": true} (granted, counted), {"ok": false, "hold": s} (a 429''s Retry-After holds every call s more seconds) or {"ok": false, "wait": s, "why": text} (the share is spent; a slot frees in about s). Shares: the tick (and cancels) up to p_rpm calls in any window; lookups (preflight, validate, mcp) up to p_rpm x (1 - p_tick_reserve), each user up to p_user_share of that. Also records p_counts and p_lookups (sftq._provider_budget_record) and a refused lookup''s count. Locking contract: locks the one sftq.provider_budget row for the rest of its own transaction (one statement): takes of every process run one at a time; nothing else waits on it.';

CREATE OR REPLACE FUNCTION sftq.provider_budget_hold(
    p_seconds  float8,
    p_counts   jsonb DEFAULT NULL,
    p_lookups  jsonb DEFAULT NULL,
    p_now      timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_until  timestamptz;
BEGIN
    IF p_seconds IS NULL OR p_seconds <> p_seconds OR p_seconds < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'seconds must be a number >= 0';
    END IF;
    PERFORM sftq._provider_budget_record(p_counts, p_lookups, p_now);
    UPDATE sftq.provider_budget b
       SET hold_until = greatest(coalesce(b.hold_until, p_now),
                                 p_now + make_interval(secs => least(p_seconds, 900)))
     WHERE b.id
    RETURNING b.hold_until INTO v_until;
    RETURN v_until;
END
$$;
COMMENT ON FUNCTION sftq.provider_budget_hold(float8, jsonb, jsonb, timestamptz) IS
    'A 429 with this Retry-After (capped at 900 s) seen by any process: no provider call of any process is granted before it ends. Answers when the hold ends. Locking contract: updates the one sftq.provider_budget row (waits for a take in progress).';

CREATE OR REPLACE FUNCTION sftq.provider_budget_flush(
    p_counts   jsonb DEFAULT NULL,
    p_lookups  jsonb DEFAULT NULL,
    p_now      timestamptz DEFAULT now())
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq._provider_budget_record(p_counts, p_lookups, p_now)
$$;
COMMENT ON FUNCTION sftq.provider_budget_flush(jsonb, jsonb, timestamptz) IS
    'Records the calls and lookups a process has not reported with a take yet (at the end of a pre-flight check). Locking contract: as sftq._provider_budget_record.';

CREATE OR REPLACE FUNCTION sftq.provider_lookups_get(
    p_names        text[],
    p_ttl_seconds  float8,
    p_now          timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(jsonb_object_agg(l.name, jsonb_build_array(l.verdict, l.detail)), '{}')
      FROM sftq.provider_lookups l
     WHERE l.name = ANY (p_names)
       AND l.checked_at > p_now - make_interval(secs => greatest(coalesce(p_ttl_seconds, 0), 0))
$$;
COMMENT ON FUNCTION sftq.provider_lookups_get(text[], float8, timestamptz) IS
    'What any process learned of these resources within the last p_ttl_seconds: {name: [verdict, detail]}. Reads only.';

CREATE OR REPLACE FUNCTION sftq.provider_backoff_until(p_now timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- The shared hold (a 429 any process met, sftq.provider_budget_hold), and what the last
    -- few finished ticks recorded: each one that meets a 429 records its Retry-After, and
    -- one that starts inside it records the same end again.
    SELECT max(u.until)
      FROM (SELECT (t.detail ->> 'provider_backoff_until')::timestamptz AS until
              FROM (SELECT detail FROM sftq.scheduler_ticks
                     WHERE finished_at IS NOT NULL ORDER BY id DESC LIMIT 5) t
            UNION ALL
            SELECT b.hold_until FROM sftq.provider_budget b) u
    HAVING max(u.until) > p_now
$$;
COMMENT ON FUNCTION sftq.provider_backoff_until(timestamptz) IS
    'When the provider''s last Retry-After ends (a 429 that any process met, or that a recent tick recorded), NULL when none is running: until then a tick makes no provider call, and sftq.provider_budget_take grants none. Reads only.';

CREATE OR REPLACE FUNCTION sftq.provider_budget_usage(p_window_seconds integer DEFAULT 60,
                                                      p_now timestamptz DEFAULT now())
RETURNS TABLE (total integer, tick integer, lookup integer)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(sum(u.n), 0)::integer,
           coalesce(sum(u.n) FILTER (WHERE u.class = 'tick'), 0)::integer,
           coalesce(sum(u.n) FILTER (WHERE u.class = 'lookup'), 0)::integer
      FROM sftq.provider_budget_use u
     WHERE u.second >= floor(extract(epoch FROM p_now))::bigint - greatest(p_window_seconds, 1) - 1
$$;
COMMENT ON FUNCTION sftq.provider_budget_usage(integer, timestamptz) IS
    'The provider calls granted in the window sftq.provider_budget_take counts (the last p_window_seconds + 1 seconds): all of them, the tick''s (and cancels''), and users'' lookups. Early ticks and reconcile passes go only while the tick''s part leaves room in its reserve for the periodic tick (sftq_server.scheduler.wake). Reads only; no locks.';
