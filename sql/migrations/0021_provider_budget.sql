-- 0021: one provider budget for the whole deployment (issue 52, item 2). Every Fireworks
-- call of every process (the tick, jobs-api's pre-flight at enqueue, POST /jobs:validate, the
-- MCP tools through jobs-api) takes a slot of FIREWORKS_RPM here first; a 429 any of them
-- meets holds them all; what a lookup learned is kept for the others for a short while.
-- sql/procedures/190_provider_budget.sql keeps them; docs/operations.md (Provider budget)
-- says how to size the shares.

-- The one row every take locks: it serializes the takes of every process, and holds the
-- provider's last Retry-After for all of them.
CREATE TABLE sftq.provider_budget (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    hold_until  timestamptz
);
INSERT INTO sftq.provider_budget (id) VALUES (true);
COMMENT ON TABLE sftq.provider_budget IS
    'One row: the deployment''s provider budget. hold_until: when the last 429''s Retry-After (met by any process) ends; no call is sent before. Every sftq.provider_budget_take locks this row.';

-- The slots taken, counted per second: by class (the tick''s calls, or users'' lookups) and,
-- for lookups, per user. A window of FIREWORKS_RPM is the sum of its last 62 seconds.
CREATE TABLE sftq.provider_budget_use (
    second    bigint  NOT NULL,
    class     text    NOT NULL CHECK (class IN ('tick', 'lookup')),
    user_key  bytea   NOT NULL DEFAULT '\x'::bytea,
    n         integer NOT NULL CHECK (n > 0),
    PRIMARY KEY (second, class, user_key)
);
COMMENT ON TABLE sftq.provider_budget_use IS
    'Provider calls granted, per Unix second, class (tick: the scheduler''s and cancels; lookup: pre-flight, validate, MCP) and user (for lookups the user''s id as 8 bytes, int8send, whichever of their keys called; empty for the tick). Rows older than the window are deleted by the takes.';

-- What a lookup learned of a dataset, model or evaluator, for every process.
CREATE TABLE sftq.provider_lookups (
    name        text PRIMARY KEY,
    verdict     text NOT NULL CHECK (verdict IN ('missing', 'doubtful', 'ok')),
    detail      text NOT NULL DEFAULT '',
    checked_at  timestamptz NOT NULL
);
COMMENT ON TABLE sftq.provider_lookups IS
    'The newest answer of the provider about one resource (full name): missing (404), doubtful (exists but not usable, or unreadable by our key: detail says why) or ok (detail: its state). Read back within SFTQ_PROVIDER_LOOKUP_TTL_SECONDS only.';
