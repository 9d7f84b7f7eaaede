-- 0014: counts of QUEUED jobs by stretch of the queue, so that a job's place in it
-- (queue_position) is read from a few hundred counts instead of counting every job ahead.
-- sql/procedures/062_queue_buckets.sql keeps them; docs/performance.md (queue analytics)
-- says why.

-- The sealed part of the queue (jobs created before queue_seal.sealed_at) is cut into
-- stretches of about 64 jobs in FIFO order. A stretch starts at its first job's
-- (created_at, id) and ends where the next one starts (the last one at sealed_at); queued is
-- how many of its jobs were QUEUED when the counts were last folded.
CREATE TABLE sftq.queue_buckets (
    lo_created_at  timestamptz NOT NULL,
    lo_id          uuid NOT NULL,
    queued         integer NOT NULL CHECK (queued >= 0),
    -- The stretches before this one, summed at the last seal (a read adds the deltas since).
    before         bigint NOT NULL DEFAULT 0 CHECK (before >= 0),
    PRIMARY KEY (lo_created_at, lo_id)
);
COMMENT ON TABLE sftq.queue_buckets IS
    'How many jobs are QUEUED in each stretch of the sealed part of the queue (sftq.queue_seal): a stretch runs from (lo_created_at, lo_id) to the next stretch''s start. Kept by sftq.queue_seal and the deltas in sftq.queue_bucket_deltas; read by sftq.queue_ahead.';

-- A job that leaves the queue from a sealed stretch (admitted, cancelled, timed out) writes
-- -1 here in its own transaction; the next seal folds the deltas into the counts. Appending
-- rows rather than updating a count means a transition never waits for another one.
CREATE TABLE sftq.queue_bucket_deltas (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lo_created_at  timestamptz NOT NULL,
    lo_id          uuid NOT NULL,
    delta          integer NOT NULL
);
CREATE INDEX queue_bucket_deltas_lo_idx ON sftq.queue_bucket_deltas (lo_created_at, lo_id);
COMMENT ON TABLE sftq.queue_bucket_deltas IS
    'Changes to sftq.queue_buckets counts not folded in yet: -1 for a job that left the queue from a sealed stretch (+1 for a job enqueued there with a clock in the past). Folded by sftq.queue_seal.';

CREATE TABLE sftq.queue_seal (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    sealed_at  timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO sftq.queue_seal DEFAULT VALUES;
COMMENT ON TABLE sftq.queue_seal IS
    'One row: QUEUED jobs created before sealed_at are counted in sftq.queue_buckets; later ones are counted one by one when asked.';

-- Row-level security and the roles' rights come from sql/grants (090_security.sql covers
-- every table of sftq).
