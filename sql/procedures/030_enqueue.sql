-- Enqueue: sftq.enqueue_many does the work for any number of jobs in one transaction (the
-- group commit of POST /jobs); sftq.enqueue is the same for one job, raising its error.

-- The signature grew a queue timeout and retry_of (issue 10): drop the old one.
DROP FUNCTION IF EXISTS sftq.enqueue(bigint, text, jsonb, text, integer, text, timestamptz);

-- What a request to enqueue is refused for before anything is written (NULL: nothing), and
-- the hash an Idempotency-Key's replay is compared with: one definition for the single-job
-- path and the batch. Single-expression SQL functions without a SET clause, so the planner
-- inlines them into the calling statement; every function is qualified (search_path does not
-- matter).
CREATE OR REPLACE FUNCTION sftq._enqueue_refusal(p_user_id bigint, p_kind text, p_payload jsonb,
                                                 p_display_name text, p_gpus integer,
                                                 p_timeout integer)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_user_id IS NULL THEN 'missing, unknown or revoked API key'
                WHEN p_kind IS NULL OR p_kind NOT IN ('SFT', 'DPO', 'RFT')
                    THEN 'kind must be one of SFT, DPO, RFT'
                WHEN p_payload IS NULL THEN 'fireworks_payload is required'
                WHEN pg_catalog.jsonb_typeof(p_payload) <> 'object'
                    THEN 'fireworks_payload must be a JSON object'
                WHEN p_gpus NOT BETWEEN 1 AND 64 THEN 'gpu_count must be an integer from 1 to 64'
                WHEN pg_catalog.char_length(p_display_name) > 256
                    THEN 'display_name must be at most 256 characters'
                WHEN p_timeout NOT BETWEEN 1 AND 2592000
                    THEN 'queue_timeout_seconds must be an integer from 1 to 2592000 (30 days)'
           END
$$;
COMMENT ON FUNCTION sftq._enqueue_refusal(bigint, text, jsonb, text, integer, integer) IS
    'Why an enqueue request is refused before anything is written (the 400/401 message), NULL when it is not; p_gpus and p_timeout with their defaults applied. Inlined by the planner.';

-- What the caller asked for: the operator's default timeout is not part of it, and a request
-- without the newer fields hashes as it did before they existed.
CREATE OR REPLACE FUNCTION sftq._request_hash(p_kind text, p_payload jsonb, p_display_name text,
                                              p_gpus integer, p_asked_timeout integer,
                                              p_retry_of uuid)
RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.sha256(pg_catalog.convert_to(
        CASE WHEN p_asked_timeout IS NULL AND p_retry_of IS NULL
             THEN pg_catalog.jsonb_build_array(p_kind, p_payload, p_display_name, p_gpus)
             ELSE pg_catalog.jsonb_build_array(p_kind, p_payload, p_display_name, p_gpus,
                      pg_catalog.jsonb_build_object('queue_timeout_seconds', p_asked_timeout,
                                                    'retry_of', p_retry_of)) END::text, 'UTF8'))
$$;
COMMENT ON FUNCTION sftq._request_hash(text, jsonb, text, integer, integer, uuid) IS
    'The request hash stored with an Idempotency-Key (jobs.request_hash): what the caller asked for, p_gpus with its default applied. Inlined by the planner.';

CREATE OR REPLACE FUNCTION sftq._enqueue_one(
    p_user_id                bigint,
    p_kind                   text,
    p_payload                jsonb,
    p_display_name           text,
    p_gpu_count              integer,
    p_idempotency_key        text,
    p_queue_timeout_seconds  integer,
    p_retry_of               uuid,
    p_default_queue_timeout  integer,
    p_now                    timestamptz)
RETURNS TABLE (ord integer, id uuid, kind text, state text, created_at timestamptz,
               replayed boolean, err_state text, err_message text, err_detail text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id       uuid := gen_random_uuid();
    v_created  timestamptz;
    v_hash     bytea;
    v_old      sftq.jobs;
    v_gpus     integer := COALESCE(p_gpu_count, 4);
    v_name     text;
    v_timeout  integer := COALESCE(p_queue_timeout_seconds, p_default_queue_timeout);
    v_bad      text;
BEGIN
    -- sftq.enqueue_many for one request, in plain statements: a batch's set-based statement
    -- costs more to set up than it saves for a single job (a lone POST /jobs, sftq.enqueue).
    -- The same checks, in the same order, with the same answers; tests/sql/test_enqueue_many.py
    -- compares the two on random requests.
    ord := 1;
    replayed := false;
    v_bad := sftq._enqueue_refusal(p_user_id, p_kind, p_payload, p_display_name, v_gpus, v_timeout);
    IF v_bad IS NOT NULL THEN
        err_state := CASE WHEN p_user_id IS NULL THEN 'SQ401' ELSE 'SQ400' END;
        err_message := v_bad;
        RETURN NEXT;
        RETURN;
    END IF;

    PERFORM sftq._gate();

    IF NOT EXISTS (SELECT 1 FROM sftq.users u WHERE u.id = p_user_id AND u.disabled_at IS NULL) THEN
        err_state := 'SQ401';
        err_message := 'user not found or disabled';
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_idempotency_key IS NOT NULL THEN
        v_hash := sftq._request_hash(p_kind, p_payload, p_display_name, v_gpus,
                                     p_queue_timeout_seconds, p_retry_of);
    END IF;

    v_created := COALESCE(p_now, clock_timestamp());
    INSERT INTO sftq.jobs AS j (id, user_id, kind, display_name, gpu_count, fireworks_payload,
                                created_at, idempotency_key, request_hash,
                                queue_timeout_seconds, queue_expires_at, retry_of)
    VALUES (v_id, p_user_id, p_kind, p_display_name, v_gpus, p_payload,
            v_created, p_idempotency_key, v_hash,
            v_timeout, v_created + make_interval(secs => v_timeout), p_retry_of)
    ON CONFLICT (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;

    IF NOT FOUND THEN
        -- The same key was used before (or concurrently, now committed).
        SELECT * INTO v_old FROM sftq.jobs j
         WHERE j.user_id = p_user_id AND j.idempotency_key = p_idempotency_key;
        IF NOT FOUND THEN  -- the conflicting job vanished: jobs are never deleted
            RAISE EXCEPTION 'Idempotency-Key % conflicted with no job', p_idempotency_key;
        END IF;
        IF v_old.request_hash IS DISTINCT FROM v_hash THEN
            err_state := 'SQ419';
            err_message := 'this Idempotency-Key was already used with a different request body';
            err_detail := json_build_object('job_id', v_old.id)::text;
        ELSE
            id := v_old.id; kind := p_kind; state := v_old.state;
            created_at := v_old.created_at; replayed := true;
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;

    UPDATE sftq.users u
       SET queued_count = u.queued_count + 1,
           sft_count = u.sft_count + (p_kind = 'SFT')::int,
           dpo_count = u.dpo_count + (p_kind = 'DPO')::int,
           rft_count = u.rft_count + (p_kind = 'RFT')::int,
           head_job_id = CASE WHEN u.head_job_id IS NULL OR (u.head_created_at, u.head_job_id) > (v_created, v_id)
                              THEN v_id ELSE u.head_job_id END,
           head_created_at = CASE WHEN u.head_job_id IS NULL OR (u.head_created_at, u.head_job_id) > (v_created, v_id)
                                  THEN v_created ELSE u.head_created_at END
     WHERE u.id = p_user_id AND u.disabled_at IS NULL
    RETURNING u.name INTO v_name;
    IF NOT FOUND THEN  -- disabled since the check above: as a batch, refused whole
        RAISE EXCEPTION USING ERRCODE = 'SQ401', MESSAGE = 'user not found or disabled';
    END IF;
    PERFORM sftq._queue_limit_recheck(ARRAY[p_user_id]);  -- 195_user_limits.sql
    PERFORM sftq._event(v_id, v_created, 'user:' || v_name, 'queued', 'QUEUED',
                        CASE WHEN p_retry_of IS NOT NULL
                             THEN jsonb_build_object('retry_of', p_retry_of) END);
    IF p_now IS NOT NULL THEN
        PERFORM sftq._queue_joined_sealed(ARRAY[v_created], ARRAY[v_id]);
    END IF;
    id := v_id; kind := p_kind; state := 'QUEUED'; created_at := v_created;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION sftq._enqueue_one(bigint, text, jsonb, text, integer, text, integer, uuid, integer, timestamptz) IS
    'sftq.enqueue_many for a single request, in plain statements (cheaper to run than the set-based batch for one job); the same answers. Locking contract: admission gate (shared), the new job row, then the owner''s user row.';

CREATE OR REPLACE FUNCTION sftq.enqueue_many(
    p_user_ids               bigint[],
    p_kinds                  text[],
    p_payloads               jsonb[],
    p_display_names          text[],
    p_gpu_counts             integer[],
    p_idempotency_keys       text[],
    p_queue_timeouts         integer[],
    p_retry_of               uuid[] DEFAULT NULL,
    p_default_queue_timeout  integer DEFAULT NULL,
    p_now                    timestamptz DEFAULT NULL)
RETURNS TABLE (ord integer, id uuid, kind text, state text, created_at timestamptz,
               replayed boolean, err_state text, err_message text, err_detail text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n          integer := COALESCE(cardinality(p_user_ids), 0);
    v_retry    uuid[] := COALESCE(p_retry_of, array_fill(NULL::uuid, ARRAY[n]));
    v_base     timestamptz;
    -- Per request, in the order given: the job (new or replayed), its created_at, and its
    -- error; v_isnew: the request made a new job; v_hash: its Idempotency-Key's body hash.
    v_ids      uuid[];
    v_created  timestamptz[];
    v_err      text[];
    v_msg      text[];
    v_detail   text[];
    v_isnew    boolean[];
    v_owners   bigint[];
    v_updated  integer;
    v_hash     bytea[];
    v_ev_ids   uuid[];
    v_ev_at    timestamptz[];
    v_ev_by    text[];
    v_ev_det   jsonb[];
    v_old_id   uuid;
    v_old_at   timestamptz;
    v_differs  boolean;
    i          integer;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF n = 1 THEN
        RETURN QUERY SELECT * FROM sftq._enqueue_one(
            p_user_ids[1], p_kinds[1], p_payloads[1], p_display_names[1], p_gpu_counts[1],
            p_idempotency_keys[1], p_queue_timeouts[1], v_retry[1], p_default_queue_timeout, p_now);
        RETURN;
    END IF;
    -- The shared gate first: admit (exclusive) then sees every enqueue that got a
    -- created_at before it decided, so no earlier job can appear behind its back.
    PERFORM sftq._gate();
    -- clock_timestamp(), not now(): taken after the gate, so FIFO order follows the moment of
    -- enqueue rather than the start of a long transaction. Requests of one batch are a
    -- microsecond apart, in the order given: each keeps its own place.
    v_base := COALESCE(p_now, clock_timestamp());

    -- One statement inserts the jobs of every request (the per-statement cost of the table,
    -- its constraints and indexes, is paid once): each request checked on its own (a bad
    -- one gets its error and the others go on), an Idempotency-Key used before inserting
    -- nothing (answered below).
    WITH items AS (
        SELECT t.o::int AS o, t.uid, t.kind, t.payload, t.name, COALESCE(t.gpus, 4) AS gpus,
               t.idem, t.timeout AS asked_timeout,
               COALESCE(t.timeout, p_default_queue_timeout) AS timeout, t.retry_of,
               sftq._enqueue_refusal(t.uid, t.kind, t.payload, t.name, COALESCE(t.gpus, 4),
                                     COALESCE(t.timeout, p_default_queue_timeout)) AS bad
          FROM unnest(p_user_ids, p_kinds, p_payloads, p_display_names, p_gpu_counts,
                      p_idempotency_keys, p_queue_timeouts, v_retry)
               WITH ORDINALITY AS t(uid, kind, payload, name, gpus, idem, timeout, retry_of, o)
    ), owners AS (
        SELECT u.id, u.name FROM sftq.users u
         WHERE u.id IN (SELECT i.uid FROM items i WHERE i.bad IS NULL) AND u.disabled_at IS NULL
    ), ok AS (
        SELECT i.o, i.uid, i.kind, i.payload, i.name, i.gpus, i.idem, i.timeout, i.retry_of,
               gen_random_uuid() AS id,
               v_base + (row_number() OVER (ORDER BY i.o) - 1) * interval '1 microsecond' AS created,
               CASE WHEN i.idem IS NOT NULL
                    THEN sftq._request_hash(i.kind, i.payload, i.name, i.gpus, i.asked_timeout,
                                            i.retry_of) END AS hash
          FROM items i JOIN owners w ON w.id = i.uid
         WHERE i.bad IS NULL
    ), ins AS (
        INSERT INTO sftq.jobs AS j (id, user_id, kind, display_name, gpu_count, fireworks_payload,
                                    created_at, idempotency_key, request_hash,
                                    queue_timeout_seconds, queue_expires_at, retry_of)
        SELECT ok.id, ok.uid, ok.kind, ok.name, ok.gpus, ok.payload, ok.created, ok.idem, ok.hash,
               ok.timeout, ok.created + make_interval(secs => ok.timeout), ok.retry_of
          FROM ok ORDER BY ok.o
        ON CONFLICT (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING j.id, j.user_id, j.kind, j.created_at
    )
    -- Every array in request order: the aggregates read one sorted input (an aggregate fed
    -- by a sorted subquery keeps its order) rather than sorting once each. New jobs'
    -- created_at follow request order too, so the events come out in FIFO order.
    SELECT array_agg(r.id), array_agg(r.created), array_agg(r.err), array_agg(r.msg),
           array_agg(r.isnew), array_agg(r.hash),
           array_agg(r.id) FILTER (WHERE r.isnew), array_agg(r.created) FILTER (WHERE r.isnew),
           array_agg('user:' || r.owner) FILTER (WHERE r.isnew),
           array_agg(CASE WHEN r.retry_of IS NOT NULL THEN jsonb_build_object('retry_of', r.retry_of) END)
               FILTER (WHERE r.isnew)
      INTO v_ids, v_created, v_err, v_msg, v_isnew, v_hash, v_ev_ids, v_ev_at, v_ev_by, v_ev_det
      FROM (SELECT ok.id, ok.created, ok.hash, i.retry_of, w.name AS owner,
                   ins.id IS NOT NULL AS isnew,
                   CASE WHEN i.bad IS NULL AND ok.o IS NULL THEN 'SQ401'
                        WHEN i.bad IS NOT NULL THEN CASE WHEN i.uid IS NULL THEN 'SQ401' ELSE 'SQ400' END
                   END AS err,
                   CASE WHEN i.bad IS NULL AND ok.o IS NULL THEN 'user not found or disabled'
                        ELSE i.bad END AS msg
              FROM items i
              LEFT JOIN ok ON ok.o = i.o
              LEFT JOIN ins ON ins.id = ok.id
              LEFT JOIN owners w ON w.id = i.uid
             ORDER BY i.o) r;

    IF v_ev_ids IS NOT NULL THEN
        -- The owners' counters and heads (admission reads them instead of the queue), after
        -- the jobs, as every procedure takes a job row before its owner's: several owners in
        -- id order, so two batches never wait on each other in a cycle. An owner disabled
        -- since the check above refuses the whole batch (SQ401): the caller retries each
        -- request alone, and that owner's are refused.
        SELECT array_agg(DISTINCT t.uid) INTO v_owners
          FROM unnest(p_user_ids, v_isnew) AS t(uid, isnew) WHERE t.isnew;
        IF cardinality(v_owners) > 1 THEN
            PERFORM 1 FROM sftq.users u WHERE u.id = ANY (v_owners) ORDER BY u.id
               FOR NO KEY UPDATE;
        END IF;
        UPDATE sftq.users u
           SET queued_count = u.queued_count + a.jobs,
               sft_count = u.sft_count + a.sft,
               dpo_count = u.dpo_count + a.dpo,
               rft_count = u.rft_count + a.rft,
               head_job_id = CASE WHEN u.head_job_id IS NULL
                                       OR (u.head_created_at, u.head_job_id) > (a.first_at, a.first_id)
                                  THEN a.first_id ELSE u.head_job_id END,
               head_created_at = CASE WHEN u.head_job_id IS NULL
                                           OR (u.head_created_at, u.head_job_id) > (a.first_at, a.first_id)
                                      THEN a.first_at ELSE u.head_created_at END
          FROM (SELECT t.uid, count(*)::int AS jobs,
                       count(*) FILTER (WHERE t.kind = 'SFT')::int AS sft,
                       count(*) FILTER (WHERE t.kind = 'DPO')::int AS dpo,
                       count(*) FILTER (WHERE t.kind = 'RFT')::int AS rft,
                       min(t.created) AS first_at,
                       (array_agg(t.id ORDER BY t.created, t.id))[1] AS first_id
                  FROM unnest(v_ids, p_user_ids, p_kinds, v_created, v_isnew)
                       AS t(id, uid, kind, created, isnew)
                 WHERE t.isnew
                 GROUP BY t.uid) a
         WHERE u.id = a.uid AND u.disabled_at IS NULL;
        GET DIAGNOSTICS v_updated = ROW_COUNT;
        IF v_updated < cardinality(v_owners) THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ401', MESSAGE = 'user not found or disabled';
        END IF;
        PERFORM sftq._queue_limit_recheck(v_owners);  -- 195_user_limits.sql

        -- Each new job's first event (queued; detail.retry_of for a retry).
        PERFORM sftq._event_many(v_ev_ids, v_ev_at, v_ev_by, 'queued', 'QUEUED', v_ev_det);
        -- A given clock may lie before the queue's seal (sql/procedures/062_queue_buckets.sql):
        -- then the jobs join their stretches' counts. A job enqueued now never does.
        IF p_now IS NOT NULL THEN
            PERFORM sftq._queue_joined_sealed(v_ev_at, v_ev_ids);
        END IF;
    END IF;

    -- Replays: the same key with the same body answers the first job; another body, SQ419.
    -- A new statement, so it sees a job a concurrent transaction committed with the same key.
    v_detail := array_fill(NULL::text, ARRAY[n]);
    FOR i IN 1 .. n LOOP
        IF v_ids[i] IS NOT NULL AND NOT v_isnew[i] THEN
            SELECT j.id, j.created_at, j.request_hash IS DISTINCT FROM v_hash[i]
              INTO v_old_id, v_old_at, v_differs
              FROM sftq.jobs j
             WHERE j.user_id = p_user_ids[i] AND j.idempotency_key = p_idempotency_keys[i];
            IF NOT FOUND THEN  -- the conflicting job vanished: jobs are never deleted
                RAISE EXCEPTION 'Idempotency-Key % conflicted with no job', p_idempotency_keys[i];
            END IF;
            IF v_differs THEN
                v_err[i] := 'SQ419';
                v_msg[i] := 'this Idempotency-Key was already used with a different request body';
                v_detail[i] := json_build_object('job_id', v_old_id)::text;
                v_ids[i] := NULL;
                v_created[i] := NULL;
            ELSE
                v_ids[i] := v_old_id;
                v_created[i] := v_old_at;
            END IF;
        END IF;
    END LOOP;

    FOR i IN 1 .. n LOOP
        ord := i;
        id := v_ids[i];
        kind := CASE WHEN v_ids[i] IS NOT NULL THEN p_kinds[i] END;
        state := CASE WHEN v_isnew[i] THEN 'QUEUED' END;
        IF v_ids[i] IS NOT NULL AND NOT v_isnew[i] THEN  -- a replay: the job as it is now
            SELECT j.state INTO state FROM sftq.jobs j WHERE j.id = v_ids[i];
        END IF;
        created_at := CASE WHEN v_ids[i] IS NOT NULL THEN v_created[i] END;
        replayed := v_ids[i] IS NOT NULL AND NOT v_isnew[i];
        err_state := v_err[i];
        err_message := v_msg[i];
        err_detail := v_detail[i];
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sftq.enqueue_many(bigint[], text[], jsonb[], text[], integer[], text[], integer[], uuid[], integer, timestamptz) IS
    'Adds QUEUED jobs, one per element of the arrays (p_user_ids[i] NULL: an unauthenticated request), in one transaction: one row per request in the order given, with the new job (or, for an Idempotency-Key used before with the same body, the first job and replayed = true) or the error that request alone gets (err_state SQ400, SQ401 or SQ419, err_message, err_detail as JSON text), as sftq.enqueue would raise it. Requests are a microsecond apart in FIFO order, in the order given. p_queue_timeouts (or else p_default_queue_timeout) sets how long each may stay QUEUED; p_retry_of names the job each retries. Writes each new job''s first event (queued, with detail.retry_of for a retry). Locking contract: admission gate (shared); the new job rows; then the owners'' user rows (several: in id order) for the counters and heads, as every procedure takes a job row before its owner''s.';

CREATE OR REPLACE FUNCTION sftq.enqueue(
    p_user_id                bigint,
    p_kind                   text,
    p_payload                jsonb,
    p_display_name           text DEFAULT NULL,
    p_gpu_count              integer DEFAULT 4,
    p_idempotency_key        text DEFAULT NULL,
    p_now                    timestamptz DEFAULT NULL,
    p_queue_timeout_seconds  integer DEFAULT NULL,
    p_retry_of               uuid DEFAULT NULL,
    p_default_queue_timeout  integer DEFAULT NULL)
RETURNS TABLE (id uuid, kind text, state text, created_at timestamptz, replayed boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row  record;
BEGIN
    IF p_user_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ401', MESSAGE = 'user not found or disabled';
    END IF;
    SELECT * INTO v_row
      FROM sftq._enqueue_one(p_user_id, p_kind, p_payload, p_display_name, p_gpu_count,
                             p_idempotency_key, p_queue_timeout_seconds, p_retry_of,
                             p_default_queue_timeout, p_now) e;
    IF v_row.err_detail IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_row.err_state, MESSAGE = v_row.err_message,
                              DETAIL = v_row.err_detail;
    ELSIF v_row.err_state IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_row.err_state, MESSAGE = v_row.err_message;
    END IF;
    RETURN QUERY SELECT v_row.id, v_row.kind, v_row.state, v_row.created_at, v_row.replayed;
END
$$;
COMMENT ON FUNCTION sftq.enqueue(bigint, text, jsonb, text, integer, text, timestamptz, integer, uuid, integer) IS
    'Adds a QUEUED job (what sftq.enqueue_many does for one request: sftq._enqueue_one). With an idempotency key, the same key and body returns the first job (replayed = true); a different body raises SQ419. p_queue_timeout_seconds (or else the operator''s p_default_queue_timeout) sets how long it may stay QUEUED before a tick cancels it; p_retry_of names the job it retries. Writes the job''s first event (queued, with detail.retry_of for a retry). Locking contract: admission gate (shared), the new job row, then the owner''s user row.';
