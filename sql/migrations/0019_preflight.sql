-- 0019: pre-flight against Fireworks' resources (issue 44). jobs-api checks a payload's
-- dataset, evaluator and model (and asks an SFT job's cost) at enqueue when the provider
-- answers within its budget; otherwise the tick does it while the job waits
-- (sql/procedures/180_preflight.sql). docs/api.md (Pre-flight) says what each finding means.

ALTER TABLE sftq.jobs
    ADD COLUMN warnings jsonb CHECK (warnings IS NULL OR jsonb_typeof(warnings) = 'array'),
    ADD COLUMN preflight_checked_at timestamptz,
    ADD COLUMN preflight_tried_at timestamptz;
COMMENT ON COLUMN sftq.jobs.warnings IS
    'The pre-flight check''s doubtful findings, [{path, message}], as the 201 of POST /jobs showed them (and any the provider check added later); NULL when there were none.';
COMMENT ON COLUMN sftq.jobs.preflight_checked_at IS
    'When the provider checks were done (or skipped: "validate": "off", or no checks to make). NULL: still to do; the tick checks QUEUED jobs oldest first (sftq.preflight_work).';
COMMENT ON COLUMN sftq.jobs.preflight_tried_at IS
    'When the provider checks were last tried without an answer (the provider failed or was slow); the tick tries again a minute later.';

-- No index for the tick's pick: it walks the QUEUED jobs in FIFO order on the queue's own
-- index and stops at its limit, and almost every job is checked at enqueue. An index on the
-- unchecked ones would cost every enqueue an index entry for a read made once a tick.
