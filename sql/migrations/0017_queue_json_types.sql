-- 0017: the two small objects of each job in GET /jobs/analytics/queue (waiting_reason and
-- estimate) as named composites, so that sftq.queue_context can write each job as one row
-- (json_agg of a row) instead of three json_build_object calls per job, which resolve the
-- output function of every argument at every call.

CREATE TYPE sftq.waiting_reason_json AS (
    code     text,
    message  text
);
COMMENT ON TYPE sftq.waiting_reason_json IS
    'A queued job''s waiting_reason as the API writes it: {"code", "message"} (sftq.queue_context).';

CREATE TYPE sftq.estimate_json AS (
    basis  text
);
COMMENT ON TYPE sftq.estimate_json IS
    'A queued job''s estimate as the API writes it: {"basis"} (sftq.queue_context).';
