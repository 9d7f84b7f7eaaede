-- The job event log: the one writer of sftq.job_events.

-- PL/pgSQL, not SQL: a SQL function that cannot be inlined (it sets search_path) is parsed
-- and planned again at every call, while PL/pgSQL keeps the INSERT's plan for the session.
-- Every transition writes an event, so this is on every hot path.
--
-- enable_seqscan = off: an event row's foreign key is checked with a lookup of its job by id
-- (PostgreSQL's own query, planned once per session and kept), and so is the webhook
-- outbox trigger's read of the job's owner. A session that plans them while sftq.jobs is a
-- page or two (a new deployment, a fresh database) keeps a sequential scan, which then
-- reads the whole table for every event until the next ANALYZE replans it: measured, a
-- burst of 15,000 enqueues into a new database spent most of its database time there
-- (75 million rows read). Turned off here, those plans are index lookups whatever the
-- table's size when they are made; nothing in these functions wants a sequential scan.
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
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
BEGIN
    INSERT INTO sftq.job_events (job_id, at, actor, event, from_state, to_state, state, detail)
    VALUES (p_job_id, p_at, p_actor, p_event, p_from, p_to, p_state, p_detail);
END
$$;
COMMENT ON FUNCTION sftq._event(uuid, timestamptz, text, text, text, jsonb, text, text) IS
    'Appends one row to a job''s history, in the caller''s transaction: p_state is the job''s state right after the event; p_from/p_to are set only by transitions. Every procedure that writes history calls this (or sftq._event_many for several jobs at once), so the log has one shape. Locks nothing beyond the new row.';

CREATE OR REPLACE FUNCTION sftq._event_many(
    p_job_ids  uuid[],
    p_at       timestamptz[],
    p_actors   text[],
    p_event    text,
    p_state    text,
    p_details  jsonb[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
BEGIN
    -- One statement for the whole set: the table's per-statement work (its constraints and
    -- triggers set up, its indexes opened) is paid once, not once per job. Rows go in the
    -- order given, so their ids follow it.
    INSERT INTO sftq.job_events (job_id, at, actor, event, state, detail)
    SELECT e.job_id, e.at, e.actor, p_event, p_state, e.detail
      FROM unnest(p_job_ids, p_at, p_actors,
                  COALESCE(p_details, array_fill(NULL::jsonb, ARRAY[cardinality(p_job_ids)])))
           WITH ORDINALITY AS e(job_id, at, actor, detail, ord)
     ORDER BY e.ord;
END
$$;
COMMENT ON FUNCTION sftq._event_many(uuid[], timestamptz[], text[], text, text, jsonb[]) IS
    'sftq._event for several jobs at once, all with the same event and state (not a transition: from/to stay null): one row per element of p_job_ids, with its own time, actor and detail, inserted in the order given. Locks nothing beyond the new rows.';
