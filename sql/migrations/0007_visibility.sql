-- 0007: what the visibility features read (waiting reasons, estimates, capacity, job history).
--
-- The provider-progress columns belong to the tick's migration (0005); they are added here
-- with IF NOT EXISTS and exactly the same names and types, so this file applies whichever of
-- the two lands first. Only the tick writes them.

ALTER TABLE sftq.jobs ADD COLUMN IF NOT EXISTS progress_percent numeric;
ALTER TABLE sftq.jobs ADD COLUMN IF NOT EXISTS progress_epoch integer;
ALTER TABLE sftq.jobs ADD COLUMN IF NOT EXISTS estimated_cost jsonb;

-- "Similar gpu_count" for run-time estimates: powers of two, so 3 and 4 GPUs share a class
-- and 4 and 8 do not. The index below is built on it: never change this function without
-- rebuilding jobs_success_runs_idx in the same migration.
CREATE FUNCTION sftq.gpu_class(p_gpu_count integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_gpu_count <= 1 THEN 1 WHEN p_gpu_count <= 2 THEN 2
                WHEN p_gpu_count <= 4 THEN 4 WHEN p_gpu_count <= 8 THEN 8
                WHEN p_gpu_count <= 16 THEN 16 WHEN p_gpu_count <= 32 THEN 32 ELSE 64 END
$$;
COMMENT ON FUNCTION sftq.gpu_class(integer) IS
    'The GPU-count class used to find similar jobs: the smallest power of two >= gpu_count (1, 2, 4, 8, 16, 32, 64; gpu_count is at most 64). Immutable: jobs_success_runs_idx is built on it.';

-- The newest successful runs of one kind and GPU class, for the median run time that
-- estimates use: a short index range scan instead of a pass over 30 days of history.
-- Partial on SUCCESS, so enqueue and the other transitions never touch it.
CREATE INDEX jobs_success_runs_idx
    ON sftq.jobs (kind, sftq.gpu_class(gpu_count), completed_at DESC)
    INCLUDE (started_at)
    WHERE state = 'SUCCESS';

-- The GPU quota as last read: the newest tick that read one, even when later ticks could not.
CREATE INDEX scheduler_ticks_quota_idx ON sftq.scheduler_ticks (started_at DESC)
    WHERE quota_limit IS NOT NULL;
