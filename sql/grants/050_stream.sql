-- The live stream's entry points (sql/procedures/140_stream.sql). They are SECURITY DEFINER:
-- the API's login role reads the log only through them. api_stream_open authenticates a key;
-- stream_backlog and stream_poll answer only users that an instance registered through it.
GRANT EXECUTE ON FUNCTION
    sftq.api_stream_open(bytea, text, uuid, text, xid8, integer, integer),
    sftq.stream_backlog(text, bigint, uuid, xid8, bigint, xid8, integer),
    sftq.stream_poll(text, xid8, bigint, integer, bytea[], integer, integer)
TO sftq_api;

-- The tick refreshes queue frames through a trigger on its own record; the function is also
-- there for a scheduler that wants to call it itself.
GRANT EXECUTE ON FUNCTION sftq.stream_queue_refresh(timestamptz, interval, interval) TO sftq_scheduler;
