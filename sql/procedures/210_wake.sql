-- Event-driven admission (issue 53, item 1): the wake flag (sftq.admission_wake, migration
-- 0024), who sets it, and what the tick and the ticker read.
--
-- Set: by sftq.request_admission_wake, which the triggers below call at the commit of every
-- transaction that adds a QUEUED job, asks to cancel a running job, or ends a job; anything
-- else that makes a waiting job admissible (a dependency met, a cap raised) calls it too.
-- The flag is one row, written only when it goes from clear to set: a group commit of 64
-- submits writes it once, and while it is set, later transactions only read it.
--
-- Taken: by the tick (sftq.admission_wake_take) just before it admits, so everything that
-- committed before that moment is seen by that admission; an event that commits after it
-- sets the flag again, and the tick's end re-pokes (trigger on the lease), so no wake is
-- lost when it lands during a tick.
--
-- Every function here is SECURITY DEFINER (owned by sftq_definer, sql/grants/090): the
-- triggers fire as whichever role writes jobs, and that role needs no right on the flag.

CREATE OR REPLACE FUNCTION sftq.request_admission_wake(p_reason text DEFAULT 'event')
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- plpgsql, not sql: its plan is cached for the session, where a sql function's body
    -- would be planned again on every call (some 100 us, on a hot path).
    UPDATE sftq.admission_wake
       SET requested_at = clock_timestamp(), requested_by = left(COALESCE(p_reason, 'event'), 64),
           requests = requests + 1, pokes = pokes + 1
     WHERE id AND requested_at IS NULL;
    RETURN CASE WHEN FOUND THEN true END;
END
$$;
COMMENT ON FUNCTION sftq.request_admission_wake(text) IS
    'Asks for admission to run soon (within about a second where a waker runs): sets the wake flag when it is clear and answers true; answers NULL when a wake is already pending (nothing written). Call it in the transaction that made a waiting job admissible or freed room, so the wake is never seen before that change commits. Locking contract: the wake row, only when the flag is clear, until commit; call it last in the transaction.';

CREATE OR REPLACE FUNCTION sftq._jobs_wake()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Pending already (the common case under load): a read, and nothing to write.
    IF NOT EXISTS (SELECT 1 FROM sftq.admission_wake WHERE id AND requested_at IS NULL) THEN
        RETURN NULL;
    END IF;
    -- sftq.request_admission_wake's statement, inline: one function call less per commit.
    UPDATE sftq.admission_wake
       SET requested_at = clock_timestamp(),
           requested_by = CASE WHEN TG_OP = 'INSERT' THEN 'submit'
                               WHEN NEW.state IN ('SUCCESS', 'FAIL', 'CANCELLED') THEN 'ended'
                               ELSE 'cancel' END,
           requests = requests + 1, pokes = pokes + 1
     WHERE id AND requested_at IS NULL;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._jobs_wake() IS
    'Deferred (at commit) trigger on sftq.jobs: a QUEUED job added, a cancel asked of a running job, a job ended -> the wake flag set if clear (sftq.request_admission_wake''s statement). At commit, so the wake row is locked for the commit alone and never before a lock the transaction takes later; once per transaction (the triggers'' WHEN queues only the first event).';

-- Constraint triggers cannot be replaced in place: dropped and made again on each apply.
-- Their WHEN is evaluated as each row is written, and its set_config marks the transaction:
-- only its first matching row queues an event, so a group commit of 64 submits runs the
-- function once at commit, not 64 times. (A savepoint rolled back takes both the mark and
-- the event with it.)
DROP TRIGGER IF EXISTS jobs_wake_insert ON sftq.jobs;
CREATE CONSTRAINT TRIGGER jobs_wake_insert
    AFTER INSERT ON sftq.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (
        NEW.state = 'QUEUED'
        AND current_setting('sftq.wake_queued', true) IS DISTINCT FROM 'on'
        AND set_config('sftq.wake_queued', 'on', true) = 'on')
    EXECUTE FUNCTION sftq._jobs_wake();
DROP TRIGGER IF EXISTS jobs_wake_update ON sftq.jobs;
CREATE CONSTRAINT TRIGGER jobs_wake_update
    AFTER UPDATE OF state, cancel_requested_at ON sftq.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (
        ((NEW.state IS DISTINCT FROM OLD.state AND NEW.state IN ('SUCCESS', 'FAIL', 'CANCELLED'))
         OR (OLD.cancel_requested_at IS NULL AND NEW.cancel_requested_at IS NOT NULL))
        AND current_setting('sftq.wake_queued', true) IS DISTINCT FROM 'on'
        AND set_config('sftq.wake_queued', 'on', true) = 'on')
    EXECUTE FUNCTION sftq._jobs_wake();

CREATE OR REPLACE FUNCTION sftq._lease_released_wake()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A wake that arrived during the tick found the lease taken: poke again now that it is free.
    UPDATE sftq.admission_wake SET pokes = pokes + 1 WHERE id AND requested_at IS NOT NULL;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._lease_released_wake() IS
    'Trigger on sftq.scheduler_lease: when a tick releases the lease with a wake pending (it came after the tick took the last one), bumps pokes so the Supabase poke fires the next tick. Locking contract: the lease row (the caller''s), then the wake row.';
CREATE OR REPLACE TRIGGER scheduler_lease_wake
    AFTER UPDATE OF tick_id ON sftq.scheduler_lease
    FOR EACH ROW WHEN (OLD.tick_id IS NOT NULL AND NEW.tick_id IS NULL)
    EXECUTE FUNCTION sftq._lease_released_wake();

CREATE OR REPLACE FUNCTION sftq.admission_wake_take()
RETURNS jsonb
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH old AS (
        SELECT requested_at, requested_by FROM sftq.admission_wake WHERE id FOR UPDATE
    ), taken AS (
        UPDATE sftq.admission_wake w
           SET requested_at = NULL, requested_by = NULL, taken_at = clock_timestamp()
          FROM old
         WHERE w.id AND old.requested_at IS NOT NULL
        RETURNING old.requested_at, old.requested_by, w.taken_at
    )
    SELECT COALESCE((SELECT jsonb_build_object(
                         'requested_at', t.requested_at, 'requested_by', t.requested_by,
                         'waited_ms', round(extract(epoch FROM t.taken_at - t.requested_at) * 1000))
                       FROM taken t), '{}'::jsonb)
$$;
COMMENT ON FUNCTION sftq.admission_wake_take() IS
    'The tick, just before it admits: clears a pending wake and answers {requested_at, requested_by, waited_ms} ({} when none was pending). What committed before this call is seen by the admission that follows; what commits after sets the flag again. Locking contract: the wake row (waits at most for an event transaction''s commit).';

CREATE OR REPLACE FUNCTION sftq.admission_wake_state()
RETURNS TABLE (wake_age_seconds double precision, last_tick_age_seconds double precision,
               lease_free boolean, has_running boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (SELECT extract(epoch FROM clock_timestamp() - w.requested_at)::double precision
              FROM sftq.admission_wake w WHERE w.id),
           (SELECT extract(epoch FROM clock_timestamp() - t.started_at)::double precision
              FROM sftq.scheduler_ticks t ORDER BY t.started_at DESC LIMIT 1),
           (SELECT l.expires_at IS NULL OR l.expires_at <= clock_timestamp()
              FROM sftq.scheduler_lease l WHERE l.name = 'tick'),
           EXISTS (SELECT 1 FROM sftq.jobs j
                    WHERE j.state = 'PROGRESS' AND j.submitted_at IS NOT NULL)
$$;
COMMENT ON FUNCTION sftq.admission_wake_state() IS
    'What a waker polls (sftq ticker, every ~250 ms; scheduler-tick before a woken tick), as ages on the database''s clock: how long a wake has been pending (NULL: none), since the last tick started (NULL: no tick yet), whether the lease is free, and whether any running job is submitted at the provider (a reconcile pass is only worth making then). Reads only; no locks.';
