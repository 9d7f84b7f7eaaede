-- The rollup behind sftq.analyst_daily (tables: migration 0012). The design:
--
-- What it holds. sftq.daily_rollup has jobs and GPU hours per (UTC day, kind, state) for every
-- UTC day before rolled_through; sftq.daily_rollup_hours the same per UTC hour. A job of such
-- a day that changes state afterwards logs the move in sftq.daily_rollup_moves (one row, from
-- sftq._transition); the end of each tick folds the moves in and deletes them. A reader adds
-- the moves not folded yet to the rollup, and counts the jobs from rolled_through on (today)
-- one by one: exact at every moment, and a tick's work is one row per state change, not a
-- pass over a day of jobs. A UTC day is rolled up in the tick after the one that saw it end.
--
-- Why it stays exact. A job's state changes only in sftq._transition, whose callers all hold
-- the admission gate (sftq._gate, shared or exclusive); jobs are created only by enqueue,
-- which holds it too and takes created_at from the clock after taking it. moves_before moves
-- on only under the exclusive gate (sftq._daily_rollup_gate), so it cannot change while a
-- transition or an enqueue runs: a transition of a job created before it always logs, and no
-- enqueue can create a job before it any more. The rows of a UTC day before moves_before thus
-- change only through logged moves. Rolling such a day up deletes its moves and counts its
-- jobs in one statement (one snapshot): the moves deleted are exactly those the count saw.
-- Folding moves in deletes the moves it adds, in one statement too. Moves committed later
-- stay for the next tick; a reader's snapshot sees either the rollup before a fold together
-- with the moves the fold deleted, or the rollup after it without them. (All of this reads
-- with READ COMMITTED, as every procedure here does.)
--
-- Time zones. analyst_daily's day is a day of the session's time zone, as before the rollup.
-- A UTC day that is exactly one day of that zone (every day, in UTC) is read from
-- daily_rollup; any other day from its hours, each hour to the day it lies in; an hour in
-- which the zone's day begins (zones 30 or 45 minutes off a whole hour) is counted from its
-- jobs. So the answers are the same in every time zone, fastest in UTC.
--
-- One assumption: jobs are created by sftq.enqueue_many with the clock's time. A job inserted
-- with a created_at before moves_before (a test's p_now in the past, or a bulk load such as
-- bench/dataset.py) is not in the rollup until sftq.daily_rollup_rebuild() counts again.

CREATE OR REPLACE FUNCTION sftq._daily_rollup_gate()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
BEGIN
    PERFORM sftq._gate(true);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;  -- enqueues or transitions kept it busy: the next tick tries again
END
$$;
COMMENT ON FUNCTION sftq._daily_rollup_gate() IS
    'Takes the admission gate exclusively for the rest of the transaction, waiting at most 100 ms; false when it could not. Locking contract: the gate only. A tick calls it after it has locked its own rows; no holder of the shared gate waits for those, and the short wait gives up long before a deadlock check would run.';

CREATE OR REPLACE FUNCTION sftq._daily_rollup_days(p_from timestamptz, p_upto timestamptz)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    -- One statement, one snapshot: the moves deleted are those whose changes the count sees.
    WITH gone AS (
        DELETE FROM sftq.daily_rollup_moves m WHERE m.hour >= p_from AND m.hour < p_upto
    ), h AS (
        SELECT date_trunc('hour', j.created_at, 'UTC') AS hour, j.kind, j.state, count(*) AS jobs,
               sum(j.gpu_count * extract(epoch FROM j.completed_at - j.started_at) / 3600)
                   AS gpu_hours
          FROM sftq.jobs j
         WHERE j.created_at >= p_from AND j.created_at < p_upto
         GROUP BY 1, 2, 3
    ), hours AS (
        INSERT INTO sftq.daily_rollup_hours (day, hour, kind, state, jobs, gpu_hours)
        SELECT date_trunc('day', h.hour, 'UTC'), h.hour, h.kind, h.state, h.jobs, h.gpu_hours
          FROM h ORDER BY 1, 2, 3, 4
    )
    INSERT INTO sftq.daily_rollup (day, kind, state, jobs, gpu_hours)
    SELECT date_trunc('day', h.hour, 'UTC'), h.kind, h.state, sum(h.jobs), sum(h.gpu_hours)
      FROM h GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
$$;
COMMENT ON FUNCTION sftq._daily_rollup_days(timestamptz, timestamptz) IS
    'Counts the jobs created in [p_from, p_upto) (whole UTC days, none of them rolled up yet) into sftq.daily_rollup and sftq.daily_rollup_hours and deletes their logged moves, in one statement. Locking contract: the rollup rows it writes and the moves it deletes; callers hold the daily_rollup_state row.';

CREATE OR REPLACE FUNCTION sftq.daily_rollup_refresh(
    p_now       timestamptz DEFAULT clock_timestamp(),
    p_max_days  integer DEFAULT 7)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state    sftq.daily_rollup_state;
    v_today    timestamptz := date_trunc('day', least(p_now, clock_timestamp()), 'UTC');
    v_moves    integer := 0;
    v_days     timestamptz[];
    v_from     timestamptz;
    v_upto     timestamptz;
    v_rolled   integer := 0;
    v_gate     boolean := NULL;
BEGIN
    -- Most ticks: nothing moved, no day ended. Answer without writing anything.
    SELECT * INTO v_state FROM sftq.daily_rollup_state;
    IF v_state.rolled_through = v_state.moves_before AND v_state.moves_before >= v_today
       AND NOT EXISTS (SELECT 1 FROM sftq.daily_rollup_moves) THEN
        RETURN jsonb_build_object('moves', 0, 'rolled_days', 0);
    END IF;
    -- One refresh at a time (a tick whose lease ran out may finish beside the next one).
    SELECT * INTO v_state FROM sftq.daily_rollup_state FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('skipped', 'another refresh is running');
    END IF;

    -- 1. Fold the moves of rolled-up days in: each leaves its old group and joins its new
    -- one (a job leaves QUEUED or PROGRESS, where it had no GPU hours).
    WITH m AS (
        DELETE FROM sftq.daily_rollup_moves m WHERE m.hour < v_state.rolled_through
        RETURNING m.hour, m.kind, m.from_state, m.to_state, m.gpu_hours
    ), delta AS (
        SELECT date_trunc('day', d.hour, 'UTC') AS day, d.hour, d.kind, d.state,
               sum(d.jobs) AS jobs, sum(d.gpu_hours) AS gpu_hours
          FROM (SELECT m.hour, m.kind, m.from_state AS state, -1 AS jobs, NULL::numeric AS gpu_hours
                  FROM m
                UNION ALL
                SELECT m.hour, m.kind, m.to_state, 1, m.gpu_hours FROM m) d
         GROUP BY d.hour, d.kind, d.state
    ), hours AS (
        INSERT INTO sftq.daily_rollup_hours AS r (day, hour, kind, state, jobs, gpu_hours)
        SELECT delta.day, delta.hour, delta.kind, delta.state, delta.jobs, delta.gpu_hours
          FROM delta
        ON CONFLICT (day, hour, kind, state) DO UPDATE
           SET jobs = r.jobs + EXCLUDED.jobs,
               gpu_hours = CASE WHEN r.gpu_hours IS NULL THEN EXCLUDED.gpu_hours
                                WHEN EXCLUDED.gpu_hours IS NULL THEN r.gpu_hours
                                ELSE r.gpu_hours + EXCLUDED.gpu_hours END
    ), days AS (
        INSERT INTO sftq.daily_rollup AS r (day, kind, state, jobs, gpu_hours)
        SELECT delta.day, delta.kind, delta.state, sum(delta.jobs), sum(delta.gpu_hours)
          FROM delta
         GROUP BY delta.day, delta.kind, delta.state
        ON CONFLICT (day, kind, state) DO UPDATE
           SET jobs = r.jobs + EXCLUDED.jobs,
               gpu_hours = CASE WHEN r.gpu_hours IS NULL THEN EXCLUDED.gpu_hours
                                WHEN EXCLUDED.gpu_hours IS NULL THEN r.gpu_hours
                                ELSE r.gpu_hours + EXCLUDED.gpu_hours END
        RETURNING r.day
    )
    SELECT (SELECT count(*) FROM m), (SELECT array_agg(DISTINCT days.day) FROM days)
      INTO v_moves, v_days;
    IF v_days IS NOT NULL THEN
        -- A group whose jobs all moved on is no group any more (the view never shows it).
        DELETE FROM sftq.daily_rollup r WHERE r.day = ANY (v_days) AND r.jobs = 0;
        DELETE FROM sftq.daily_rollup_hours r WHERE r.day = ANY (v_days) AND r.jobs = 0;
    END IF;

    LOOP
        -- 2. Roll up the days that ended before moves_before (a few a tick when catching up).
        IF v_state.rolled_through < v_state.moves_before THEN
            v_from := v_state.rolled_through;
            IF v_from = '-infinity' THEN
                SELECT date_trunc('day', min(j.created_at), 'UTC') INTO v_from
                  FROM sftq.jobs j WHERE j.created_at < v_state.moves_before;
                v_from := COALESCE(v_from, v_state.moves_before);
            END IF;
            v_upto := CASE WHEN p_max_days IS NULL THEN v_state.moves_before
                           ELSE least(v_state.moves_before,
                                      v_from + p_max_days * interval '24 hours') END;
            IF v_upto > v_from THEN
                PERFORM sftq._daily_rollup_days(v_state.rolled_through, v_upto);
                v_rolled := v_rolled + extract(day FROM v_upto - v_from)::integer;
            END IF;
            UPDATE sftq.daily_rollup_state
               SET rolled_from = COALESCE(rolled_from, v_from), rolled_through = v_upto
            RETURNING * INTO v_state;
        END IF;

        -- 3. A UTC day ended: from now on its jobs log their moves. The gate makes every
        -- enqueue and transition either finish before or see the new value.
        EXIT WHEN v_state.moves_before >= v_today OR v_gate IS NOT NULL;
        v_gate := sftq._daily_rollup_gate();
        EXIT WHEN NOT v_gate;
        UPDATE sftq.daily_rollup_state SET moves_before = v_today RETURNING * INTO v_state;
        -- Holding the gate, the new day can be rolled up at once; a tick leaves it to the
        -- next one instead of keeping enqueues waiting meanwhile.
        EXIT WHEN p_max_days IS NOT NULL;
    END LOOP;

    RETURN jsonb_build_object('moves', v_moves, 'rolled_days', v_rolled,
                              'moves_before', v_state.moves_before,
                              'rolled_through', v_state.rolled_through)
           || CASE WHEN v_gate IS FALSE THEN jsonb_build_object('gate', 'busy') ELSE '{}' END;
END
$$;
COMMENT ON FUNCTION sftq.daily_rollup_refresh(timestamptz, integer) IS
    'Keeps sftq.daily_rollup and sftq.daily_rollup_hours current (run at the end of every tick): folds the logged moves in, rolls up at most p_max_days UTC days that are over (NULL: all of them, moving moves_before to today first), and once a UTC day has ended moves moves_before on. Answers {moves, rolled_days, moves_before, rolled_through}. Locking contract: the daily_rollup_state row FOR UPDATE SKIP LOCKED (a second refresh answers at once), the rollup rows, and when a UTC day has ended the admission gate exclusively, waiting at most 100 ms (sftq._daily_rollup_gate). Never locks a job.';

CREATE OR REPLACE FUNCTION sftq.daily_rollup_rebuild(p_now timestamptz DEFAULT clock_timestamp())
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state  sftq.daily_rollup_state;
BEGIN
    PERFORM sftq._gate(true);
    SELECT * INTO v_state FROM sftq.daily_rollup_state FOR UPDATE;
    DELETE FROM sftq.daily_rollup_moves;
    DELETE FROM sftq.daily_rollup;
    DELETE FROM sftq.daily_rollup_hours;
    UPDATE sftq.daily_rollup_state
       SET rolled_from = NULL, rolled_through = '-infinity', moves_before = '-infinity';
    RETURN sftq.daily_rollup_refresh(p_now, NULL);
END
$$;
COMMENT ON FUNCTION sftq.daily_rollup_rebuild(timestamptz) IS
    'Counts every UTC day that is over again from the jobs (after rows were loaded into sftq.jobs by hand). Locking contract: the admission gate exclusively (waits for it, as admission does), then the daily_rollup_state row.';

CREATE OR REPLACE FUNCTION sftq.analyst_daily_split_hours()
RETURNS SETOF timestamptz
LANGUAGE sql STABLE SECURITY DEFINER
ROWS 1
SET search_path = pg_catalog, pg_temp
AS $$
    -- The rolled-up hours in which a day of the session's time zone begins: none in UTC, nor
    -- in any zone a whole number of hours away from it.
    SELECT DISTINCT r.hour
      FROM sftq.daily_rollup_state s
     CROSS JOIN LATERAL generate_series(s.rolled_from, s.rolled_through - interval '24 hours',
                                        interval '24 hours') g (day)
      JOIN sftq.daily_rollup_hours r ON r.day = g.day
     WHERE NOT (date_trunc('day', g.day) = g.day
                AND date_trunc('day', g.day + interval '24 hours') = g.day + interval '24 hours'
                AND date_trunc('day', g.day + interval '24 hours' - interval '1 microsecond') = g.day)
       AND date_trunc('day', r.hour) <> date_trunc('day', r.hour + interval '1 hour' - interval '1 microsecond')
$$;
COMMENT ON FUNCTION sftq.analyst_daily_split_hours() IS
    'The UTC hours of the rollup that hold the start of a day of the session''s time zone (none in UTC), whose jobs analyst_daily counts one by one. SECURITY DEFINER: it shows only hours, to the analyst role that reads the view. Reads only.';

CREATE OR REPLACE FUNCTION sftq._analyst_daily_after_tick()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    BEGIN
        PERFORM sftq.daily_rollup_refresh(NEW.finished_at);
    EXCEPTION WHEN OTHERS THEN
        -- The rollup only makes a view faster (readers stay exact without it): never fail a tick.
        RAISE WARNING 'analyst_daily: rollup not refreshed: % (%)', SQLERRM, SQLSTATE;
    END;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._analyst_daily_after_tick() IS
    'AFTER UPDATE trigger on scheduler_ticks: when a tick records its end (sftq.tick_finish), refresh the analyst_daily rollup in the same transaction. Errors become a warning.';

DROP TRIGGER IF EXISTS scheduler_ticks_analyst_daily ON sftq.scheduler_ticks;
CREATE TRIGGER scheduler_ticks_analyst_daily
    AFTER UPDATE OF finished_at ON sftq.scheduler_ticks
    FOR EACH ROW WHEN (OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL
                       AND NEW.status <> 'abandoned')
    EXECUTE FUNCTION sftq._analyst_daily_after_tick();
