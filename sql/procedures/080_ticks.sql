-- The tick lease and the tick record.

CREATE OR REPLACE FUNCTION sftq.tick_begin(
    p_holder  text,
    p_ttl     interval DEFAULT interval '2 minutes',
    p_now     timestamptz DEFAULT clock_timestamp())
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_old_tick  bigint;
    v_tick      bigint;
BEGIN
    SELECT tick_id INTO v_old_tick FROM sftq.scheduler_lease
     WHERE name = 'tick' AND (expires_at IS NULL OR expires_at <= p_now)
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;  -- another tick holds the lease (or is taking it right now)
    END IF;
    -- A lease that expired while held belonged to a tick that died mid-way.
    UPDATE sftq.scheduler_ticks SET status = 'abandoned', finished_at = p_now
     WHERE id = v_old_tick AND status = 'running';
    INSERT INTO sftq.scheduler_ticks (started_at, holder) VALUES (p_now, p_holder) RETURNING id INTO v_tick;
    UPDATE sftq.scheduler_lease SET holder = p_holder, tick_id = v_tick, expires_at = p_now + p_ttl
     WHERE name = 'tick';
    RETURN v_tick;
END
$$;
COMMENT ON FUNCTION sftq.tick_begin(text, interval, timestamptz) IS
    'Takes the tick lease if it is free or expired and opens a tick row; NULL when another tick holds it. Locking contract: the lease row, SKIP LOCKED so a concurrent tick answers at once instead of queueing.';

CREATE OR REPLACE FUNCTION sftq.tick_renew(p_tick_id bigint, p_ttl interval DEFAULT interval '2 minutes')
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE sftq.scheduler_lease SET expires_at = clock_timestamp() + p_ttl
     WHERE name = 'tick' AND tick_id = p_tick_id AND expires_at > clock_timestamp()
    RETURNING true
$$;
COMMENT ON FUNCTION sftq.tick_renew(bigint, interval) IS 'Extends the lease of a live tick; NULL when it was lost.';

CREATE OR REPLACE FUNCTION sftq.tick_finish(p_tick_id bigint, p_result jsonb, p_now timestamptz DEFAULT clock_timestamp())
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The lease row before the tick row, as tick_begin takes them (see the comment below).
    UPDATE sftq.scheduler_lease SET holder = NULL, tick_id = NULL, expires_at = NULL
     WHERE name = 'tick' AND tick_id = p_tick_id;
    UPDATE sftq.scheduler_ticks
       SET finished_at = p_now,
           status      = CASE WHEN jsonb_array_length(COALESCE(p_result -> 'errors', '[]')) > 0 THEN 'error' ELSE 'ok' END,
           quota_limit = (p_result ->> 'quota_limit')::int,
           quota_usage = (p_result ->> 'quota_usage')::numeric,
           budget      = (p_result ->> 'budget')::int,
           admitted    = COALESCE((p_result ->> 'admitted')::int, 0),
           submitted   = COALESCE((p_result ->> 'submitted')::int, 0),
           reconciled  = COALESCE((p_result ->> 'reconciled')::int, 0),
           cancelled   = COALESCE((p_result ->> 'cancelled')::int, 0),
           failed      = COALESCE((p_result ->> 'failed')::int, 0),
           errors      = COALESCE(p_result -> 'errors', '[]'),
           detail      = p_result
     WHERE id = p_tick_id;
END
$$;
COMMENT ON FUNCTION sftq.tick_finish(bigint, jsonb, timestamptz) IS
    'Records what a tick saw and did, and releases the lease if this tick still holds it. Locking contract: the lease row first, then this tick''s row: the order sftq.tick_begin takes them in (lease, then the abandoned tick''s row), so a finishing tick and a tick taking over its expired lease never deadlock.';
