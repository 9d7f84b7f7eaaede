-- Admission: strict FIFO by (created_at, id) over all kinds, users at cap skipped,
-- no backfill, GPU budget never overspent.

-- The admission rule for one walk, in one place: given the eligible heads' GPUs in FIFO
-- order, how many are admitted. Strict FIFO with no backfill: heads go while they fit, and the
-- first that does not fit stops the walk. sftq._admission_walk (which admission runs) and
-- sftq.forecast (which simulates future walks) both decide with it.
CREATE OR REPLACE FUNCTION sftq._walk_admits(p_gpus integer[], p_budget integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_left  integer := p_budget;
    v_n     integer := 0;
    v_g     integer;
BEGIN
    FOREACH v_g IN ARRAY COALESCE(p_gpus, '{}') LOOP
        EXIT WHEN v_g > v_left;
        v_left := v_left - v_g;
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION sftq._walk_admits(integer[], integer) IS
    'The admission rule of one walk: of the eligible heads whose GPUs p_gpus lists in FIFO order, how many are admitted within p_budget GPUs (strict FIFO, no backfill: heads go while they fit; the next one, if any, is the head that does not fit). Used by sftq._admission_walk and by every simulated walk of sftq.forecast. Pure.';

-- The admission walk: the one place that decides who goes next. sftq._admit runs it and
-- admits what it returns; sftq.preview_admission and every waiting reason read the same rows.
CREATE OR REPLACE FUNCTION sftq._admission_walk(p_budget integer)
RETURNS TABLE (step integer, user_id bigint, job_id uuid, gpu_count integer,
               created_at timestamptz, budget_before integer, fits boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_heads  record;
    v_go     integer;
BEGIN
    -- The candidates are the heads of users below their cap, earliest first: one row per
    -- user with queued work (users_head_idx), so this never reads the queued jobs of users at
    -- cap, and one admission per user per walk. Every job needs a GPU at least, so no more
    -- than budget + 1 heads can matter.
    SELECT array_agg(u.id ORDER BY u.head_created_at, u.head_job_id) AS users,
           array_agg(u.head_job_id ORDER BY u.head_created_at, u.head_job_id) AS jobs,
           array_agg(u.head_created_at ORDER BY u.head_created_at, u.head_job_id) AS ats,
           array_agg(j.gpu_count ORDER BY u.head_created_at, u.head_job_id) AS gpus
      INTO v_heads
      FROM (SELECT u.id, u.head_job_id, u.head_created_at
              FROM sftq.users u
             WHERE u.head_job_id IS NOT NULL
               AND u.disabled_at IS NULL
               AND u.running_count < u.max_running
             ORDER BY u.head_created_at, u.head_job_id
             LIMIT GREATEST(p_budget, 0) + 1) u
      JOIN sftq.jobs j ON j.id = u.head_job_id;
    v_go := sftq._walk_admits(v_heads.gpus, p_budget);
    budget_before := p_budget;
    -- The heads that go, then the head that does not fit (the blocker), if any.
    FOR i IN 1 .. LEAST(v_go + 1, COALESCE(cardinality(v_heads.jobs), 0)) LOOP
        step := i;
        user_id := v_heads.users[i];
        job_id := v_heads.jobs[i];
        gpu_count := v_heads.gpus[i];
        created_at := v_heads.ats[i];
        fits := i <= v_go;
        RETURN NEXT;
        budget_before := budget_before - gpu_count;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sftq._admission_walk(integer) IS
    'The admission walk over p_budget GPUs, without writing: one row per eligible head it reaches, in order, with the budget left before it; every row fits but the last, which is the head that does not fit (the blocker), if any. Strict FIFO by (created_at, id) over the heads of users below their cap and not disabled (one admission per user per walk), decided by sftq._walk_admits, the rule sftq.forecast''s simulated walks use too. sftq._admit admits exactly the rows that fit; preview_admission and the waiting reasons classify every queued job from the same rows. Reads only, takes no locks (admit holds the exclusive gate around it).';

CREATE OR REPLACE FUNCTION sftq._admit(p_budget integer, p_now timestamptz, p_detail jsonb)
RETURNS TABLE (job_id uuid, user_id bigint, kind text, gpu_count integer, fireworks_payload jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_step  record;
    v_job   sftq.jobs;
BEGIN
    -- The walk is computed in full before the first transition. Under the exclusive gate
    -- nothing else changes the queue, and the walk already treats a user it admits as at
    -- cap, so admitting its rows one by one gives exactly what walking while admitting did.
    FOR v_step IN SELECT * FROM sftq._admission_walk(p_budget) w WHERE w.fits ORDER BY w.step LOOP
        v_job := sftq._transition(v_step.job_id, 'PROGRESS', p_now, 'scheduler', 'admitted',
            COALESCE(p_detail, '{}'::jsonb)
              || jsonb_build_object('gpu_budget', v_step.budget_before,
                                    'gpu_count', v_step.gpu_count));
        job_id := v_job.id; user_id := v_job.user_id; kind := v_job.kind;
        gpu_count := v_job.gpu_count; fireworks_payload := v_job.fireworks_payload;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sftq._admit(integer, timestamptz, jsonb) IS
    'Admits the jobs sftq._admission_walk(p_budget) says fit, in walk order, each through sftq._transition (event detail: gpu_budget before it, gpu_count, plus p_detail). Callers hold the exclusive admission gate. Locking contract: each admitted job row, then its user row.';

CREATE OR REPLACE FUNCTION sftq.admit(p_available_gpus integer, p_now timestamptz DEFAULT now())
RETURNS TABLE (job_id uuid, user_id bigint, kind text, gpu_count integer, fireworks_payload jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM sftq._gate(true);
    RETURN QUERY SELECT * FROM sftq._admit(p_available_gpus, p_now, NULL);
END
$$;
COMMENT ON FUNCTION sftq.admit(integer, timestamptz) IS
    'Admits QUEUED jobs into PROGRESS within p_available_gpus, in one transaction. Locking contract: takes the admission gate EXCLUSIVE first (it waits for in-flight enqueues, cancels and transitions to commit, and holds new ones back for the few milliseconds it runs), so two concurrent calls serialise and never admit the same job, and no concurrent change can reorder the queue under it. Then locks each admitted job row and its user row.';

CREATE OR REPLACE FUNCTION sftq.admission_budget(
    p_quota_limit  integer,
    p_quota_usage  numeric,
    p_usage_grace  interval DEFAULT interval '5 minutes',
    p_now          timestamptz DEFAULT now())
RETURNS TABLE (budget integer, ours_total integer, ours_recent integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- recent: our jobs the provider's usage may not count yet. Not yet created, or created
    -- within the grace window and not yet shown by a quota reading (usage_counted_at, set
    -- by sftq.record_usage_reading). docs/scheduling.md explains the rule.
    WITH ours AS (
        SELECT COALESCE(sum(j.gpu_count), 0)::int AS total,
               COALESCE(sum(j.gpu_count) FILTER (
                   WHERE j.submitted_at IS NULL
                      OR (j.submitted_at > p_now - p_usage_grace AND j.usage_counted_at IS NULL)),
                   0)::int AS recent
          FROM sftq.jobs j
         WHERE j.state = 'PROGRESS'
    )
    SELECT (p_quota_limit - GREATEST(ceil(p_quota_usage)::int + ours.recent, ours.total))::int,
           ours.total, ours.recent
      FROM ours
$$;
COMMENT ON FUNCTION sftq.admission_budget(integer, numeric, interval, timestamptz) IS
    'GPUs admission may spend: limit - max(usage + recent, ours). recent = GPUs of our PROGRESS jobs the provider''s usage may not count yet: not yet submitted, or submitted within p_usage_grace and not yet shown by a quota reading (usage_counted_at); ours = GPUs of all our PROGRESS jobs, a floor on real usage even when the provider''s figure is stuck. Never under-counts under the documented assumptions (docs/scheduling.md). Reads only.';

CREATE OR REPLACE FUNCTION sftq.admit_for_quota(
    p_quota_limit  integer,
    p_quota_usage  numeric,
    p_usage_grace  interval DEFAULT interval '5 minutes',
    p_now          timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_b     record;
    v_jobs  jsonb;
BEGIN
    PERFORM sftq._gate(true);
    -- The budget is computed under the exclusive gate, so it counts every admission
    -- committed before this one, even by a tick that raced this one.
    SELECT * INTO v_b FROM sftq.admission_budget(p_quota_limit, p_quota_usage, p_usage_grace, p_now);
    SELECT COALESCE(jsonb_agg(to_jsonb(a)), '[]'::jsonb) INTO v_jobs
      FROM sftq._admit(v_b.budget, p_now,
                       jsonb_build_object('quota_limit', p_quota_limit, 'quota_usage', p_quota_usage,
                                          'ours_total', v_b.ours_total, 'ours_recent', v_b.ours_recent)) a;
    RETURN jsonb_build_object('budget', v_b.budget, 'ours_total', v_b.ours_total,
                              'ours_recent', v_b.ours_recent, 'jobs', v_jobs);
END
$$;
COMMENT ON FUNCTION sftq.admit_for_quota(integer, numeric, interval, timestamptz) IS
    'The scheduler''s admission: computes the budget (sftq.admission_budget) and admits (sftq.admit) under one exclusive gate. Returns {budget, ours_total, ours_recent, jobs: [...]}.';

-- An admitted job's create may go out at a later tick than its admission (the admitting
-- tick died or lost its lease, or the create failed and is retried), when usage outside the
-- queue may have grown. Before such a create the tick asks whether the job still fits the
-- quota it has just read. The rule is sftq.admission_budget's, not a copy: that budget
-- already counts every admitted-not-created job, so the room before a waiting job is the
-- budget plus the GPUs of that job and of every waiting job admitted after it (a tick admits
-- in FIFO order at one timestamp, hence started_at, created_at, id), as if none of them had
-- been admitted yet. A job goes out only if it and every one before it fit; one that does
-- not is held (no attempt counted) until room comes back, instead of sending the provider a
-- create its quota has no room for. Unsubmitted jobs being cancelled are not waiting: they
-- stay counted (a lost answer may mean their create landed) and are never re-created.
CREATE OR REPLACE FUNCTION sftq.creates_that_fit(
    p_quota_limit  integer,
    p_quota_usage  numeric,
    p_usage_grace  interval DEFAULT interval '5 minutes',
    p_now          timestamptz DEFAULT now())
RETURNS TABLE (job_id uuid, gpu_count integer, free_before integer, fits boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT w.id, w.gpu_count, w.free_before, w.gpu_count <= w.free_before
      FROM (SELECT j.id, j.gpu_count, j.started_at, j.created_at,
                   (b.budget + sum(j.gpu_count) OVER (
                        ORDER BY j.started_at, j.created_at, j.id
                        ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING))::int AS free_before
              FROM sftq.admission_budget(p_quota_limit, p_quota_usage, p_usage_grace, p_now) b,
                   sftq.jobs j
             WHERE j.state = 'PROGRESS' AND j.submitted_at IS NULL
               AND j.cancel_requested_at IS NULL) w
     ORDER BY w.started_at, w.created_at, w.id
$$;
COMMENT ON FUNCTION sftq.creates_that_fit(integer, numeric, interval, timestamptz) IS
    'For every admitted job not yet created at the provider (and not being cancelled), in admission order: its GPUs, the GPUs the quota reading (limit, usage) leaves free before it (sftq.admission_budget plus the GPUs of this job and the waiting jobs admitted after it: the budget as if they were not admitted yet), and whether it fits. The jobs that fit are a prefix of that order. The tick creates only those; the others keep their place and slot and wait for room. Reads only.';

-- Why each queued job waits, from the walk's rows and the job's and its user's facts. The
-- same function words the reasons GET /jobs/analytics/queue and GET /jobs/{id}/analytics
-- show and the codes preview_admission gives operators. Messages name numbers only: never
-- another user's name or job id.
-- Many jobs at once (one call, not one per job: a call of a function with its own
-- search_path costs about 13 us, which a queue of 400 jobs paid 400 times): element i of
-- p_jobs is job i (sftq.waiting_facts); the blocker and the stall are the walk's, the same
-- for all.
DROP FUNCTION IF EXISTS sftq.waiting_reasons(integer[], bigint[], boolean[], integer[], integer[],
                                             boolean[], integer[], boolean[], integer, integer, text);
CREATE OR REPLACE FUNCTION sftq.waiting_reasons(
    p_jobs           sftq.waiting_facts[],
    p_blocker_gpus   integer,
    p_blocker_free   integer,
    p_stalled        text DEFAULT NULL)
RETURNS TABLE (ord integer, code text, message text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.o::int, c.code, CASE c.code
        WHEN 'user_disabled' THEN
            'Your account is disabled: its queued jobs are not admitted until an administrator enables it again.'
        WHEN 'scheduler_stalled' THEN p_stalled
        WHEN 'behind_own_queued_job' THEN
            format('Behind %s of your own earlier queued job%s: your jobs start in the order you submitted them.',
                   t.own_ahead, CASE WHEN t.own_ahead = 1 THEN '' ELSE 's' END)
        WHEN 'behind_own_running_job' THEN CASE
            WHEN t.cap <= 0 THEN
                'Your cap on running jobs is 0: none of your jobs is admitted until an administrator raises it.'
            ELSE format('You have %s running job%s and may run %s at a time: this job is admitted when one of them ends.',
                        t.running, CASE WHEN t.running = 1 THEN '' ELSE 's' END, t.cap) END
        WHEN 'does_not_fit' THEN
            format('First in line, but it needs %s GPUs while %s are free: it is admitted when running jobs free enough GPUs.',
                   t.gpu_count, GREATEST(t.walk_free, 0))
        WHEN 'behind_job_that_does_not_fit' THEN
            format('Behind an earlier job that needs %s GPUs while %s are free: strict FIFO lets no later job start before it.',
                   p_blocker_gpus, GREATEST(p_blocker_free, 0))
        WHEN 'next_tick' THEN CASE
            WHEN t.walk_fits THEN
                format('Eligible, and it fits (%s GPUs needed, %s free): the next scheduler tick admits it.',
                       t.gpu_count, GREATEST(t.walk_free, 0))
            ELSE 'Waiting for the next scheduler tick.' END
        END
      FROM unnest(p_jobs) WITH ORDINALITY AS t (gpu_count, own_ahead, disabled, running, cap,
                                                walk_fits, walk_free, behind_blocker, o)
     CROSS JOIN LATERAL (SELECT CASE
                WHEN t.disabled THEN 'user_disabled'
                WHEN p_stalled IS NOT NULL THEN 'scheduler_stalled'
                WHEN t.own_ahead > 0 THEN 'behind_own_queued_job'
                WHEN t.running >= t.cap THEN 'behind_own_running_job'
                WHEN t.walk_fits THEN 'next_tick'
                WHEN t.walk_fits IS NOT NULL THEN 'does_not_fit'
                WHEN t.behind_blocker THEN 'behind_job_that_does_not_fit'
                ELSE 'next_tick'
            END AS code) c
     ORDER BY t.o
$$;
COMMENT ON FUNCTION sftq.waiting_reasons(sftq.waiting_facts[], integer, integer, text) IS
    'Why each of several QUEUED jobs waits, as (ord, code, message), ord being the job''s index in p_jobs (sftq.waiting_facts: its GPUs, its owner''s queued jobs before it, whether the owner is disabled, their running jobs and cap; walk_fits true when the admission walk (sftq._admission_walk) admits it, false when it is the head that does not fit, NULL when the walk does not reach it; the budget left before it in the walk; whether it comes after the walk''s non-fitting head); p_blocker_* describe that head. Precedence: user_disabled, scheduler_stalled (p_stalled is its message), behind_own_queued_job, behind_own_running_job, next_tick, does_not_fit, behind_job_that_does_not_fit. Messages give numbers, never another user''s name or job id. Pure.';

CREATE OR REPLACE FUNCTION sftq.waiting_reason(
    p_gpu_count      integer,
    p_own_ahead      bigint,
    p_disabled       boolean,
    p_running        integer,
    p_cap            integer,
    p_walk_fits      boolean,
    p_walk_free      integer,
    p_blocker_gpus   integer,
    p_blocker_free   integer,
    p_behind_blocker boolean,
    p_stalled        text DEFAULT NULL)
RETURNS TABLE (code text, message text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.code, r.message
      FROM sftq.waiting_reasons(
               ARRAY[ROW(p_gpu_count, p_own_ahead, p_disabled, p_running, p_cap, p_walk_fits,
                         p_walk_free, p_behind_blocker)::sftq.waiting_facts],
               p_blocker_gpus, p_blocker_free, p_stalled) r
$$;
COMMENT ON FUNCTION sftq.waiting_reason(integer, bigint, boolean, integer, integer, boolean, integer, integer, integer, boolean, text) IS
    'Why one QUEUED job waits, as {code, message}: sftq.waiting_reasons for that job alone (its arguments say what they mean). Pure.';

DROP FUNCTION IF EXISTS sftq.preview_admission(integer, integer, timestamptz);
CREATE FUNCTION sftq.preview_admission(
    p_available_gpus  integer,
    p_limit           integer DEFAULT 100,
    p_now             timestamptz DEFAULT now())
RETURNS TABLE (queue_rank bigint, job_id uuid, user_name text, kind text, gpu_count integer,
               created_at timestamptz, decision text, reason text, code text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH walk AS MATERIALIZED (
        SELECT * FROM sftq._admission_walk(p_available_gpus)
    ), blocker AS (
        -- The head that does not fit, if any (the walk ends there: one row at most).
        SELECT w.job_id, w.created_at, w.gpu_count, w.budget_before FROM walk w WHERE NOT w.fits
    ), q AS MATERIALIZED (
        -- The head of the queue, in FIFO order (n): every queued job of a user that comes
        -- before one listed here is listed too, so own_ahead is exact.
        SELECT j.*, u.name AS user_name, u.head_job_id, u.running_count, u.max_running,
               u.disabled_at IS NOT NULL AS disabled, w.fits, w.budget_before,
               (b.created_at, b.job_id) < (j.created_at, j.id) AS behind_blocker
          FROM (SELECT j.id, j.user_id, j.kind, j.gpu_count, j.created_at, j.waiting_on,
                       row_number() OVER (ORDER BY j.created_at, j.id) AS n,
                       -- A job waiting for a dependency (200_pipelines.sql) is ahead of nobody.
                       count(*) FILTER (WHERE j.waiting_on IS NULL) OVER (
                           PARTITION BY j.user_id ORDER BY j.created_at, j.id
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS own_ahead
                  FROM (SELECT * FROM sftq.jobs j WHERE j.state = 'QUEUED'
                         ORDER BY j.created_at, j.id LIMIT p_limit) j) j
          JOIN sftq.users u ON u.id = j.user_id
          LEFT JOIN walk w ON w.job_id = j.id
          LEFT JOIN blocker b ON true
    ), rs AS MATERIALIZED (
        -- Every job's code in one call (sftq.waiting_reasons): job n's is element n.
        SELECT array_agg(r.code ORDER BY r.ord) AS codes
          FROM sftq.waiting_reasons(
                   (SELECT array_agg(ROW(x.gpu_count, x.own_ahead, x.disabled, x.running_count,
                                         x.max_running, x.fits, x.budget_before,
                                         x.behind_blocker)::sftq.waiting_facts ORDER BY x.n)
                      FROM q x),
                   (SELECT b.gpu_count FROM blocker b), (SELECT b.budget_before FROM blocker b)) r
    )
    SELECT q.n, q.id, q.user_name, q.kind, q.gpu_count, q.created_at,
           CASE WHEN q.fits THEN 'admit' ELSE 'wait' END,
           -- The operator's wording: operators may see every user and job.
           CASE WHEN q.waiting_on IS NOT NULL THEN format('waits for job %s (after)', q.waiting_on)
           ELSE CASE rs.codes[q.n]
               WHEN 'next_tick' THEN CASE WHEN q.fits THEN format('admitted: needs %s GPUs', q.gpu_count)
                                          ELSE 'waiting' END
               WHEN 'user_disabled' THEN 'user is disabled'
               WHEN 'behind_own_queued_job' THEN
                   format('behind the same user''s earlier queued job %s', q.head_job_id)
               WHEN 'behind_own_running_job' THEN
                   format('user at cap: %s running of %s allowed', q.running_count, q.max_running)
               WHEN 'does_not_fit' THEN
                   format('does not fit: needs %s GPUs while %s are free', q.gpu_count, q.budget_before)
               WHEN 'behind_job_that_does_not_fit' THEN
                   (SELECT format('behind head job %s that needs %s GPUs while %s are free',
                                  b.job_id, b.gpu_count, b.budget_before) FROM blocker b)
               ELSE 'waiting'
           END END,
           CASE WHEN q.waiting_on IS NOT NULL THEN 'waiting_for_dependency' ELSE rs.codes[q.n] END
      FROM q CROSS JOIN rs
     ORDER BY q.created_at, q.id
$$;
COMMENT ON FUNCTION sftq.preview_admission(integer, integer, timestamptz) IS
    'What admit(p_available_gpus) would do now and why each of the first p_limit queued jobs (FIFO order) waits: the admission walk (sftq._admission_walk) classified by sftq.waiting_reason, so code is the code users see; reason is the operator''s wording (it names users'' job ids). Changes nothing, takes no locks.';
