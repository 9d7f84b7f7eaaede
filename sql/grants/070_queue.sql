-- Privileges for the group commit of POST /jobs and the queue's stretch counts
-- (sql/procedures/030_enqueue.sql, 062_queue_buckets.sql). Re-applied after 010_roles.sql,
-- which revokes first.

GRANT EXECUTE ON FUNCTION
    sftq.api_submit_many(bytea[], text[], jsonb[], text[], integer[], text[], integer[], integer)
TO sftq_api;

-- The tick runs as itself: a job it moves out of the queue writes its stretch's delta, and
-- it seals the queue once per tick.
GRANT SELECT, UPDATE ON sftq.queue_seal TO sftq_scheduler;
GRANT SELECT, INSERT, UPDATE, DELETE ON sftq.queue_buckets, sftq.queue_bucket_deltas
    TO sftq_scheduler;
GRANT USAGE ON SEQUENCE sftq.queue_bucket_deltas_id_seq TO sftq_scheduler;
GRANT EXECUTE ON FUNCTION
    sftq._queue_left(timestamptz, uuid),
    sftq._event_many(uuid[], timestamptz[], text[], text, text, jsonb[]),
    sftq.queue_seal(timestamptz, integer)
TO sftq_scheduler;
