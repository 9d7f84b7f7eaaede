"""The invariants a replay checks at every virtual tick.

Three are checked by the database itself, at the moment of each admission (a trigger on the
'admitted' event, inside the admitting transaction, which holds the admission gate
exclusively so nothing changes under it): the GPUs of our PROGRESS jobs plus the GPUs used
outside the queue never exceed the quota; no user runs more than their cap; no job waiting
ahead in FIFO order could have been admitted instead (strict FIFO among eligible jobs: an
earlier job of the same user, or of a user below cap whose dependencies are met). They
record instead of raising; the replay reads them after each tick and stops at the first.

Two are checked in Python from what the replay sees: every job's transitions form one legal
path and it ends exactly once (`Lifecycle`), and no provider job is created twice (the
replay counts the simulator's successful creates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from sftq_server.simulate.clock import SCHEMA

ORACLE_SQL = f"""
CREATE TABLE IF NOT EXISTS {SCHEMA}.truth (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    quota_limit integer NOT NULL,
    external integer NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS {SCHEMA}.caps (
    user_id bigint PRIMARY KEY,
    cap integer NOT NULL);
CREATE TABLE IF NOT EXISTS {SCHEMA}.violations (
    id bigserial PRIMARY KEY,
    what text NOT NULL,
    jobs uuid[] NOT NULL);
CREATE OR REPLACE FUNCTION {SCHEMA}.check_admission() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_job   sftq.jobs;
    v_user  sftq.users;
    v_ours  integer;
    v_truth {SCHEMA}.truth;
    v_cap   integer;
    v_now   timestamptz;
BEGIN
    SELECT * INTO v_job FROM sftq.jobs WHERE id = NEW.job_id;
    SELECT * INTO v_user FROM sftq.users WHERE id = v_job.user_id;
    SELECT * INTO v_truth FROM {SCHEMA}.truth;
    SELECT COALESCE(sum(j.gpu_count), 0)::int INTO v_ours FROM sftq.jobs j
     WHERE j.state = 'PROGRESS';
    IF v_ours + v_truth.external > v_truth.quota_limit THEN
        INSERT INTO {SCHEMA}.violations (what, jobs) VALUES (
            format('quota: admitting %s (%s GPUs) puts %s GPUs in PROGRESS with %s used '
                   'outside the queue, over the quota of %s', NEW.job_id, v_job.gpu_count,
                   v_ours, v_truth.external, v_truth.quota_limit), ARRAY[NEW.job_id]);
    END IF;
    -- The cap the replay was asked for, not only the row admission reads.
    v_cap := COALESCE((SELECT c.cap FROM {SCHEMA}.caps c WHERE c.user_id = v_user.id),
                      v_user.max_running);
    IF (SELECT count(*) FROM sftq.jobs r WHERE r.user_id = v_user.id AND r.state = 'PROGRESS')
         > LEAST(v_cap, v_user.max_running) THEN
        INSERT INTO {SCHEMA}.violations (what, jobs) VALUES (
            format('cap: admitting %s gives user %s more than their cap of %s running',
                   NEW.job_id, v_user.name, LEAST(v_cap, v_user.max_running)),
            ARRAY[NEW.job_id]);
    END IF;
    -- Each user's earliest job waiting ahead of this one (a user's jobs go in order), then
    -- the few users: theirs could have been admitted instead when the user is this job's
    -- own, or is below cap and got no job earlier in this pass (same virtual moment).
    v_now := {SCHEMA}.now();
    INSERT INTO {SCHEMA}.violations (what, jobs)
    SELECT format('fifo: admitted %s while %s (%s) waited ahead of it%s', NEW.job_id, q.id,
                  u.name, CASE WHEN q.user_id = v_job.user_id THEN ' (same user)' ELSE '' END),
           ARRAY[NEW.job_id, q.id]
      FROM (SELECT DISTINCT ON (w.user_id) w.id, w.user_id, w.created_at
              FROM sftq.jobs w
             WHERE w.state = 'QUEUED'
               AND (w.created_at, w.id) < (v_job.created_at, v_job.id)
               AND (w.after IS NULL OR sftq._first_unmet(w.after) IS NULL)
             ORDER BY w.user_id, w.created_at, w.id) q
      JOIN sftq.users u ON u.id = q.user_id
     WHERE q.user_id = v_job.user_id
        OR (u.disabled_at IS NULL
            AND (SELECT count(*) FROM sftq.jobs r
                  WHERE r.user_id = u.id AND r.state = 'PROGRESS') < u.max_running
            AND NOT EXISTS (
                SELECT 1 FROM sftq.jobs a
                 WHERE a.user_id = u.id AND a.state = 'PROGRESS' AND a.id <> NEW.job_id
                   AND a.started_at = v_now))
     ORDER BY q.created_at, q.id
     LIMIT 1;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS sim_check_admission ON sftq.job_events;
CREATE TRIGGER sim_check_admission AFTER INSERT ON sftq.job_events
    FOR EACH ROW WHEN (NEW.event = 'admitted') EXECUTE FUNCTION {SCHEMA}.check_admission();
"""

TERMINAL = frozenset({"SUCCESS", "FAIL", "CANCELLED"})
LEGAL = frozenset({("QUEUED", "PROGRESS"), ("QUEUED", "CANCELLED"), ("PROGRESS", "SUCCESS"),
                   ("PROGRESS", "FAIL"), ("PROGRESS", "CANCELLED")})


def install(conn: psycopg.Connection[Any], quota_limit: int) -> None:
    """The admission oracle, into the replay's own database (never a production one)."""
    conn.execute(ORACLE_SQL, prepare=False)
    conn.execute(f"INSERT INTO {SCHEMA}.truth (quota_limit, external) VALUES (%s, 0) "
                 "ON CONFLICT (only_row) DO UPDATE SET quota_limit = EXCLUDED.quota_limit",
                 (quota_limit,))


def set_cap(conn: psycopg.Connection[Any], user_id: int, cap: int) -> None:
    """The cap the replay gave this user: admission must hold it whatever the row says."""
    conn.execute(f"INSERT INTO {SCHEMA}.caps (user_id, cap) VALUES (%s, %s) "
                 "ON CONFLICT (user_id) DO UPDATE SET cap = EXCLUDED.cap", (user_id, cap))


def set_external(conn: psycopg.Connection[Any], gpus: int) -> None:
    """What the simulator was just told is used outside the queue (between ticks only)."""
    conn.execute(f"UPDATE {SCHEMA}.truth SET external = %s", (gpus,))


def recorded(conn: psycopg.Connection[Any], since: int) -> tuple[list[tuple[str, list[str]]], int]:
    """Violations the oracle recorded with an id above `since`, and the highest id."""
    rows = conn.execute(f"SELECT id, what, jobs FROM {SCHEMA}.violations WHERE id > %s "
                        "ORDER BY id", (since,)).fetchall()
    top = max((int(r[0]) for r in rows), default=since)
    return [(str(r[1]), [str(j) for j in r[2]]) for r in rows], top


@dataclass
class Lifecycle:
    """Each job's state as its events tell it: one legal path, one end."""

    state: dict[str, str] = field(default_factory=dict)
    open: int = 0

    def created(self, job_id: str) -> list[str]:
        if job_id in self.state:
            return [f"job {job_id} submitted twice"]
        self.state[job_id] = "QUEUED"
        self.open += 1
        return []

    def moved(self, job_id: str, frm: str, to: str) -> list[str]:
        at = self.state.get(job_id)
        if at is None:
            return [f"job {job_id}: {frm} -> {to} for a job never submitted"]
        if at in TERMINAL:
            return [f"job {job_id} ended twice: {at}, then {frm} -> {to}"]
        if frm != at or (frm, to) not in LEGAL:
            return [f"job {job_id}: illegal move {frm} -> {to} (it was {at})"]
        self.state[job_id] = to
        if to in TERMINAL:
            self.open -= 1
        return []

    def unfinished(self) -> list[str]:
        return sorted(j for j, s in self.state.items() if s not in TERMINAL)
