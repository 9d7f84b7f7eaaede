-- The live stream: what GET /jobs/{id}/stream and GET /jobs/stream send, read by one poll per
-- server instance. The design (docs/api.md, Live updates; docs/performance.md, stream):
--
-- Order. A frame's position is (txid, id) of its row: txid is the writing transaction's id
-- (sftq.job_events.txid, sftq.stream_queue_events.txid), id the row's identity. A reader
-- takes every row whose txid is below its snapshot's xmin: those transactions have all
-- finished, and no transaction that finishes later can hold a txid below it, so a cursor
-- over (txid, id) never steps over a row that commits late. Within one job the positions
-- follow commit order: every writer of a job's events holds the job's row lock, and
-- sftq._stream_order raises a new row's txid to the job's previous one when the writer got
-- its transaction id before it waited for that lock.
--
-- Frames. status: a transition (to_state set) or the job's first event (queued), with the
-- job record as it was in that state (sftq.stream_record). progress: a provider_state event.
-- queue: a row of sftq.stream_queue_events, written at the end of a tick for users with an
-- open stream when a queued job's position, waiting reason or estimated start changed.
-- Other events (submitted, cancel_requested, ...) move the position but make no frame.
--
-- Ids on the wire: a frame's id is its row id (digits; the same id GET /jobs/{id}/events
-- shows). A stream that has sent no frame yet names its starting point as "h<txid>".

-- ---------------------------------------------------------------------------------------
-- Write side
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq._stream_order()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_last xid8;
BEGIN
    -- The job's last position so far: its newest event row (ids follow commit order within a
    -- job, since every writer holds the job's row lock) and its newest queue frame.
    SELECT e.txid INTO v_last FROM sftq.job_events e
     WHERE e.job_id = NEW.job_id ORDER BY e.id DESC LIMIT 1;
    IF v_last > NEW.txid THEN
        NEW.txid := v_last;
    END IF;
    SELECT q.txid INTO v_last FROM sftq.stream_queue_events q
     WHERE q.job_id = NEW.job_id ORDER BY q.id DESC LIMIT 1;
    IF v_last > NEW.txid THEN
        NEW.txid := v_last;
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION sftq._stream_order() IS
    'BEFORE INSERT on job_events (not for a job''s first event, queued): raises txid to the job''s previous position so that a writer that got its transaction id before it waited for the job''s row lock still sorts after the rows written before it. Keeps the stream''s completeness argument (txid is never below the writer''s own transaction id). Reads two index entries; locks nothing.';

DROP TRIGGER IF EXISTS job_events_stream_order ON sftq.job_events;
CREATE TRIGGER job_events_stream_order
    BEFORE INSERT ON sftq.job_events
    FOR EACH ROW WHEN (NEW.event <> 'queued') EXECUTE FUNCTION sftq._stream_order();

-- ---------------------------------------------------------------------------------------
-- Frames
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq.stream_record(j sftq.jobs, p_state text)
RETURNS json
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The job record (sftq.job_json, what GET /jobs/{id} answers) as it was in p_state: the
    -- fields set later in a job's life read null. A field added to job_json that changes
    -- during a job's life needs its name in the lists below.
    SELECT CASE WHEN p_state = j.state THEN sftq.job_json(j) ELSE (
        SELECT json_object_agg(f.key, CASE WHEN f.key = 'state' THEN to_json(p_state)
                                           WHEN f.key = ANY (m.later) THEN 'null'::json
                                           ELSE f.value END ORDER BY f.n)
          FROM json_each(sftq.job_json(j)) WITH ORDINALITY AS f(key, value, n),
               (SELECT CASE p_state
                    WHEN 'QUEUED' THEN ARRAY['started_at', 'completed_at', 'error',
                                             'fireworks_job_name', 'failure_class']
                    WHEN 'PROGRESS' THEN ARRAY['completed_at', 'error', 'failure_class']
                    ELSE ARRAY[]::text[] END AS later) m) END
$$;
COMMENT ON FUNCTION sftq.stream_record(sftq.jobs, text) IS
    'The data of a status frame: sftq.job_json of the job with state = p_state and the fields a job gets only after that state (started_at, completed_at, error, fireworks_job_name, failure_class) null. Reads only.';

CREATE OR REPLACE FUNCTION sftq.stream_estimated_finish(j sftq.jobs, p_detail jsonb)
RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The estimate GET /jobs/{id}/analytics answers (sftq.finish_estimate), as of now.
    SELECT CASE WHEN j.state = 'PROGRESS' THEN (
               SELECT f.finish_at FROM sftq.finish_estimate(j.id, j.kind, j.gpu_count,
                                                            j.started_at, j.submitted_at, now()) f)
           END
$$;
COMMENT ON FUNCTION sftq.stream_estimated_finish(sftq.jobs, jsonb) IS
    'estimated_finish_at of a progress frame: the estimate of GET /jobs/{id}/analytics (sftq.finish_estimate) for a job still PROGRESS, as of now; null once it has ended. Reads only.';

CREATE OR REPLACE FUNCTION sftq._stream_frame(
    p_src      text,
    p_event    text,
    p_to       text,
    p_state    text,
    p_detail   jsonb,
    p_qpos     bigint,
    p_qreason  jsonb,
    p_qstart   timestamptz,
    j          sftq.jobs)
RETURNS TABLE (frame text, data json)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT x.frame,
           CASE x.frame
               WHEN 'status' THEN sftq.stream_record(j, p_state)
               WHEN 'progress' THEN json_build_object(
                   'job_id', j.id,
                   'provider_state', COALESCE(p_detail ->> 'provider_state', p_detail ->> 'to'),
                   'progress', CASE WHEN p_detail ? 'progress_percent' OR p_detail ? 'progress_epoch'
                                    THEN json_build_object('percent', p_detail -> 'progress_percent',
                                                           'epoch', p_detail -> 'progress_epoch') END,
                   'estimated_finish_at', sftq._iso(sftq.stream_estimated_finish(j, p_detail)))
               WHEN 'queue' THEN json_build_object(
                   'job_id', j.id, 'queue_position', p_qpos, 'waiting_reason', p_qreason,
                   'estimated_start_at', sftq._iso(p_qstart))
           END
      FROM (SELECT CASE WHEN p_src = 'q' THEN 'queue'
                        WHEN p_to IS NOT NULL OR p_event = 'queued' THEN 'status'
                        WHEN p_event = 'provider_state' THEN 'progress' END AS frame) x
$$;
COMMENT ON FUNCTION sftq._stream_frame(text, text, text, text, jsonb, bigint, jsonb, timestamptz, sftq.jobs) IS
    'The frame a row makes (status, progress, queue, or none) and its data. Reads only.';

-- One scan of the log in stream order: rows with position in (after, upto), at most p_limit of
-- them, all users (p_users NULL) or some, all jobs (p_job NULL) or one. Answers the frames in
-- order, then one 'scan' row: the last position scanned (id, txid) and how many rows were
-- scanned, so a caller can go on from there when it hit the limit.
CREATE OR REPLACE FUNCTION sftq._stream_scan(
    p_after_txid  xid8,
    p_after_id    bigint,
    p_upto        xid8,
    p_job         uuid,
    p_users       bigint[],
    p_limit       integer)
RETURNS TABLE (frame text, id bigint, txid text, job_id uuid, user_id bigint, state text, data text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_job IS NULL THEN
        RETURN QUERY
        WITH s AS MATERIALIZED (
            SELECT * FROM (
                (SELECT 'e'::text AS src, e.id, e.txid, e.job_id, e.event, e.state, e.to_state,
                        e.detail, NULL::bigint AS qpos, NULL::jsonb AS qreason,
                        NULL::timestamptz AS qstart
                   FROM sftq.job_events e
                  WHERE (e.txid, e.id) > (p_after_txid, p_after_id) AND e.txid < p_upto
                  ORDER BY e.txid, e.id LIMIT p_limit)
                UNION ALL
                (SELECT 'q', q.id, q.txid, q.job_id, 'queue', 'QUEUED', NULL, NULL,
                        q.queue_position, q.waiting_reason, q.estimated_start_at
                   FROM sftq.stream_queue_events q
                  WHERE (q.txid, q.id) > (p_after_txid, p_after_id) AND q.txid < p_upto
                  ORDER BY q.txid, q.id LIMIT p_limit)) u
             ORDER BY u.txid, u.id LIMIT p_limit)
        SELECT r.frame, r.id, r.txid::text, r.job_id, r.user_id, r.state, r.data FROM (
            SELECT f.frame, s.id, s.txid, s.job_id, j.user_id, s.state, f.data::text AS data, 0 AS k
              FROM s JOIN sftq.jobs j ON j.id = s.job_id
             CROSS JOIN LATERAL sftq._stream_frame(s.src, s.event, s.to_state, s.state, s.detail,
                                                  s.qpos, s.qreason, s.qstart, j) f
             WHERE f.frame IS NOT NULL AND (p_users IS NULL OR j.user_id = ANY (p_users))
            UNION ALL
            SELECT 'scan', l.id, l.txid, NULL, NULL, NULL,
                   json_build_object('scanned', (SELECT count(*) FROM s))::text, 1
              FROM (SELECT 1) one
              LEFT JOIN LATERAL (SELECT s.id, s.txid FROM s ORDER BY s.txid DESC, s.id DESC
                                  LIMIT 1) l ON true) r
         ORDER BY r.k, r.txid, r.id;
    ELSE
        RETURN QUERY
        WITH s AS MATERIALIZED (
            SELECT * FROM (
                (SELECT 'e'::text AS src, e.id, e.txid, e.job_id, e.event, e.state, e.to_state,
                        e.detail, NULL::bigint AS qpos, NULL::jsonb AS qreason,
                        NULL::timestamptz AS qstart
                   FROM sftq.job_events e
                  WHERE e.job_id = p_job
                    AND (e.txid, e.id) > (p_after_txid, p_after_id) AND e.txid < p_upto)
                UNION ALL
                (SELECT 'q', q.id, q.txid, q.job_id, 'queue', 'QUEUED', NULL, NULL,
                        q.queue_position, q.waiting_reason, q.estimated_start_at
                   FROM sftq.stream_queue_events q
                  WHERE q.job_id = p_job
                    AND (q.txid, q.id) > (p_after_txid, p_after_id) AND q.txid < p_upto)) u
             ORDER BY u.txid, u.id LIMIT p_limit)
        SELECT r.frame, r.id, r.txid::text, r.job_id, r.user_id, r.state, r.data FROM (
            SELECT f.frame, s.id, s.txid, s.job_id, j.user_id, s.state, f.data::text AS data, 0 AS k
              FROM s JOIN sftq.jobs j ON j.id = s.job_id
             CROSS JOIN LATERAL sftq._stream_frame(s.src, s.event, s.to_state, s.state, s.detail,
                                                  s.qpos, s.qreason, s.qstart, j) f
             WHERE f.frame IS NOT NULL AND (p_users IS NULL OR j.user_id = ANY (p_users))
            UNION ALL
            SELECT 'scan', l.id, l.txid, NULL, NULL, NULL,
                   json_build_object('scanned', (SELECT count(*) FROM s))::text, 1
              FROM (SELECT 1) one
              LEFT JOIN LATERAL (SELECT s.id, s.txid FROM s ORDER BY s.txid DESC, s.id DESC
                                  LIMIT 1) l ON true) r
         ORDER BY r.k, r.txid, r.id;
    END IF;
END
$$;
COMMENT ON FUNCTION sftq._stream_scan(xid8, bigint, xid8, uuid, bigint[], integer) IS
    'Frames of the rows with position (txid, id) in (after, upto) in stream order, at most p_limit rows scanned (job_events_stream_idx and stream_queue_events_stream_idx, or the per-job indexes), then a scan row with the last position scanned. Reads only.';

-- The state of a job as of a horizon: its newest event below it.
CREATE OR REPLACE FUNCTION sftq._stream_last_event(p_job uuid, p_upto xid8)
RETURNS sftq.job_events
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.* FROM sftq.job_events e
     WHERE e.job_id = p_job AND e.txid < p_upto
     ORDER BY e.txid DESC, e.id DESC LIMIT 1
$$;

-- ---------------------------------------------------------------------------------------
-- Read side: open, backlog, poll
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION sftq._stream_watch(p_instance text, p_key_id bigint, p_user_id bigint,
                                              p_ttl_seconds integer)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO sftq.stream_watchers AS w (instance, key_id, user_id, expires_at)
    VALUES (p_instance, p_key_id, p_user_id, now() + make_interval(secs => p_ttl_seconds))
    ON CONFLICT (instance, key_id) DO UPDATE SET expires_at = EXCLUDED.expires_at
     WHERE w.expires_at < EXCLUDED.expires_at - interval '5 seconds'
$$;

CREATE OR REPLACE FUNCTION sftq.api_stream_open(
    p_key_hash       bytea,
    p_instance       text,
    p_job_id         uuid,
    p_last_event_id  text,
    p_floor          xid8,
    p_ttl_seconds    integer,
    p_limit          integer)
RETURNS TABLE (frame text, id bigint, txid text, job_id uuid, user_id bigint, state text, data text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The horizon first: every row below it is committed and visible to this function's
    -- later statements; p_floor (the instance's poll cursor) keeps it from falling behind
    -- what the instance's poll already covers.
    v_horizon   xid8 := GREATEST(pg_snapshot_xmin(pg_current_snapshot()), COALESCE(p_floor, '0'));
    v_user      bigint := sftq._auth(p_key_hash);
    v_key_id    bigint;
    v_job       sftq.jobs;
    v_last      sftq.job_events;
    v_after     xid8;
    v_after_id  bigint;
    v_owner     bigint;
    v_state     text;
BEGIN
    IF p_job_id IS NOT NULL THEN
        v_job := sftq.get_job(v_user, p_job_id);  -- SQ404 when not the caller's
    END IF;
    SELECT k.id INTO v_key_id FROM sftq.api_keys k WHERE k.key_hash = p_key_hash;

    IF p_last_event_id IS NOT NULL THEN
        -- Validated before the watcher is recorded: a bad id opens nothing.
        IF p_last_event_id ~ '^[0-9]{1,18}$' THEN
            v_after_id := p_last_event_id::bigint;
            SELECT e.txid, j.user_id INTO v_after, v_owner
              FROM sftq.job_events e JOIN sftq.jobs j ON j.id = e.job_id WHERE e.id = v_after_id;
            IF NOT FOUND THEN
                SELECT q.txid, q.user_id INTO v_after, v_owner
                  FROM sftq.stream_queue_events q WHERE q.id = v_after_id;
            END IF;
        ELSIF p_last_event_id ~ '^h[0-9]{1,20}$' THEN
            v_after := substr(p_last_event_id, 2)::xid8;
            v_after_id := 0;
            v_owner := CASE WHEN v_after <= pg_snapshot_xmax(pg_current_snapshot()) THEN v_user END;
        END IF;
        IF v_owner IS DISTINCT FROM v_user THEN
            -- One answer for ids that do not exist and ids of other users' jobs.
            RAISE EXCEPTION USING ERRCODE = 'SQ400',
                MESSAGE = 'Last-Event-ID is not an id this stream sent you; reconnect without it';
        END IF;
    END IF;

    PERFORM sftq._stream_watch(p_instance, v_key_id, v_user, p_ttl_seconds);
    IF p_job_id IS NOT NULL THEN
        v_last := sftq._stream_last_event(p_job_id, v_horizon);
        v_state := v_last.state;
    END IF;

    frame := 'meta';
    data := json_build_object('user_id', v_user, 'key_id', v_key_id, 'horizon', v_horizon::text,
                              'job_state', v_state,
                              'after', CASE WHEN v_after IS NOT NULL
                                            THEN json_build_array(v_after::text, v_after_id) END)::text;
    RETURN NEXT;

    IF p_last_event_id IS NOT NULL THEN
        -- Resume: the first page of everything after the given position, below the horizon.
        RETURN QUERY SELECT * FROM sftq._stream_scan(v_after, v_after_id, v_horizon, p_job_id,
                                                     ARRAY[v_user], p_limit);
    ELSIF p_job_id IS NOT NULL THEN
        -- One job as of the horizon, then its newest queue frame if that came later.
        IF v_last.id IS NOT NULL THEN
            RETURN QUERY
            SELECT x.frame, x.id, x.txid::text, x.job_id, v_user, x.state, x.data FROM (
                SELECT 'status'::text AS frame, v_last.id AS id, v_last.txid AS txid,
                       v_job.id AS job_id, v_last.state AS state,
                       sftq.stream_record(v_job, v_last.state)::text AS data
                UNION ALL
                SELECT f.frame, q.id, q.txid, q.job_id, 'QUEUED', f.data::text
                  FROM (SELECT * FROM sftq.stream_queue_events q
                         WHERE q.job_id = p_job_id AND q.txid < v_horizon
                         ORDER BY q.txid DESC, q.id DESC LIMIT 1) q
                 CROSS JOIN LATERAL sftq._stream_frame('q', 'queue', NULL, 'QUEUED', NULL,
                     q.queue_position, q.waiting_reason, q.estimated_start_at, v_job) f
                 WHERE v_last.state = 'QUEUED' AND (q.txid, q.id) > (v_last.txid, v_last.id)) x
             ORDER BY x.txid, x.id;
        END IF;
    ELSE
        -- Every job of the caller's that was QUEUED or PROGRESS as of the horizon, in stream
        -- order of the rows that put it there: the jobs queued or running now, and those whose
        -- newest rows lie at or above the horizon (they may have been active below it).
        RETURN QUERY
        WITH cand AS (
            SELECT j.id FROM sftq.jobs j WHERE j.user_id = v_user AND j.state = 'QUEUED'
            UNION
            SELECT j.id FROM sftq.jobs j WHERE j.user_id = v_user AND j.state = 'PROGRESS'
            UNION
            SELECT e.job_id FROM sftq.job_events e JOIN sftq.jobs j ON j.id = e.job_id
             WHERE e.txid >= v_horizon AND j.user_id = v_user
        ), last AS (
            SELECT c.id AS job_id, l.id, l.txid, l.state
              FROM cand c CROSS JOIN LATERAL sftq._stream_last_event(c.id, v_horizon) l
             WHERE l.state IN ('QUEUED', 'PROGRESS')
        ), frames AS (
            SELECT 'status'::text AS frame, l.id, l.txid, j.id AS job_id, l.state,
                   sftq.stream_record(j, l.state)::text AS data
              FROM last l JOIN sftq.jobs j ON j.id = l.job_id
            UNION ALL
            SELECT f.frame, q.id, q.txid, j.id, 'QUEUED', f.data::text
              FROM last l JOIN sftq.jobs j ON j.id = l.job_id
             CROSS JOIN LATERAL (SELECT * FROM sftq.stream_queue_events q
                                  WHERE q.job_id = l.job_id AND q.txid < v_horizon
                                  ORDER BY q.txid DESC, q.id DESC LIMIT 1) q
             CROSS JOIN LATERAL sftq._stream_frame('q', 'queue', NULL, 'QUEUED', NULL,
                 q.queue_position, q.waiting_reason, q.estimated_start_at, j) f
             WHERE l.state = 'QUEUED' AND (q.txid, q.id) > (l.txid, l.id)
        )
        SELECT x.frame, x.id, x.txid::text, x.job_id, v_user, x.state, x.data
          FROM frames x ORDER BY x.txid, x.id;
    END IF;
END
$$;
COMMENT ON FUNCTION sftq.api_stream_open(bytea, text, uuid, text, xid8, integer, integer) IS
    'Opens a stream (GET /jobs/{id}/stream with p_job_id, GET /jobs/stream without): authenticates, checks the job is the caller''s (SQ404), validates Last-Event-ID (SQ400 for an unknown or foreign id), records the instance as watching the caller, then answers a meta row {user_id, key_id, horizon, job_state, after} and either the snapshot (the job, or every QUEUED/PROGRESS job, as of the horizon, each at the position of the row that made it so) or the first page of frames after Last-Event-ID. Locking contract: upserts one stream_watchers row; reads otherwise.';

CREATE OR REPLACE FUNCTION sftq.stream_backlog(
    p_instance    text,
    p_user_id     bigint,
    p_job_id      uuid,
    p_after_txid  xid8,
    p_after_id    bigint,
    p_upto        xid8,
    p_limit       integer)
RETURNS TABLE (frame text, id bigint, txid text, job_id uuid, user_id bigint, state text, data text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Only for a user this instance opened a stream for with a valid key.
    IF NOT EXISTS (SELECT 1 FROM sftq.stream_watchers w
                    WHERE w.instance = p_instance AND w.user_id = p_user_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ401', MESSAGE = 'the stream is no longer registered';
    END IF;
    RETURN QUERY SELECT * FROM sftq._stream_scan(p_after_txid, p_after_id, p_upto, p_job_id,
                                                 ARRAY[p_user_id], p_limit);
END
$$;
COMMENT ON FUNCTION sftq.stream_backlog(text, bigint, uuid, xid8, bigint, xid8, integer) IS
    'The next page of a resumed stream''s backlog (after api_stream_open''s first page). Only for users the instance registered. Reads only.';

-- p_open_streams joined the signature (issue 45: sftq_stream_connections).
DROP FUNCTION IF EXISTS sftq.stream_poll(text, xid8, bigint, integer, bytea[], integer);
CREATE OR REPLACE FUNCTION sftq.stream_poll(
    p_instance      text,
    p_after_txid    xid8,
    p_after_id      bigint,
    p_limit         integer,
    p_key_hashes    bytea[] DEFAULT NULL,
    p_ttl_seconds   integer DEFAULT 120,
    p_open_streams  integer DEFAULT NULL)
RETURNS TABLE (frame text, id bigint, txid text, job_id uuid, user_id bigint, state text, data text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_horizon  xid8 := pg_snapshot_xmin(pg_current_snapshot());
    v_users    bigint[];
    v_gone     bytea[];
BEGIN
    IF p_key_hashes IS NOT NULL THEN
        -- Refresh: re-register the keys the instance still streams for (a key revoked or a
        -- user disabled meanwhile is answered in "gone"), forget the others, and drop the
        -- rows of instances that stopped refreshing.
        WITH live AS (
            SELECT k.id AS key_id, k.user_id FROM sftq.api_keys k JOIN sftq.users u ON u.id = k.user_id
             WHERE k.key_hash = ANY (p_key_hashes) AND k.revoked_at IS NULL AND u.disabled_at IS NULL
        ), up AS (
            INSERT INTO sftq.stream_watchers AS w (instance, key_id, user_id, expires_at)
            SELECT p_instance, l.key_id, l.user_id, now() + make_interval(secs => p_ttl_seconds)
              FROM live l
            ON CONFLICT (instance, key_id) DO UPDATE SET expires_at = EXCLUDED.expires_at
            RETURNING w.key_id
        )
        DELETE FROM sftq.stream_watchers w
         WHERE (w.instance = p_instance AND w.key_id NOT IN (SELECT l.key_id FROM live l))
            OR (w.instance <> p_instance AND w.expires_at < now());
        -- The instance's open streams, for GET /metrics (sftq.metrics sums live instances).
        IF p_open_streams IS NOT NULL THEN
            INSERT INTO sftq.stream_instances AS i (instance, open_streams, expires_at)
            VALUES (p_instance, GREATEST(p_open_streams, 0), now() + make_interval(secs => p_ttl_seconds))
            ON CONFLICT (instance) DO UPDATE
               SET open_streams = EXCLUDED.open_streams, expires_at = EXCLUDED.expires_at;
            DELETE FROM sftq.stream_instances i WHERE i.instance <> p_instance AND i.expires_at < now();
        END IF;
        SELECT array_agg(h) INTO v_gone FROM unnest(p_key_hashes) h
         WHERE NOT EXISTS (SELECT 1 FROM sftq.api_keys k JOIN sftq.users u ON u.id = k.user_id
                            WHERE k.key_hash = h AND k.revoked_at IS NULL AND u.disabled_at IS NULL);
    END IF;
    SELECT array_agg(DISTINCT w.user_id) INTO v_users FROM sftq.stream_watchers w
     WHERE w.instance = p_instance;

    frame := 'meta';
    data := json_build_object('horizon', v_horizon::text, 'users', COALESCE(v_users, '{}'),
                              'gone', (SELECT json_agg(encode(g, 'hex')) FROM unnest(v_gone) g))::text;
    RETURN NEXT;
    RETURN QUERY SELECT * FROM sftq._stream_scan(p_after_txid, p_after_id, v_horizon, NULL,
                                                 COALESCE(v_users, '{}'), p_limit);
END
$$;
COMMENT ON FUNCTION sftq.stream_poll(text, xid8, bigint, integer, bytea[], integer, integer) IS
    'The one poll of a stream server instance, for all its open streams: the frames of its watched users with position after the cursor and txid below this snapshot''s xmin (the meta row''s horizon), at most p_limit rows scanned. With p_key_hashes it first refreshes the instance''s stream_watchers rows (every 30 s) and answers the keys that stopped being valid; with p_open_streams too it records the instance''s open stream count (stream_instances, same TTL). Locking contract: upserts and deletes stream_watchers and stream_instances rows only.';

-- ---------------------------------------------------------------------------------------
-- Queue frames: written when a tick ends, for users with an open stream
-- ---------------------------------------------------------------------------------------

-- A user's queue frames were read one user at a time through sftq.queue_context; the
-- refresh below now reads every watched user at once (sftq.queue_view_many).
DROP FUNCTION IF EXISTS sftq.stream_queue_snapshot(bigint);

-- p_tick_interval and p_usage_grace were added (the deployment's settings, as the API's):
-- drop the form without them.
DROP FUNCTION IF EXISTS sftq.stream_queue_refresh(timestamptz);

CREATE OR REPLACE FUNCTION sftq.stream_queue_refresh(
    p_now            timestamptz DEFAULT now(),
    p_tick_interval  interval DEFAULT interval '30 seconds',
    p_usage_grace    interval DEFAULT interval '5 minutes')
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_written integer;
    v_users   bigint[];
BEGIN
    SELECT array_agg(DISTINCT w.user_id) INTO v_users
      FROM sftq.stream_watchers w WHERE w.expires_at > now();
    -- The same numbers GET /jobs/analytics/queue answers for every queued job of each
    -- watched user (one source of truth), for all of them at once: one lookup of the jobs
    -- ahead per job, one admission walk and one forecast, however many users watch.
    WITH cur AS MATERIALIZED (
        SELECT v.user_id, v.id AS job_id, v.queue_position,
               CASE WHEN v.waiting_code IS NOT NULL
                    THEN jsonb_build_object('code', v.waiting_code, 'message', v.waiting_message)
               END AS waiting_reason,
               v.estimated_start_at
          FROM sftq.queue_view_many(COALESCE(v_users, '{}'), p_now, p_tick_interval,
                                    p_usage_grace) v
    ), changed AS (
        SELECT c.* FROM cur c LEFT JOIN sftq.stream_queue_state st ON st.job_id = c.job_id
         WHERE st.job_id IS NULL
            OR (st.queue_position, st.waiting_reason, st.estimated_start_at)
               IS DISTINCT FROM (c.queue_position, c.waiting_reason, c.estimated_start_at)
    ), locked AS (
        -- A queue frame must not follow the job's leaving the queue: lock the job rows (KEY
        -- SHARE, in id order; transitions take FOR UPDATE and wait, or we wait for them and see
        -- the job gone) and write only for jobs still QUEUED.
        SELECT j.id FROM sftq.jobs j WHERE j.id IN (SELECT c.job_id FROM changed c)
           AND j.state = 'QUEUED' ORDER BY j.id FOR KEY SHARE
    ), ins AS (
        INSERT INTO sftq.stream_queue_events (txid, job_id, user_id, at, queue_position,
                                              waiting_reason, estimated_start_at)
        SELECT GREATEST(pg_current_xact_id(),
                        (SELECT e.txid FROM sftq.job_events e WHERE e.job_id = c.job_id
                          ORDER BY e.id DESC LIMIT 1),
                        (SELECT q.txid FROM sftq.stream_queue_events q WHERE q.job_id = c.job_id
                          ORDER BY q.id DESC LIMIT 1)),
               c.job_id, c.user_id, p_now, c.queue_position, c.waiting_reason, c.estimated_start_at
          FROM changed c JOIN locked l ON l.id = c.job_id
         ORDER BY c.user_id, c.queue_position
        RETURNING 1
    ), up AS (
        INSERT INTO sftq.stream_queue_state AS st (job_id, user_id, queue_position, waiting_reason,
                                                   estimated_start_at)
        SELECT c.job_id, c.user_id, c.queue_position, c.waiting_reason, c.estimated_start_at
          FROM changed c JOIN locked l ON l.id = c.job_id
        ON CONFLICT (job_id) DO UPDATE
           SET queue_position = EXCLUDED.queue_position, waiting_reason = EXCLUDED.waiting_reason,
               estimated_start_at = EXCLUDED.estimated_start_at
        RETURNING 1
    ), gone AS (
        DELETE FROM sftq.stream_queue_state st WHERE st.job_id NOT IN (SELECT c.job_id FROM cur c)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM ins) + 0 * (SELECT count(*) FROM up) + 0 * (SELECT count(*) FROM gone)
      INTO v_written;
    -- Queue frames are for reconnecting clients, not history: keep a day.
    DELETE FROM sftq.stream_queue_events
     WHERE id IN (SELECT q.id FROM sftq.stream_queue_events q
                   WHERE q.at < p_now - interval '1 day' ORDER BY q.at LIMIT 10000);
    RETURN v_written;
END
$$;
COMMENT ON FUNCTION sftq.stream_queue_refresh(timestamptz, interval, interval) IS
    'Writes a queue frame (sftq.stream_queue_events) for each queued job of a user with an open stream whose queue_position, waiting_reason or estimated_start_at changed since the last frame (every queued job of the user, as GET /jobs/analytics/queue lists them, from sftq.queue_view_many with the deployment''s tick interval and usage grace), and prunes frames older than a day. Run at the end of every tick. Cost: one queue view for all watched users together. Locking contract: KEY SHARE on the changed jobs'' rows, in id order, so a frame never follows the job''s leaving the queue; the small stream tables otherwise.';

CREATE OR REPLACE FUNCTION sftq._stream_after_tick()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    BEGIN
        -- The tick records the deployment's tick interval and usage grace with its result.
        PERFORM sftq.stream_queue_refresh(
            NEW.finished_at,
            COALESCE((NEW.detail ->> 'tick_interval_seconds')::float8, 30) * interval '1 second',
            COALESCE((NEW.detail ->> 'usage_grace_seconds')::float8, 300) * interval '1 second');
    EXCEPTION WHEN OTHERS THEN
        -- Live queue frames are a convenience: they never cost a tick its result.
        RAISE WARNING 'stream: queue frames not refreshed: % (%)', SQLERRM, SQLSTATE;
    END;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sftq._stream_after_tick() IS
    'AFTER UPDATE trigger on scheduler_ticks: when a tick records its end (sftq.tick_finish), refresh the queue frames in the same transaction. Errors become a warning.';

DROP TRIGGER IF EXISTS scheduler_ticks_stream_queue ON sftq.scheduler_ticks;
CREATE TRIGGER scheduler_ticks_stream_queue
    AFTER UPDATE OF finished_at ON sftq.scheduler_ticks
    FOR EACH ROW WHEN (OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL
                       AND NEW.status <> 'abandoned')
    EXECUTE FUNCTION sftq._stream_after_tick();
