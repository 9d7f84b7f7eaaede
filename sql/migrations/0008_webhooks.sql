-- 0008: webhooks. Users register HTTPS endpoints; every job event a user's endpoint subscribes
-- to gets a delivery row written in the SAME transaction as the event (a transactional
-- outbox: a crash after the commit loses nothing), which deliverers claim, sign and send.
-- The logic lives in sql/procedures/120_webhooks.sql.

-- How many endpoints the user has (enabled or not). The outbox trigger reads it before
-- anything else, so an event of a user without endpoints costs one lookup and no more;
-- it is also the cap (10 per user) that POST /webhooks enforces under the user row lock.
ALTER TABLE sftq.users
    ADD COLUMN webhook_count integer NOT NULL DEFAULT 0
        CHECK (webhook_count BETWEEN 0 AND 10);
COMMENT ON COLUMN sftq.users.webhook_count IS
    'Number of this user''s webhook endpoints (at most 10), kept by the webhook procedures; 0 lets the outbox trigger skip the user''s events at once.';

CREATE TABLE sftq.webhook_endpoints (
    id               uuid PRIMARY KEY,
    user_id          bigint NOT NULL REFERENCES sftq.users (id),
    url              text NOT NULL CHECK (char_length(url) BETWEEN 8 AND 2048),
    events           text[] NOT NULL CHECK (cardinality(events) BETWEEN 1 AND 6),
    description      text CHECK (char_length(description) <= 500),
    -- The signing secret, sealed by the server (AES-256-GCM under SFTQ_WEBHOOKS_KEY, a key
    -- that is not in the database) and never shown again after POST /webhooks answered.
    secret_sealed    text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    disabled_at      timestamptz,
    disabled_reason  text,
    CHECK ((disabled_at IS NULL) = (disabled_reason IS NULL))
);
COMMENT ON TABLE sftq.webhook_endpoints IS
    'Users'' webhook endpoints. secret_sealed is encrypted by the functions with a key kept outside the database; no role but the owner can read this table, and no view shows the secret.';
COMMENT ON COLUMN sftq.webhook_endpoints.events IS
    'Subscribed types: job.queued, job.admitted, job.succeeded, job.failed, job.cancelled, or job.* for all.';
COMMENT ON COLUMN sftq.webhook_endpoints.disabled_reason IS
    'Why deliveries stopped (410 Gone, or retries exhausted); NULL while enabled.';
CREATE INDEX webhook_endpoints_user_idx ON sftq.webhook_endpoints (user_id, created_at, id);

-- One row per (event, endpoint): the outbox. No foreign keys on purpose: the outbox trigger
-- runs inside every job transaction, and a foreign key check against an endpoint deleted a
-- moment earlier would fail the job's own transaction. Rows of a deleted endpoint are never
-- claimed (the claim joins the endpoint) and are pruned.
CREATE TABLE sftq.webhook_deliveries (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id      uuid NOT NULL,
    webhook_id       text NOT NULL UNIQUE,
    event_id         bigint,
    job_id           uuid,
    type             text NOT NULL,
    body             text NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'succeeded', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    lease_token      uuid,
    completed_at     timestamptz,
    last_status      integer,
    last_error       text,
    CHECK ((state = 'pending') = (completed_at IS NULL))
);
COMMENT ON TABLE sftq.webhook_deliveries IS
    'The webhook outbox: one row per (job event, subscribed endpoint), written in the event''s transaction, and one per test delivery. Deliverers claim due rows with FOR UPDATE SKIP LOCKED.';
COMMENT ON COLUMN sftq.webhook_deliveries.webhook_id IS
    'The webhook-id header: the same on every attempt, so receivers can deduplicate.';
COMMENT ON COLUMN sftq.webhook_deliveries.body IS
    'The exact JSON sent and signed: {"type", "timestamp" (the event time), "data" (the job record at the event)}.';
COMMENT ON COLUMN sftq.webhook_deliveries.next_attempt_at IS
    'When the row is due. While a deliverer holds it (lease_token set) it is the lease expiry: a deliverer that dies leaves the row due again then.';
COMMENT ON COLUMN sftq.webhook_deliveries.attempts IS 'Attempts recorded so far.';
-- Due rows in order; the only index the claim walks.
CREATE INDEX webhook_deliveries_due_idx ON sftq.webhook_deliveries (next_attempt_at, id)
    WHERE state = 'pending';
-- Rows a deliverer holds right now, per endpoint (the per-endpoint concurrency bound).
CREATE INDEX webhook_deliveries_leased_idx ON sftq.webhook_deliveries (endpoint_id)
    WHERE lease_token IS NOT NULL;
CREATE INDEX webhook_deliveries_endpoint_idx ON sftq.webhook_deliveries (endpoint_id, id);
CREATE INDEX webhook_deliveries_completed_idx ON sftq.webhook_deliveries (completed_at)
    WHERE state <> 'pending';

CREATE TABLE sftq.webhook_attempts (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id    bigint NOT NULL,
    endpoint_id    uuid NOT NULL,
    attempt        integer NOT NULL,
    attempted_at   timestamptz NOT NULL,
    status_code    integer,
    duration_ms    integer,
    error          text,
    outcome        text NOT NULL CHECK (outcome IN ('succeeded', 'retrying', 'failed')),
    next_retry_at  timestamptz
);
COMMENT ON TABLE sftq.webhook_attempts IS
    'One row per delivery attempt: what the receiver answered (status_code, or error when there was no answer), how long it took, and what happens next.';
CREATE INDEX webhook_attempts_endpoint_idx ON sftq.webhook_attempts (endpoint_id, id DESC);
CREATE INDEX webhook_attempts_at_idx ON sftq.webhook_attempts (attempted_at);
