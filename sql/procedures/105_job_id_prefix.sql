-- Finding one's own jobs by the first characters of their id (GET /jobs?id_prefix=...).
--
-- A hex prefix of a UUID is a range of UUIDs: [prefix 000..., prefix fff...]. The lookup walks
-- that range of the primary key, so it reads the few jobs (of anyone) whose id starts that way,
-- never the caller's whole history; only the caller's are kept (another user's job is not
-- there, as everywhere else: 404 rules, never 403).

CREATE OR REPLACE FUNCTION sftq.api_jobs_by_id_prefix(
    p_key_hash  bytea,
    p_prefix    text,
    p_state     text,
    p_kind      text,
    p_limit     integer)
RETURNS json
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user  bigint := sftq._auth(p_key_hash);
    v_hex   text := lower(replace(p_prefix, '-', ''));
    v_lo    uuid;
    v_hi    uuid;
    v_body  json;
BEGIN
    IF v_hex IS NULL OR v_hex !~ '^[0-9a-f]{8,32}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400',
            MESSAGE = 'id_prefix must be 8 to 32 hexadecimal digits of a job id (dashes allowed)';
    END IF;
    IF p_state IS NOT NULL AND p_state NOT IN ('QUEUED', 'PROGRESS', 'SUCCESS', 'FAIL', 'CANCELLED') THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'state must be one of QUEUED, PROGRESS, SUCCESS, FAIL, CANCELLED';
    END IF;
    IF p_kind IS NOT NULL AND p_kind NOT IN ('SFT', 'DPO', 'RFT') THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'kind must be one of SFT, DPO, RFT';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ400', MESSAGE = 'limit must be between 1 and 1000';
    END IF;
    v_lo := rpad(v_hex, 32, '0')::uuid;
    v_hi := rpad(v_hex, 32, 'f')::uuid;
    -- Ordered by id, so the primary key's range scan is also the order: it stops at p_limit.
    SELECT COALESCE(json_agg(sftq.job_json(m) ORDER BY m.created_at DESC, m.id DESC), '[]'::json)
      INTO v_body
      FROM (SELECT j.* FROM sftq.jobs j
             WHERE j.id BETWEEN v_lo AND v_hi
               AND j.user_id = v_user
               AND (p_state IS NULL OR j.state = p_state)
               AND (p_kind IS NULL OR j.kind = p_kind)
             ORDER BY j.id
             LIMIT p_limit) m;
    RETURN v_body;
END
$$;
COMMENT ON FUNCTION sftq.api_jobs_by_id_prefix(bytea, text, text, text, integer) IS
    'GET /jobs?id_prefix=. Authenticates, then at most p_limit of the caller''s jobs whose id starts with the hex prefix (8 to 32 digits), newest first. Reads only: a range scan of jobs_pkey, no locks.';
