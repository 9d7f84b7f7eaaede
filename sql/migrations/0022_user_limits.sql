-- 0022: per-user limits on the shared parts (issue 52): the request rate of the write and
-- tool routes, the number of QUEUED jobs, and the long-lived connections (SSE streams, MCP
-- waits) one user may hold. The procedures are in sql/procedures/195_user_limits.sql; what
-- each limit means and how to size it: docs/operations.md (Per-user limits).

-- A user's own limits; NULL: the deployment's default (sftq.user_limit_defaults). 0: none.
ALTER TABLE sftq.users
    ADD COLUMN rate_per_minute integer CHECK (rate_per_minute BETWEEN 0 AND 1000000),
    ADD COLUMN max_queued integer CHECK (max_queued BETWEEN 0 AND 100000000),
    ADD COLUMN max_streams integer CHECK (max_streams BETWEEN 0 AND 100000);
COMMENT ON COLUMN sftq.users.rate_per_minute IS
    'Requests a minute this user may make of POST /jobs, POST /jobs:validate, retries and MCP tool calls together (a bucket of that many, refilled evenly over the minute); NULL: the default in sftq.user_limit_defaults; 0: no limit.';
COMMENT ON COLUMN sftq.users.max_queued IS
    'How many QUEUED jobs this user may have at once (Slurm''s MaxSubmit); NULL: the default; 0: no limit.';
COMMENT ON COLUMN sftq.users.max_streams IS
    'How many long-lived connections (SSE streams, MCP waits) this user may hold at once; NULL: the default; 0: no limit.';

-- One row: the limits of every user who has none of their own.
CREATE TABLE sftq.user_limit_defaults (
    only_row         boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    rate_per_minute  integer NOT NULL DEFAULT 600 CHECK (rate_per_minute BETWEEN 0 AND 1000000),
    max_queued       integer NOT NULL DEFAULT 0 CHECK (max_queued BETWEEN 0 AND 100000000),
    max_streams      integer NOT NULL DEFAULT 10 CHECK (max_streams BETWEEN 0 AND 100000)
);
INSERT INTO sftq.user_limit_defaults DEFAULT VALUES;
COMMENT ON TABLE sftq.user_limit_defaults IS
    'The per-user limits of users without their own (one row; 0: no limit). Defaults: 600 requests a minute, no queue limit, 10 streams and waits. `sftq admin set-limits --default` changes them.';

-- The request-rate bucket of each user who made a limited request: a generic cell rate
-- algorithm (GCRA) keeps one time per user instead of a count per window.
CREATE TABLE sftq.user_rate (
    user_id  bigint PRIMARY KEY REFERENCES sftq.users (id),
    tat      timestamptz NOT NULL,
    granted  integer NOT NULL
) WITH (fillfactor = 50);  -- updated in place on every limited request: room for HOT updates
-- A bucket for every user there is (new users get theirs from a trigger: 195_user_limits.sql).
INSERT INTO sftq.user_rate (user_id, tat, granted) SELECT u.id, '-infinity', 0 FROM sftq.users u;
COMMENT ON TABLE sftq.user_rate IS
    'Per-user request-rate state (GCRA): the bucket is full when tat <= now, empty when tat >= now + 1 minute; each request moves tat on by a minute / the user''s rate. granted: how many requests the last take let through.';

-- One row per open long-lived connection: counted across every process, renewed by the
-- process that holds it, gone when it closes or when its process stops renewing it.
CREATE TABLE sftq.user_leases (
    id          uuid PRIMARY KEY,
    user_id     bigint NOT NULL REFERENCES sftq.users (id),
    kind        text NOT NULL CHECK (kind IN ('stream', 'wait')),
    opened_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX user_leases_user_idx ON sftq.user_leases (user_id, expires_at);
COMMENT ON TABLE sftq.user_leases IS
    'The open SSE streams (kind stream) and MCP waits (kind wait) of each user, one row each, counted against the user''s max_streams. A row whose expires_at passed belongs to a process that died: it no longer counts.';
