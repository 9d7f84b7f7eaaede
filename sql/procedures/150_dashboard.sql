-- What the web dashboard reads beyond the other routes (issue 14). The dashboard is a client of
-- the public API like any other, so each of these is a public, read-only route any valid key
-- may call, bounded in size and in cost:
--   GET /queue                    the head of the queue, anonymised (sftq.public_queue)
--   GET /jobs/{id}/payload        one of your jobs' payloads, secrets redacted
--   GET /jobs/analytics/history   your waits and run times over time, success by kind
--   GET /capacity/history         GPUs in use over the last 24 hours or 7 days
-- Reasons and estimates come from the visibility procedures (060_admission.sql,
-- 065_forecast.sql): the same admission walk, the same reason codes, the same forecast.

-- ---------------------------------------------------------------------------------------
-- The queue as everyone sees it.
-- ---------------------------------------------------------------------------------------

-- How a waiting reason reads for a job that is not the reader's: the code is the one
-- sftq.waiting_reason gave; the owner's own sentence speaks to them ("your ..."), so the
-- codes that describe the owner are worded in the third person, naming no one.
CREATE OR REPLACE FUNCTION sftq.waiting_message_for_others(
    p_code       text,
    p_message    text,
    p_own_ahead  bigint)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE p_code
        WHEN 'user_disabled' THEN
            'Its submitter''s account is disabled: it is not admitted until an administrator enables it again.'
        WHEN 'behind_own_queued_job' THEN
            format('Behind %s earlier queued job%s of the same submitter, which start first.',
                   p_own_ahead, CASE WHEN p_own_ahead = 1 THEN '' ELSE 's' END)
        WHEN 'behind_own_running_job' THEN
            'Its submitter is at their cap on running jobs: it is admitted when one of theirs ends.'
        -- does_not_fit, behind_job_that_does_not_fit, next_tick, scheduler_stalled speak of
        -- GPUs and the scheduler only.
        ELSE p_message
    END
$$;
COMMENT ON FUNCTION sftq.waiting_message_for_others(text, text, bigint) IS
    'The sentence GET /queue shows for another user''s queued job: the owner-facing message of sftq.waiting_reason reworded in the third person for the codes that describe the owner (user_disabled, behind_own_queued_job, behind_own_running_job), unchanged for the others. Names no user and no job. Pure.';

CREATE OR REPLACE FUNCTION sftq.public_queue(
    p_user_id        bigint,
    p_limit          integer,
    p_now            timestamptz,
    p_tick_interval  interval,
    p_usage_grace    interval)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
-- The planner guesses a thousand rows for each function it calls here, so the plan's cost
-- passes jit_above_cost: on a server with JIT on, compiling it took about 1.8 s of a 20 ms
-- answer. Off for everything it runs (as sftq.queue_view_many).
SET jit = off
AS $$
    WITH st AS MATERIALIZED (
        SELECT * FROM sftq.scheduler_status(p_now, p_tick_interval, p_usage_grace)
    ), head AS MATERIALIZED (
        -- The first p_limit queued jobs in FIFO order (jobs_queued_idx). Every queued job of a
        -- user that comes before one listed here is listed too, so own_ahead is exact.
        SELECT q.*,
               row_number() OVER (ORDER BY q.created_at, q.id) AS position,
               -- A job waiting for a dependency (200_pipelines.sql) is ahead of nobody.
               count(*) FILTER (WHERE q.waiting_on IS NULL) OVER (
                   PARTITION BY q.user_id ORDER BY q.created_at, q.id
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS own_ahead
          FROM (SELECT j.id, j.user_id, j.kind, j.gpu_count, j.created_at, j.display_name, j.waiting_on
                  FROM sftq.jobs j
                 WHERE j.state = 'QUEUED'
                 ORDER BY j.created_at, j.id
                 LIMIT p_limit) q
    ), walk AS MATERIALIZED (
        -- The walk admission would make now with the quota as last read (as sftq.queue_view).
        SELECT w.* FROM st CROSS JOIN LATERAL sftq._admission_walk(COALESCE(st.free_gpus, 0)) w
    ), blocker AS (
        -- The head that does not fit, if any (the walk ends there: one row at most).
        SELECT w.job_id, w.created_at, w.gpu_count, w.budget_before FROM walk w WHERE NOT w.fits
    ), facts AS MATERIALIZED (
        SELECT h.*, u.disabled_at IS NOT NULL AS disabled, u.running_count, u.max_running,
               w.fits, w.budget_before, (b.created_at, b.job_id) < (h.created_at, h.id) AS behind_blocker
          FROM head h
          JOIN sftq.users u ON u.id = h.user_id
          LEFT JOIN walk w ON w.job_id = h.id
          LEFT JOIN blocker b ON true
    ), reasons AS MATERIALIZED (
        -- Every listed job's reason in one call (sftq.waiting_reasons): job n's is element n.
        SELECT f.*,
               CASE WHEN f.waiting_on IS NOT NULL THEN 'waiting_for_dependency'
                    ELSE rs.codes[f.position] END AS code,
               -- sftq.dependency_waiting_message (200_pipelines.sql, applied after this file).
               CASE WHEN f.waiting_on IS NOT NULL THEN (
                        SELECT format('Waits for your job %s (%s) to succeed: a job starts only when every job in its "after" is SUCCESS, and is cancelled if one of them fails or is cancelled.',
                                      d.id, d.state)
                          FROM sftq.jobs d WHERE d.id = f.waiting_on)
                    ELSE rs.messages[f.position] END AS message
          FROM facts f
         CROSS JOIN (
               SELECT array_agg(r.code ORDER BY r.ord) AS codes,
                      array_agg(r.message ORDER BY r.ord) AS messages
                 FROM st CROSS JOIN LATERAL sftq.waiting_reasons(
                          (SELECT array_agg(ROW(x.gpu_count, x.own_ahead, x.disabled,
                                                x.running_count, x.max_running, x.fits,
                                                x.budget_before, x.behind_blocker)::sftq.waiting_facts
                                            ORDER BY x.position)
                             FROM facts x),
                          (SELECT b.gpu_count FROM blocker b), (SELECT b.budget_before FROM blocker b),
                          st.stalled) r) rs
    ), lists AS MATERIALIZED (
        -- The caller's listed jobs are the start of their queue, as sftq.forecast wants them
        -- for one user; all listed jobs are the head of the whole queue, as it wants them for
        -- everyone (user NULL). p_ahead is every queued job ahead (position - 1), as
        -- sftq.queue_view passes.
        SELECT h.user_id = p_user_id AS mine,
               array_agg(h.id ORDER BY h.position) AS jobs,
               array_agg(h.position - 1 ORDER BY h.position) AS ahead,
               array_agg(h.kind ORDER BY h.position) AS kinds,
               array_agg(h.gpu_count ORDER BY h.position) AS gpus
          FROM head h
         GROUP BY GROUPING SETS ((h.user_id = p_user_id), ())
    ), fc_mine AS MATERIALIZED (
        -- The caller's own jobs: the estimates GET /jobs/analytics/queue gives them.
        SELECT f.*
          FROM st
          JOIN lists l ON l.mine
         CROSS JOIN LATERAL sftq.forecast(p_user_id, l.jobs, l.ahead, l.kinds, l.gpus, p_now,
                                          st.free_gpus, st.last_tick_at, p_tick_interval, NULL,
                                          1000, 500) f
         WHERE st.stalled IS NULL
    ), fc_all AS MATERIALIZED (
        -- Everyone else's: one simulation for the whole list.
        SELECT f.*
          FROM st
          JOIN lists l ON l.mine IS NULL
         CROSS JOIN LATERAL sftq.forecast(NULL, l.jobs, l.ahead, l.kinds, l.gpus, p_now,
                                          st.free_gpus, st.last_tick_at, p_tick_interval, NULL,
                                          p_limit + 50, 2 * p_limit + 100) f
         WHERE st.stalled IS NULL
    ), fc AS (
        SELECT r.id AS job_id,
               CASE WHEN r.user_id = p_user_id THEN m.estimated_start_at ELSE a.estimated_start_at END
                   AS estimated_start_at,
               CASE WHEN r.user_id = p_user_id THEN m.basis ELSE a.basis END AS basis
          FROM head r
          LEFT JOIN fc_mine m ON m.job_id = r.id
          LEFT JOIN fc_all a ON a.job_id = r.id
    ), mine AS (
        SELECT COALESCE(u.queued_count, 0) AS queued FROM sftq.users u WHERE u.id = p_user_id
    )
    SELECT json_build_object(
        'depth', (SELECT COALESCE(sum(u.queued_count), 0)::bigint FROM sftq.users u),
        'limit', p_limit,
        'has_more', (SELECT COALESCE(sum(u.queued_count), 0) FROM sftq.users u)
                    > (SELECT count(*) FROM head),
        'your_queued_jobs', COALESCE((SELECT m.queued FROM mine m), 0),
        'items', COALESCE((
            SELECT json_agg(json_build_object(
                       'position', r.position,
                       'mine', r.user_id = p_user_id,
                       'id', CASE WHEN r.user_id = p_user_id THEN r.id END,
                       'display_name', CASE WHEN r.user_id = p_user_id THEN r.display_name END,
                       'kind', r.kind,
                       'gpu_count', r.gpu_count,
                       -- Another user's enqueue time only to the second: enough to read a
                       -- wait, too coarse to match against anything else of theirs.
                       'created_at', sftq._iso(CASE WHEN r.user_id = p_user_id THEN r.created_at
                                                    ELSE date_trunc('second', r.created_at) END),
                       'waiting_reason', json_build_object(
                           'code', r.code,
                           'message', CASE WHEN r.user_id = p_user_id THEN r.message
                                           WHEN r.code = 'waiting_for_dependency' THEN
                                               'Waits for another job of its submitter to succeed first.'
                                           ELSE sftq.waiting_message_for_others(r.code, r.message, r.own_ahead) END),
                       'estimated_start_at', sftq._iso(fc.estimated_start_at),
                       'estimate', json_build_object('basis', CASE
                           WHEN fc.basis IS NULL THEN
                               'no estimate: the scheduler is not running normally (see waiting_reason)'
                           WHEN r.user_id = p_user_id THEN fc.basis
                           ELSE regexp_replace(fc.basis, '\myour\M', 'its submitter''s', 'g') END))
                   ORDER BY r.position)
              FROM reasons r
              LEFT JOIN fc ON fc.job_id = r.id), '[]'::json))
$$;
COMMENT ON FUNCTION sftq.public_queue(bigint, integer, timestamptz, interval, interval) IS
    'GET /queue: the first p_limit QUEUED jobs in FIFO order, anonymised: position (1 = first in line), kind, gpu_count, created_at, the waiting reason (sftq.waiting_reasons over sftq._admission_walk with the budget of sftq.scheduler_status, exactly as sftq.queue_view) and the estimated start (sftq.forecast: once for the caller''s own jobs, which get the estimates GET /jobs/analytics/queue gives, and once for the whole list). Only the caller''s own jobs carry id and display_name; other users'' jobs carry neither, nor a user name, nor a payload, and their created_at is truncated to the second. Cost: one index range of p_limit entries of jobs_queued_idx, one admission walk, and two bounded forecasts (p_limit is at most 100), however many users are on the list. Reads only, takes no locks.';

CREATE OR REPLACE FUNCTION sftq.api_public_queue(
    p_key_hash       bytea,
    p_limit          integer,
    p_tick_interval  interval,
    p_usage_grace    interval)
RETURNS json
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._auth(p_key_hash);
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'limit must be an integer from 1 to 100';
    END IF;
    RETURN sftq.public_queue(v_user, p_limit, now(), p_tick_interval, p_usage_grace);
END
$$;
COMMENT ON FUNCTION sftq.api_public_queue(bytea, integer, interval, interval) IS 'GET /queue. Any valid key; see sftq.public_queue.';

-- ---------------------------------------------------------------------------------------
-- A job's payload, as its owner may read it back.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.api_job_payload(p_key_hash bytea, p_job_id uuid)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT json_build_object('id', j.id,
                             'fireworks_payload', sftq.redact_secrets(j.fireworks_payload))
      FROM sftq.get_job(sftq._auth(p_key_hash), p_job_id) j
$$;
COMMENT ON FUNCTION sftq.api_job_payload(bytea, uuid) IS
    'GET /jobs/:id/payload: the job''s fireworks_payload with every secret-looking key''s value replaced by "[REDACTED]" (sftq.redact_secrets, the analysts'' rule), so the secret never leaves the database. SQ404 when not the caller''s. Reads one row.';

-- ---------------------------------------------------------------------------------------
-- Your waits and run times over time, and how each kind of job ended.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.job_history(
    p_user_id  bigint,
    p_days     integer,
    p_now      timestamptz,
    p_max_jobs integer DEFAULT 5000)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH prm AS (
        SELECT p_now - p_days * interval '1 day' AS since,
               -- Hours for a day or two, days beyond: at most 91 buckets.
               CASE WHEN p_days <= 2 THEN 3600 ELSE 86400 END AS step
    ), recent AS MATERIALIZED (
        -- The newest p_max_jobs of the caller's jobs enqueued in the window: a range of
        -- jobs_user_created_idx, whatever the length of the caller's history.
        SELECT j.kind, j.state, j.created_at,
               extract(epoch FROM j.started_at - j.created_at)::float8 AS wait,
               CASE WHEN j.state IN ('SUCCESS', 'FAIL')
                    THEN extract(epoch FROM j.completed_at - j.started_at)::float8 END AS run
          FROM sftq.jobs j, prm
         WHERE j.user_id = p_user_id
           AND j.created_at > prm.since AND j.created_at <= p_now
         ORDER BY j.created_at DESC, j.id DESC
         LIMIT p_max_jobs
    ), bucketed AS (
        SELECT r.*, floor(extract(epoch FROM r.created_at) / prm.step)::bigint AS b
          FROM recent r, prm
    ), slots AS (
        SELECT s AS b
          FROM prm, generate_series(floor(extract(epoch FROM prm.since) / prm.step)::bigint,
                                    floor(extract(epoch FROM p_now) / prm.step)::bigint) s
    ), per_bucket AS (
        SELECT s.b,
               count(x.created_at) AS jobs,
               count(x.wait) AS started,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY x.wait) AS wait_p50,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY x.wait) AS wait_p90,
               count(x.run) AS finished,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY x.run) AS run_p50,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY x.run) AS run_p90
          FROM slots s
          LEFT JOIN bucketed x ON x.b = s.b
         GROUP BY s.b
    ), kinds AS (
        SELECT k.kind,
               count(r.state) FILTER (WHERE r.state = 'SUCCESS') AS succeeded,
               count(r.state) FILTER (WHERE r.state = 'FAIL') AS failed,
               count(r.state) FILTER (WHERE r.state = 'CANCELLED') AS cancelled,
               count(r.state) FILTER (WHERE r.state IN ('QUEUED', 'PROGRESS')) AS open
          FROM (VALUES ('SFT'), ('DPO'), ('RFT')) k(kind)
          LEFT JOIN recent r ON r.kind = k.kind
         GROUP BY k.kind
    )
    SELECT json_build_object(
        'days', p_days,
        'bucket_seconds', prm.step,
        'from', sftq._iso(prm.since),
        'to', sftq._iso(p_now),
        'jobs', (SELECT count(*) FROM recent),
        'truncated', (SELECT count(*) FROM recent) >= p_max_jobs,
        'buckets', (SELECT json_agg(json_build_object(
                        'start', sftq._iso(to_timestamp(pb.b * prm.step)),
                        'jobs', pb.jobs,
                        'started', pb.started,
                        'wait_p50_seconds', round(pb.wait_p50::numeric, 1),
                        'wait_p90_seconds', round(pb.wait_p90::numeric, 1),
                        'finished', pb.finished,
                        'run_p50_seconds', round(pb.run_p50::numeric, 1),
                        'run_p90_seconds', round(pb.run_p90::numeric, 1))
                        ORDER BY pb.b)
                      FROM per_bucket pb),
        'by_kind', (SELECT json_agg(json_build_object(
                        'kind', k.kind, 'succeeded', k.succeeded, 'failed', k.failed,
                        'cancelled', k.cancelled, 'open', k.open,
                        'success_rate', CASE WHEN k.succeeded + k.failed + k.cancelled > 0
                            THEN round(k.succeeded::numeric / (k.succeeded + k.failed + k.cancelled), 3) END)
                        ORDER BY array_position(ARRAY['SFT', 'DPO', 'RFT'], k.kind))
                      FROM kinds k))
      FROM prm
$$;
COMMENT ON FUNCTION sftq.job_history(bigint, integer, timestamptz, integer) IS
    'GET /jobs/analytics/history: the caller''s jobs enqueued in the p_days before p_now (the newest p_max_jobs of them; truncated says when there were more), grouped by enqueue hour (p_days <= 2) or day: jobs, started, median and p90 queue wait (admission - enqueue) of those admitted, finished, median and p90 run time (admission - end) of those that ran to SUCCESS or FAIL; and per kind succeeded, failed, cancelled, open and success_rate = SUCCESS / (SUCCESS + FAIL + CANCELLED) (the summary''s definition) or null. Every bucket of the window is listed, empty ones with zero counts and null times. Cost: one range of jobs_user_created_idx of at most p_max_jobs rows. Reads only.';

CREATE OR REPLACE FUNCTION sftq.api_job_history(p_key_hash bytea, p_days integer)
RETURNS json
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user bigint := sftq._auth(p_key_hash);
BEGIN
    IF p_days IS NULL OR p_days < 1 OR p_days > 90 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'days must be an integer from 1 to 90';
    END IF;
    RETURN sftq.job_history(v_user, p_days, now());
END
$$;
COMMENT ON FUNCTION sftq.api_job_history(bytea, integer) IS 'GET /jobs/analytics/history. See sftq.job_history.';

-- ---------------------------------------------------------------------------------------
-- GPUs in use over time, from what each tick read and held.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.gpu_history(
    p_window  interval,
    p_step    interval,
    p_now     timestamptz)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH pts AS (
        SELECT g AS at FROM generate_series(p_now - p_window + p_step, p_now, p_step) g
    )
    SELECT json_build_object(
        'window_seconds', extract(epoch FROM p_window)::bigint,
        'step_seconds', extract(epoch FROM p_step)::bigint,
        'points', json_agg(json_build_object(
                      'at', sftq._iso(pts.at),
                      'tick_at', sftq._iso(t.started_at),
                      'quota_limit', t.quota_limit,
                      'quota_usage', t.quota_usage,
                      'queue_gpus', t.ours)
                  ORDER BY pts.at))
      FROM pts
      LEFT JOIN LATERAL (
          -- The newest tick that read the quota in (at - step, at]: one probe of
          -- scheduler_ticks_quota_idx per point, however often the scheduler ticks.
          SELECT s.started_at, s.quota_limit, s.quota_usage,
                 CASE WHEN jsonb_typeof(s.detail -> 'ours_total') = 'number'
                      THEN (s.detail ->> 'ours_total')::int END AS ours
            FROM sftq.scheduler_ticks s
           WHERE s.quota_limit IS NOT NULL
             AND s.started_at <= pts.at AND s.started_at > pts.at - p_step
           ORDER BY s.started_at DESC
           LIMIT 1) t ON true
$$;
COMMENT ON FUNCTION sftq.gpu_history(interval, interval, timestamptz) IS
    'GET /capacity/history: one point every p_step over the p_window before p_now, each from the newest tick that read the quota within that step: quota_limit and quota_usage (the provider''s figures) and queue_gpus (GPUs of the queue''s PROGRESS jobs when that tick computed its budget); null where no tick read the quota in the step (the scheduler was not running, or could not reach the provider). Cost: one index probe of scheduler_ticks_quota_idx per point. Reads only.';

CREATE OR REPLACE FUNCTION sftq.api_gpu_history(p_key_hash bytea, p_window text)
RETURNS json
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM sftq._auth(p_key_hash);
    IF p_window = '24h' THEN
        RETURN sftq.gpu_history(interval '24 hours', interval '15 minutes', now());
    ELSIF p_window = '7d' THEN
        RETURN sftq.gpu_history(interval '7 days', interval '1 hour', now());
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'window must be 24h or 7d';
END
$$;
COMMENT ON FUNCTION sftq.api_gpu_history(bytea, text) IS
    'GET /capacity/history: window 24h (96 points, 15 minutes apart) or 7d (168 points, an hour apart); any other window is SQ400. Any valid key.';
