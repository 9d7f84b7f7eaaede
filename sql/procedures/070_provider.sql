-- What the scheduler learns from the provider, recorded against our jobs.

CREATE OR REPLACE FUNCTION sftq.scheduler_work()
RETURNS TABLE (job_id uuid, kind text, user_id bigint, gpu_count integer, started_at timestamptz,
               submitted_at timestamptz, fireworks_job_name text, cancel_requested_at timestamptz,
               provider_state text, submit_attempts integer, fireworks_payload jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.id, j.kind, j.user_id, j.gpu_count, j.started_at, j.submitted_at, j.fireworks_job_name,
           j.cancel_requested_at, j.provider_state, j.submit_attempts,
           CASE WHEN j.submitted_at IS NULL THEN j.fireworks_payload END
      FROM sftq.jobs j
     WHERE j.state = 'PROGRESS'
     ORDER BY j.started_at, j.id
$$;
COMMENT ON FUNCTION sftq.scheduler_work() IS
    'Every PROGRESS job with what the tick needs: unsubmitted ones (with their payload) to submit, submitted ones to reconcile, requested cancels to finish. Reads only.';

CREATE OR REPLACE FUNCTION sftq.record_submitted(
    p_job_id          uuid,
    p_job_name        text,
    p_provider_state  text DEFAULT NULL,
    p_adopted         boolean DEFAULT false,
    p_now             timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job sftq.jobs;
BEGIN
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    IF v_job.submitted_at IS NULL THEN
        UPDATE sftq.jobs
           SET submitted_at = p_now, fireworks_job_name = p_job_name,
               provider_state = COALESCE(p_provider_state, provider_state),
               provider_state_at = p_now, last_submit_error = NULL
         WHERE id = p_job_id;
        PERFORM sftq._event(p_job_id, p_now, 'scheduler', 'submitted', v_job.state,
                jsonb_build_object('fireworks_job_name', p_job_name, 'provider_state', p_provider_state,
                                   'adopted_existing', p_adopted, 'attempt', v_job.submit_attempts + 1),
                v_job.state);
    END IF;
    -- A cancel that arrived while the create was in flight: the caller must stop the
    -- provider job right away.
    IF v_job.state <> 'PROGRESS' OR v_job.cancel_requested_at IS NOT NULL THEN
        RETURN 'stop';
    END IF;
    RETURN 'ok';
END
$$;
COMMENT ON FUNCTION sftq.record_submitted(uuid, text, text, boolean, timestamptz) IS
    'Records that the provider accepted (or already had) the job. Returns stop when a cancel was requested meanwhile, else ok. Locking contract: the job row only (no eligibility change, so no gate).';

CREATE OR REPLACE FUNCTION sftq.record_submit_error(
    p_job_id     uuid,
    p_error      text,
    p_transient  boolean,
    p_now        timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job sftq.jobs;
BEGIN
    IF NOT p_transient THEN
        PERFORM sftq._gate();
    END IF;
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    IF v_job.state <> 'PROGRESS' OR v_job.submitted_at IS NOT NULL THEN
        RETURN v_job.state;
    END IF;
    IF p_transient THEN
        -- The job keeps its place (PROGRESS) and its provider id; the next tick retries.
        UPDATE sftq.jobs SET submit_attempts = submit_attempts + 1, last_submit_error = p_error
         WHERE id = p_job_id;
        PERFORM sftq._event(p_job_id, p_now, 'scheduler', 'submit_retry', v_job.state,
                jsonb_build_object('error', left(p_error, 2000), 'attempt', v_job.submit_attempts + 1));
        RETURN 'PROGRESS';
    END IF;
    UPDATE sftq.jobs SET submit_attempts = submit_attempts + 1 WHERE id = p_job_id;
    v_job := sftq._transition(p_job_id, 'FAIL', p_now, 'scheduler', 'submission_rejected',
                              jsonb_build_object('attempt', v_job.submit_attempts + 1), p_error);
    RETURN v_job.state;
END
$$;
COMMENT ON FUNCTION sftq.record_submit_error(uuid, text, boolean, timestamptz) IS
    'A failed create. Transient: stays PROGRESS with last_submit_error visible, retried next tick. Rejected: PROGRESS -> FAIL with the provider''s body verbatim in error. Locking contract: gate (shared) for a rejection, then the job row and its user row.';

CREATE OR REPLACE FUNCTION sftq.record_provider_state(
    p_job_id          uuid,
    p_provider_state  text,
    p_message         text DEFAULT NULL,
    p_now             timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job     sftq.jobs;
    v_target  text;
    v_state   text := upper(p_provider_state);
BEGIN
    -- The contract's mapping. NOT_FOUND stands for a 404 on GET (deleted outside us).
    v_target := CASE
        WHEN v_state IN ('JOB_STATE_COMPLETED') THEN 'SUCCESS'
        WHEN v_state IN ('JOB_STATE_FAILED', 'JOB_STATE_EXPIRED', 'JOB_STATE_EARLY_STOPPED') THEN 'FAIL'
        WHEN v_state IN ('JOB_STATE_CANCELLED', 'JOB_STATE_DELETED', 'NOT_FOUND') THEN 'CANCELLED'
    END;
    IF v_target IS NOT NULL THEN
        PERFORM sftq._gate();
    END IF;
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    IF v_job.state <> 'PROGRESS' THEN
        RETURN v_job.state;
    END IF;
    IF v_target IS NULL THEN
        -- Still running (any other or unknown state): note it when it changed.
        IF v_job.provider_state IS DISTINCT FROM v_state THEN
            UPDATE sftq.jobs SET provider_state = v_state, provider_state_at = p_now WHERE id = p_job_id;
            PERFORM sftq._event(p_job_id, p_now, 'scheduler', 'provider_state', v_job.state,
                    jsonb_build_object('from', v_job.provider_state, 'to', v_state));
        END IF;
        RETURN v_job.state;
    END IF;
    UPDATE sftq.jobs SET provider_state = v_state, provider_state_at = p_now WHERE id = p_job_id;
    v_job := sftq._transition(
        p_job_id, v_target, p_now, 'scheduler',
        CASE WHEN v_target = 'CANCELLED' AND v_job.cancel_requested_at IS NOT NULL THEN 'cancelled'
             WHEN v_target = 'CANCELLED' THEN 'reconciled'
             WHEN v_target = 'SUCCESS' THEN 'succeeded'
             ELSE 'failed' END,
        jsonb_build_object('provider_state', v_state, 'message', p_message),
        CASE WHEN v_target = 'FAIL' THEN COALESCE(p_message, v_state)
             WHEN v_target = 'CANCELLED' AND v_job.cancel_requested_at IS NULL
                  THEN format('cancelled outside the queue (provider reported %s)', v_state) END);
    RETURN v_job.state;
END
$$;
COMMENT ON FUNCTION sftq.record_provider_state(uuid, text, text, timestamptz) IS
    'Maps the provider''s state onto the job: COMPLETED -> SUCCESS; FAILED, EXPIRED, EARLY_STOPPED -> FAIL (message in error); CANCELLED, DELETED, NOT_FOUND (a 404) -> CANCELLED; anything else leaves it PROGRESS and notes the provider state. A no-op on a job no longer in PROGRESS. Locking contract: gate (shared) when it transitions, the job row, then its user row.';

CREATE OR REPLACE FUNCTION sftq.provider_job_id(p_job_id uuid)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'sftq-' || replace(p_job_id::text, '-', '')
$$;
COMMENT ON FUNCTION sftq.provider_job_id(uuid) IS
    'The provider job id we choose for a job: deterministic, so a retried create answers 409 instead of making a second job.';
