-- 0015: what sftq.waiting_reasons needs to know of each queued job, as one composite, so a
-- caller hands over one array for a whole list (a call per job cost more than the reasons;
-- eight parallel arrays made every caller build eight aggregates).

CREATE TYPE sftq.waiting_facts AS (
    gpu_count       integer,  -- GPUs the job needs
    own_ahead       bigint,   -- its owner's queued jobs before it
    disabled        boolean,  -- the owner is disabled
    running         integer,  -- the owner's running jobs
    cap             integer,  -- the owner's cap on running jobs
    walk_fits       boolean,  -- the admission walk admits it (true), stops at it (false), or does not reach it (NULL)
    walk_free       integer,  -- GPUs left before it in the walk
    behind_blocker  boolean   -- it comes after the walk's head that does not fit
);
COMMENT ON TYPE sftq.waiting_facts IS
    'One queued job as sftq.waiting_reasons classifies it: its GPUs, its owner''s queued jobs ahead of it, running jobs, cap and whether they are disabled, and what the admission walk (sftq._admission_walk) does with it.';
