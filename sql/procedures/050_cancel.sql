-- Cancelling a job. QUEUED jobs are cancelled at once; PROGRESS jobs record the request
-- and tell the caller which provider call finishes it.

CREATE OR REPLACE FUNCTION sftq.cancel(
    p_user_id  bigint,
    p_job_id   uuid,
    p_actor    text DEFAULT NULL,
    p_now      timestamptz DEFAULT now())
RETURNS TABLE (job_id uuid, kind text, state text, action text, fireworks_job_name text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job    sftq.jobs;
    v_actor  text;
BEGIN
    PERFORM sftq._gate();
    SELECT * INTO v_job FROM sftq.jobs j WHERE j.id = p_job_id AND j.user_id = p_user_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    v_actor := COALESCE(p_actor, 'user:' || (SELECT u.name FROM sftq.users u WHERE u.id = p_user_id));

    IF v_job.state = 'QUEUED' THEN
        v_job := sftq._transition(p_job_id, 'CANCELLED', p_now, v_actor, 'cancelled', NULL);
        RETURN QUERY SELECT v_job.id, v_job.kind, v_job.state, 'none'::text, v_job.fireworks_job_name;
    ELSIF v_job.state = 'PROGRESS' THEN
        IF v_job.cancel_requested_at IS NULL THEN
            UPDATE sftq.jobs j SET cancel_requested_at = p_now WHERE j.id = p_job_id;
            PERFORM sftq._event(p_job_id, p_now, v_actor, 'cancel_requested', 'PROGRESS',
                                jsonb_build_object('submitted', v_job.submitted_at IS NOT NULL),
                                'PROGRESS');
        END IF;
        RETURN QUERY SELECT v_job.id, v_job.kind, v_job.state,
            CASE WHEN v_job.submitted_at IS NULL THEN 'deferred'
                 WHEN v_job.kind = 'RFT' THEN 'provider_cancel'
                 ELSE 'provider_delete' END,
            v_job.fireworks_job_name;
    ELSE
        RAISE EXCEPTION USING ERRCODE = 'SQ409',
            MESSAGE = format('job is already %s', v_job.state),
            DETAIL = json_build_object('state', v_job.state)::text;
    END IF;
END
$$;
COMMENT ON FUNCTION sftq.cancel(bigint, uuid, text, timestamptz) IS
    'Owner-scoped cancel. QUEUED -> CANCELLED now (action none). PROGRESS -> records cancel_requested_at and answers the provider call that finishes it: provider_delete (SFT/DPO), provider_cancel (RFT), or deferred when the job is not yet submitted (the scheduler, the only one that creates provider jobs, finishes it so a create in flight cannot be missed). Terminal -> SQ409. Locking contract: gate (shared), job row, then user row.';

CREATE OR REPLACE FUNCTION sftq.complete_cancel(
    p_job_id  uuid,
    p_actor   text DEFAULT 'scheduler',
    p_detail  jsonb DEFAULT NULL,
    p_now     timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job sftq.jobs;
BEGIN
    PERFORM sftq._gate();
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    -- Idempotent: the API and a tick may both finish the same cancel, and the provider
    -- may have finished the job first; either way there is nothing left to do.
    IF v_job.state <> 'PROGRESS' THEN
        RETURN v_job.state;
    END IF;
    IF v_job.cancel_requested_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ409', MESSAGE = 'no cancel was requested for this job';
    END IF;
    -- A cancel the queue recorded itself (cancel_reason, 205_run_limits.sql: run_timeout)
    -- ends with that reason as its event, detail and error; a user's cancel is unchanged.
    v_job := sftq._transition(p_job_id, 'CANCELLED', p_now, p_actor,
                              COALESCE(v_job.cancel_reason, 'cancelled'),
                              sftq._cancel_reason_detail(v_job, p_detail),
                              sftq._cancel_reason_error(v_job));
    RETURN v_job.state;
END
$$;
COMMENT ON FUNCTION sftq.complete_cancel(uuid, text, jsonb, timestamptz) IS
    'Second half of a PROGRESS cancel, once the provider confirmed the stop: PROGRESS -> CANCELLED. Returns the job''s state; a no-op on a job that already left PROGRESS. Locking contract: gate (shared), job row, user row.';
