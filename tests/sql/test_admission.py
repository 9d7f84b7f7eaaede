"""Admission: strict FIFO over all kinds, caps, no backfill, the budget rule, the preview."""

from __future__ import annotations

from datetime import timedelta

import pytest

from .conftest import Q, t


def test_fifo_across_kinds_one_running_per_user(q: Q) -> None:
    a, b, c = q.user("a"), q.user("b"), q.user("c")
    a1 = q.enqueue(a, "SFT", at=t(1))
    b1 = q.enqueue(b, "RFT", at=t(2))
    a2 = q.enqueue(a, "DPO", at=t(3))
    c1 = q.enqueue(c, "DPO", at=t(4))
    assert q.admit(100) == [a1, b1, c1]  # a2 waits: a is at cap
    assert q.state(a2) == "QUEUED"
    assert q.admit(100) == []
    q.provider_state(a1, "JOB_STATE_COMPLETED")
    assert q.admit(100) == [a2]


def test_no_backfill_big_head_blocks_smaller_later_jobs(q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    big = q.enqueue(a, gpus=8, at=t(1))
    small = q.enqueue(b, gpus=4, at=t(2))
    assert q.admit(4) == []
    assert q.state(small) == "QUEUED"
    assert q.admit(8) == [big]
    assert q.admit(4) == [small]


def test_users_at_cap_do_not_block_others(q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    a1 = q.enqueue(a, at=t(1))
    q.admit(4)
    a_later = [q.enqueue(a, gpus=64, at=t(2 + i)) for i in range(5)]  # huge, but a is at cap
    b1 = q.enqueue(b, at=t(10))
    assert q.admit(4) == [b1]
    assert all(q.state(j) == "QUEUED" for j in a_later)
    assert q.state(a1) == "PROGRESS"


def test_budget_is_spent_in_order_and_never_overspent(q: Q) -> None:
    users = [q.user(f"u{i}") for i in range(5)]
    jobs = [q.enqueue(u, gpus=4, at=t(i)) for i, u in enumerate(users)]
    assert q.admit(10) == jobs[:2]
    assert q.one("SELECT sum(gpu_count) FROM sftq.jobs WHERE state = 'PROGRESS'") == 8


def test_admitted_user_counts_as_at_cap_within_one_call(q: Q) -> None:
    a = q.user("a", cap=3)
    b = q.user("b")
    a1, a2 = q.enqueue(a, at=t(1)), q.enqueue(a, at=t(2))
    b1 = q.enqueue(b, at=t(3))
    assert q.admit(100) == [a1, b1]
    assert q.admit(100) == [a2]  # next call: a is below its cap of 3 again


def test_cap_zero_and_disabled_users_are_skipped(q: Q) -> None:
    a, b, c = q.user("a", cap=0), q.user("b"), q.user("c")
    q.enqueue(a, at=t(1))
    q.enqueue(b, at=t(2))
    c1 = q.enqueue(c, at=t(3))
    q.one("SELECT sftq.set_user_disabled('b', true)")
    assert q.admit(100) == [c1]


def test_cancelled_head_hands_over_to_the_next_job(q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    a1, a2 = q.enqueue(a, at=t(1)), q.enqueue(a, at=t(3))
    b1 = q.enqueue(b, at=t(2))
    q.all("SELECT * FROM sftq.cancel(%s, %s)", a, a1)
    assert q.one("SELECT head_job_id FROM sftq.users WHERE id = %s", a) == a2
    assert q.admit(100) == [b1, a2]


def test_admission_event_records_the_budget_seen(q: Q) -> None:
    a = q.user("a")
    j = q.enqueue(a, gpus=4)
    q.admit(12)
    assert q.one(
        "SELECT detail FROM sftq.job_events WHERE job_id = %s AND event = 'admitted'", j
    ) == {"gpu_budget": 12, "gpu_count": 4}


def test_budget_rule_covers_lagging_usage(q: Q) -> None:
    """budget = limit - max(usage + ours submitted recently or not yet, all ours)."""
    a, b, c = q.user("a"), q.user("b"), q.user("c")
    ja = q.enqueue(a, gpus=8, at=t(0))
    jb = q.enqueue(b, gpus=4, at=t(1))
    q.enqueue(c, gpus=8, at=t(2))
    q.admit(12, at=t(10))
    q.submitted(ja, at=t(11))
    budget = "SELECT * FROM sftq.admission_budget(%s, %s, %s, %s)"
    # jb not yet submitted, ja submitted 9 s ago: the provider's usage (2, external) counts neither.
    assert q.all(budget, 16, 2, timedelta(minutes=5), t(20)) == [(16 - (2 + 12), 12, 12)]
    # Much later the provider counts ours (usage 14 = 12 ours + 2 external): jb still unsubmitted.
    q.submitted(jb, at=t(12))
    assert q.all(budget, 16, 14, timedelta(minutes=5), t(1000)) == [(2, 12, 0)]
    # A provider whose usage is stuck at 0: our own running GPUs are the floor.
    assert q.all(budget, 16, 0, timedelta(minutes=5), t(1000)) == [(4, 12, 0)]


def test_admit_for_quota_uses_the_rule(q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    q.enqueue(a, gpus=8, at=t(0))
    jb = q.enqueue(b, gpus=8, at=t(1))
    first = q.one("SELECT sftq.admit_for_quota(16, 0)")
    assert first["budget"] == 16 and len(first["jobs"]) == 2
    # The provider still reports 0 in use: the next call must not spend those GPUs again.
    c = q.user("c")
    q.enqueue(c, gpus=1, at=t(2))
    second = q.one("SELECT sftq.admit_for_quota(16, 0)")
    assert second["budget"] == 0 and second["jobs"] == []
    assert q.state(jb) == "PROGRESS"


def test_preview_explains_every_wait_and_changes_nothing(q: Q) -> None:
    a, b, c, d = q.user("a"), q.user("b"), q.user("c"), q.user("d")
    running = q.enqueue(d, at=t(0))
    q.admit(4)
    q.enqueue(d, at=t(1))  # d at cap
    a1 = q.enqueue(a, gpus=2, at=t(2))  # admitted
    q.enqueue(a, at=t(3))  # behind a's own head
    q.enqueue(b, gpus=8, at=t(4))  # does not fit
    q.enqueue(c, gpus=1, at=t(5))  # behind the blocking head
    before = q.all("SELECT id, state FROM sftq.jobs ORDER BY id")
    rows = q.all("SELECT job_id, decision, reason FROM sftq.preview_admission(6)")
    assert [r[1] for r in rows] == ["wait", "admit", "wait", "wait", "wait"]
    reasons = [r[2] for r in rows]
    assert reasons[0].startswith("user at cap")
    assert rows[1][0] == a1
    assert reasons[2].startswith("behind the same user")
    assert reasons[3] == "does not fit: needs 8 GPUs while 4 are free"
    assert (
        reasons[4].startswith("behind head job") and "needs 8 GPUs while 4 are free" in reasons[4]
    )
    assert q.all("SELECT id, state FROM sftq.jobs ORDER BY id") == before
    assert q.state(running) == "PROGRESS"
    assert len(q.all("SELECT * FROM sftq.preview_admission(6, 2)")) == 2


@pytest.mark.parametrize("budget", [-5, 0])
def test_no_budget_admits_nothing(q: Q, budget: int) -> None:
    a = q.user("a")
    q.enqueue(a, gpus=1)
    assert q.admit(budget) == []
