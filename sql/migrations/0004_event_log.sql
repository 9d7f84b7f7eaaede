-- 0004: the event log becomes each job's public history (GET /jobs/{id}/events, the stream,
-- webhooks). Every row now says the job's state right after it, and enqueue writes the first
-- row ('queued'), so a job's history starts where the job does.

ALTER TABLE sftq.job_events ADD COLUMN state text;

-- Rows written before this migration: the state after a row is its own to_state, else the
-- last to_state before it in the same job, else QUEUED (every job starts there).
UPDATE sftq.job_events e
   SET state = COALESCE(e.to_state,
                        (SELECT p.to_state FROM sftq.job_events p
                          WHERE p.job_id = e.job_id AND p.id < e.id AND p.to_state IS NOT NULL
                          ORDER BY p.id DESC LIMIT 1),
                        'QUEUED');

ALTER TABLE sftq.job_events
    ALTER COLUMN state SET NOT NULL,
    ADD CONSTRAINT job_events_state_check
        CHECK (state IN ('QUEUED', 'PROGRESS', 'SUCCESS', 'FAIL', 'CANCELLED'));

COMMENT ON COLUMN sftq.job_events.state IS 'The job''s state right after this event.';
COMMENT ON COLUMN sftq.job_events.event IS
    'What happened: queued, admitted, submitted, submit_retry, provider_state, cancel_requested, cancelled, succeeded, failed, and the types later migrations add (see sftq._event).';
