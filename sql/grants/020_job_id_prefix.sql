-- The id-prefix lookup of GET /jobs (sql/procedures/105_job_id_prefix.sql): an api_* entry
-- point like the others (SECURITY DEFINER), callable by the API role only.
REVOKE ALL ON FUNCTION sftq.api_jobs_by_id_prefix(bytea, text, text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sftq.api_jobs_by_id_prefix(bytea, text, text, text, integer) TO sftq_api;
