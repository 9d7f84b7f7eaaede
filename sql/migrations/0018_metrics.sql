-- 0018: the figures GET /functions/v1/jobs-api/metrics serves (issue 45), kept as counts so
-- that one cheap read answers them whatever the number of jobs. sql/procedures/170_metrics.sql
-- keeps them (triggers on jobs and webhook_attempts, the tick's record, the stream poll) and
-- reads them (sftq.metrics); docs/operations.md (Metrics) lists the series.

-- Every change appends a row (name, labels, delta) in its own transaction; the tick folds the
-- rows of one series into one (sftq.metrics_fold). Appending rather than updating one count
-- per series means a transition never waits for another one, as with queue_bucket_deltas.
CREATE TABLE sftq.metric_counts (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name    text NOT NULL,
    labels  jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    value   double precision NOT NULL
);
COMMENT ON TABLE sftq.metric_counts IS
    'Counters and gauges behind GET /metrics: a series (name, labels) is the sum of its rows. Changes append a row; sftq.metrics_fold (every tick) sums each series back into one row. Histogram buckets are name ''<histogram>_bucket'' with an le label, counted per bucket (not cumulative), plus ''<histogram>_sum''.';
COMMENT ON COLUMN sftq.metric_counts.name IS 'The series name without the sftq_ prefix, e.g. pending_jobs, finished_jobs_total.';
COMMENT ON COLUMN sftq.metric_counts.labels IS 'The series labels as a JSON object of strings, e.g. {"kind": "SFT"}.';
COMMENT ON COLUMN sftq.metric_counts.value IS 'This row''s contribution to the series (a delta).';

-- The open streams of each stream server instance, as its last registration refresh saw them.
CREATE TABLE sftq.stream_instances (
    instance      text PRIMARY KEY CHECK (char_length(instance) BETWEEN 16 AND 64),
    open_streams  integer NOT NULL CHECK (open_streams >= 0),
    expires_at    timestamptz NOT NULL
);
COMMENT ON TABLE sftq.stream_instances IS
    'One row per live stream server instance: how many streams it held open at its last refresh (sftq.stream_poll). A row past expires_at belongs to an instance that stopped refreshing and is not counted.';

-- The counts so far, from the rows as they are (the triggers count from here on).
INSERT INTO sftq.metric_counts (name, labels, value)
SELECT 'pending_jobs', jsonb_build_object('kind', k.kind), count(j.id) FILTER (WHERE j.state = 'QUEUED')
  FROM (VALUES ('SFT'), ('DPO'), ('RFT')) k (kind) LEFT JOIN sftq.jobs j ON j.kind = k.kind
 GROUP BY k.kind
UNION ALL
SELECT 'running_jobs', jsonb_build_object('kind', k.kind), count(j.id) FILTER (WHERE j.state = 'PROGRESS')
  FROM (VALUES ('SFT'), ('DPO'), ('RFT')) k (kind) LEFT JOIN sftq.jobs j ON j.kind = k.kind
 GROUP BY k.kind
UNION ALL
SELECT 'running_gpus', '{}', COALESCE(sum(j.gpu_count) FILTER (WHERE j.state = 'PROGRESS'), 0)
  FROM sftq.jobs j
UNION ALL
SELECT 'admitted_jobs_total', '{}', count(*) FILTER (WHERE j.started_at IS NOT NULL)
  FROM sftq.jobs j
UNION ALL
SELECT 'finished_jobs_total',
       jsonb_build_object('state', j.state, 'failure_class', COALESCE(j.failure_class, '')),
       count(*)
  FROM sftq.jobs j
 WHERE j.state IN ('SUCCESS', 'FAIL', 'CANCELLED')
 GROUP BY j.state, j.failure_class
UNION ALL
SELECT 'webhook_deliveries_total', jsonb_build_object('result', a.outcome), count(*)
  FROM sftq.webhook_attempts a
 GROUP BY a.outcome;

-- The admission wait of the jobs admitted so far, in the buckets sftq.metric_bucket uses
-- (sql/procedures/170_metrics.sql; these bounds are its bounds at this migration).
WITH waits AS (
    SELECT extract(epoch FROM j.started_at - j.created_at)::float8 AS s
      FROM sftq.jobs j WHERE j.started_at IS NOT NULL
), bucketed AS (
    SELECT COALESCE((SELECT min(b)::text FROM unnest(ARRAY[1, 5, 15, 30, 60, 120, 300, 600, 1800,
                                                            3600, 7200, 21600, 86400]::float8[]) b
                      WHERE w.s <= b), '+Inf') AS le, w.s
      FROM waits w
)
INSERT INTO sftq.metric_counts (name, labels, value)
SELECT 'admission_wait_time_seconds_bucket', jsonb_build_object('le', b.le), count(*)
  FROM bucketed b GROUP BY b.le
UNION ALL
SELECT 'admission_wait_time_seconds_sum', '{}', COALESCE(sum(b.s), 0) FROM bucketed b;
