-- The queue's capacity, as any key holder may see it: GET /capacity.

CREATE OR REPLACE FUNCTION sftq.capacity(
    p_user_id        bigint,
    p_show_users     boolean,
    p_now            timestamptz,
    p_tick_interval  interval,
    p_usage_grace    interval,
    p_quota_id       text)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH st AS (
        SELECT * FROM sftq.scheduler_status(p_now, p_tick_interval, p_usage_grace)
    ), work AS (
        SELECT j.user_id,
               count(*) FILTER (WHERE j.state = 'PROGRESS') AS running_jobs,
               COALESCE(sum(j.gpu_count) FILTER (WHERE j.state = 'PROGRESS'), 0) AS running_gpus,
               count(*) FILTER (WHERE j.state = 'QUEUED') AS queued_jobs,
               COALESCE(sum(j.gpu_count) FILTER (WHERE j.state = 'QUEUED'), 0) AS queued_gpus
          FROM sftq.jobs j
         WHERE j.state IN ('QUEUED', 'PROGRESS')
         GROUP BY j.user_id
    ), per_user AS (
        SELECT w.*, u.name, u.max_running AS cap FROM work w JOIN sftq.users u ON u.id = w.user_id
    ), shown AS (
        -- With p_show_users false every other user is folded into one "others" row.
        SELECT p.name, p.cap, p.running_jobs, p.running_gpus, p.queued_jobs, p.queued_gpus
          FROM per_user p
         WHERE p_show_users OR p.user_id = p_user_id
        UNION ALL
        SELECT 'others', NULL, sum(p.running_jobs), sum(p.running_gpus), sum(p.queued_jobs),
               sum(p.queued_gpus)
          FROM per_user p
         WHERE NOT p_show_users AND p.user_id <> p_user_id
        HAVING count(*) > 0
    )
    SELECT json_build_object(
        'quota', json_build_object('id', COALESCE(st.quota_name, p_quota_id),
                                   'limit', st.quota_limit, 'usage', st.quota_usage,
                                   'read_at', sftq._iso(st.quota_read_at)),
        -- GREATEST would turn a missing reading (NULL) into 0.
        'free_gpus', CASE WHEN st.free_gpus IS NOT NULL THEN GREATEST(st.free_gpus, 0) END,
        'running', (SELECT json_build_object('jobs', COALESCE(sum(p.running_jobs), 0),
                                             'gpus', COALESCE(sum(p.running_gpus), 0))
                      FROM per_user p),
        'queued', (SELECT json_build_object('jobs', COALESCE(sum(p.queued_jobs), 0),
                                            'gpus', COALESCE(sum(p.queued_gpus), 0))
                     FROM per_user p),
        'users', COALESCE((
            SELECT json_agg(json_build_object('name', s.name, 'cap', s.cap,
                                              'running_jobs', s.running_jobs,
                                              'running_gpus', s.running_gpus,
                                              'queued_jobs', s.queued_jobs,
                                              'queued_gpus', s.queued_gpus)
                            ORDER BY s.running_gpus DESC, s.queued_gpus DESC, s.name)
              FROM shown s), '[]'::json),
        'scheduler', json_build_object('last_tick_at', sftq._iso(st.last_tick_at),
                                       'interval_seconds', extract(epoch FROM p_tick_interval)::float8,
                                       'healthy', st.healthy))
      FROM st
$$;
COMMENT ON FUNCTION sftq.capacity(bigint, boolean, timestamptz, interval, interval, text) IS
    'GET /capacity: the GPU quota as last read (id: the name the tick recorded, else p_quota_id), free_gpus (what admission could spend now with that reading, never below 0), running and queued jobs and GPUs over everyone, the users with running or queued work (most running GPUs first; with p_show_users false everyone but the caller is folded into one "others" row), and the scheduler''s last tick, interval and health (sftq.scheduler_status). Cost: one pass over the QUEUED and PROGRESS jobs. Reads only, takes no locks.';

CREATE OR REPLACE FUNCTION sftq.api_capacity(
    p_key_hash       bytea,
    p_show_users     boolean,
    p_tick_interval  interval,
    p_usage_grace    interval,
    p_quota_id       text)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.capacity(sftq._auth(p_key_hash), p_show_users, now(), p_tick_interval,
                         p_usage_grace, p_quota_id)
$$;
COMMENT ON FUNCTION sftq.api_capacity(bytea, boolean, interval, interval, text) IS 'GET /capacity. Any valid key.';
