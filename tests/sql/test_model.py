"""Property-based: random sequences of enqueue / cancel / admit / provider outcomes against
a small Python model of the contract's rules; every job's state must agree after every step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
