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

CREATE OR REPLACE FUNCTION sftq.record_usage_reading(
    p_usage_before  numeric,
    p_usage_after   numeric,
    p_usage_grace   interval DEFAULT interval '5 minutes',
    p_now           timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rise   numeric := p_usage_after - p_usage_before;
    v_jobs   integer;
    v_gpus   integer;
BEGIN
    -- Two quota readings of one tick, before its admission and after its creates. Between
    -- them the only change we know of is our own creates, so a rise in usage is our jobs
    -- being counted. It is credited to our uncounted recent jobs oldest first (a provider
    -- that counts jobs late counts the older ones first), whole jobs only, never more
    -- GPUs than the rise: so the GPUs still taken as uncounted never fall below the GPUs
    -- really uncounted. A fall, or no change, credits nothing (our jobs stay counted on top
    -- of usage until a later reading or the grace window).
    IF v_rise IS NULL OR v_rise <= 0 THEN
        RETURN jsonb_build_object('counted_jobs', 0, 'counted_gpus', 0);
    END IF;
    WITH pending AS (
        SELECT j.id, sum(j.gpu_count) OVER (ORDER BY j.submitted_at, j.id) AS running_total
          FROM sftq.jobs j
         WHERE j.state = 'PROGRESS' AND j.submitted_at IS NOT NULL
           AND j.usage_counted_at IS NULL AND j.submitted_at > p_now - p_usage_grace
    ), counted AS (
        UPDATE sftq.jobs j SET usage_counted_at = p_now
          FROM pending p
         WHERE j.id = p.id AND p.running_total <= v_rise
           AND j.state = 'PROGRESS' AND j.usage_counted_at IS NULL
        RETURNING j.gpu_count
    )
    SELECT count(*), COALESCE(sum(gpu_count), 0) INTO v_jobs, v_gpus FROM counted;
    RETURN jsonb_build_object('counted_jobs', v_jobs, 'counted_gpus', v_gpus);
END
$$;
COMMENT ON FUNCTION sftq.record_usage_reading(numeric, numeric, interval, timestamptz) IS
    'Marks our recent jobs that the provider''s usage now counts (usage_counted_at), from the rise between a reading taken before a tick''s creates and one taken after them: oldest first, whole jobs, at most the rise in GPUs. sftq.admission_budget stops adding those jobs on top of usage. Answers {counted_jobs, counted_gpus}. Locking contract: the job rows it marks (one UPDATE); no gate, since it only ever lowers a job''s contribution when the provider has shown it.';

CREATE OR REPLACE FUNCTION sftq.provider_health()
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The newest finished tick that learned how the provider takes our credentials.
    SELECT CASE WHEN (t.detail ->> 'provider_auth_failed')::boolean THEN 'provider_auth_failed'
                ELSE 'ok' END
      FROM sftq.scheduler_ticks t
     WHERE t.status IN ('ok', 'error')
       AND jsonb_typeof(t.detail -> 'provider_auth_failed') = 'boolean'
     ORDER BY t.started_at DESC
     LIMIT 1
$$;
COMMENT ON FUNCTION sftq.provider_health() IS
    'provider_auth_failed when the newest tick that talked to the provider found our credentials refused (401/403 on the account''s quota), ok when it found them accepted, NULL before any such tick. Reads only.';

-- sftq.provider_backoff_until: in 190_provider_budget.sql (the one hold every process shares).
