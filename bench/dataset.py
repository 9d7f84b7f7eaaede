"""Bulk-loaded queues for the admission and analytics sections.

Enqueueing 10^6 jobs through sftq.enqueue would take longer than the whole benchmark, so
the rows go straight into sftq.jobs with one INSERT ... SELECT FROM generate_series, with
the secondary indexes dropped during the load and rebuilt after it (the definitions are
read back from the catalog, so they are exactly the migrated ones). The admission
bookkeeping that sftq.enqueue and sftq._transition keep in sftq.users (queued_count,
running_count, head_job_id, head_created_at) is then set by ONE UPDATE computed from the
loaded rows (`FIX_USERS`), which gives the same values the procedures would have kept.
Then VACUUM ANALYZE, as autovacuum would do on a table this size, and analyst_daily's rollup
of the days that are over (sftq.daily_rollup_rebuild) and the queue's stretch counts
(sftq.queue_buckets_rebuild), which the ticks would have kept.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

USERS = 1000
HEAVY_USERS = 10
# Queue timestamps: one job per millisecond from T0 on (history lies before T0).
T0 = "2025-06-01 00:00:00+00"

# A realistic Fireworks SFT body (~230 bytes), with a secret that the analyst view redacts.
PAYLOAD = ('{"dataset": "accounts/bench/datasets/chat-2025-06", '
           '"baseModel": "accounts/fireworks/models/llama-v3p1-8b-instruct", '
           '"epochs": 2, "learningRate": 0.0001, "loraRank": 16, '
           '"wandbConfig": {"enabled": true, "project": "sft", "apiKey": "wandb-secret"}}')

FIX_USERS = """
UPDATE sftq.users u
   SET queued_count    = COALESCE(s.queued, 0),
       running_count   = COALESCE(s.running, 0),
       head_job_id     = h.id,
       head_created_at = h.created_at
  FROM sftq.users u2
  LEFT JOIN (SELECT user_id,
                    count(*) FILTER (WHERE state = 'QUEUED')   AS queued,
                    count(*) FILTER (WHERE state = 'PROGRESS') AS running
               FROM sftq.jobs GROUP BY user_id) s ON s.user_id = u2.id
  LEFT JOIN LATERAL (SELECT j.id, j.created_at FROM sftq.jobs j
                      WHERE j.user_id = u2.id AND j.state = 'QUEUED'
                      ORDER BY j.created_at, j.id LIMIT 1) h ON true
 WHERE u.id = u2.id
"""

# QUEUED jobs, one a millisecond. "worst": the oldest half belongs to the HEAVY_USERS users
# (round robin), who also each run one PROGRESS job, so they are at their cap of 1 and
# admission must skip all their queued work; the younger half is spread round robin over
# the other 990 users. "uniform": every job round robin over all 1,000 users, nobody running.
QUEUED_SQL = """
INSERT INTO sftq.jobs (id, user_id, kind, state, display_name, gpu_count, fireworks_payload,
                       created_at)
SELECT gen_random_uuid(),
       CASE WHEN %(worst)s AND i < %(n)s / 2 THEN 1 + i %% %(heavy)s
            WHEN %(worst)s THEN %(heavy)s + 1 + i %% (%(users)s - %(heavy)s)
            ELSE 1 + i %% %(users)s END,
       (ARRAY['SFT', 'DPO', 'RFT'])[1 + i %% 3], 'QUEUED', 'bench-' || i, 4,
       %(payload)s::jsonb,
       %(t0)s::timestamptz + i * interval '1 millisecond'
  FROM generate_series(0, %(n)s - 1) AS i
"""

# `n` QUEUED jobs of one user at the very end of the queue (a user deep in it).
TAIL_SQL = """
INSERT INTO sftq.jobs (id, user_id, kind, state, display_name, gpu_count, fireworks_payload,
                       created_at)
SELECT gen_random_uuid(), %(user)s, 'SFT', 'QUEUED', 'tail-' || i, 4, %(payload)s::jsonb,
       %(t0)s::timestamptz + (%(offset)s + i) * interval '1 millisecond'
  FROM generate_series(0, %(n)s - 1) AS i
"""

# One PROGRESS job for each of users 1..k, started before the queue began.
RUNNING_SQL = """
INSERT INTO sftq.jobs (id, user_id, kind, state, display_name, gpu_count, fireworks_payload,
                       created_at, started_at, submitted_at, fireworks_job_name, provider_state)
SELECT gen_random_uuid(), u, 'SFT', 'PROGRESS', 'running-' || u, 4, %(payload)s::jsonb,
       %(t0)s::timestamptz - interval '2 hours', %(t0)s::timestamptz - interval '1 hour',
       %(t0)s::timestamptz - interval '1 hour',
       'accounts/bench/supervisedFineTuningJobs/run-' || u, 'JOB_STATE_RUNNING'
  FROM generate_series(1, %(k)s) AS u
"""

# Finished jobs over the 60 days before T0: 70%% SUCCESS, 15%% FAIL, 15%% CANCELLED (half of
# those cancelled while queued). User 1 owns 5%% of them (a heavy user); the rest round robin.
HISTORY_SQL = """
INSERT INTO sftq.jobs (id, user_id, kind, state, display_name, gpu_count, fireworks_payload,
                       created_at, started_at, completed_at, submitted_at, error,
                       fireworks_job_name, provider_state)
SELECT gen_random_uuid(), h.user_id, h.kind, h.state, 'hist-' || h.i, h.gpus,
       %(payload)s::jsonb, h.created,
       CASE WHEN h.started THEN h.created + interval '10 minutes' END,
       h.created + CASE WHEN h.started THEN interval '10 minutes' + h.run
                        ELSE interval '5 minutes' END,
       CASE WHEN h.started THEN h.created + interval '10 minutes' END,
       CASE WHEN h.state = 'FAIL' THEN 'training diverged (loss is NaN)' END,
       CASE WHEN h.started THEN 'accounts/bench/jobs/hist-' || h.i END,
       CASE h.state WHEN 'SUCCESS' THEN 'JOB_STATE_COMPLETED' WHEN 'FAIL' THEN 'JOB_STATE_FAILED'
                    ELSE NULL END
  FROM (SELECT i,
               CASE WHEN i %% 20 = 0 THEN 1 ELSE 2 + i %% (%(users)s - 1) END AS user_id,
               (ARRAY['SFT', 'DPO', 'RFT'])[1 + i %% 3] AS kind,
               CASE WHEN i %% 100 < 70 THEN 'SUCCESS' WHEN i %% 100 < 85 THEN 'FAIL'
                    ELSE 'CANCELLED' END AS state,
               NOT (i %% 100 >= 92) AS started,
               (ARRAY[1, 2, 4, 8])[1 + i %% 4] AS gpus,
               %(t0)s::timestamptz - interval '60 days'
                   + (i::float8 / %(n)s) * interval '60 days' AS created,
               (30 + i %% 240) * interval '1 minute' AS run
          FROM generate_series(0, %(n)s - 1) AS i) h
"""


def _secondary_indexes(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    rows = conn.execute(
        "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
        "WHERE indrelid = 'sftq.jobs'::regclass AND NOT indisprimary ORDER BY 1").fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def create_users(conn: psycopg.Connection[Any], n: int = USERS) -> None:
    conn.execute("INSERT INTO sftq.users (name) "
                 "SELECT format('u%%s', lpad(i::text, 4, '0')) FROM generate_series(1, %s) i",
                 (n,))


def load(conn: psycopg.Connection[Any], *, queued: int, layout: str = "uniform",
         running: int = 0, history: int = 0, tail_user: int | None = None,
         tail_jobs: int = 0) -> dict[str, float]:
    """Fill an empty migrated database; returns seconds per step.

    layout "worst" also makes users 1..HEAVY_USERS run one job each (at cap).
    tail_user gets `tail_jobs` QUEUED jobs at the very end of the queue (a user deep in it).
    """
    times: dict[str, float] = {}
    t = time.perf_counter()
    # No autovacuum during the load: an autoanalyze that starts on the fresh rows holds a
    # snapshot, and the VACUUM below could then not mark the pages all-visible.
    for table in ("sftq.jobs", "sftq.users"):
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    create_users(conn)
    indexes = _secondary_indexes(conn)
    for name, _ in indexes:
        conn.execute(f"DROP INDEX {name}")
    worst = layout == "worst"
    if worst:
        running = max(running, HEAVY_USERS)
    common = {"payload": PAYLOAD, "t0": T0, "users": USERS, "heavy": HEAVY_USERS}
    if history:
        conn.execute(HISTORY_SQL, common | {"n": history})
    if running:
        conn.execute(RUNNING_SQL, common | {"k": running})
    if queued:
        conn.execute(QUEUED_SQL, common | {"n": queued, "worst": worst})
    if tail_user is not None and tail_jobs:
        conn.execute(TAIL_SQL, common | {"n": tail_jobs, "user": tail_user, "offset": queued})
    times["insert_s"] = time.perf_counter() - t
    t = time.perf_counter()
    for _, definition in indexes:
        conn.execute(definition)
    times["index_s"] = time.perf_counter() - t
    t = time.perf_counter()
    conn.execute(FIX_USERS)
    times["fix_users_s"] = time.perf_counter() - t
    t = time.perf_counter()
    conn.execute("VACUUM ANALYZE sftq.jobs")
    conn.execute("VACUUM ANALYZE sftq.users")
    for table in ("sftq.jobs", "sftq.users"):
        conn.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
    times["vacuum_s"] = time.perf_counter() - t
    t = time.perf_counter()
    # Rows loaded by hand never went through the transitions that keep the rollup.
    conn.execute("SELECT sftq.daily_rollup_rebuild()")
    conn.execute("ANALYZE sftq.daily_rollup, sftq.daily_rollup_hours")
    times["rollup_s"] = time.perf_counter() - t
    t = time.perf_counter()
    # Nor did the enqueues that keep the queue's stretch counts (the ticks' seals would have).
    conn.execute("SELECT sftq.queue_buckets_rebuild()")
    conn.execute("VACUUM ANALYZE sftq.queue_buckets")
    times["queue_buckets_s"] = time.perf_counter() - t
    return times


def check_bookkeeping(conn: psycopg.Connection[Any]) -> None:
    """The one UPDATE must leave what the procedures would have kept (cheap spot check)."""
    bad = conn.execute("""
        SELECT count(*) FROM sftq.users u
         WHERE u.queued_count <> (SELECT count(*) FROM sftq.jobs j
                                   WHERE j.user_id = u.id AND j.state = 'QUEUED')
            OR u.head_job_id IS DISTINCT FROM (SELECT j.id FROM sftq.jobs j
                                   WHERE j.user_id = u.id AND j.state = 'QUEUED'
                                   ORDER BY j.created_at, j.id LIMIT 1)
            OR u.running_count <> (SELECT count(*) FROM sftq.jobs j
                                    WHERE j.user_id = u.id AND j.state = 'PROGRESS')
    """).fetchone()
    if bad and bad[0]:
        raise RuntimeError(f"bulk load left {bad[0]} users with wrong admission bookkeeping")
