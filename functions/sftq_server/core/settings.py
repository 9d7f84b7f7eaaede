"""Settings, read once from the environment into one typed object."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache

# A queued job may wait at most 30 days when it (or the operator) sets a queue timeout.
MAX_QUEUE_TIMEOUT_SECONDS = 2_592_000


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def _bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, not {raw!r}")


def _queue_timeout(name: str) -> int | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    value = int(raw)
    if not 1 <= value <= MAX_QUEUE_TIMEOUT_SECONDS:
        raise ValueError(f"{name} must be from 1 to {MAX_QUEUE_TIMEOUT_SECONDS} seconds")
    return value


def _max_run(name: str) -> int | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    value = int(raw)
    if not 60 <= value <= MAX_QUEUE_TIMEOUT_SECONDS:
        raise ValueError(f"{name} must be from 60 to {MAX_QUEUE_TIMEOUT_SECONDS} seconds")
    return value


def _stall(name: str) -> int:
    raw = os.environ.get(name)
    if not raw:
        return 7200
    value = int(raw)
    if value < 60:
        raise ValueError(f"{name} must be 60 seconds or more")
    return value


@dataclass(frozen=True)
class StreamSettings:
    """The live stream's knobs: SFTQ_STREAM_* (docs/operations.md lists them)."""

    heartbeat_seconds: float = 15.0
    max_seconds: float = 3300.0
    poll_ms: float = 1000.0
    # How often the poll also re-registers the instance's keys (and learns revoked ones).
    refresh_seconds: float = 30.0
    # How long a registration outlives an instance that stopped refreshing it.
    watch_ttl_seconds: int = 120
    # Rows one query scans at most (a poll, a page of backlog).
    page_rows: int = 2000
    # Chunks queued for a stream that does not read them: past this it gets `reconnect`
    # (it resumes from the database with Last-Event-ID instead of growing our memory).
    max_queued: int = 5000

    @classmethod
    def from_env(cls) -> StreamSettings:
        return cls(
            heartbeat_seconds=_float("SFTQ_STREAM_HEARTBEAT_SECONDS", 15.0),
            max_seconds=_float("SFTQ_STREAM_MAX_SECONDS", 3300.0),
            poll_ms=_float("SFTQ_STREAM_POLL_MS", 1000.0),
        )


@dataclass(frozen=True)
class Settings:
    database_url: str
    # Pool per process: functions are small and many; a few connections each is plenty.
    db_pool_max: int = 4
    # How long a request waits for a connection before answering 503 (never a hang).
    db_timeout_seconds: float = 5.0
    max_body_bytes: int = 1_048_576
    tick_secret: str = ""
    # A bearer for GET /metrics alone (besides the tick secret): a scraper need not hold the
    # secret that drives the scheduler.
    metrics_token: str = ""
    fireworks_base_url: str = "https://api.fireworks.ai"
    fireworks_api_key: str = ""
    fireworks_account_id: str = ""
    fireworks_quota_id: str = "training-h200-count"
    fireworks_timeout_seconds: float = 10.0
    # The account's requests a minute (10 to 6,000): every process's calls share it through
    # the provider budget in PostgreSQL; a 429's Retry-After holds every call of every process.
    fireworks_rpm: int = 6000
    # How long after a create the provider's usage may still not count the job.
    usage_grace_seconds: float = 300.0
    # A tick that dies keeps the lease this long at most.
    tick_lease_seconds: float = 120.0
    # A create that keeps failing: give up after this many attempts or this long since
    # admission, whichever comes first; attempt n waits min(base x 2^(n-1), 10 min).
    submit_max_attempts: int = 8
    submit_max_seconds: float = 3600.0
    submit_backoff_seconds: float = 5.0
    # The operator's default queue timeout for jobs submitted without one (None: no limit).
    queue_timeout_seconds: int | None = None
    # When a kind's list call fails, GET this many of its least recently checked jobs.
    reconcile_get_limit: int = 20
    # A job whose handling by the tick fails the same way (an error no phase expected) on
    # this many ticks in a row ends FAIL permanent with the error (0: never; each fault is
    # still recorded on the job as a tick_error event). docs/scheduling.md, Faults.
    job_fault_limit: int = 3
    # Issue 53: the run-time bound of a job submitted without max_run_seconds (None: no
    # bound), and how long a running job's provider progress may stand still before it is
    # flagged stalled (one event; it is not cancelled).
    max_run_seconds: int | None = None
    stall_seconds: int = 7200
    # Set (SFTQ_DEV_STACK=1) only by a local development stack: scheduler-tick then accepts a
    # tick secret shorter than 32 characters. Everywhere else a short one stops it starting.
    dev_stack: bool = False
    # Webhooks (docs/webhooks.md). The key seals endpoints' signing secrets at rest; without
    # it, production mode refuses to create endpoints. allow_private lets deliveries go to
    # loopback and private addresses and over http:// (`sftq dev` sets it).
    webhooks_key: str = field(default="", repr=False)
    webhooks_allow_private: bool = False
    # How often the scheduler ticks. The API judges a stalled scheduler (no tick for 3 of
    # these) and places estimates on the tick grid with it; `sftq dev` passes its
    # --tick-interval here.
    tick_interval_seconds: float = 30.0
    # GET /capacity names every user with work; false folds the others into one row.
    capacity_show_users: bool = True
    # Group commit: at most this many POST /jobs requests that one process received together
    # share one transaction (1: every request alone).
    group_commit_max: int = 64
    # ... and a leader that finds fewer requests waiting than its process's recent batches
    # waits this long at most for them to arrive (0: never waits).
    group_commit_linger_ms: float = 1.0
    # The RSGI gateway (gateway_rsgi.py): threads per process for every request but POST /jobs.
    gateway_threads: int = 8
    # Analytics may read from a replica (ANALYTICS_DATABASE_URL); empty: the main database.
    analytics_database_url: str = ""
    # Pre-flight (docs/api.md): POST /jobs checks each fireworks_payload against Fireworks'
    # create schema for its kind and refuses a definite error with 400 (a request's own
    # "validate": "off" skips it). Read from SFTQ_PREFLIGHT even by Settings(...) made in code.
    preflight: bool = field(default_factory=lambda: _bool("SFTQ_PREFLIGHT", True))
    # ... and, with Fireworks credentials, asks Fireworks whether the payload's dataset,
    # evaluator and models exist (and an SFT job's cost) within this budget; what does not
    # answer in time is checked by the tick while the job waits (0: always by the tick).
    preflight_budget_ms: float = 2000.0
    # The tick checks at most this many waiting jobs a tick, the nearest the head first.
    preflight_tick_limit: int = 20
    # The Host values the MCP endpoint answers (SFTQ_MCP_ALLOWED_HOSTS, comma-separated
    # `host`, `host:port` or `host:*`; `*` turns the check off); empty: the loopback hosts on
    # any port and SUPABASE_URL's host (sftq_server.http.mcp.transport_security).
    mcp_allowed_hosts: str = ""
    # Event-driven admission (docs/scheduling.md): a submit, a cancel or a job's end wakes
    # admission within about a second instead of at the next periodic tick (off: only the
    # periodic tick admits, as before).
    event_admission: bool = True
    # ... and woken ticks start at least this far apart (a burst of submits coalesces into a
    # few ticks); wider when FIREWORKS_RPM leaves the tick too few requests for one a second.
    wake_min_gap_seconds: float = 1.0
    # Running jobs' provider state is read at least this often when the request budget
    # allows (a reconcile pass between periodic ticks; 0: only at the periodic tick).
    reconcile_freshness_seconds: float = 10.0
    # The deployment's one provider budget (docs/operations.md, Provider budget): every
    # process's Fireworks calls share FIREWORKS_RPM. This fraction of it is the tick's alone
    # (users' lookups never take it); each user's lookups may take this fraction of the rest;
    # what a lookup learned is reused by every process for this long.
    provider_tick_reserve: float = 0.5
    provider_user_share: float = 0.25
    provider_lookup_ttl_seconds: float = 60.0
    stream: StreamSettings = field(default_factory=StreamSettings)

    @property
    def analytics_url(self) -> str:
        """Where the read-only analytics function reads: the replica if set, else the primary."""
        return self.analytics_database_url or self.database_url

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database_url=os.environ.get("DATABASE_URL", ""),
            db_pool_max=_int("SFTQ_DB_POOL_MAX", 4),
            db_timeout_seconds=_float("SFTQ_DB_TIMEOUT_SECONDS", 5.0),
            max_body_bytes=_int("SFTQ_MAX_BODY_BYTES", 1_048_576),
            tick_secret=os.environ.get("SFTQ_TICK_SECRET", ""),
            metrics_token=os.environ.get("SFTQ_METRICS_TOKEN", ""),
            fireworks_base_url=os.environ.get("FIREWORKS_BASE_URL", "https://api.fireworks.ai"),
            fireworks_api_key=os.environ.get("FIREWORKS_API_KEY", ""),
            fireworks_account_id=os.environ.get("FIREWORKS_ACCOUNT_ID", ""),
            fireworks_quota_id=os.environ.get("FIREWORKS_QUOTA_ID", "training-h200-count"),
            fireworks_timeout_seconds=_float("FIREWORKS_TIMEOUT", 10.0),
            fireworks_rpm=_int("FIREWORKS_RPM", 6000),
            usage_grace_seconds=_float("SFTQ_USAGE_GRACE_SECONDS", 300.0),
            tick_lease_seconds=_float("SFTQ_TICK_LEASE_SECONDS", 120.0),
            submit_max_attempts=_int("SFTQ_SUBMIT_MAX_ATTEMPTS", 8),
            submit_max_seconds=_float("SFTQ_SUBMIT_MAX_SECONDS", 3600.0),
            submit_backoff_seconds=_float("SFTQ_SUBMIT_BACKOFF_SECONDS", 5.0),
            queue_timeout_seconds=_queue_timeout("SFTQ_QUEUE_TIMEOUT_SECONDS"),
            max_run_seconds=_max_run("SFTQ_MAX_RUN_SECONDS"),
            stall_seconds=_stall("SFTQ_STALL_SECONDS"),
            reconcile_get_limit=_int("SFTQ_RECONCILE_GET_LIMIT", 20),
            job_fault_limit=_int("SFTQ_JOB_FAULT_LIMIT", 3),
            dev_stack=os.environ.get("SFTQ_DEV_STACK", "") == "1",
            webhooks_key=os.environ.get("SFTQ_WEBHOOKS_KEY", ""),
            webhooks_allow_private=_bool("SFTQ_WEBHOOKS_ALLOW_PRIVATE"),
            tick_interval_seconds=_float("SFTQ_TICK_INTERVAL_SECONDS", 30.0),
            capacity_show_users=_bool("SFTQ_CAPACITY_SHOW_USERS", True),
            group_commit_max=_int("SFTQ_GROUP_COMMIT_MAX", 64),
            group_commit_linger_ms=_float("SFTQ_GROUP_COMMIT_LINGER_MS", 1.0),
            gateway_threads=_int("SFTQ_GATEWAY_THREADS", 8),
            analytics_database_url=os.environ.get("ANALYTICS_DATABASE_URL", ""),
            preflight=_bool("SFTQ_PREFLIGHT", True),
            preflight_budget_ms=_float("SFTQ_PREFLIGHT_BUDGET_MS", 2000.0),
            preflight_tick_limit=_int("SFTQ_PREFLIGHT_TICK_LIMIT", 20),
            mcp_allowed_hosts=os.environ.get("SFTQ_MCP_ALLOWED_HOSTS", ""),
            event_admission=_bool("SFTQ_EVENT_ADMISSION", True),
            wake_min_gap_seconds=_float("SFTQ_WAKE_MIN_GAP_SECONDS", 1.0),
            reconcile_freshness_seconds=_float("SFTQ_RECONCILE_FRESHNESS_SECONDS", 10.0),
            provider_tick_reserve=_float("SFTQ_PROVIDER_TICK_RESERVE", 0.5),
            provider_user_share=_float("SFTQ_PROVIDER_USER_SHARE", 0.25),
            provider_lookup_ttl_seconds=_float("SFTQ_PROVIDER_LOOKUP_TTL_SECONDS", 60.0),
            stream=StreamSettings.from_env(),
        )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings.from_env()
