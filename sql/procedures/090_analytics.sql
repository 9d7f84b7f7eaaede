-- Per-user analytics with the contract's shapes and definitions. All read-only.

CREATE OR REPLACE FUNCTION sftq.queue_context(p_user_id bigint)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH mine AS (
        -- At most 100 of the caller's queued jobs, oldest first (documented bound).
        SELECT q.*, row_number() OVER (ORDER BY q.created_at, q.id) AS k
          FROM (SELECT j.id, j.display_name, j.kind, j.gpu_count, j.created_at
                  FROM sftq.jobs j
                 WHERE j.user_id = p_user_id AND j.state = 'QUEUED'
                 ORDER BY j.created_at, j.id
                 LIMIT 100) q
    ), gaps AS (
        -- queue_position (the contract's: other users' QUEUED jobs created earlier) in ONE
        -- walk of jobs_queued_idx instead of one count from the queue's start per job:
        -- n = every QUEUED job from my previous listed job (inclusive) up to this one
        -- (exclusive). Mine are consecutive in FIFO order, so the running sum of n is the
        -- number of all QUEUED jobs ahead of this one, of which k - 1 are mine. The counts
        -- touch only (created_at, id) of the partial index, so they are index-only scans.
        SELECT m.*,
               (SELECT count(*) FROM sftq.jobs o
                 WHERE o.state = 'QUEUED'
                   AND (o.created_at, o.id) < (m.created_at, m.id)
                   AND (o.created_at, o.id) >= (COALESCE(p.created_at, '-infinity'),
                                                COALESCE(p.id, '00000000-0000-0000-0000-000000000000'))
               ) AS n
          FROM mine m
          LEFT JOIN mine p ON p.k = m.k - 1
    ), ranked AS (
        SELECT g.*, (sum(g.n) OVER (ORDER BY g.k) - (g.k - 1))::bigint AS queue_position
          FROM gaps g
    )
    SELECT json_build_object(
        'your_progress_job', (
            SELECT json_build_object('id', j.id, 'display_name', j.display_name, 'kind', j.kind,
                                     'gpu_count', j.gpu_count, 'started_at', sftq._iso(j.started_at),
                                     'fireworks_job_name', j.fireworks_job_name)
              FROM sftq.jobs j
             WHERE j.user_id = p_user_id AND j.state = 'PROGRESS'
             ORDER BY j.started_at, j.id
             LIMIT 1),
        'your_queued_jobs', COALESCE((
            SELECT json_agg(json_build_object('id', r.id, 'display_name', r.display_name, 'kind', r.kind,
                                              'gpu_count', r.gpu_count, 'created_at', sftq._iso(r.created_at),
                                              'queue_position', r.queue_position)
                            ORDER BY r.created_at, r.id)
              FROM ranked r), '[]'::json),
        'global_queue_depth', (SELECT COALESCE(sum(u.queued_count), 0)::bigint FROM sftq.users u),
        'global_progress_count', (SELECT count(*) FROM sftq.jobs j WHERE j.state = 'PROGRESS'),
        'global_gpu_in_use', (SELECT COALESCE(sum(j.gpu_count), 0)::bigint FROM sftq.jobs j WHERE j.state = 'PROGRESS'))
$$;
COMMENT ON FUNCTION sftq.queue_context(bigint) IS
    'The caller''s running job, their queued jobs (first 100) with queue_position = other users'' QUEUED jobs created earlier, and global depth, running count and GPUs in use. Cost: the positions take one index-only walk of the queue up to the caller''s 100th listed job (O(its position)); the global figures read the users table and the running jobs only. Reads only, takes no locks.';

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

CREATE OR REPLACE FUNCTION sftq.job_analytics(p_user_id bigint, p_job_id uuid)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT json_build_object(
        'id', j.id, 'display_name', j.display_name, 'kind', j.kind, 'state', j.state,
        'gpu_count', j.gpu_count, 'fireworks_job_name', j.fireworks_job_name,
        'timeline', json_build_object('queued_at', sftq._iso(j.created_at),
                                      'started_at', sftq._iso(j.started_at),
                                      'completed_at', sftq._iso(j.completed_at)),
        'queue_wait_seconds', round(extract(epoch FROM j.started_at - j.created_at))::bigint,
        'run_duration_seconds', round(extract(epoch FROM j.completed_at - j.started_at))::bigint,
        'gpu_hours', round(j.gpu_count * extract(epoch FROM j.completed_at - j.started_at) / 3600, 3),
        'error', j.error)
      FROM sftq.get_job(p_user_id, p_job_id) j
$$;
COMMENT ON FUNCTION sftq.job_analytics(bigint, uuid) IS
    'Timeline, queue wait, run duration and GPU hours of one of the caller''s jobs (null where not known yet); SQ404 when not theirs.';
