-- Privileges for the visibility features (job history, waiting reasons, estimates, capacity).
-- Runs after 010_roles.sql, which revokes everything first.

GRANT EXECUTE ON FUNCTION
    sftq.api_queue_context(bytea, interval, interval),
    sftq.api_job_analytics(bytea, uuid, interval, interval),
    sftq.api_job_events(bytea, uuid, integer, bigint),
    sftq.api_capacity(bytea, boolean, interval, interval, text)
TO sftq_api;

-- The scheduler's admission runs the shared walk (and the walk's rule), and its preview the
-- shared reasons.
GRANT EXECUTE ON FUNCTION
    sftq._walk_admits(integer[], integer),
    sftq._admission_walk(integer),
    sftq.waiting_reason(integer, bigint, boolean, integer, integer, boolean, integer, integer,
                        integer, boolean, text),
    sftq.waiting_reasons(sftq.waiting_facts[], integer, integer, text)
TO sftq_scheduler;

-- jobs_success_runs_idx is built on sftq.gpu_class: every role that moves a job to SUCCESS
-- evaluates it (the api_* functions run as their owner, who has it already).
GRANT EXECUTE ON FUNCTION sftq.gpu_class(integer) TO sftq_scheduler;

-- Analysts may word the event log as the API does (a pure function over a row they can read).
GRANT EXECUTE ON FUNCTION sftq.event_message(text, text, text, text, jsonb),
                          sftq._provider_state_label(text),
                          sftq._human_seconds(numeric)
TO sftq_analyst;
