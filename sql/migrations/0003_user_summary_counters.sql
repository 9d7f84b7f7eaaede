-- 0003: per-user lifetime counters, so a user's summary costs the same for 10 jobs as for
-- 100,000 (it used to aggregate every one of the user's jobs). Kept by sftq.enqueue and
-- sftq._transition in the same UPDATE of the user row they already make.

ALTER TABLE sftq.users
    ADD COLUMN succeeded_count      integer NOT NULL DEFAULT 0,
    ADD COLUMN failed_count         integer NOT NULL DEFAULT 0,
    ADD COLUMN cancelled_count      integer NOT NULL DEFAULT 0,
    ADD COLUMN sft_count            integer NOT NULL DEFAULT 0,
    ADD COLUMN dpo_count            integer NOT NULL DEFAULT 0,
    ADD COLUMN rft_count            integer NOT NULL DEFAULT 0,
    ADD COLUMN success_run_seconds  numeric NOT NULL DEFAULT 0,
    ADD COLUMN success_gpu_seconds  numeric NOT NULL DEFAULT 0;

COMMENT ON COLUMN sftq.users.succeeded_count IS 'Lifetime count of this user''s SUCCESS jobs (likewise failed_count, cancelled_count).';
COMMENT ON COLUMN sftq.users.sft_count IS 'Lifetime count of this user''s SFT jobs (likewise dpo_count, rft_count).';
COMMENT ON COLUMN sftq.users.success_run_seconds IS 'Sum of run durations (seconds) of this user''s SUCCESS jobs.';
COMMENT ON COLUMN sftq.users.success_gpu_seconds IS 'Sum of gpu_count x run duration (seconds) of this user''s SUCCESS jobs.';

UPDATE sftq.users u
   SET succeeded_count = s.succeeded, failed_count = s.failed, cancelled_count = s.cancelled,
       sft_count = s.sft, dpo_count = s.dpo, rft_count = s.rft,
       success_run_seconds = s.run_seconds, success_gpu_seconds = s.gpu_seconds
  FROM (SELECT user_id,
               count(*) FILTER (WHERE state = 'SUCCESS') AS succeeded,
               count(*) FILTER (WHERE state = 'FAIL') AS failed,
               count(*) FILTER (WHERE state = 'CANCELLED') AS cancelled,
               count(*) FILTER (WHERE kind = 'SFT') AS sft,
               count(*) FILTER (WHERE kind = 'DPO') AS dpo,
               count(*) FILTER (WHERE kind = 'RFT') AS rft,
               COALESCE(sum(extract(epoch FROM completed_at - started_at))
                        FILTER (WHERE state = 'SUCCESS'), 0) AS run_seconds,
               COALESCE(sum(gpu_count * extract(epoch FROM completed_at - started_at))
                        FILTER (WHERE state = 'SUCCESS'), 0) AS gpu_seconds
          FROM sftq.jobs GROUP BY user_id) s
 WHERE s.user_id = u.id;

-- A user's newest failures without reading their other jobs.
CREATE INDEX jobs_user_failed_idx ON sftq.jobs (user_id, completed_at DESC, id DESC)
    WHERE state = 'FAIL';
