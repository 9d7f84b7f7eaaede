-- Reading one's own jobs.

CREATE OR REPLACE FUNCTION sftq.job_json(j sftq.jobs)
RETURNS json
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The timestamps in sftq._iso's format, written out: three calls of that function (a SQL
    -- function with its own search_path is never inlined) cost twice the rest of the row,
    -- and GET /jobs without a limit builds this for every job of the caller.
    SELECT json_build_object(
        'id', j.id, 'kind', j.kind, 'state', j.state, 'display_name', j.display_name,
        'gpu_count', j.gpu_count,
        'created_at', to_char(j.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'started_at', to_char(j.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'completed_at', to_char(j.completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'error', j.error, 'fireworks_job_name', j.fireworks_job_name,
        'failure_class', j.failure_class, 'retry_of', j.retry_of,
        'warnings', j.warnings, 'estimated_cost', j.estimated_cost,
        -- Pipelines and run limits (200_pipelines.sql, 205_run_limits.sql).
        'after', j.after, 'max_run_seconds', j.max_run_seconds,
        -- sftq.is_stalled and sftq.progress_since written out (no function call per job).
        'stalled', CASE WHEN j.stalled_at IS NULL THEN false
                        ELSE j.state = 'PROGRESS'
                             AND GREATEST(j.submitted_at, j.provider_state_at, j.progress_moved_at) <= j.stalled_at END,
        'stalled_since', CASE WHEN j.stalled_at IS NOT NULL AND j.state = 'PROGRESS'
                                   AND GREATEST(j.submitted_at, j.provider_state_at, j.progress_moved_at) <= j.stalled_at
                              THEN to_char(GREATEST(j.submitted_at, j.provider_state_at, j.progress_moved_at) AT TIME ZONE 'UTC',
                                           'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END)
$$;
COMMENT ON FUNCTION sftq.job_json(sftq.jobs) IS 'A job as the API shows it: the contract''s fields, then the ones added since (failure_class, retry_of, the pre-flight''s warnings and the estimated cost, after, max_run_seconds, stalled and stalled_since), never the payload.';

CREATE OR REPLACE FUNCTION sftq.get_job(p_user_id bigint, p_job_id uuid)
RETURNS sftq.jobs
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job sftq.jobs;
BEGIN
    -- Owner-scoped: another user's job is "not found", so existence does not leak.
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id AND user_id = p_user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    RETURN v_job;
END
$$;
COMMENT ON FUNCTION sftq.get_job(bigint, uuid) IS 'One of the caller''s jobs; SQ404 when it does not exist or is not theirs. Reads only.';

CREATE OR REPLACE FUNCTION sftq.list_jobs(
    p_user_id        bigint,
    p_state          text DEFAULT NULL,
    p_kind           text DEFAULT NULL,
    p_limit          integer DEFAULT 100,
    p_after_created  timestamptz DEFAULT NULL,
    p_after_id       uuid DEFAULT NULL)
RETURNS SETOF sftq.jobs
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_state IS NOT NULL AND p_state NOT IN ('QUEUED', 'PROGRESS', 'SUCCESS', 'FAIL', 'CANCELLED') THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'state must be one of QUEUED, PROGRESS, SUCCESS, FAIL, CANCELLED';
    END IF;
    IF p_kind IS NOT NULL AND p_kind NOT IN ('SFT', 'DPO', 'RFT') THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'kind must be one of SFT, DPO, RFT';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'limit must be between 1 and 1000';
    END IF;
    RETURN QUERY
        SELECT * FROM sftq.jobs j
         WHERE j.user_id = p_user_id
           AND (p_state IS NULL OR j.state = p_state)
           AND (p_kind IS NULL OR j.kind = p_kind)
           AND (p_after_created IS NULL OR (j.created_at, j.id) < (p_after_created, p_after_id))
         ORDER BY j.created_at DESC, j.id DESC
         LIMIT p_limit;
END
$$;
COMMENT ON FUNCTION sftq.list_jobs(bigint, text, text, integer, timestamptz, uuid) IS
    'The caller''s jobs, newest first, filtered by state and kind, keyset-paged after (created_at, id). Reads only.';
