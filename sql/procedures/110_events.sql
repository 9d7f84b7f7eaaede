-- A job's history as its owner reads it: GET /jobs/{id}/events.
--
-- The rows are sftq.job_events (written only through sftq._event). The sentence for a
-- person is computed here, at read time, from the event's type and detail, so wording can
-- improve without rewriting history. Details are shown with secrets redacted.

CREATE OR REPLACE FUNCTION sftq._provider_state_label(p_state text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT regexp_replace(p_state, '^JOB_STATE_', '')
$$;
COMMENT ON FUNCTION sftq._provider_state_label(text) IS 'A provider state for a sentence: JOB_STATE_RUNNING -> RUNNING.';

CREATE OR REPLACE FUNCTION sftq.event_message(
    p_event   text,
    p_state   text,
    p_from    text,
    p_actor   text,
    p_detail  jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH d AS (
        SELECT COALESCE(p_detail, '{}'::jsonb) AS j,
               CASE WHEN p_actor LIKE 'user:%' THEN 'at your request'
                    WHEN p_actor = 'admin' THEN 'by an administrator'
                    ELSE 'by the scheduler' END AS by_whom,
               CASE WHEN p_actor LIKE 'user:%' THEN 'You'
                    WHEN p_actor = 'admin' THEN 'An administrator'
                    ELSE 'The scheduler' END AS who
    ), x AS (
        SELECT d.*,
               sftq._provider_state_label(COALESCE(d.j ->> 'provider_state', d.j ->> 'to')) AS ps,
               d.j ->> 'reason' AS reason,
               CASE d.j ->> 'failure_class'
                   WHEN 'permanent' THEN ' The failure is permanent: a retry would fail the same way.'
                   WHEN 'retryable' THEN ' The failure is temporary: a retry may succeed.'
                   ELSE '' END AS class_note,
               CASE WHEN jsonb_typeof(d.j -> 'progress_percent') = 'number'
                    THEN round((d.j ->> 'progress_percent')::numeric, 1)::float8 END AS pct,
               CASE WHEN jsonb_typeof(d.j -> 'progress_epoch') = 'number'
                    THEN (d.j ->> 'progress_epoch')::numeric END AS epoch
          FROM d
    )
    SELECT CASE p_event
        WHEN 'queued' THEN
            CASE WHEN x.j ? 'retry_of' THEN format('Queued as a retry of job %s.', x.j ->> 'retry_of')
                 ELSE 'Queued: waiting for admission.' END
        WHEN 'admitted' THEN
            CASE WHEN x.j ? 'gpu_count' AND x.j ? 'gpu_budget' THEN
                     format('Admitted: it needed %s GPU%s and %s were free.', x.j ->> 'gpu_count',
                            CASE WHEN x.j ->> 'gpu_count' = '1' THEN '' ELSE 's' END, x.j ->> 'gpu_budget')
                 ELSE 'Admitted by the scheduler.' END
        WHEN 'preflight_failed' THEN
            'Left the queue before its turn: the pre-flight check found a resource it needs missing at the provider.'
        WHEN 'submitted' THEN
            CASE WHEN (x.j ->> 'adopted_existing')::boolean IS TRUE THEN
                     format('Submitted: the provider already had it as %s, and the queue adopted that job.',
                            COALESCE(x.j ->> 'fireworks_job_name', 'its job'))
                 WHEN x.j ? 'fireworks_job_name' THEN
                     format('Submitted to the provider as %s.', x.j ->> 'fireworks_job_name')
                 ELSE 'Submitted to the provider.' END
        WHEN 'submit_retry' THEN
            format('Submission attempt %s failed with a temporary error; the scheduler tries again at its next tick.',
                   COALESCE(x.j ->> 'attempt', '?'))
        WHEN 'provider_state' THEN
            CASE WHEN x.ps IS NULL AND x.pct IS NULL THEN 'The provider reported a change.'
                 ELSE concat_ws(', ',
                          CASE WHEN x.ps IS NOT NULL THEN format('The provider reports %s', x.ps)
                               ELSE 'The provider reports progress' END,
                          CASE WHEN x.pct IS NOT NULL THEN format('%s%% done', x.pct) END,
                          CASE WHEN x.epoch IS NOT NULL THEN format('epoch %s', x.epoch) END) || '.' END
        WHEN 'cancel_requested' THEN
            CASE WHEN x.reason = 'run_timeout' THEN  -- 205_run_limits.sql
                     format('It ran at the provider past its max_run_seconds (%s); the scheduler is stopping it.',
                            COALESCE(sftq._human_seconds((x.j ->> 'max_run_seconds')::numeric), '?'))
                 WHEN (x.j ->> 'submitted')::boolean IS FALSE THEN
                     format('%s asked to cancel it before the provider job was created; the scheduler finishes the cancel at its next tick.', x.who)
                 ELSE format('%s asked to cancel it; the provider job is being stopped.', x.who) END
        WHEN 'cancelled' THEN
            CASE WHEN p_from = 'QUEUED' AND x.reason IS NULL THEN format('Cancelled while queued, %s.', x.by_whom)
                 WHEN x.reason IN ('reconciled', 'external', 'deleted_outside', 'not_found', 'provider_deleted',
                                   'cancelled_outside') THEN
                     'Cancelled: the provider job was deleted or cancelled outside the queue'
                     || CASE WHEN x.ps IS NOT NULL THEN format(' (the provider reported %s)', x.ps) ELSE '' END || '.'
                 WHEN x.reason = 'queue_timeout' THEN
                     'Cancelled: it waited longer than its queue timeout without being admitted.'
                 WHEN x.reason = 'cancel_requested' THEN
                     'Cancelled: the provider confirmed that its job stopped.'
                 WHEN x.reason IS NOT NULL THEN format('Cancelled (%s).', replace(x.reason, '_', ' '))
                 WHEN p_actor LIKE 'user:%' OR p_actor = 'admin' THEN
                     format('Cancelled %s: the provider job was stopped.', x.by_whom)
                 ELSE 'Cancelled: the provider confirmed that its job stopped.' END
        WHEN 'reconciled' THEN
            format('Cancelled: the provider job was deleted or cancelled outside the queue (the provider reported %s).',
                   COALESCE(x.ps, 'it gone'))
        WHEN 'succeeded' THEN 'Finished successfully.'
        WHEN 'failed' THEN
            CASE WHEN x.reason IN ('submission_rejected', 'rejected') THEN
                     'Failed: the provider rejected the submission; the job''s error field holds its answer.'
                 WHEN x.reason = 'preflight_failed' THEN
                     'Failed before its turn: the pre-flight check found '
                     || COALESCE(left(x.j #>> '{findings,0,message}', 300), 'a resource that does not exist')
                     || CASE WHEN jsonb_array_length(COALESCE(x.j -> 'findings', '[]')) > 1
                             THEN format(' (and %s more; the job''s error field lists them)',
                                         jsonb_array_length(x.j -> 'findings') - 1) ELSE '' END
                     || '. It was never sent to the provider.'
                 WHEN x.reason = 'tick_errors' THEN
                     format('Failed: the scheduler could not handle it on %s ticks in a row; the job''s error field holds the last error.',
                            COALESCE(x.j ->> 'faults', '?'))
                 WHEN x.reason = 'submission_gave_up' THEN
                     format('Failed: the provider could not be reached to create it (%s failed attempts over %s); the job''s error field holds the last answer.',
                            COALESCE(x.j ->> 'attempts', '?'),
                            CASE WHEN jsonb_typeof(x.j -> 'seconds') = 'number'
                                 THEN sftq._human_seconds((x.j ->> 'seconds')::numeric) ELSE 'a while' END)
                 WHEN x.j ->> 'message' IS NOT NULL AND x.j ->> 'message' <> '' THEN
                     format('Failed at the provider: %s', left(x.j ->> 'message', 300))
                 WHEN x.reason IS NOT NULL THEN format('Failed (%s).', replace(x.reason, '_', ' '))
                 WHEN x.ps IS NOT NULL THEN format('Failed: the provider reported %s.', x.ps)
                 ELSE 'Failed.' END || x.class_note
        WHEN 'submission_rejected' THEN
            format('Failed: the provider rejected the submission (attempt %s); the job''s error field holds its answer.',
                   COALESCE(x.j ->> 'attempt', '?'))
        WHEN 'queue_timeout' THEN
            CASE WHEN jsonb_typeof(x.j -> 'queue_timeout_seconds') = 'number' THEN
                     format('Cancelled: it waited longer than its queue timeout (%s) without being admitted.',
                            sftq._human_seconds((x.j ->> 'queue_timeout_seconds')::numeric))
                 ELSE 'Cancelled: it waited longer than its queue timeout without being admitted.' END
        WHEN 'tick_error' THEN
            format('The scheduler could not handle it (%s step: %s)%s', COALESCE(x.j ->> 'phase', '?'),
                   left(COALESCE(x.j ->> 'error', x.j ->> 'error_type', 'an error'), 300),
                   CASE WHEN (x.j ->> 'ends_job')::boolean IS TRUE THEN '; that was one time too many, so it fails.'
                        ELSE format('; fault %s of %s in a row, the scheduler tries again at its next tick.',
                                    COALESCE(x.j ->> 'fault', '?'), COALESCE(x.j ->> 'limit', '?')) END)
        -- Pipelines and run limits (200_pipelines.sql, 205_run_limits.sql).
        WHEN 'waiting_for_dependency' THEN
            format('Waits for job %s to succeed before it may be admitted.', x.j ->> 'waiting_on')
        WHEN 'dependencies_met' THEN
            format('Every job it runs after has succeeded (the last: %s); it takes its place in the queue.',
                   x.j ->> 'last')
        WHEN 'dependency_failed' THEN
            format('Cancelled: job %s, which it runs after, ended %s.', x.j ->> 'after', x.j ->> 'after_state')
        WHEN 'run_timeout' THEN
            format('Cancelled: it ran at the provider past its max_run_seconds (%s), and the scheduler stopped it.',
                   COALESCE(sftq._human_seconds((x.j ->> 'max_run_seconds')::numeric), '?'))
        WHEN 'stalled' THEN
            format('Stalled: its progress at the provider has not moved since %s. It is not cancelled; cancel it if it has crashed.',
                   x.j ->> 'since')
        WHEN 'retried' THEN
            CASE WHEN x.j ? 'new_job_id' THEN format('Retried as job %s.', x.j ->> 'new_job_id')
                 ELSE 'Retried as a new job.' END
        ELSE format('%s (the job is %s).', initcap(replace(p_event, '_', ' ')), p_state)
    END
      FROM x
$$;
COMMENT ON FUNCTION sftq.event_message(text, text, text, text, jsonb) IS
    'A sentence for a person about one event, from its type, the state before it, its actor and its (redacted) detail. Covers every type the event log holds (queued, admitted, preflight_failed, submitted, submit_retry, provider_state, cancel_requested, cancelled, succeeded, failed, submission_rejected, reconciled, queue_timeout, retried, tick_error; failed/cancelled with detail.reason and failure_class) and words any other type generically. Names only the job''s own ids, never another user. Pure.';

CREATE OR REPLACE FUNCTION sftq.event_json(e sftq.job_events)
RETURNS json
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT json_build_object(
        'id', e.id::text, 'job_id', e.job_id, 'type', e.event, 'state', e.state,
        'message', sftq.event_message(e.event, e.state, e.from_state, e.actor,
                                      sftq.redact_secrets(e.detail)),
        'created_at', sftq._iso(e.at),
        'data', COALESCE(sftq.redact_secrets(e.detail), '{}'::jsonb))
$$;
COMMENT ON FUNCTION sftq.event_json(sftq.job_events) IS
    'One event as GET /jobs/{id}/events shows it: id (text), job_id, type, state (the job''s state after it), message (sftq.event_message), created_at, data (the detail with secrets redacted, {} when none).';

CREATE OR REPLACE FUNCTION sftq.job_events_page(
    p_user_id  bigint,
    p_job_id   uuid,
    p_limit    integer DEFAULT 50,
    p_after    bigint DEFAULT NULL)
RETURNS json
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'limit must be between 1 and 100';
    END IF;
    PERFORM sftq.get_job(p_user_id, p_job_id);  -- another user's job: SQ404
    RETURN (
        SELECT json_build_object(
                   'data', COALESCE(json_agg(sftq.event_json(q.ev) ORDER BY q.n)
                                        FILTER (WHERE q.n <= p_limit), '[]'::json),
                   'has_more', count(*) > p_limit)
          FROM (SELECT e AS ev, row_number() OVER (ORDER BY e.id) AS n
                  FROM sftq.job_events e
                 WHERE e.job_id = p_job_id AND e.id > COALESCE(p_after, 0)
                 ORDER BY e.id
                 LIMIT p_limit + 1) q);
END
$$;
COMMENT ON FUNCTION sftq.job_events_page(bigint, uuid, integer, bigint) IS
    'One page of a job''s history, oldest first: {data: [event, ...], has_more}, events with id > p_after, at most p_limit (1..100, else SQ400). SQ404 when the job is not the caller''s. Reads job_events_job_idx only; takes no locks.';

CREATE OR REPLACE FUNCTION sftq.api_job_events(
    p_key_hash  bytea,
    p_job_id    uuid,
    p_limit     integer,
    p_after     bigint)
RETURNS json
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sftq.job_events_page(sftq._auth(p_key_hash), p_job_id, p_limit, p_after)
$$;
COMMENT ON FUNCTION sftq.api_job_events(bytea, uuid, integer, bigint) IS 'GET /jobs/:id/events. SQ404 when not the caller''s.';
