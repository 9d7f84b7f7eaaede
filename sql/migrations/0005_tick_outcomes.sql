-- 0005: what the tick records so that one job never stalls the queue and every end has a
-- reason (issue 10), the provider's progress (issue 11), and a GPU budget that stops
-- counting our job twice once the provider's usage shows it (issue 19).

ALTER TABLE sftq.jobs
    ADD COLUMN failure_class          text
        CHECK (failure_class IN ('permanent', 'retryable', 'unknown')),
    ADD COLUMN retry_of               uuid REFERENCES sftq.jobs (id),
    ADD COLUMN queue_timeout_seconds  integer
        CHECK (queue_timeout_seconds BETWEEN 1 AND 2592000),
    ADD COLUMN queue_expires_at       timestamptz,
    ADD COLUMN progress_percent       numeric,
    ADD COLUMN progress_epoch         integer,
    ADD COLUMN estimated_cost         jsonb,
    ADD COLUMN next_submit_at         timestamptz,
    ADD COLUMN provider_checked_at    timestamptz,
    ADD COLUMN usage_counted_at       timestamptz;

COMMENT ON COLUMN sftq.jobs.failure_class IS
    'Set on every FAIL: permanent (a resubmit would fail the same way: the payload was refused, or the provider failed it for a cause of its own), retryable (we gave up after transient errors; EXPIRED; capacity, preemption or internal failures), unknown. docs/scheduling.md lists the mapping.';
COMMENT ON COLUMN sftq.jobs.retry_of IS 'The job this one retries (POST /jobs/{id}/retry), else NULL.';
COMMENT ON COLUMN sftq.jobs.queue_timeout_seconds IS
    'How long the job may wait QUEUED (from submit, or the operator default SFTQ_QUEUE_TIMEOUT_SECONDS at enqueue); NULL: no limit.';
COMMENT ON COLUMN sftq.jobs.queue_expires_at IS 'created_at + queue_timeout_seconds: a tick cancels the job if it is still QUEUED then.';
COMMENT ON COLUMN sftq.jobs.progress_percent IS 'jobProgress.percent as the provider last reported it.';
COMMENT ON COLUMN sftq.jobs.progress_epoch IS 'jobProgress.epoch as the provider last reported it.';
COMMENT ON COLUMN sftq.jobs.estimated_cost IS 'estimatedCost as the provider last reported it, verbatim.';
COMMENT ON COLUMN sftq.jobs.next_submit_at IS 'After a failed create: the earliest time of the next attempt (exponential backoff).';
COMMENT ON COLUMN sftq.jobs.provider_checked_at IS 'When a tick last learned this job''s state from the provider.';
COMMENT ON COLUMN sftq.jobs.usage_counted_at IS
    'When a quota reading first showed this job in the provider''s usage; until then admission counts it on top of that usage (see sftq.admission_budget).';

-- Jobs that failed before this migration: a rejected create is permanent, an EXPIRED run
-- retryable; nothing else can be told apart now.
UPDATE sftq.jobs j
   SET failure_class = CASE
         WHEN EXISTS (SELECT 1 FROM sftq.job_events e
                       WHERE e.job_id = j.id AND e.event = 'submission_rejected') THEN 'permanent'
         WHEN j.provider_state = 'JOB_STATE_EXPIRED' THEN 'retryable'
         ELSE 'unknown' END
 WHERE j.state = 'FAIL';

-- The tick's queue-timeout sweep reads only the queued jobs that have a deadline.
CREATE INDEX jobs_queue_expiry_idx ON sftq.jobs (queue_expires_at, id)
    WHERE state = 'QUEUED' AND queue_expires_at IS NOT NULL;
