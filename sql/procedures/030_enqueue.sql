-- Enqueue.

-- The signature grew a queue timeout and retry_of (issue 10): drop the old one.
DROP FUNCTION IF EXISTS sftq.enqueue(bigint, text, jsonb, text, integer, text, timestamptz);

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
    v_id       uuid := gen_random_uuid();
    v_created  timestamptz;
    v_hash     bytea;
    v_old      sftq.jobs;
    v_gpus     integer := COALESCE(p_gpu_count, 4);
    v_name     text;
    v_timeout  integer := COALESCE(p_queue_timeout_seconds, p_default_queue_timeout);
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('SFT', 'DPO', 'RFT') THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'kind must be one of SFT, DPO, RFT';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'fireworks_payload is required';
    END IF;
    IF jsonb_typeof(p_payload) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'fireworks_payload must be a JSON object';
    END IF;
    IF v_gpus < 1 OR v_gpus > 64 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'gpu_count must be an integer from 1 to 64';
    END IF;
    IF char_length(p_display_name) > 256 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'display_name must be at most 256 characters';
    END IF;
    IF v_timeout IS NOT NULL AND (v_timeout < 1 OR v_timeout > 2592000) THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400',
            MESSAGE = 'queue_timeout_seconds must be an integer from 1 to 2592000 (30 days)';
    END IF;

    -- Shared gate first: admit (exclusive) then sees every enqueue that got a
    -- created_at before it decided, so no earlier job can appear behind its back.
    PERFORM sftq._gate();

    IF p_idempotency_key IS NOT NULL THEN
        -- What the caller asked for: the operator's default timeout is not part of it, and a
        -- request without the newer fields hashes exactly as it did before they existed.
        v_hash := sha256(convert_to(
            CASE WHEN p_queue_timeout_seconds IS NULL AND p_retry_of IS NULL
                 THEN jsonb_build_array(p_kind, p_payload, p_display_name, v_gpus)
                 ELSE jsonb_build_array(p_kind, p_payload, p_display_name, v_gpus,
                          jsonb_build_object('queue_timeout_seconds', p_queue_timeout_seconds,
                                             'retry_of', p_retry_of)) END::text, 'UTF8'));
    END IF;

    -- clock_timestamp(), not now(): taken after the gate, so FIFO order follows the
    -- moment of enqueue rather than the start of a long transaction.
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
        IF v_old.request_hash IS DISTINCT FROM v_hash THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ419',
                MESSAGE = 'this Idempotency-Key was already used with a different request body',
                DETAIL = json_build_object('job_id', v_old.id)::text;
        END IF;
        RETURN QUERY SELECT v_old.id, v_old.kind, v_old.state, v_old.created_at, true;
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
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ401', MESSAGE = 'user not found or disabled';
    END IF;
    IF p_retry_of IS NULL THEN
        PERFORM sftq._event(v_id, v_created, 'user:' || v_name, 'queued', 'QUEUED');
    ELSE
        PERFORM sftq._event(v_id, v_created, 'user:' || v_name, 'queued', 'QUEUED',
                            jsonb_build_object('retry_of', p_retry_of));
    END IF;

    RETURN QUERY SELECT v_id, p_kind, 'QUEUED'::text, v_created, false;
END
$$;
COMMENT ON FUNCTION sftq.enqueue(bigint, text, jsonb, text, integer, text, timestamptz, integer, uuid, integer) IS
    'Adds a QUEUED job. With an idempotency key, the same key and body returns the first job (replayed = true); a different body raises SQ419. p_queue_timeout_seconds (or else the operator''s p_default_queue_timeout) sets how long it may stay QUEUED before a tick cancels it; p_retry_of names the job it retries. Writes the job''s first event (queued, with detail.retry_of for a retry). Locking contract: admission gate (shared), the new job row, then the owner''s user row (to keep queued_count and the head).';
