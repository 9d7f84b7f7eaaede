-- Pipelines: a job that runs after others (POST /jobs "after", issue 53 item 3).
--
-- A job with "after" is enqueued like any other, then held: jobs.waiting_on names the first
-- of its dependencies that is not SUCCESS yet, and a held job is never its owner's head
-- (users.head_job_id), so the admission walk (sftq._admission_walk, 060) never sees it and it
-- blocks nobody. When its last dependency succeeds, waiting_on becomes NULL and the job takes
-- its place among its owner's queued jobs by its own created_at, in the transaction that
-- recorded the success (so the admission that follows in the same tick may admit it). When
-- a dependency ends FAIL or CANCELLED, the dependent ends CANCELLED in that same transaction,
-- and so on down a chain. The state machine (010) calls the two hooks at the bottom.
--
-- A plain job pays nothing for this: it never enters these functions, and the state machine
-- asks one index probe of a terminal transition (are there dependents?).

-- At most this many dependencies per job.
CREATE OR REPLACE FUNCTION sftq.max_after()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 20 $$;
COMMENT ON FUNCTION sftq.max_after() IS 'The most jobs one job may name in "after" (20).';

-- The ids a caller gave in "after" (full ids or the prefixes GET /jobs?id_prefix= takes, 8 to
-- 32 hexadecimal digits, dashes allowed) as the full ids of their own jobs, in the order
-- given, a repeated job once. Another user's job answers exactly as a job that does not exist
-- (SQ460, the same message shape), so "after" never tells whether an id is taken. Locks every
-- dependency FOR SHARE: a dependency that ends while this transaction runs waits for it to
-- commit and then finds this job among its dependents; one that ended before is seen ended.
-- Callers take the admission gate first.
CREATE OR REPLACE FUNCTION sftq._resolve_after(p_user_id bigint, p_after text[])
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_given  text;
    v_hex    text;
    v_ids    uuid[];
    v_n      integer;
    v_out    uuid[] := '{}';
    v_job    record;
BEGIN
    IF cardinality(p_after) > sftq.max_after() THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ463',
            MESSAGE = format('after names %s jobs; at most %s are allowed',
                             cardinality(p_after), sftq.max_after());
    END IF;
    FOREACH v_given IN ARRAY COALESCE(p_after, '{}') LOOP
        v_hex := lower(replace(v_given, '-', ''));
        IF v_hex IS NULL OR v_hex !~ '^[0-9a-f]{8,32}$' THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ400',
                MESSAGE = format('after: %s is not a job id (a full id, or its first 8 to 32 hexadecimal digits)',
                                 COALESCE(v_given, 'null'));
        END IF;
        -- Only the caller's jobs are looked at: a range of the primary key, as id_prefix does.
        SELECT array_agg(j.id), count(*) INTO v_ids, v_n
          FROM (SELECT j.id FROM sftq.jobs j
                 WHERE j.id BETWEEN rpad(v_hex, 32, '0')::uuid AND rpad(v_hex, 32, 'f')::uuid
                   AND j.user_id = p_user_id
                 ORDER BY j.id LIMIT 2) j;
        IF v_n = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ460',
                MESSAGE = format('after: you have no job %s', v_given),
                DETAIL = json_build_object('after', v_given)::text;
        ELSIF v_n > 1 THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ400',
                MESSAGE = format('after: %s is the start of several of your jobs'' ids; give more of it', v_given);
        END IF;
        CONTINUE WHEN v_ids[1] = ANY (v_out);  -- named twice: once is enough
        SELECT j.id, j.state INTO v_job FROM sftq.jobs j WHERE j.id = v_ids[1] FOR SHARE;
        IF v_job.state IN ('FAIL', 'CANCELLED') THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ462',
                MESSAGE = format('after: job %s ended %s, so a job after it could never start', v_job.id, v_job.state),
                DETAIL = json_build_object('after', v_job.id, 'state', v_job.state)::text;
        END IF;
        v_out := v_out || v_job.id;
    END LOOP;
    RETURN v_out;
END
$$;
COMMENT ON FUNCTION sftq._resolve_after(bigint, text[]) IS
    'The full ids of the caller''s jobs that p_after names (full ids or 8-32 hex digit prefixes; a repeat counted once), in order. SQ463 over sftq.max_after() ids; SQ400 for a malformed or ambiguous id; SQ460 for an id that is none of the caller''s jobs (another user''s job answers the same); SQ462 for a job that already ended FAIL or CANCELLED. Locking contract: takes each dependency FOR SHARE (callers hold the admission gate, shared, first).';

-- Whether p_job_id is among the jobs p_after runs after, directly or down their own "after":
-- a job may only name jobs that exist before it, so through the API this never happens; it
-- is checked anyway, so that no hand-made edge can make two jobs wait for each other forever.
CREATE OR REPLACE FUNCTION sftq._after_cycle(p_job_id uuid, p_after uuid[])
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE up (id) AS (
        SELECT unnest(p_after)
        UNION
        SELECT d.after_id FROM sftq.job_dependencies d JOIN up ON d.job_id = up.id
    )
    SELECT EXISTS (SELECT 1 FROM up WHERE up.id = p_job_id)
$$;
COMMENT ON FUNCTION sftq._after_cycle(uuid, uuid[]) IS
    'True when p_job_id is reachable from p_after through sftq.job_dependencies (a cycle). Reads only.';

-- The first of a job's dependencies that is not SUCCESS, or NULL.
CREATE OR REPLACE FUNCTION sftq._first_unmet(p_after uuid[])
RETURNS uuid
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.id FROM unnest(p_after) WITH ORDINALITY AS a (id, o)
      JOIN sftq.jobs j ON j.id = a.id
     WHERE j.state <> 'SUCCESS'
     ORDER BY a.o LIMIT 1
$$;

-- A user's head as the state machine computes it (their earliest QUEUED job that waits for
-- no dependency), written to their row. Callers hold the user row.
CREATE OR REPLACE FUNCTION sftq._pipeline_reset_head(p_user_id bigint)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE sftq.users u
       SET head_job_id = h.id, head_created_at = h.created_at
      FROM (SELECT (SELECT j.id FROM sftq.jobs j
                     WHERE j.user_id = p_user_id AND j.state = 'QUEUED' AND j.waiting_on IS NULL
                     ORDER BY j.created_at, j.id LIMIT 1) AS id) x
      LEFT JOIN sftq.jobs h ON h.id = x.id
     WHERE u.id = p_user_id
       AND u.head_job_id IS DISTINCT FROM h.id
$$;

-- Makes a job just enqueued (same transaction) wait for p_after: the edges, jobs.after, and
-- waiting_on; if it became its owner's head, the head moves to the next job that waits for
-- nothing. A dependency already SUCCESS is simply met.
CREATE OR REPLACE FUNCTION sftq._pipeline_hold(p_job_id uuid, p_after uuid[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job      sftq.jobs;
    v_waiting  uuid;
BEGIN
    IF COALESCE(cardinality(p_after), 0) = 0 THEN
        RETURN;
    END IF;
    IF sftq._after_cycle(p_job_id, p_after) THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ461',
            MESSAGE = 'after: these jobs already run after this one (a cycle): none of them could ever start';
    END IF;
    INSERT INTO sftq.job_dependencies (job_id, after_id) SELECT p_job_id, unnest(p_after);
    v_waiting := sftq._first_unmet(p_after);
    UPDATE sftq.jobs j SET after = p_after, waiting_on = v_waiting
     WHERE j.id = p_job_id RETURNING * INTO v_job;
    IF v_waiting IS NOT NULL THEN
        PERFORM 1 FROM sftq.users u WHERE u.id = v_job.user_id FOR NO KEY UPDATE;
        IF (SELECT u.head_job_id FROM sftq.users u WHERE u.id = v_job.user_id) = p_job_id THEN
            PERFORM sftq._pipeline_reset_head(v_job.user_id);
        END IF;
        PERFORM sftq._event(p_job_id, COALESCE(p_now, clock_timestamp()), 'scheduler',
                            'waiting_for_dependency', 'QUEUED',
                            jsonb_build_object('after', to_jsonb(p_after), 'waiting_on', v_waiting));
    END IF;
END
$$;
COMMENT ON FUNCTION sftq._pipeline_hold(uuid, uuid[], timestamptz) IS
    'Makes a QUEUED job enqueued in this transaction run after the jobs p_after (resolved by sftq._resolve_after): writes sftq.job_dependencies and jobs.after, sets waiting_on to the first that is not SUCCESS (NULL: all met, nothing waits), and when the job waits, moves its owner''s head off it (sftq._pipeline_reset_head) and writes a waiting_for_dependency event. SQ461 on a cycle. Locking contract: the job row (held since its insert), then its owner''s user row.';

-- Called by sftq._transition (010) when a job ends, before it locks the owner's row: locks
-- the QUEUED jobs that run after it, down the whole chain, so that every job row is locked
-- before the user row as everywhere else. Answers whether there are any (the second hook
-- runs only then).
CREATE OR REPLACE FUNCTION sftq._pipeline_lock_dependents(p_job_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM sftq.job_dependencies d WHERE d.after_id = p_job_id) THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM sftq.jobs j
     WHERE j.id IN (WITH RECURSIVE down (id) AS (
                        SELECT d.job_id FROM sftq.job_dependencies d WHERE d.after_id = p_job_id
                        UNION
                        SELECT d.job_id FROM sftq.job_dependencies d JOIN down ON d.after_id = down.id)
                    SELECT down.id FROM down)
       AND j.state = 'QUEUED'
     ORDER BY j.id
       FOR UPDATE;
    RETURN true;
END
$$;
COMMENT ON FUNCTION sftq._pipeline_lock_dependents(uuid) IS
    'The state machine''s first pipeline hook, for a job reaching SUCCESS, FAIL or CANCELLED: locks every QUEUED job that runs after it, directly or down a chain (in id order), and answers whether it has dependents at all (one index probe of job_dependencies_after_idx when it has none). Locking contract: job rows only; called before the owner''s user row is taken.';

-- The second hook, after the ended job's own event: its dependents move on.
CREATE OR REPLACE FUNCTION sftq._pipeline_dependency_ended(p_job sftq.jobs, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_dep      sftq.jobs;
    v_waiting  uuid;
    v_head     boolean := false;
BEGIN
    FOR v_dep IN SELECT j.* FROM sftq.job_dependencies d JOIN sftq.jobs j ON j.id = d.job_id
                  WHERE d.after_id = p_job.id AND j.state = 'QUEUED'
                  ORDER BY j.created_at, j.id LOOP
        IF p_job.state = 'SUCCESS' THEN
            v_waiting := sftq._first_unmet(v_dep.after);
            CONTINUE WHEN v_waiting IS NOT DISTINCT FROM v_dep.waiting_on;
            UPDATE sftq.jobs j SET waiting_on = v_waiting WHERE j.id = v_dep.id;
            IF v_waiting IS NULL THEN
                v_head := true;
                PERFORM sftq._event(v_dep.id, p_now, 'scheduler', 'dependencies_met', 'QUEUED',
                                    jsonb_build_object('after', to_jsonb(v_dep.after),
                                                       'last', p_job.id));
            END IF;
        ELSE
            -- QUEUED -> CANCELLED, the contract's move; its own dependents follow through
            -- this same hook, called by the transition.
            PERFORM sftq._transition(
                v_dep.id, 'CANCELLED', p_now, 'scheduler', 'dependency_failed',
                jsonb_build_object('reason', 'dependency_failed', 'after', p_job.id,
                                   'after_state', p_job.state),
                format('cancelled: job %s, which this job runs after, ended %s', p_job.id, p_job.state));
        END IF;
    END LOOP;
    IF v_head THEN
        -- The jobs whose wait is over join their owner's queue by their own created_at.
        -- All of a job's dependencies are its owner's jobs, so that is p_job's owner, whose
        -- row the transition holds.
        PERFORM sftq._pipeline_reset_head(p_job.user_id);
    END IF;
END
$$;
COMMENT ON FUNCTION sftq._pipeline_dependency_ended(sftq.jobs, timestamptz) IS
    'The state machine''s second pipeline hook, after a job p_job reached SUCCESS, FAIL or CANCELLED: each QUEUED job that runs after it either moves its waiting_on to its next unmet dependency, or (all met) waits no more (a dependencies_met event, and its owner''s head is recomputed so it takes its FIFO place by created_at); or, when p_job ended FAIL or CANCELLED, ends CANCELLED through sftq._transition with a dependency_failed event and an error naming p_job and its state (chains follow by recursion). Locking contract: the dependents were locked by sftq._pipeline_lock_dependents; the owner''s row is held by the calling transition.';

-- Why a job that waits for a dependency waits: the waiting reason the API shows.
CREATE OR REPLACE FUNCTION sftq.dependency_waiting_message(p_waiting_on uuid)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('Waits for your job %s (%s) to succeed: a job starts only when every job in its "after" is SUCCESS, and is cancelled if one of them fails or is cancelled.',
                  j.id, j.state)
      FROM sftq.jobs j WHERE j.id = p_waiting_on
$$;
COMMENT ON FUNCTION sftq.dependency_waiting_message(uuid) IS
    'The message of the waiting reason waiting_for_dependency: names the job waited for (always the caller''s own) and its state. Reads only.';

-- ---------------------------------------------------------------------------------------
-- POST /jobs with "after" or "max_run_seconds"
-- ---------------------------------------------------------------------------------------

-- A request without either field goes through the group commit (sftq.api_submit_many) as
-- before; one with them comes here, one request per transaction.
CREATE OR REPLACE FUNCTION sftq.api_submit_job(
    p_key_hash               bytea,
    p_kind                   text,
    p_payload                jsonb,
    p_display_name           text,
    p_gpu_count              integer,
    p_idempotency_key        text,
    p_queue_timeout_seconds  integer,
    p_default_queue_timeout  integer,
    p_after                  text[],
    p_max_run_seconds        integer)
RETURNS TABLE (body json, replayed boolean, job_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user   bigint := sftq._auth(p_key_hash);
    v_after  uuid[];
    v_row    record;
BEGIN
    IF p_max_run_seconds IS NOT NULL AND p_max_run_seconds NOT BETWEEN 60 AND 2592000 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400',
            MESSAGE = 'max_run_seconds must be an integer from 60 to 2592000 (30 days)';
    END IF;
    -- The gate first (as enqueue takes it), then the dependencies' rows, then the new job's.
    PERFORM sftq._gate();
    IF p_after IS NOT NULL THEN
        v_after := sftq._resolve_after(v_user, p_after);
    END IF;
    SELECT * INTO v_row FROM sftq.enqueue(v_user, p_kind, p_payload, p_display_name, p_gpu_count,
                                          p_idempotency_key, NULL, p_queue_timeout_seconds, NULL,
                                          p_default_queue_timeout);
    IF v_row.replayed THEN
        -- The request hash (030) predates these fields: a replay must also ask for the same.
        IF EXISTS (SELECT 1 FROM sftq.jobs j WHERE j.id = v_row.id
                      AND (j.after IS DISTINCT FROM NULLIF(v_after, '{}')
                           OR (p_max_run_seconds IS NOT NULL
                               AND j.max_run_seconds IS DISTINCT FROM p_max_run_seconds))) THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ419',
                MESSAGE = 'this Idempotency-Key was already used with a different request body',
                DETAIL = json_build_object('job_id', v_row.id)::text;
        END IF;
    ELSE
        IF p_max_run_seconds IS NOT NULL THEN
            UPDATE sftq.jobs j SET max_run_seconds = p_max_run_seconds WHERE j.id = v_row.id;
        END IF;
        PERFORM sftq._pipeline_hold(v_row.id, v_after, NULL);
    END IF;
    SELECT json_build_object('id', v_row.id, 'kind', v_row.kind, 'state', j.state,
                             'created_at', sftq._iso(v_row.created_at), 'after', j.after,
                             'max_run_seconds', j.max_run_seconds)
      INTO body FROM sftq.jobs j WHERE j.id = v_row.id;
    replayed := v_row.replayed;
    job_id := v_row.id;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION sftq.api_submit_job(bytea, text, jsonb, text, integer, text, integer, integer, text[], integer) IS
    'POST /jobs with "after" and/or "max_run_seconds": authenticates, resolves "after" (sftq._resolve_after: the caller''s own jobs only, another user''s answering as unknown), enqueues (sftq.enqueue), then stores max_run_seconds (60 to 2592000) and holds the job until its dependencies succeed (sftq._pipeline_hold). Answers the 201 body ({id, kind, state, created_at, after, max_run_seconds}) and whether an Idempotency-Key replayed (a replay changes nothing). Locking contract: gate (shared), the dependencies (FOR SHARE), then as sftq.enqueue, then the new job and its owner''s row again.';
