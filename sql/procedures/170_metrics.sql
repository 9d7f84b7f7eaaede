-- The figures of GET /functions/v1/jobs-api/metrics (issue 45): kept as counts by the paths
-- that change them (sftq.metric_counts, 0018_metrics.sql) and read in one call
-- (sftq.metrics). docs/operations.md (Metrics) lists the series and what each means.

CREATE OR REPLACE FUNCTION sftq.metric_bounds(p_histogram text)
RETURNS float8[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE p_histogram
        WHEN 'admission_wait_time_seconds' THEN
            ARRAY[1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400]::float8[]
        WHEN 'tick_duration_seconds' THEN
            ARRAY[0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]::float8[]
    END
$$;
COMMENT ON FUNCTION sftq.metric_bounds(text) IS
    'The upper bounds (le) of a histogram''s buckets, +Inf not included. Changing them leaves the counts already kept under the old bounds.';

CREATE OR REPLACE FUNCTION sftq.metric_bucket(p_histogram text, p_value float8)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT COALESCE((SELECT min(b)::text FROM unnest(sftq.metric_bounds(p_histogram)) b
                      WHERE p_value <= b), '+Inf')
$$;
COMMENT ON FUNCTION sftq.metric_bucket(text, float8) IS
    'The le label of the one bucket a value is counted in (the smallest bound at or above it, else +Inf); sftq.metrics sums buckets into Prometheus'' cumulative ones on read.';

-- ---------------------------------------------------------------------------------------
-- Keeping the counts
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq._metrics_jobs_inserted()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- One row per kind and statement: a group commit of a hundred enqueues appends one row.
    INSERT INTO sftq.metric_counts (name, labels, value)
    SELECT CASE n.state WHEN 'QUEUED' THEN 'pending_jobs' ELSE 'running_jobs' END,
           jsonb_build_object('kind', n.kind), count(*)
      FROM new_jobs n
     WHERE n.state IN ('QUEUED', 'PROGRESS')
     GROUP BY n.state, n.kind;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._metrics_jobs_inserted() IS
    'AFTER INSERT statement trigger on jobs: counts the new QUEUED (and PROGRESS) jobs per kind. Appends rows to sftq.metric_counts; takes no lock another writer waits for.';

DROP TRIGGER IF EXISTS jobs_metrics_inserted ON sftq.jobs;
CREATE TRIGGER jobs_metrics_inserted
    AFTER INSERT ON sftq.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION sftq._metrics_jobs_inserted();

CREATE OR REPLACE FUNCTION sftq._metrics_jobs_moved()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_kind  jsonb := jsonb_build_object('kind', NEW.kind);
    v_wait  float8 := extract(epoch FROM NEW.started_at - NEW.created_at)::float8;
BEGIN
    INSERT INTO sftq.metric_counts (name, labels, value)
    SELECT m.name, m.labels, m.value
      FROM (VALUES
        (OLD.state = 'QUEUED', 'pending_jobs', v_kind, -1::float8),
        (OLD.state = 'PROGRESS', 'running_jobs', v_kind, -1),
        (OLD.state = 'PROGRESS', 'running_gpus', '{}'::jsonb, -NEW.gpu_count),
        (NEW.state = 'PROGRESS', 'running_jobs', v_kind, 1),
        (NEW.state = 'PROGRESS', 'running_gpus', '{}', NEW.gpu_count),
        (NEW.state = 'PROGRESS', 'admitted_jobs_total', '{}', 1),
        (NEW.state = 'PROGRESS', 'admission_wait_time_seconds_bucket',
            jsonb_build_object('le', sftq.metric_bucket('admission_wait_time_seconds', v_wait)), 1),
        (NEW.state = 'PROGRESS', 'admission_wait_time_seconds_sum', '{}', v_wait),
        (NEW.state IN ('SUCCESS', 'FAIL', 'CANCELLED'), 'finished_jobs_total',
            jsonb_build_object('state', NEW.state, 'failure_class', COALESCE(NEW.failure_class, '')), 1)
      ) AS m (wanted, name, labels, value)
     WHERE m.wanted;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._metrics_jobs_moved() IS
    'AFTER UPDATE OF state row trigger on jobs (only when the state changes, i.e. in sftq._transition): moves the job between the pending/running gauges, and counts an admission (with its wait since enqueue in the histogram) or an end (by state and failure_class). Appends rows to sftq.metric_counts; takes no lock another writer waits for.';

DROP TRIGGER IF EXISTS jobs_metrics_moved ON sftq.jobs;
CREATE TRIGGER jobs_metrics_moved
    AFTER UPDATE OF state ON sftq.jobs
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION sftq._metrics_jobs_moved();

CREATE OR REPLACE FUNCTION sftq._metrics_jobs_deleted()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Nothing deletes jobs today; an operator's cleanup still leaves the gauges right.
    INSERT INTO sftq.metric_counts (name, labels, value)
    SELECT CASE o.state WHEN 'QUEUED' THEN 'pending_jobs' ELSE 'running_jobs' END,
           jsonb_build_object('kind', o.kind), -count(*)
      FROM old_jobs o
     WHERE o.state IN ('QUEUED', 'PROGRESS')
     GROUP BY o.state, o.kind
    UNION ALL
    SELECT 'running_gpus', '{}', -sum(o.gpu_count)
      FROM old_jobs o WHERE o.state = 'PROGRESS' HAVING count(*) > 0;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._metrics_jobs_deleted() IS
    'AFTER DELETE statement trigger on jobs: takes deleted QUEUED/PROGRESS jobs off the gauges. Appends rows to sftq.metric_counts.';

DROP TRIGGER IF EXISTS jobs_metrics_deleted ON sftq.jobs;
CREATE TRIGGER jobs_metrics_deleted
    AFTER DELETE ON sftq.jobs
    REFERENCING OLD TABLE AS old_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION sftq._metrics_jobs_deleted();

CREATE OR REPLACE FUNCTION sftq._metrics_webhook_attempts()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO sftq.metric_counts (name, labels, value)
    SELECT 'webhook_deliveries_total', jsonb_build_object('result', n.outcome), count(*)
      FROM new_attempts n GROUP BY n.outcome;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._metrics_webhook_attempts() IS
    'AFTER INSERT statement trigger on webhook_attempts: counts delivery attempts by outcome (succeeded, retrying, failed). Appends rows to sftq.metric_counts.';

DROP TRIGGER IF EXISTS webhook_attempts_metrics ON sftq.webhook_attempts;
CREATE TRIGGER webhook_attempts_metrics
    AFTER INSERT ON sftq.webhook_attempts
    REFERENCING NEW TABLE AS new_attempts
    FOR EACH STATEMENT EXECUTE FUNCTION sftq._metrics_webhook_attempts();

CREATE OR REPLACE FUNCTION sftq.metrics_fold()
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rows  integer;
BEGIN
    -- Rows appended by transactions still open are not seen, so not deleted: they count
    -- once they commit, exactly once.
    WITH gone AS (
        DELETE FROM sftq.metric_counts RETURNING name, labels, value
    ), folded AS (
        INSERT INTO sftq.metric_counts (name, labels, value)
        SELECT g.name, g.labels, sum(g.value) FROM gone g GROUP BY g.name, g.labels
        RETURNING 1
    )
    SELECT count(*) INTO v_rows FROM folded;
    RETURN v_rows;
END
$$;
COMMENT ON FUNCTION sftq.metrics_fold() IS
    'Sums the rows of each series of sftq.metric_counts into one, so that sftq.metrics reads about one row per series; answers how many series there are. Run at the end of every tick. Locking contract: deletes the committed rows it sees (a concurrent fold waits on them, then skips them); appenders never wait.';

CREATE OR REPLACE FUNCTION sftq._metrics_tick_finished()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_seconds  float8 := extract(epoch FROM NEW.finished_at - NEW.started_at)::float8;
BEGIN
    -- The tick's provider calls, as run_tick counted them: [{call, status, count}, ...]
    -- (the other sources' calls come through sftq.provider_budget_take).
    INSERT INTO sftq.metric_counts (name, labels, value)
    SELECT 'provider_requests_total',
           jsonb_build_object('source', 'tick', 'call', r ->> 'call', 'status', r ->> 'status'),
           (r ->> 'count')::float8
      FROM jsonb_array_elements(CASE WHEN jsonb_typeof(NEW.detail -> 'provider_requests') = 'array'
                                     THEN NEW.detail -> 'provider_requests' ELSE '[]' END) r
     WHERE r ->> 'call' IS NOT NULL AND (r ->> 'count') ~ '^[0-9]+$'
    UNION ALL
    SELECT 'tick_duration_seconds_bucket',
           jsonb_build_object('le', sftq.metric_bucket('tick_duration_seconds', v_seconds)), 1
    UNION ALL
    SELECT 'tick_duration_seconds_sum', '{}', v_seconds;
    PERFORM sftq.metrics_fold();
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._metrics_tick_finished() IS
    'AFTER UPDATE trigger on scheduler_ticks, when a tick records its end (sftq.tick_finish): counts its provider calls by call and status (source tick) and its duration, then folds the counts (sftq.metrics_fold).';

DROP TRIGGER IF EXISTS scheduler_ticks_metrics ON sftq.scheduler_ticks;
CREATE TRIGGER scheduler_ticks_metrics
    AFTER UPDATE OF status ON sftq.scheduler_ticks
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status IN ('ok', 'error')
                       AND NEW.finished_at IS NOT NULL)
    EXECUTE FUNCTION sftq._metrics_tick_finished();

CREATE OR REPLACE FUNCTION sftq.metrics_rebuild()
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rows  integer;
BEGIN
    -- The job figures start again from the rows as they are; the tick's figures (durations,
    -- provider calls) are history that the rows do not hold, so they stay.
    LOCK TABLE sftq.jobs IN SHARE MODE;
    DELETE FROM sftq.metric_counts
     WHERE name IN ('pending_jobs', 'running_jobs', 'running_gpus', 'admitted_jobs_total',
                    'finished_jobs_total', 'admission_wait_time_seconds_bucket',
                    'admission_wait_time_seconds_sum', 'webhook_deliveries_total');
    WITH kinds (kind) AS (VALUES ('SFT'), ('DPO'), ('RFT')),
    waits AS (
        SELECT extract(epoch FROM j.started_at - j.created_at)::float8 AS s
          FROM sftq.jobs j WHERE j.started_at IS NOT NULL
    ), rows AS (
        SELECT 'pending_jobs' AS name, jsonb_build_object('kind', k.kind) AS labels,
               count(j.id)::float8 AS value
          FROM kinds k LEFT JOIN sftq.jobs j ON j.kind = k.kind AND j.state = 'QUEUED'
         GROUP BY k.kind
        UNION ALL
        SELECT 'running_jobs', jsonb_build_object('kind', k.kind), count(j.id)
          FROM kinds k LEFT JOIN sftq.jobs j ON j.kind = k.kind AND j.state = 'PROGRESS'
         GROUP BY k.kind
        UNION ALL
        SELECT 'running_gpus', '{}', COALESCE(sum(j.gpu_count), 0)
          FROM sftq.jobs j WHERE j.state = 'PROGRESS'
        UNION ALL
        SELECT 'admitted_jobs_total', '{}', count(*) FROM waits
        UNION ALL
        SELECT 'finished_jobs_total',
               jsonb_build_object('state', j.state, 'failure_class', COALESCE(j.failure_class, '')),
               count(*)
          FROM sftq.jobs j
         WHERE j.state IN ('SUCCESS', 'FAIL', 'CANCELLED')
         GROUP BY j.state, j.failure_class
        UNION ALL
        SELECT 'admission_wait_time_seconds_bucket',
               jsonb_build_object('le', sftq.metric_bucket('admission_wait_time_seconds', w.s)),
               count(*)
          FROM waits w GROUP BY 2
        UNION ALL
        SELECT 'admission_wait_time_seconds_sum', '{}', COALESCE(sum(w.s), 0) FROM waits w
        UNION ALL
        SELECT 'webhook_deliveries_total', jsonb_build_object('result', a.outcome), count(*)
          FROM sftq.webhook_attempts a GROUP BY a.outcome
    )
    INSERT INTO sftq.metric_counts (name, labels, value)
    SELECT r.name, r.labels, r.value FROM rows r;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$$;
COMMENT ON FUNCTION sftq.metrics_rebuild() IS
    'Recounts the job figures of sftq.metric_counts (gauges, admitted and finished totals, the admission wait histogram) and the webhook attempts from the rows, for rows loaded without the triggers (a bulk load, a restore); the tick''s figures stay. Run once by this file when the counts are new. Locking contract: SHARE on jobs for its duration (writers of jobs wait), then rewrites those series'' rows. One pass over jobs.';

-- The first time (0018 just made the table): count what is there. The triggers above exist
-- from here on in this transaction, and the SHARE lock waits out any writer still running.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM sftq.metric_counts) THEN
        PERFORM sftq.metrics_rebuild();
    END IF;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Reading them
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.metrics(p_now timestamptz DEFAULT now())
RETURNS json
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH counts AS (
        SELECT c.name, c.labels, sum(c.value) AS value
          FROM sftq.metric_counts c GROUP BY c.name, c.labels
    ), q AS (
        -- The newest quota reading, as sftq.scheduler_status takes it.
        SELECT s.detail -> 'quota' AS quota,
               COALESCE((s.detail ->> 'usage_after')::numeric, s.quota_usage) AS usage,
               (s.detail ->> 'ours_total')::numeric AS ours_total,
               (s.detail ->> 'ours_recent')::numeric AS ours_recent
          FROM sftq.scheduler_ticks s
         WHERE s.quota_limit IS NOT NULL
         ORDER BY s.started_at DESC
         LIMIT 1
    ), ok AS (
        SELECT s.finished_at FROM sftq.scheduler_ticks s
         WHERE s.status = 'ok'
         ORDER BY s.started_at DESC
         LIMIT 1
    )
    SELECT json_build_object(
        'counts', COALESCE((SELECT json_agg(json_build_object('name', c.name, 'labels', c.labels,
                                                              'value', c.value)
                                            ORDER BY c.name, c.labels::text)
                              FROM counts c), '[]'),
        'bounds', json_build_object(
            'admission_wait_time_seconds', sftq.metric_bounds('admission_wait_time_seconds'),
            'tick_duration_seconds', sftq.metric_bounds('tick_duration_seconds')),
        'gpu_quota', (SELECT json_build_object(
                          'enforced', (q.quota ->> 'value')::numeric,
                          'max', (q.quota ->> 'max_value')::numeric) FROM q),
        -- Usage counts our jobs it has seen (ours_total - ours_recent GPUs at that reading);
        -- the rest of it is held by someone else on the account.
        'gpu_external', (SELECT GREATEST(q.usage - COALESCE(q.ours_total - q.ours_recent, 0), 0)
                           FROM q),
        'tick_last_success', (SELECT extract(epoch FROM ok.finished_at)::float8 FROM ok),
        'stream_connections', (SELECT COALESCE(sum(i.open_streams), 0) FROM sftq.stream_instances i
                                WHERE i.expires_at > p_now),
        -- Running jobs whose provider progress stopped moving (205_run_limits.sql).
        -- (sftq.stalled_jobs written out: 205 is applied after this file.)
        'stalled_jobs', (SELECT count(*) FROM sftq.jobs j
                          WHERE j.state = 'PROGRESS' AND j.stalled_at IS NOT NULL
                            AND GREATEST(j.submitted_at, j.provider_state_at, j.progress_moved_at)
                                <= j.stalled_at))
$$;
COMMENT ON FUNCTION sftq.metrics(timestamptz) IS
    'Everything GET /metrics serves, as JSON: counts (every series of sftq.metric_counts summed: gauges pending_jobs/running_jobs by kind and running_gpus, counters, per-bucket histogram counts and sums), bounds (each histogram''s bucket bounds), gpu_quota {enforced, max} and gpu_external from the newest quota reading, tick_last_success (epoch seconds of the newest ok tick''s end), stream_connections (open streams of live instances). Cost: the folded counts (about one row per series plus what changed since the last tick), two index probes on scheduler_ticks and the live stream instances; no scan of jobs. Reads only, takes no locks.';
