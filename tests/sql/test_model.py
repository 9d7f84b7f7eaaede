"""Property-based: random sequences of enqueue / cancel / admit / provider outcomes against
a small Python model of the contract's rules; every job's state must agree after every step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import COUNTER_DRIFT, Q, t

USERS = ["a", "b", "c"]
CAPS = {"a": 1, "b": 1, "c": 2}
OUTCOMES = {
    "JOB_STATE_COMPLETED": "SUCCESS",
    "JOB_STATE_FAILED": "FAIL",
    "JOB_STATE_EXPIRED": "FAIL",
    "JOB_STATE_EARLY_STOPPED": "FAIL",
    "JOB_STATE_CANCELLED": "CANCELLED",
    "NOT_FOUND": "CANCELLED",
    "JOB_STATE_RUNNING": None,
}


@dataclass
class MJob:
    user: str
    gpus: int
    state: str = "QUEUED"
    cancel_requested: bool = False


@dataclass
class Model:
    jobs: list[MJob] = field(default_factory=list)

    def running(self, user: str) -> int:
        return sum(1 for j in self.jobs if j.user == user and j.state == "PROGRESS")

    def admit(self, budget: int) -> list[int]:
        admitted: list[int] = []
        users_done: set[str] = set()
        while True:
            cand = next(
                (
                    i
                    for i, j in enumerate(self.jobs)
                    if j.state == "QUEUED"
                    and j.user not in users_done
                    and self.running(j.user) < CAPS[j.user]
                ),
                None,
            )
            if cand is None or self.jobs[cand].gpus > budget:
                return admitted
            self.jobs[cand].state = "PROGRESS"
            budget -= self.jobs[cand].gpus
            users_done.add(self.jobs[cand].user)
            admitted.append(cand)

    def cancel(self, i: int) -> str:
        job = self.jobs[i]
        if job.state == "QUEUED":
            job.state = "CANCELLED"
            return "none"
        if job.state == "PROGRESS":
            job.cancel_requested = True
            return "deferred"
        return "conflict"

    def outcome(self, i: int, provider: str) -> None:
        job = self.jobs[i]
        if job.state == "PROGRESS" and OUTCOMES[provider] is not None:
            job.state = OUTCOMES[provider]


op = st.one_of(
    st.tuples(st.just("enqueue"), st.sampled_from(USERS), st.sampled_from([1, 2, 4, 8])),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("admit"), st.integers(-2, 16)),
    st.tuples(st.just("outcome"), st.integers(0, 30), st.sampled_from(sorted(OUTCOMES))),
    st.tuples(st.just("complete_cancel"), st.integers(0, 30)),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(op, min_size=1, max_size=40))
def test_procedures_agree_with_the_model(q: Q, ops: list[tuple[Any, ...]]) -> None:
    q.conn.execute(
        "TRUNCATE sftq.job_events, sftq.jobs, sftq.api_keys, sftq.users RESTART IDENTITY CASCADE"
    )
    uid = {u: q.user(u, CAPS[u]) for u in USERS}
    model = Model()
    ids: list[Any] = []
    for step, o in enumerate(ops):
        kind = o[0]
        if kind == "enqueue":
            ids.append(q.enqueue(uid[o[1]], "SFT", o[2], at=t(step)))
            model.jobs.append(MJob(o[1], o[2]))
        elif kind == "admit":
            got = q.admit(o[1])
            assert got == [ids[i] for i in model.admit(o[1])]
        elif not ids:
            continue
        elif kind == "cancel":
            i = o[1] % len(ids)
            expected = model.cancel(i)
            try:
                action = q.all(
                    "SELECT action FROM sftq.cancel(%s, %s)", uid[model.jobs[i].user], ids[i]
                )[0][0]
            except Exception as exc:  # noqa: BLE001 - the coded error is the check
                assert getattr(exc, "sqlstate", None) == "SQ409" and expected == "conflict"
            else:
                assert action == expected
        elif kind == "outcome":
            i = o[1] % len(ids)
            model.outcome(i, o[2])
            if q.state(ids[i]) == "PROGRESS":
                q.provider_state(ids[i], o[2])
        elif kind == "complete_cancel":
            i = o[1] % len(ids)
            job = model.jobs[i]
            if job.state == "PROGRESS" and job.cancel_requested:
                job.state = "CANCELLED"
                assert q.one("SELECT sftq.complete_cancel(%s)", ids[i]) == "CANCELLED"
        states = dict(q.all("SELECT id, state FROM sftq.jobs"))
        assert [states[j] for j in ids] == [m.state for m in model.jobs], (step, o)
    assert q.all(COUNTER_DRIFT) == []


# ---- the GPU budget against a provider whose usage lags (issue 19) -------------------------
#
# A small provider model: our jobs hold their GPUs from their create on, but its `usage` counts
# a job only `lag` seconds after the create; external usage moves between ticks. A tick reads
# the usage, admits (sftq.admit_for_quota), creates what it admitted, reads the usage again
# and credits the rise (sftq.record_usage_reading), all at one instant of the model's clock.

LIMIT = 16
GRACE = 300
BUDGET_USERS = ["a", "b", "c", "d"]

budget_op = st.one_of(
    st.tuples(st.just("enqueue"), st.sampled_from(BUDGET_USERS), st.sampled_from([1, 2, 4, 8])),
    st.tuples(st.just("end"), st.integers(0, 40)),
    st.tuples(st.just("external"), st.sampled_from([0, 0, 2, 4, 6, 8, 12])),
    st.tuples(st.just("advance"), st.sampled_from([1, 10, 30, 45, 90, 400])),
    st.tuples(st.just("tick")),
)


@dataclass
class BJob:
    user: str
    gpus: int
    state: str = "QUEUED"
    created_at: float | None = None  # model seconds, at the provider
    counted: bool = False  # credited by a reading (usage_counted_at)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lag=st.sampled_from([0, 60]), ops=st.lists(budget_op, min_size=1, max_size=50))
def test_budget_with_lag_and_external_usage(q: Q, lag: int, ops: list[tuple[Any, ...]]) -> None:
    q.conn.execute(
        "TRUNCATE sftq.job_events, sftq.jobs, sftq.api_keys, sftq.users RESTART IDENTITY CASCADE"
    )
    uid = {u: q.user(u) for u in BUDGET_USERS}
    jobs: list[BJob] = []
    ids: list[UUID] = []
    clock = 0.0
    external = 0

    def running() -> list[tuple[BJob, UUID]]:
        return [(j, i) for j, i in zip(jobs, ids, strict=True) if j.state == "PROGRESS"]

    def usage(now: float) -> int:
        seen = sum(j.gpus for j, _ in running()
                   if j.created_at is not None and now - j.created_at >= lag)
        return external + seen

    for step, o in enumerate(ops):
        kind = o[0]
        now = clock + step * 1e-3  # strictly increasing, so FIFO order is enqueue order
        if kind == "enqueue":
            ids.append(q.enqueue(uid[o[1]], "SFT", o[2], at=t(now)))
            jobs.append(BJob(o[1], o[2]))
        elif kind == "end" and ids:
            i = o[1] % len(ids)
            if jobs[i].state == "PROGRESS":
                jobs[i].state = "SUCCESS"
                assert q.provider_state(ids[i], "JOB_STATE_COMPLETED", at=t(now)) == "SUCCESS"
        elif kind == "external":
            external = o[1]
        elif kind == "advance":
            clock += o[1]
        elif kind == "tick":
            before = usage(now)
            ours = sum(j.gpus for j, _ in running())
            recent = sum(j.gpus for j, _ in running() if not j.counted
                         and j.created_at is not None and now - j.created_at < GRACE)
            answer = q.one("SELECT sftq.admit_for_quota(%s, %s, make_interval(secs => %s), %s)",
                           LIMIT, before, GRACE, t(now))
            # The rule as docs/scheduling.md states it ...
            assert answer["budget"] == LIMIT - max(before + recent, ours), (step, answer)
            admitted = [UUID(j["job_id"]) for j in answer["jobs"]]
            for job_id in admitted:
                j = jobs[ids.index(job_id)]
                j.state, j.created_at = "PROGRESS", now
                q.submitted(job_id, at=t(now))
            # ... never spends what the provider's usage and our own jobs leave no room for ...
            if admitted:
                held = sum(j.gpus for j, _ in running())
                assert held + external <= LIMIT, (step, held, external)
            # ... and, with no lag, is the contract's own figure: limit - usage.
            if lag == 0:
                assert recent == 0 and answer["budget"] == LIMIT - max(before, ours), step
            # The second reading: the rise credits uncounted recent jobs, oldest first
            # (ties by id, as SQL orders them), whole jobs, as far as the rise goes.
            after = usage(now)
            q.one("SELECT sftq.record_usage_reading(%s, %s, make_interval(secs => %s), %s)",
                  before, after, GRACE, t(now))
            rise = after - before
            pending = sorted(((j, i) for j, i in running() if not j.counted
                              and j.created_at is not None and now - j.created_at < GRACE),
                             key=lambda ji: (ji[0].created_at, ji[1]))
            for j, _ in pending:
                if rise < j.gpus:
                    break
                rise -= j.gpus
                j.counted = True
            flags = dict(q.all("SELECT id, usage_counted_at IS NOT NULL FROM sftq.jobs "
                               "WHERE state = 'PROGRESS'"))
            assert {i: j.counted for j, i in running()} == flags, step
        states = dict(q.all("SELECT id, state FROM sftq.jobs"))
        assert [states[i] for i in ids] == [j.state for j in jobs], (step, o)
    assert q.all(COUNTER_DRIFT) == []
