-- Where a job stands in the queue, without counting every job ahead of it.
--
-- queue_position (the contract's: other users' QUEUED jobs created earlier) needs the number
-- of QUEUED jobs ahead of a job. Counting them walks the queue up to the job: at 10^5 queued
-- that is most of what GET /jobs/analytics/queue costs. Instead the queue's older part is cut
-- into stretches of about 64 jobs with a count each (sftq.queue_buckets, migration
-- 0014), and the jobs ahead of a job are the counts of the stretches before its own plus the
-- jobs of its own stretch before it: its index among the stretch's jobs as of the last seal
-- (migration 0016), adjusted by the jobs that left or joined the stretch since
-- (sftq.queue_ahead).
--
-- Keeping the counts exact:
-- - A job leaving the queue (sftq._transition from QUEUED) appends -1 for its stretch, with
--   its own key, to sftq.queue_bucket_deltas in its own transaction: appending never waits
--   for anyone.
-- - sftq.queue_seal (once a tick) folds the deltas in, merges stretches that have thinned
--   out, cuts the jobs enqueued since the last seal into new stretches, and lists again the
--   jobs of every stretch whose contents changed. It holds the
--   admission gate exclusively, so no enqueue is half done and no job leaves meanwhile:
--   every job created before the new seal is committed and counted exactly once.
-- - Jobs created after the seal are counted one by one (at most one tick's enqueues).

CREATE OR REPLACE FUNCTION sftq._queue_left(p_created_at timestamptz, p_id uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Only a job of the sealed part is in a count; the others are counted when asked.
    INSERT INTO sftq.queue_bucket_deltas (lo_created_at, lo_id, delta, job_created_at, job_id)
    SELECT b.lo_created_at, b.lo_id, -1, p_created_at, p_id
      FROM sftq.queue_seal s
     CROSS JOIN LATERAL (
           SELECT b.lo_created_at, b.lo_id FROM sftq.queue_buckets b
            WHERE (b.lo_created_at, b.lo_id) <= (p_created_at, p_id)
            ORDER BY b.lo_created_at DESC, b.lo_id DESC
            LIMIT 1) b
     WHERE p_created_at < s.sealed_at;
END
$$;
COMMENT ON FUNCTION sftq._queue_left(timestamptz, uuid) IS
    'Called by sftq._transition when a job leaves QUEUED: if the job is in the sealed part of the queue, appends -1 for its stretch to sftq.queue_bucket_deltas. Locking contract: inserts one row; reads the seal and one bucket; waits for nothing.';

CREATE OR REPLACE FUNCTION sftq._queue_joined_sealed(p_created_at timestamptz[], p_ids uuid[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    i integer;
BEGIN
    -- Only for jobs enqueued with a clock before the seal (tests and replays pass p_now):
    -- a job enqueued normally is created after it. Such a job joins the count of the stretch
    -- it falls in; one before every stretch starts a stretch of its own (nothing is queued
    -- there, or a stretch would cover it).
    FOR i IN 1 .. COALESCE(cardinality(p_ids), 0) LOOP
        CONTINUE WHEN p_created_at[i] >= (SELECT s.sealed_at FROM sftq.queue_seal s);
        INSERT INTO sftq.queue_buckets (lo_created_at, lo_id, queued)
        SELECT p_created_at[i], p_ids[i], 0
         WHERE NOT EXISTS (SELECT 1 FROM sftq.queue_buckets b
                            WHERE (b.lo_created_at, b.lo_id) <= (p_created_at[i], p_ids[i]));
        INSERT INTO sftq.queue_bucket_deltas (lo_created_at, lo_id, delta, job_created_at, job_id)
        SELECT b.lo_created_at, b.lo_id, 1, p_created_at[i], p_ids[i] FROM sftq.queue_buckets b
         WHERE (b.lo_created_at, b.lo_id) <= (p_created_at[i], p_ids[i])
         ORDER BY b.lo_created_at DESC, b.lo_id DESC
         LIMIT 1;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sftq._queue_joined_sealed(timestamptz[], uuid[]) IS
    'Called by sftq.enqueue_many when it was given a clock (p_now): each new job created before the seal joins its stretch''s count (+1 in sftq.queue_bucket_deltas). Locking contract: may insert a bucket row; inserts delta rows.';

CREATE OR REPLACE FUNCTION sftq.queue_seal(p_upto timestamptz DEFAULT NULL, p_bucket integer DEFAULT 64)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_from    timestamptz;
    v_upto    timestamptz;
    v_lo_c    timestamptz;
    v_lo_i    uuid;
    v_room    integer := 0;
    v_folded  integer;
    v_new     integer := 0;
    v_merged  integer := 0;
    v_total   bigint;
    v_count   integer;
    r         record;
    p         record;
    p_n       integer;
BEGIN
    -- Exclusive: no enqueue is between its created_at and its commit, no job is leaving.
    PERFORM sftq._gate(true);
    v_upto := COALESCE(p_upto, clock_timestamp());
    SELECT s.sealed_at INTO v_from FROM sftq.queue_seal s FOR UPDATE;

    -- 1. Fold the deltas into the counts. A stretch whose jobs changed loses its list
    -- (ids NULL) until step 4 lists them again.
    WITH d AS (
        DELETE FROM sftq.queue_bucket_deltas RETURNING lo_created_at, lo_id, delta
    ), s AS (
        SELECT d.lo_created_at, d.lo_id, sum(d.delta)::int AS delta FROM d GROUP BY 1, 2
    ), u AS (
        UPDATE sftq.queue_buckets b SET queued = b.queued + s.delta, ids = NULL
          FROM s WHERE b.lo_created_at = s.lo_created_at AND b.lo_id = s.lo_id
        RETURNING 1
    )
    SELECT count(*) INTO v_folded FROM u;

    -- 2. Merge stretches that thinned out, when there are many more than the queue needs:
    -- a stretch joins the one before it while the two together fit in p_bucket (its range
    -- then ends where the deleted one's did); empty leading stretches go.
    SELECT count(*), COALESCE(sum(b.queued), 0) INTO v_count, v_total FROM sftq.queue_buckets b;
    IF v_count > 2 * (v_total / p_bucket) + 16 THEN
        p := NULL;
        FOR r IN SELECT b.lo_created_at, b.lo_id, b.queued FROM sftq.queue_buckets b
                  ORDER BY b.lo_created_at, b.lo_id LOOP
            IF p IS NULL AND r.queued = 0 THEN
                DELETE FROM sftq.queue_buckets b
                 WHERE b.lo_created_at = r.lo_created_at AND b.lo_id = r.lo_id;
                v_merged := v_merged + 1;
            ELSIF p IS NOT NULL AND p_n + r.queued <= p_bucket THEN
                DELETE FROM sftq.queue_buckets b
                 WHERE b.lo_created_at = r.lo_created_at AND b.lo_id = r.lo_id;
                p_n := p_n + r.queued;
                v_merged := v_merged + 1;
            ELSE
                IF p IS NOT NULL AND p_n <> p.queued THEN
                    UPDATE sftq.queue_buckets b SET queued = p_n, ids = NULL
                     WHERE b.lo_created_at = p.lo_created_at AND b.lo_id = p.lo_id;
                END IF;
                p := r;
                p_n := r.queued;
            END IF;
        END LOOP;
        IF p IS NOT NULL AND p_n <> p.queued THEN
            UPDATE sftq.queue_buckets b SET queued = p_n, ids = NULL
             WHERE b.lo_created_at = p.lo_created_at AND b.lo_id = p.lo_id;
        END IF;
    END IF;

    -- 3. Seal the jobs enqueued since: first into the room left in the last stretch (whose
    -- range runs to the seal), then into new stretches of p_bucket jobs.
    IF v_upto > v_from THEN
        SELECT b.lo_created_at, b.lo_id, GREATEST(p_bucket - b.queued, 0)
          INTO v_lo_c, v_lo_i, v_room
          FROM sftq.queue_buckets b ORDER BY b.lo_created_at DESC, b.lo_id DESC LIMIT 1;
        v_room := COALESCE(v_room, 0);
        WITH fresh AS MATERIALIZED (
            SELECT j.created_at, j.id, row_number() OVER (ORDER BY j.created_at, j.id) AS rn
              FROM sftq.jobs j
             WHERE j.state = 'QUEUED' AND j.created_at >= v_from AND j.created_at < v_upto
        ), into_last AS (
            UPDATE sftq.queue_buckets b
               SET queued = b.queued + (SELECT count(*) FROM fresh f WHERE f.rn <= v_room),
                   -- A list still unknown stays so (step 4 lists it whole).
                   ids = CASE WHEN b.ids IS NOT NULL THEN
                             b.ids || (SELECT array_agg(f.id ORDER BY f.rn) FROM fresh f WHERE f.rn <= v_room)
                         END
             WHERE b.lo_created_at = v_lo_c AND b.lo_id = v_lo_i
               AND EXISTS (SELECT 1 FROM fresh f WHERE f.rn <= v_room)
            RETURNING 1
        ), chunks AS (
            SELECT (f.rn - v_room - 1) / p_bucket AS c, min(f.rn) AS first_rn, count(*)::int AS n,
                   array_agg(f.id ORDER BY f.rn) AS ids
              FROM fresh f WHERE f.rn > v_room GROUP BY 1
        ), ins AS (
            INSERT INTO sftq.queue_buckets (lo_created_at, lo_id, queued, ids)
            SELECT f.created_at, f.id, c.n, c.ids FROM chunks c JOIN fresh f ON f.rn = c.first_rn
            RETURNING queued
        )
        SELECT count(*) INTO v_new FROM fresh;
        UPDATE sftq.queue_seal SET sealed_at = v_upto;
    END IF;
    IF v_folded = 0 AND v_new = 0 AND v_merged = 0 THEN
        RETURN jsonb_build_object('sealed_at', v_upto, 'sealed_jobs', 0, 'folded', 0, 'merged', 0);
    END IF;
    -- 4. The jobs of each stretch whose contents changed, listed again (the gate keeps them
    -- from changing meanwhile): a short range of jobs_queued_idx each, up to where the next
    -- stretch starts or the seal (both bounds row values, so that the index stops there).
    UPDATE sftq.queue_buckets b
       SET ids = COALESCE((
               SELECT array_agg(j.id ORDER BY j.created_at, j.id) FROM sftq.jobs j
                WHERE j.state = 'QUEUED'
                  AND (j.created_at, j.id) >= (b.lo_created_at, b.lo_id)
                  AND (j.created_at, j.id) < (
                       COALESCE((SELECT n.lo_created_at FROM sftq.queue_buckets n
                                  WHERE (n.lo_created_at, n.lo_id) > (b.lo_created_at, b.lo_id)
                                  ORDER BY n.lo_created_at, n.lo_id LIMIT 1), GREATEST(v_from, v_upto)),
                       COALESCE((SELECT n.lo_id FROM sftq.queue_buckets n
                                  WHERE (n.lo_created_at, n.lo_id) > (b.lo_created_at, b.lo_id)
                                  ORDER BY n.lo_created_at, n.lo_id LIMIT 1),
                                '00000000-0000-0000-0000-000000000000'::uuid))), '{}')
     WHERE b.ids IS NULL;
    -- 5. Each stretch's sum of the stretches before it, for reads to start from. Only the
    -- rows whose sum moved are written (after the queue's front moved: most of them), and
    -- only when a count changed.
    UPDATE sftq.queue_buckets b SET before = x.before
      FROM (SELECT y.lo_created_at, y.lo_id,
                   COALESCE(sum(y.queued) OVER (ORDER BY y.lo_created_at, y.lo_id
                                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                       AS before
              FROM sftq.queue_buckets y) x
     WHERE b.lo_created_at = x.lo_created_at AND b.lo_id = x.lo_id AND b.before <> x.before;
    RETURN jsonb_build_object('sealed_at', v_upto, 'sealed_jobs', v_new, 'folded', v_folded,
                              'merged', v_merged);
END
$$;
COMMENT ON FUNCTION sftq.queue_seal(timestamptz, integer) IS
    'Brings sftq.queue_buckets up to date: folds the deltas in, merges stretches that thinned out (when there are more than twice as many as the queue needs), counts the jobs enqueued since the last seal into stretches of p_bucket jobs up to p_upto (default: now), and lists again the jobs (ids) of every stretch whose contents changed. The tick calls it once per tick. Locking contract: the admission gate, exclusive (so it must be the first lock of its transaction), then the seal row and the bucket rows.';

CREATE OR REPLACE FUNCTION sftq.queue_buckets_rebuild(p_bucket integer DEFAULT 64)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- For a database whose jobs were written around the procedures (a bulk load, a restore):
    -- count the whole queue afresh.
    PERFORM sftq._gate(true);
    DELETE FROM sftq.queue_bucket_deltas;
    DELETE FROM sftq.queue_buckets;
    UPDATE sftq.queue_seal SET sealed_at = '-infinity';
    RETURN sftq.queue_seal(NULL, p_bucket);
END
$$;
COMMENT ON FUNCTION sftq.queue_buckets_rebuild(integer) IS
    'Recounts the queue''s stretches from scratch (after jobs were loaded without the procedures). Locking contract: as sftq.queue_seal.';

CREATE OR REPLACE FUNCTION sftq.queue_ahead(p_created_at timestamptz[], p_ids uuid[])
RETURNS TABLE (ord integer, ahead bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- many short subqueries the planner overestimates: compiling costs seconds
AS $$
BEGIN
    -- PL/pgSQL for its plan cache: a SQL function parses and plans its query again at
    -- every call (about 15% of a call for 400 keys).
    -- For each (created_at, id) given: how many QUEUED jobs come before it in FIFO order.
    -- Sealed: the sum of the stretches before its own (kept by the last seal, plus the deltas
    -- since) and the QUEUED jobs of its own stretch before it: its index in the stretch's
    -- list as of the last seal (ids), plus the deltas since of jobs before it. A job not in
    -- that list (it joined the stretch since), a stretch without a list, or one with a delta
    -- that names no job (written before migration 0016) is counted instead: an index-only
    -- range of jobs_queued_idx, at most about p_bucket entries. The list saves that range
    -- read, the larger part of a key's cost.
    -- After the seal: every stretch, plus the jobs since the seal before it, counted in ONE
    -- walk shared by all such keys: each counts from the previous key to itself, and a
    -- running sum adds them up (so many keys in a long tail cost one pass over it).
    -- The sealed total is the last stretch's sum before it plus its own count (both kept by
    -- the seal), plus the deltas: one index probe, not a sum over every stretch. The deltas
    -- are read per key only when there are any (after a seal there are none).
    RETURN QUERY
    WITH s AS (
        SELECT q.sealed_at,
               COALESCE((SELECT b.before + b.queued FROM sftq.queue_buckets b
                          ORDER BY b.lo_created_at DESC, b.lo_id DESC LIMIT 1), 0)
               + (SELECT COALESCE(sum(d.delta), 0) FROM sftq.queue_bucket_deltas d) AS sealed_total,
               EXISTS (SELECT 1 FROM sftq.queue_bucket_deltas d) AS has_deltas
          FROM sftq.queue_seal q
    ), k AS (
        SELECT t.c, t.i, t.o FROM unnest(p_created_at, p_ids) WITH ORDINALITY AS t(c, i, o)
    ), sealed AS (
        SELECT k.o,
               COALESCE(b.before, 0)
               + CASE WHEN s.has_deltas THEN
                     (SELECT COALESCE(sum(d.delta), 0) FROM sftq.queue_bucket_deltas d
                       WHERE (d.lo_created_at, d.lo_id) < (b.lo_created_at, b.lo_id)) ELSE 0 END
               + COALESCE(
                   array_position(b.ids, k.i) - 1
                   + CASE WHEN s.has_deltas THEN
                         (SELECT CASE WHEN bool_and(d.job_id IS NOT NULL) IS NOT FALSE THEN
                                     COALESCE(sum(d.delta) FILTER (
                                         WHERE (d.job_created_at, d.job_id) < (k.c, k.i)), 0) END
                            FROM sftq.queue_bucket_deltas d
                           WHERE (d.lo_created_at, d.lo_id) = (b.lo_created_at, b.lo_id)) ELSE 0 END,
                   (SELECT count(*) FROM sftq.jobs j
                     WHERE j.state = 'QUEUED'
                       AND (j.created_at, j.id) >= (COALESCE(b.lo_created_at, '-infinity'),
                                                    COALESCE(b.lo_id, '00000000-0000-0000-0000-000000000000'))
                       AND (j.created_at, j.id) < (k.c, k.i))) AS ahead
          FROM k CROSS JOIN s
          LEFT JOIN LATERAL (
                SELECT x.lo_created_at, x.lo_id, x.before, x.ids FROM sftq.queue_buckets x
                 WHERE (x.lo_created_at, x.lo_id) <= (k.c, k.i)
                 ORDER BY x.lo_created_at DESC, x.lo_id DESC
                 LIMIT 1) b ON true
         WHERE k.c < s.sealed_at
    ), tail AS (
        SELECT k.o, k.c, k.i,
               COALESCE(lag(k.c) OVER w, s.sealed_at) AS pc,
               COALESCE(lag(k.i) OVER w, '00000000-0000-0000-0000-000000000000'::uuid) AS pi
          FROM k CROSS JOIN s
         WHERE k.c >= s.sealed_at
        WINDOW w AS (ORDER BY k.c, k.i)
    ), tail_gaps AS (
        SELECT tail.o, tail.c, tail.i,
               (SELECT count(*) FROM sftq.jobs j
                 WHERE j.state = 'QUEUED' AND (j.created_at, j.id) >= (tail.pc, tail.pi)
                   AND (j.created_at, j.id) < (tail.c, tail.i)) AS n
          FROM tail
    )
    SELECT x.o::int, x.ahead::bigint
      FROM (SELECT sealed.o, sealed.ahead FROM sealed
            UNION ALL
            SELECT g.o, s.sealed_total + sum(g.n) OVER (ORDER BY g.c, g.i)
              FROM tail_gaps g CROSS JOIN s) x
     ORDER BY x.o;
END
$$;
COMMENT ON FUNCTION sftq.queue_ahead(timestamptz[], uuid[]) IS
    'For each (created_at, id) given, in the order given: the number of QUEUED jobs before it in FIFO order (created_at, then id). Exact: for a key before the seal, the sum of the stretches before its own as of the last seal plus the deltas since, then its index in its stretch''s list of jobs (ids, as of the last seal) plus the deltas since of jobs before it, or where that list cannot say, one index-only count within its own stretch (at most about p_bucket jobs); for keys after it, every stretch plus one walk of the jobs since the seal shared by all of them. Cost: one index lookup per sealed key, whatever the length of the queue; one pass over the unsealed tail. Reads only, takes no locks.';
