-- Waiting reasons and estimates: what the queue looks like from one user's side.
--
-- Everything here reads only (the analytics function may run on a replica). The facts come
-- from the same places admission takes them: the admission walk (060_admission.sql), the
-- GPU budget (sftq.admission_budget) with the quota the scheduler read last, the users'
-- caps and heads. docs/scheduling.md ("Why a job waits, and when it should start")
-- explains the model in prose.

CREATE OR REPLACE FUNCTION sftq._human_seconds(p_seconds numeric)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN p_seconds IS NULL THEN NULL
        WHEN p_seconds < 1.5 THEN '1 second'
        WHEN p_seconds < 90 THEN round(p_seconds) || ' seconds'
        WHEN p_seconds < 5400 THEN round(p_seconds / 60) || ' minutes'
        WHEN p_seconds < 172800 THEN round(p_seconds / 3600, 1) || ' hours'
        ELSE round(p_seconds / 86400, 1) || ' days'
    END
$$;
COMMENT ON FUNCTION sftq._human_seconds(numeric) IS 'A duration for a sentence: "45 seconds", "12 minutes", "3.5 hours", "2.0 days".';

CREATE OR REPLACE FUNCTION sftq.default_run_seconds()
RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 3600::float8
$$;
COMMENT ON FUNCTION sftq.default_run_seconds() IS
    'The run time estimates assume (1 hour) for a job when no job of the same kind and GPU class finished in the last 30 days.';

-- ---------------------------------------------------------------------------------------
-- The scheduler as the API sees it: when it last ran, the quota it last read, the budget.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.scheduler_status(
    p_now            timestamptz DEFAULT now(),
    p_tick_interval  interval DEFAULT interval '30 seconds',
    p_usage_grace    interval DEFAULT interval '5 minutes')
RETURNS TABLE (last_tick_at timestamptz, quota_limit integer, quota_usage numeric,
               quota_read_at timestamptz, quota_name text, free_gpus integer,
               healthy boolean, stalled text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH t AS (
        SELECT max(s.started_at) AS at FROM sftq.scheduler_ticks s
    ), q AS (
        -- The newest tick that read the quota (scheduler_ticks_quota_idx), even if later
        -- ticks could not: admission and the reasons both work from the last reading.
        -- A tick that created jobs reads usage again after its creates (usage_after) and marks
        -- the jobs that reading counts (sftq.record_usage_reading): that reading is the one
        -- admission_budget must pair with those marks, or counted jobs would be in neither.
        SELECT s.quota_limit,
               COALESCE((s.detail ->> 'usage_after')::numeric, s.quota_usage) AS quota_usage,
               COALESCE(s.finished_at, s.started_at) AS read_at,
               s.detail -> 'quota' ->> 'name' AS name
          FROM sftq.scheduler_ticks s
         WHERE s.quota_limit IS NOT NULL
         ORDER BY s.started_at DESC
         LIMIT 1
    ), x AS (
        SELECT t.at, q.quota_limit, q.quota_usage, q.read_at, q.name,
               CASE
                 WHEN t.at IS NULL THEN
                     'The scheduler has not run yet: nothing is admitted until it does.'
                 WHEN p_now - t.at > 3 * p_tick_interval THEN
                     format('The scheduler has not run for %s (it should run every %s): nothing is admitted until it is back.',
                            sftq._human_seconds(extract(epoch FROM p_now - t.at)),
                            sftq._human_seconds(extract(epoch FROM p_tick_interval)))
                 WHEN q.read_at IS NULL THEN
                     'The scheduler has not read the GPU quota from the provider yet: nothing is admitted until it can.'
                 WHEN p_now - q.read_at > 3 * p_tick_interval THEN
                     format('The scheduler has not been able to read the GPU quota from the provider for %s: nothing is admitted until it can.',
                            sftq._human_seconds(extract(epoch FROM p_now - q.read_at)))
               END AS stalled
          FROM t LEFT JOIN q ON true
    )
    SELECT x.at, x.quota_limit, x.quota_usage, x.read_at, x.name,
           (SELECT b.budget FROM sftq.admission_budget(x.quota_limit, x.quota_usage, p_usage_grace, p_now) b),
           x.stalled IS NULL, x.stalled
      FROM x
$$;
COMMENT ON FUNCTION sftq.scheduler_status(timestamptz, interval, interval) IS
    'The scheduler as seen from the API: the last tick, the GPU quota it last read (limit, usage, when, name if the tick recorded one), free_gpus = sftq.admission_budget of that reading now (what admission would spend if it ran now with the same reading), and stalled: NULL while healthy, else the sentence users see (scheduler_stalled): no tick for more than 3 x p_tick_interval, or no quota reading for that long (admission does not run without one). Reads two index entries; takes no locks.';

-- ---------------------------------------------------------------------------------------
-- Run times: the provider's progress, else recent similar jobs, else the default.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.median_run(
    p_kind          text,
    p_gpu_class     integer,
    p_now           timestamptz,
    p_longer_than   float8 DEFAULT 0)
RETURNS TABLE (seconds float8, samples integer)
LANGUAGE sql STABLE
-- Not inlined, on purpose (its SET clause prevents it): inlined into the forecast's
-- statements it changes their row estimates (one row for its answer instead of a function
-- scan's default), and the plans built on them have been much worse (tried: the window's
-- jobs joined with their users as a nested loop, the forecast 3-4x slower on the visibility
-- bench's history).
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY r.d), count(*)::int
      FROM (SELECT extract(epoch FROM j.completed_at - j.started_at)::float8 AS d
              FROM sftq.jobs j
             WHERE j.state = 'SUCCESS' AND j.kind = p_kind
               AND sftq.gpu_class(j.gpu_count) = p_gpu_class
               AND j.completed_at > p_now - interval '30 days' AND j.completed_at <= p_now
               AND j.completed_at - j.started_at > p_longer_than * interval '1 second'
             ORDER BY j.completed_at DESC
             LIMIT 200) r
$$;
COMMENT ON FUNCTION sftq.median_run(text, integer, timestamptz, float8) IS
    'Median run time (seconds) of the newest 200 SUCCESS jobs of this kind and GPU class (sftq.gpu_class) that finished in the 30 days before p_now and ran longer than p_longer_than seconds, and how many there were (0: seconds is NULL). The newest 200 rather than all 30 days keep it a short range scan of jobs_success_runs_idx and follow recent changes in the workload. Reads only.';

CREATE OR REPLACE FUNCTION sftq.finish_estimate(
    p_job_id        uuid,
    p_kind          text,
    p_gpu_count     integer,
    p_started_at    timestamptz,
    p_submitted_at  timestamptz,
    p_now           timestamptz,
    p_median        float8 DEFAULT NULL,
    p_samples       integer DEFAULT NULL,
    p_fixed_run     float8 DEFAULT NULL)
RETURNS TABLE (finish_at timestamptz, basis text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ref      timestamptz := COALESCE(p_submitted_at, p_started_at);
    v_p1       numeric;
    v_a1       timestamptz;
    v_p2       numeric;
    v_a2       timestamptz;
    v_elapsed  float8 := GREATEST(extract(epoch FROM p_now - p_started_at), 0);
    v_med      float8 := p_median;
    v_n        integer := p_samples;
    v_class    integer := sftq.gpu_class(p_gpu_count);
BEGIN
    IF p_fixed_run IS NOT NULL THEN
        finish_at := GREATEST(p_started_at + p_fixed_run * interval '1 second', p_now);
        basis := format('fixed run time of %s per job', sftq._human_seconds(p_fixed_run::numeric));
        RETURN NEXT;
        RETURN;
    END IF;
    -- 1. The provider's progress, from the provider_state events the tick writes when the
    -- percent changes: the rate between the first and the last reported percent, or from
    -- the submission to the last one when they are too close together.
    SELECT e.at, (e.detail ->> 'progress_percent')::numeric INTO v_a2, v_p2
      FROM sftq.job_events e
     WHERE e.job_id = p_job_id AND e.event = 'provider_state'
       AND e.detail ? 'progress_percent' AND jsonb_typeof(e.detail -> 'progress_percent') = 'number'
     ORDER BY e.id DESC LIMIT 1;
    IF v_p2 >= 100 THEN
        finish_at := GREATEST(v_a2, p_now);
        basis := 'the provider reports 100% progress: it is finishing';
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_p2 > 0 THEN
        SELECT e.at, (e.detail ->> 'progress_percent')::numeric INTO v_a1, v_p1
          FROM sftq.job_events e
         WHERE e.job_id = p_job_id AND e.event = 'provider_state'
           AND e.detail ? 'progress_percent' AND jsonb_typeof(e.detail -> 'progress_percent') = 'number'
           AND (e.detail ->> 'progress_percent')::numeric > 0
         ORDER BY e.id LIMIT 1;
        IF v_p1 < v_p2 AND v_a2 - v_a1 >= interval '1 minute' THEN
            finish_at := v_a2 + (v_a2 - v_a1) * ((100 - v_p2) / (v_p2 - v_p1))::float8;
        ELSE
            finish_at := v_ref + (v_a2 - v_ref) * (100 / v_p2)::float8;
        END IF;
        finish_at := GREATEST(finish_at, p_now);
        basis := format('from the provider''s progress: %s%% after %s', round(v_p2, 1)::float8,
                        sftq._human_seconds(extract(epoch FROM v_a2 - v_ref)));
        RETURN NEXT;
        RETURN;
    END IF;
    -- 2. Recent similar jobs. A job already past their median is expected to run as long
    -- as the similar jobs that ran at least as long as it has (the median of those).
    IF v_n IS NULL THEN
        SELECT m.seconds, m.samples INTO v_med, v_n FROM sftq.median_run(p_kind, v_class, p_now) m;
    END IF;
    IF v_n > 0 THEN
        IF v_elapsed < v_med THEN
            finish_at := p_started_at + v_med * interval '1 second';
            basis := format('median run time of %s %s job%s on %s GPU%s that finished in the last 30 days',
                            v_n, p_kind, CASE WHEN v_n = 1 THEN '' ELSE 's' END,
                            CASE WHEN v_class = 1 THEN '1' WHEN v_class = 2 THEN '2'
                                 ELSE (v_class / 2 + 1) || '-' || v_class END,
                            CASE WHEN v_class = 1 THEN '' ELSE 's' END);
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT m.seconds, m.samples INTO v_med, v_n
          FROM sftq.median_run(p_kind, v_class, p_now, v_elapsed) m;
        IF v_n > 0 THEN
            finish_at := GREATEST(p_started_at + v_med * interval '1 second', p_now);
            basis := format('median run time of the %s similar job%s that ran longer than its %s so far',
                            v_n, CASE WHEN v_n = 1 THEN '' ELSE 's' END,
                            sftq._human_seconds(v_elapsed::numeric));
        ELSE
            finish_at := p_now;
            basis := format('already running longer (%s) than every similar job of the last 30 days',
                            sftq._human_seconds(v_elapsed::numeric));
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    -- 3. The default.
    finish_at := GREATEST(p_started_at + sftq.default_run_seconds() * interval '1 second', p_now);
    basis := format('default run time of %s: no %s job on a similar GPU count finished in the last 30 days',
                    sftq._human_seconds(sftq.default_run_seconds()::numeric), p_kind);
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION sftq.finish_estimate(uuid, text, integer, timestamptz, timestamptz, timestamptz, float8, integer, float8) IS
    'When a PROGRESS job should end, and why: (1) from the provider''s progress rate when provider_state events report progress_percent; else (2) the median run time of similar jobs (sftq.median_run; p_median/p_samples pass one already read), conditioned on the time it has run when it is past that median; else (3) sftq.default_run_seconds(). p_fixed_run replaces all three with a fixed run time (the baseline the estimate bench compares against). Never earlier than p_now. Reads the job''s events (job_events_job_idx) and at most two short index scans.';

-- ---------------------------------------------------------------------------------------
-- One user's queued jobs with the contract's queue_position.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.my_queue(
    p_user_id     bigint,
    p_upto_at     timestamptz DEFAULT 'infinity',
    p_upto_id     uuid DEFAULT 'ffffffff-ffff-ffff-ffff-ffffffffffff')
RETURNS TABLE (id uuid, display_name text, kind text, gpu_count integer, created_at timestamptz,
               k bigint, queue_position bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL for its plan cache, as sftq.queue_ahead.
    RETURN QUERY
    WITH mine AS MATERIALIZED (
        SELECT q.*, row_number() OVER (ORDER BY q.created_at, q.id) AS k
          FROM (SELECT j.id, j.display_name, j.kind, j.gpu_count, j.created_at
                  FROM sftq.jobs j
                 WHERE j.user_id = p_user_id AND j.state = 'QUEUED'
                   AND (j.created_at, j.id) <= (p_upto_at, p_upto_id)) q
    ), ahead AS (
        -- QUEUED jobs ahead of each (sftq.queue_ahead: the stretch counts, not a walk of the
        -- queue), of which k - 1 are the user's own: the rest is the contract's position.
        SELECT a.* FROM sftq.queue_ahead((SELECT array_agg(m.created_at ORDER BY m.k) FROM mine m),
                                         (SELECT array_agg(m.id ORDER BY m.k) FROM mine m)) a
    )
    SELECT m.id, m.display_name, m.kind, m.gpu_count, m.created_at, m.k, a.ahead - (m.k - 1)
      FROM mine m JOIN ahead a ON a.ord = m.k
     ORDER BY m.k;
END
$$;
COMMENT ON FUNCTION sftq.my_queue(bigint, timestamptz, uuid) IS
    'The caller''s QUEUED jobs in FIFO order (all of them, or those up to and including (p_upto_at, p_upto_id)), with k (1 for their earliest) and queue_position = other users'' QUEUED jobs created earlier (the contract''s definition). Cost: the caller''s queued jobs (jobs_user_queued_idx) and sftq.queue_ahead for them: the stretch counts once and a short range per job, whatever the length of the queue. Reads only.';

-- ---------------------------------------------------------------------------------------
-- The forecast: admission simulated forward from now.
-- ---------------------------------------------------------------------------------------

-- p_owners (several users at once) was added: drop the signature without it.
DROP FUNCTION IF EXISTS sftq.forecast(bigint, uuid[], bigint[], text[], integer[], timestamptz,
                                      integer, timestamptz, interval, float8, integer, integer);

CREATE OR REPLACE FUNCTION sftq.forecast(
    p_user_id        bigint,
    p_jobs           uuid[],
    p_ahead          bigint[],
    p_kinds          text[],
    p_gpus           integer[],
    p_now            timestamptz,
    p_budget         integer,
    p_last_tick      timestamptz,
    p_tick_interval  interval DEFAULT interval '30 seconds',
    p_fixed_run      float8 DEFAULT NULL,
    p_window         integer DEFAULT 600,
    p_max_steps      integer DEFAULT 300,
    p_owners         bigint[] DEFAULT NULL)
RETURNS TABLE (job_id uuid, estimated_start_at timestamptz, basis text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- as sftq.queue_view_many: short queries the planner overestimates
AS $$
DECLARE
    v_tick       float8 := GREATEST(extract(epoch FROM p_tick_interval), 1);
    -- Times are seconds after p_now; ticks run on a fixed grid through the last one.
    v_base       float8 := extract(epoch FROM COALESCE(p_last_tick, p_now) - p_now);
    v_first      float8;
    -- The window: the first p_window queued jobs in FIFO order, indexes 1..v_n.
    w_id         uuid[];
    w_u          integer[];
    w_g          integer[];
    w_d          float8[];
    w_next       integer[];
    w_mine       integer[];
    w_start      float8[];
    v_n          integer;
    v_truncated  boolean;
    -- The window's users, indexes 1..: id, running jobs, cap, not disabled, next head.
    u_ids        bigint[];
    u_run        integer[];
    u_cap        integer[];
    u_ok         boolean[];
    u_head       integer[];
    -- Eligible heads as sorted window indexes; e[ep..ne] are live.
    e            integer[];
    ep           integer := 1;
    ne           integer;
    v_defer      integer[];
    -- Running jobs as sorted keys (end in ms << 20 | ref); r[rp..rn] are live; a_* by ref.
    r            bigint[];
    rp           integer := 1;
    rn           integer;
    a_u          integer[];
    a_g          integer[];
    a_n          integer;
    v_running    integer;
    v_budget     integer := p_budget;
    v_t          float8;
    v_steps      integer := 0;
    v_steps0     integer;
    v_mine_n     integer;
    v_mine_left  integer;
    v_my_u       integer;
    v_stop       text;
    v_blocked    boolean;
    v_block_g    integer;
    v_heads      integer[];
    v_go         integer;
    v_k          integer;
    h            integer;
    u            integer;
    x            integer;
    lo           integer;
    hi           integer;
    mid          integer;
    v_key        bigint;
    v_ref        integer;
    v_cap        integer;
    v_disabled   boolean;
    v_rate       float8;
    v_est        float8[];
    m_d          float8[];
    -- Median run times read once per call, by kind and GPU class (sftq.median_run).
    mk           text[];
    mc           integer[];
    ms           float8[];
    mn           integer[];
    v_ix         integer;
    v_ahead_left bigint;
    v_note       text;
    v_extrapolated text;
    i            integer;
    -- No user: p_jobs are the first jobs of the whole queue, whoever they belong to.
    v_all        boolean := p_user_id IS NULL AND p_owners IS NULL;
    -- Several users: p_jobs are theirs (p_owners[i] owns p_jobs[i]), in FIFO order.
    v_multi      boolean := p_owners IS NOT NULL;
    w_is_mine    boolean[];
    o_ok         boolean[];
    o_cap        integer[];
    o_prev       integer[];
BEGIN
    IF p_jobs IS NULL OR cardinality(p_jobs) = 0 THEN
        RETURN;
    END IF;
    IF v_all OR v_multi THEN
        v_cap := 1; v_disabled := false;  -- per job: admission says who may run below
    ELSE
        SELECT usr.max_running, usr.disabled_at IS NOT NULL INTO v_cap, v_disabled
          FROM sftq.users usr WHERE usr.id = p_user_id;
    END IF;
    IF v_disabled OR v_cap <= 0 OR p_budget IS NULL THEN
        RETURN QUERY
            SELECT j, NULL::timestamptz,
                   CASE WHEN v_disabled THEN 'no estimate: your account is disabled'
                        WHEN v_cap <= 0 THEN 'no estimate: your cap on running jobs is 0'
                        ELSE 'no estimate: the scheduler has not read the GPU quota' END
              FROM unnest(p_jobs) j;
        RETURN;
    END IF;
    v_first := v_base + GREATEST(1, ceil((0 - v_base) / v_tick)) * v_tick;

    -- The window, its users and the eligible heads, in one statement.
    WITH w AS (
        SELECT j.id, j.user_id, j.gpu_count, j.kind,
               row_number() OVER (ORDER BY j.created_at, j.id)::int AS ix
          FROM (SELECT j.id, j.user_id, j.gpu_count, j.kind, j.created_at
                  FROM sftq.jobs j WHERE j.state = 'QUEUED'
                 ORDER BY j.created_at, j.id LIMIT p_window) j
    ), wx AS MATERIALIZED (
        -- One sort by (user, place) numbers the users, links each job to its owner's next
        -- one and marks each owner's head: no join of the jobs with their users, which a
        -- plan built on a low row estimate ran as a nested loop (600 jobs x 600 users).
        SELECT w.*, dense_rank() OVER (ORDER BY w.user_id)::int AS uix,
               COALESCE(lead(w.ix) OVER (PARTITION BY w.user_id ORDER BY w.ix), 0) AS nxt,
               lag(w.ix) OVER (PARTITION BY w.user_id ORDER BY w.ix) IS NULL AS is_head
          FROM w
    ), kc AS MATERIALIZED (
        -- Run times by (kind, gpu_count): one median per kind and GPU class, read once for
        -- all this call needs: the window's jobs, the running jobs (their ends, below) and
        -- the caller's jobs (extrapolated below). The running jobs read here are those read
        -- below: the statements of a STABLE function share one snapshot.
        SELECT kg.kind, kg.gpu_count, sftq.gpu_class(kg.gpu_count) AS c
          FROM (SELECT x.kind, x.gpu_count FROM wx x
                UNION SELECT j.kind, j.gpu_count FROM sftq.jobs j WHERE j.state = 'PROGRESS'
                UNION SELECT y.kind, y.g FROM unnest(p_kinds, p_gpus) AS y(kind, g)) kg
    ), med AS MATERIALIZED (
        SELECT c.kind, c.c, m.seconds, m.samples
          FROM (SELECT DISTINCT kc.kind, kc.c FROM kc) c
         CROSS JOIN LATERAL sftq.median_run(c.kind, c.c, p_now) m
    ), dur AS MATERIALIZED (
        SELECT kc.kind, kc.gpu_count, CASE WHEN med.samples > 0 THEN med.seconds END AS seconds
          FROM kc JOIN med ON med.kind = kc.kind AND med.c = kc.c
    ), wu AS MATERIALIZED (
        -- The window's users, one row each (at their head).
        SELECT x.uix, x.user_id, x.ix AS head, usr.running_count, usr.max_running,
               usr.disabled_at IS NULL AS ok
          FROM wx x JOIN sftq.users usr ON usr.id = x.user_id
         WHERE x.is_head
    )
    -- Each aggregate reads a subquery sorted once (an aggregate fed by a sorted subquery
    -- keeps that order), instead of sorting again per array.
    SELECT a.*, b.*, c.*
      FROM (SELECT array_agg(x.id), array_agg(x.uix), array_agg(x.gpu_count),
                   array_agg(COALESCE(p_fixed_run, x.seconds, sftq.default_run_seconds())),
                   array_agg(x.nxt),
                   array_agg(x.ix) FILTER (WHERE CASE WHEN v_multi THEN x.id = ANY (p_jobs)
                                                      ELSE v_all OR x.user_id = p_user_id END),
                   array_agg(v_multi AND x.id = ANY (p_jobs))
              FROM (SELECT wx.*, dur.seconds FROM wx
                      JOIN dur ON dur.kind = wx.kind AND dur.gpu_count = wx.gpu_count
                     ORDER BY wx.ix) x) a,
           (SELECT array_agg(y.user_id), array_agg(y.running_count), array_agg(y.max_running),
                   array_agg(y.ok), array_agg(y.head),
                   array_agg(y.head ORDER BY y.head)
                       FILTER (WHERE y.ok AND y.running_count < y.max_running)
              FROM (SELECT * FROM wu ORDER BY wu.uix) y) b,
           (SELECT array_agg(med.kind), array_agg(med.c), array_agg(med.seconds),
                   array_agg(med.samples)
              FROM med) c
      INTO w_id, w_u, w_g, w_d, w_next, w_mine, w_is_mine, u_ids, u_run, u_cap, u_ok, u_head, e,
           mk, mc, ms, mn;
    v_n := COALESCE(cardinality(w_id), 0);
    ne := COALESCE(cardinality(e), 0);
    -- A full window may hide more jobs behind it.
    v_truncated := v_n >= p_window;
    w_start := array_fill(NULL::float8, ARRAY[GREATEST(v_n, 1)]);
    -- The caller's jobs in the window are a prefix of p_jobs (both in FIFO order); with no
    -- user, the window's first jobs are.
    v_mine_n := 0;
    WHILE v_mine_n < COALESCE(cardinality(w_mine), 0) AND v_mine_n < cardinality(p_jobs)
          AND w_id[w_mine[v_mine_n + 1]] = p_jobs[v_mine_n + 1] LOOP
        v_mine_n := v_mine_n + 1;
    END LOOP;
    v_mine_left := v_mine_n;
    v_my_u := COALESCE(array_position(u_ids, p_user_id), 0);

    -- Running jobs: when each should end (sftq.finish_estimate), as sorted keys.
    WITH rj AS (
        SELECT j.id, j.user_id, j.gpu_count, j.kind, j.started_at, j.submitted_at,
               row_number() OVER (ORDER BY j.id)::int AS ref
          FROM sftq.jobs j WHERE j.state = 'PROGRESS'
    ), dur AS MATERIALIZED (
        SELECT kg.kind, kg.gpu_count, k.seconds, k.samples
          FROM (SELECT DISTINCT rj.kind, rj.gpu_count FROM rj) kg
          JOIN unnest(mk, mc, ms, mn) AS k(kind, c, seconds, samples)
            ON k.kind = kg.kind AND k.c = sftq.gpu_class(kg.gpu_count)
    ), ends AS (
        SELECT rj.ref, rj.gpu_count, COALESCE(array_position(u_ids, rj.user_id), 0) AS uix,
               (GREATEST(round(extract(epoch FROM f.finish_at - p_now) * 1000), 0)::bigint << 20)
                   + rj.ref AS key
          FROM rj
          JOIN dur med ON med.kind = rj.kind AND med.gpu_count = rj.gpu_count
         CROSS JOIN LATERAL sftq.finish_estimate(rj.id, rj.kind, rj.gpu_count, rj.started_at,
                                                 rj.submitted_at, p_now, med.seconds,
                                                 med.samples, p_fixed_run) f
    )
    SELECT array_agg(ends.key ORDER BY ends.key), array_agg(ends.uix ORDER BY ends.ref),
           array_agg(ends.gpu_count ORDER BY ends.ref)
      FROM ends
      INTO r, a_u, a_g;
    rn := COALESCE(cardinality(r), 0);
    a_n := rn;
    v_running := rn;

    -- The simulation: a walk at each tick after something ends.
    v_t := v_first;
    LOOP
        -- Jobs that end by this tick give back their GPUs and their user's slot.
        WHILE rp <= rn AND (r[rp] >> 20) <= v_t * 1000 LOOP
            v_ref := (r[rp] & 1048575)::int;
            rp := rp + 1;
            v_budget := v_budget + a_g[v_ref];
            u := a_u[v_ref];
            IF u > 0 THEN
                u_run[u] := u_run[u] - 1;
                IF u_ok[u] AND u_run[u] = u_cap[u] - 1 AND u_head[u] > 0 THEN
                    x := u_head[u];
                    lo := ep; hi := ne;
                    WHILE lo <= hi LOOP
                        mid := (lo + hi) / 2;
                        IF e[mid] < x THEN lo := mid + 1; ELSE hi := mid - 1; END IF;
                    END LOOP;
                    e := e[ep:lo - 1] || x || e[lo:ne];
                    ne := ne - ep + 2;
                    ep := 1;
                END IF;
            END IF;
        END LOOP;
        -- The walk: admission's own rule (sftq._walk_admits) decides how many of the
        -- eligible heads, in FIFO order, go at this tick. Every job needs a GPU at least, so
        -- no more than budget + 1 heads can matter.
        v_blocked := false;
        v_defer := '{}';
        v_heads := '{}';
        FOR x IN ep .. LEAST(ne, ep + GREATEST(v_budget, 0)) LOOP
            v_heads := v_heads || w_g[e[x]];
        END LOOP;
        v_go := sftq._walk_admits(v_heads, v_budget);
        IF v_go < cardinality(v_heads) THEN
            v_blocked := true;
            v_block_g := v_heads[v_go + 1];
        END IF;
        FOR v_k IN 1 .. v_go LOOP
            h := e[ep];
            ep := ep + 1;
            w_start[h] := v_t;
            v_budget := v_budget - w_g[h];
            v_steps := v_steps + 1;
            u := w_u[h];
            IF (CASE WHEN v_multi THEN w_is_mine[h] WHEN v_all THEN h <= v_mine_n
                     ELSE u = v_my_u END) THEN
                v_mine_left := v_mine_left - 1;
            END IF;
            u_run[u] := u_run[u] + 1;
            u_head[u] := w_next[h];
            a_n := a_n + 1;
            a_u[a_n] := u;
            a_g[a_n] := w_g[h];
            v_key := (GREATEST(round((v_t + w_d[h]) * 1000), 0)::bigint << 20) + a_n;
            lo := rp; hi := rn;
            WHILE lo <= hi LOOP
                mid := (lo + hi) / 2;
                IF r[mid] < v_key THEN lo := mid + 1; ELSE hi := mid - 1; END IF;
            END LOOP;
            r := r[rp:lo - 1] || v_key || r[lo:rn];
            rn := rn - rp + 2;
            rp := 1;
            -- One admission per user per walk: a user with room for more offers its next
            -- job at the next walk.
            IF u_run[u] < u_cap[u] AND u_head[u] > 0 THEN
                v_defer := v_defer || u;
            END IF;
        END LOOP;
        FOREACH u IN ARRAY v_defer LOOP
            x := u_head[u];
            lo := ep; hi := ne;
            WHILE lo <= hi LOOP
                mid := (lo + hi) / 2;
                IF e[mid] < x THEN lo := mid + 1; ELSE hi := mid - 1; END IF;
            END LOOP;
            e := e[ep:lo - 1] || x || e[lo:ne];
            ne := ne - ep + 2;
            ep := 1;
        END LOOP;
        IF v_steps0 IS NULL THEN
            v_steps0 := v_steps;  -- what the first walk admits at once: not a rate
        END IF;
        IF v_mine_left <= 0 AND v_mine_n = cardinality(p_jobs) THEN v_stop := 'done'; EXIT; END IF;
        IF v_steps >= p_max_steps THEN v_stop := 'steps'; EXIT; END IF;
        IF NOT v_blocked AND v_truncated AND ep > ne THEN
            -- The next head lies beyond the window: what it needs is not known here.
            v_stop := 'horizon'; EXIT;
        END IF;
        IF cardinality(v_defer) > 0 THEN
            -- A user admitted below its cap offers its next job at the very next tick.
            v_t := v_t + v_tick;
            CONTINUE;
        END IF;
        IF rp > rn THEN
            v_stop := CASE WHEN v_blocked THEN 'stuck' ELSE 'idle' END;
            EXIT;
        END IF;
        -- Next walk: the first tick at or after the next expected end.
        v_t := GREATEST(v_t, v_base + ceil((((r[rp] >> 20)::float8 / 1000) - v_base) / v_tick) * v_tick);
    END LOOP;

    -- The answers, in the caller's FIFO order. Jobs the simulation placed start when it
    -- says. Later ones are extrapolated at the rate it admitted jobs, and not before the
    -- caller's own job `cap` places earlier ends (the cap admits them one by one).
    -- The rate: admissions after the first walk over the time they took (the first walk
    -- admits a batch at once, which says nothing about how fast the queue moves).
    v_rate := CASE WHEN v_steps > v_steps0 AND v_t > v_first
                   THEN (v_steps - v_steps0) / (v_t - v_first) END;
    v_est := array_fill(NULL::float8, ARRAY[cardinality(p_jobs)]);
    IF v_stop IN ('steps', 'horizon') AND v_rate IS NOT NULL THEN
        WITH md AS MATERIALIZED (
            SELECT kg.kind, kg.g, CASE WHEN k.samples > 0 THEN k.seconds END AS seconds
              FROM (SELECT DISTINCT y.kind, y.g FROM unnest(p_kinds, p_gpus) AS y(kind, g)) kg
              JOIN unnest(mk, mc, ms, mn) AS k(kind, c, seconds, samples)
                ON k.kind = kg.kind AND k.c = sftq.gpu_class(kg.g)
        )
        SELECT array_agg(COALESCE(p_fixed_run, md.seconds, sftq.default_run_seconds()) ORDER BY t.ord)
          INTO m_d
          FROM unnest(p_kinds, p_gpus) WITH ORDINALITY AS t(kind, g, ord)
          JOIN md ON md.kind = t.kind AND md.g = t.g;
    END IF;
    v_note := CASE WHEN p_fixed_run IS NOT NULL
                   THEN format('fixed run time of %s per job', sftq._human_seconds(p_fixed_run::numeric))
                   ELSE format('run times from the provider''s progress or recent similar jobs, else a default of %s',
                               sftq._human_seconds(sftq.default_run_seconds()::numeric)) END;
    -- What every extrapolated answer says after its own count of jobs ahead, worded once.
    v_extrapolated := format(' jobs ahead, beyond the %s admissions simulated, at their rate of %s jobs per hour; %s',
                             v_steps, round((v_rate * 3600)::numeric, 1), v_note);
    IF v_multi THEN
        -- Each job's owner, as that owner's own forecast sees it: whether they may run
        -- anything, and their job `cap` places earlier (the cap admits theirs one by one).
        SELECT array_agg(t.ok ORDER BY t.o), array_agg(t.cap ORDER BY t.o),
               array_agg(t.prev ORDER BY t.o)
          INTO o_ok, o_cap, o_prev
          FROM (SELECT t.o, usr.disabled_at IS NULL AS ok, usr.max_running AS cap,
                       lag(t.o, GREATEST(usr.max_running, 1)) OVER (PARTITION BY t.uid ORDER BY t.o) AS prev
                  FROM unnest(p_owners) WITH ORDINALITY AS t(uid, o)
                  JOIN sftq.users usr ON usr.id = t.uid) t;
    END IF;
    FOR i IN 1 .. cardinality(p_jobs) LOOP
        job_id := p_jobs[i];
        v_ix := CASE WHEN i <= v_mine_n THEN w_mine[i] ELSE 0 END;
        IF v_multi AND (NOT o_ok[i] OR o_cap[i] <= 0) THEN
            estimated_start_at := NULL;
            basis := CASE WHEN NOT o_ok[i] THEN 'no estimate: your account is disabled'
                          ELSE 'no estimate: your cap on running jobs is 0' END;
        ELSIF v_all AND v_ix > 0 AND (NOT u_ok[w_u[v_ix]] OR u_cap[w_u[v_ix]] <= 0) THEN
            -- Everyone's list: a job whose owner may not run anything, as that owner's own
            -- forecast says it.
            estimated_start_at := NULL;
            basis := CASE WHEN NOT u_ok[w_u[v_ix]] THEN 'no estimate: your account is disabled'
                          ELSE 'no estimate: your cap on running jobs is 0' END;
        ELSIF v_ix > 0 AND w_start[v_ix] IS NOT NULL THEN
            v_est[i] := w_start[v_ix];
            estimated_start_at := p_now + v_est[i] * interval '1 second';
            basis := format('simulated strict-FIFO admission with %s job%s ahead, %s running and %s free GPUs; %s',
                            p_ahead[i], CASE WHEN p_ahead[i] = 1 THEN '' ELSE 's' END,
                            v_running, GREATEST(p_budget, 0), v_note);
        ELSIF v_stop IN ('steps', 'horizon') AND v_rate IS NOT NULL THEN
            -- Two statements, not one with a CASE: an expression with a subquery runs through
            -- the executor every time, a simple one does not (the common case, a job beyond
            -- the window, is simple).
            IF v_ix > 0 THEN
                v_ahead_left := p_ahead[i]
                    - (SELECT count(*) FROM unnest(w_start[1:v_ix - 1]) s WHERE s IS NOT NULL);
            ELSE
                v_ahead_left := p_ahead[i] - v_steps;
            END IF;
            v_est[i] := v_t + (GREATEST(v_ahead_left, 0) + 1) / v_rate;
            IF v_multi THEN
                IF o_prev[i] IS NOT NULL AND v_est[o_prev[i]] IS NOT NULL THEN
                    v_est[i] := GREATEST(v_est[i], v_est[o_prev[i]] + m_d[o_prev[i]]);
                END IF;
            ELSIF NOT v_all AND i > v_cap AND v_est[i - v_cap] IS NOT NULL THEN
                v_est[i] := GREATEST(v_est[i], v_est[i - v_cap] + m_d[i - v_cap]);
            END IF;
            v_est[i] := v_base + ceil((v_est[i] - v_base) / v_tick) * v_tick;
            estimated_start_at := p_now + v_est[i] * interval '1 second';
            basis := concat('extrapolated: ', p_ahead[i], v_extrapolated);
        ELSE
            estimated_start_at := NULL;
            basis := CASE v_stop
                WHEN 'stuck' THEN format('no estimate: the job first in line needs %s GPUs, more than can become free under the GPU quota as last read', v_block_g)
                WHEN 'idle' THEN 'no estimate: no job ahead of it can be admitted under the current caps'
                ELSE format('no estimate: too far back in the queue (%s jobs ahead) to simulate', p_ahead[i]) END;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sftq.forecast(bigint, uuid[], bigint[], text[], integer[], timestamptz, integer, timestamptz, interval, float8, integer, integer, bigint[]) IS
    'Estimated start of one user''s QUEUED jobs p_jobs (their FIFO order, as sftq.my_queue lists them; p_ahead = QUEUED jobs of anyone ahead of each, p_kinds/p_gpus their kind and GPUs), or with p_user_id NULL of the first jobs of the whole queue (p_jobs then the queue''s head in FIFO order: one simulation for everyone''s estimates, as GET /queue lists them), or with p_owners the jobs of several users (p_owners[i] owns p_jobs[i], all in FIFO order: what each would get alone, from one simulation: the live stream''s queue frames), by simulating admission forward from p_now: the first p_window queued jobs under the rules of sftq._admission_walk (strict FIFO over the heads of users below their cap, one admission per user per walk, no backfill), a walk at each scheduler tick (on the grid through p_last_tick, every p_tick_interval) after a job ends, p_budget free GPUs to start with, running jobs ending when sftq.finish_estimate says and giving their GPUs back, queued jobs running for the median of recent similar jobs (sftq.median_run) or sftq.default_run_seconds(). It stops after p_max_steps admissions or where the window ends; jobs it did not place are extrapolated at its admission rate (and not before the user''s own earlier job ends), or get NULL with the reason in basis. p_fixed_run makes every run take that long (the baseline the estimate bench compares against). Cost is bounded by p_window and p_max_steps, not by the length of the queue. Reads only, takes no locks.';

-- ---------------------------------------------------------------------------------------
-- One user's queued jobs as they see them: position, why each waits, when it should start.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.queue_view_many(
    p_user_ids       bigint[],
    p_now            timestamptz,
    p_tick_interval  interval,
    p_usage_grace    interval,
    p_upto_at        timestamptz DEFAULT 'infinity',
    p_upto_id        uuid DEFAULT 'ffffffff-ffff-ffff-ffff-ffffffffffff',
    p_fixed_run      float8 DEFAULT NULL)
RETURNS TABLE (user_id bigint, id uuid, display_name text, kind text, gpu_count integer,
               created_at timestamptz, queue_position bigint, waiting_code text,
               waiting_message text, estimated_start_at timestamptz, estimate_basis text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
-- The planner's cost estimate of this query (per-job subqueries over guessed row counts)
-- passes jit_above_cost; compiling it took about 2 s of a 10 ms answer. Off for everything
-- it runs.
SET jit = off
-- Planned once per session: as a SQL function this query was planned again at every call,
-- and PL/pgSQL would plan it afresh for each set of arguments too (its estimates depend on
-- them). The plan does not: every step is a MATERIALIZED CTE or a function call, and the
-- joins between them are hash joins whatever the estimates. About 5% of an answer for 400
-- jobs (paired calls on the bench's data).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    -- What each of these users sees of their queued jobs: for one user, GET /jobs/analytics/
    -- queue; for every user with an open stream, the queue frames. The work is shared: one
    -- lookup of the jobs ahead per job (sftq.queue_ahead), one admission walk, one forecast.
    WITH st AS (
        SELECT * FROM sftq.scheduler_status(p_now, p_tick_interval, p_usage_grace)
    ), mine AS MATERIALIZED (
        SELECT j.user_id, j.id, j.display_name, j.kind, j.gpu_count, j.created_at,
               row_number() OVER (PARTITION BY j.user_id ORDER BY j.created_at, j.id) AS k,
               row_number() OVER (ORDER BY j.created_at, j.id) AS g,
               -- The owner's earlier jobs that admission sees: one waiting for a dependency
               -- (200_pipelines.sql) is ahead of nobody.
               count(*) FILTER (WHERE j.waiting_on IS NULL) OVER (
                   PARTITION BY j.user_id ORDER BY j.created_at, j.id
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS own_ahead,
               j.waiting_on
          FROM sftq.jobs j
         WHERE j.user_id = ANY (p_user_ids) AND j.state = 'QUEUED'
           AND (j.created_at, j.id) <= (p_upto_at, p_upto_id)
    ), ahead AS MATERIALIZED (
        -- QUEUED jobs of anyone ahead of each; k - 1 of them are the owner's own, the rest is
        -- the contract's queue_position.
        SELECT a.* FROM (SELECT array_agg(x.created_at) AS c, array_agg(x.id) AS i
                           FROM (SELECT mine.created_at, mine.id FROM mine ORDER BY mine.g) x) k
         CROSS JOIN LATERAL sftq.queue_ahead(k.c, k.i) a
    ), usr AS (
        SELECT u.id, u.disabled_at IS NOT NULL AS disabled, u.running_count, u.max_running
          FROM sftq.users u WHERE u.id = ANY (p_user_ids)
    ), walk AS MATERIALIZED (
        -- The walk admission would make now with the quota as last read.
        SELECT w.* FROM st CROSS JOIN LATERAL sftq._admission_walk(COALESCE(st.free_gpus, 0)) w
    ), blocker AS MATERIALIZED (
        -- The head that does not fit, if any (the walk ends there: one row at most).
        SELECT w.job_id, w.created_at, w.gpu_count, w.budget_before FROM walk w WHERE NOT w.fits
    ), m AS MATERIALIZED (
        -- Each job with its place, its owner's facts and what the walk does with it.
        SELECT mine.*, a.ahead, a.ahead - (mine.k - 1) AS queue_position,
               usr.disabled, usr.running_count, usr.max_running, w.fits, w.budget_before,
               (b.created_at, b.job_id) < (mine.created_at, mine.id) AS behind_blocker
          FROM mine
          JOIN ahead a ON a.ord = mine.g
          JOIN usr ON usr.id = mine.user_id
          LEFT JOIN walk w ON w.job_id = mine.id
          LEFT JOIN blocker b ON true
    ), args AS MATERIALIZED (
        -- What the reasons and the forecast are given, element g for job g: one pass over
        -- the jobs sorted once (an aggregate fed by a sorted subquery keeps its order).
        SELECT array_agg(ROW(x.gpu_count, x.own_ahead, x.disabled, x.running_count, x.max_running,
                             x.fits, x.budget_before, x.behind_blocker)::sftq.waiting_facts) AS facts,
               array_agg(x.id) AS ids, array_agg(x.ahead) AS ahead, array_agg(x.kind) AS kinds,
               array_agg(x.gpu_count) AS gpus, array_agg(x.user_id) AS owners
          FROM (SELECT * FROM m ORDER BY m.g) x
    ), rs AS MATERIALIZED (
        -- Why each waits, all in one call (sftq.waiting_reasons): job g's is element g.
        SELECT array_agg(r.code ORDER BY r.ord) AS codes,
               array_agg(r.message ORDER BY r.ord) AS messages
          FROM st CROSS JOIN args a CROSS JOIN LATERAL sftq.waiting_reasons(
                   a.facts, (SELECT b.gpu_count FROM blocker b), (SELECT b.budget_before FROM blocker b),
                   st.stalled) r
    ), fc AS MATERIALIZED (
        -- One simulation for every job listed (sftq.forecast with p_owners): each user gets
        -- what a forecast of their own jobs alone would say. MATERIALIZED, so that it runs
        -- once whatever the plan (inlined, a planner once put it inside a nested loop and ran
        -- it per listed job: 200 jobs, 3.7 s). It answers one row per job, in
        -- the order given, so job g's answer is element g of these arrays: joined on job id
        -- instead, the planner, which cannot know how many rows a function returns, compared
        -- every job with every answer (400 jobs: 160,000 comparisons, 35 ms of a 50 ms call).
        SELECT array_agg(f.estimated_start_at ORDER BY f.o) AS starts,
               array_agg(f.basis ORDER BY f.o) AS bases
          FROM st CROSS JOIN args a CROSS JOIN LATERAL sftq.forecast(
                   -- One user: their own forecast (the same answers, without the per-owner
                   -- bookkeeping); several: one simulation for all of them.
                   CASE WHEN cardinality(p_user_ids) = 1 THEN p_user_ids[1] END,
                   a.ids, a.ahead, a.kinds, a.gpus,
                   p_now, st.free_gpus, st.last_tick_at, p_tick_interval, p_fixed_run,
                   p_owners => CASE WHEN cardinality(p_user_ids) > 1 THEN a.owners END)
               WITH ORDINALITY AS f (job_id, estimated_start_at, basis, o)
         WHERE st.stalled IS NULL
    )
    SELECT m.user_id, m.id, m.display_name, m.kind, m.gpu_count, m.created_at, m.queue_position,
           CASE WHEN m.waiting_on IS NOT NULL THEN 'waiting_for_dependency' ELSE rs.codes[m.g] END,
           CASE WHEN m.waiting_on IS NOT NULL THEN sftq.dependency_waiting_message(m.waiting_on)
                ELSE rs.messages[m.g] END,
           CASE WHEN m.waiting_on IS NULL THEN fc.starts[m.g] END,
           CASE WHEN m.waiting_on IS NOT NULL
                THEN 'no estimate: it starts only after the jobs in its "after" succeed'
                ELSE COALESCE(fc.bases[m.g], 'no estimate: the scheduler is not running normally (see waiting_reason)') END
      FROM m CROSS JOIN rs CROSS JOIN fc
     ORDER BY m.user_id, m.k;
END
$$;
COMMENT ON FUNCTION sftq.queue_view_many(bigint[], timestamptz, interval, interval, timestamptz, uuid, float8) IS
    'The QUEUED jobs of several users (all, or up to and including (p_upto_at, p_upto_id)), each user''s in FIFO order, with queue_position (sftq.queue_ahead less the owner''s own jobs ahead), the waiting reason (sftq.waiting_reasons over sftq._admission_walk with the budget sftq.scheduler_status gives: the walk admission would make with the quota as last read) and the estimated start (sftq.forecast over all of them at once; NULL while the scheduler is stalled). What a user gets does not depend on who else is listed. p_tick_interval and p_usage_grace are the deployment''s SFTQ_TICK_INTERVAL_SECONDS and SFTQ_USAGE_GRACE_SECONDS. Reads only, takes no locks.';

CREATE OR REPLACE FUNCTION sftq.queue_view(
    p_user_id        bigint,
    p_now            timestamptz,
    p_tick_interval  interval,
    p_usage_grace    interval,
    p_upto_at        timestamptz DEFAULT 'infinity',
    p_upto_id        uuid DEFAULT 'ffffffff-ffff-ffff-ffff-ffffffffffff',
    p_fixed_run      float8 DEFAULT NULL)
RETURNS TABLE (id uuid, display_name text, kind text, gpu_count integer, created_at timestamptz,
               queue_position bigint, waiting_code text, waiting_message text,
               estimated_start_at timestamptz, estimate_basis text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT v.id, v.display_name, v.kind, v.gpu_count, v.created_at, v.queue_position,
           v.waiting_code, v.waiting_message, v.estimated_start_at, v.estimate_basis
      FROM sftq.queue_view_many(ARRAY[p_user_id], p_now, p_tick_interval, p_usage_grace,
                                p_upto_at, p_upto_id, p_fixed_run) v
$$;
COMMENT ON FUNCTION sftq.queue_view(bigint, timestamptz, interval, interval, timestamptz, uuid, float8) IS
    'One user''s QUEUED jobs in FIFO order with queue_position, waiting reason and estimated start: sftq.queue_view_many for that user. Reads only, takes no locks.';
