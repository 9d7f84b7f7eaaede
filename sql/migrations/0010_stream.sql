-- 0010: the live stream (GET /jobs/{id}/stream, GET /jobs/stream). See docs/api.md (Live
-- updates) and sql/procedures/140_stream.sql for how these are read.

-- The stream's order key. Identity ids are taken at INSERT, not at COMMIT, so a reader of
-- "id > cursor" can step over a row whose transaction commits after a higher id was seen.
-- Each row records the id of the transaction that wrote it; a poller reads only rows whose
-- transaction is older than its snapshot's xmin (all finished, none can appear later below
-- it) and orders by (txid, id). The default is metadata-only: rows written before this
-- migration read '0' (long committed), new rows get their writer's transaction id.
ALTER TABLE sftq.job_events ADD COLUMN txid xid8 NOT NULL DEFAULT '0';
ALTER TABLE sftq.job_events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();
CREATE INDEX job_events_stream_idx ON sftq.job_events (txid, id);
COMMENT ON COLUMN sftq.job_events.txid IS
    'The stream''s order key: the writing transaction''s id, raised to the job''s previous key when lower (sftq._stream_order), so that (txid, id) follows commit order within a job. 0 for rows older than the stream.';

-- Which users have an open stream on which server instance, through which key. A stream
-- server refreshes its rows while it holds streams; rows of a dead instance expire. It is
-- also the grant the poll reads: a poll returns frames only for the users an instance
-- registered with a valid key.
CREATE TABLE sftq.stream_watchers (
    instance    text NOT NULL CHECK (char_length(instance) BETWEEN 16 AND 64),
    key_id      bigint NOT NULL REFERENCES sftq.api_keys (id) ON DELETE CASCADE,
    user_id     bigint NOT NULL REFERENCES sftq.users (id),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (instance, key_id)
);
CREATE INDEX stream_watchers_user_idx ON sftq.stream_watchers (user_id, expires_at);
COMMENT ON TABLE sftq.stream_watchers IS
    'Stream servers (by random instance id) and the keys they hold open streams for. Expires unless refreshed; the tick writes queue frames only for users listed here.';

-- Queue frames (queue_position, waiting_reason, estimated_start_at of one queued job), kept
-- out of the job history: they change with every admission ahead of the job and are worth
-- keeping only long enough for a client to resume (a day). Ids come from the job_events
-- sequence, so one id names one frame whichever table holds it.
DO $$
BEGIN
    EXECUTE format(
        'CREATE TABLE sftq.stream_queue_events (
             id                  bigint PRIMARY KEY DEFAULT nextval(%L::regclass),
             txid                xid8 NOT NULL DEFAULT pg_current_xact_id(),
             job_id              uuid NOT NULL REFERENCES sftq.jobs (id) ON DELETE CASCADE,
             user_id             bigint NOT NULL,
             at                  timestamptz NOT NULL DEFAULT clock_timestamp(),
             queue_position      bigint,
             waiting_reason      jsonb,
             estimated_start_at  timestamptz
         )', pg_get_serial_sequence('sftq.job_events', 'id'));
END
$$;
CREATE INDEX stream_queue_events_stream_idx ON sftq.stream_queue_events (txid, id);
CREATE INDEX stream_queue_events_job_idx ON sftq.stream_queue_events (job_id, id);
CREATE INDEX stream_queue_events_at_idx ON sftq.stream_queue_events (at);
COMMENT ON TABLE sftq.stream_queue_events IS
    'Queue frames of the stream: a queued job''s position, waiting reason and estimated start when a tick changed one of them, for users with an open stream. Pruned after a day.';

-- The last queue values written per watched queued job, to write a frame only on change.
CREATE TABLE sftq.stream_queue_state (
    job_id              uuid PRIMARY KEY REFERENCES sftq.jobs (id) ON DELETE CASCADE,
    user_id             bigint NOT NULL,
    queue_position      bigint,
    waiting_reason      jsonb,
    estimated_start_at  timestamptz
);
COMMENT ON TABLE sftq.stream_queue_state IS
    'The queue values last written as a frame for each watched queued job (rows leave with the job or the watcher).';
