-- GET /metrics (sql/procedures/170_metrics.sql). sftq.metrics is SECURITY DEFINER and reads
-- only counts: the API's login role calls it after the route checked the tick secret or
-- SFTQ_METRICS_TOKEN; the scheduler may read it too. The triggers that keep the counts are
-- SECURITY DEFINER as well (owned by sftq_definer, 090_security.sql), so neither role needs
-- rights on sftq.metric_counts or sftq.stream_instances.
GRANT EXECUTE ON FUNCTION sftq.metrics(timestamptz) TO sftq_api, sftq_scheduler;
GRANT EXECUTE ON FUNCTION
    sftq.metric_bounds(text),
    sftq.metric_bucket(text, float8)
TO sftq_api, sftq_scheduler;
