-- The job state machine. sftq._transition is the only writer of jobs.state.

CREATE OR REPLACE FUNCTION sftq.is_legal_transition(p_from text, p_to text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (p_from, p_to) IN (('QUEUED', 'PROGRESS'), ('QUEUED', 'CANCELLED'),
                              ('PROGRESS', 'SUCCESS'), ('PROGRESS', 'FAIL'),
                              ('PROGRESS', 'CANCELLED'))
$$;
COMMENT ON FUNCTION sftq.is_legal_transition(text, text) IS
    'The only legal moves: QUEUED->PROGRESS->{SUCCESS|FAIL}, QUEUED->CANCELLED, PROGRESS->CANCELLED.';

-- Defence in depth: even a hand-written UPDATE cannot make an illegal move or
-- set started_at / completed_at outside the transition that owns them.
CREATE OR REPLACE FUNCTION sftq._jobs_guard()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NOT sftq.is_legal_transition(OLD.state, NEW.state) THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ422',
                MESSAGE = format('illegal transition %s -> %s for job %s', OLD.state, NEW.state, OLD.id);
        END IF;
        IF NEW.state = 'PROGRESS' AND (NEW.started_at IS NULL OR NEW.completed_at IS NOT NULL) THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ422', MESSAGE = 'entering PROGRESS must set started_at only';
        END IF;
        IF NEW.state <> 'PROGRESS' AND NEW.completed_at IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ422', MESSAGE = 'a terminal state must set completed_at';
        END IF;
        IF NEW.state <> 'PROGRESS' AND NEW.started_at IS DISTINCT FROM OLD.started_at THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ422', MESSAGE = 'started_at is set only on admission';
        END IF;
    ELSIF NEW.started_at IS DISTINCT FROM OLD.started_at
       OR NEW.completed_at IS DISTINCT FROM OLD.completed_at THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ422',
            MESSAGE = 'started_at and completed_at are set by transitions, never directly';
    END IF;
    IF NEW.user_id <> OLD.user_id OR NEW.created_at <> OLD.created_at OR NEW.kind <> OLD.kind
       OR NEW.gpu_count <> OLD.gpu_count THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ422', MESSAGE = 'owner, kind, gpu_count and created_at are immutable';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER jobs_guard
    BEFORE UPDATE ON sftq.jobs
    FOR EACH ROW EXECUTE FUNCTION sftq._jobs_guard();

CREATE OR REPLACE FUNCTION sftq._transition(
    p_job_id  uuid,
    p_to      text,
    p_now     timestamptz,
    p_actor   text,
    p_event   text,
    p_detail  jsonb DEFAULT NULL,
    p_error   text DEFAULT NULL)
RETURNS sftq.jobs
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job      sftq.jobs;
    v_from     text;
    v_next_id  uuid;
    v_next_at  timestamptz;
    v_deps     boolean := false;
BEGIN
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = format('job %s not found', p_job_id);
    END IF;
    v_from := v_job.state;
    IF NOT sftq.is_legal_transition(v_from, p_to) THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ409',
            MESSAGE = format('job %s is %s and cannot become %s', p_job_id, v_from, p_to),
            DETAIL = json_build_object('state', v_from)::text;
    END IF;

    UPDATE sftq.jobs
       SET state        = p_to,
           started_at   = CASE WHEN p_to = 'PROGRESS' THEN p_now ELSE started_at END,
           completed_at = CASE WHEN p_to IN ('SUCCESS', 'FAIL', 'CANCELLED') THEN p_now END,
           error        = COALESCE(p_error, error)
     WHERE id = p_job_id
    RETURNING * INTO v_job;

    -- Keep the owner's admission bookkeeping in step (job row first, then user row:
    -- the same order as enqueue, so the two never deadlock). Lock the user row before
    -- looking for the next head: the statement after the lock sees every change
    -- committed by a concurrent cancel or enqueue of the same user, so the head can
    -- never be set to a job that just left the queue; an enqueue still in flight updates
    -- the head itself after this commits. FOR NO KEY UPDATE, the lock an UPDATE of the row
    -- takes: it waits for the owner's other changes, but not for the KEY SHARE locks that
    -- inserting a job (its foreign key) leaves on the row, so a group-commit enqueue holding
    -- those on several owners never closes a cycle with it.
    -- Pipelines (200_pipelines.sql): a job ending locks the queued jobs that run after it
    -- now, before its owner's row, as every job row is locked before its user's.
    IF p_to <> 'PROGRESS' THEN
        v_deps := sftq._pipeline_lock_dependents(p_job_id);
    END IF;
    PERFORM 1 FROM sftq.users u WHERE u.id = v_job.user_id FOR NO KEY UPDATE;
    IF v_from = 'QUEUED' THEN
        -- A job waiting for a dependency (waiting_on) is never a head.
        SELECT j.id, j.created_at INTO v_next_id, v_next_at
          FROM sftq.jobs j
         WHERE j.user_id = v_job.user_id AND j.state = 'QUEUED' AND j.waiting_on IS NULL
         ORDER BY j.created_at, j.id
         LIMIT 1;
    END IF;
    UPDATE sftq.users u
       SET queued_count    = u.queued_count - (v_from = 'QUEUED')::int,
           running_count   = u.running_count + (p_to = 'PROGRESS')::int - (v_from = 'PROGRESS')::int,
           head_job_id     = CASE WHEN v_from = 'QUEUED' THEN v_next_id ELSE u.head_job_id END,
           head_created_at = CASE WHEN v_from = 'QUEUED' THEN v_next_at ELSE u.head_created_at END,
           succeeded_count = u.succeeded_count + (p_to = 'SUCCESS')::int,
           failed_count    = u.failed_count + (p_to = 'FAIL')::int,
           cancelled_count = u.cancelled_count + (p_to = 'CANCELLED')::int,
           success_run_seconds = u.success_run_seconds + CASE WHEN p_to = 'SUCCESS'
               THEN extract(epoch FROM v_job.completed_at - v_job.started_at) ELSE 0 END,
           success_gpu_seconds = u.success_gpu_seconds + CASE WHEN p_to = 'SUCCESS'
               THEN v_job.gpu_count * extract(epoch FROM v_job.completed_at - v_job.started_at) ELSE 0 END
     WHERE u.id = v_job.user_id;

    IF v_from = 'QUEUED' THEN
        PERFORM sftq._queue_left(v_job.created_at, v_job.id);  -- its stretch's count
    END IF;
    -- A job created before analyst_daily's rollup horizon (160_analyst_daily.sql): log its move.
    IF v_job.created_at < (SELECT s.moves_before FROM sftq.daily_rollup_state s) THEN
        INSERT INTO sftq.daily_rollup_moves (hour, kind, from_state, to_state, gpu_hours)
        VALUES (date_trunc('hour', v_job.created_at, 'UTC'), v_job.kind, v_from, p_to,
                v_job.gpu_count * extract(epoch FROM v_job.completed_at - v_job.started_at) / 3600);
    END IF;

    PERFORM sftq._event(p_job_id, p_now, p_actor, p_event, p_to, p_detail, v_from, p_to);
    -- Pipelines: its dependents move on (met, or cancelled with it), in this transaction.
    IF v_deps THEN
        PERFORM sftq._pipeline_dependency_ended(v_job, p_now);
    END IF;
    RETURN v_job;
END
$$;
COMMENT ON FUNCTION sftq._transition(uuid, text, timestamptz, text, text, jsonb, text) IS
    'Moves one job along the state machine, sets started_at/completed_at, keeps the owner''s counters and head (and, for a job leaving the queue, its stretch''s count: sftq._queue_left), logs the move for analyst_daily''s rollup when the job''s UTC day is rolled up (sftq.daily_rollup_moves), and writes the event row; a job ending moves the jobs that run after it on (sftq._pipeline_lock_dependents, sftq._pipeline_dependency_ended). Locking contract: locks the job row (and, when it ends, the queued jobs that run after it), then its owner''s user row. Callers take sftq._gate() first (the rollup relies on it too).';
