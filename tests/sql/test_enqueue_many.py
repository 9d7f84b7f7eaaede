"""sftq.enqueue_many (the group commit of POST /jobs): a batch answers and stores exactly what
its requests would, sent one by one (each a batch of one, which is what sftq.enqueue runs;
test_procedures.py checks a lone enqueue's answers and errors on their own)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import COUNTER_DRIFT, Q

BATCH = ("SELECT ord, id, kind, state, replayed, err_state, err_message, err_detail "
         "FROM sftq.enqueue_many(%s::bigint[], %s::text[], %s::jsonb[], %s::text[], %s::int[], "
         "%s::text[], %s::int[])")

request = st.tuples(
    st.sampled_from(["alice", "bob", "carol", "off", None]),  # off: a disabled user
    st.sampled_from(["SFT", "DPO", "RFT", "XX"]),
    st.sampled_from(['{"d": 1}', '{"d": 2}', "[1]"]),
    st.sampled_from([None, "k1", "k2"]),
    st.sampled_from([4, 8, 0]),
    st.sampled_from([None, 60]),
)


def _setup(q: Q) -> dict[str, int]:
    users = {name: q.user(name) for name in ("alice", "bob", "carol", "off")}
    q.conn.execute("SELECT sftq.set_user_disabled('off', true)")
    return users


def _state(q: Q) -> list[tuple[Any, ...]]:
    """What the requests left behind, without ids or times: each user's jobs in FIFO order,
    their events, and the admission bookkeeping (counters, and the head by its name)."""
    jobs = q.all(
        "SELECT u.name, j.kind, j.display_name, j.gpu_count, j.idempotency_key, "
        "j.queue_timeout_seconds, (SELECT array_agg(e.event ORDER BY e.id) FROM sftq.job_events e "
        "WHERE e.job_id = j.id) FROM sftq.jobs j JOIN sftq.users u ON u.id = j.user_id "
        "ORDER BY j.created_at, j.id")
    users = q.all(
        "SELECT u.name, u.queued_count, u.sft_count, u.dpo_count, u.rft_count, h.display_name, "
        "h.id IS NOT DISTINCT FROM (SELECT j.id FROM sftq.jobs j WHERE j.user_id = u.id "
        "AND j.state = 'QUEUED' ORDER BY j.created_at, j.id LIMIT 1) "
        "FROM sftq.users u LEFT JOIN sftq.jobs h ON h.id = u.head_job_id ORDER BY u.name")
    return [*jobs, *users]


def _answers(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Answers without the generated ids: a replay names the request whose job it got."""
    first: dict[Any, int] = {}
    out = []
    for ord_, job, kind, state, replayed, err, msg, detail in rows:
        if job is not None:
            first.setdefault(job, ord_)
        out.append((first.get(job), kind, state, replayed, err, msg,
                    None if detail is None else sorted(json.loads(detail))))
    return out


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=st.lists(request, min_size=1, max_size=10))
def test_a_batch_is_what_its_requests_alone_would_be(q: Q, reqs: list[tuple[Any, ...]]) -> None:
    conn = q.conn
    with conn.transaction(force_rollback=True):
        users = _setup(q)
        ids = [users.get(u) if u is not None else None for u, *_ in reqs]
        args = (ids, [r[1] for r in reqs], [r[2] for r in reqs],
                [f"n{i}" for i in range(len(reqs))], [r[4] for r in reqs],
                [r[3] for r in reqs], [r[5] for r in reqs])
        batch = _answers(conn.execute(BATCH, args).fetchall())
        after_batch = _state(q)
        assert q.all(COUNTER_DRIFT) == []
    with conn.transaction(force_rollback=True):
        users = _setup(q)
        alone = []
        for i, (u, kind, payload, key, gpus, timeout) in enumerate(reqs):
            row = conn.execute(BATCH, ([users.get(u) if u else None], [kind], [payload],
                                       [f"n{i}"], [gpus], [key], [timeout])).fetchone()
            assert row is not None
            alone.append((i + 1, *row[1:]))
        one_by_one = _answers(alone)
        after_alone = _state(q)
        assert q.all(COUNTER_DRIFT) == []
    assert batch == one_by_one
    assert after_batch == after_alone


def test_sftq_enqueue_raises_what_the_batch_answers(q: Q) -> None:
    alice = q.user("alice")
    q.enqueue(alice, key="k", payload={"a": 1})
    try:
        q.enqueue(alice, key="k", payload={"a": 2})
    except psycopg.Error as exc:
        assert exc.sqlstate == "SQ419"
        assert exc.diag.message_detail and "job_id" in json.loads(exc.diag.message_detail)
    else:  # pragma: no cover
        raise AssertionError("a second body under the same key must be refused")
    try:
        q.enqueue(alice, kind="XX")
    except psycopg.Error as exc:
        assert exc.sqlstate == "SQ400" and exc.diag.message_detail is None
    else:  # pragma: no cover
        raise AssertionError("an unknown kind must be refused")


def test_requests_of_a_batch_keep_their_order(q: Q) -> None:
    users = [q.user(f"u{i}") for i in range(5)]
    rows = q.all(BATCH, users * 2, ["SFT"] * 10, ["{}"] * 10, [f"n{i}" for i in range(10)],
                 [4] * 10, [None] * 10, [None] * 10)
    assert [r[0] for r in rows] == list(range(1, 11))
    names = [r[0] for r in q.all("SELECT display_name FROM sftq.jobs ORDER BY created_at, id")]
    assert names == [f"n{i}" for i in range(10)]
    heads = q.all("SELECT u.head_job_id = (SELECT j.id FROM sftq.jobs j WHERE j.user_id = u.id "
                  "ORDER BY j.created_at, j.id LIMIT 1) FROM sftq.users u")
    assert all(h for (h,) in heads)
