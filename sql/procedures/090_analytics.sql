-- Per-user analytics with the contract's shapes and definitions. All read-only.

CREATE OR REPLACE FUNCTION sftq.queue_context(
    p_user_id        bigint,
    p_now            timestamptz,
    p_tick_interval  interval,
    p_usage_grace    interval)
RETURNS json
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
-- Planned once per session (as sftq.queue_view_many, and for the same reason: a SQL
-- function plans its query at every call); the rows come from sftq.queue_view_many
-- directly, not through sftq.queue_view (one set of 400 rows fewer to copy).
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (SELECT json_build_object(
        'your_progress_job', (
            SELECT json_build_object('id', j.id, 'display_name', j.display_name, 'kind', j.kind,
                                     'gpu_count', j.gpu_count, 'started_at', sftq._iso(j.started_at),
                                     'fireworks_job_name', j.fireworks_job_name)
              FROM sftq.jobs j
             WHERE j.user_id = p_user_id AND j.state = 'PROGRESS'
             ORDER BY j.started_at, j.id
             LIMIT 1),
        -- Each job is one row of named columns (its nested objects composites of migration
        -- 0017), written by json_agg: a json_build_object per job and per nested object
        -- resolved the output function of every argument at every call (for 500 jobs about
        -- a fifth of this JSON's cost). The timestamps in sftq._iso's format, written out as
        -- in sftq.job_json: two calls of that function per job (never inlined: it has its own
        -- search_path) were a third of this JSON's cost for 400 jobs.
        'your_queued_jobs', COALESCE((
            SELECT json_agg(x)
              FROM (SELECT v.id, v.display_name, v.kind, v.gpu_count,
                           to_char(v.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at,
                           v.queue_position,
                           ROW(v.waiting_code, v.waiting_message)::sftq.waiting_reason_json AS waiting_reason,
                           to_char(v.estimated_start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS estimated_start_at,
                           ROW(v.estimate_basis)::sftq.estimate_json AS estimate
                      FROM sftq.queue_view_many(ARRAY[p_user_id], p_now, p_tick_interval, p_usage_grace) v
                     ORDER BY v.created_at, v.id) x), '[]'::json),
        'global_queue_depth', (SELECT COALESCE(sum(u.queued_count), 0)::bigint FROM sftq.users u),
        'global_progress_count', (SELECT count(*) FROM sftq.jobs j WHERE j.state = 'PROGRESS'),
        'global_gpu_in_use', (SELECT COALESCE(sum(j.gpu_count), 0)::bigint FROM sftq.jobs j WHERE j.state = 'PROGRESS')));
END
$$;
COMMENT ON FUNCTION sftq.queue_context(bigint, timestamptz, interval, interval) IS
    'GET /jobs/analytics/queue: the caller''s running job; every one of their queued jobs (FIFO order) with queue_position = other users'' QUEUED jobs created earlier, waiting_reason, estimated_start_at and estimate (sftq.queue_view_many for this user); global depth, running count and GPUs in use. Cost: the positions come from the stretch counts (sftq.queue_ahead: an index lookup per job, whatever the length of the queue); the reasons one admission walk and one sftq.waiting_reasons call; the estimates a simulation bounded by its window and step count; the global figures read the users table and the running jobs only. Reads only, takes no locks.';

-- The one-argument form predates the waiting reasons: the defaults of the deployment
-- settings (30 s ticks, 300 s usage grace), at now().
CREATE OR REPLACE FUNCTION sftq.queue_context(p_user_id bigint)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.queue_context(p_user_id, now(), interval '30 seconds', interval '5 minutes')
$$;
COMMENT ON FUNCTION sftq.queue_context(bigint) IS
    'sftq.queue_context at now() with the default tick interval (30 s) and usage grace (300 s). Reads only.';

CREATE OR REPLACE FUNCTION sftq.summary(p_user_id bigint)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- From the user's counters (kept by enqueue and _transition), not from their jobs: the
    -- cost does not grow with the user's history.
    WITH a AS (
        SELECT COALESCE(u.queued_count, 0) AS queued, COALESCE(u.running_count, 0) AS progress,
               COALESCE(u.succeeded_count, 0) AS success, COALESCE(u.failed_count, 0) AS fail,
               COALESCE(u.cancelled_count, 0) AS cancelled,
               COALESCE(u.sft_count, 0) AS sft, COALESCE(u.dpo_count, 0) AS dpo,
               COALESCE(u.rft_count, 0) AS rft,
               COALESCE(u.success_run_seconds, 0) AS run_seconds,
               COALESCE(u.success_gpu_seconds, 0) AS gpu_seconds
          FROM (SELECT p_user_id AS id) x LEFT JOIN sftq.users u ON u.id = x.id
    )
    SELECT json_build_object(
        'total', a.queued + a.progress + a.success + a.fail + a.cancelled,
        'by_state', json_build_object('QUEUED', a.queued, 'PROGRESS', a.progress, 'SUCCESS', a.success,
                                      'FAIL', a.fail, 'CANCELLED', a.cancelled),
        'by_kind', json_build_object('SFT', a.sft, 'DPO', a.dpo, 'RFT', a.rft),
        'success_rate', CASE WHEN a.success + a.fail + a.cancelled > 0
                             THEN round(a.success::numeric / (a.success + a.fail + a.cancelled), 3) END,
        'avg_run_duration_seconds', CASE WHEN a.success > 0 THEN round(a.run_seconds / a.success)::bigint END,
        'total_gpu_hours', round(a.gpu_seconds / 3600, 3),
        'recent_failures', COALESCE((
            SELECT json_agg(json_build_object('id', f.id, 'display_name', f.display_name, 'kind', f.kind,
                                              'gpu_count', f.gpu_count, 'error', f.error,
                                              'failed_at', sftq._iso(f.completed_at))
                            ORDER BY f.completed_at DESC, f.id DESC)
              FROM (SELECT * FROM sftq.jobs j
                     WHERE j.user_id = p_user_id AND j.state = 'FAIL'
                     ORDER BY j.completed_at DESC, j.id DESC
                     LIMIT 10) f), '[]'::json))
      FROM a
$$;
COMMENT ON FUNCTION sftq.summary(bigint) IS
    'Lifetime figures for the caller: total, by_state and by_kind (every key present), success_rate = SUCCESS/(SUCCESS+FAIL+CANCELLED) or null, avg_run_duration_seconds and total_gpu_hours over SUCCESS jobs, and the 10 newest FAIL jobs. Reads the user''s counters and jobs_user_failed_idx only, so its cost does not grow with the user''s history. Reads only.';

CREATE OR REPLACE FUNCTION sftq.job_analytics(
    p_user_id        bigint,
    p_job_id         uuid,
    p_now            timestamptz,
    p_tick_interval  interval,
    p_usage_grace    interval)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH j AS (
        SELECT * FROM sftq.get_job(p_user_id, p_job_id)
    ), qv AS (
        SELECT v.* FROM j CROSS JOIN LATERAL sftq.queue_view(
                   p_user_id, p_now, p_tick_interval, p_usage_grace, j.created_at, j.id) v
         WHERE j.state = 'QUEUED' AND v.id = j.id
    ), fin AS (
        SELECT f.* FROM j CROSS JOIN LATERAL sftq.finish_estimate(
                   j.id, j.kind, j.gpu_count, j.started_at, j.submitted_at, p_now) f
         WHERE j.state = 'PROGRESS'
    )
    SELECT json_build_object(
        'id', j.id, 'display_name', j.display_name, 'kind', j.kind, 'state', j.state,
        'gpu_count', j.gpu_count, 'fireworks_job_name', j.fireworks_job_name,
        'timeline', json_build_object('queued_at', sftq._iso(j.created_at),
                                      'started_at', sftq._iso(j.started_at),
                                      'completed_at', sftq._iso(j.completed_at)),
        'queue_wait_seconds', round(extract(epoch FROM j.started_at - j.created_at))::bigint,
        'run_duration_seconds', round(extract(epoch FROM j.completed_at - j.started_at))::bigint,
        'gpu_hours', round(j.gpu_count * extract(epoch FROM j.completed_at - j.started_at) / 3600, 3),
        'error', j.error,
        -- Added by the visibility issue; every key is present, null when there is nothing to say.
        'queue_position', qv.queue_position,
        'waiting_reason', CASE WHEN qv.id IS NOT NULL
                               THEN json_build_object('code', qv.waiting_code, 'message', qv.waiting_message) END,
        'estimated_start_at', sftq._iso(qv.estimated_start_at),
        'estimated_finish_at', sftq._iso(fin.finish_at),
        'estimate', CASE WHEN qv.id IS NOT NULL THEN json_build_object('basis', qv.estimate_basis)
                         WHEN fin.finish_at IS NOT NULL THEN json_build_object('basis', fin.basis) END,
        'provider_state', j.provider_state,
        'progress', CASE WHEN j.progress_percent IS NOT NULL OR j.progress_epoch IS NOT NULL
                         THEN json_build_object('percent', j.progress_percent, 'epoch', j.progress_epoch) END,
        'estimated_cost', j.estimated_cost)
      FROM j
      LEFT JOIN qv ON true
      LEFT JOIN fin ON true
$$;
COMMENT ON FUNCTION sftq.job_analytics(bigint, uuid, timestamptz, interval, interval) IS
    'GET /jobs/{id}/analytics: timeline, queue wait, run duration and GPU hours of one of the caller''s jobs (null where not known yet); for a QUEUED job its queue_position, waiting_reason, estimated_start_at and estimate (sftq.queue_view up to this job); for a PROGRESS job estimated_finish_at and estimate (sftq.finish_estimate); the provider''s state, progress and estimated cost as last reported. SQ404 when not theirs. Reads only.';

CREATE OR REPLACE FUNCTION sftq.job_analytics(p_user_id bigint, p_job_id uuid)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.job_analytics(p_user_id, p_job_id, now(), interval '30 seconds', interval '5 minutes')
$$;
COMMENT ON FUNCTION sftq.job_analytics(bigint, uuid) IS
    'sftq.job_analytics at now() with the default tick interval (30 s) and usage grace (300 s); SQ404 when not the caller''s. Reads only.';
