-- 0013: a bound on the final check of a submission that kept failing (issue 10, item 4).
-- Out of attempts or time, the tick GETs the job's deterministic provider id once more
-- before giving up; when that GET itself cannot be made (5xx, a timeout, a 401/403 for this
-- job while the account answers), it is retried under the backoff a few times only, so the
-- job cannot hold its user's slot and its GPUs for ever. These columns count those
-- failures and keep the answer the job gave up on.

ALTER TABLE sftq.jobs
    ADD COLUMN last_check_failures integer NOT NULL DEFAULT 0
        CHECK (last_check_failures >= 0),
    ADD COLUMN last_check_error    text;

COMMENT ON COLUMN sftq.jobs.last_check_failures IS
    'Final checks that could not be made: GETs of the job''s provider id, after its creates ran out of attempts or time, that failed (5xx, timeout, or a 401/403 for this job). At the bound (sftq.record_submit_failure) the job ends FAIL retryable. 0 for every job whose creates never ran out.';
COMMENT ON COLUMN sftq.jobs.last_check_error IS
    'Set only when the job gave up because its final check could not be made: that check''s last answer (also in the job''s error). Each earlier failed check is a final_check_failed event.';
