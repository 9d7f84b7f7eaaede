"""The one database module every function shares: a small lazy pool and every SQL string.

Python calls procedures; it never builds SQL for a state change. Each statement below
has a one-line purpose. Connections are made for a transaction-mode pooler: autocommit
(each call is its own transaction), no server-side prepared statements, no session state.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from sftq_server.core.errors import SftqError, Unavailable, from_db_error
from sftq_server.db import arrays as pg_arrays  # noqa: F401 - registers its dumpers before any connection is made

# --- jobs-api: one call per request -------------------------------------------------
# Authenticate + enqueue; the 201 body, whether it replayed an idempotency key, the id.
API_ENQUEUE = (
    "SELECT body::text, replayed, job_id FROM sftq.api_enqueue(%s, %s, %s::jsonb, %s, %s, %s)"
)
# Authenticate + one keyset page of the caller's jobs and the next cursor.
API_LIST_JOBS = "SELECT body::text, next_cursor FROM sftq.api_list_jobs(%s, %s, %s, %s, %s)"
# Authenticate + one job of the caller's.
API_GET_JOB = "SELECT sftq.api_get_job(%s, %s)::text"
# Authenticate + cancel: the job as it now is, and which provider call (if any) finishes it.
API_CANCEL_JOB = (
    "SELECT body::text, action, kind, fireworks_job_name FROM sftq.api_cancel_job(%s, %s)"
)
# Authenticate + finish a PROGRESS cancel once the provider confirmed the stop.
API_COMPLETE_CANCEL = "SELECT sftq.api_complete_cancel(%s, %s)::text"
# Authenticate + the three analytics bodies.
API_QUEUE_CONTEXT = "SELECT sftq.api_queue_context(%s)::text"
API_SUMMARY = "SELECT sftq.api_summary(%s)::text"
API_JOB_ANALYTICS = "SELECT sftq.api_job_analytics(%s, %s)::text"
# The database answers (health probe).
API_HEALTH = "SELECT sftq.api_health()::text"
# GET /metrics: every figure the scrape serves, as JSON (sql/procedures/170_metrics.sql).
METRICS = "SELECT sftq.metrics()::text"

# --- the live stream (stream.py): one open per stream, one poll per instance ------
# Authenticate, check the job, validate Last-Event-ID, register the watcher; a meta row, then
# the snapshot or the first page after Last-Event-ID.
STREAM_OPEN = (
    "SELECT frame, id, txid, job_id, user_id, state, data "
    "FROM sftq.api_stream_open(%s, %s, %s, %s, %s::xid8, %s, %s)"
)
# The next page of a stream's backlog (for a user this instance registered).
STREAM_BACKLOG = (
    "SELECT frame, id, txid, job_id, user_id, state, data "
    "FROM sftq.stream_backlog(%s, %s, %s, %s::xid8, %s, %s::xid8, %s)"
)
# The instance's poll: new frames of its watched users; with key hashes, refresh the watchers.
STREAM_POLL = (
    "SELECT frame, id, txid, job_id, user_id, state, data "
    "FROM sftq.stream_poll(%s, %s::xid8, %s, %s, %s, %s, %s)"
)

# --- visibility: history, waiting reasons, estimates, capacity ------------------------
# Authenticate + the queue context with waiting reasons and estimates (tick interval and
# usage grace in seconds, from the settings).
API_QUEUE_CONTEXT_AT = (
    "SELECT sftq.api_queue_context(%s, make_interval(secs => %s), make_interval(secs => %s))::text"
)
# Authenticate + one job's analytics with its waiting reason or finish estimate.
API_JOB_ANALYTICS_AT = (
    "SELECT sftq.api_job_analytics(%s, %s, make_interval(secs => %s),"
    " make_interval(secs => %s))::text"
)
# Authenticate + one page of a job's events (limit, after an event id).
API_JOB_EVENTS = "SELECT sftq.api_job_events(%s, %s, %s, %s)::text"
# Authenticate + the queue's capacity (show users, tick interval, usage grace, quota id).
API_CAPACITY = (
    "SELECT sftq.api_capacity(%s, %s, make_interval(secs => %s), make_interval(secs => %s),"
    " %s)::text"
)

# --- the dashboard's routes (api_dashboard.py, sql/procedures/150_dashboard.sql) ----------
# Authenticate + the head of the queue, anonymised (limit, tick interval, usage grace).
API_PUBLIC_QUEUE = (
    "SELECT sftq.api_public_queue(%s, %s, make_interval(secs => %s),"
    " make_interval(secs => %s))::text"
)
# Authenticate + one of the caller's jobs' payloads, secrets redacted.
API_JOB_PAYLOAD = "SELECT sftq.api_job_payload(%s, %s)::text"
# Authenticate + the caller's waits and run times over `days` days, and success by kind.
API_JOB_HISTORY = "SELECT sftq.api_job_history(%s, %s)::text"
# Authenticate + GPUs in use over a window ('24h' or '7d').
API_GPU_HISTORY = "SELECT sftq.api_gpu_history(%s, %s)::text"

# --- scheduler ---------------------------------------------------------------------
# Take the tick lease; NULL when another tick holds it.
TICK_BEGIN = "SELECT sftq.tick_begin(%s, make_interval(secs => %s))"
# Extend the lease of a running tick.
TICK_RENEW = "SELECT sftq.tick_renew(%s, make_interval(secs => %s))"
# Record a tick's result and release the lease.
TICK_FINISH = "SELECT sftq.tick_finish(%s, %s::jsonb)"
# Every PROGRESS job with what the tick needs to submit, reconcile or finish a cancel.
SCHEDULER_WORK = "SELECT * FROM sftq.scheduler_work()"
# Compute the budget from the quota and admit, under the exclusive admission gate.
ADMIT_FOR_QUOTA = "SELECT sftq.admit_for_quota(%s::int, %s::numeric, make_interval(secs => %s))"
# Which admitted, not yet created jobs still fit a fresh quota reading (a prefix, in order).
CREATES_THAT_FIT = ("SELECT job_id, gpu_count, free_before, fits"
                    " FROM sftq.creates_that_fit(%s::int, %s::numeric, make_interval(secs => %s))")
# The provider accepted (or already had) the job; answers 'stop' if a cancel came meanwhile.
RECORD_SUBMITTED = "SELECT sftq.record_submitted(%s, %s, %s, %s)"
# A create failed: transient (retry next tick) or rejected (FAIL with the body verbatim).
RECORD_SUBMIT_ERROR = "SELECT sftq.record_submit_error(%s, %s, %s)"
# The provider's state for one of our PROGRESS jobs (NOT_FOUND for a 404).
RECORD_PROVIDER_STATE = "SELECT sftq.record_provider_state(%s, %s, %s)"
# The provider confirmed a stop: PROGRESS -> CANCELLED.
COMPLETE_CANCEL = "SELECT sftq.complete_cancel(%s, %s, %s::jsonb)"

# --- webhooks (sql/procedures/120_webhooks.sql) --------------------------------------
# Authenticate and check the cap, before the URL is resolved (strangers get no DNS lookups).
API_WEBHOOK_PRECHECK = "SELECT sftq.api_webhook_precheck(%s)"
# Authenticate + add an endpoint; its JSON without the secret.
API_WEBHOOK_CREATE = "SELECT sftq.api_webhook_create(%s, %s, %s, %s::text[], %s, %s)::text"
# Authenticate + the caller's endpoints, newest first.
API_WEBHOOK_LIST = "SELECT sftq.api_webhook_list(%s)::text"
# Authenticate + one of the caller's endpoints.
API_WEBHOOK_GET = "SELECT sftq.api_webhook_get(%s, %s)::text"
# Authenticate + delete one of the caller's endpoints.
API_WEBHOOK_DELETE = "SELECT sftq.api_webhook_delete(%s, %s)"
# Authenticate + queue a webhook.test delivery; the delivery as GET .../deliveries shows it.
API_WEBHOOK_TEST = "SELECT sftq.api_webhook_test(%s, %s)::text"
# Authenticate + an endpoint's recent attempts, newest first.
API_WEBHOOK_DELIVERIES = "SELECT sftq.api_webhook_deliveries(%s, %s, %s)::text"
# Deliverers: lease due deliveries (limit, per-endpoint limit, lease seconds).
WEBHOOK_CLAIM = (
    "SELECT delivery_id, lease_token, endpoint_id, url, secret_sealed, webhook_id, type, body,"
    " attempt FROM sftq.webhook_claim(%s, %s, make_interval(secs => %s))"
)
# Record one attempt (status or error, duration, when) and learn what follows.
WEBHOOK_RECORD_ATTEMPT = (
    "SELECT sftq.webhook_record_attempt(%s, %s, %s, %s, %s, to_timestamp(%s))"
)
# Drop attempts and finished deliveries older than N days.
WEBHOOK_PRUNE = "SELECT sftq.webhook_prune(now() - make_interval(days => %s))"
# --- tick: bounded submissions, provider progress, queue timeouts, the usage reading ---
# A failed create: transient (backoff; answers whether attempts or time ran out) or rejected.
RECORD_SUBMIT_FAILURE = (
    "SELECT sftq.record_submit_failure(%s, %s, %s, %s, %s::float8, %s::float8)"
)
# An admitted job the tick did not try to create: the reason, no attempt counted.
RECORD_SUBMIT_SKIPPED = "SELECT sftq.record_submit_skipped(%s, %s)"
# No provider job exists under the id after the last attempt: PROGRESS -> FAIL (retryable).
GIVE_UP_SUBMISSION = "SELECT sftq.give_up_submission(%s)"
# Pre-flight by the tick (sql/procedures/180_preflight.sql): the waiting jobs still to check,
# then what was learned of each.
PREFLIGHT_WORK = "SELECT * FROM sftq.preflight_work(%s, make_interval(secs => %s))"
RECORD_PREFLIGHT = "SELECT sftq.record_preflight(%s, %s, %s::jsonb, %s::jsonb)"
FAIL_PREFLIGHT = "SELECT sftq.fail_preflight(%s, %s::jsonb, %s, %s::jsonb)"
# Per-job fault isolation (sql/procedures/185_job_faults.sql): record one job's fault (and
# end the job at the limit); the jobs with a run of faults going; end those runs.
RECORD_JOB_FAULT = "SELECT sftq.record_job_fault(%s, %s, %s, %s, %s, %s)"
FAULTED_JOBS = "SELECT sftq.faulted_jobs()"
CLEAR_JOB_FAULTS = "SELECT sftq.clear_job_faults(%s::uuid[])"
# The end of a Retry-After an earlier tick was given (NULL: none running).
PROVIDER_BACKOFF_UNTIL = "SELECT sftq.provider_backoff_until()"
# Event-driven admission (sql/procedures/210_wake.sql): what a waker polls (ages of the
# pending wake and of the last tick, lease free, any job running at the provider), and the
# tick taking a pending wake just before it admits ({requested_at, requested_by, waited_ms}).
ADMISSION_WAKE_STATE = "SELECT * FROM sftq.admission_wake_state()"
ADMISSION_WAKE_TAKE = "SELECT sftq.admission_wake_take()"
# What the provider says of one PROGRESS job: state, message, status code, progress, cost.
OBSERVE_PROVIDER_JOB = "SELECT sftq.observe_provider_job(%s, %s::jsonb)"
# Two quota readings around a tick's creates: mark our jobs the provider's usage now counts.
RECORD_USAGE_READING = (
    "SELECT sftq.record_usage_reading(%s::numeric, %s::numeric, make_interval(secs => %s))"
)
# Fold the queue's stretch counts and count the jobs enqueued since (once a tick).
QUEUE_SEAL = "SELECT sftq.queue_seal()"
# Cancel QUEUED jobs whose queue timeout ran out; answers how many.
EXPIRE_QUEUED = "SELECT sftq.expire_queued()"
# Run limits (issue 53): record the cancels of jobs past their bound (run_timeout) and the
# stalled events; a row (job_id, kind, fireworks_job_name, action) per job touched.
RUN_LIMITS = "SELECT job_id, kind, fireworks_job_name, action FROM sftq.run_limits(%s, %s)"

# --- jobs-api: retry and queue timeouts -----------------------------------------------
# Authenticate + enqueue with the caller's queue timeout (or the operator's default).
API_SUBMIT = (
    "SELECT body::text, replayed, job_id "
    "FROM sftq.api_submit(%s, %s, %s::jsonb, %s, %s, %s, %s, %s)"
)
# Authenticate + enqueue several requests in one transaction (group commit); a row each.
# The arrays go in binary (%b): for a text array psycopg writes the literal in Python, and
# escapes every '"' of each JSON payload with a regular expression substitution, about a
# sixth of a web worker's Python time per request (docs/performance.md).
API_SUBMIT_MANY = (
    "SELECT ord, body, replayed, job_id, err_state, err_message, err_detail "
    "FROM sftq.api_submit_many(%b::bytea[], %b::text[], %b::jsonb[], %b::text[], %b::int[], "
    "%b::text[], %b::int[], %s::int)"
)
# POST /jobs with "after" or "max_run_seconds" (issue 53): one request, its own transaction.
API_SUBMIT_JOB = (
    "SELECT body::text, replayed, job_id "
    "FROM sftq.api_submit_job(%s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s::text[], %s)"
)
# Authenticate + retry one of the caller's FAIL or CANCELLED jobs as a new job.
API_RETRY_JOB = "SELECT body::text, replayed, job_id FROM sftq.api_retry_job(%s, %s, %s, %s)"
# After POST /jobs: what its pre-flight learned (warnings, cost, whether the provider answered).
API_RECORD_PREFLIGHT = "SELECT sftq.api_record_preflight(%s, %s, %s, %s::jsonb, %s::jsonb)"

# --- per-user limits (sql/procedures/195_user_limits.sql) ---------------------------
# Authenticate + count one request against the caller's rate (POST /jobs:validate, MCP calls).
API_RATE_TAKE = "SELECT sftq.api_rate_take(%s)"
# Authenticate + record an open stream or wait (lease id, kind, ttl): SQ4SL over the limit.
API_LEASE_TAKE = "SELECT sftq.api_lease_take(%s, %s, %s, %s)"
# A process's open streams and waits, renewed (ids, ttl) / freed (ids).
API_LEASES_RENEW = "SELECT sftq.api_leases_renew(%s::uuid[], %s)"
API_LEASES_RELEASE = "SELECT sftq.api_leases_release(%s::uuid[])"
# The operator's: set a user's limits (or the defaults: name NULL); list them.
SET_USER_LIMITS = "SELECT sftq.set_user_limits(%s, %s, %s, %s, %s, %s, %s)"
LIST_USER_LIMITS = "SELECT * FROM sftq.user_limits_list()"

# --- admin -------------------------------------------------------------------------
CREATE_USER = "SELECT sftq.create_user(%s)"
ISSUE_KEY = "SELECT key, prefix FROM sftq.issue_key(%s)"
REVOKE_KEY = "SELECT sftq.revoke_key(%s)"
LIST_USERS = "SELECT * FROM sftq.list_users()"
SET_CAP = "SELECT sftq.set_cap(%s, %s)"
USER_EXISTS = "SELECT EXISTS (SELECT 1 FROM sftq.users WHERE name = %s)"
# Whether a key (by its SHA-256) still authenticates: the dev stack reuses a stored demo key.
KEY_IS_ACTIVE = "SELECT sftq.authenticate(%s) IS NOT NULL"

# --- jobs-api: job id prefixes (ux) -------------------------------------------------
# Authenticate + the caller's jobs whose id starts with a hex prefix (GET /jobs?id_prefix=).
API_JOBS_BY_ID_PREFIX = "SELECT sftq.api_jobs_by_id_prefix(%s, %s, %s, %s, %s)::text"

# --- admin: disabling users (ux) ---------------------------------------------------
# Disable (true) or re-enable (false) a user; keys refused and queued jobs held while disabled.
SET_USER_DISABLED = "SELECT sftq.set_user_disabled(%s, %s)"
# A user's running and queued job counts and when they were disabled (NULL: enabled).
USER_STATUS = "SELECT running_count, queued_count, disabled_at FROM sftq.users WHERE name = %s"


# --- the deployment's provider budget (sql/procedures/190_provider_budget.sql) ---------
# One call's slot (and what earlier calls answered): {"ok": ...} as JSON text.
PROVIDER_BUDGET_TAKE = (
    "SELECT sftq.provider_budget_take(%s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s)::text"
)
# A 429 with this Retry-After: hold every process's calls.
PROVIDER_BUDGET_HOLD = "SELECT sftq.provider_budget_hold(%s, %s::jsonb, %s::jsonb)"
# What a process has not reported with a take yet: call counts and lookups.
PROVIDER_BUDGET_FLUSH = "SELECT sftq.provider_budget_flush(%s::jsonb, %s::jsonb)"
# What any process learned of these resources within the TTL: {name: [verdict, detail]}.
PROVIDER_LOOKUPS_GET = "SELECT sftq.provider_lookups_get(%s::text[], %s)::text"
# The provider calls granted in the budget's window, all, the tick's and lookups' (190): early
# ticks and reconcile passes go only while the tick's reserve has room for the periodic tick.
PROVIDER_BUDGET_USAGE = "SELECT total, tick, lookup FROM sftq.provider_budget_usage()"

def connect_kwargs() -> dict[str, Any]:
    """Connection options that work behind a transaction-mode pooler. TCP keepalives make a
    database that vanished without closing the connection show up as an error in seconds
    instead of a request that hangs."""
    return {
        "autocommit": True,
        "prepare_threshold": None,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }


class Database:
    """A lazily opened pool. Database trouble surfaces as Unavailable (HTTP 503), never a hang."""

    def __init__(self, url: str, *, max_size: int = 4, timeout: float = 5.0) -> None:
        self.url = url
        self.timeout = timeout
        self._max_size = max_size
        self._pool: ConnectionPool | None = None
        self._lock = threading.Lock()

    def _get_pool(self) -> ConnectionPool:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    kwargs = connect_kwargs() | {"connect_timeout": max(1, int(self.timeout))}
                    pool = ConnectionPool(
                        self.url,
                        min_size=1,
                        max_size=self._max_size,
                        kwargs=kwargs,
                        timeout=self.timeout,
                        open=False,
                        name="sftq",
                        # Keep retrying a dead database so the function recovers by itself.
                        reconnect_timeout=3600.0,
                    )
                    pool.open(wait=False)
                    self._pool = pool
        return self._pool

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            with self._get_pool().connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise unreachable() from exc
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def fetchone(self, query: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        with self.connection() as conn:
            return conn.execute(query, params).fetchone()

    def fetchall(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            return conn.execute(query, params).fetchall()

    def scalar(self, query: str, params: Sequence[Any] = ()) -> Any:
        row = self.fetchone(query, params)
        return None if row is None else row[0]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def unreachable() -> Unavailable:
    return Unavailable("the database is not reachable right now; retry shortly",
                       headers={"Retry-After": "5"})


def translate(exc: psycopg.Error) -> SftqError:
    """A psycopg error as a typed error: a procedure's coded error, or Unavailable."""
    typed = from_db_error(exc)
    if typed is not None:
        return typed
    if isinstance(exc, psycopg.OperationalError):
        return unreachable()
    return SftqError("internal database error")


_databases: dict[str, Database] = {}
_registry_lock = threading.Lock()


def get_database(url: str, *, max_size: int = 4, timeout: float = 5.0) -> Database:
    """One pool per process and URL, shared by every function served from it."""
    with _registry_lock:
        db = _databases.get(url)
        if db is None:
            db = _databases[url] = Database(url, max_size=max_size, timeout=timeout)
        return db
