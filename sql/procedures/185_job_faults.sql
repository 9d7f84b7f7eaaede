-- Per-job fault isolation: what the tick records when handling one job fails in a way none
-- of its phases expected (any exception: a bug, a malformed name, an odd provider answer),
-- so that one job can never stop the tick for the others nor hold its owner's slot forever.
-- functions/sftq_server/scheduler/tick/context.py (Tick.job) is the caller.

CREATE OR REPLACE FUNCTION sftq.record_job_fault(
    p_job_id      uuid,
    p_tick_id     bigint,
    p_phase       text,
    p_error_type  text,
    p_error       text,
    p_limit       integer DEFAULT 3,
    p_now         timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job     sftq.jobs;
    v_faults  integer;
    v_error   text := left(COALESCE(NULLIF(p_error, ''), p_error_type, 'error'), 2000);
    v_detail  jsonb;
    v_ends    boolean;
BEGIN
    IF p_phase IS NULL OR p_phase = '' OR p_error_type IS NULL OR p_error_type = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'phase and error_type are required';
    END IF;
    -- The gate first, always: the fault may end the job, which this call learns only under
    -- the job's row lock (the same order as every state change).
    PERFORM sftq._gate();
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    IF v_job.state NOT IN ('QUEUED', 'PROGRESS') THEN
        -- Ended meanwhile (by this tick's own earlier step, or a user): nothing to hold.
        DELETE FROM sftq.job_faults WHERE job_id = p_job_id;
        RETURN jsonb_build_object('state', v_job.state, 'faults', 0, 'ended', false);
    END IF;
    INSERT INTO sftq.job_faults AS f (job_id, faults, phase, error_type, error, first_at,
                                      last_at, last_tick_id)
    VALUES (p_job_id, 1, p_phase, p_error_type, v_error, p_now, p_now, p_tick_id)
    -- A second fault in the same tick is not counted again and keeps the tick's first
    -- fault as the way it failed: phases run in a fixed order, so a job that fails in
    -- several of them each tick is compared tick to tick by the same, first one.
    ON CONFLICT (job_id) DO UPDATE
       SET faults = CASE WHEN f.last_tick_id = EXCLUDED.last_tick_id THEN f.faults
                         WHEN f.phase = EXCLUDED.phase AND f.error_type = EXCLUDED.error_type
                         THEN f.faults + 1
                         ELSE 1 END,
           first_at = CASE WHEN f.last_tick_id = EXCLUDED.last_tick_id
                             OR (f.phase = EXCLUDED.phase AND f.error_type = EXCLUDED.error_type)
                           THEN f.first_at ELSE EXCLUDED.first_at END,
           phase = CASE WHEN f.last_tick_id = EXCLUDED.last_tick_id THEN f.phase
                        ELSE EXCLUDED.phase END,
           error_type = CASE WHEN f.last_tick_id = EXCLUDED.last_tick_id THEN f.error_type
                             ELSE EXCLUDED.error_type END,
           error = CASE WHEN f.last_tick_id = EXCLUDED.last_tick_id THEN f.error
                        ELSE EXCLUDED.error END,
           last_at = EXCLUDED.last_at, last_tick_id = EXCLUDED.last_tick_id
    RETURNING f.faults INTO v_faults;
    v_ends := p_limit > 0 AND v_faults >= p_limit;
    v_detail := jsonb_build_object('phase', p_phase, 'error_type', p_error_type, 'error', v_error,
                                   'fault', v_faults, 'limit', p_limit, 'tick_id', p_tick_id,
                                   'ends_job', v_ends);
    IF NOT v_ends THEN
        PERFORM sftq._event(p_job_id, p_now, 'scheduler', 'tick_error', v_job.state, v_detail);
        RETURN jsonb_build_object('state', v_job.state, 'faults', v_faults, 'ended', false);
    END IF;
    -- At the limit: the job ends FAIL permanent with the error, through the contract's
    -- transitions. A QUEUED job leaves the queue through PROGRESS in this one transaction
    -- (as sftq.fail_preflight does): the tick_error event is that step, the failed event
    -- the next, so nobody ever sees it running and it never reaches the provider.
    UPDATE sftq.jobs SET failure_class = 'permanent', next_submit_at = NULL WHERE id = p_job_id;
    IF v_job.state = 'QUEUED' THEN
        PERFORM sftq._transition(p_job_id, 'PROGRESS', p_now, 'scheduler', 'tick_error',
                                 v_detail || jsonb_build_object('submitted', false));
    ELSE
        PERFORM sftq._event(p_job_id, p_now, 'scheduler', 'tick_error', v_job.state, v_detail);
    END IF;
    PERFORM sftq._transition(
        p_job_id, 'FAIL', p_now, 'scheduler', 'failed',
        jsonb_build_object('reason', 'tick_errors', 'failure_class', 'permanent',
                           'phase', p_phase, 'error_type', p_error_type, 'faults', v_faults),
        format('the scheduler could not handle this job on %s ticks in a row (%s, %s): %s',
               v_faults, p_phase, p_error_type, v_error));
    DELETE FROM sftq.job_faults WHERE job_id = p_job_id;
    RETURN jsonb_build_object('state', 'FAIL', 'faults', v_faults, 'ended', true,
                              'submitted', v_job.submitted_at IS NOT NULL,
                              'fireworks_job_name', v_job.fireworks_job_name);
END
$$;
COMMENT ON FUNCTION sftq.record_job_fault(uuid, bigint, text, text, text, integer, timestamptz) IS
    'The tick failed to handle one QUEUED or PROGRESS job (p_phase: reconcile, cancel, preflight, submit, last_check; p_error_type: the error''s kind; p_error: its text). Counts the fault in sftq.job_faults (once per tick p_tick_id, whose first fault is the way it failed; a different phase or error_type than the last tick''s starts the count again at 1) and writes a tick_error event with {phase, error_type, error, fault, limit, tick_id, ends_job}. At p_limit faults in a row (0: never) the job ends FAIL, failure_class permanent, with the error: QUEUED -> PROGRESS (that tick_error event) -> FAIL, or PROGRESS -> FAIL, event failed with reason tick_errors. A job already ended: no event, its fault row removed. Answers {state, faults, ended} (and, when it ended, submitted and fireworks_job_name, so the tick can stop a provider job). Locking contract: gate (shared), the job row, its fault row, then (when it ends) its user row.';

CREATE OR REPLACE FUNCTION sftq.faulted_jobs()
RETURNS SETOF uuid
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT f.job_id FROM sftq.job_faults f
$$;
COMMENT ON FUNCTION sftq.faulted_jobs() IS
    'The jobs with a run of faults going (sftq.job_faults): the tick reads them once, and clears those it then handles without a fault. Reads only.';

CREATE OR REPLACE FUNCTION sftq.clear_job_faults(p_job_ids uuid[])
RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Also the rows of jobs that ended since (a user's cancel, a normal end): nothing holds.
    WITH gone AS (
        DELETE FROM sftq.job_faults f
         WHERE f.job_id = ANY (p_job_ids)
            OR NOT EXISTS (SELECT 1 FROM sftq.jobs j
                            WHERE j.id = f.job_id AND j.state IN ('QUEUED', 'PROGRESS'))
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;
COMMENT ON FUNCTION sftq.clear_job_faults(uuid[]) IS
    'A tick handled these jobs without a fault: their runs of faults end (the next fault counts from 1); the rows of jobs no longer QUEUED or PROGRESS go too. Answers how many rows it removed. Locking contract: fault rows only (reads the jobs without locking them).';
