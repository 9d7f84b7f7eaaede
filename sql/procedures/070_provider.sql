-- What the scheduler learns from the provider, recorded against our jobs: submissions
-- (with bounded retries), the provider's state and progress, and failure classes.

-- ---------------------------------------------------------------------------
-- one mapping of provider states
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.normalize_provider_state(p_state text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN p_state IS NULL OR btrim(p_state) = '' THEN NULL
        WHEN upper(btrim(p_state)) = 'NOT_FOUND' THEN 'NOT_FOUND'
        ELSE 'JOB_STATE_' || regexp_replace(upper(btrim(p_state)), '^JOB_STATE_', '')
    END
$$;
COMMENT ON FUNCTION sftq.normalize_provider_state(text) IS
    'A provider state in one spelling: upper case with the JOB_STATE_ prefix (COMPLETED and job_state_completed both become JOB_STATE_COMPLETED). NOT_FOUND (our name for a 404 on GET) stays as it is. Python''s provider.normalize_state is the same rule; a test holds them together.';

CREATE OR REPLACE FUNCTION sftq.map_provider_state(p_state text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN s IS NULL THEN NULL
        WHEN s = 'JOB_STATE_COMPLETED' THEN 'SUCCESS'
        WHEN s IN ('JOB_STATE_FAILED', 'JOB_STATE_EXPIRED', 'JOB_STATE_EARLY_STOPPED') THEN 'FAIL'
        WHEN s IN ('JOB_STATE_CANCELLED', 'JOB_STATE_DELETED', 'NOT_FOUND') THEN 'CANCELLED'
        WHEN s IN ('JOB_STATE_UNSPECIFIED', 'JOB_STATE_CREATING', 'JOB_STATE_PENDING',
                   'JOB_STATE_VALIDATING', 'JOB_STATE_RUNNING', 'JOB_STATE_WRITING_RESULTS',
                   'JOB_STATE_CANCELLING', 'JOB_STATE_DELETING', 'JOB_STATE_DELETING_CLEANING_UP',
                   'JOB_STATE_PAUSED', 'JOB_STATE_RE_QUEUEING', 'JOB_STATE_CREATING_INPUT_DATASET',
                   'JOB_STATE_IDLE') THEN 'RUNNING'
        ELSE 'UNKNOWN'
    END
      FROM (SELECT sftq.normalize_provider_state(p_state) AS s) n
$$;
COMMENT ON FUNCTION sftq.map_provider_state(text) IS
    'The contract''s mapping, with or without the JOB_STATE_ prefix: COMPLETED -> SUCCESS; FAILED, EXPIRED, EARLY_STOPPED -> FAIL; CANCELLED, DELETED, NOT_FOUND (a 404) -> CANCELLED; the documented non-terminal states (PAUSED included) -> RUNNING; anything else -> UNKNOWN, which leaves the job as it is. NULL for no state.';

CREATE OR REPLACE FUNCTION sftq.failure_class_for(p_state text, p_status_code text, p_message text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN sftq.normalize_provider_state(p_state) = 'JOB_STATE_EXPIRED' THEN 'retryable'
        -- Stopped by its own early-stopping rule: it would stop again.
        WHEN sftq.normalize_provider_state(p_state) = 'JOB_STATE_EARLY_STOPPED' THEN 'permanent'
        -- status.code first: the provider's own word on the cause.
        WHEN upper(p_status_code) IN ('RESOURCE_EXHAUSTED', 'UNAVAILABLE', 'ABORTED', 'INTERNAL',
                                     'DEADLINE_EXCEEDED') THEN 'retryable'
        WHEN upper(p_status_code) IN ('INVALID_ARGUMENT', 'FAILED_PRECONDITION', 'NOT_FOUND',
                                     'PERMISSION_DENIED', 'UNAUTHENTICATED', 'OUT_OF_RANGE',
                                     'UNIMPLEMENTED', 'ALREADY_EXISTS') THEN 'permanent'
        -- Otherwise the message: capacity, preemption and internal faults first ...
        WHEN p_message ~* '(capacity|insufficient (gpu|resource|node)|no (available )?(gpu|node|resource)s?( available)?\M|out of (gpus|capacity)|quota|resource.?exhausted|try again later)'
            THEN 'retryable'
        WHEN p_message ~* '(preempt|spot (instance|node)|evict|node (was )?(lost|reclaimed|terminated|failure|failed)|host (failure|maintenance))'
            THEN 'retryable'
        WHEN p_message ~* '(internal (error|server)|service unavailable|temporar(y|ily)|transient|timed? ?out|connection (reset|refused|lost))'
            THEN 'retryable'
        -- ... then causes a resubmit keeps: the payload, the data, the model.
        WHEN p_message ~* '(out of memory|\moom\M|invalid|not found|does not exist|no such|unsupported|malformed|permission|forbidden|\mnan\M|diverg|bad (request|dataset|data))'
            THEN 'permanent'
        ELSE 'unknown'
    END
$$;
COMMENT ON FUNCTION sftq.failure_class_for(text, text, text) IS
    'The failure class of a provider-reported failure: EXPIRED retryable, EARLY_STOPPED permanent; then status.code (RESOURCE_EXHAUSTED, UNAVAILABLE, ABORTED, INTERNAL, DEADLINE_EXCEEDED retryable; INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, PERMISSION_DENIED, ... permanent); then the message (capacity, preemption, internal faults retryable; memory, invalid input, missing data or model, divergence permanent); else unknown. docs/scheduling.md lists it.';

-- Every FAIL carries a class: a path that did not name one gets 'unknown'.
CREATE OR REPLACE FUNCTION sftq._jobs_failure_class()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.failure_class := 'unknown';
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION sftq._jobs_failure_class() IS
    'Trigger: a job entering FAIL without a failure_class gets unknown, so every FAIL carries one even from a path that names none (the scheduler''s paths all name one). Touches only the row being updated.';
CREATE OR REPLACE TRIGGER jobs_failure_class
    BEFORE UPDATE OF state ON sftq.jobs
    FOR EACH ROW WHEN (NEW.state = 'FAIL' AND NEW.failure_class IS NULL)
    EXECUTE FUNCTION sftq._jobs_failure_class();

-- ---------------------------------------------------------------------------
-- the tick's view of PROGRESS jobs
-- ---------------------------------------------------------------------------

-- The answer grew columns (backoff, the last check and its failures): a new return type
-- needs a drop.
DROP FUNCTION IF EXISTS sftq.scheduler_work();
CREATE FUNCTION sftq.scheduler_work()
RETURNS TABLE (job_id uuid, kind text, user_id bigint, gpu_count integer, started_at timestamptz,
               submitted_at timestamptz, fireworks_job_name text, cancel_requested_at timestamptz,
               provider_state text, submit_attempts integer, fireworks_payload jsonb,
               submit_due boolean, admitted_seconds double precision,
               provider_checked_at timestamptz, last_submit_error text,
               last_check_failures integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.id, j.kind, j.user_id, j.gpu_count, j.started_at, j.submitted_at, j.fireworks_job_name,
           j.cancel_requested_at, j.provider_state, j.submit_attempts,
           CASE WHEN j.submitted_at IS NULL THEN j.fireworks_payload END,
           j.submitted_at IS NULL AND (j.next_submit_at IS NULL OR j.next_submit_at <= now()),
           extract(epoch FROM now() - j.started_at)::double precision,
           j.provider_checked_at, j.last_submit_error, j.last_check_failures
      FROM sftq.jobs j
     WHERE j.state = 'PROGRESS'
     ORDER BY j.started_at, j.id
$$;
COMMENT ON FUNCTION sftq.scheduler_work() IS
    'Every PROGRESS job with what the tick needs: unsubmitted ones (with their payload, whether their backoff has passed, how long ago they were admitted, and how many final checks failed) to submit, check or give up on, submitted ones (with when they were last checked) to reconcile, requested cancels to finish. Reads only.';

-- ---------------------------------------------------------------------------
-- submissions
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.record_submitted(
    p_job_id          uuid,
    p_job_name        text,
    p_provider_state  text DEFAULT NULL,
    p_adopted         boolean DEFAULT false,
    p_now             timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job    sftq.jobs;
    v_state  text := sftq.normalize_provider_state(p_provider_state);
BEGIN
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    IF v_job.submitted_at IS NULL THEN
        UPDATE sftq.jobs
           SET submitted_at = p_now, fireworks_job_name = p_job_name,
               provider_state = COALESCE(v_state, provider_state),
               provider_state_at = p_now, provider_checked_at = p_now,
               last_submit_error = NULL, next_submit_at = NULL
         WHERE id = p_job_id;
        PERFORM sftq._event(p_job_id, p_now, 'scheduler', 'submitted', v_job.state,
                jsonb_build_object('fireworks_job_name', p_job_name, 'provider_state', v_state,
                                   'adopted_existing', p_adopted, 'attempt', v_job.submit_attempts + 1),
                v_job.state);
    END IF;
    -- A cancel that arrived while the create was in flight: the caller must stop the
    -- provider job right away.
    IF v_job.state <> 'PROGRESS' OR v_job.cancel_requested_at IS NOT NULL THEN
        RETURN 'stop';
    END IF;
    RETURN 'ok';
END
$$;
COMMENT ON FUNCTION sftq.record_submitted(uuid, text, text, boolean, timestamptz) IS
    'Records that the provider accepted (or already had) the job. Returns stop when a cancel was requested meanwhile, else ok. Locking contract: the job row only (no eligibility change, so no gate).';

CREATE OR REPLACE FUNCTION sftq.record_submit_failure(
    p_job_id           uuid,
    p_error            text,
    p_transient        boolean,
    p_max_attempts     integer DEFAULT 8,
    p_max_seconds      double precision DEFAULT 3600,
    p_backoff_seconds  double precision DEFAULT 5,
    p_now              timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The final check is made at most this many times (docs/scheduling.md, Faults).
    c_max_checks CONSTANT integer := 4;
    v_job       sftq.jobs;
    v_attempt   integer;
    v_checks    integer;
    v_next      timestamptz;
BEGIN
    -- The gate first, always: a rejection ends the job here, and so does a final check
    -- that failed once too often, which this call only learns under the job's row lock.
    PERFORM sftq._gate();
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    IF v_job.state <> 'PROGRESS' OR v_job.submitted_at IS NOT NULL THEN
        RETURN jsonb_build_object('state', v_job.state, 'attempts', v_job.submit_attempts,
                                  'exhausted', false);
    END IF;
    IF p_transient AND v_job.submit_attempts >= p_max_attempts THEN
        -- No create attempt was left, so this failure is the final check's: the GET of the
        -- job's provider id that would find a job a lost create answer left behind (the
        -- tick passes p_max_attempts 0 for it). It could not tell, so it is tried again
        -- under the same backoff, c_max_checks times in all; then the job gives up, saying
        -- that the check could not be made and why. A create is never sent again.
        v_checks := v_job.last_check_failures + 1;
        IF v_checks >= c_max_checks THEN
            UPDATE sftq.jobs SET last_check_failures = v_checks, last_check_error = p_error
             WHERE id = p_job_id;
            RETURN jsonb_build_object(
                'state', sftq.give_up_submission(p_job_id, p_now),
                'attempts', v_job.submit_attempts, 'final_checks', v_checks, 'exhausted', true);
        END IF;
        v_next := p_now + make_interval(secs => least(
            p_backoff_seconds * power(2, v_job.submit_attempts + v_checks - 1), 600));
        UPDATE sftq.jobs SET last_check_failures = v_checks, next_submit_at = v_next
         WHERE id = p_job_id;
        PERFORM sftq._event(p_job_id, p_now, 'scheduler', 'final_check_failed', v_job.state,
                jsonb_build_object('error', left(p_error, 2000), 'final_check', v_checks,
                                   'max_checks', c_max_checks, 'attempts', v_job.submit_attempts,
                                   'next_check_at', sftq._iso(v_next)));
        RETURN jsonb_build_object('state', 'PROGRESS', 'attempts', v_job.submit_attempts,
                                  'final_checks', v_checks, 'next_attempt_at', sftq._iso(v_next),
                                  'exhausted', true);
    END IF;
    v_attempt := v_job.submit_attempts + 1;
    IF p_transient THEN
        -- The job keeps its place (PROGRESS) and its provider id; attempt n is followed by
        -- a wait of min(base x 2^(n-1), 10 min) before the next one.
        v_next := p_now + make_interval(secs => least(p_backoff_seconds * power(2, v_attempt - 1), 600));
        UPDATE sftq.jobs SET submit_attempts = v_attempt, last_submit_error = p_error,
                             next_submit_at = v_next
         WHERE id = p_job_id;
        PERFORM sftq._event(p_job_id, p_now, 'scheduler', 'submit_retry', v_job.state,
                jsonb_build_object('error', left(p_error, 2000), 'attempt', v_attempt,
                                   'next_attempt_at', sftq._iso(v_next)));
        RETURN jsonb_build_object(
            'state', 'PROGRESS', 'attempts', v_attempt, 'next_attempt_at', sftq._iso(v_next),
            'exhausted', v_attempt >= p_max_attempts
                         OR extract(epoch FROM p_now - v_job.started_at) >= p_max_seconds);
    END IF;
    UPDATE sftq.jobs SET submit_attempts = v_attempt, failure_class = 'permanent', next_submit_at = NULL
     WHERE id = p_job_id;
    v_job := sftq._transition(p_job_id, 'FAIL', p_now, 'scheduler', 'failed',
                              jsonb_build_object('reason', 'submission_rejected', 'attempt', v_attempt,
                                                 'failure_class', 'permanent'),
                              p_error);
    RETURN jsonb_build_object('state', v_job.state, 'attempts', v_attempt, 'exhausted', false);
END
$$;
COMMENT ON FUNCTION sftq.record_submit_failure(uuid, text, boolean, integer, double precision, double precision, timestamptz) IS
    'A failed create, or a failed final check. Transient create: stays PROGRESS (last_submit_error, a submit_retry event, next_submit_at after an exponential backoff capped at 10 min) and answers whether the job ran out of attempts (p_max_attempts) or time since admission (p_max_seconds). Transient with no create attempt left (submit_attempts >= p_max_attempts; the tick passes 0 for its final check): the final check could not be made; last_check_failures counts it, a final_check_failed event and the same backoff follow, and the 4th such failure gives up (last_check_error, then sftq.give_up_submission: FAIL retryable, saying the check could not be made and why). Rejected: PROGRESS -> FAIL, failure_class permanent, the provider''s body verbatim in error, event failed with reason submission_rejected. Locking contract: gate (shared), then the job row and (when it ends) its user row.';

-- The old entry point (tests and tools call it): the default bounds.
CREATE OR REPLACE FUNCTION sftq.record_submit_error(
    p_job_id     uuid,
    p_error      text,
    p_transient  boolean,
    p_now        timestamptz DEFAULT now())
RETURNS text
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.record_submit_failure(p_job_id, p_error, p_transient, 8, 3600, 5, p_now) ->> 'state'
$$;
COMMENT ON FUNCTION sftq.record_submit_error(uuid, text, boolean, timestamptz) IS
    'sftq.record_submit_failure with the default bounds; answers the job''s state. Locking contract: as record_submit_failure.';

CREATE OR REPLACE FUNCTION sftq.record_submit_skipped(
    p_job_id  uuid,
    p_reason  text,
    p_now     timestamptz DEFAULT now())
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE sftq.jobs SET last_submit_error = p_reason
     WHERE id = p_job_id AND state = 'PROGRESS' AND submitted_at IS NULL
$$;
COMMENT ON FUNCTION sftq.record_submit_skipped(uuid, text, timestamptz) IS
    'An admitted job the tick did not try to create (the provider was failing, or refused our credentials): the reason goes to last_submit_error; no attempt is counted, so an outage never uses up a job''s attempts. Locking contract: the job row.';

CREATE OR REPLACE FUNCTION sftq.give_up_submission(
    p_job_id  uuid,
    p_now     timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job      sftq.jobs;
    v_seconds  bigint;
    v_error    text;
    v_detail   jsonb;
BEGIN
    PERFORM sftq._gate();
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    -- Submitted meanwhile (adopted), cancelled, or ended: nothing to give up.
    IF v_job.state <> 'PROGRESS' OR v_job.submitted_at IS NOT NULL
       OR v_job.cancel_requested_at IS NOT NULL THEN
        RETURN v_job.state;
    END IF;
    v_seconds := floor(extract(epoch FROM p_now - v_job.started_at));
    v_error := format('gave up submitting to the provider after %s failed attempt%s over %s s; last provider answer: %s',
                      v_job.submit_attempts, CASE WHEN v_job.submit_attempts = 1 THEN '' ELSE 's' END,
                      v_seconds, COALESCE(v_job.last_submit_error, 'none'));
    v_detail := jsonb_build_object('reason', 'submission_gave_up', 'failure_class', 'retryable',
                                   'attempts', v_job.submit_attempts, 'seconds', v_seconds,
                                   'last_error', left(v_job.last_submit_error, 2000));
    IF v_job.last_check_error IS NOT NULL THEN
        -- Given up because the final check could not be made (sftq.record_submit_failure):
        -- nobody could tell whether one of the creates reached the provider after all.
        v_error := v_error || format('; the final check for a provider job under its id could not be made (%s tr%s, the last answer: %s)',
                                     v_job.last_check_failures,
                                     CASE WHEN v_job.last_check_failures = 1 THEN 'y' ELSE 'ies' END,
                                     v_job.last_check_error);
        v_detail := v_detail || jsonb_build_object('final_check_failures', v_job.last_check_failures,
                                                   'final_check_error', left(v_job.last_check_error, 2000));
    END IF;
    UPDATE sftq.jobs SET failure_class = 'retryable', next_submit_at = NULL WHERE id = p_job_id;
    v_job := sftq._transition(p_job_id, 'FAIL', p_now, 'scheduler', 'failed', v_detail, v_error);
    RETURN v_job.state;
END
$$;
COMMENT ON FUNCTION sftq.give_up_submission(uuid, timestamptz) IS
    'Ends an unsubmitted PROGRESS job whose creates kept failing: PROGRESS -> FAIL, failure_class retryable, an error that says how many attempts over how long and the last provider answer. Called when the final check found no provider job under the id (a 404), or by sftq.record_submit_failure when that check could not be made at its bound (last_check_error set): the error then also says so, how many tries, and the last answer. The transition frees its user''s slot and its GPUs in the same transaction. A no-op on a job submitted, cancelled or ended meanwhile. Locking contract: gate (shared), the job row, then its user row.';

-- ---------------------------------------------------------------------------
-- the provider's state and progress
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.observe_provider_job(
    p_job_id  uuid,
    p_obs     jsonb,
    p_now     timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job      sftq.jobs;
    v_state    text := sftq.normalize_provider_state(p_obs ->> 'state');
    -- No state at all is proto3's way of sending the zero value, UNSPECIFIED.
    v_mapped   text := COALESCE(sftq.map_provider_state(p_obs ->> 'state'), 'RUNNING');
    v_message  text := NULLIF(p_obs ->> 'message', '');
    v_code     text := NULLIF(p_obs ->> 'status_code', '');
    v_percent  numeric;
    v_epoch    integer;
    v_cost     jsonb := NULLIF(p_obs -> 'estimated_cost', 'null'::jsonb);
    v_first    boolean := false;
    v_class    text;
    v_reason   text;
BEGIN
    IF jsonb_typeof(p_obs -> 'percent') = 'number' THEN
        v_percent := (p_obs ->> 'percent')::numeric;
    END IF;
    IF jsonb_typeof(p_obs -> 'epoch') = 'number' THEN
        v_epoch := floor((p_obs ->> 'epoch')::numeric)::integer;
    END IF;
    IF v_mapped IN ('SUCCESS', 'FAIL', 'CANCELLED') THEN
        PERFORM sftq._gate();
    END IF;
    SELECT * INTO v_job FROM sftq.jobs WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ404', MESSAGE = 'job not found';
    END IF;
    IF v_job.state <> 'PROGRESS' THEN
        RETURN jsonb_build_object('state', v_job.state, 'mapped', v_mapped, 'changed', false,
                                  'first_unknown', false);
    END IF;

    IF v_mapped IN ('RUNNING', 'UNKNOWN') THEN
        -- Still running (an unknown state included: a state Fireworks adds later must never
        -- end a job by accident). Progress the provider left out this time keeps its last
        -- value. An event only when something a person would notice changed: the state,
        -- the epoch, the cost, or the percent into a new tenth (so a running job writes a
        -- handful of progress events, not one per tick).
        v_percent := COALESCE(v_percent, v_job.progress_percent);
        v_epoch := COALESCE(v_epoch, v_job.progress_epoch);
        v_cost := COALESCE(v_cost, v_job.estimated_cost);
        IF v_mapped = 'UNKNOWN' AND v_job.provider_state IS DISTINCT FROM v_state THEN
            v_first := NOT EXISTS (SELECT 1 FROM sftq.job_events e
                                    WHERE e.job_id = p_job_id AND e.event = 'provider_state'
                                      AND e.detail ? 'unknown_state');
        END IF;
        UPDATE sftq.jobs
           SET provider_state = COALESCE(v_state, provider_state),
               provider_state_at = CASE WHEN COALESCE(v_state, provider_state) IS DISTINCT FROM provider_state
                                        THEN p_now ELSE provider_state_at END,
               progress_percent = v_percent, progress_epoch = v_epoch, estimated_cost = v_cost,
               provider_checked_at = p_now,
               -- When progress last moved, for the stall check (205_run_limits.sql).
               progress_moved_at = CASE WHEN v_percent IS DISTINCT FROM progress_percent
                                          OR v_epoch IS DISTINCT FROM progress_epoch
                                        THEN p_now ELSE progress_moved_at END
         WHERE id = p_job_id;
        IF (v_state IS NOT NULL AND v_state IS DISTINCT FROM v_job.provider_state)
           OR v_epoch IS DISTINCT FROM v_job.progress_epoch
           OR v_cost IS DISTINCT FROM v_job.estimated_cost
           OR floor(v_percent / 10) IS DISTINCT FROM floor(v_job.progress_percent / 10) THEN
            PERFORM sftq._event(p_job_id, p_now, 'scheduler', 'provider_state', v_job.state,
                    jsonb_build_object('provider_state', COALESCE(v_state, v_job.provider_state),
                                       'progress_percent', v_percent, 'progress_epoch', v_epoch,
                                       'estimated_cost', v_cost)
                    || CASE WHEN v_mapped = 'UNKNOWN' AND v_state IS DISTINCT FROM v_job.provider_state
                            THEN jsonb_build_object('unknown_state', true) ELSE '{}'::jsonb END);
            RETURN jsonb_build_object('state', v_job.state, 'mapped', v_mapped, 'changed', true,
                                      'first_unknown', v_first);
        END IF;
        RETURN jsonb_build_object('state', v_job.state, 'mapped', v_mapped, 'changed', false,
                                  'first_unknown', false);
    END IF;

    UPDATE sftq.jobs
       SET provider_state = v_state, provider_state_at = p_now, provider_checked_at = p_now,
           progress_percent = COALESCE(v_percent, progress_percent),
           progress_epoch = COALESCE(v_epoch, progress_epoch),
           estimated_cost = COALESCE(v_cost, estimated_cost)
     WHERE id = p_job_id;
    IF v_mapped = 'FAIL' THEN
        v_class := sftq.failure_class_for(v_state, v_code, v_message);
        UPDATE sftq.jobs SET failure_class = v_class WHERE id = p_job_id;
        v_job := sftq._transition(p_job_id, 'FAIL', p_now, 'scheduler', 'failed',
                jsonb_build_object('reason', 'provider_failed', 'provider_state', v_state,
                                   'message', v_message, 'status_code', v_code,
                                   'failure_class', v_class),
                COALESCE(v_message, v_state));
    ELSIF v_mapped = 'SUCCESS' THEN
        v_job := sftq._transition(p_job_id, 'SUCCESS', p_now, 'scheduler', 'succeeded',
                jsonb_build_object('provider_state', v_state, 'message', v_message));
    ELSE
        v_reason := CASE WHEN v_job.cancel_requested_at IS NOT NULL THEN 'cancel_requested'
                         WHEN v_state IN ('NOT_FOUND', 'JOB_STATE_DELETED') THEN 'deleted_outside'
                         ELSE 'cancelled_outside' END;
        v_job := sftq._transition(p_job_id, 'CANCELLED', p_now, 'scheduler', 'cancelled',
                jsonb_build_object('reason', v_reason, 'provider_state', v_state, 'message', v_message),
                CASE WHEN v_job.cancel_requested_at IS NULL
                     THEN format('cancelled outside the queue (provider reported %s)', v_state) END);
    END IF;
    RETURN jsonb_build_object('state', v_job.state, 'mapped', v_mapped, 'changed', true,
                              'first_unknown', false);
END
$$;
COMMENT ON FUNCTION sftq.observe_provider_job(uuid, jsonb, timestamptz) IS
    'Records what the provider says about one of our PROGRESS jobs. p_obs: {state (a JOB_STATE_* with or without the prefix, or NOT_FOUND for a 404), message, status_code, percent, epoch, estimated_cost}. A terminal state ends the job (sftq.map_provider_state; FAIL with sftq.failure_class_for); any other keeps it PROGRESS, stores the sub-state and progress, and writes a provider_state event only when something changed. Answers {state, mapped (SUCCESS|FAIL|CANCELLED|RUNNING|UNKNOWN), changed, first_unknown (this job shows an unknown state for the first time)}. A no-op on a job no longer in PROGRESS. Locking contract: gate (shared) when it transitions, the job row, then its user row.';

-- The old entry point (tests and tools call it): state and message only.
CREATE OR REPLACE FUNCTION sftq.record_provider_state(
    p_job_id          uuid,
    p_provider_state  text,
    p_message         text DEFAULT NULL,
    p_now             timestamptz DEFAULT now())
RETURNS text
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.observe_provider_job(
               p_job_id, jsonb_build_object('state', p_provider_state, 'message', p_message), p_now)
           ->> 'state'
$$;
COMMENT ON FUNCTION sftq.record_provider_state(uuid, text, text, timestamptz) IS
    'sftq.observe_provider_job with a state and a message only; answers the job''s state. Locking contract: as observe_provider_job.';

CREATE OR REPLACE FUNCTION sftq.provider_job_id(p_job_id uuid)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'sftq-' || replace(p_job_id::text, '-', '')
$$;
COMMENT ON FUNCTION sftq.provider_job_id(uuid) IS
    'The provider job id we choose for a job: deterministic, so a retried create answers 409 instead of making a second job.';
