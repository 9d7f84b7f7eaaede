-- 0020: per-job fault isolation in the tick (issue 52). Whatever goes wrong while the tick
-- handles one job is recorded on that job (a tick_error event) and the tick goes on with
-- the others; a job whose handling fails the same way on several ticks in a row ends FAIL
-- permanent (sql/procedures/185_job_faults.sql, docs/scheduling.md, Faults).

CREATE TABLE sftq.job_faults (
    job_id        uuid PRIMARY KEY REFERENCES sftq.jobs (id) ON DELETE CASCADE,
    faults        integer NOT NULL CHECK (faults > 0),
    phase         text NOT NULL,
    error_type    text NOT NULL,
    error         text NOT NULL,
    first_at      timestamptz NOT NULL,
    last_at       timestamptz NOT NULL,
    last_tick_id  bigint
);
COMMENT ON TABLE sftq.job_faults IS
    'The jobs whose handling by the tick failed on the last tick that handled them (one row a job, removed when a tick handles the job without a fault or the job ends). Written only by sftq.record_job_fault and sftq.clear_job_faults.';
COMMENT ON COLUMN sftq.job_faults.faults IS
    'How many ticks in a row failed to handle the job the same way (phase and error_type); a tick counts once however many of its phases failed. At the limit (SFTQ_JOB_FAULT_LIMIT) the job ends FAIL permanent.';
COMMENT ON COLUMN sftq.job_faults.phase IS
    'The tick phase of the last faulting tick''s first fault: reconcile, cancel, preflight, submit, last_check.';
COMMENT ON COLUMN sftq.job_faults.error_type IS
    'The kind of error of the last fault (the exception''s class name, e.g. InvalidURL): with phase, what "the same way" compares.';
COMMENT ON COLUMN sftq.job_faults.error IS 'That fault''s error, as its tick_error event shows it.';
COMMENT ON COLUMN sftq.job_faults.first_at IS 'When the current run of faults began.';
COMMENT ON COLUMN sftq.job_faults.last_at IS 'When the last fault was recorded.';
COMMENT ON COLUMN sftq.job_faults.last_tick_id IS
    'The tick (sftq.scheduler_ticks.id) that recorded the last fault: a second fault in the same tick is not counted again.';
