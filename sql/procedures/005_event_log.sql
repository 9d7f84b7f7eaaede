-- The job event log: the one writer of sftq.job_events.

CREATE OR REPLACE FUNCTION sftq._event(
    p_job_id  uuid,
    p_at      timestamptz,
    p_actor   text,
    p_event   text,
    p_state   text,
    p_detail  jsonb DEFAULT NULL,
    p_from    text DEFAULT NULL,
    p_to      text DEFAULT NULL)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO sftq.job_events (job_id, at, actor, event, from_state, to_state, state, detail)
    VALUES (p_job_id, p_at, p_actor, p_event, p_from, p_to, p_state, p_detail)
$$;
COMMENT ON FUNCTION sftq._event(uuid, timestamptz, text, text, text, jsonb, text, text) IS
    'Appends one row to a job''s history, in the caller''s transaction: p_state is the job''s state right after the event; p_from/p_to are set only by transitions. Every procedure that writes history calls this, so the log has one shape. Locks nothing beyond the new row.';
