"""The queue's stretch counts (sql/procedures/062_queue_buckets.sql): sftq.queue_ahead answers
exactly what counting the queue answers, whatever enqueues, departures and seals did."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from .conftest import T0, Q

BRUTE = """
SELECT j.id, (SELECT count(*) FROM sftq.jobs o WHERE o.state = 'QUEUED'
               AND (o.created_at, o.id) < (j.created_at, j.id))
  FROM sftq.jobs j WHERE j.state = 'QUEUED' ORDER BY j.created_at, j.id
"""
AHEAD = """
WITH k AS (SELECT array_agg(created_at ORDER BY created_at, id) AS c,
                  array_agg(id ORDER BY created_at, id) AS i
             FROM sftq.jobs WHERE state = 'QUEUED')
SELECT k.i[a.ord], a.ahead FROM k, sftq.queue_ahead(k.c, k.i) a ORDER BY a.ord
"""


def _check(q: Q) -> None:
    assert q.all(AHEAD) == q.all(BRUTE)
    # The counts themselves, after folding what is pending, match the stretches' contents.
    drift = q.all("""
        SELECT b.lo_created_at, b.queued + COALESCE((SELECT sum(d.delta) FROM sftq.queue_bucket_deltas d
                                                      WHERE (d.lo_created_at, d.lo_id) = (b.lo_created_at, b.lo_id)), 0)
                   AS counted,
               (SELECT count(*) FROM sftq.jobs j, sftq.queue_seal s
                 WHERE j.state = 'QUEUED' AND j.created_at < s.sealed_at
                   AND (j.created_at, j.id) >= (b.lo_created_at, b.lo_id)
                   AND (j.created_at, j.id) < COALESCE(
                        (SELECT (n.lo_created_at, n.lo_id) FROM sftq.queue_buckets n
                          WHERE (n.lo_created_at, n.lo_id) > (b.lo_created_at, b.lo_id)
                          ORDER BY n.lo_created_at, n.lo_id LIMIT 1),
                        ('infinity'::timestamptz, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid)))
                   AS actual
          FROM sftq.queue_buckets b""")
    assert [(c, a) for _, c, a in drift if c != a] == []
    # Each stretch's list of jobs (as of the last seal), less the jobs that left it since and
    # with those that joined, is what the stretch holds now, in FIFO order.
    lists = q.all("""
        SELECT b.ids,
               ARRAY(SELECT d.job_id FROM sftq.queue_bucket_deltas d
                      WHERE (d.lo_created_at, d.lo_id) = (b.lo_created_at, b.lo_id) AND d.delta < 0),
               ARRAY(SELECT d.job_id FROM sftq.queue_bucket_deltas d
                      WHERE (d.lo_created_at, d.lo_id) = (b.lo_created_at, b.lo_id) AND d.delta > 0),
               ARRAY(SELECT j.id FROM sftq.jobs j, sftq.queue_seal s
                      WHERE j.state = 'QUEUED' AND j.created_at < s.sealed_at
                        AND (j.created_at, j.id) >= (b.lo_created_at, b.lo_id)
                        AND (j.created_at, j.id) < COALESCE(
                             (SELECT (n.lo_created_at, n.lo_id) FROM sftq.queue_buckets n
                               WHERE (n.lo_created_at, n.lo_id) > (b.lo_created_at, b.lo_id)
                               ORDER BY n.lo_created_at, n.lo_id LIMIT 1),
                             ('infinity'::timestamptz, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid))
                      ORDER BY j.created_at, j.id)
          FROM sftq.queue_buckets b""")
    for ids, left, joined, now in lists:
        if ids is None:  # unknown until the next seal: only a stretch a past clock just made
            assert joined
            continue
        kept = [i for i in ids if i not in left]
        came = set(joined) - set(left)  # a job may join a stretch and leave it again
        assert kept == [i for i in now if i not in came]
        assert set(now) == set(kept) | came


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_positions_match_a_count_of_the_queue(q: Q, seed: int) -> None:
    rng = random.Random(seed)
    users = [q.user(f"u{i}", cap=2) for i in range(5)]
    clock = T0
    for step in range(120):
        op = rng.random()
        clock += timedelta(seconds=1)
        if op < 0.45:
            q.enqueue(rng.choice(users), at=clock)
        elif op < 0.55:
            # A clock in the past: it may fall in a stretch already sealed.
            q.enqueue(rng.choice(users), at=clock - timedelta(seconds=rng.randint(1, 100)))
        elif op < 0.7:
            row = q.conn.execute("SELECT user_id, id FROM sftq.jobs WHERE state = 'QUEUED' "
                                 "ORDER BY random() LIMIT 1").fetchone()
            if row:
                q.conn.execute("SELECT * FROM sftq.cancel(%s, %s)", row)
        elif op < 0.8:
            q.admit(rng.choice([4, 8, 12]), at=clock)
            for (job,) in q.all("SELECT id FROM sftq.jobs WHERE state = 'PROGRESS' "
                                "ORDER BY random() LIMIT 1"):
                q.conn.execute("SELECT sftq.record_provider_state(%s, 'JOB_STATE_COMPLETED', 'x')",
                               (job,))
        elif op < 0.95:
            # Tiny stretches, so that stretches fill, thin out and merge within the test.
            q.conn.execute("SELECT sftq.queue_seal(%s, 3)", (clock + timedelta(seconds=1),))
        else:
            q.conn.execute("SELECT sftq.queue_buckets_rebuild(3)")
        if step % 10 == 9:
            _check(q)
    _check(q)
    assert q.one("SELECT count(*) FROM sftq.queue_buckets") > 3  # the seal did cut stretches


def test_a_seal_with_nothing_new_changes_nothing(q: Q) -> None:
    users = [q.user(f"u{i}") for i in range(3)]
    for i in range(10):
        q.enqueue(users[i % 3], at=T0 + timedelta(seconds=i))
    q.conn.execute("SELECT sftq.queue_seal(%s, 4)", (T0 + timedelta(seconds=20),))
    before = q.all("SELECT * FROM sftq.queue_buckets ORDER BY 1, 2")
    again = q.one("SELECT sftq.queue_seal(%s, 4)", T0 + timedelta(seconds=21))
    assert again["sealed_jobs"] == 0 and again["folded"] == 0
    assert q.all("SELECT * FROM sftq.queue_buckets ORDER BY 1, 2") == before
    assert [n for (n,) in q.all("SELECT queued FROM sftq.queue_buckets ORDER BY lo_created_at, lo_id")] == [4, 4, 2]
    _check(q)


def test_a_delta_that_names_no_job_sends_readers_back_to_counting(q: Q) -> None:
    # Deltas written before migration 0016 do not name their job: a stretch with one is
    # counted, not read from its list, until the next seal folds it.
    users = [q.user(f"u{i}", cap=5) for i in range(3)]
    for i in range(12):
        q.enqueue(users[i % 3], at=T0 + timedelta(seconds=i))
    q.conn.execute("SELECT sftq.queue_seal(%s, 4)", (T0 + timedelta(seconds=20),))
    for (job,) in q.all("SELECT id FROM sftq.jobs WHERE state = 'QUEUED' "
                        "ORDER BY created_at, id OFFSET 1 LIMIT 6"):
        q.conn.execute("SELECT * FROM sftq.cancel((SELECT user_id FROM sftq.jobs WHERE id = %s), %s)",
                       (job, job))
    assert q.one("SELECT count(*) FROM sftq.queue_bucket_deltas") == 6
    q.conn.execute("UPDATE sftq.queue_bucket_deltas SET job_created_at = NULL, job_id = NULL")
    assert q.all(AHEAD) == q.all(BRUTE)
    q.conn.execute("SELECT sftq.queue_seal(%s, 4)", (T0 + timedelta(seconds=21),))
    _check(q)
