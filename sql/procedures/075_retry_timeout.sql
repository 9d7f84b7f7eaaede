-- Second chances and deadlines: retrying a job that ended badly (POST /jobs/{id}/retry), and
-- a queue timeout that cancels a job left QUEUED too long (issue 10).

CREATE OR REPLACE FUNCTION sftq.retry_job(
    p_user_id                bigint,
    p_job_id                 uuid,
    p_idempotency_key        text DEFAULT NULL,
    p_default_queue_timeout  integer DEFAULT NULL,
    p_now                    timestamptz DEFAULT NULL)
RETURNS TABLE (id uuid, kind text, state text, created_at timestamptz, replayed boolean,
               retry_of uuid)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_old   sftq.jobs;
    v_row   record;
    v_name  text;
BEGIN
    -- Owner-scoped: another user's job is "not found", so existence does not leak.
    SELECT * INTO v_old FROM sftq.jobs j WHERE j.id = p_job_id AND j.user_id = p_user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    IF v_old.state NOT IN ('FAIL', 'CANCELLED') THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ439',
            MESSAGE = format('job is %s: only a FAIL or CANCELLED job can be retried', v_old.state),
            DETAIL = json_build_object('state', v_old.state)::text;
    END IF;
    -- The same kind, payload, display name and GPUs, at the back of the queue. The queue
    -- timeout the old job had carries over; an old job without one gets the operator's.
    SELECT * INTO v_row FROM sftq.enqueue(
        p_user_id, v_old.kind, v_old.fireworks_payload, v_old.display_name, v_old.gpu_count,
        p_idempotency_key, p_now, NULL, v_old.id,
        COALESCE(v_old.queue_timeout_seconds, p_default_queue_timeout)) e;
    IF NOT v_row.replayed THEN
        SELECT u.name INTO v_name FROM sftq.users u WHERE u.id = p_user_id;
        PERFORM sftq._event(v_old.id, COALESCE(p_now, clock_timestamp()), 'user:' || v_name,
                            'retried', v_old.state, jsonb_build_object('new_job_id', v_row.id));
    END IF;
    RETURN QUERY
        SELECT v_row.id, v_row.kind, v_row.state, v_row.created_at, v_row.replayed, j.retry_of
          FROM sftq.jobs j WHERE j.id = v_row.id;
END
$$;
COMMENT ON FUNCTION sftq.retry_job(bigint, uuid, text, integer, timestamptz) IS
    'Enqueues a new job with the same kind, payload, display name and gpu_count as one of the caller''s FAIL or CANCELLED jobs (retry_of points back; its queued event has detail.retry_of) and writes a retried event (detail.new_job_id) on the old job. SQ404 for a job that is not the caller''s, SQ439 for QUEUED, PROGRESS or SUCCESS (details.state says which). An Idempotency-Key replays the first retry made with it (SQ419 if it was used for another request). Locking contract: as sftq.enqueue (gate shared, the new job row, the user row); the old job is only read.';

CREATE OR REPLACE FUNCTION sftq.expire_queued(
    p_now    timestamptz DEFAULT now(),
    p_limit  integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids   uuid[];
    v_job   sftq.jobs;
    v_id    uuid;
    v_done  integer := 0;
BEGIN
    PERFORM sftq._gate();
    -- Lock every job to cancel before touching any user row: procedures lock a job row
    -- before its user row, so holding user rows while waiting for job rows could close a
    -- cycle. SKIP LOCKED: a job some user is cancelling right now is theirs to finish.
    SELECT array_agg(x.id ORDER BY x.queue_expires_at, x.id) INTO v_ids
      FROM (SELECT j.id, j.queue_expires_at FROM sftq.jobs j
             WHERE j.state = 'QUEUED' AND j.queue_expires_at <= p_now
             ORDER BY j.queue_expires_at, j.id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED) x;
    -- Then their owners' rows, in id order, before the first transition: a group-commit
    -- enqueue (sftq.enqueue_many) holds several user rows at once, taken in id order, so
    -- taking ours in the same order closes no cycle with it.
    PERFORM 1 FROM sftq.users u
     WHERE u.id IN (SELECT j.user_id FROM sftq.jobs j WHERE j.id = ANY (v_ids))
     ORDER BY u.id
       FOR NO KEY UPDATE;
    FOREACH v_id IN ARRAY COALESCE(v_ids, '{}') LOOP
        SELECT * INTO v_job FROM sftq.jobs j WHERE j.id = v_id;
        CONTINUE WHEN v_job.state <> 'QUEUED';
        PERFORM sftq._transition(
            v_id, 'CANCELLED', p_now, 'scheduler', 'queue_timeout',
            jsonb_build_object('reason', 'queue_timeout',
                               'queue_timeout_seconds', v_job.queue_timeout_seconds),
            format('timed out in the queue: still QUEUED after %s s (queue_timeout_seconds %s)',
                   floor(extract(epoch FROM p_now - v_job.created_at)), v_job.queue_timeout_seconds));
        v_done := v_done + 1;
    END LOOP;
    RETURN v_done;
END
$$;
COMMENT ON FUNCTION sftq.expire_queued(timestamptz, integer) IS
    'Cancels up to p_limit QUEUED jobs whose queue timeout has run out (queue_expires_at <= p_now), oldest deadline first: QUEUED -> CANCELLED with a queue_timeout event and an error saying it timed out in the queue. Answers how many. Locking contract: gate (shared), then the expired job rows (SKIP LOCKED, in deadline order: a job being cancelled is left to that cancel), then their owners'' user rows in id order (as sftq.enqueue_many takes several), for which it may wait on a concurrent change of those users; a change that holds one user row never waits for the rows the sweep holds, and one that holds several took them in the same order, so there is no cycle.';

-- ---------------------------------------------------------------------------
-- HTTP entry points (SECURITY DEFINER, like sql/procedures/100_api.sql)
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.api_submit(
    p_key_hash               bytea,
    p_kind                   text,
    p_payload                jsonb,
    p_display_name           text,
    p_gpu_count              integer,
    p_idempotency_key        text,
    p_queue_timeout_seconds  integer,
    p_default_queue_timeout  integer)
RETURNS TABLE (body json, replayed boolean, job_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._auth(p_key_hash);
    v_row  record;
BEGIN
    SELECT * INTO v_row FROM sftq.enqueue(v_user, p_kind, p_payload, p_display_name, p_gpu_count,
                                          p_idempotency_key, NULL, p_queue_timeout_seconds, NULL,
                                          p_default_queue_timeout);
    body := json_build_object('id', v_row.id, 'kind', v_row.kind, 'state', v_row.state,
                              'created_at', sftq._iso(v_row.created_at));
    replayed := v_row.replayed;
    job_id := v_row.id;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION sftq.api_submit(bytea, text, jsonb, text, integer, text, integer, integer) IS
    'POST /jobs with a queue timeout: authenticates, then sftq.enqueue with the caller''s queue_timeout_seconds (or the operator''s default). The same answer as sftq.api_enqueue, which stays for callers without a timeout. Locking contract: as sftq.enqueue.';

CREATE OR REPLACE FUNCTION sftq.api_retry_job(
    p_key_hash               bytea,
    p_job_id                 uuid,
    p_idempotency_key        text,
    p_default_queue_timeout  integer)
RETURNS TABLE (body json, replayed boolean, job_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._auth(p_key_hash);
    v_row  record;
BEGIN
    PERFORM sftq.user_limits_check(v_user, true);  -- SQ429, SQ4QL: 195_user_limits.sql
    SELECT * INTO v_row FROM sftq.retry_job(v_user, p_job_id, p_idempotency_key,
                                            p_default_queue_timeout);
    body := json_build_object('id', v_row.id, 'kind', v_row.kind, 'state', v_row.state,
                              'created_at', sftq._iso(v_row.created_at), 'retry_of', v_row.retry_of);
    replayed := v_row.replayed;
    job_id := v_row.id;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION sftq.api_retry_job(bytea, uuid, text, integer) IS
    'POST /jobs/:id/retry. Authenticates, then sftq.retry_job; answers the enqueue shape plus retry_of, and whether an Idempotency-Key replayed. Locking contract: as sftq.retry_job.';
