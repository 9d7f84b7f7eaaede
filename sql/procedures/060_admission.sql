-- Admission: strict FIFO by (created_at, id) over all kinds, users at cap skipped,
-- no backfill, GPU budget never overspent.

CREATE OR REPLACE FUNCTION sftq._admit(p_budget integer, p_now timestamptz, p_detail jsonb)
RETURNS TABLE (job_id uuid, user_id bigint, kind text, gpu_count integer, fireworks_payload jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_budget    integer := p_budget;
    v_admitted  bigint[] := '{}';
    v_user      bigint;
    v_head      uuid;
    v_job       sftq.jobs;
BEGIN
    LOOP
        -- The candidate is the earliest head among users below their cap. One row per
        -- user with queued work (users_head_idx), so this never walks the queued jobs
        -- of users at cap. A user admitted in this call counts as at cap for the rest of it.
        SELECT u.id, u.head_job_id INTO v_user, v_head
          FROM sftq.users u
         WHERE u.head_job_id IS NOT NULL
           AND u.disabled_at IS NULL
           AND u.running_count < u.max_running
           AND u.id <> ALL (v_admitted)
         ORDER BY u.head_created_at, u.head_job_id
         LIMIT 1;
        EXIT WHEN NOT FOUND;

        SELECT * INTO v_job FROM sftq.jobs j WHERE j.id = v_head;
        -- No backfill: if the earliest eligible job does not fit, nothing later goes.
        EXIT WHEN v_job.gpu_count > v_budget;

        v_job := sftq._transition(v_head, 'PROGRESS', p_now, 'scheduler', 'admitted',
            COALESCE(p_detail, '{}'::jsonb)
              || jsonb_build_object('gpu_budget', v_budget, 'gpu_count', v_job.gpu_count));
        v_budget := v_budget - v_job.gpu_count;
        v_admitted := v_admitted || v_user;

        job_id := v_job.id; user_id := v_job.user_id; kind := v_job.kind;
        gpu_count := v_job.gpu_count; fireworks_payload := v_job.fireworks_payload;
        RETURN NEXT;
    END LOOP;
END
$$;

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

CREATE OR REPLACE FUNCTION sftq.preview_admission(
    p_available_gpus  integer,
    p_limit           integer DEFAULT 100,
    p_now             timestamptz DEFAULT now())
RETURNS TABLE (queue_rank bigint, job_id uuid, user_name text, kind text, gpu_count integer,
               created_at timestamptz, decision text, reason text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_budget      integer := p_available_gpus;
    v_would       uuid[] := '{}';
    v_users       bigint[] := '{}';
    v_blocker     uuid;
    v_blocker_g   integer;
    v_user        bigint;
    v_head        uuid;
    v_gpus        integer;
BEGIN
    -- Run the admission walk without writing anything.
    LOOP
        SELECT u.id, u.head_job_id INTO v_user, v_head
          FROM sftq.users u
         WHERE u.head_job_id IS NOT NULL AND u.disabled_at IS NULL
           AND u.running_count < u.max_running AND u.id <> ALL (v_users)
         ORDER BY u.head_created_at, u.head_job_id
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        SELECT j.gpu_count INTO v_gpus FROM sftq.jobs j WHERE j.id = v_head;
        IF v_gpus > v_budget THEN
            v_blocker := v_head; v_blocker_g := v_gpus;
            EXIT;
        END IF;
        v_budget := v_budget - v_gpus;
        v_would := v_would || v_head;
        v_users := v_users || v_user;
    END LOOP;

    RETURN QUERY
    SELECT row_number() OVER (ORDER BY q.created_at, q.id), q.id, u.name, q.kind, q.gpu_count, q.created_at,
           CASE WHEN q.id = ANY (v_would) THEN 'admit' ELSE 'wait' END,
           CASE
             WHEN q.id = ANY (v_would) THEN format('admitted: needs %s GPUs', q.gpu_count)
             WHEN u.disabled_at IS NOT NULL THEN 'user is disabled'
             WHEN q.id <> u.head_job_id THEN format('behind the same user''s earlier queued job %s', u.head_job_id)
             WHEN u.running_count >= u.max_running THEN
                 format('user at cap: %s running of %s allowed', u.running_count, u.max_running)
             WHEN u.id = ANY (v_users) THEN 'user gets another job admitted in this round'
             WHEN q.id = v_blocker THEN
                 format('does not fit: needs %s GPUs while %s are free', q.gpu_count, v_budget)
             WHEN v_blocker IS NOT NULL THEN
                 format('behind head job %s that needs %s GPUs while %s are free', v_blocker, v_blocker_g, v_budget)
             ELSE 'waiting'
           END
      FROM (SELECT * FROM sftq.jobs j WHERE j.state = 'QUEUED'
             ORDER BY j.created_at, j.id LIMIT p_limit) q
      JOIN sftq.users u ON u.id = q.user_id
     ORDER BY q.created_at, q.id;
END
$$;
COMMENT ON FUNCTION sftq.preview_admission(integer, integer, timestamptz) IS
    'What admit(p_available_gpus) would do now and why each of the first p_limit queued jobs (FIFO order) waits. Changes nothing, takes no locks.';
