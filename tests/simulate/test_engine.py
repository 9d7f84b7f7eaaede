"""The replay engine: exact waits on tiny traces, settings that change them, the virtual
clock inside the database, and invariants that stop a replay when broken."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from standin import ExternalUsage, Trace, job

from sftq_server import db as sqlmod
from sftq_server.simulate import clock, report
from sftq_server.simulate.engine import Options, replay, with_overrides

# alice submits two 4-GPU jobs (100 s each), bob one (50 s); quota 8, cap 1.
TINY = Trace((job("a", 0, "alice", 4, 100), job("b", 5, "alice", 4, 100),
              job("c", 10, "bob", 4, 50)))


def waits(result: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {u: (v["wait_p50"], v["wait_max"]) for u, v in result["users"].items()}


def test_tiny_trace_periodic_ticks_only_gives_exact_waits(db_url: str) -> None:
    r = replay(TINY, Options(cap=1, quota=8, tick_interval=30, event_admission=False),
               database_url=db_url)
    assert r["violations"] == []
    # a and c wait for the tick at 30 s; b waits for a's end (130 s) to be seen at 150 s.
    assert r["users"]["alice"]["wait_max"] == 145.0
    assert r["users"]["alice"]["wait_p50"] == pytest.approx((30 + 145) / 2)
    assert r["users"]["bob"]["wait_max"] == 20.0
    assert r["virtual_seconds"] == 270.0  # b ends at 250 s, seen at the tick at 270 s
    assert r["users"]["bob"]["mean_slowdown"] == pytest.approx((20 + 50) / 50)
    # 1000 GPU-seconds used of 8 GPUs over 270 s.
    assert r["gpu_utilisation"] == pytest.approx(1000 / (8 * 270), abs=1e-4)
    assert r["jobs_over_wait_threshold"] == 0
    assert r["timeline"] and {"t", "queue_depth", "gpus_in_use", "quota"} <= set(r["timeline"][0])
    means = [u["mean_slowdown"] for u in r["users"].values()]
    assert r["jain_fairness"] == pytest.approx(
        sum(means) ** 2 / (len(means) * sum(x * x for x in means)), abs=1e-4)


def test_event_admission_shortens_the_waits(db_url: str) -> None:
    r = replay(TINY, Options(cap=1, quota=8, tick_interval=30, event_admission=True),
               database_url=db_url)
    assert r["violations"] == []
    # a: woken at least 1 s after the tick at 0 s; c: woken a poll (0.25 s) after its submit;
    # b: a ends at 101 s, the reconcile pass 10 s after the (skipped) tick at 90 s sees it.
    assert waits(r) == {"alice": (53.0, 105.0), "bob": (0.25, 0.25)}
    assert r["passes"]["wake"] >= 2 and r["passes"]["reconcile"] >= 1


def test_cap_1_and_cap_2_give_different_waits(db_url: str, pg_cluster: Any) -> None:
    one = replay(TINY, Options(cap=1, event_admission=False), database_url=db_url)
    with psycopg.connect(pg_cluster.url_for("postgres"), autocommit=True) as c:
        c.execute("CREATE DATABASE sim_cap2")
    two = replay(TINY, Options(cap=2, event_admission=False),
                 database_url=pg_cluster.url_for("sim_cap2"))
    assert one["users"]["alice"]["wait_max"] == 145.0
    # A pass admits one job per user: a and c at 30 s fill the quota; c's end (80 s) is seen
    # at 90 s and b, alice's second running job, starts beside a (with cap 1: after a).
    assert two["users"]["alice"]["wait_max"] == 85.0
    text = report.side_by_side([one, two])
    assert "[A] cap 1" in text and "[B] cap 2" in text
    assert "1.5 min / 2.3 min" in text and "57.5 s / 1.4 min" in text


def test_compare_sides_parse_and_refuse_clearly() -> None:
    base = Options(cap=1, quota=8)
    side = with_overrides(base, "cap=2, quota=16,event-admission=off,cap=alice:3")
    assert (side.cap, side.quota, side.event_admission, side.caps) == (2, 16, False,
                                                                       {"alice": 3})
    assert side.cap_of("alice") == 3 and side.cap_of("bob") == 2
    with pytest.raises(ValueError, match="not key=value"):
        with_overrides(base, "caps=2")
    with pytest.raises(ValueError, match="quota cannot be 'lots'"):
        with_overrides(base, "quota=lots")


def test_cancels_failures_pipelines_and_external_usage_end_once(db_url: str) -> None:
    trace = Trace(
        (job("a", 0, "alice", 4, 600),
         job("q", 1, "alice", 2, 300, outcome="CANCELLED", outcome_at=60),  # cancelled queued
         job("r", 2, "bob", 2, 900, outcome="CANCELLED", outcome_at=200),  # cancelled running
         job("f", 3, "carol", 2, 900, outcome="FAIL", outcome_at=100),
         job("d", 4, "bob", 2, 100, kind="DPO", after=("r",)),  # its dependency is cancelled
         job("e", 5, "dave", 2, 100),
         job("late", 50, "erin", 4, 100)),
        (ExternalUsage(40, 4), ExternalUsage(700, 0)))
    r = replay(trace, Options(cap=1, quota=12, event_admission=True), database_url=db_url)
    assert r["violations"] == []
    assert r["jobs"] == 7
    # erin's 4 GPUs do not fit while 4 are used outside the queue: the head waits on them.
    assert r["users"]["erin"]["wait_max"] > 100
    assert r["blocked"]["by_user"].get("erin", 0) > 0
    assert r["idle_gpu_hours_head_blocked"] > 0


def test_the_database_reads_the_virtual_clock(db_url: str) -> None:
    start = datetime(2031, 1, 1, tzinfo=UTC)
    with psycopg.connect(db_url, autocommit=True) as c:
        changed = clock.install(c, start)
        assert changed > 20
        assert clock.leftovers(c) == []
        uid = c.execute("SELECT sftq.create_user('tim', 1)").fetchone()[0]  # type: ignore[index]
        clock.set_time(c, start + timedelta(hours=5))
        rows = c.execute("SELECT created_at FROM sftq.enqueue(%s, 'SFT', '{}'::jsonb) "
                         "UNION ALL SELECT created_at FROM sftq.enqueue(%s, 'SFT', '{}'::jsonb)",
                         (uid, uid)).fetchall()
        first, second = rows[0][0], rows[1][0]
        assert first >= start + timedelta(hours=5)
        assert first < second < start + timedelta(hours=5, seconds=1)  # in submit order
        assert c.execute("SELECT now() < %s", (start,)).fetchone()[0]  # type: ignore[index]


def test_a_broken_admission_is_caught_at_its_tick(db_url: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Admission told the quota is 100 GPUs larger than it is: both 4-GPU jobs start at once
    # on a quota of 4.
    monkeypatch.setattr(sqlmod, "ADMIT_FOR_QUOTA", sqlmod.ADMIT_FOR_QUOTA.replace(
        "%s::int", "(%s::int + 100)", 1))
    trace = Trace((job("a", 0, "alice", 4, 100), job("b", 1, "bob", 4, 100)))
    r = replay(trace, Options(quota=4, event_admission=False), database_url=db_url)
    assert len(r["violations"]) >= 1
    v = r["violations"][0]
    assert v["tick"] == 1 and v["at"] == 30.0
    assert v["what"].startswith("quota:") and "over the quota of 4" in v["what"]
    assert v["jobs"]
    assert "VIOLATION at tick 1" in report.table(r)


def test_a_cap_broken_inside_the_database_is_caught(db_url: str) -> None:
    trace = Trace((job("a", 0, "alice", 1, 100), job("b", 1, "alice", 1, 100)))
    with psycopg.connect(db_url, autocommit=True) as c:
        # A trigger that lifts every new user's cap: admission then starts both of alice's.
        c.execute("""CREATE FUNCTION public.lift() RETURNS trigger LANGUAGE plpgsql AS $$
                     BEGIN NEW.max_running := 5; RETURN NEW; END $$;
                     CREATE TRIGGER lift BEFORE INSERT ON sftq.users
                     FOR EACH ROW EXECUTE FUNCTION public.lift();""", prepare=False)
    r = replay(trace, Options(cap=1, event_admission=False), database_url=db_url)
    assert [v["what"].split(":")[0] for v in r["violations"]] == ["cap"]
    # Admission takes one job per user a pass: alice's second starts at the second tick.
    assert (r["violations"][0]["tick"], r["violations"][0]["at"]) == (2, 60.0)
    assert "alice more than their cap of 1" in r["violations"][0]["what"]


LIFO_SQL = """
CREATE FUNCTION public.lifo_admit(p_limit integer, p_usage numeric, p_grace interval)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_job sftq.jobs;
BEGIN
    -- The newest waiting job first: last in, first out.
    SELECT * INTO v_job FROM sftq.jobs WHERE state = 'QUEUED'
     ORDER BY created_at DESC, id DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('budget', p_limit, 'jobs', '[]'::jsonb);
    END IF;
    v_job := sftq._transition(v_job.id, 'PROGRESS', now(), 'scheduler', 'admitted');
    RETURN jsonb_build_object('budget', p_limit, 'jobs', jsonb_build_array(jsonb_build_object(
        'job_id', v_job.id, 'kind', v_job.kind, 'gpu_count', v_job.gpu_count,
        'fireworks_payload', v_job.fireworks_payload)));
END $$;
"""


def test_an_admission_out_of_fifo_order_is_caught(db_url: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(LIFO_SQL, prepare=False)
    monkeypatch.setattr(sqlmod, "ADMIT_FOR_QUOTA",
                        "SELECT public.lifo_admit(%s::int, %s::numeric, make_interval(secs => %s))")
    trace = Trace((job("a", 0, "alice", 1, 100), job("b", 1, "bob", 1, 100)))
    r = replay(trace, Options(quota=8, event_admission=False), database_url=db_url)
    assert r["violations"], "a LIFO admission went unnoticed"
    v = r["violations"][0]
    assert (v["tick"], v["at"]) == (1, 30.0)
    assert v["what"].startswith("fifo: admitted") and "(alice) waited ahead of it" in v["what"]
    assert len(v["jobs"]) == 2


def test_max_queued_applies_the_per_user_limits_when_the_database_has_them(
        db_url: str) -> None:
    from sftq_server.simulate.engine import ReplayError

    trace = Trace(tuple(job(f"j{i}", 0, "alice", 1, 100) for i in range(4)))
    with psycopg.connect(db_url, autocommit=True) as c:
        row = c.execute("SELECT to_regproc('sftq.set_user_limits') IS NOT NULL").fetchone()
    if not (row and row[0]):
        with pytest.raises(ReplayError, match="--max-queued needs the per-user limits"):
            replay(trace, Options(max_queued=1), database_url=db_url)
        return
    r = replay(trace, Options(max_queued=1, event_admission=False), database_url=db_url)
    assert r["violations"] == [] and r["refused"] >= 2
