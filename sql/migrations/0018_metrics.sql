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

-- The counts of the jobs already there are taken by sftq.metrics_rebuild, which
-- sql/procedures/170_metrics.sql runs once, after it has created the triggers that count from
-- then on.
