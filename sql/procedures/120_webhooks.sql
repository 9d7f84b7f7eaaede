-- Webhooks: endpoints, the outbox written with every job event, and the deliverers' side
-- (claim, record an attempt, the retry schedule, disabling). Python (sftq_server.webhooks)
-- checks destinations, signs and sends; every decision about what happens next is here.

-- ---------------------------------------------------------------------------------------
-- event -> webhook type
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION sftq.webhook_type(p_event text, p_to_state text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Terminal types follow the state reached, whatever the event is called (failed,
    -- submission_rejected, queue_timeout, reconciled, ...), so renamed or new event types
    -- cannot drop a notification.
    SELECT CASE p_to_state
               WHEN 'SUCCESS' THEN 'job.succeeded'
               WHEN 'FAIL' THEN 'job.failed'
               WHEN 'CANCELLED' THEN 'job.cancelled'
               ELSE CASE p_event WHEN 'queued' THEN 'job.queued'
                                 WHEN 'admitted' THEN 'job.admitted' END
           END
$$;
COMMENT ON FUNCTION sftq.webhook_type(text, text) IS
    'The webhook type of a job event, or NULL when the event is not one: queued -> job.queued, admitted -> job.admitted, any event reaching SUCCESS / FAIL / CANCELLED -> job.succeeded / job.failed / job.cancelled.';

CREATE OR REPLACE FUNCTION sftq.webhook_event_types()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ARRAY['job.queued', 'job.admitted', 'job.succeeded', 'job.failed', 'job.cancelled',
                 'job.*']
$$;
COMMENT ON FUNCTION sftq.webhook_event_types() IS 'The event names an endpoint may subscribe to (job.* = all).';

-- ---------------------------------------------------------------------------------------
-- the outbox
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION sftq._webhook_outbox()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Its reads of sftq.jobs by id stay index lookups even when a session plans them on a
-- nearly empty table (see sql/procedures/005_event_log.sql).
SET enable_seqscan = off
AS $$
DECLARE
    v_count  integer;
    v_user   bigint;
    v_type   text;
    v_body   text;
BEGIN
    -- The cheap part, paid by every user: the owner's endpoint count, through two primary
    -- keys whose pages this transaction has just touched. Users without endpoints stop here.
    SELECT u.webhook_count, u.id INTO v_count, v_user
      FROM sftq.jobs j JOIN sftq.users u ON u.id = j.user_id
     WHERE j.id = NEW.job_id;
    IF v_count IS NULL OR v_count = 0 THEN
        RETURN NULL;
    END IF;
    v_type := sftq.webhook_type(NEW.event, NEW.to_state);
    IF v_type IS NULL OR NOT EXISTS (
            SELECT 1 FROM sftq.webhook_endpoints e
             WHERE e.user_id = v_user AND e.disabled_at IS NULL
               AND (v_type = ANY (e.events) OR 'job.*' = ANY (e.events))) THEN
        RETURN NULL;
    END IF;
    -- The job as it is right now, inside the event's transaction: the record at the event.
    SELECT json_build_object('type', v_type, 'timestamp', sftq._iso(NEW.at),
                             'data', sftq.job_json(j))::text
      INTO v_body
      FROM sftq.jobs j WHERE j.id = NEW.job_id;
    INSERT INTO sftq.webhook_deliveries (endpoint_id, webhook_id, event_id, job_id, type, body)
    SELECT e.id, 'msg_' || replace(gen_random_uuid()::text, '-', ''), NEW.id, NEW.job_id,
           v_type, v_body
      FROM sftq.webhook_endpoints e
     WHERE e.user_id = v_user AND e.disabled_at IS NULL
       AND (v_type = ANY (e.events) OR 'job.*' = ANY (e.events))
     ORDER BY e.created_at, e.id;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._webhook_outbox() IS
    'AFTER INSERT trigger on sftq.job_events: writes one sftq.webhook_deliveries row per enabled, subscribed endpoint of the job''s owner, in the event''s own transaction (the outbox). Reads users.webhook_count first, so users without endpoints pay one lookup. Locking contract: takes no row locks (reads the job, user and endpoint rows; inserts new rows only), so it adds no lock to the transitions that fire it. SECURITY DEFINER: the roles that write events need no rights on the webhook tables.';

-- The WHEN clause is evaluated without calling the function: provider_state, submitted,
-- submit_retry and the like never pay for the trigger at all.
CREATE OR REPLACE TRIGGER job_events_webhooks
    AFTER INSERT ON sftq.job_events
    FOR EACH ROW
    WHEN (NEW.event IN ('queued', 'admitted') OR NEW.to_state IN ('SUCCESS', 'FAIL', 'CANCELLED'))
    EXECUTE FUNCTION sftq._webhook_outbox();

-- ---------------------------------------------------------------------------------------
-- endpoints
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION sftq.webhook_endpoint_json(e sftq.webhook_endpoints)
RETURNS json
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT json_build_object(
        'id', e.id, 'url', e.url, 'events', to_json(e.events), 'description', e.description,
        'enabled', e.disabled_at IS NULL, 'created_at', sftq._iso(e.created_at),
        'disabled_at', sftq._iso(e.disabled_at), 'disabled_reason', e.disabled_reason)
$$;
COMMENT ON FUNCTION sftq.webhook_endpoint_json(sftq.webhook_endpoints) IS
    'An endpoint as the API shows it: never the secret.';

CREATE OR REPLACE FUNCTION sftq.webhook_create(
    p_user_id        bigint,
    p_id             uuid,
    p_url            text,
    p_events         text[],
    p_description    text,
    p_secret_sealed  text,
    p_now            timestamptz DEFAULT clock_timestamp())
RETURNS sftq.webhook_endpoints
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_events  text[];
    v_row     sftq.webhook_endpoints;
BEGIN
    -- The functions check all of this first with friendlier messages; this is the floor.
    IF p_url IS NULL OR p_url !~ '^https?://[^[:space:]]+$' OR char_length(p_url) > 2048 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'url must be an https:// URL of at most 2048 characters';
    END IF;
    SELECT array_agg(DISTINCT t ORDER BY t) INTO v_events FROM unnest(p_events) t;
    IF v_events IS NULL OR NOT v_events <@ sftq.webhook_event_types() THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400',
            MESSAGE = 'events must be a non-empty list of: ' || array_to_string(sftq.webhook_event_types(), ', ');
    END IF;
    IF char_length(p_description) > 500 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'description must be at most 500 characters';
    END IF;
    IF p_secret_sealed IS NULL OR p_secret_sealed = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'a sealed secret is required';
    END IF;
    -- The user row lock makes the cap exact under concurrent creates.
    UPDATE sftq.users SET webhook_count = webhook_count + 1
     WHERE id = p_user_id AND webhook_count < 10;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ440',
            MESSAGE = 'a user may have at most 10 webhook endpoints; delete one first (DELETE /webhooks/{id})';
    END IF;
    -- Keep the caller's order (job.* stays job.*), without duplicates.
    SELECT array_agg(t ORDER BY first) INTO v_events
      FROM (SELECT t, min(ord) AS first FROM unnest(p_events) WITH ORDINALITY AS u(t, ord)
             GROUP BY t) s;
    INSERT INTO sftq.webhook_endpoints (id, user_id, url, events, description, secret_sealed, created_at)
    VALUES (p_id, p_user_id, p_url, v_events, p_description, p_secret_sealed, p_now)
    RETURNING * INTO v_row;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION sftq.webhook_create(bigint, uuid, text, text[], text, text, timestamptz) IS
    'Adds an endpoint (at most 10 per user: SQ440). p_secret_sealed is the signing secret as the functions sealed it. Locking contract: the owner''s user row (webhook_count), then the new row.';

CREATE OR REPLACE FUNCTION sftq.webhook_get(p_user_id bigint, p_id uuid)
RETURNS sftq.webhook_endpoints
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row sftq.webhook_endpoints;
BEGIN
    -- Owner-scoped: another user's endpoint is "not found", so its existence does not leak.
    SELECT * INTO v_row FROM sftq.webhook_endpoints WHERE id = p_id AND user_id = p_user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'webhook endpoint not found';
    END IF;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION sftq.webhook_get(bigint, uuid) IS 'One of the caller''s endpoints; SQ404 when it does not exist or is not theirs. Reads only.';

CREATE OR REPLACE FUNCTION sftq.webhook_delete(p_user_id bigint, p_id uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM sftq.webhook_endpoints WHERE id = p_id AND user_id = p_user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'webhook endpoint not found';
    END IF;
    UPDATE sftq.users SET webhook_count = webhook_count - 1 WHERE id = p_user_id;
    -- Its deliveries and attempts are not touched here: a deliverer recording an attempt
    -- holds a delivery row and then wants the endpoint row, so deleting them under the
    -- endpoint lock could deadlock. Nothing can reach them any more (every read goes through
    -- an endpoint of the caller's); the next claim fails what was waiting, and
    -- sftq.webhook_prune removes them.
END
$$;
COMMENT ON FUNCTION sftq.webhook_delete(bigint, uuid) IS
    'Deletes one of the caller''s endpoints (SQ404 when not theirs); its deliveries become unreachable and are failed by the next claim and pruned later. Locking contract: the endpoint row, then the owner''s user row.';

CREATE OR REPLACE FUNCTION sftq.webhook_send_test(p_user_id bigint, p_id uuid,
                                                  p_now timestamptz DEFAULT clock_timestamp())
RETURNS sftq.webhook_deliveries
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_endpoint  sftq.webhook_endpoints := sftq.webhook_get(p_user_id, p_id);
    v_row       sftq.webhook_deliveries;
BEGIN
    IF v_endpoint.disabled_at IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ441',
            MESSAGE = format('this endpoint is disabled (%s); delete it and add it again', v_endpoint.disabled_reason);
    END IF;
    INSERT INTO sftq.webhook_deliveries (endpoint_id, webhook_id, type, body, created_at, next_attempt_at)
    VALUES (p_id, 'msg_' || replace(gen_random_uuid()::text, '-', ''), 'webhook.test',
            json_build_object('type', 'webhook.test', 'timestamp', sftq._iso(p_now),
                              'data', json_build_object(
                                  'webhook_endpoint_id', p_id,
                                  'message', 'a test delivery from finetune-queue'))::text,
            p_now, p_now)
    RETURNING * INTO v_row;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION sftq.webhook_send_test(bigint, uuid, timestamptz) IS
    'Queues a webhook.test delivery to one of the caller''s enabled endpoints (SQ441 when disabled). Tried once, never retried. Locking contract: none beyond the new row.';

-- ---------------------------------------------------------------------------------------
-- the retry schedule
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION sftq.webhook_retry_at(p_created timestamptz, p_failures integer,
                                                 p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- After the 1st, 2nd, ... failed attempt: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, then daily,
    -- the last one clipped to 3 days after the event; at 3 days, give up (NULL).
    SELECT CASE WHEN p_now >= p_created + interval '3 days' THEN NULL
                ELSE least(p_now + CASE p_failures
                                       WHEN 1 THEN interval '5 seconds'
                                       WHEN 2 THEN interval '5 minutes'
                                       WHEN 3 THEN interval '30 minutes'
                                       WHEN 4 THEN interval '2 hours'
                                       WHEN 5 THEN interval '5 hours'
                                       WHEN 6 THEN interval '10 hours'
                                       ELSE interval '1 day' END,
                           p_created + interval '3 days') END
$$;
COMMENT ON FUNCTION sftq.webhook_retry_at(timestamptz, integer, timestamptz) IS
    'When to try a delivery again after its n-th failed attempt: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, then every day, the last try at 3 days after the delivery was written; NULL once 3 days have passed (give up).';

CREATE OR REPLACE FUNCTION sftq._webhook_disable(p_endpoint_id uuid, p_reason text, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE sftq.webhook_endpoints
       SET disabled_at = p_now, disabled_reason = left(p_reason, 500)
     WHERE id = p_endpoint_id AND disabled_at IS NULL;
    IF FOUND THEN
        -- What was still waiting will not be sent: say so where the user looks.
        UPDATE sftq.webhook_deliveries
           SET state = 'failed', completed_at = p_now, lease_token = NULL,
               last_error = 'not sent: the endpoint was disabled'
         WHERE endpoint_id = p_endpoint_id AND state = 'pending' AND lease_token IS NULL;
    END IF;
END
$$;
COMMENT ON FUNCTION sftq._webhook_disable(uuid, text, timestamptz) IS
    'Disables an endpoint with a visible reason and fails its waiting deliveries (those a deliverer holds finish their attempt). Locking contract: the endpoint row, then its unheld pending delivery rows.';

-- ---------------------------------------------------------------------------------------
-- deliverers
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION sftq.webhook_claim(
    p_limit         integer,
    p_per_endpoint  integer DEFAULT 4,
    p_lease         interval DEFAULT interval '60 seconds',
    p_now           timestamptz DEFAULT clock_timestamp())
RETURNS TABLE (delivery_id bigint, lease_token uuid, endpoint_id uuid, url text,
               secret_sealed text, webhook_id text, type text, body text, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_per_endpoint IS NULL OR p_per_endpoint < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'limit and per-endpoint limit must be at least 1';
    END IF;
    RETURN QUERY
    WITH busy AS (
        -- Held right now by some deliverer (any process): the per-endpoint bound counts them.
        SELECT d.endpoint_id, count(*)::integer AS n
          FROM sftq.webhook_deliveries d
         WHERE d.lease_token IS NOT NULL AND d.state = 'pending' AND d.next_attempt_at > p_now
         GROUP BY d.endpoint_id
    ), due AS (
        SELECT d.id, d.endpoint_id, d.next_attempt_at,
               e.id IS NOT NULL AND e.disabled_at IS NULL AS live
          FROM sftq.webhook_deliveries d
          LEFT JOIN sftq.webhook_endpoints e ON e.id = d.endpoint_id
         WHERE d.state = 'pending' AND d.next_attempt_at <= p_now
           AND NOT EXISTS (SELECT 1 FROM busy b
                            WHERE b.endpoint_id = d.endpoint_id AND b.n >= p_per_endpoint)
         ORDER BY d.next_attempt_at, d.id
         LIMIT p_limit * 4
         FOR UPDATE OF d SKIP LOCKED
    ), ranked AS (
        SELECT due.id, due.live, due.next_attempt_at,
               row_number() OVER (PARTITION BY due.endpoint_id ORDER BY due.next_attempt_at, due.id)
                 + COALESCE(b.n, 0) AS slot
          FROM due LEFT JOIN busy b ON b.endpoint_id = due.endpoint_id
    ), dropped AS (
        -- Written for an endpoint that was disabled or deleted in the meantime.
        UPDATE sftq.webhook_deliveries d
           SET state = 'failed', completed_at = p_now, lease_token = NULL,
               last_error = 'not sent: the endpoint was disabled or deleted'
          FROM ranked r
         WHERE d.id = r.id AND NOT r.live
    ), picked AS (
        SELECT r.id FROM ranked r
         WHERE r.live AND r.slot <= p_per_endpoint
         ORDER BY r.next_attempt_at, r.id
         LIMIT p_limit
    )
    UPDATE sftq.webhook_deliveries d
       SET lease_token = gen_random_uuid(), next_attempt_at = p_now + p_lease
      FROM picked, sftq.webhook_endpoints e
     WHERE d.id = picked.id AND e.id = d.endpoint_id
    RETURNING d.id, d.lease_token, d.endpoint_id, e.url, e.secret_sealed, d.webhook_id, d.type,
              d.body, d.attempts + 1;
END
$$;
COMMENT ON FUNCTION sftq.webhook_claim(integer, integer, interval, timestamptz) IS
    'Hands a deliverer up to p_limit due deliveries, at most p_per_endpoint held at once per endpoint across all deliverers, with a lease: the row''s next_attempt_at moves to now + p_lease, so if the deliverer dies the row is due again then (at least once). Locking contract: FOR UPDATE SKIP LOCKED on due delivery rows in (next_attempt_at, id) order, so any number of deliverers run side by side without waiting on each other; locks released at commit, the lease_token marks the hold after that.';

CREATE OR REPLACE FUNCTION sftq.webhook_record_attempt(
    p_delivery_id   bigint,
    p_lease_token   uuid,
    p_status_code   integer,
    p_error         text,
    p_duration_ms   integer,
    p_attempted_at  timestamptz DEFAULT NULL,
    p_now           timestamptz DEFAULT clock_timestamp())
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_d        sftq.webhook_deliveries;
    v_ok       boolean := p_status_code BETWEEN 200 AND 299;
    v_retry    boolean := p_status_code IS NULL OR p_status_code = 429
                          OR p_status_code BETWEEN 500 AND 599;
    v_outcome  text;
    v_next     timestamptz;
    v_error    text := left(p_error, 1000);
BEGIN
    SELECT * INTO v_d FROM sftq.webhook_deliveries WHERE id = p_delivery_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'gone';  -- the endpoint was deleted meanwhile
    END IF;
    IF v_d.state <> 'pending' OR v_d.lease_token IS DISTINCT FROM p_lease_token THEN
        -- Our lease ran out and another deliverer took the row (or finished it). A success
        -- still counts: the receiver has it. Anything else is history only.
        IF v_ok AND v_d.state = 'pending' THEN
            UPDATE sftq.webhook_deliveries
               SET state = 'succeeded', completed_at = p_now, lease_token = NULL,
                   attempts = attempts + 1, last_status = p_status_code, last_error = NULL
             WHERE id = p_delivery_id;
        END IF;
        INSERT INTO sftq.webhook_attempts (delivery_id, endpoint_id, attempt, attempted_at,
                                           status_code, duration_ms, error, outcome)
        VALUES (p_delivery_id, v_d.endpoint_id, v_d.attempts + 1, COALESCE(p_attempted_at, p_now),
                p_status_code, p_duration_ms, v_error,
                CASE WHEN v_ok THEN 'succeeded' ELSE 'failed' END);
        RETURN 'stale';
    END IF;

    IF v_ok THEN
        v_outcome := 'succeeded';
    ELSIF v_retry AND v_d.type <> 'webhook.test' THEN
        v_next := sftq.webhook_retry_at(v_d.created_at, v_d.attempts + 1, p_now);
        v_outcome := CASE WHEN v_next IS NULL THEN 'failed' ELSE 'retrying' END;
    ELSE
        v_outcome := 'failed';
    END IF;

    UPDATE sftq.webhook_deliveries
       SET attempts = attempts + 1, lease_token = NULL, last_status = p_status_code,
           last_error = v_error,
           state = CASE WHEN v_outcome = 'retrying' THEN 'pending' ELSE v_outcome END,
           completed_at = CASE WHEN v_outcome = 'retrying' THEN NULL ELSE p_now END,
           next_attempt_at = COALESCE(v_next, next_attempt_at)
     WHERE id = p_delivery_id;
    INSERT INTO sftq.webhook_attempts (delivery_id, endpoint_id, attempt, attempted_at,
                                       status_code, duration_ms, error, outcome, next_retry_at)
    VALUES (p_delivery_id, v_d.endpoint_id, v_d.attempts + 1, COALESCE(p_attempted_at, p_now),
            p_status_code, p_duration_ms, v_error, v_outcome, v_next);

    IF p_status_code = 410 THEN
        PERFORM sftq._webhook_disable(v_d.endpoint_id,
            format('the receiver answered 410 Gone to %s at %s', v_d.webhook_id, sftq._iso(p_now)),
            p_now);
        RETURN 'disabled';
    ELSIF v_outcome = 'failed' AND v_retry AND v_d.type <> 'webhook.test' THEN
        PERFORM sftq._webhook_disable(v_d.endpoint_id,
            format('gave up on %s after %s attempts over 3 days; last error: %s',
                   v_d.webhook_id, v_d.attempts + 1,
                   COALESCE(v_error, 'HTTP ' || p_status_code)),
            p_now);
        RETURN 'disabled';
    END IF;
    RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION sftq.webhook_record_attempt(bigint, uuid, integer, text, integer, timestamptz, timestamptz) IS
    'Records one attempt and decides what follows. 2xx: succeeded. No answer (timeout, connection error, refused destination), 429 or 5xx: retried per sftq.webhook_retry_at, and after 3 days the endpoint is disabled. 410: failed, endpoint disabled at once. Any other status: failed, not retried. webhook.test deliveries are never retried. A holder whose lease ran out only adds history (a success still completes the row). Answers succeeded | retrying | failed | disabled | stale | gone. Locking contract: the delivery row, then (when disabling) its endpoint row and that endpoint''s unheld pending rows.';

CREATE OR REPLACE FUNCTION sftq.webhook_prune(p_before timestamptz, p_batch integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_attempts  integer;
    v_done      integer;
    v_orphans   integer;
BEGIN
    DELETE FROM sftq.webhook_attempts
     WHERE id IN (SELECT id FROM sftq.webhook_attempts WHERE attempted_at < p_before
                   LIMIT p_batch);
    GET DIAGNOSTICS v_attempts = ROW_COUNT;
    DELETE FROM sftq.webhook_deliveries
     WHERE id IN (SELECT id FROM sftq.webhook_deliveries
                   WHERE state <> 'pending' AND completed_at < p_before LIMIT p_batch);
    GET DIAGNOSTICS v_done = ROW_COUNT;
    -- Rows left behind by an endpoint deleted while their event's transaction was open.
    DELETE FROM sftq.webhook_deliveries d
     WHERE d.id IN (SELECT x.id FROM sftq.webhook_deliveries x
                     WHERE x.created_at < p_before
                       AND NOT EXISTS (SELECT 1 FROM sftq.webhook_endpoints e WHERE e.id = x.endpoint_id)
                     LIMIT p_batch);
    GET DIAGNOSTICS v_orphans = ROW_COUNT;
    RETURN v_attempts + v_done + v_orphans;
END
$$;
COMMENT ON FUNCTION sftq.webhook_prune(timestamptz, integer) IS
    'Deletes attempts and finished deliveries older than p_before, and deliveries of deleted endpoints, at most p_batch of each per call; answers how many rows went. Locking contract: row locks on what it deletes only; never touches pending deliveries of live endpoints.';

CREATE OR REPLACE FUNCTION sftq.webhook_deliveries_json(p_endpoint_id uuid, p_limit integer)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT COALESCE(json_agg(x.item ORDER BY x.at DESC, x.ord DESC), '[]'::json)
      FROM (
        SELECT * FROM (
            SELECT a.attempted_at AS at, a.id AS ord,
                   json_build_object('webhook_id', d.webhook_id, 'type', d.type, 'job_id', d.job_id,
                       'attempt', a.attempt, 'outcome', a.outcome, 'status_code', a.status_code,
                       'duration_ms', a.duration_ms, 'error', a.error,
                       'created_at', sftq._iso(d.created_at),
                       'attempted_at', sftq._iso(a.attempted_at),
                       'next_retry_at', sftq._iso(a.next_retry_at)) AS item
              FROM sftq.webhook_attempts a
              JOIN sftq.webhook_deliveries d ON d.id = a.delivery_id
             WHERE a.endpoint_id = p_endpoint_id
             ORDER BY a.id DESC
             LIMIT p_limit) attempts
        UNION ALL
        SELECT * FROM (
            -- Written and not tried yet (or being tried right now): pending; or dropped
            -- untried because the endpoint was disabled: failed, with the reason in error.
            SELECT d.created_at AS at, 0 AS ord,
                   json_build_object('webhook_id', d.webhook_id, 'type', d.type, 'job_id', d.job_id,
                       'attempt', 0, 'outcome', d.state, 'status_code', NULL::integer,
                       'duration_ms', NULL::integer, 'error', d.last_error,
                       'created_at', sftq._iso(d.created_at), 'attempted_at', NULL::text,
                       'next_retry_at', CASE WHEN d.lease_token IS NULL
                                             THEN sftq._iso(d.next_attempt_at) END) AS item
              FROM sftq.webhook_deliveries d
             WHERE d.endpoint_id = p_endpoint_id AND d.attempts = 0
             ORDER BY d.id DESC
             LIMIT p_limit) waiting
        ORDER BY 1 DESC, 2 DESC
        LIMIT p_limit) x
$$;
COMMENT ON FUNCTION sftq.webhook_deliveries_json(uuid, integer) IS
    'An endpoint''s recent attempts, and the deliveries not tried yet, newest first (at most p_limit). Reads only.';

-- ---------------------------------------------------------------------------------------
-- the HTTP API's entry points (see 100_api.sql for the pattern)
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION sftq.api_webhook_create(
    p_key_hash bytea, p_id uuid, p_url text, p_events text[], p_description text,
    p_secret_sealed text)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.webhook_endpoint_json(sftq.webhook_create(
        sftq._auth(p_key_hash), p_id, p_url, p_events, p_description, p_secret_sealed))
$$;

CREATE OR REPLACE FUNCTION sftq.api_webhook_precheck(p_key_hash bytea)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._auth(p_key_hash);  -- once, whatever the users table holds
BEGIN
    IF (SELECT webhook_count FROM sftq.users WHERE id = v_user) >= 10 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ440',
            MESSAGE = 'a user may have at most 10 webhook endpoints; delete one first (DELETE /webhooks/{id})';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION sftq.api_webhook_list(p_key_hash bytea)
RETURNS json
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Authenticated once, before the scan: a user without endpoints still gets a 401 for a
    -- bad key, and the key is not checked once per row.
    v_user bigint := sftq._auth(p_key_hash);
BEGIN
    RETURN (SELECT COALESCE(json_agg(sftq.webhook_endpoint_json(e)
                                     ORDER BY e.created_at DESC, e.id DESC), '[]'::json)
              FROM sftq.webhook_endpoints e
             WHERE e.user_id = v_user);
END
$$;

CREATE OR REPLACE FUNCTION sftq.api_webhook_get(p_key_hash bytea, p_id uuid)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.webhook_endpoint_json(sftq.webhook_get(sftq._auth(p_key_hash), p_id))
$$;

CREATE OR REPLACE FUNCTION sftq.api_webhook_delete(p_key_hash bytea, p_id uuid)
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.webhook_delete(sftq._auth(p_key_hash), p_id)
$$;

CREATE OR REPLACE FUNCTION sftq.api_webhook_test(p_key_hash bytea, p_id uuid)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT json_build_object('webhook_id', d.webhook_id, 'type', d.type, 'job_id', d.job_id,
                             'attempt', 0, 'outcome', 'pending', 'status_code', NULL::integer,
                             'duration_ms', NULL::integer, 'error', NULL::text,
                             'created_at', sftq._iso(d.created_at), 'attempted_at', NULL::text,
                             'next_retry_at', sftq._iso(d.next_attempt_at))
      FROM sftq.webhook_send_test(sftq._auth(p_key_hash), p_id) d
$$;

CREATE OR REPLACE FUNCTION sftq.api_webhook_deliveries(p_key_hash bytea, p_id uuid, p_limit integer)
RETURNS json
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_endpoint sftq.webhook_endpoints := sftq.webhook_get(sftq._auth(p_key_hash), p_id);
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'limit must be between 1 and 200';
    END IF;
    RETURN sftq.webhook_deliveries_json(v_endpoint.id, p_limit);
END
$$;

COMMENT ON FUNCTION sftq.api_webhook_create(bytea, uuid, text, text[], text, text) IS 'POST /webhooks: authenticates, then sftq.webhook_create; the endpoint without its secret (the function adds the secret to this one answer).';
COMMENT ON FUNCTION sftq.api_webhook_precheck(bytea) IS 'POST /webhooks, first step: authenticates and checks the cap before the function resolves the URL, so strangers cannot make this server look names up.';
COMMENT ON FUNCTION sftq.api_webhook_list(bytea) IS 'GET /webhooks: the caller''s endpoints, newest first.';
COMMENT ON FUNCTION sftq.api_webhook_get(bytea, uuid) IS 'GET /webhooks/:id. SQ404 when not the caller''s.';
COMMENT ON FUNCTION sftq.api_webhook_delete(bytea, uuid) IS 'DELETE /webhooks/:id. SQ404 when not the caller''s.';
COMMENT ON FUNCTION sftq.api_webhook_test(bytea, uuid) IS 'POST /webhooks/:id/test: queues a webhook.test delivery and answers it (pending).';
COMMENT ON FUNCTION sftq.api_webhook_deliveries(bytea, uuid, integer) IS 'GET /webhooks/:id/deliveries: recent attempts, newest first.';
