-- A bound on run time, and stalled jobs (issue 53 item 4).
--
-- Run timeout: a PROGRESS job that has run at the provider (since its submission) longer than
-- its max_run_seconds, or the deployment's SFTQ_MAX_RUN_SECONDS when it gave none, gets a
-- cancel recorded with the reason run_timeout, exactly as a user's cancel of a running job is
-- recorded (cancel_requested_at, a cancel_requested event); the tick's cancel path stops it
-- at the provider (DELETE for SFT/DPO, :cancel for RFT) and sftq.complete_cancel ends it
-- CANCELLED with a run_timeout event and an error saying why, like queue_timeout.
--
-- Stall: a running job whose provider progress (state, percent, epoch, as
-- sftq.observe_provider_job records them) has not moved for SFTQ_STALL_SECONDS gets one
-- stalled event and shows as stalled (GET /jobs/{id}, the dashboard, sftq_stalled_jobs); it
-- is not cancelled: Fireworks documents jobs that crash silently and stay RUNNING, and a
-- person decides.

-- When a running job's provider progress last moved: its submission, a new provider state,
-- or a new percent or epoch, whichever is latest.
CREATE OR REPLACE FUNCTION sftq.progress_since(p_job sftq.jobs)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT GREATEST(p_job.submitted_at, p_job.provider_state_at, p_job.progress_moved_at)
$$;
COMMENT ON FUNCTION sftq.progress_since(sftq.jobs) IS
    'When the job''s provider progress last moved: the latest of its submission, its last provider state change and its last percent/epoch change (progress_moved_at). Pure.';

-- Whether a job is stalled now: running, its stalled event written, and no movement since.
CREATE OR REPLACE FUNCTION sftq.is_stalled(p_job sftq.jobs)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_job.state = 'PROGRESS' AND p_job.stalled_at IS NOT NULL
           AND COALESCE(sftq.progress_since(p_job) <= p_job.stalled_at, true)
$$;
COMMENT ON FUNCTION sftq.is_stalled(sftq.jobs) IS
    'True while a PROGRESS job that got its stalled event has not moved since (sftq.progress_since before stalled_at). Pure.';

-- The event detail and error a cancel the queue recorded itself ends with (NULL reason: a
-- user's cancel, unchanged). sftq.complete_cancel (050) calls these.
CREATE OR REPLACE FUNCTION sftq._cancel_reason_detail(p_job sftq.jobs, p_detail jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_job.cancel_reason IS NULL THEN p_detail
                ELSE COALESCE(p_detail, '{}'::jsonb)
                     || jsonb_build_object('reason', p_job.cancel_reason,
                                           'max_run_seconds', p_job.max_run_seconds) END
$$;

CREATE OR REPLACE FUNCTION sftq._cancel_reason_error(p_job sftq.jobs)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE p_job.cancel_reason
        WHEN 'run_timeout' THEN
            format('stopped: it ran at Fireworks for %s s, past its max_run_seconds (%s s)',
                   floor(extract(epoch FROM p_job.cancel_requested_at - p_job.submitted_at)),
                   COALESCE(p_job.max_run_seconds::text, 'the deployment''s SFTQ_MAX_RUN_SECONDS'))
        END
$$;

CREATE OR REPLACE FUNCTION sftq.run_limits(
    p_default_max_run  integer,
    p_stall_seconds    integer,
    p_now              timestamptz DEFAULT now(),
    p_limit            integer DEFAULT 100)
RETURNS TABLE (job_id uuid, kind text, fireworks_job_name text, action text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job  sftq.jobs;
    v_max  integer;
BEGIN
    PERFORM sftq._gate();
    -- Past their bound: the cancel is recorded as a user's would be (050's sftq.cancel),
    -- with the reason. SKIP LOCKED: a job some other change holds is looked at next tick.
    FOR v_job IN
        SELECT j.* FROM sftq.jobs j
         WHERE j.state = 'PROGRESS' AND j.submitted_at IS NOT NULL
           AND j.cancel_requested_at IS NULL
           AND COALESCE(j.max_run_seconds, p_default_max_run) IS NOT NULL
           AND j.submitted_at + make_interval(secs => COALESCE(j.max_run_seconds, p_default_max_run)) <= p_now
         ORDER BY j.submitted_at, j.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    LOOP
        v_max := COALESCE(v_job.max_run_seconds, p_default_max_run);
        UPDATE sftq.jobs j SET cancel_requested_at = p_now, cancel_reason = 'run_timeout',
                               max_run_seconds = v_max
         WHERE j.id = v_job.id;
        PERFORM sftq._event(v_job.id, p_now, 'scheduler', 'cancel_requested', 'PROGRESS',
                            jsonb_build_object('reason', 'run_timeout', 'submitted', true,
                                               'max_run_seconds', v_max,
                                               'ran_seconds', floor(extract(epoch FROM p_now - v_job.submitted_at))),
                            'PROGRESS');
        job_id := v_job.id; kind := v_job.kind; fireworks_job_name := v_job.fireworks_job_name;
        action := 'run_timeout';
        RETURN NEXT;
    END LOOP;

    -- Stalled: one event each, never a second (stalled_at stays set).
    IF p_stall_seconds IS NOT NULL AND p_stall_seconds > 0 THEN
        FOR v_job IN
            SELECT j.* FROM sftq.jobs j
             WHERE j.state = 'PROGRESS' AND j.submitted_at IS NOT NULL AND j.stalled_at IS NULL
               AND sftq.progress_since(j) <= p_now - make_interval(secs => p_stall_seconds)
             ORDER BY j.submitted_at, j.id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        LOOP
            UPDATE sftq.jobs j SET stalled_at = p_now WHERE j.id = v_job.id;
            PERFORM sftq._event(v_job.id, p_now, 'scheduler', 'stalled', 'PROGRESS',
                                jsonb_build_object('since', sftq._iso(sftq.progress_since(v_job)),
                                                   'stall_seconds', p_stall_seconds,
                                                   'provider_state', v_job.provider_state,
                                                   'progress_percent', v_job.progress_percent,
                                                   'progress_epoch', v_job.progress_epoch));
            job_id := v_job.id; kind := v_job.kind; fireworks_job_name := v_job.fireworks_job_name;
            action := 'stalled';
            RETURN NEXT;
        END LOOP;
    END IF;
END
$$;
COMMENT ON FUNCTION sftq.run_limits(integer, integer, timestamptz, integer) IS
    'The tick''s run-limit sweep over submitted PROGRESS jobs, up to p_limit of each: (1) past max_run_seconds (or p_default_max_run, the deployment''s SFTQ_MAX_RUN_SECONDS; NULL: no bound) since submission, records the cancel with cancel_reason run_timeout and a cancel_requested event (detail.reason run_timeout), for the tick to stop at the provider and finish (sftq.complete_cancel ends it with a run_timeout event); (2) provider progress unmoved for p_stall_seconds (sftq.progress_since), sets stalled_at and writes one stalled event; never cancels. One row per job touched: (job_id, kind, fireworks_job_name, action run_timeout | stalled). Locking contract: gate (shared), then each job row (SKIP LOCKED); no user row.';

-- How many running jobs are stalled now (GET /metrics: sftq_stalled_jobs). Reads the running
-- jobs only (jobs_progress_idx).
CREATE OR REPLACE FUNCTION sftq.stalled_jobs()
RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) FROM sftq.jobs j
     WHERE j.state = 'PROGRESS' AND j.stalled_at IS NOT NULL AND sftq.is_stalled(j)
$$;
COMMENT ON FUNCTION sftq.stalled_jobs() IS
    'The number of PROGRESS jobs that are stalled now (sftq.is_stalled). Reads only.';
