-- The HTTP API's entry points: one call per request. Each authenticates the key hash
-- and answers the response body as JSON text, so the web layer does not re-shape rows.
-- SECURITY DEFINER so the API's login role needs EXECUTE on these and nothing else.

CREATE OR REPLACE FUNCTION sftq.api_enqueue(
    p_key_hash         bytea,
    p_kind             text,
    p_payload          jsonb,
    p_display_name     text,
    p_gpu_count        integer,
    p_idempotency_key  text)
RETURNS TABLE (body json, replayed boolean, job_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._auth(p_key_hash);
    v_row  record;
BEGIN
    SELECT * INTO v_row FROM sftq.enqueue(v_user, p_kind, p_payload, p_display_name,
                                          p_gpu_count, p_idempotency_key);
    body := json_build_object('id', v_row.id, 'kind', v_row.kind, 'state', v_row.state,
                              'created_at', sftq._iso(v_row.created_at));
    replayed := v_row.replayed;
    job_id := v_row.id;
    RETURN NEXT;
END
$$;

-- The 201 body of POST /jobs, from an enqueue's row (NULL for a request that failed). No SET
-- clause and a single expression, so the planner inlines it into the calling query instead
-- of calling a function per row (search_path does not matter: every name is qualified or
-- from pg_catalog).
CREATE OR REPLACE FUNCTION sftq._enqueue_body(p_id uuid, p_kind text, p_state text,
                                              p_created_at timestamptz, p_err_state text)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_err_state IS NULL THEN
               pg_catalog.json_build_object(
                   'id', p_id, 'kind', p_kind, 'state', p_state,
                   'created_at', pg_catalog.to_char(p_created_at AT TIME ZONE 'UTC',
                                                    'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))::text END
$$;
COMMENT ON FUNCTION sftq._enqueue_body(uuid, text, text, timestamptz, text) IS
    'The 201 body of POST /jobs ({id, kind, state, created_at}) for an enqueue''s row, NULL when it failed. Inlined by the planner (no SET clause on purpose).';

CREATE OR REPLACE FUNCTION sftq.api_submit_many(
    p_key_hashes             bytea[],
    p_kinds                  text[],
    p_payloads               jsonb[],
    p_display_names          text[],
    p_gpu_counts             integer[],
    p_idempotency_keys       text[],
    p_queue_timeouts         integer[],
    p_default_queue_timeout  integer)
RETURNS TABLE (ord integer, body text, replayed boolean, job_id uuid,
               err_state text, err_message text, err_detail text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- POST /jobs for the requests one server process received together (group commit): one
    -- round trip and one transaction, each request with its own answer, key and FIFO place.
    -- PL/pgSQL rather than SQL, so that its plan is kept for the session. A request that
    -- arrived alone takes the single-job path (sftq._enqueue_one), as a lone enqueue did
    -- before batches (a UNION ALL of both paths behind one-time filters measured 20% more
    -- instructions for it than this branch).
    -- The per-user limits first (sql/procedures/195_user_limits.sql): a refused request
    -- enters the enqueue without a user, so nothing is written for it, and answers the
    -- limit's error (lim.err_*[ord]) instead of the missing user's.
    IF cardinality(p_key_hashes) = 1 THEN
        RETURN QUERY
            SELECT e.ord, sftq._enqueue_body(e.id, e.kind, e.state, e.created_at, e.err_state),
                   e.replayed, e.id, COALESCE(lim.err_states[1], e.err_state),
                   COALESCE(lim.err_messages[1], e.err_message),
                   COALESCE(lim.err_details[1], e.err_detail)
              FROM sftq._user_limit_one(sftq.authenticate(p_key_hashes[1])) lim,
                   sftq._enqueue_one(lim.user_ids[1], p_kinds[1], p_payloads[1],
                                     p_display_names[1], p_gpu_counts[1], p_idempotency_keys[1],
                                     p_queue_timeouts[1], NULL, p_default_queue_timeout, NULL) e;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT e.ord, sftq._enqueue_body(e.id, e.kind, e.state, e.created_at, e.err_state),
               e.replayed, e.id, COALESCE(lim.err_states[e.ord], e.err_state),
               COALESCE(lim.err_messages[e.ord], e.err_message),
               COALESCE(lim.err_details[e.ord], e.err_detail)
          FROM sftq.user_limits_take(sftq.authenticate_many(p_key_hashes)) lim,
               sftq.enqueue_many(lim.user_ids, p_kinds, p_payloads,
                                 p_display_names, p_gpu_counts, p_idempotency_keys,
                                 p_queue_timeouts, NULL, p_default_queue_timeout) e;
END
$$;

CREATE OR REPLACE FUNCTION sftq.api_list_jobs(
    p_key_hash  bytea,
    p_state     text,
    p_kind      text,
    p_limit     integer,
    p_cursor    text)
RETURNS TABLE (body json, next_cursor text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user      bigint := sftq._auth(p_key_hash);
    v_after_at  timestamptz;
    v_after_id  uuid;
    v_rows      sftq.jobs[];
    v_n         integer;
BEGIN
    IF p_cursor IS NOT NULL THEN
        -- Cursor: "<created_at in epoch microseconds>_<job id hex>", opaque to clients.
        IF p_cursor !~ '^[0-9]{1,17}_[0-9a-f]{32}$' THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'cursor is not valid; use the X-Next-Cursor value of the previous page';
        END IF;
        v_after_at := timestamptz 'epoch' + split_part(p_cursor, '_', 1)::bigint * interval '1 microsecond';
        v_after_id := split_part(p_cursor, '_', 2)::uuid;
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'limit must be between 1 and 1000';
    END IF;
    SELECT array_agg(j ORDER BY j.created_at DESC, j.id DESC) INTO v_rows
      FROM sftq.list_jobs(v_user, p_state, p_kind, p_limit, v_after_at, v_after_id) j;
    v_n := COALESCE(array_length(v_rows, 1), 0);
    -- A full page has a next one only if one more row follows its last: probe for it rather
    -- than asking list_jobs for limit + 1 rows, which it refuses at the maximum limit (1000).
    IF v_n = p_limit AND EXISTS (
            SELECT 1 FROM sftq.list_jobs(v_user, p_state, p_kind, 1,
                                         v_rows[v_n].created_at, v_rows[v_n].id)) THEN
        next_cursor := (extract(epoch FROM v_rows[v_n].created_at) * 1000000)::bigint::text
                       || '_' || replace(v_rows[v_n].id::text, '-', '');
    END IF;
    SELECT COALESCE(json_agg(sftq.job_json(r) ORDER BY r.created_at DESC, r.id DESC), '[]'::json)
      INTO body FROM unnest(v_rows) r;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION sftq.api_get_job(p_key_hash bytea, p_job_id uuid)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.job_json(sftq.get_job(sftq._auth(p_key_hash), p_job_id))
$$;

CREATE OR REPLACE FUNCTION sftq.api_cancel_job(p_key_hash bytea, p_job_id uuid)
RETURNS TABLE (body json, action text, kind text, fireworks_job_name text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._auth(p_key_hash);
    v_row  record;
BEGIN
    SELECT * INTO v_row FROM sftq.cancel(v_user, p_job_id);
    body := sftq.job_json(sftq.get_job(v_user, p_job_id));
    action := v_row.action;
    kind := v_row.kind;
    fireworks_job_name := v_row.fireworks_job_name;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION sftq.api_complete_cancel(p_key_hash bytea, p_job_id uuid)
RETURNS json
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._auth(p_key_hash);
BEGIN
    PERFORM sftq.get_job(v_user, p_job_id);  -- owner check first
    PERFORM sftq.complete_cancel(p_job_id, 'user:' || (SELECT name FROM sftq.users WHERE id = v_user),
                                 '{"via": "api"}'::jsonb);
    RETURN sftq.job_json(sftq.get_job(v_user, p_job_id));
END
$$;

CREATE OR REPLACE FUNCTION sftq.api_queue_context(p_key_hash bytea)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.queue_context(sftq._auth(p_key_hash))
$$;

CREATE OR REPLACE FUNCTION sftq.api_summary(p_key_hash bytea)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.summary(sftq._auth(p_key_hash))
$$;

CREATE OR REPLACE FUNCTION sftq.api_job_analytics(p_key_hash bytea, p_job_id uuid)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.job_analytics(sftq._auth(p_key_hash), p_job_id)
$$;

-- The analytics entry points with the deployment's tick interval and usage grace (the
-- waiting reasons and estimates need them); the forms above use the defaults.
CREATE OR REPLACE FUNCTION sftq.api_queue_context(p_key_hash bytea, p_tick_interval interval,
                                                  p_usage_grace interval)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.queue_context(sftq._auth(p_key_hash), now(), p_tick_interval, p_usage_grace)
$$;

CREATE OR REPLACE FUNCTION sftq.api_job_analytics(p_key_hash bytea, p_job_id uuid,
                                                  p_tick_interval interval, p_usage_grace interval)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.job_analytics(sftq._auth(p_key_hash), p_job_id, now(), p_tick_interval, p_usage_grace)
$$;

CREATE OR REPLACE FUNCTION sftq.api_health()
RETURNS json
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT json_build_object('database', 'ok',
                             'last_tick', (SELECT sftq._iso(max(started_at)) FROM sftq.scheduler_ticks),
                             'provider', sftq.provider_health())
$$;

COMMENT ON FUNCTION sftq.api_enqueue(bytea, text, jsonb, text, integer, text) IS 'POST /jobs. Authenticates, then sftq.enqueue; answers the 201 body and whether it was an idempotent replay.';
COMMENT ON FUNCTION sftq.api_submit_many(bytea[], text[], jsonb[], text[], integer[], text[], integer[], integer) IS 'POST /jobs for several requests at once (group commit): sftq.authenticate_many, then sftq.enqueue_many; one row per request in the order given, with the 201 body and whether it replayed an Idempotency-Key, or the error that request gets (err_state: SQ400, SQ401, SQ419, or a per-user limit''s SQ429, SQ4QL). Locking contract: the key rows authenticate_many touches (never waited for), the callers'' sftq.user_rate rows (sftq.user_limits_take, or sftq._user_limit_one for a lone request), then as sftq.enqueue_many.';
COMMENT ON FUNCTION sftq.api_list_jobs(bytea, text, text, integer, text) IS 'GET /jobs. Authenticates, then one keyset page of sftq.list_jobs and the next cursor (NULL on the last page).';
COMMENT ON FUNCTION sftq.api_get_job(bytea, uuid) IS 'GET /jobs/:id. SQ404 when not the caller''s.';
COMMENT ON FUNCTION sftq.api_cancel_job(bytea, uuid) IS 'DELETE /jobs/:id, first half: sftq.cancel plus the job as it now is.';
COMMENT ON FUNCTION sftq.api_complete_cancel(bytea, uuid) IS 'DELETE /jobs/:id, second half, after the provider confirmed the stop.';
COMMENT ON FUNCTION sftq.api_queue_context(bytea) IS 'GET /jobs/analytics/queue.';
COMMENT ON FUNCTION sftq.api_summary(bytea) IS 'GET /jobs/analytics/summary.';
COMMENT ON FUNCTION sftq.api_job_analytics(bytea, uuid) IS 'GET /jobs/:id/analytics.';
COMMENT ON FUNCTION sftq.api_queue_context(bytea, interval, interval) IS 'GET /jobs/analytics/queue with the deployment''s tick interval and usage grace.';
COMMENT ON FUNCTION sftq.api_job_analytics(bytea, uuid, interval, interval) IS 'GET /jobs/:id/analytics with the deployment''s tick interval and usage grace.';
COMMENT ON FUNCTION sftq.api_health() IS 'Health probe: the database answers; when the last tick started; whether the provider accepts our credentials (sftq.provider_health).';

-- Replaced by sftq.authenticate skipping its last_used_at touch in a read-only transaction.
DROP FUNCTION IF EXISTS sftq._auth_read(bytea);
