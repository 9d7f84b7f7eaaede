-- Pre-flight against Fireworks' resources: what jobs-api or the tick learned about a job's
-- dataset, evaluator and model before the job waits (functions/sftq_server/preflight/).
-- A definite "does not exist" ends the job FAIL permanent while it is still QUEUED, without
-- ever reaching the provider; anything doubtful is kept as a warning on the job.

-- The owner joined the answer (issue 52): the tick checks a job on its owner's share of the
-- lookups. The return type changed, so the old function goes first.
DROP FUNCTION IF EXISTS sftq.preflight_work(integer, interval, timestamptz);
CREATE FUNCTION sftq.preflight_work(p_limit integer DEFAULT 20,
                                    p_retry_after interval DEFAULT interval '60 seconds',
                                    p_now timestamptz DEFAULT now())
RETURNS TABLE (job_id uuid, kind text, fireworks_payload jsonb, gpu_count integer,
               user_id bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.id, j.kind, j.fireworks_payload, j.gpu_count, j.user_id
      FROM sftq.jobs j
     WHERE j.state = 'QUEUED' AND j.preflight_checked_at IS NULL
       AND (j.preflight_tried_at IS NULL OR j.preflight_tried_at <= p_now - p_retry_after)
     ORDER BY j.created_at, j.id
     LIMIT greatest(p_limit, 0)
$$;
COMMENT ON FUNCTION sftq.preflight_work(integer, interval, timestamptz) IS
    'The QUEUED jobs whose provider checks are still to do, oldest first (the nearest the head first), at most p_limit, each with its owner (whose share of the provider budget its lookups draw on); a job tried without an answer waits p_retry_after before it is tried again. Reads only.';

CREATE OR REPLACE FUNCTION sftq.record_preflight(
    p_job_id          uuid,
    p_outcome         text,
    p_warnings        jsonb DEFAULT NULL,
    p_estimated_cost  jsonb DEFAULT NULL,
    p_now             timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_warnings jsonb := NULLIF(NULLIF(p_warnings, 'null'::jsonb), '[]'::jsonb);
    v_cost     jsonb := NULLIF(p_estimated_cost, 'null'::jsonb);
    v_state    text;
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('checked', 'skipped', 'unanswered', 'pending') THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400',
            MESSAGE = 'outcome must be one of checked, skipped, unanswered, pending';
    END IF;
    IF v_warnings IS NOT NULL AND jsonb_typeof(v_warnings) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'warnings must be a JSON array';
    END IF;
    -- Any state: jobs-api records after its enqueue committed, and a tick may have admitted
    -- the job in between. A warning already kept is not written twice.
    UPDATE sftq.jobs j
       SET warnings = CASE WHEN v_warnings IS NULL THEN j.warnings
                           WHEN j.warnings IS NULL THEN v_warnings
                           ELSE j.warnings || (SELECT COALESCE(jsonb_agg(w), '[]'::jsonb)
                                                 FROM jsonb_array_elements(v_warnings) w
                                                WHERE NOT j.warnings @> jsonb_build_array(w)) END,
           estimated_cost = COALESCE(j.estimated_cost, v_cost),
           preflight_checked_at = CASE WHEN p_outcome IN ('checked', 'skipped')
                                       THEN COALESCE(j.preflight_checked_at, p_now)
                                       ELSE j.preflight_checked_at END,
           preflight_tried_at = CASE WHEN p_outcome = 'unanswered' THEN p_now
                                     ELSE j.preflight_tried_at END
     WHERE j.id = p_job_id
    RETURNING j.state INTO v_state;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    RETURN v_state;
END
$$;
COMMENT ON FUNCTION sftq.record_preflight(uuid, text, jsonb, jsonb, timestamptz) IS
    'What a pre-flight learned of one job: p_outcome checked (every provider check answered; none found a missing resource), skipped (nothing to check, or "validate": "off") unanswered (the provider failed or ran out of time: the tick tries again a minute later) or pending (not asked yet: only the warnings and cost are kept; the tick asks). Adds the doubtful findings to warnings (each once), keeps the first estimated_cost. Answers the job''s state. Locking contract: the job row.';

CREATE OR REPLACE FUNCTION sftq.fail_preflight(
    p_job_id    uuid,
    p_findings  jsonb,
    p_error     text,
    p_warnings  jsonb DEFAULT NULL,
    p_now       timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job sftq.jobs;
BEGIN
    IF jsonb_typeof(p_findings) IS DISTINCT FROM 'array' OR jsonb_array_length(p_findings) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'findings must be a non-empty JSON array';
    END IF;
    PERFORM sftq._gate();
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    IF v_job.state <> 'QUEUED' THEN
        -- Admitted meanwhile: the create will meet the same answer at the provider and fail
        -- there, with the provider's own words. Cancelled or ended: nothing to do.
        RETURN v_job.state;
    END IF;
    -- The contract's transitions have no QUEUED -> FAIL: the job leaves the queue through
    -- PROGRESS and ends FAIL in this one transaction, so nobody ever sees it running, it
    -- takes no slot and no GPUs, and it is never created at the provider.
    UPDATE sftq.jobs
       SET failure_class = 'permanent', preflight_checked_at = p_now,
           warnings = COALESCE(warnings, NULLIF(NULLIF(p_warnings, 'null'::jsonb), '[]'::jsonb))
     WHERE id = p_job_id;
    PERFORM sftq._transition(p_job_id, 'PROGRESS', p_now, 'scheduler', 'preflight_failed',
                             jsonb_build_object('reason', 'preflight_failed', 'submitted', false));
    v_job := sftq._transition(p_job_id, 'FAIL', p_now, 'scheduler', 'failed',
                              jsonb_build_object('reason', 'preflight_failed',
                                                 'failure_class', 'permanent',
                                                 'findings', p_findings),
                              p_error);
    RETURN v_job.state;
END
$$;
COMMENT ON FUNCTION sftq.fail_preflight(uuid, jsonb, text, jsonb, timestamptz) IS
    'Ends a QUEUED job whose pre-flight found a resource that does not exist: QUEUED -> PROGRESS -> FAIL in one transaction (the contract''s transitions; never visible as running, never created at the provider), failure_class permanent, p_error as its error, events preflight_failed then failed with reason preflight_failed and the findings. A no-op on a job no longer QUEUED (answers its state). Locking contract: gate (shared), the job row, then its user row.';

-- jobs-api's entry: the pre-flight it made of a job it has just enqueued for this key.
CREATE OR REPLACE FUNCTION sftq.api_record_preflight(
    p_key_hash        bytea,
    p_job_id          uuid,
    p_outcome         text,
    p_warnings        jsonb DEFAULT NULL,
    p_estimated_cost  jsonb DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.record_preflight((sftq.get_job(sftq._auth(p_key_hash), p_job_id)).id, p_outcome,
                                 p_warnings, p_estimated_cost)
$$;
COMMENT ON FUNCTION sftq.api_record_preflight(bytea, uuid, text, jsonb, jsonb) IS
    'POST /jobs, after the enqueue: sftq.record_preflight for one of the caller''s jobs (SQ404 when not theirs).';
