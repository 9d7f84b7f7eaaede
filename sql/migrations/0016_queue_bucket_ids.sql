-- 0016: each stretch of the queue keeps the ids of its QUEUED jobs in FIFO order, as of the
-- last seal, so a job's place inside its stretch is its index there instead of a count of
-- the jobs before it (an index range read per job). A delta now names the job that left or
-- joined, so that a read can tell whether it was before or after the job it places.
-- sql/procedures/062_queue_buckets.sql keeps both; docs/performance.md (queue analytics)
-- says why.

-- NULL: not known (a reader counts the stretch instead); the next seal that touches the
-- stretch fills it.
ALTER TABLE sftq.queue_buckets ADD COLUMN ids uuid[];
COMMENT ON COLUMN sftq.queue_buckets.ids IS
    'The stretch''s QUEUED jobs in FIFO order when its count was last folded (sftq.queue_seal), or NULL when not known; a job''s place in its stretch is its index here adjusted by the deltas since.';

-- NULL for a delta written before this migration: a reader then counts that stretch.
ALTER TABLE sftq.queue_bucket_deltas ADD COLUMN job_created_at timestamptz,
                                     ADD COLUMN job_id uuid;
COMMENT ON COLUMN sftq.queue_bucket_deltas.job_id IS
    'The job that left (-1) or joined (+1) the stretch; with job_created_at its FIFO key.';

-- Each stretch's jobs as they are now. A stretch with deltas written before this migration
-- (no job named) keeps its readers on the count until the next seal folds them.
-- Each stretch ends where the next starts (the last one at the seal): both bounds written as
-- row values, so that each stretch is one short range of jobs_queued_idx.
UPDATE sftq.queue_buckets b
   SET ids = COALESCE((SELECT array_agg(j.id ORDER BY j.created_at, j.id) FROM sftq.jobs j
                        WHERE j.state = 'QUEUED'
                          AND (j.created_at, j.id) >= (x.lo_created_at, x.lo_id)
                          AND (j.created_at, j.id) < (x.hi_created_at, x.hi_id)), '{}')
  FROM (SELECT y.lo_created_at, y.lo_id,
               COALESCE(lead(y.lo_created_at) OVER w, s.sealed_at) AS hi_created_at,
               COALESCE(lead(y.lo_id) OVER w, '00000000-0000-0000-0000-000000000000'::uuid) AS hi_id
          FROM sftq.queue_buckets y CROSS JOIN sftq.queue_seal s
        WINDOW w AS (ORDER BY y.lo_created_at, y.lo_id)) x
 WHERE b.lo_created_at = x.lo_created_at AND b.lo_id = x.lo_id;
