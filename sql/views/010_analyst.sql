-- The analyst surface: what SQL analysts (role sftq_analyst) may read. Payload secrets
-- are redacted and key material is absent. The views run with their owner's rights,
-- so the analyst role needs no grant on the tables underneath.

CREATE OR REPLACE VIEW sftq.analyst_jobs AS
SELECT j.id,
       u.name                                                     AS user_name,
       j.kind,
       j.state,
       j.display_name,
       j.gpu_count,
       sftq.redact_secrets(j.fireworks_payload)                   AS fireworks_payload,
       j.fireworks_job_name,
       j.created_at,
       j.started_at,
       j.completed_at,
       j.error,
       j.cancel_requested_at,
       j.submitted_at,
       j.submit_attempts,
       j.last_submit_error,
       j.provider_state,
       j.provider_state_at,
       extract(epoch FROM j.started_at - j.created_at)            AS queue_wait_seconds,
       extract(epoch FROM j.completed_at - j.started_at)          AS run_duration_seconds,
       j.gpu_count * extract(epoch FROM j.completed_at - j.started_at) / 3600 AS gpu_hours,
       j.failure_class
  FROM sftq.jobs j
  JOIN sftq.users u ON u.id = j.user_id;
COMMENT ON VIEW sftq.analyst_jobs IS
    'Every job with derived timings (seconds) and GPU hours; payload secrets redacted. run_duration_seconds and gpu_hours are null until the job ends, and for jobs cancelled while queued.';
COMMENT ON COLUMN sftq.analyst_jobs.queue_wait_seconds IS 'Seconds from enqueue to admission; null while queued or if cancelled while queued.';
COMMENT ON COLUMN sftq.analyst_jobs.run_duration_seconds IS 'Seconds from admission to completion; null until the job ends.';
COMMENT ON COLUMN sftq.analyst_jobs.gpu_hours IS 'gpu_count x run duration in hours.';
COMMENT ON COLUMN sftq.analyst_jobs.failure_class IS 'For FAIL jobs: permanent, retryable or unknown (docs/scheduling.md); null otherwise.';
COMMENT ON COLUMN sftq.analyst_jobs.fireworks_payload IS 'The Fireworks body with secret-looking keys replaced by "[REDACTED]".';

CREATE OR REPLACE VIEW sftq.analyst_job_events AS
SELECT e.id, e.job_id, u.name AS user_name, j.kind, e.at, e.actor, e.event,
       e.from_state, e.to_state, e.detail, e.state
  FROM sftq.job_events e
  JOIN sftq.jobs j ON j.id = e.job_id
  JOIN sftq.users u ON u.id = j.user_id;
COMMENT ON VIEW sftq.analyst_job_events IS 'Every transition and scheduler action, with who did it and what they saw.';

CREATE OR REPLACE VIEW sftq.analyst_ticks AS
SELECT id, started_at, finished_at, status, quota_limit, quota_usage, budget, admitted,
       submitted, reconciled, cancelled, failed, errors,
       extract(epoch FROM finished_at - started_at) AS duration_seconds
  FROM sftq.scheduler_ticks;
COMMENT ON VIEW sftq.analyst_ticks IS 'One row per scheduler tick: quota seen, budget, what it did, errors.';

CREATE OR REPLACE VIEW sftq.analyst_users AS
SELECT u.id, u.name, u.created_at, u.disabled_at, u.max_running,
       u.running_count AS running, u.queued_count AS queued
  FROM sftq.users u;
COMMENT ON VIEW sftq.analyst_users IS 'Users with their cap and current running and queued counts (no key material).';

-- fifo_rank numbers the QUEUED jobs straight from jobs_queued_idx, and the owner is joined
-- after numbering (a hash of the users, not one probe per job). ROWS: row_number ignores the
-- frame, and PostgreSQL 15 would otherwise compare each row with the next to find its peers.
-- `WHERE fifo_rank <= n` stops the numbering after n rows; `ORDER BY created_at, id LIMIT n`
-- reads n rows of the index. `ORDER BY fifo_rank LIMIT n` alone still numbers the whole queue:
-- the planner cannot tell that fifo_rank follows (created_at, id) (docs/analysts.md).
CREATE OR REPLACE VIEW sftq.analyst_queue AS
SELECT q.fifo_rank, q.id, u.name AS user_name, q.kind, q.gpu_count, q.created_at,
       q.id = u.head_job_id AS is_user_head,
       u.running_count >= u.max_running AS user_at_cap
  FROM (SELECT row_number() OVER (ORDER BY j.created_at, j.id ROWS UNBOUNDED PRECEDING) AS fifo_rank,
               j.id, j.user_id, j.kind, j.gpu_count, j.created_at
          FROM sftq.jobs j
         WHERE j.state = 'QUEUED') q
  JOIN sftq.users u ON u.id = q.user_id;
COMMENT ON VIEW sftq.analyst_queue IS 'The queue in FIFO order, with whether each job heads its user''s queue and whether that user is at cap.';

-- Per day of the session's time zone (sql/procedures/160_analyst_daily.sql has the design).
-- For the UTC days that are over: the rollup with the moves not folded in yet; a UTC day that
-- is exactly one day of the session's zone (every day in UTC) is read from daily_rollup, by
-- its index; another one from daily_rollup_hours, each hour to the day it lies in; an hour in
-- which the zone's day changes is counted from its jobs, as are the days not rolled up yet
-- (today). A group whose jobs all moved to other states is not shown, as before. The jobs
-- are read per range of created_at (jobs_created_brin_idx), driven by the state row and the
-- list of hours (OFFSET 0 keeps that order: the planner cannot know how few jobs a range
-- holds, and would rather scan every job in parallel against an empty list; the list comes
-- from a function that says it has one row, or the plan would be costed as if it had a
-- thousand, and a server with jit on would compile it at every query).
CREATE OR REPLACE VIEW sftq.analyst_daily AS
SELECT d.day, d.kind, d.state, sum(d.jobs)::bigint AS jobs, sum(d.gpu_hours) AS gpu_hours
  FROM (SELECT r.day, r.kind, r.state, r.jobs, r.gpu_hours
          FROM sftq.daily_rollup r
         WHERE date_trunc('day', r.day) = r.day
           AND date_trunc('day', r.day + interval '24 hours') = r.day + interval '24 hours'
           AND date_trunc('day', r.day + interval '24 hours' - interval '1 microsecond') = r.day
        UNION ALL
        SELECT date_trunc('day', r.hour), r.kind, r.state, r.jobs, r.gpu_hours
          FROM sftq.daily_rollup_state s
         CROSS JOIN LATERAL generate_series(s.rolled_from, s.rolled_through - interval '24 hours',
                                            interval '24 hours') g (day)
          JOIN sftq.daily_rollup_hours r ON r.day = g.day
         WHERE NOT (date_trunc('day', g.day) = g.day
                    AND date_trunc('day', g.day + interval '24 hours') = g.day + interval '24 hours'
                    AND date_trunc('day', g.day + interval '24 hours' - interval '1 microsecond') = g.day)
           AND date_trunc('day', r.hour) = date_trunc('day', r.hour + interval '1 hour' - interval '1 microsecond')
        UNION ALL
        SELECT date_trunc('day', m.hour), m.kind, x.state, x.jobs, x.gpu_hours
          FROM sftq.daily_rollup_moves m
         CROSS JOIN LATERAL (VALUES (m.from_state, -1, NULL::numeric),
                                    (m.to_state, 1, m.gpu_hours)) x (state, jobs, gpu_hours)
         WHERE m.hour < (SELECT s.rolled_through FROM sftq.daily_rollup_state s)
           AND date_trunc('day', m.hour) = date_trunc('day', m.hour + interval '1 hour' - interval '1 microsecond')
        UNION ALL
        SELECT date_trunc('day', t.created_at), t.kind, t.state, 1, t.gpu_hours
          FROM sftq.daily_rollup_state s
         CROSS JOIN LATERAL (
               SELECT j.created_at, j.kind, j.state,
                      j.gpu_count * extract(epoch FROM j.completed_at - j.started_at) / 3600 AS gpu_hours
                 FROM sftq.jobs j
                WHERE j.created_at >= s.rolled_through
               OFFSET 0) t
        UNION ALL
        SELECT date_trunc('day', t.created_at), t.kind, t.state, 1, t.gpu_hours
          FROM sftq.analyst_daily_split_hours() h (hour)
         CROSS JOIN LATERAL (
               SELECT j.created_at, j.kind, j.state,
                      j.gpu_count * extract(epoch FROM j.completed_at - j.started_at) / 3600 AS gpu_hours
                 FROM sftq.jobs j
                WHERE j.created_at >= h.hour AND j.created_at < h.hour + interval '1 hour'
               OFFSET 0) t) d
 GROUP BY d.day, d.kind, d.state
HAVING sum(d.jobs) > 0;
COMMENT ON VIEW sftq.analyst_daily IS 'Jobs and GPU hours per day of enqueue (in the session''s time zone), kind and state.';
