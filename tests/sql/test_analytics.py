"""Per-user analytics: the contract's shapes and definitions."""

from __future__ import annotations

from uuid import uuid4

import psycopg
import pytest

from .conftest import Q, check_code, t


def test_summary_of_a_new_user_has_every_key(q: Q) -> None:
    a = q.user("a")
    assert q.one("SELECT sftq.summary(%s)", a) == {
        "total": 0,
        "by_state": {"QUEUED": 0, "PROGRESS": 0, "SUCCESS": 0, "FAIL": 0, "CANCELLED": 0},
        "by_kind": {"SFT": 0, "DPO": 0, "RFT": 0},
        "success_rate": None,
        "avg_run_duration_seconds": None,
        "total_gpu_hours": 0,
        "recent_failures": [],
    }


def _finished(
    q: Q, user: int, kind: str, gpus: int, start: float, end: float, outcome: str
) -> object:
    job = q.enqueue(user, kind, gpus, at=t(start - 10))
    assert q.admit(64, at=t(start)) == [job]
    q.submitted(job, at=t(start))
    q.provider_state(
        job, outcome, "went wrong" if outcome != "JOB_STATE_COMPLETED" else None, at=t(end)
    )
    return job


def test_summary_definitions(q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    _finished(q, a, "SFT", 4, 100, 100 + 3600, "JOB_STATE_COMPLETED")  # 4 GPU-hours
    _finished(q, a, "DPO", 2, 5000, 5000 + 1800, "JOB_STATE_COMPLETED")  # 1 GPU-hour
    failures = [
        _finished(q, a, "RFT", 1, 10000 + i * 100, 10050 + i * 100, "JOB_STATE_FAILED")
        for i in range(12)
    ]
    cancelled = q.enqueue(a, "SFT", at=t(20000))
    q.all("SELECT * FROM sftq.cancel(%s, %s)", a, cancelled)
    _finished(q, b, "SFT", 8, 100, 200, "JOB_STATE_COMPLETED")  # not a's
    q.enqueue(a, "SFT", at=t(30000))
    s = q.one("SELECT sftq.summary(%s)", a)
    assert s["total"] == 16
    assert s["by_state"] == {"QUEUED": 1, "PROGRESS": 0, "SUCCESS": 2, "FAIL": 12, "CANCELLED": 1}
    assert s["by_kind"] == {"SFT": 3, "DPO": 1, "RFT": 12}
    assert s["success_rate"] == round(2 / 15, 3)
    assert s["avg_run_duration_seconds"] == 2700
    assert s["total_gpu_hours"] == 5
    assert [f["id"] for f in s["recent_failures"]] == [str(j) for j in reversed(failures)][:10]
    assert set(s["recent_failures"][0]) == {
        "id",
        "display_name",
        "kind",
        "gpu_count",
        "error",
        "failed_at",
    }
    assert s["recent_failures"][0]["error"] == "went wrong"


def test_queue_context(q: Q) -> None:
    a, b, c = q.user("a"), q.user("b"), q.user("c")
    run = q.enqueue(a, gpus=4, at=t(0))
    q.enqueue(b, gpus=8, at=t(1))
    q.admit(12, at=t(5))
    q.enqueue(c, at=t(6))
    mine1 = q.enqueue(a, "DPO", 2, at=t(7), name="second")
    q.enqueue(b, at=t(8))
    q.enqueue(c, at=t(9))
    mine2 = q.enqueue(a, "RFT", 2, at=t(10))
    ctx = q.one("SELECT sftq.queue_context(%s)", a)
    assert ctx["your_progress_job"]["id"] == str(run)
    assert set(ctx["your_progress_job"]) == {
        "id",
        "display_name",
        "kind",
        "gpu_count",
        "started_at",
        "fireworks_job_name",
    }
    assert [(j["id"], j["queue_position"]) for j in ctx["your_queued_jobs"]] == [
        (str(mine1), 1),
        (str(mine2), 3),
    ]
    assert ctx["your_queued_jobs"][0]["display_name"] == "second"
    assert set(ctx["your_queued_jobs"][0]) == {
        "id",
        "display_name",
        "kind",
        "gpu_count",
        "created_at",
        "queue_position",
        # Added by the visibility issue (tests/sql/test_waiting.py checks them).
        "waiting_reason",
        "estimated_start_at",
        "estimate",
    }
    assert (ctx["global_queue_depth"], ctx["global_progress_count"], ctx["global_gpu_in_use"]) == (
        5,
        2,
        12,
    )
    idle = q.one("SELECT sftq.queue_context(%s)", q.user("d"))
    assert idle["your_progress_job"] is None and idle["your_queued_jobs"] == []


def test_job_analytics(q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    job = _finished(q, a, "SFT", 4, 90, 90 + 3765, "JOB_STATE_COMPLETED")
    got = q.one("SELECT sftq.job_analytics(%s, %s)", a, job)
    assert got["timeline"] == {
        "queued_at": "2026-05-01T10:01:20.000000Z",
        "started_at": "2026-05-01T10:01:30.000000Z",
        "completed_at": "2026-05-01T11:04:15.000000Z",
    }
    assert (got["queue_wait_seconds"], got["run_duration_seconds"], got["gpu_hours"]) == (
        10,
        3765,
        4.183,
    )
    queued = q.enqueue(a, at=t(5000))
    got = q.one("SELECT sftq.job_analytics(%s, %s)", a, queued)
    assert (got["queue_wait_seconds"], got["run_duration_seconds"], got["gpu_hours"]) == (
        None,
        None,
        None,
    )
    for who, what in ((b, job), (a, uuid4())):
        with pytest.raises(psycopg.Error) as e:
            q.one("SELECT sftq.job_analytics(%s, %s)", who, what)
        check_code(e, "SQ404")
