"""Admission as the queue grows: 10^3 .. 10^6 QUEUED jobs over 1,000 users.

Two layouts per size (bench/dataset.py): "worst" (the oldest half of the queue belongs to 10
users at their cap of 1, so admission must skip all of it) and "uniform" (round robin, nobody
running). Measured:

- the candidate SELECT (the statement sftq._admit runs to pick the next job), alone;
- a whole admission transaction: BEGIN; sftq.admit(40) -> 10 jobs of 4 GPUs; ROLLBACK, sent
  as one round trip (so every repetition starts from the same queue), and the scheduler's
  sftq.admit_for_quota with a quota that leaves the same 40 GPUs;
- sftq.preview_admission(40, 100);
- the global figures (queue depth, running count, GPUs in use) as queue_context reads them.
"""

from __future__ import annotations

from typing import Any

import dataset
import psycopg
from common import Bench, summarize, time_calls

SECTION = "admission"

# The candidate query of sftq._admit, with an empty "already admitted" list (the first pick).
CANDIDATE = """
SELECT u.id, u.head_job_id
  FROM sftq.users u
 WHERE u.head_job_id IS NOT NULL
   AND u.disabled_at IS NULL
   AND u.running_count < u.max_running
   AND u.id <> ALL ('{}'::bigint[])
 ORDER BY u.head_created_at, u.head_job_id
 LIMIT 1
"""
ADMIT_TX = "BEGIN; SELECT count(*) FROM sftq.admit(40); ROLLBACK"
PREVIEW = "SELECT count(*) FROM sftq.preview_admission(40, 100)"
GLOBALS = """
SELECT (SELECT COALESCE(sum(u.queued_count), 0)::bigint FROM sftq.users u),
       (SELECT count(*) FROM sftq.jobs j WHERE j.state = 'PROGRESS'),
       (SELECT COALESCE(sum(j.gpu_count), 0)::bigint FROM sftq.jobs j WHERE j.state = 'PROGRESS')
"""
NAIVE_DEPTH = "SELECT count(*) FROM sftq.jobs WHERE state = 'QUEUED'"


def _admit_tx(conn: psycopg.Connection[Any]) -> int:
    cur = conn.execute(ADMIT_TX)
    # Results of a multi-statement string: BEGIN, the SELECT, ROLLBACK.
    admitted = -1
    while True:
        if cur.description is not None:
            row = cur.fetchone()
            if row is not None:
                admitted = int(row[0])
        if not cur.nextset():
            break
    return admitted


def _quota_tx_sql(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT COALESCE(sum(gpu_count), 0) FROM sftq.jobs "
                       "WHERE state = 'PROGRESS'").fetchone()
    ours = int(row[0]) if row else 0
    # limit - max(usage + recent, ours) = 40: usage = ours, nothing submitted recently.
    return (f"BEGIN; SELECT sftq.admit_for_quota({ours + 40}, {ours}); ROLLBACK")


def explain(conn: psycopg.Connection[Any], sql: str) -> str:
    rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING) " + sql).fetchall()
    return "\n".join(str(r[0]) for r in rows)


def explain_nested(conn: psycopg.Connection[Any], sql: str) -> str:
    """EXPLAIN ANALYZE of every statement a procedure runs, through auto_explain (its
    plans arrive as NOTICEs); the work is rolled back."""
    notices: list[str] = []

    def on_notice(diag: Any) -> None:
        notices.append(str(diag.message_primary or ""))

    conn.add_notice_handler(on_notice)
    try:
        conn.execute("LOAD 'auto_explain'")
        for setting, value in (("log_min_duration", "0"), ("log_analyze", "on"),
                               ("log_buffers", "on"), ("log_nested_statements", "on"),
                               ("log_timing", "on"), ("log_level", "notice")):
            conn.execute(f"SET auto_explain.{setting} = {value}")
        conn.execute("BEGIN")
        conn.execute(sql).fetchall()
        conn.execute("ROLLBACK")
    except psycopg.Error as exc:
        return f"(auto_explain not available: {exc})"
    finally:
        conn.execute("SET auto_explain.log_min_duration = -1")
        conn.remove_notice_handler(on_notice)
    return "\n\n".join(n for n in notices if n.strip())


def server_ms(conn: psycopg.Connection[Any], sql: str, reps: int,
              rollback: bool = False) -> dict[str, float]:
    """Server-side execution time (EXPLAIN ANALYZE's, without per-node timing) of `sql`,
    repeated: what the statement costs inside PostgreSQL, without the round trip and without
    the client's scheduling on a busy machine."""
    times = []
    for _ in range(reps):
        if rollback:
            conn.execute("BEGIN")
        plan = "\n".join(str(r[0]) for r in conn.execute(
            "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) " + sql).fetchall())
        if rollback:
            conn.execute("ROLLBACK")
        times.append(_exec_ms(plan))
    return summarize(times)


def measure(conn: psycopg.Connection[Any], quick: bool) -> dict[str, Any]:
    reps = 50 if quick else 300
    tx_reps = 10 if quick else 40
    out: dict[str, Any] = {}
    out["candidate"] = summarize(time_calls(lambda: conn.execute(CANDIDATE).fetchone(), reps=reps))
    out["candidate_server"] = server_ms(conn, CANDIDATE, 20 if quick else 100)
    out["candidate_server_ms"] = out["candidate_server"]["p50"]
    out["admit_server"] = server_ms(conn, "SELECT * FROM sftq.admit(40)", tx_reps, rollback=True)
    admitted = _admit_tx(conn)
    out["admitted_per_tx"] = admitted
    out["admit_tx"] = summarize(time_calls(lambda: _admit_tx(conn), reps=tx_reps))
    quota_sql = _quota_tx_sql(conn)
    out["admit_for_quota_tx"] = summarize(
        time_calls(lambda: _run_multi(conn, quota_sql), reps=tx_reps))
    out["preview"] = summarize(time_calls(lambda: conn.execute(PREVIEW).fetchone(), reps=tx_reps))
    out["globals"] = summarize(time_calls(lambda: conn.execute(GLOBALS).fetchone(), reps=reps))
    out["naive_depth"] = summarize(
        time_calls(lambda: conn.execute(NAIVE_DEPTH).fetchone(), reps=5 if quick else 10,
                   warmup=1))
    return out


def _run_multi(conn: psycopg.Connection[Any], sql: str) -> None:
    cur = conn.execute(sql)
    while cur.nextset():
        pass


def _exec_ms(plan: str) -> float:
    for line in plan.splitlines():
        if line.strip().startswith("Execution Time:"):
            return float(line.split(":")[1].split()[0])
    return float("nan")


def run(b: Bench) -> None:
    sizes = [1_000, 10_000] if b.quick else [1_000, 10_000, 100_000, 1_000_000]
    layouts = ["worst"] if b.quick else ["worst", "uniform"]
    results: dict[str, Any] = {"sizes": sizes, "layouts": layouts, "runs": {}}
    b.data[SECTION] = results
    for layout in layouts:
        for n in sizes:
            dbname = "bench_adm"
            url = b.new_db(dbname)
            with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
                load_times = dataset.load(conn, queued=n, layout=layout)
                dataset.check_bookkeeping(conn)
                m = measure(conn, b.quick)
                m["load_s"] = load_times
                if layout == "worst" and n == sizes[-1]:
                    results["explain_candidate"] = explain(conn, CANDIDATE)
                    results["explain_admit"] = explain_nested(
                        conn, "SELECT * FROM sftq.admit(4)")
                    results["explain_admit_10"] = explain(conn, "SELECT * FROM sftq.admit(40)")
            b.drop_db(dbname)
            results["runs"][f"{layout}/{n}"] = m
            b.log(f"{layout:>7} {n:>9,}: candidate p50 {m['candidate']['p50']:.3f} ms "
                  f"(server {m['candidate_server_ms']:.3f}), admit tx p50 "
                  f"{m['admit_tx']['p50']:.2f} ms ({m['admitted_per_tx']} jobs), "
                  f"admit_for_quota p50 {m['admit_for_quota_tx']['p50']:.2f} ms, preview p50 "
                  f"{m['preview']['p50']:.2f} ms, globals p50 {m['globals']['p50']:.3f} ms, "
                  f"count(QUEUED) {m['naive_depth']['p50']:.1f} ms "
                  f"[load {sum(m['load_s'].values()):.1f} s]")

    runs = results["runs"]
    big, small = sizes[-1], sizes[0]
    for layout in layouts:
        for n in sizes:
            m = runs[f"{layout}/{n}"]
            c = m["candidate_server"]
            b.add(SECTION, f"pick next job, {layout}, {n:,} queued", c["p50"], "ms",
                  goal="< 1", ok=c["p95"] < 1,
                  note=f"in the server (p95 {c['p95']:.3f}); as its own round trip p50 "
                       f"{m['candidate']['p50']:.3f} ms")
    for layout in layouts:
        for n in sizes:
            m = runs[f"{layout}/{n}"]
            b.add(SECTION, f"admit tx (10 jobs), {layout}, {n:,} queued", m["admit_tx"]["p50"],
                  "ms", goal="< 5", ok=m["admit_tx"]["p50"] < 5,
                  note=f"p95 {m['admit_tx']['p95']:.2f}; in the server "
                       f"{m['admit_server']['p50']:.2f}; admit_for_quota "
                       f"{m['admit_for_quota_tx']['p50']:.2f}; preview "
                       f"{m['preview']['p50']:.2f} ms")
    w_big, w_small = runs[f"worst/{big}"], runs[f"worst/{small}"]
    for key, label in (("candidate_server", "pick next job"), ("admit_tx", "admit tx"),
                       ("preview", "preview_admission")):
        ratio = w_big[key]["p50"] / w_small[key]["p50"]
        b.add(SECTION, f"{label}: worst {big:,} / {small:,}", ratio, "x", goal="<= 3",
              ok=ratio <= 3)
    for n in sizes:
        m = runs[f"worst/{n}"]
        b.add(SECTION, f"global figures (depth, running, GPUs), {n:,} queued",
              m["globals"]["p50"], "ms", goal="< 5", ok=m["globals"]["p50"] < 5,
              note=f"count(*) of QUEUED instead: {m['naive_depth']['p50']:.1f} ms")
