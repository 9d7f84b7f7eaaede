-- 0001: the queue's tables. Forward-only: never edit this file once it has landed;
-- add a new numbered migration instead. Procedures and views live in their own
-- repeatable files (sql/procedures, sql/views) and are re-applied when they change.

CREATE SCHEMA IF NOT EXISTS sftq;
COMMENT ON SCHEMA sftq IS 'finetune-queue: fair FIFO admission queue in front of Fireworks fine-tuning';

-- ---------------------------------------------------------------------------
-- users and keys
-- ---------------------------------------------------------------------------
CREATE TABLE sftq.users (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name             text NOT NULL UNIQUE
                     CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$'),
    created_at       timestamptz NOT NULL DEFAULT now(),
    disabled_at      timestamptz,
    max_running      integer NOT NULL DEFAULT 1 CHECK (max_running BETWEEN 0 AND 1000),
    -- Admission bookkeeping, written only by the procedures in the same transaction
    -- as the job change that moves it (see sftq._transition and sftq.enqueue):
    running_count    integer NOT NULL DEFAULT 0 CHECK (running_count >= 0),
    queued_count     integer NOT NULL DEFAULT 0 CHECK (queued_count >= 0),
    head_job_id      uuid,
    head_created_at  timestamptz,
    CHECK ((head_job_id IS NULL) = (head_created_at IS NULL))
);
COMMENT ON TABLE sftq.users IS
    'People and agents that submit jobs. running_count, queued_count and head_* are kept by the procedures so admission never scans the queue.';
COMMENT ON COLUMN sftq.users.max_running IS 'Cap on PROGRESS jobs for this user (default 1).';
COMMENT ON COLUMN sftq.users.disabled_at IS 'When set, the user''s keys stop working and their queued jobs are not admitted.';
COMMENT ON COLUMN sftq.users.running_count IS 'Number of this user''s jobs in PROGRESS.';
COMMENT ON COLUMN sftq.users.queued_count IS 'Number of this user''s jobs in QUEUED.';
COMMENT ON COLUMN sftq.users.head_job_id IS 'This user''s earliest QUEUED job (by created_at, id), or NULL.';

-- Admission walks users by their head job: one entry per user with queued work,
-- so picking the next candidate never walks past the queued jobs of users at cap.
CREATE INDEX users_head_idx ON sftq.users (head_created_at, head_job_id)
    WHERE head_job_id IS NOT NULL;

CREATE TABLE sftq.api_keys (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id       bigint NOT NULL REFERENCES sftq.users (id),
    key_hash      bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    prefix        text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);
COMMENT ON TABLE sftq.api_keys IS
    'Bearer keys. Only the SHA-256 of a key is stored; prefix (e.g. sftq_AbCd1234) is for display and revocation.';
CREATE INDEX api_keys_user_idx ON sftq.api_keys (user_id);
CREATE INDEX api_keys_prefix_idx ON sftq.api_keys (prefix);

-- ---------------------------------------------------------------------------
-- jobs
-- ---------------------------------------------------------------------------
CREATE TABLE sftq.jobs (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id              bigint NOT NULL REFERENCES sftq.users (id),
    kind                 text NOT NULL CHECK (kind IN ('SFT', 'DPO', 'RFT')),
    state                text NOT NULL DEFAULT 'QUEUED'
                         CHECK (state IN ('QUEUED', 'PROGRESS', 'SUCCESS', 'FAIL', 'CANCELLED')),
    display_name         text CHECK (char_length(display_name) <= 256),
    gpu_count            integer NOT NULL DEFAULT 4 CHECK (gpu_count BETWEEN 1 AND 64),
    fireworks_payload    jsonb NOT NULL CHECK (jsonb_typeof(fireworks_payload) = 'object'),
    fireworks_job_name   text,
    created_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at           timestamptz,
    completed_at         timestamptz,
    error                text,
    cancel_requested_at  timestamptz,
    submitted_at         timestamptz,
    submit_attempts      integer NOT NULL DEFAULT 0,
    last_submit_error    text,
    provider_state       text,
    provider_state_at    timestamptz,
    idempotency_key      text CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    request_hash         bytea,
    CHECK ((state = 'QUEUED') = (started_at IS NULL) OR state = 'CANCELLED'),
    CHECK ((state IN ('SUCCESS', 'FAIL', 'CANCELLED')) = (completed_at IS NOT NULL))
);
COMMENT ON TABLE sftq.jobs IS 'One row per fine-tuning job submitted through the queue.';
COMMENT ON COLUMN sftq.jobs.state IS 'QUEUED -> PROGRESS -> SUCCESS | FAIL; QUEUED -> CANCELLED; PROGRESS -> CANCELLED.';
COMMENT ON COLUMN sftq.jobs.gpu_count IS 'GPUs the submitter expects the job to use (1..64); admission gates on it.';
COMMENT ON COLUMN sftq.jobs.fireworks_payload IS 'The Fireworks request body, passed through verbatim. May hold secrets: analysts read it redacted through sftq.analyst_jobs.';
COMMENT ON COLUMN sftq.jobs.fireworks_job_name IS 'accounts/{acct}/{collection}/{id} once the provider accepted the job.';
COMMENT ON COLUMN sftq.jobs.created_at IS 'Enqueue time; the FIFO order is (created_at, id).';
COMMENT ON COLUMN sftq.jobs.started_at IS 'Admission time (QUEUED -> PROGRESS), set by the transition.';
COMMENT ON COLUMN sftq.jobs.completed_at IS 'Time the job reached SUCCESS, FAIL or CANCELLED, set by the transition.';
COMMENT ON COLUMN sftq.jobs.error IS 'Why the job failed: the provider''s message, or its response body verbatim when it rejected the submission.';
COMMENT ON COLUMN sftq.jobs.cancel_requested_at IS 'When a user asked to cancel a PROGRESS job whose provider-side stop is not confirmed yet.';
COMMENT ON COLUMN sftq.jobs.submitted_at IS 'When the provider acknowledged the create (or we adopted an existing provider job).';
COMMENT ON COLUMN sftq.jobs.last_submit_error IS 'Last transient error while submitting; the scheduler retries with the same provider id.';
COMMENT ON COLUMN sftq.jobs.provider_state IS 'The provider''s last reported state (JOB_STATE_*), and provider_state_at when we saw it.';

-- Listing and per-user analytics, newest first, keyset-paged by (created_at, id).
CREATE INDEX jobs_user_created_idx ON sftq.jobs (user_id, created_at DESC, id DESC);
-- A user's next queued job when the head leaves the queue.
CREATE INDEX jobs_user_queued_idx ON sftq.jobs (user_id, created_at, id) WHERE state = 'QUEUED';
-- Global FIFO order of the queue: queue positions and the admission preview.
CREATE INDEX jobs_queued_idx ON sftq.jobs (created_at, id) WHERE state = 'QUEUED';
-- Running jobs: reconciliation, budget and GPUs in use.
CREATE INDEX jobs_progress_idx ON sftq.jobs (user_id) INCLUDE (gpu_count) WHERE state = 'PROGRESS';
CREATE UNIQUE INDEX jobs_idempotency_idx ON sftq.jobs (user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- ---------------------------------------------------------------------------
-- events and ticks
-- ---------------------------------------------------------------------------
CREATE TABLE sftq.job_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid NOT NULL REFERENCES sftq.jobs (id),
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor       text NOT NULL,
    event       text NOT NULL,
    from_state  text,
    to_state    text,
    detail      jsonb
);
COMMENT ON TABLE sftq.job_events IS
    'One row per state transition and per notable scheduler action (admitted, submitted, provider_state, cancel_requested, reconciled, ...).';
COMMENT ON COLUMN sftq.job_events.actor IS 'Who acted: user:<name>, scheduler, admin.';
COMMENT ON COLUMN sftq.job_events.detail IS 'What the actor saw, e.g. the GPU budget at admission or the provider state.';
CREATE INDEX job_events_job_idx ON sftq.job_events (job_id, id);
CREATE INDEX job_events_at_idx ON sftq.job_events (at);

CREATE TABLE sftq.scheduler_ticks (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz,
    holder       text NOT NULL,
    status       text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'ok', 'error', 'abandoned')),
    quota_limit  integer,
    quota_usage  numeric,
    budget       integer,
    admitted     integer NOT NULL DEFAULT 0,
    submitted    integer NOT NULL DEFAULT 0,
    reconciled   integer NOT NULL DEFAULT 0,
    cancelled    integer NOT NULL DEFAULT 0,
    failed       integer NOT NULL DEFAULT 0,
    errors       jsonb NOT NULL DEFAULT '[]',
    detail       jsonb
);
COMMENT ON TABLE sftq.scheduler_ticks IS 'One row per scheduler tick: what it saw (quota) and what it did.';
CREATE INDEX scheduler_ticks_started_idx ON sftq.scheduler_ticks (started_at DESC);

-- One row: who holds the tick lease and until when. A lease row rather than a
-- session advisory lock, because the database sits behind a transaction-mode pooler.
CREATE TABLE sftq.scheduler_lease (
    name        text PRIMARY KEY,
    holder      text,
    tick_id     bigint,
    expires_at  timestamptz
);
INSERT INTO sftq.scheduler_lease (name) VALUES ('tick');
COMMENT ON TABLE sftq.scheduler_lease IS 'The tick lease: one tick at a time; a lease left by a killed tick expires.';

-- ---------------------------------------------------------------------------
-- roles
-- ---------------------------------------------------------------------------
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sftq_analyst') THEN
        CREATE ROLE sftq_analyst NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sftq_api') THEN
        CREATE ROLE sftq_api NOLOGIN;
    END IF;
END
$$;
REVOKE ALL ON SCHEMA sftq FROM PUBLIC;
